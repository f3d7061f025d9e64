"""FP8 attention on the CPU backends: q, k, v in e4m3 or e5m2 (ml_dtypes
numpy arrays, torch float8 tensors) with out in float32/float16/bfloat16,
and FP8 K/V caches under bf16 and f32 q, against a float64 numpy
computation on the dequantised inputs (x * descale, per batch and KV head,
query head h using KV head h // (Hq // Hkv)). Descales of every form
(None, a number, 0-d, [B, Hkv], broadcast with stride 0), causal, GQA,
varlen, bhsd, the amax outputs, both CPU backends, torch autograd (the
gradient raises), the kept-call cache, and the errors."""

import zlib

import numpy as np
import pytest

import flashcore
from flashcore import _call_cache

import fc_reference as ref

try:
    import ml_dtypes
except ImportError:  # numpy has no FP8 or bfloat16 without it
    ml_dtypes = None

try:
    import torch
except ImportError:
    torch = None

needs_ml = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed (numpy FP8 arrays)")
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")
ERR = flashcore.InvalidArgumentError

# The kit's per-element gate (tools/kit.c, kit_gate_for) for out's dtype:
# an element fails beyond atol + rtol * |ref|, and at most pct_bad percent
# may; ref.check applies the same function's max_abs and rel_l2.
ELEMENT_GATES = {"f32": (1e-5, 1e-4, 0.0), "f16": (1e-3, 2e-3, 1.0), "bf16": (8e-3, 1.6e-2, 1.0)}


def rng_for(*names):
    return np.random.default_rng(zlib.crc32("/".join(map(str, names)).encode()))


def np_fp8(fmt):
    return {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]


def np_out(name):
    return {"f32": np.float32, "f16": np.float16}.get(name) or ml_dtypes.bfloat16


def torch_dtype(name):
    return {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "f32": torch.float32,
            "f16": torch.float16, "bf16": torch.bfloat16}[name]


def randn(rng, shape, dtype):
    """N(0,1) values (never zeros) rounded to dtype (an FP8 format or
    f32/f16/bf16), as a numpy array."""
    x = rng.standard_normal(shape)
    return x.astype(np_fp8(dtype) if dtype in ("e4m3", "e5m2") else np_out(dtype))


def as_torch(x):
    """A numpy array of an FP8, float or bfloat16 type as the torch tensor
    of the same type (the values pass exactly through float32)."""
    name = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float32": "f32", "float16": "f16",
            "bfloat16": "bf16"}[x.dtype.name]
    return torch.from_numpy(x.astype(np.float32)).to(torch_dtype(name))


def f64(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x).astype(np.float64)


def descales(rng, batch, heads_kv):
    return rng.uniform(0.5, 2.0, (batch, heads_kv)).astype(np.float32)


def dequant(x, d, heads, seq_of_row=None):
    """x in the library's order ([B,S,H,D], or varlen [total,H,D]) as
    float64 times its descale d: None (1), a number or 0-d, or [B, Hkv]
    (head h of batch b: d[b, h // (H // Hkv)]; varlen: b is the row's
    sequence, seq_of_row)."""
    x = f64(x)
    if d is None:
        return x
    d = f64(d)
    if d.ndim == 0:
        return x * d
    per_head = np.repeat(d, heads // d.shape[1], axis=1)  # [B, H]
    if seq_of_row is not None:
        return x * per_head[seq_of_row][:, :, None]
    return x * per_head[:, None, :, None]


def p_amax(q, k, causal=False, window=(-1, -1), scale=None):
    """The largest softmax probability over rows that see a key (1 / the
    row's sum of exp(s - max s)), float64, dense [B,S,H,D] inputs; 0 if no
    row sees a key."""
    k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * (scale or 1.0 / np.sqrt(q.shape[3]))
    s = np.where(ref.visible_mask(q.shape[1], k.shape[1], causal, window), s, -np.inf)
    m = s.max(axis=-1, initial=-np.inf)
    seen = np.isfinite(m)
    if not seen.any():
        return 0.0
    rowsum = np.exp(s[seen] - m[seen][:, None]).sum(axis=-1)
    return float((1.0 / rowsum).max())


def check(out, lse, ref_out, ref_lse, out_name):
    """out (and lse) against the float64 reference under out's dtype's gates."""
    ref.check(f64(out), None if lse is None else f64(lse), ref_out, ref_lse, out_name)
    atol, rtol, pct = ELEMENT_GATES[out_name]
    bad = np.abs(f64(out) - ref_out) > atol + rtol * np.abs(ref_out)
    assert 100.0 * bad.mean() <= pct, "%.3f%% of elements beyond atol %g + rtol %g" % (100 * bad.mean(), atol, rtol)


def check_amax(amax, out, ref_p):
    amax = f64(amax)
    assert amax.shape == (2,)
    assert amax[0] == np.float32(np.abs(f64(out)).max(initial=0.0)), "out_amax %r, max |out| %r" % (
        amax[0], np.abs(f64(out)).max(initial=0.0))
    assert abs(amax[1] - ref_p) <= 1e-5 * ref_p, "p_amax %r, reference %r" % (amax[1], ref_p)


def problem(rng, fmt, B=2, Sq=19, Sk=33, Hq=4, Hkv=2, D=64):
    """q, k, v of one FP8 format, [B,S,H,D]."""
    return (randn(rng, (B, Sq, Hq, D), fmt), randn(rng, (B, Sk, Hkv, D), fmt),
            randn(rng, (B, Sk, Hkv, D), fmt))


def reference(q, k, v, qd=None, kd=None, vd=None, **opts):
    """(out, lse, p_amax) of the dequantised dense inputs, float64."""
    Hq, Hkv = q.shape[2], k.shape[2]
    q, k, v = dequant(q, qd, Hq), dequant(k, kd, Hkv), dequant(v, vd, Hkv)
    out, lse = ref.attention(q, k, v, **opts)
    return out, lse, p_amax(q, k, **opts)


# ---- results against the float64 reference -------------------------------------------


@needs_ml
@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
@pytest.mark.parametrize("out_name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_matches_reference(fmt, out_name, backend):
    rng = rng_for("dense", fmt, out_name, backend)
    q, k, v = problem(rng, fmt)
    qd, kd, vd = (descales(rng, 2, 2) for _ in range(3))
    out, lse, amax = flashcore.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd,
                                         out_dtype=np_out(out_name), return_lse=True, return_amax=True,
                                         backend=backend)
    assert out.dtype == np_out(out_name) and out.shape == q.shape
    assert amax.dtype == np.float32 and lse.dtype == np.float32
    r_out, r_lse, r_p = reference(q, k, v, qd, kd, vd)
    check(out, lse, r_out, r_lse, out_name)
    check_amax(amax, out, r_p)
    assert flashcore.kernel_info.backend == backend


@needs_ml
def test_default_out_dtype_is_bfloat16_and_descales_default_to_one():
    rng = rng_for("default")
    q, k, v = problem(rng, "e4m3")
    out = flashcore.attention(q, k, v)
    assert out.dtype == ml_dtypes.bfloat16
    r_out, r_lse, _ = reference(q, k, v)
    check(out, None, r_out, r_lse, "bf16")
    ones = np.ones((2, 2), np.float32)
    same = flashcore.attention(q, k, v, q_descale=1.0, k_descale=ones, v_descale=np.float32(1))
    assert np.array_equal(f64(same), f64(out))


def _descale_form(form, d, B, Hkv):
    """The descale d (a [B, Hkv] float32 array of one value where the form
    has one) in the given form, and its value for the reference."""
    if form == "none":
        return None, None
    if form == "number":
        return float(d[0, 0]), d[0, 0]
    if form == "0-d":
        return np.array(d[0, 0], np.float32), d[0, 0]
    if form == "broadcast":  # stride 0 in both dimensions
        x = np.broadcast_to(np.float32(d[0, 0]), (B, Hkv))
        assert x.strides == (0, 0)
        return x, x
    if form == "per-batch":  # stride 0 over heads
        x = np.broadcast_to(d[:, :1], (B, Hkv))
        return x, x
    if form == "transposed":  # a non-contiguous view of [Hkv, B]
        x = np.ascontiguousarray(d.T).T
        return x, x
    return d, d


DESCALE_FORMS = ["none", "number", "0-d", "broadcast", "per-batch", "transposed", "array"]


@needs_ml
@pytest.mark.parametrize("form", DESCALE_FORMS)
def test_descale_forms(form):
    rng = rng_for("forms", form)
    q, k, v = problem(rng, "e4m3", B=3, Hq=6, Hkv=3)
    given, used = zip(*(_descale_form(form, descales(rng, 3, 3), 3, 3) for _ in range(3)))
    out, lse, amax = flashcore.attention(q, k, v, q_descale=given[0], k_descale=given[1],
                                         v_descale=given[2], out_dtype=np.float32, return_lse=True,
                                         return_amax=True)
    r_out, r_lse, r_p = reference(q, k, v, *used)
    check(out, lse, r_out, r_lse, "f32")
    check_amax(amax, out, r_p)


@needs_ml
@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_causal_gqa_bhsd(fmt, backend):
    rng = rng_for("bhsd", fmt, backend)
    B, Sq, Sk, Hq, Hkv, D = 2, 37, 45, 6, 2, 32
    # [B, H, S, D] storage, the library reading it through permuted strides
    q, k, v = (randn(rng, s, fmt) for s in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)))
    qd, kd, vd = (descales(rng, B, Hkv) for _ in range(3))
    out, lse, amax = flashcore.attention(q, k, v, layout="bhsd", causal=True, scale=0.2, q_descale=qd,
                                         k_descale=kd, v_descale=vd, out_dtype=np.float16,
                                         return_lse=True, return_amax=True, backend=backend)
    assert out.shape == q.shape and out.dtype == np.float16
    lib = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    r_out, r_lse, r_p = reference(lib(q), lib(k), lib(v), qd, kd, vd, causal=True, scale=0.2)
    check(lib(out), lse, r_out, r_lse, "f16")
    check_amax(amax, out, r_p)


@needs_ml
@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
def test_varlen_descales_per_sequence(backend):
    rng = rng_for("varlen", backend)
    cu_q = np.array([0, 7, 7, 30, 41], np.int32)  # one sequence without queries
    cu_k = np.array([0, 12, 20, 20, 53], np.int32)  # one without keys: its rows see none
    Hq, Hkv, D, S = 4, 1, 64, 4
    q = randn(rng, (41, Hq, D), "e5m2")
    k, v = randn(rng, (53, Hkv, D), "e5m2"), randn(rng, (53, Hkv, D), "e5m2")
    qd, kd, vd = (descales(rng, S, Hkv) for _ in range(3))
    out, lse, amax = flashcore.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
                                         q_descale=qd, k_descale=kd, v_descale=vd, out_dtype=np.float32,
                                         return_lse=True, return_amax=True, backend=backend)
    seq_q, seq_k = (np.repeat(np.arange(S), np.diff(cu)) for cu in (cu_q, cu_k))
    qf, kf, vf = dequant(q, qd, Hq, seq_q), dequant(k, kd, Hkv, seq_k), dequant(v, vd, Hkv, seq_k)
    r_out, r_lse = ref.attention_varlen(qf, kf, vf, cu_q, cu_k, causal=True)
    check(out, lse, r_out, r_lse, "f32")
    r_p = max(p_amax(qf[None, cu_q[b]:cu_q[b + 1]], kf[None, cu_k[b]:cu_k[b + 1]], causal=True)
              for b in range(S) if cu_q[b + 1] > cu_q[b])
    check_amax(amax, out, r_p)
    assert np.all(f64(out)[cu_q[2]:cu_q[3]] == 0)  # the sequence without keys


@needs_ml
@pytest.mark.parametrize("q_name", ["bf16", "f32"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_kv_cache_under_float_q(fmt, q_name):
    rng = rng_for("kvcache", fmt, q_name)
    q = randn(rng, (2, 5, 4, 64), q_name)
    k, v = randn(rng, (2, 40, 2, 64), fmt), randn(rng, (2, 40, 2, 64), fmt)
    kd, vd = descales(rng, 2, 2), descales(rng, 2, 2)
    out, lse, amax = flashcore.attention(q, k, v, k_descale=kd, v_descale=vd, causal=True, return_lse=True,
                                         return_amax=True)
    assert out.dtype == q.dtype
    r_out, r_lse, r_p = reference(q, k, v, None, kd, vd, causal=True)
    check(out, lse, r_out, r_lse, q_name)
    check_amax(amax, out, r_p)
    # out_dtype may repeat q's dtype
    again = flashcore.attention(q, k, v, k_descale=kd, v_descale=vd, causal=True, out_dtype=q.dtype)
    assert np.array_equal(f64(again), f64(out))


@needs_ml
def test_paged_fp8_cache_through_attention_with_kvcache():
    rng = rng_for("paged")
    page, Hkv, D = 8, 2, 32
    q = randn(rng, (2, 3, 4, D), "bf16")
    k_pages, v_pages = randn(rng, (6, page, Hkv, D), "e4m3"), randn(rng, (6, page, Hkv, D), "e4m3")
    table = np.array([[4, 0, 5], [2, 1, 3]], np.int32)
    lens = np.array([21, 13], np.int32)
    kd, vd = descales(rng, 2, Hkv), descales(rng, 2, Hkv)
    out = flashcore.attention_with_kvcache(q, k_pages, v_pages, cache_seqlens=lens, block_table=table,
                                           causal=True, k_descale=kd, v_descale=vd)
    assert out.dtype == q.dtype
    for b in range(2):  # gather each sequence's keys through its pages
        kb = np.concatenate([k_pages[p] for p in table[b]])[None, :lens[b]]
        vb = np.concatenate([v_pages[p] for p in table[b]])[None, :lens[b]]
        r_out, r_lse, _ = reference(q[b:b + 1], kb, vb, None, kd[b:b + 1], vd[b:b + 1], causal=True)
        check(out[b:b + 1], None, r_out, r_lse, "bf16")


@needs_ml
def test_given_out_decides_the_output_dtype():
    rng = rng_for("out=")
    q, k, v = problem(rng, "e4m3")
    out = np.full(q.shape, np.nan, np.float16)
    res = flashcore.attention(q, k, v, out=out, k_descale=1.5)
    assert res is out
    r_out, r_lse, _ = reference(q, k, v, None, 1.5)
    check(out, None, r_out, r_lse, "f16")
    with pytest.raises(ERR, match="out: dtype float16 differs from out_dtype float32"):
        flashcore.attention(q, k, v, out=out, out_dtype=np.float32)
    with pytest.raises(ERR, match="out: dtype float8_e4m3fn: an FP8 call writes numpy.float32"):
        flashcore.attention(q, k, v, out=np.empty_like(q))


@needs_ml
def test_amax_of_a_call_without_query_rows_is_zero():
    rng = rng_for("empty")
    q, k, v = problem(rng, "e4m3", Sq=0)
    out, amax = flashcore.attention(q, k, v, return_amax=True, q_descale=np.ones((2, 2), np.float32))
    assert out.shape == q.shape and out.dtype == ml_dtypes.bfloat16
    assert np.array_equal(amax, np.zeros(2, np.float32))


@needs_ml
def test_supported_answers_fp8_questions():
    rng = rng_for("supported")
    q, k, v = problem(rng, "e5m2")
    ok, name = flashcore.supported(q, k, v, out_dtype=np.float16, k_descale=2.0, return_amax=True)
    assert ok and name
    ok, why = flashcore.supported(q, k.astype(np.float16), v.astype(np.float16))
    assert not ok and "dtype" in why


# ---- torch CPU tensors ------------------------------------------------------------


@needs_torch
@needs_ml
@pytest.mark.parametrize("out_name", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_torch_fp8(fmt, out_name):
    rng = rng_for("torch", fmt, out_name)
    qn, kn, vn = problem(rng, fmt, B=2, Hq=4, Hkv=2)
    q, k, v = (as_torch(x) for x in (qn, kn, vn))
    kd = torch.from_numpy(descales(rng, 2, 2))
    vd = torch.tensor(1.25).expand(2, 2)  # stride 0
    assert vd.stride() == (0, 0)
    out, lse, amax = flashcore.attention(q, k, v, q_descale=0.75, k_descale=kd, v_descale=vd,
                                         out_dtype=torch_dtype(out_name), return_lse=True, return_amax=True)
    assert isinstance(out, torch.Tensor) and out.dtype == torch_dtype(out_name)
    assert amax.dtype == torch.float32 and amax.shape == (2,)
    r_out, r_lse, r_p = reference(qn, kn, vn, 0.75, kd, vd)
    check(out, lse, r_out, r_lse, out_name)
    check_amax(amax, out, r_p)


@needs_torch
def test_torch_default_out_and_0d_descale_tensor():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 9, 2, 32, generator=g).to(torch.float8_e4m3fn) for _ in range(3))
    out = flashcore.attention(q, k, v, layout="bhsd", v_descale=torch.tensor(0.5))
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    lib = lambda x: f64(x).transpose(0, 2, 1, 3)  # noqa: E731
    r_out, r_lse, _ = reference(lib(q), lib(k), lib(v), None, None, 0.5)
    check(lib(out), None, r_out, r_lse, "bf16")


@needs_torch
@pytest.mark.parametrize("q_dtype", ["bf16", "f32"])
def test_torch_fp8_cache_under_grad_has_a_backward_that_raises(q_dtype):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 4, 32, generator=g).to(torch_dtype(q_dtype)).requires_grad_()
    k, v = (torch.randn(1, 20, 2, 32, generator=g).to(torch.float8_e5m2) for _ in range(2))
    kd = torch.full((1, 2), 1.5)
    out = flashcore.attention(q, k, v, k_descale=kd)
    assert out.requires_grad and out.dtype == q.dtype
    r_out, r_lse, _ = reference(f64(q), f64(k), f64(v), None, kd)
    check(out, None, r_out, r_lse, q_dtype)
    with pytest.raises(flashcore.UnsupportedError, match="FP8"):
        out.sum().backward()
    with torch.no_grad():
        plain = flashcore.attention(q, k, v, k_descale=kd)
    assert not plain.requires_grad and torch.equal(plain, out.detach())


@needs_torch
def test_torch_fp8_calls_are_never_kept():
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 8, 2, 32, generator=g).to(torch.float8_e4m3fn) for _ in range(3))
    kept = dict(_call_cache._kept)
    first = flashcore.attention(q, k, v)
    d = torch.ones(1, 2)
    results = []
    for value in (1.0, 2.0, 4.0):  # same tensor object, new values: never a stale pointer or value
        d.fill_(value)
        results.append(flashcore.attention(q, k, v, k_descale=d, out_dtype=torch.float32))
    assert _call_cache._kept == kept
    assert torch.equal(first.float(), flashcore.attention(q, k, v).float())
    r1, r2 = (reference(f64(q), f64(k), f64(v), None, s)[0] for s in (1.0, 2.0))
    check(results[0], None, r1, None, "f32")
    check(results[1], None, r2, None, "f32")
    assert not torch.equal(results[1], results[2])


@needs_torch
@pytest.mark.usefixtures("python_eager_path")  # the Python path's kept calls
def test_kept_plain_call_does_not_swallow_a_descale():
    q, k, v = (torch.randn(1, 8, 2, 32, dtype=torch.float16) for _ in range(3))
    flashcore.attention(q, k, v)
    flashcore.attention(q, k, v)  # kept now
    with pytest.raises(ERR, match="q_descale is set but q is f16"):
        flashcore.attention(q, k, v, q_descale=2.0)
    with pytest.raises(ERR, match="out_amax/p_amax are set"):
        flashcore.attention(q, k, v, return_amax=True)


@needs_torch
def test_descale_on_a_call_autograd_records_meets_the_librarys_check():
    q, k, v = (torch.randn(1, 8, 2, 32, requires_grad=True) for _ in range(3))
    with pytest.raises(ERR, match="v_descale is set but v is f32"):
        flashcore.attention(q, k, v, v_descale=torch.ones(1, 2))
    out = flashcore.attention(q, k, v, out_dtype=torch.float32)  # q's own: the op, differentiable
    out.sum().backward()
    assert q.grad is not None


@needs_torch
def test_torch_descale_errors():
    q, k, v = (torch.randn(2, 8, 2, 32).to(torch.float8_e4m3fn) for _ in range(3))
    with pytest.raises(ERR, match="k_descale: dtype torch.float64"):
        flashcore.attention(q, k, v, k_descale=torch.ones(2, 2, dtype=torch.float64))
    with pytest.raises(ERR, match=r"q_descale: shape \(2,\), expected \[batch, heads_kv\] = \[2, 2\]"):
        flashcore.attention(q, k, v, q_descale=torch.ones(2))
    with pytest.raises(ERR, match="v_descale: expected a number, or a float32 torch tensor like q"):
        flashcore.attention(q, k, v, v_descale=np.ones((2, 2), np.float32))
    with pytest.raises(ERR, match="out_dtype: dtype <class 'numpy.float32'>: an FP8 call writes torch.float32"):
        flashcore.attention(q, k, v, out_dtype=np.float32)
    with pytest.raises(ERR, match="out_dtype: dtype torch.float8_e4m3fn: an FP8 call writes torch.float32"):
        flashcore.attention(q, k, v, out_dtype=torch.float8_e4m3fn)


@needs_torch
@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")  # the graph break, at ctypes
def test_compiled_fp8_call_breaks_the_graph_and_matches_eager():
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, 8, 2, 32, generator=g).to(torch.float8_e5m2) for _ in range(3))
    fn = lambda q, k, v: flashcore.attention(q, k, v, k_descale=2.0, out_dtype=torch.float32) * 2  # noqa: E731
    assert torch.equal(torch.compile(fn)(q, k, v), fn(q, k, v))


@needs_torch
def test_the_forward_op_refuses_fp8_tensors():
    q, k, v = (torch.randn(1, 8, 2, 32).to(torch.float8_e4m3fn) for _ in range(3))
    with pytest.raises(flashcore.UnsupportedError, match="FP8 tensors are not taken by the ops"):
        torch.ops.flashcore.attention_fwd(q, k, v, None, None, -1, -1, 0.0, 0.0, False, -1, -1, False, "auto", 0,
                                          False)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available() or not flashcore.cuda_available(),
                    reason="needs torch, a GPU and a CUDA build")
def test_cuda_fp8_q_is_unsupported_for_now():
    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    with pytest.raises(flashcore.UnsupportedError, match="FP8"):
        flashcore.attention(q, k, v, k_descale=torch.ones(1, 2, device="cuda"), return_amax=True)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available() or not flashcore.cuda_available(),
                    reason="needs torch, a GPU and a CUDA build")
@pytest.mark.parametrize("kv_type", ["float8_e4m3fn", "float8_e5m2"])
def test_cuda_fp8_kv_cache_matches_the_dequantised_call(kv_type):
    """An FP8 K/V cache under bf16 q on the GPU against the same call on the
    dequantised bf16-exact k/v (FP8 values are exact in bf16): per-(batch,
    kv head) descales that are powers of two keep the dequantised values
    exact, so only the kernels' own rounding differs."""
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(3, 1, 8, 128, device="cuda", generator=g).to(torch.bfloat16)
    k8, v8 = (torch.randn(3, 700, 2, 128, device="cuda", generator=g).to(getattr(torch, kv_type)) for _ in range(2))
    kd = torch.tensor([[0.5, 2.0], [1.0, 4.0], [0.25, 1.0]], device="cuda")
    vd = torch.tensor([[2.0, 1.0], [0.5, 0.5], [1.0, 8.0]], device="cuda")
    out = flashcore.attention(q, k8, v8, k_descale=kd, v_descale=vd)
    k = (k8.float() * kd[:, None, :, None]).to(torch.bfloat16)
    v = (v8.float() * vd[:, None, :, None]).to(torch.bfloat16)
    ref = flashcore.attention(q, k, v)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    assert (out.float() - ref.float()).abs().max().item() <= 3e-2


# ---- errors ----------------------------------------------------------------------


@needs_ml
def test_descale_on_a_float16_tensor_is_the_librarys_error():
    rng = rng_for("f16 descale")
    q, k, v = (randn(rng, s, "f16") for s in ((1, 4, 2, 32), (1, 6, 2, 32), (1, 6, 2, 32)))
    with pytest.raises(ERR, match="k_descale is set but k is f16: descales belong to FP8 tensors"):
        flashcore.attention(q, k, v, k_descale=2.0)
    # under an FP8 cache, q stays float: its descale is refused too
    k8, v8 = k.astype(ml_dtypes.float8_e4m3fn), v.astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(ERR, match="q_descale is set but q is f16"):
        flashcore.attention(q, k8, v8, q_descale=np.ones((1, 2), np.float32))


@needs_ml
@pytest.mark.parametrize("bad, match", [
    (np.ones((2, 4), np.float32), r"k_descale: shape \(2, 4\), expected \[batch, heads_kv\] = \[2, 2\]"),
    (np.ones((2,), np.float32), r"k_descale: shape \(2,\)"),
    (np.ones((2, 2), np.float64), "k_descale: dtype float64, expected float32"),
    (np.ones((2, 2), np.float16), "k_descale: dtype float16, expected float32"),
    (np.ones((2, 2), ">f4"), "k_descale: dtype >f4, expected float32"),
    (np.ones((2, 2), np.float32)[::-1], "k_descale: strides .* non-negative"),
    ([[1.0, 1.0], [1.0, 1.0]], "k_descale: expected a number, or a float32 numpy array like q, got list"),
    (True, "k_descale: expected a number"),
    (float("inf"), "k_descale: inf is not a finite float32"),
    (1e39, "k_descale: 1e\\+39 is not a finite float32"),
])
def test_descale_argument_errors(bad, match):
    q, k, v = problem(rng_for("bad descale"), "e4m3", Sq=3, Sk=5, D=16)
    with pytest.raises(ERR, match=match):
        flashcore.attention(q, k, v, k_descale=bad)


@needs_ml
def test_out_dtype_errors():
    rng = rng_for("out_dtype")
    q, k, v = problem(rng, "e4m3", Sq=3, Sk=5, D=16)
    for bad in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, np.float64, np.int32):
        with pytest.raises(ERR, match="out_dtype: dtype .*: an FP8 call writes numpy.float32, numpy.float16 or "
                                      "ml_dtypes.bfloat16"):
            flashcore.attention(q, k, v, out_dtype=bad)
    with pytest.raises(ERR, match="out_dtype: dtype no such type: an FP8 call writes"):
        flashcore.attention(q, k, v, out_dtype="no such type")
    f16 = [x.astype(np.float16) for x in (q, k, v)]
    with pytest.raises(ERR, match="out_dtype: float32 differs from q's dtype float16: only FP8 q"):
        flashcore.attention(*f16, out_dtype=np.float32)
    out = flashcore.attention(*f16, out_dtype=np.float16)  # q's own: allowed, the plain call
    assert np.array_equal(out, flashcore.attention(*f16))
    k8 = [x.astype(ml_dtypes.float8_e5m2) for x in (k, v)]
    with pytest.raises(ERR, match="out_dtype: .* differs from q's dtype float16"):
        flashcore.attention(f16[0], *k8, out_dtype=np.float32)  # an FP8 cache writes q's dtype


@needs_ml
def test_return_amax_on_a_float_call_is_the_librarys_error():
    rng = rng_for("amax f32")
    q, k, v = (randn(rng, s, "f32") for s in ((1, 4, 2, 16), (1, 6, 2, 16), (1, 6, 2, 16)))
    with pytest.raises(ERR, match="out_amax/p_amax are set on a f32 call: they are statistics of FP8 calls"):
        flashcore.attention(q, k, v, return_amax=True)


@needs_ml
def test_mixed_fp8_types_are_refused():
    rng = rng_for("mixed")
    q, k, v = problem(rng, "e4m3", Sq=3, Sk=5, D=16)
    k5, v5 = k.astype(ml_dtypes.float8_e5m2), v.astype(ml_dtypes.float8_e5m2)
    with pytest.raises(ERR, match="FP8 dtypes q e4m3, k e5m2, v e5m2: k and v must be one FP8 type"):
        flashcore.attention(q, k5, v5)
    with pytest.raises(ERR, match="v: dtype float8_e5m2 differs from k's float8_e4m3fn"):
        flashcore.attention(q, k, v5)
    with pytest.raises(ERR, match="k: dtype float16 differs from q's float8_e4m3fn"):
        flashcore.attention(q, k.astype(np.float16), v.astype(np.float16))


@needs_ml
def test_backward_of_fp8_inputs_is_unsupported():
    rng = rng_for("backward")
    q, k, v = problem(rng, "e4m3", Sq=3, Sk=5, D=16)
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    with pytest.raises(flashcore.UnsupportedError, match="FP8 inputs are forward-only"):
        flashcore.attention_backward(np.ones_like(out), q, k, v, out, lse)
    ok, why = flashcore.attention_backward_supported(np.ones_like(out), q, k, v, out, lse)
    assert not ok and "forward-only" in why


@needs_ml
def test_append_into_an_fp8_cache_is_unsupported():
    rng = rng_for("append")
    q = randn(rng, (1, 1, 2, 16), "bf16")
    k, v = randn(rng, (1, 8, 2, 16), "e4m3"), randn(rng, (1, 8, 2, 16), "e4m3")
    new = randn(rng, (1, 1, 2, 16), "bf16")
    with pytest.raises(flashcore.UnsupportedError, match="FP8 cache"):
        flashcore.attention_with_kvcache(q, k, v, cache_seqlens=3, k_new=new, v_new=new)


def test_supported_dtype_messages_name_fp8():
    with pytest.raises(ERR, match="float8_e4m3fn or float8_e5m2"):
        flashcore.attention(*(np.ones((1, 2, 1, 8), np.int8) for _ in range(3)))
    if torch is not None:
        with pytest.raises(ERR, match="torch.float8_e4m3fn or torch.float8_e5m2"):
            flashcore.attention(*(torch.ones(1, 2, 1, 8, dtype=torch.int8) for _ in range(3)))
