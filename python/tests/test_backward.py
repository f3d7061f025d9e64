"""The backward through the binding on the CPU with numpy: gradients against
the float64 reference (fc_reference.attention_backward, itself checked
against finite differences here) in both layouts, with GQA, masks, softcap,
varlen with empty sequences and calls without query rows; outputs given
poisoned, so every element must be written; and the arguments the binding
or the library refuses, with nothing written. Needs no GPU and no torch."""

import zlib

import numpy as np
import pytest

import flashcore
from flashcore import _lib

import fc_reference as ref
from test_binding import CASES, DTYPES, make_qkv, np_dtype, randn, to_lib
from test_binding_inputs import NO_ROWS

ERR = flashcore.InvalidArgumentError


def forward_and_dout(rng, q, k, v, dtype, **opts):
    out, lse = flashcore.attention(q, k, v, return_lse=True, **opts)
    return out, lse, randn(rng, out.shape, dtype)


def poisoned(*like):
    return [np.full(x.shape, np.nan, dtype=x.dtype) for x in like]


def test_reference_backward_matches_finite_differences():
    # The oracle itself: central differences of sum(out * dout) in float64.
    rng = np.random.default_rng(40)
    q, k, v = (rng.standard_normal(s) for s in ((1, 5, 4, 3), (1, 7, 2, 3), (1, 7, 2, 3)))
    dout = rng.standard_normal(q.shape)
    for opts in ({}, dict(causal=True, window=(2, -1)), dict(softcap=0.7, scale=1.3)):
        grads = ref.attention_backward(q, k, v, dout, **opts)
        for i, x in enumerate((q, k, v)):
            num = np.zeros_like(x)
            for idx in np.ndindex(x.shape):
                hi, lo = [a.copy() for a in (q, k, v)], [a.copy() for a in (q, k, v)]
                hi[i][idx] += 1e-6
                lo[i][idx] -= 1e-6
                num[idx] = ((ref.attention(*hi, **opts)[0] - ref.attention(*lo, **opts)[0])
                            * dout).sum() / 2e-6
            assert np.max(np.abs(num - grads[i])) < 1e-7, (opts, "dq dk dv".split()[i])


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dense_gradients_match_reference(case, dtype, layout):
    name, B, Sq, Sk, Hq, Hkv, D, opts = case
    rng = np.random.default_rng(zlib.crc32(("bwd/%s/%s/%s" % (name, dtype, layout)).encode()))
    q, k, v = make_qkv(rng, B, Sq, Sk, Hq, Hkv, D, dtype, layout)
    out, lse, dout = forward_and_dout(rng, q, k, v, dtype, layout=layout, **opts)
    dq, dk, dv = poisoned(q, k, v)
    res = flashcore.attention_backward(dout, q, k, v, out, lse, layout=layout, dq=dq, dk=dk, dv=dv,
                                       **opts)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    r = ref.attention_backward(*(to_lib(x, layout) for x in (q, k, v, dout)), out=to_lib(out, layout),
                               lse=lse, **opts)
    ref.check_grads([to_lib(x, layout) for x in res], r, dtype)
    ref.check_unseen_zero(*(to_lib(x, layout) for x in res), **opts)
    assert flashcore.kernel_info.backend == "cpu"


@pytest.mark.parametrize("dtype", DTYPES)
def test_new_gradients_have_the_operands_kind_shape_and_dtype(dtype):
    rng = np.random.default_rng(41)
    q, k, v = make_qkv(rng, 2, 9, 14, 4, 1, 32, dtype, "bhsd")  # MQA
    out, lse, dout = forward_and_dout(rng, q, k, v, dtype, layout="bhsd", window=(3, 2))
    grads = flashcore.attention_backward(dout, q, k, v, out, lse, layout="bhsd", window=(3, 2))
    for g, x in zip(grads, (q, k, v)):
        assert isinstance(g, np.ndarray) and g.shape == x.shape and g.dtype == x.dtype
    r = ref.attention_backward(*(to_lib(x, "bhsd") for x in (q, k, v, dout)), out=to_lib(out, "bhsd"),
                               lse=lse, window=(3, 2))
    ref.check_grads([to_lib(x, "bhsd") for x in grads], r, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_gradients(dtype):
    rng = np.random.default_rng(42)
    # A sequence of keys no query sees (dk = dv = 0), one of a query that
    # sees no key (dq = 0), Sq > Sk and Sq < Sk, and a window that leaves
    # the first keys of the long sequence unseen.
    lens_q = [5, 0, 17, 1, 9, 12]
    lens_k = [8, 3, 17, 0, 30, 4]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = randn(rng, (int(cu_q[-1]), 4, 64), dtype)
    k = randn(rng, (int(cu_k[-1]), 2, 64), dtype)
    v = randn(rng, (int(cu_k[-1]), 2, 64), dtype)
    opts = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, window=(6, -1))
    out, lse, dout = forward_and_dout(rng, q, k, v, dtype, **opts)
    dq, dk, dv = poisoned(q, k, v)
    flashcore.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, **opts)
    r = ref.attention_backward_varlen(q, k, v, dout, list(cu_q), list(cu_k), out=out, lse=lse,
                                      causal=True, window=(6, -1))
    ref.check_grads((dq, dk, dv), r, dtype)
    assert np.all(dk[8:11] == 0) and np.all(dv[8:11] == 0)   # the sequence with no query
    assert np.all(dq[22] == 0)                                # the query with no key


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_without_query_tokens_zeroes_dk_dv(dtype):
    rng = np.random.default_rng(43)
    q, k, v = randn(rng, (0, 4, 32), dtype), randn(rng, (9, 2, 32), dtype), randn(rng, (9, 2, 32), dtype)
    opts = dict(cu_seqlens_q=[0, 0, 0], cu_seqlens_k=[0, 4, 9])
    out, lse, dout = forward_and_dout(rng, q, k, v, dtype, **opts)
    dq, dk, dv = poisoned(q, k, v)
    flashcore.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, **opts)
    assert dq.shape == (0, 4, 32) and np.all(dk == 0) and np.all(dv == 0)


@pytest.mark.parametrize("case", NO_ROWS, ids=[c[0] for c in NO_ROWS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_call_without_query_rows(case, dtype):
    _, layout, sq, skv = case
    rng = np.random.default_rng(44)
    q, k, v = randn(rng, sq, dtype), randn(rng, skv, dtype), randn(rng, skv, dtype)
    out, lse, dout = forward_and_dout(rng, q, k, v, dtype, layout=layout, causal=True)
    dq, dk, dv = poisoned(q, k, v)
    flashcore.attention_backward(dout, q, k, v, out, lse, layout=layout, causal=True, dq=dq, dk=dk, dv=dv)
    assert dq.size == 0 and np.all(dk == 0) and np.all(dv == 0)
    grads = flashcore.attention_backward(dout, q, k, v, out, lse, layout=layout)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape] and np.all(grads[1] == 0)
    # What the empty form drops is still checked.
    with pytest.raises(ERR, match=r"^dk: shape"):
        flashcore.attention_backward(dout, q, k, v, out, lse, layout=layout, dk=dk[..., :16])
    with pytest.raises(ERR, match=r"^lse: shape"):
        flashcore.attention_backward(dout, q, k, v, out, lse[:, :1], layout=layout)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_cpu_reference_backend(dtype):
    rng = np.random.default_rng(45)
    q, k, v = make_qkv(rng, 1, 12, 20, 4, 2, 32, dtype, "bshd")
    opts = dict(causal=True, softcap=3.0, backend="cpu_reference")
    out, lse, dout = forward_and_dout(rng, q, k, v, dtype, **opts)
    grads = flashcore.attention_backward(dout, q, k, v, out, lse, **opts)
    assert flashcore.kernel_info.backend == "cpu_reference"
    r = ref.attention_backward(q, k, v, dout, out=out, lse=lse, causal=True, softcap=3.0)
    ref.check_grads(grads, r, dtype)


def test_cpu_backward_is_deterministic():
    rng = np.random.default_rng(46)
    q, k, v = make_qkv(rng, 2, 70, 90, 8, 2, 64, "f32", "bshd")
    out, lse, dout = forward_and_dout(rng, q, k, v, "f32", causal=True)
    runs = [flashcore.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=d)
            for d in (False, True, False)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert np.array_equal(a, b)


def test_supported():
    rng = np.random.default_rng(47)
    q, k, v = make_qkv(rng, 1, 8, 8, 4, 2, 64, "f16", "bshd")
    out, lse, dout = forward_and_dout(rng, q, k, v, "f16")
    ok, name = flashcore.attention_backward_supported(dout, q, k, v, out, lse)
    assert ok and name
    ok, why = flashcore.attention_backward_supported(dout, q, k, v, out, None)
    assert not ok and why.startswith("lse:")
    ok, why = flashcore.attention_backward_supported(dout, q, k, v, out, lse, dq=q)
    assert not ok and "dq overlaps q" in why


# ---- refused arguments: a clear error, nothing written ------------------------

def _error_cases(q, k, v, out, lse, dout):
    ro = np.zeros(q.shape, q.dtype)
    ro.flags.writeable = False
    return [
        (dict(dout=dout[:, :4]), r"^dout: shape \(1, 4, 4, 32\) differs from out's \(1, 8, 4, 32\)"),
        (dict(dout=dout.astype(np.float16)), r"^dout: dtype float16 differs from out's float32"),
        (dict(out=None), r"^out: expected a numpy array or a torch tensor, got NoneType"),
        (dict(out=out[..., :16]), r"^out: shape"),
        (dict(lse=None), r"^lse: the backward needs the forward's lse"),
        (dict(lse=lse[:, :2]),
         r"^lse: shape \(1, 2, 8\), expected \[batch, heads_q, seqlen_q\] = \(1, 4, 8\)"),
        (dict(lse=lse.astype(np.float64)), r"^lse: dtype float64: the forward's lse is float32"),
        (dict(lse=lse.astype(">f4")), r"^lse: dtype float32 is big-endian"),
        (dict(dq=ro), r"^dq: the array is read-only"),
        (dict(dk=np.zeros(q.shape, q.dtype)), r"^dk: shape \(1, 8, 4, 32\) differs from k's \(1, 8, 2, 32\)"),
        (dict(dv=np.zeros(v.shape, np.float16)), r"^dv: dtype float16 differs from v's float32"),
        (dict(dq=np.zeros(q.shape, ">f4")), r"^dq: dtype float32 is big-endian"),
        (dict(dq=q), r"^dq overlaps q in memory"),
        (dict(dq=out), r"^dq overlaps out in memory"),
        (dict(dv="dk"), r"^dv overlaps dk in memory: outputs must not alias each other"),
        (dict(window=(-2, 0)), r"^window \(-2, 0\) is invalid"),
        (dict(window=(2**32, -1)), r"^window left: 4294967296 is outside int32"),
        (dict(scale=1e-46), r"^scale: 1e-46 rounds to 0 in float32"),
        (dict(causal=True, window=(-1, 3)), r"contradictory"),
        (dict(backend="cuda"), r"q, k, v are in host memory"),
        (dict(cuda_path=70), r"^cuda_path"),
        (dict(layout="bhsd"), r"^lse: shape \(1, 4, 8\), expected"),
    ]


def test_refused_arguments_leave_the_gradients_untouched():
    rng = np.random.default_rng(48)
    q, k, v = (randn(rng, s, "f32") for s in ((1, 8, 4, 32), (1, 8, 2, 32), (1, 8, 2, 32)))
    out, lse, dout = forward_and_dout(rng, q, k, v, "f32")
    for kw, msg in _error_cases(q, k, v, out, lse, dout):
        a = dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)
        a.update(dq=np.full(q.shape, 7.0, np.float32), dk=np.full(k.shape, 7.0, np.float32),
                 dv=np.full(v.shape, 7.0, np.float32))
        a.update(kw)
        if isinstance(a["dv"], str):
            a["dv"] = a[a["dv"]]
        written = [a[n] for n in ("dq", "dk", "dv") if a[n].flags.writeable and n not in kw]
        with pytest.raises(ERR, match=msg):
            flashcore.attention_backward(a.pop("dout"), a.pop("q"), a.pop("k"), a.pop("v"), a.pop("out"),
                                         a.pop("lse"), **a)
        assert all(np.all(x == 7.0) for x in written), kw


def test_varlen_offsets_must_cover_every_token():
    rng = np.random.default_rng(49)
    q, k, v = randn(rng, (12, 2, 32), "f32"), randn(rng, (15, 2, 32), "f32"), randn(rng, (15, 2, 32), "f32")
    opts = dict(cu_seqlens_q=[0, 5, 12], cu_seqlens_k=[0, 9, 15])
    out, lse, dout = forward_and_dout(rng, q, k, v, "f32", **opts)
    dq = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(ERR, match=r"^cu_seqlens_k: the last offset is 14 but the tensor has 15 tokens"):
        flashcore.attention_backward(dout, q, k, v, out, lse, dq=dq, cu_seqlens_q=[0, 5, 12],
                                     cu_seqlens_k=[0, 9, 14])
    with pytest.raises(ERR, match=r"^lse: shape \(2, 11\), expected \[heads_q, total_q\] = \(2, 12\)"):
        flashcore.attention_backward(dout, q, k, v, out, lse[:, :11], dq=dq, **opts)
    assert np.all(dq == 7.0)


def test_backward_args_struct():
    a = _lib.new_bwd_args(_lib.load())
    assert (a.fwd.window_left, a.fwd.window_right, a.fwd.backend, a.deterministic) == (-1, -1, 0, 0)
    assert not a.dout.data and not a.dq.data and not a.workspace and a.workspace_bytes == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_big_endian_dout_is_refused(dtype):
    rng = np.random.default_rng(50)
    q, k, v = make_qkv(rng, 1, 6, 6, 2, 2, 32, dtype, "bshd")
    out, lse, dout = forward_and_dout(rng, q, k, v, dtype)
    swapped = dout.astype(dout.dtype.newbyteorder("S"))
    with pytest.raises(ERR, match=r"^dout: dtype \w+ is big-endian"):
        flashcore.attention_backward(swapped, q, k, v, out, lse)
    native = swapped.astype(np.dtype(np_dtype(dtype)))
    grads = flashcore.attention_backward(native, q, k, v, out, lse)
    ref.check_grads(grads, ref.attention_backward(q, k, v, native, out=out, lse=lse), dtype)
