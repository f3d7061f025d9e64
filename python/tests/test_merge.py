"""flashcore.merge_attention on the CPU: keys split into blocks, one
flashcore.attention(..., return_lse=True) per block, merged, against one
call over all keys (unmasked and causal, GQA, both layouts, varlen,
float32 and bfloat16 parts, out_dtype, out=, the merged lse), with numpy
and with torch CPU tensors (those cases skip without torch); and the
arguments the binding or the library refuses, with nothing written."""

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


def test_torch_cuda_is_unsupported():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    o = torch.ones(1, 2, 1, 4, device="cuda")
    l = torch.zeros(1, 1, 2, device="cuda")
    with pytest.raises(flashcore.UnsupportedError, match="cuda backend has no merge") as e:
        flashcore.merge_attention([o, o], [l, l])
    assert e.value.status_name == "FC_ERR_UNSUPPORTED"
    with pytest.raises(ERR, match="CPU backends read host memory"):
        flashcore.merge_attention([o], [l], backend="cpu")


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
    e = refused(flashcore.UnsupportedError, "cuda backend has no merge", o, l, backend="cuda")
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
