"""flashcore.merge_attention on the CPU: keys split into blocks, one
flashcore.attention(..., return_lse=True) per block, merged, against one
call over all keys (unmasked and causal, GQA, both layouts, varlen,
float32 and bfloat16 parts, out_dtype, out=, the merged lse), with numpy
and with torch CPU tensors (those cases skip without torch); and the
arguments the binding or the library refuses, with nothing written.

On CUDA (torch with a GPU and a library with the CUDA backend): random
parts merged on the GPU against the CPU merge of the same parts (f32, f16,
bf16 and mixed parts, dense and varlen, with and without lse, 1 to 300
parts; bit for bit in every row whose weights both backends round alike,
as tests/test_cuda_merge.c), torch's current stream and graph capture,
out=, calls without rows, the tensors' own device. A library built without
CUDA refuses the cuda backend ("has no merge"), with CUDA tensors too;
mixed CPU/CUDA arguments are refused in either build."""

import ctypes
import ctypes.util
import math
import re
import zlib
from pathlib import Path

import numpy as np
import pytest

import flashcore
from flashcore import _lib

try:
    import ml_dtypes
except ImportError:  # bf16 numpy arrays need ml_dtypes
    ml_dtypes = None

HEADER = Path(__file__).resolve().parents[2] / "include" / "flashcore.h"
ERR = flashcore.InvalidArgumentError
needs_bf16 = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed (numpy has no bfloat16)")

# Whether the loaded library has its CUDA backend (fc_build_info ends in
# "cuda: none" in a build without), and how it refuses backend='cuda' on
# host memory: a build without CUDA has no CUDA merge; a CUDA build needs
# device pointers.
LIB_CUDA = not flashcore.build_info().endswith("cuda: none")
CUDA_ON_HOST = ("^out is host memory but the cuda backend needs device pointers$" if LIB_CUDA
                else "the cuda backend has no merge in this build")

# Block boundaries as distances from the last key: block j holds the keys
# k with Sk - k in (d[j], d[j+1]], so its causal window_right is d[j] for
# every sequence, whatever its length.
SPLITS = {2: (0, 4), 3: (0, 2, 7), 4: (0, 1, 3, 9)}


def rng_for(*name):
    return np.random.default_rng(zlib.crc32("/".join(map(str, name)).encode()))


def blocks(sk, dists):
    """[(k0, k1, window_right)] covering keys [0, sk), last block first."""
    ends = list(dists) + [sk]
    return [(max(0, sk - ends[j + 1]), max(0, sk - ends[j]), ends[j]) for j in range(len(dists))]


def dense_problem(rng, layout, dtype=np.float32, B=2, Sq=6, Sk=13, Hq=4, Hkv=2, D=8):
    shapes = [(B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)]
    if layout == "bhsd":
        shapes = [(b, h, s, d) for b, s, h, d in shapes]
    return [rng.standard_normal(s).astype(np.float32).astype(dtype) for s in shapes]


def dense_parts(q, k, v, n, causal, layout="bshd", **opts):
    """Each block's (out, lse), keys cut along the sequence axis."""
    axis = 1 if layout == "bshd" else 2
    sk = k.shape[axis]
    outs, lses = [], []
    for k0, k1, wr in blocks(sk, SPLITS[n]):
        idx = [slice(None)] * 4
        idx[axis] = slice(k0, k1)
        window = (-1, wr) if causal else (-1, -1)
        o, l = flashcore.attention(q, k[tuple(idx)], v[tuple(idx)], window=window, layout=layout,
                                   return_lse=True, **opts)
        outs.append(o)
        lses.append(l)
    return outs, lses


def as_f32(x):
    return np.asarray(x, dtype=np.float32) if isinstance(x, np.ndarray) else x.float().numpy()


def close(a, b, tol):
    a, b = as_f32(a), as_f32(b)
    assert a.shape == b.shape
    fin = np.isfinite(b)
    assert np.array_equal(fin, np.isfinite(a)) and np.array_equal(a[~fin], b[~fin])
    err = np.max(np.abs(a[fin] - b[fin]), initial=0.0)
    assert err <= tol, err


# ---- results ----------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["unmasked", "causal"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_dense_merge_matches_one_call(layout, causal, n):
    q, k, v = dense_problem(rng_for("dense", layout, causal, n), layout)
    full, full_lse = flashcore.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    outs, lses = dense_parts(q, k, v, n, causal, layout)
    out, lse = flashcore.merge_attention(outs, lses, layout=layout, return_lse=True)
    assert type(out) is np.ndarray and out.dtype == np.float32 and out.shape == full.shape
    assert lse.dtype == np.float32 and lse.shape == full_lse.shape
    close(out, full, 1e-5)
    close(lse, full_lse, 1e-5)
    if causal:  # the first query rows see no key of the block at the end
        assert np.isneginf(lses[0]).any()


def test_causal_rows_that_see_no_key():
    # Sq > Sk: the first rows see nothing in any block: out 0, lse -inf.
    q, k, v = dense_problem(rng_for("empty rows"), "bshd", Sq=12, Sk=9)
    full, full_lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    assert np.isneginf(full_lse).any()
    out, lse = flashcore.merge_attention(*dense_parts(q, k, v, 3, True), return_lse=True)
    close(out, full, 1e-5)
    close(lse, full_lse, 1e-5)
    assert np.all(out[:, :3] == 0) and np.all(np.isneginf(lse[:, :, :3]))


def test_a_row_no_part_saw_gets_zero_and_minus_inf():
    o = np.ones((1, 2, 1, 4), np.float32)
    l = np.full((1, 1, 2), -np.inf, np.float32)
    l2 = l.copy()
    l2[0, 0, 1] = 0.5
    out, lse = flashcore.merge_attention([o, 2 * o], [l, l2], return_lse=True)
    assert np.all(out[0, 0] == 0) and np.isneginf(lse[0, 0, 0])
    assert np.all(out[0, 1] == 2) and lse[0, 0, 1] == np.float32(0.5)


def test_one_part_is_itself_bitwise():
    q, k, v = dense_problem(rng_for("one"), "bshd")
    o, l = flashcore.attention(q, k, v, return_lse=True)
    out, lse = flashcore.merge_attention([o], [l], return_lse=True)
    assert np.array_equal(out, o) and np.array_equal(lse, l)
    ref = flashcore.merge_attention([o], [l], backend="cpu_reference")  # the same code
    assert np.array_equal(ref, o)


def test_same_bits_on_any_thread_count():
    q, k, v = dense_problem(rng_for("threads"), "bshd", B=3, Sq=17)
    outs, lses = dense_parts(q, k, v, 4, True)
    try:
        flashcore.set_num_threads(1)
        one = flashcore.merge_attention(outs, lses, return_lse=True)
        flashcore.set_num_threads(2)
        two = flashcore.merge_attention(outs, lses, return_lse=True)
    finally:
        flashcore.set_num_threads(0)
    assert all(np.array_equal(a, b) for a, b in zip(one, two))


@pytest.mark.parametrize("causal", [False, True], ids=["unmasked", "causal"])
def test_varlen_merge_matches_one_call(causal):
    rng = rng_for("varlen", causal)
    lq, lk = [3, 0, 5, 2], [7, 4, 2, 10]  # a sequence without queries, one shorter than a block
    Hq, Hkv, D = 4, 1, 8
    cq, ck = np.cumsum([0] + lq).astype(np.int32), np.cumsum([0] + lk).astype(np.int32)
    q = rng.standard_normal((cq[-1], Hq, D)).astype(np.float32)
    k, v = (rng.standard_normal((ck[-1], Hkv, D)).astype(np.float32) for _ in range(2))
    full, full_lse = flashcore.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=causal,
                                         return_lse=True)
    outs, lses = [], []
    for j in range(3):
        keys = [np.arange(ck[b], ck[b + 1])[slice(*blocks(lk[b], SPLITS[3])[j][:2])] for b in range(len(lk))]
        cb = np.cumsum([0] + [len(x) for x in keys]).astype(np.int32)
        sel = np.concatenate(keys)
        window = (-1, SPLITS[3][j]) if causal else (-1, -1)
        o, l = flashcore.attention(q, k[sel], v[sel], cu_seqlens_q=cq, cu_seqlens_k=cb, window=window,
                                   return_lse=True)
        outs.append(o)
        lses.append(l)
    out, lse = flashcore.merge_attention(outs, lses, return_lse=True)
    assert out.shape == q.shape and lse.shape == (Hq, cq[-1])
    close(out, full, 1e-5)
    close(lse, full_lse, 1e-5)


@needs_bf16
def test_bfloat16_parts():
    # bf16 parts carry their own rounding: against the float32 call on the
    # same (bf16-rounded) inputs, as tests/test_merge.c gates them.
    bf16 = ml_dtypes.bfloat16
    q, k, v = dense_problem(rng_for("bf16"), "bshd", dtype=bf16)
    ref, ref_lse = flashcore.attention(*(x.astype(np.float32) for x in (q, k, v)), causal=True,
                                       return_lse=True)
    outs, lses = dense_parts(q, k, v, 3, True)
    assert outs[0].dtype == bf16
    out, lse = flashcore.merge_attention(outs, lses, return_lse=True)
    assert out.dtype == bf16
    close(out, ref, 2e-2)
    close(lse, ref_lse, 1e-4)
    out32 = flashcore.merge_attention(outs, lses, out_dtype=np.float32)
    assert out32.dtype == np.float32
    close(out32, ref, 1e-2)
    # each part its own dtype
    outs32 = dense_parts(*(x.astype(np.float32) for x in (q, k, v)), 3, True)[0]
    mixed = flashcore.merge_attention([outs32[0], outs[1], outs32[2]], lses, out_dtype=np.float32)
    close(mixed, ref, 1e-2)


def test_out_dtype_float16():
    q, k, v = dense_problem(rng_for("f16 out"), "bhsd")
    full = flashcore.attention(q, k, v, layout="bhsd")
    out = flashcore.merge_attention(*dense_parts(q, k, v, 2, False, "bhsd"), out_dtype="float16",
                                    layout="bhsd")
    assert out.dtype == np.float16 and out.shape == full.shape
    close(out, full, 2e-3)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_out_given_is_written_and_returned(layout):
    q, k, v = dense_problem(rng_for("out=", layout), layout)
    full, full_lse = flashcore.attention(q, k, v, causal=True, layout=layout, return_lse=True)
    outs, lses = dense_parts(q, k, v, 3, True, layout)
    # a strided view (every other row of a larger array), poisoned
    big = np.full((full.shape[0], 2 * full.shape[1]) + full.shape[2:], np.nan, np.float32)
    given = big[:, ::2]
    res, lse = flashcore.merge_attention(outs, lses, out=given, layout=layout, return_lse=True)
    assert res is given
    close(given, full, 1e-5)
    close(lse, full_lse, 1e-5)
    assert np.all(np.isnan(big[:, 1::2]))
    f16 = np.empty(full.shape, np.float16)  # out's dtype without out_dtype
    assert flashcore.merge_attention(outs, lses, out=f16, layout=layout) is f16
    close(f16, full, 2e-3)
    assert flashcore.merge_attention(outs, lses, out=f16, out_dtype=np.float16, layout=layout) is f16


def test_dense_without_query_rows():
    for shape in ((0, 5, 2, 4), (2, 0, 2, 4)):
        o = np.zeros(shape, np.float32)
        l = np.zeros((shape[0], shape[2], shape[1]), np.float32)
        out, lse = flashcore.merge_attention([o, o], [l, l], return_lse=True)
        assert out.shape == shape and lse.shape == l.shape
    with pytest.raises(ERR, match=r"lses\[1\]: shape"):
        flashcore.merge_attention([o, o], [l, l[:1]])


# ---- torch (CPU) ------------------------------------------------------------

@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_torch_cpu(layout):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x) for x in dense_problem(rng_for("torch", layout), layout))
    full, full_lse = flashcore.attention(q, k, v, causal=True, layout=layout, return_lse=True)
    outs, lses = dense_parts(q, k, v, 4, True, layout)
    out, lse = flashcore.merge_attention(outs, lses, layout=layout, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.stride() == full.stride()
    close(out, full, 1e-5)
    close(lse, full_lse, 1e-5)
    bf = flashcore.merge_attention(outs, lses, layout=layout, out_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    close(bf, full, 2e-2)
    given = torch.empty_like(full)
    assert flashcore.merge_attention(tuple(outs), tuple(lses), out=given, layout=layout) is given
    close(given, full, 1e-5)


def test_torch_parts_that_require_grad():
    torch = pytest.importorskip("torch")
    o = torch.ones(1, 2, 1, 4, requires_grad=True)
    l = torch.zeros(1, 1, 2)
    with pytest.raises(flashcore.UnsupportedError, match="no backward"):
        flashcore.merge_attention([o], [l])
    with torch.no_grad():
        assert torch.equal(flashcore.merge_attention([o], [l]), o.detach())


# ---- errors -------------------------------------------------------------------

def small(rng_name="err", B=2, S=3, H=2, D=4):
    rng = rng_for(rng_name)
    o = [rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(2)]
    l = [rng.standard_normal((B, H, S)).astype(np.float32) for _ in range(2)]
    return o, l


def refused(cls, match, *args, **kwargs):
    with pytest.raises(cls, match=match) as e:
        flashcore.merge_attention(*args, **kwargs)
    return e.value


def test_refused_by_the_binding():
    o, l = small()
    refused(ERR, "no parts", [], [])
    refused(ERR, "lses: 1 entries but outs has 2", o, l[:1])
    refused(ERR, "expected a list or tuple", np.stack(o), np.stack(l))
    refused(ERR, "outs: expected a list or tuple", 3, l)
    refused(ERR, r"outs\[0\]: expected a 4-D tensor", [o[0][0, 0]], [l[0]])
    refused(ERR, "layout='bhsd' applies to 4-D", [o[0][0]], [l[0][0]], layout="bhsd")
    refused(ERR, "layout: expected", o, l, layout="sbhd")
    refused(ERR, "backend: expected", o, l, backend="gpu")
    refused(ERR, "out_dtype: .* is not float32, float16 or bfloat16", o, l, out_dtype=np.float64)
    refused(ERR, "out: dtype float32 differs from out_dtype float16", o, l, out=np.empty_like(o[0]),
            out_dtype=np.float16)
    refused(ERR, "out: shape", o, l, out=np.empty((2, 3, 2, 5), np.float32))
    ro = np.empty_like(o[0])
    ro.flags.writeable = False
    refused(ERR, "read-only", o, l, out=ro)
    refused(ERR, r"lses\[1\]: dtype int32 is not supported", o, [l[0], l[1].astype(np.int32)])


def test_refused_by_the_library_with_its_message():
    o, l = small()
    e = refused(ERR, r"^parts_out\[1\]\.shape differs from out\.shape$", [o[0], o[1][:, :2]], l)
    assert e.status_name == "FC_ERR_INVALID_ARGUMENT"
    refused(ERR, r"^parts_lse\[0\]\.dtype is .*: must be f32$", o, [l[0].astype(np.float16), l[1]])
    refused(ERR, r"^parts_lse\[1\]\.shape must be \[batch, heads, seqlen_q\] of out$", o,
            [l[0], l[1][:, :, :2]])
    refused(ERR, r"^parts_out\[1\]\.dtype is .*: must be f32, f16 or bf16$",
            [o[0], o[1].astype(np.float64)], l)
    refused(ERR, r"^parts_out\[1\]\.ndim is 3: expected 4$", [o[0], o[1][0]], l)
    refused(ERR, r"^out overlaps parts_out\[0\] in memory", o, l, out=o[0])
    refused(ERR, r"^num_parts is 1025: must be 1 to 1024$", [o[0]] * 1025, [l[0]] * 1025)
    e = refused(flashcore.UnsupportedError, CUDA_ON_HOST, o, l, backend="cuda")
    assert e.status_name == "FC_ERR_UNSUPPORTED"


def test_a_refused_call_writes_nothing():
    o, l = small()
    given = np.full_like(o[0], 7.0)
    for bad in (dict(outs=[o[0], o[1][:, :2]], lses=l), dict(outs=o, lses=[l[0], l[1].astype(np.float16)]),
                dict(outs=o, lses=l, backend="cuda")):
        with pytest.raises(flashcore.FlashCoreError):
            flashcore.merge_attention(bad["outs"], bad["lses"], out=given, backend=bad.get("backend", "auto"))
        assert np.all(given == 7.0)
    assert flashcore.merge_attention(o, l, out=given) is given and not np.all(given == 7.0)


def test_kind_and_device_must_match():
    torch = pytest.importorskip("torch")
    o, l = small()
    refused(ERR, r"outs\[1\]: is a torch object on cpu but outs\[0\] is a numpy object",
            [o[0], torch.from_numpy(o[1])], l)
    refused(ERR, r"lses\[0\]: is a torch object", o, [torch.from_numpy(l[0]), l[1]])
    refused(ERR, r"out: is a torch object", o, l, out=torch.empty(o[0].shape))


# ---- torch (CUDA) -------------------------------------------------------------

def torch_cuda():
    """torch, for a test that needs a CUDA device; skips (saying why)
    without torch or a GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    return torch


def torch_cuda_merge():
    """torch, for a test of the library's CUDA merge; skips (saying why)
    without torch, a GPU, or a library whose CUDA backend runs here."""
    torch = torch_cuda()
    if not LIB_CUDA:
        pytest.skip("this libflashcore was built without CUDA (test_torch_cuda_without_the_cuda_backend "
                    "covers it)")
    if not flashcore.cuda_available():
        pytest.skip("this libflashcore has no CUDA device of a compiled architecture here")
    return torch


def test_torch_cuda_without_the_cuda_backend():
    torch = torch_cuda()
    if LIB_CUDA:
        pytest.skip("this libflashcore has the CUDA backend: test_cuda_merge_* merge on the GPU")
    o = torch.ones(1, 2, 1, 4, device="cuda")
    l = torch.zeros(1, 1, 2, device="cuda")
    given = torch.full_like(o, 7.0)
    e = refused(flashcore.UnsupportedError, "^fc_attention_merge: the cuda backend has no merge in this build",
                [o, o], [l, l], out=given)
    assert e.status_name == "FC_ERR_UNSUPPORTED" and bool((given == 7.0).all())


def test_torch_cuda_refused_in_either_build():
    # The binding's checks (kind, device, backend, grad) and the library's
    # argument checks come before any backend: the same in both builds.
    torch = torch_cuda()
    o = torch.ones(1, 2, 1, 4, device="cuda")
    l = torch.zeros(1, 1, 2, device="cuda")
    dev = "cuda:%d" % o.get_device()
    for name in ("cpu", "cpu_reference"):
        refused(ERR, "the parts are CUDA tensors; the CPU backends read host memory", [o], [l], backend=name)
    refused(ERR, r"^outs\[1\]: is a torch object on cpu but outs\[0\] is a torch object on %s$" % dev,
            [o, o.cpu()], [l, l])
    refused(ERR, r"^lses\[1\]: is a torch object on cpu but outs\[0\] is a torch object on %s$" % dev,
            [o, o], [l, l.cpu()])
    refused(ERR, r"^outs\[1\]: is a torch object on %s but outs\[0\] is a torch object on cpu$" % dev,
            [o.cpu(), o], [l.cpu(), l.cpu()])
    refused(ERR, r"^lses\[0\]: is a numpy object on cpu but outs\[0\] is a torch object on %s$" % dev,
            [o], [l.cpu().numpy()])
    refused(ERR, r"^out: is a torch object on cpu but outs\[0\] is a torch object on %s$" % dev,
            [o], [l], out=torch.empty(o.shape))
    refused(ERR, r"^out: is a torch object on %s but outs\[0\] is a torch object on cpu$" % dev,
            [o.cpu()], [l.cpu()], out=torch.empty_like(o))
    refused(flashcore.UnsupportedError, "no backward", [o.clone().requires_grad_()], [l])
    parts = [o + 1, o + 2]
    before = [p.clone() for p in parts]
    e = refused(ERR, r"^out overlaps parts_out\[0\] in memory", parts, [l, l], out=parts[0])
    assert e.status_name == "FC_ERR_INVALID_ARGUMENT"
    refused(ERR, r"^parts_out\[1\]\.shape differs from out\.shape$", [o, o[:, :1]], [l, l])
    refused(ERR, r"^parts_lse\[1\]\.dtype is f16: must be f32$", [o, o], [l, l.half()])
    assert all(torch.equal(p, b) for p, b in zip(parts, before))
    if torch.cuda.device_count() > 1:
        other = o.to("cuda:1")
        refused(ERR, r"^outs\[1\]: is a torch object on cuda:1 but outs\[0\] is a torch object on cuda:0$",
                [o.to("cuda:0"), other], [l.to("cuda:0"), l.to("cuda:0")])


TORCH_DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
U32 = 2.0 ** -24  # the unit roundoff of float32


def random_parts(torch, rng, n, form, B, S, H, D, dts, specials=True):
    """n random parts as CPU torch tensors in form's layout ('bshd', 'bhsd'
    or 'varlen': B 1, S the tokens), part i in dtype dts[i % len(dts)];
    and their lse as a float32 [n, rows] array, rows in order (b, s, h).
    lse in [-6, 6], -inf for one part in eight (its out rows NaN: never
    read); with specials every part -inf in every 13th row (no part saw a
    key), a NaN lse at row 1 and a +inf at row 2 (NaN rows)."""
    rows = B * S * H
    lse = rng.uniform(-6.0, 6.0, (n, rows)).astype(np.float32)
    lse[rng.random((n, rows)) < 0.125] = -np.inf
    if specials:
        lse[:, np.arange(rows) % 13 == 5] = -np.inf
        if rows > 2:
            lse[0, 1], lse[n - 1, 2] = np.nan, np.inf
    x = rng.uniform(-2.0, 2.0, (n, rows, D)).astype(np.float32)
    x[x == 0] = 0.75
    x[np.isneginf(lse)] = np.nan
    outs, lses = [], []
    for i in range(n):
        o = torch.from_numpy(x[i].reshape(B, S, H, D)).to(getattr(torch, TORCH_DT[dts[i % len(dts)]]))
        l = torch.from_numpy(lse[i].reshape(B, S, H))
        if form == "varlen":
            o, l = o[0].contiguous(), l[0].t().contiguous()
        else:
            l = l.permute(0, 2, 1).contiguous()
            if form == "bhsd":
                o = o.permute(0, 2, 1, 3).contiguous()
        outs.append(o)
        lses.append(l)
    return outs, lses, lse


def in_row_order(t, form, lse=False):
    """An out ([rows, D]) or lse ([rows]) of form's layout, rows in order
    (b, s, h), on the CPU, contiguous."""
    if form == "varlen":
        t = t.t() if lse else t
    elif lse:
        t = t.permute(0, 2, 1)
    elif form == "bhsd":
        t = t.permute(0, 2, 1, 3)
    t = t.cpu().contiguous()
    return t.reshape(-1) if lse else t.reshape(-1, t.shape[-1])


def _libm():
    path = ctypes.util.find_library("m")
    if path is None:
        return None
    m = ctypes.CDLL(path)
    for f in (m.expf, m.logf):
        f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
    return m


LIBM = _libm()  # the expf/logf the CPU merge calls (this process's libm)


def rounds_alike(v):
    """v (a double the device and this host compute within 1.5 ulp of each
    other) rounds to the same float on both: not within 2^-50 of a rounding
    boundary."""
    return np.float32(v * (1.0 + 2.0 ** -50)) == np.float32(v * (1.0 - 2.0 ** -50))


def predict_row(col):
    """One row's lse over the parts (float32) as both backends take it:
    ('nan' | 'empty' | 'finite', same weights, same log). The CPU merge
    rounds expf/logf of fp32 arguments (libm), the kernel exp/log in double
    rounded once: the two give the same bits where libm's value is the
    correctly rounded one and the double is not at a rounding boundary
    (tests/test_cuda_merge.c, eval_row). Without libm nothing is predicted
    alike."""
    mx = np.float32(-np.inf)
    for v in col:
        if v > mx:
            mx = v
    if np.isnan(col).any() or mx == np.inf:
        return "nan", False, False
    if mx == -np.inf:
        return "empty", True, True
    if LIBM is None:
        return "finite", False, False
    same, total = True, np.float32(0.0)
    for v in col:
        if v == -np.inf:
            continue
        df = float(np.float32(v - mx))
        e, d = LIBM.expf(df), math.exp(df)
        same = same and e == float(np.float32(d)) and rounds_alike(d)
        total = np.float32(total + np.float32(e))
    ld = math.log(float(total))
    return "finite", same, same and LIBM.logf(float(total)) == float(np.float32(ld)) and rounds_alike(ld)


def spacing(dt, v):
    """The spacing of float16/bfloat16 at magnitude v (0 for float32)."""
    if dt == "f32":
        return 0.0
    e = math.frexp(v)[1] if v > 0 else -200
    return 2.0 ** max(e - 11, -24) if dt == "f16" else 2.0 ** max(e - 8, -133)


def check_against_cpu(torch, form, out_dt, outs, lse_np, g, c, gl, cl):
    """The GPU merge (g, gl) of the parts (outs, CPU; lse_np) against the
    CPU one (c, cl): NaN rows NaN in both, rows no part saw 0 and -inf;
    rows whose weights both backends round alike bit for bit (lse too where
    its log does); others within twice the fp32 algorithm's error, 4 (n + 2)
    u relative to sum_i w_i |x_i| / W + |out|, and one rounding of out's
    dtype (lse: 4 (n + 2) u (1 + |lse|)). Returns (rows alike bit for bit,
    rows neither NaN nor empty)."""
    n, rows = lse_np.shape
    bits = torch.int32 if out_dt == "f32" else torch.int16
    gb, cb = in_row_order(g, form).view(bits).numpy(), in_row_order(c, form).view(bits).numpy()
    go, co = in_row_order(g, form).double().numpy(), in_row_order(c, form).double().numpy()
    xs = np.stack([in_row_order(o, form).double().numpy() for o in outs])  # [n, rows, D]
    glv = None if gl is None else in_row_order(gl, form, True).double().numpy()
    clv = None if cl is None else in_row_order(cl, form, True).double().numpy()
    alike = finite = 0
    for r in range(rows):
        kind, same_w, same_log = predict_row(lse_np[:, r])
        where = "row %d of %d (%s, weights alike: %s)" % (r, rows, kind, same_w)
        if kind == "nan":
            assert np.isnan(go[r]).all() and np.isnan(co[r]).all(), where
            assert glv is None or (np.isnan(glv[r]) and np.isnan(clv[r])), where
            continue
        if kind == "empty":
            assert not go[r].any() and not co[r].any(), where
            assert glv is None or (glv[r] == -np.inf and clv[r] == -np.inf), where
            continue
        finite += 1
        if same_w:
            alike += 1
            assert np.array_equal(gb[r], cb[r]), (where, go[r], co[r])
        else:
            col = lse_np[:, r].astype(np.float64)
            seen = col != -np.inf
            w = np.where(seen, np.exp(col - col[seen].max()), 0.0)
            mag = (w[seen, None] * np.abs(xs[seen, r])).sum(0) / w.sum()
            gate = 4 * (n + 2) * U32 * (mag + np.abs(co[r])) + 2.0 ** -140
            gate += np.array([spacing(out_dt, v) for v in np.maximum(np.abs(go[r]), np.abs(co[r]))])
            assert (np.abs(go[r] - co[r]) <= gate).all(), (where, go[r], co[r], gate)
        if glv is not None:
            if same_log:
                assert glv[r] == clv[r], (where, glv[r], clv[r])
            else:
                assert abs(glv[r] - clv[r]) <= 4 * (n + 2) * U32 * (1 + abs(clv[r])), (where, glv[r], clv[r])
    return alike, finite


CUDA_CASES = [  # parts, form, B, S, H, D, part dtypes (in turn), out dtype, lse
    (1, "bshd", 2, 5, 3, 64, ("f32",), "f32", True),
    (2, "bshd", 2, 7, 4, 128, ("bf16",), "bf16", True),
    (2, "bhsd", 3, 6, 2, 64, ("f16",), "f16", False),
    (3, "bshd", 2, 9, 5, 1, ("f32",), "f32", True),
    (4, "varlen", 1, 30, 2, 8, ("f32",), "f32", False),
    (7, "varlen", 1, 23, 3, 80, ("f32", "f16", "bf16"), "f16", True),
    (8, "bhsd", 2, 4, 3, 40, ("f16",), "f32", True),
    (9, "varlen", 1, 17, 2, 256, ("bf16",), "bf16", True),
    (40, "bshd", 1, 6, 2, 72, ("f32", "f16", "bf16"), "f32", True),
    (300, "varlen", 1, 9, 2, 3, ("f16",), "f16", False),
]


@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: "%dparts-%s-%s-%s-%s" % (
    c[0], c[1], "+".join(c[6]), c[7], "lse" if c[8] else "nolse"))
def test_cuda_merge_equals_the_cpu_merge(case):
    torch = torch_cuda_merge()
    n, form, B, S, H, D, dts, out_dt, want_lse = case
    outs, lses, lse_np = random_parts(torch, rng_for("cuda", *case), n, form, B, S, H, D, dts)
    dev = torch.device("cuda")
    gouts, glses = [o.to(dev) for o in outs], [l.to(dev) for l in lses]
    layout = "bhsd" if form == "bhsd" else "bshd"
    odt = getattr(torch, TORCH_DT[out_dt])
    g = flashcore.merge_attention(gouts, glses, out_dtype=odt, return_lse=want_lse, layout=layout)
    c = flashcore.merge_attention(outs, lses, out_dtype=odt, return_lse=want_lse, layout=layout)
    (g, gl), (c, cl) = (g, c) if want_lse else ((g, None), (c, None))
    torch.cuda.synchronize()
    assert g.device == gouts[0].device and g.dtype == odt and g.shape == outs[0].shape
    assert g.stride() == c.stride()
    if want_lse:
        assert gl.device == gouts[0].device and gl.dtype == torch.float32 and gl.shape == lses[0].shape
    alike, finite = check_against_cpu(torch, form, out_dt, outs, lse_np, g, c, gl, cl)
    if LIBM is not None:  # libm's expf is correctly rounded nearly always: most rows are bit for bit
        assert 2 * alike >= finite, (alike, finite)


@pytest.mark.parametrize("n", [3, 12], ids=["params", "table"])  # parts in the kernel's parameters, in a table
def test_cuda_merge_current_stream_and_graph_capture(n):
    torch = torch_cuda_merge()
    outs, lses, _ = random_parts(torch, rng_for("stream", n), n, "bshd", 2, 33, 4, 64, ("bf16",), specials=False)
    outs, lses = [o.cuda() for o in outs], [l.cuda() for l in lses]
    expect, expect_lse = flashcore.merge_attention(outs, lses, return_lse=True)
    torch.cuda.synchronize()
    assert torch.isfinite(expect).all() and not torch.isnan(expect_lse).any()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Parts produced on the side stream right before the call: only a
        # call queued on the same (current) stream is ordered after them.
        fresh = [o * 1.0 for o in outs]
        got, got_lse = flashcore.merge_attention(fresh, lses, return_lse=True)
    side.synchronize()
    assert torch.equal(got, expect) and torch.equal(got_lse, expect_lse)
    # Capturing: a launch on any stream but the capturing one breaks the capture.
    out = torch.empty_like(expect)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        _, lse = flashcore.merge_attention(outs, lses, out=out, return_lse=True)
    out.zero_()
    lse.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect) and torch.equal(lse, expect_lse)


def test_cuda_merge_out_given_and_calls_without_rows():
    torch = torch_cuda_merge()
    outs, lses, _ = random_parts(torch, rng_for("cuda out="), 3, "bhsd", 2, 5, 3, 16, ("f16",), specials=False)
    outs, lses = [o.cuda() for o in outs], [l.cuda() for l in lses]
    expect = flashcore.merge_attention(outs, lses, out_dtype=torch.float32, layout="bhsd")
    B, H, S, D = expect.shape
    big = torch.full((B, 2 * H, S, D), float("nan"), device="cuda")  # a strided view, poisoned
    given = big[:, ::2]
    assert flashcore.merge_attention(outs, lses, out=given, layout="bhsd") is given
    torch.cuda.synchronize()
    assert torch.equal(given, expect) and torch.isnan(big[:, 1::2]).all()
    for shape in ((0, 5, 2, 4), (2, 0, 2, 4), (0, 2, 4)):  # no query row: nothing to merge
        o = torch.zeros(shape, device="cuda")
        l = torch.zeros((shape[1], 0) if len(shape) == 3 else (shape[0], shape[2], shape[1]), device="cuda")
        out, lse = flashcore.merge_attention([o, o], [l, l], return_lse=True)
        assert out.shape == shape and lse.shape == l.shape and out.device == o.device == lse.device


def test_cuda_merge_on_the_tensors_device():
    torch = torch_cuda_merge()
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device: no other device to merge on")
    outs, lses, _ = random_parts(torch, rng_for("cuda:1"), 4, "bshd", 1, 7, 2, 32, ("f32",), specials=False)
    expect = flashcore.merge_attention(outs, lses)
    with torch.cuda.device(0):  # the current device differs from the tensors'
        got = flashcore.merge_attention([o.to("cuda:1") for o in outs], [l.to("cuda:1") for l in lses])
        assert got.device == torch.device("cuda", 1)
        torch.cuda.synchronize(1)
    close(got.cpu(), expect, 1e-5)


# ---- the C struct -------------------------------------------------------------

@pytest.mark.skipif(not HEADER.is_file(), reason="not in a source checkout")
def test_ctypes_struct_mirrors_the_header():
    text = HEADER.read_text()
    body = re.search(r"typedef struct fc_attention_merge_args \{(.*?)\} fc_attention_merge_args;", text,
                     re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = [n for decl in body.split(";") if decl.strip()
             for n in re.findall(r"(\w+)\s*(?:,|$)", decl.strip())]
    assert [f[0] for f in _lib.fc_attention_merge_args._fields_] == names
    assert int(re.search(r"#define FC_MAX_MERGE_PARTS (\d+)", text).group(1)) == _lib.MAX_MERGE_PARTS
    args = _lib.new_merge_args(_lib.load())
    assert (args.num_parts, args.backend, bool(args.parts_out), args.out.data) == (0, 0, False, None)
