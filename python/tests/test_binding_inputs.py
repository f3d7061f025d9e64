"""Input classes the binding must refuse or answer correctly before anything
reaches the library: outputs that may not be written, foreign byte order,
zero-size arrays, values that ctypes would wrap or round, and cu_seqlens
that leave tokens uncovered. A refused call names the argument and leaves
every output untouched."""

import numpy as np
import pytest

import flashcore

import fc_reference as ref
from test_binding import DTYPES, np_dtype, randn

ERR = flashcore.InvalidArgumentError


def qkv(rng, shape_q, shape_kv, dtype="f32"):
    return randn(rng, shape_q, dtype), randn(rng, shape_kv, dtype), randn(rng, shape_kv, dtype)


# ---- out= must be writable ---------------------------------------------------

def _read_only_outs(shape, tmp_path):
    """(what, array, how to read its memory afterwards) for each kind of
    read-only output."""
    n = int(np.prod(shape))
    ro = np.full(shape, 7.0, np.float32)
    ro.flags.writeable = False
    raw = np.full(n, 7.0, np.float32).tobytes()
    over_bytes = np.frombuffer(raw, np.float32).reshape(shape)
    path = tmp_path / "out.f32"
    np.full(shape, 7.0, np.float32).tofile(path)
    mm = np.memmap(path, np.float32, "r", shape=shape)
    return [("read-only array", ro, lambda: ro),
            ("array over bytes", over_bytes, lambda: np.frombuffer(raw, np.float32)),
            ("read-only memmap", mm, lambda: np.fromfile(path, np.float32))]


def test_read_only_out_is_refused_and_left_untouched(tmp_path):
    rng = np.random.default_rng(21)
    q, k, v = qkv(rng, (1, 8, 2, 32), (1, 8, 2, 32))
    for what, out, memory in _read_only_outs(q.shape, tmp_path):
        with pytest.raises(ERR, match=r"^out: the array is read-only") as e:
            flashcore.attention(q, k, v, out=out)
        assert e.value.status == 1, what
        assert np.all(memory() == 7.0), "%s was written" % what
        ok, why = flashcore.supported(q, k, v, out=out)
        assert not ok and why.startswith("out: the array is read-only"), what


def test_writable_memmap_out_is_written(tmp_path):
    rng = np.random.default_rng(22)
    q, k, v = qkv(rng, (1, 9, 2, 32), (1, 12, 2, 32))
    out = np.memmap(tmp_path / "out.f32", np.float32, "w+", shape=q.shape)
    assert flashcore.attention(q, k, v, out=out, causal=True) is out
    r_out, _ = ref.attention(q, k, v, causal=True)
    ref.check(np.fromfile(tmp_path / "out.f32", np.float32).reshape(q.shape), None, r_out, None, "f32")


def test_read_only_inputs_are_fine():
    rng = np.random.default_rng(23)
    q, k, v = qkv(rng, (1, 7, 2, 32), (1, 7, 2, 32))
    for x in (q, k, v):
        x.flags.writeable = False
    r_out, _ = ref.attention(q, k, v)
    ref.check(flashcore.attention(q, k, v), None, r_out, None, "f32")


# ---- byte order ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["q", "k", "v", "out"])
def test_non_native_byte_order_is_refused(dtype, which):
    rng = np.random.default_rng(24)
    ops = dict(zip("qkv", qkv(rng, (1, 6, 2, 32), (1, 6, 2, 32), dtype)))
    ops["out"] = np.full(ops["q"].shape, 3.0, np.dtype(np_dtype(dtype)))
    swapped = ops[which].dtype.newbyteorder("S")
    ops[which] = ops[which].astype(swapped)
    keep = ops["out"].copy()
    with pytest.raises(ERR, match=r"^%s: dtype \w+ is big-endian, not the machine's" % which):
        flashcore.attention(ops["q"], ops["k"], ops["v"], out=ops["out"])
    assert np.array_equal(ops["out"], keep), "a refused call wrote out"
    # The suggested conversion gives the reference's answer.
    native = {n: x.astype(x.dtype.newbyteorder("=")) for n, x in ops.items()}
    res = flashcore.attention(native["q"], native["k"], native["v"], out=native["out"])
    r_out, _ = ref.attention(native["q"], native["k"], native["v"])
    ref.check(res, None, r_out, None, dtype)


def test_big_endian_cu_seqlens_are_converted():
    rng = np.random.default_rng(25)
    q, k, v = qkv(rng, (12, 2, 32), (15, 2, 32))
    cu_q, cu_k = np.array([0, 5, 12], ">i8"), np.array([0, 9, 15], ">i4")
    out = flashcore.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    r_out, _ = ref.attention_varlen(q, k, v, [0, 5, 12], [0, 9, 15])
    ref.check(out, None, r_out, None, "f32")


# ---- zero-size arrays ------------------------------------------------------------

# (name, layout, q shape, k/v shape): dense calls whose q has no row.
NO_ROWS = [
    ("batch0", "bshd", (0, 8, 4, 32), (0, 8, 2, 32)),
    ("batch0-seqlens0", "bshd", (0, 0, 4, 32), (0, 0, 2, 32)),
    ("seqlen_q0", "bshd", (2, 0, 4, 32), (2, 8, 2, 32)),
    ("seqlen_q0-bhsd", "bhsd", (2, 4, 0, 32), (2, 2, 8, 32)),
]


@pytest.mark.parametrize("case", NO_ROWS, ids=[c[0] for c in NO_ROWS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_call_without_query_rows_returns_empty(case, dtype):
    _, layout, sq, skv = case
    rng = np.random.default_rng(26)
    q, k, v = qkv(rng, sq, skv, dtype)
    out, lse = flashcore.attention(q, k, v, layout=layout, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.size == 0
    B, H, S = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhsd" else (q.shape[0], q.shape[2], q.shape[1])
    assert lse.shape == (B, H, S) and lse.dtype == np.float32
    given = np.empty_like(q)
    assert flashcore.attention(q, k, v, layout=layout, out=given) is given
    assert flashcore.supported(q, k, v, layout=layout)[0]


def test_no_query_rows_still_checks_everything_else():
    rng = np.random.default_rng(27)
    q, k, v = qkv(rng, (2, 0, 4, 32), (2, 8, 2, 32))
    cases = [
        ((q, k[..., :16], v[..., :16]), {}, "head_dim"),
        ((q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2)), {}, "heads_q 4 is not a multiple"),
        ((q[:0], k, v), {}, "k: batch 2 differs from q's 0"),
        ((q, k, v[:, :5]), {}, "v: shape"),
        ((q, k, v), dict(window=(-2, 0)), "window"),
        ((q, k, v), dict(causal=True, window=(-1, 3)), "contradictory"),
        ((q, k, v), dict(out=np.empty((2, 0, 4, 16), np.float32)), "out: shape"),
        ((q, k, v), dict(out=np.empty((2, 0, 4, 32), np.float16)), "out: dtype"),
    ]
    for ops, kw, msg in cases:
        with pytest.raises(ERR) as e:
            flashcore.attention(*ops, **kw)
        assert msg in str(e.value), (kw, str(e.value))


def test_dense_empty_key_sequence_with_query_rows_is_the_librarys_error():
    # The C API's dense tensors have every dimension >= 1; varlen is the way
    # to give a sequence no key (its rows get out 0, lse -inf).
    rng = np.random.default_rng(28)
    q, k, v = qkv(rng, (1, 5, 2, 32), (1, 0, 2, 32))
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(ERR, match=r"k\.shape\[1\] \(seqlen_k\) is 0"):
        flashcore.attention(q, k, v, out=out)
    assert np.all(out == 7.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_zero_size_arrays(dtype):
    rng = np.random.default_rng(29)
    # No query token at all, keys present: an empty result.
    q, k, v = qkv(rng, (0, 4, 32), (9, 2, 32), dtype)
    out, lse = flashcore.attention(q, k, v, cu_seqlens_q=[0, 0, 0], cu_seqlens_k=[0, 4, 9],
                                   return_lse=True)
    assert out.shape == (0, 4, 32) and lse.shape == (4, 0)
    # No token on either side.
    e = randn(rng, (0, 2, 32), dtype)
    out = flashcore.attention(e, e[:, :1], e[:, :1], cu_seqlens_q=[0, 0], cu_seqlens_k=[0, 0])
    assert out.shape == (0, 2, 32)
    # Zero-size k/v: every query row sees no key (out 0, lse -inf).
    q = randn(rng, (6, 2, 32), dtype)
    out, lse = flashcore.attention(q, e[:, :1], e[:, :1], cu_seqlens_q=[0, 2, 6],
                                   cu_seqlens_k=[0, 0, 0], return_lse=True)
    r_out, r_lse = ref.attention_varlen(q, e[:, :1], e[:, :1], [0, 2, 6], [0, 0, 0])
    ref.check(out, lse, r_out, r_lse, dtype)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


# ---- values ctypes would wrap or round ----------------------------------------

FIELD_CASES = [
    (dict(window=(2**32, -1)), r"window left: 4294967296 is outside int32 \[-2147483648, 2147483647\]"),
    (dict(window=(-1, 2**31)), r"window right: 2147483648 is outside int32"),
    (dict(window=(-2**31 - 1, -1)), r"window left: -2147483649 is outside int32"),
    (dict(window=(2.5, -1)), r"window left: expected an integer, got 2.5"),
    (dict(scale=1e-46), r"scale: 1e-46 rounds to 0 in float32, which means 1/sqrt\(head_dim\)"),
    (dict(scale=-1e-46), r"scale: -1e-46 rounds to 0 in float32"),
    (dict(scale=1e39), r"scale: 1e\+39 is not a finite float32 \(\|scale\| <= 3.4028235e\+38\)"),
    (dict(scale=float("nan")), r"scale: nan is not a finite float32"),
    (dict(scale=float("-inf")), r"scale: -inf is not a finite float32"),
    (dict(scale="big"), r"scale: expected a number"),
    (dict(softcap=1e-46), r"softcap: 1e-46 rounds to 0 in float32, which means no cap"),
    (dict(softcap=3.5e38), r"softcap: 3.5e\+38 is not a finite float32"),
    (dict(softcap=float("inf")), r"softcap: inf is not a finite float32"),
]
VARLEN_FIELD_CASES = [
    (dict(max_seqlen_q=2**32 + 5), r"max_seqlen_q: 4294967301 is outside int32"),
    (dict(max_seqlen_k=-2**31 - 1), r"max_seqlen_k: -2147483649 is outside int32"),
    (dict(max_seqlen_q=8.0), r"max_seqlen_q: expected an integer"),
]


@pytest.mark.parametrize("kw,msg", FIELD_CASES + VARLEN_FIELD_CASES)
def test_fields_are_range_checked_before_narrowing(kw, msg):
    rng = np.random.default_rng(30)
    q, k, v = qkv(rng, (1, 8, 2, 32), (1, 8, 2, 32))
    if "max_seqlen_q" in kw or "max_seqlen_k" in kw:
        q, k, v = q[0], k[0], v[0]
        kw = dict(kw, cu_seqlens_q=[0, 8], cu_seqlens_k=[0, 8])
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(ERR, match="^" + msg) as e:
        flashcore.attention(q, k, v, out=out, **kw)
    assert isinstance(e.value, ValueError) and np.all(out == 7.0)


def test_field_extremes_that_fit_are_computed():
    rng = np.random.default_rng(31)
    q, k, v = qkv(rng, (1, 20, 2, 32), (1, 24, 2, 32))
    big = 2**31 - 1
    # The edges of the library's option ranges (docs/API.md) are computed ...
    for kw in (dict(window=(big, big)), dict(window=(big, 0)), dict(scale=1e-25),
               dict(scale=1e25, softcap=2.0), dict(softcap=1e-13, scale=1e-3), dict(softcap=1e3)):
        r_out, r_lse = ref.attention(q, k, v, **kw)
        out, lse = flashcore.attention(q, k, v, return_lse=True, **kw)
        ref.check(out, lse, r_out, r_lse, "f32")
    # ... and float32 values past them are refused by the library, naming the range.
    for kw, what in ((dict(scale=1e-45), "scale"), (dict(scale=3.4e38, softcap=2.0), "scale"),
                     (dict(softcap=1e-30, scale=1e-3), "softcap"), (dict(softcap=1e4), "softcap")):
        with pytest.raises(ERR, match=r"^%s .* is out of range" % what):
            flashcore.attention(q, k, v, **kw)


def test_context_settings_are_range_checked():
    before = flashcore.get_tuning()
    with pytest.raises(ERR, match=r"^tuning splits: 4294967296 is outside int32"):
        flashcore.set_tuning(splits=2**32)
    with pytest.raises(ERR, match=r"^tuning pdl: expected an integer"):
        flashcore.set_tuning(pdl=1.5)
    assert flashcore.get_tuning() == before
    with pytest.raises(ERR, match=r"^num_threads: 4294967297 is outside int32"):
        flashcore.set_num_threads(2**32 + 1)


# ---- cu_seqlens must cover every token --------------------------------------

def test_cu_seqlens_must_end_at_the_token_count():
    rng = np.random.default_rng(32)
    q, k, v = qkv(rng, (12, 2, 32), (15, 2, 32))
    cases = [
        (([0, 5, 10], [0, 9, 15]), r"cu_seqlens_q: the last offset is 10 but the tensor has 12 tokens"),
        (([0, 5, 12], [0, 9, 14]), r"cu_seqlens_k: the last offset is 14 but the tensor has 15 tokens"),
        (([0, 5, 13], [0, 9, 15]), r"cu_seqlens_q: the last offset is 13 but the tensor has 12 tokens"),
        (([0], [0]), r"cu_seqlens_q: has 1 entries: expected batch\+1 >= 2"),
        ((np.array([0, 2**32 + 12]), [0, 15]), r"cu_seqlens_q: values do not fit int32"),
    ]
    out = np.full(q.shape, 7.0, np.float32)
    for (cu_q, cu_k), msg in cases:
        with pytest.raises(ERR, match="^" + msg):
            flashcore.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out)
        assert np.all(out == 7.0)
    # Covering every token: every row is written, as the reference says.
    res = flashcore.attention(q, k, v, cu_seqlens_q=[0, 5, 12], cu_seqlens_k=[0, 9, 15], out=out)
    r_out, _ = ref.attention_varlen(q, k, v, [0, 5, 12], [0, 9, 15])
    ref.check(res, None, r_out, None, "f32")


# ---- torch CPU tensors ---------------------------------------------------------

def test_torch_cpu_input_classes_if_torch_is_installed():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(33)
    q, k, v = (torch.randn(1, 8, 2, 32, generator=g) for _ in range(3))
    leaf = torch.zeros(q.shape, requires_grad=True)
    with pytest.raises(ERR, match=r"^out: a leaf tensor that requires grad"):
        flashcore.attention(q, k, v, out=leaf)
    assert torch.all(leaf == 0)
    with torch.inference_mode():
        out = flashcore.attention(q, k, v)
    ref.check(out.numpy(), None, ref.attention(q.numpy(), k.numpy(), v.numpy())[0], None, "f32")
    e = torch.empty(0, 8, 2, 32)
    assert flashcore.attention(e, e, e).shape == (0, 8, 2, 32)
    with pytest.raises(ERR, match=r"^cu_seqlens_q: the last offset is 6 but the tensor has 8 tokens"):
        flashcore.attention(q[0], k[0], v[0], cu_seqlens_q=torch.tensor([0, 6]),
                            cu_seqlens_k=torch.tensor([0, 8]))
