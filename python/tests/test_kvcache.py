"""attention_with_kvcache and attention(block_table=, seqused_k=) on the CPU:
paged and dense KV caches against a float64 reference that gathers each
sequence's keys through the block table and attends over its
cache_seqlens[b] keys (bottom-right aligned), with numpy and torch. Page
sizes 1 to 64, shuffled tables with shared pages and garbage past each
sequence's pages, cache rows no sequence uses poisoned with NaN (never
read), out poisoned with NaN (every element written), both page layouts,
the kept-call path, torch.compile, and the errors."""

import zlib

import numpy as np
import pytest

import flashcore
from flashcore import _call_cache

import fc_reference as ref

try:
    import ml_dtypes
except ImportError:  # bf16 numpy arrays need ml_dtypes
    ml_dtypes = None

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")
BF16 = pytest.param("bf16", marks=pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed"))
ERR = flashcore.InvalidArgumentError


def np_dtype(name):
    return {"f32": np.float32, "f16": np.float16}.get(name) or ml_dtypes.bfloat16


def convert(x, kind, dtype=None):
    """A float32 or int32 numpy array as the call's kind (and float dtype)."""
    if x.dtype == np.int32:
        return x if kind == "numpy" else torch.from_numpy(x)
    if kind == "numpy":
        return x.astype(np_dtype(dtype))
    return torch.from_numpy(x).to({"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype])


def f64(x):
    return x.detach().double().numpy() if torch is not None and isinstance(x, torch.Tensor) \
        else np.asarray(x, dtype=np.float64)


def lib_order(storage, layout):
    """Pages in the library's [num_pages, page_size, H, D] order: the 'hnd'
    storage [num_pages, H, page_size, D] as a permuted view, no copy."""
    if layout == "nhd":
        return storage
    return storage.swapaxes(1, 2) if isinstance(storage, np.ndarray) else storage.transpose(1, 2)


class Paged:
    """A random paged cache: pages handed out in shuffled order, the second
    sequence sharing the first one's first page, table entries past each
    sequence's pages out of range, rows no sequence uses set to fill."""

    def __init__(self, rng, B, Hkv, D, page_size, max_pages, lens, layout="nhd", extra=3, fill=np.nan):
        self.lens = np.asarray(lens, dtype=np.int32)
        need = [-(-int(n) // page_size) for n in lens]
        share = B > 1 and need[0] > 0 and need[1] > 0
        self.num_pages = sum(need) - share + extra
        order = iter(rng.permutation(self.num_pages))
        table = rng.choice([-1, self.num_pages, self.num_pages + 7], size=(B, max_pages)).astype(np.int32)
        for b in range(B):
            for j in range(need[b]):
                table[b, j] = table[0, 0] if (share and b == 1 and j == 0) else next(order)
        self.table = table
        used = np.zeros((self.num_pages, page_size), dtype=bool)
        for b in range(B):
            j = np.arange(lens[b])
            used[table[b, j // page_size], j % page_size] = True
        shape = (self.num_pages, page_size, Hkv, D) if layout == "nhd" else (self.num_pages, Hkv, page_size, D)
        self.k, self.v = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        for x in (self.k, self.v):
            lib_order(x, layout)[~used] = fill
        self.layout, self.page_size = layout, page_size

    def inputs(self, kind, dtype):
        """(k_cache, v_cache, block_table, cache_seqlens) of the call's kind."""
        k, v = (lib_order(convert(x, kind, dtype), self.layout) for x in (self.k, self.v))
        return k, v, convert(self.table, kind, dtype), convert(self.lens, kind, dtype)


def reference(q, k, v, table, lens, **opts):
    """float64 out [B,Sq,Hq,D] and lse [B,Hq,Sq]: sequence b attends over its
    lens[b] keys, gathered through the table (None: k, v are [B,S,H,D])."""
    q, k, v = f64(q), f64(k), f64(v)
    B, Sq, Hq, _ = q.shape
    out, lse = np.zeros(q.shape), np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        j = np.arange(int(lens[b]))
        if table is None:
            kb, vb = k[b, j], v[b, j]
        else:
            rows = (np.asarray(table)[b, j // k.shape[1]], j % k.shape[1])
            kb, vb = k[rows], v[rows]
        o, l = ref.attention(q[b:b + 1], kb[None], vb[None], **opts)
        out[b], lse[b] = o[0], l[0]
    return out, lse


def flash_to_ref(opts):
    """attention_with_kvcache's options as the reference's."""
    names = dict(window_size="window", softmax_scale="scale")
    return {names.get(n, n): x for n, x in opts.items()}


def seeded(*parts):
    return np.random.default_rng(zlib.crc32("/".join(map(str, parts)).encode()))


def poisoned(q):
    if isinstance(q, np.ndarray):
        return np.full(q.shape, np.nan, dtype=q.dtype)
    return torch.full_like(q, float("nan"))


def run_and_check(q, cache, kind, dtype, opts, lens=None):
    """attention_with_kvcache on the cache (lens: what to pass as
    cache_seqlens, else its lengths) into a NaN-poisoned out, checked
    against the reference."""
    k, v, table, used = cache.inputs(kind, dtype)
    out = poisoned(q)
    res, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=used if lens is None else lens,
                                                block_table=table, out=out, return_softmax_lse=True, **opts)
    assert res is out and tuple(lse.shape) == (q.shape[0], q.shape[2], q.shape[1])
    r_out, r_lse = reference(q, k, v, cache.table, cache.lens, **flash_to_ref(opts))
    ref.check(f64(out), f64(lse), r_out, r_lse, dtype)


def capacity_lens(rng, B, capacity):
    """Cache lengths with 0, 1 and a full cache among them."""
    return ([0, 1, capacity] + list(rng.integers(0, capacity + 1, size=B)))[:B]


PAGE_SIZES = [(1, 40), (3, 13), (16, 4), (64, 2)]  # (page_size, max_pages)

# name, Sq, Hq, Hkv, D, attention_with_kvcache options
CASES = [
    ("decode", 1, 4, 4, 32, {}),
    ("decode-gqa-causal", 1, 8, 2, 64, dict(causal=True)),
    ("sq3-causal", 3, 4, 2, 32, dict(causal=True)),
    ("sq3-window", 3, 2, 1, 32, dict(window_size=(4, 1))),
    ("sq3-causal-window-softcap", 3, 6, 3, 64, dict(causal=True, window_size=(5, -1), softcap=4.0,
                                                     softmax_scale=0.3)),
]


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("pages", PAGE_SIZES, ids=["ps1", "ps3", "ps16", "ps64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_paged_matches_reference(case, pages, layout):
    name, Sq, Hq, Hkv, D, opts = case
    ps, max_pages = pages
    rng = seeded(name, ps, layout)
    B = 5
    cache = Paged(rng, B, Hkv, D, ps, max_pages, capacity_lens(rng, B, ps * max_pages), layout)
    q = rng.standard_normal((B, Sq, Hq, D)).astype(np.float32)
    run_and_check(q, cache, "numpy", "f32", opts)


@pytest.mark.parametrize("kind", ["numpy", pytest.param("torch", marks=needs_torch)])
@pytest.mark.parametrize("dtype", ["f32", "f16", BF16])
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_dtypes_and_kinds(dtype, kind, layout):
    rng = seeded("dtypes", dtype, kind, layout)
    B, Sq, Hq, Hkv, D, ps, max_pages = 4, 3, 4, 2, 64, 16, 5
    cache = Paged(rng, B, Hkv, D, ps, max_pages, capacity_lens(rng, B, ps * max_pages), layout)
    q = convert(rng.standard_normal((B, Sq, Hq, D)).astype(np.float32), kind, dtype)
    run_and_check(q, cache, kind, dtype, dict(causal=True))
    assert flashcore.kernel_info.backend == "cpu"


@pytest.mark.parametrize("kind", ["numpy", pytest.param("torch", marks=needs_torch)])
def test_dense_cache(kind):
    rng = seeded("dense", kind)
    B, Sq, Hq, Hkv, D, S = 4, 3, 4, 2, 32, 37
    q, k, v = (convert(rng.standard_normal(s).astype(np.float32), kind, "f32")
               for s in ((B, Sq, Hq, D), (B, S, Hkv, D), (B, S, Hkv, D)))
    per_seq = convert(np.array([0, 1, S, 20], dtype=np.int32), kind, "f32")
    # per sequence, one length for all, the whole cache
    for given, lens in ((per_seq, [0, 1, S, 20]), (9, [9] * B), (None, [S] * B)):
        out, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=given, causal=True,
                                                    return_softmax_lse=True)
        r_out, r_lse = reference(q, k, v, None, lens, causal=True)
        ref.check(f64(out), f64(lse), r_out, r_lse, "f32")


def test_attention_takes_the_cache_in_both_layouts_and_backends():
    # flashcore.attention(layout='bhsd') reads q [B,H,S,D] and pages
    # [num_pages, H, page_size, D] as they are.
    rng = seeded("bhsd")
    B, Sq, Hq, Hkv, D, ps, max_pages = 3, 2, 4, 2, 32, 8, 4
    cache = Paged(rng, B, Hkv, D, ps, max_pages, [5, 32, 0], "hnd")
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float32)
    r_out, r_lse = reference(q.transpose(0, 2, 1, 3), lib_order(cache.k, "hnd"), lib_order(cache.v, "hnd"),
                             cache.table, cache.lens, causal=True)
    for backend in ("cpu", "cpu_reference"):
        ok, name = flashcore.supported(q, cache.k, cache.v, layout="bhsd", block_table=cache.table,
                                       seqused_k=cache.lens, backend=backend)
        assert ok, name
        out, lse = flashcore.attention(q, cache.k, cache.v, layout="bhsd", causal=True, block_table=cache.table,
                                       seqused_k=cache.lens, backend=backend, return_lse=True)
        assert out.shape == q.shape and flashcore.kernel_info.backend == backend
        ref.check(out.transpose(0, 2, 1, 3), lse, r_out, r_lse, "f32")


@pytest.mark.parametrize("kind", ["numpy", pytest.param("torch", marks=needs_torch)])
def test_row_strided_block_table(kind):
    # A table cut from a wider one is read in place (block_table_stride).
    rng = seeded("strided", kind)
    B, Hq, Hkv, D, ps, max_pages = 3, 2, 2, 16, 4, 3
    cache = Paged(rng, B, Hkv, D, ps, max_pages, [12, 7, 1])
    wide = np.full((B, max_pages + 5), -1, dtype=np.int32)
    wide[:, :max_pages] = cache.table
    k, v, _, lens = cache.inputs(kind, "f32")
    table = convert(wide, kind, "f32")[:, :max_pages]
    q = convert(rng.standard_normal((B, 1, Hq, D)).astype(np.float32), kind, "f32")
    out = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table)
    ref.check(f64(out), None, reference(q, k, v, cache.table, cache.lens)[0], None, "f32")


@needs_torch
@pytest.mark.usefixtures("python_eager_path")  # the Python path's kept calls
def test_kept_calls_follow_new_lengths_and_tables():
    # The same signature is served from the kept call with the pointers of
    # this call's tensors; int64 tables are converted, so never kept.
    _call_cache._kept.clear()
    rng = seeded("kept")
    B, Hq, Hkv, D, ps, max_pages = 3, 4, 2, 32, 8, 4
    cache = Paged(rng, B, Hkv, D, ps, max_pages, [32, 3, 17])
    k, v, table, lens = cache.inputs("torch", "f32")
    q = torch.randn(B, 1, Hq, D, generator=torch.Generator().manual_seed(1))
    for step in range(3):
        for t, n in ((table, lens), (table.clone(), lens.clone()), (table.long(), lens)):
            out = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=n, block_table=t, causal=True)
            r_out, _ = reference(q, k, v, cache.table, n.numpy(), causal=True)
            ref.check(f64(out), None, r_out, None, "f32")
        assert len(_call_cache._kept) == 1
        lens -= torch.tensor([step + 1, 1, 2], dtype=torch.int32)  # in place: the kept pointer's values


def test_empty_queries():
    rng = seeded("empty")
    cache = Paged(rng, 2, 2, 16, 4, 3, [5, 12])
    for q in (np.zeros((2, 0, 2, 16), np.float32), np.zeros((0, 1, 2, 16), np.float32)):
        table, lens = cache.table[:q.shape[0]], cache.lens[:q.shape[0]]
        out, lse = flashcore.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=lens, block_table=table,
                                                    return_softmax_lse=True)
        assert out.shape == q.shape and lse.shape == (q.shape[0], 2, q.shape[1])
    with pytest.raises(ERR, match=r"^block_table: shape \(1, 3\), expected \[batch 2"):
        flashcore.attention_with_kvcache(np.zeros((2, 0, 2, 16), np.float32), cache.k, cache.v,
                                         block_table=cache.table[:1])


def error_case():
    rng = seeded("errors")
    cache = Paged(rng, 2, 2, 16, 4, 3, [5, 12], extra=0)
    q = rng.standard_normal((2, 1, 4, 16)).astype(np.float32)
    return q, cache


@pytest.mark.parametrize("change, msg", [
    (lambda t, n: t.__setitem__((1, 2), 99), r"^block_table\[1\]\[2\] is 99: page indices must be in \[0, 4\)"),
    (lambda t, n: t.__setitem__((0, 0), -1), r"^block_table\[0\]\[0\] is -1"),
    (lambda t, n: n.__setitem__(0, 13), r"^seqused_k\[0\] is 13: must be in \[0, 12\]"),
    (lambda t, n: n.__setitem__(1, -1), r"^seqused_k\[1\] is -1"),
], ids=["page-out-of-range", "negative-page", "longer-than-capacity", "negative-length"])
def test_bad_contents_are_refused_before_writing(change, msg):
    q, cache = error_case()
    table, lens = cache.table.copy(), cache.lens.copy()
    change(table, lens)
    out = np.full(q.shape, 7.0, np.float32)
    with pytest.raises(ERR, match=msg):
        flashcore.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=lens, block_table=table, out=out)
    assert np.all(out == 7.0)


def test_bad_shapes_and_types():
    q, cache = error_case()
    k, v, table, lens = cache.k, cache.v, cache.table, cache.lens
    cases = [
        (dict(block_table=table[:1]), r"^block_table: shape \(1, 3\), expected \[batch 2, max_pages_per_seq >= 1\]"),
        (dict(block_table=table[:, :0]), r"^block_table: shape \(2, 0\)"),
        (dict(block_table=table[0]), r"^block_table: expected a 2-D integer array"),
        (dict(block_table=table.astype(np.float32)), r"^block_table: expected a 2-D integer array, got float32"),
        (dict(block_table=table, cache_seqlens=lens[:1]), r"^seqused_k: 1 entries, expected one a sequence"),
        (dict(block_table=table.astype(np.int64) + 2**32), r"^block_table: values do not fit int32"),
        (dict(cache_seqlens=2**31), r"^cache_seqlens: 2147483648 is outside int32"),
    ]
    for kw, msg in cases:
        with pytest.raises(ERR, match=msg):
            flashcore.attention_with_kvcache(q, k, v, **kw)
    with pytest.raises(flashcore.UnsupportedError, match=r"^block_table with cu_seqlens"):
        flashcore.attention(q[:, 0], k[0], v[0], cu_seqlens_q=[0, 2], cu_seqlens_k=[0, 4], block_table=table)
    with pytest.raises(ERR, match=r"^seqused_k with cu_seqlens"):
        flashcore.attention(q[:, 0], k[0], v[0], cu_seqlens_q=[0, 2], cu_seqlens_k=[0, 4], seqused_k=lens)


@pytest.mark.parametrize("name", ["cache_batch_idx", "cache_leftpad", "alibi_slopes", "num_splits"])
def test_unimplemented_arguments_are_named(name):
    q, cache = error_case()
    value = 2 if name == "num_splits" else np.zeros((2, 1, 2, 16), np.float32)
    with pytest.raises(flashcore.UnsupportedError, match="^%s" % name):
        flashcore.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=cache.lens, block_table=cache.table,
                                         **{name: value})


@needs_torch
def test_gradient_is_refused():
    rng = seeded("grad")
    cache = Paged(rng, 2, 2, 16, 4, 3, [5, 12])
    k, v, table, lens = cache.inputs("torch", "f32")
    q = torch.randn(2, 1, 4, 16, requires_grad=True)
    out = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table)
    with torch.no_grad():
        expect = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table)
    assert torch.equal(out.detach(), expect)
    with pytest.raises(flashcore.UnsupportedError, match=r"^backward of a paged KV cache or seqused_k call"):
        out.sum().backward()
    dense = flashcore.attention(q, k[:2], v[:2], seqused_k=lens.clamp(max=4))
    with pytest.raises(flashcore.UnsupportedError, match=r"^backward of a paged"):
        dense.sum().backward()


@needs_torch
def test_compile_fullgraph_and_fake_shapes():
    rng = seeded("compile")
    cache = Paged(rng, 3, 2, 16, 4, 4, [16, 1, 9])
    k, v, table, lens = cache.inputs("torch", "f32")
    q = torch.randn(3, 2, 4, 16, generator=torch.Generator().manual_seed(2))

    def step(q, k, v, table, lens):
        a = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, causal=True)
        b, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=4, block_table=table,
                                                  return_softmax_lse=True)
        return a + b, lse

    explain = torch._dynamo.explain(step)(q, k, v, table, lens)
    assert explain.graph_break_count == 0, explain.break_reasons
    with torch.no_grad():
        expect = step(q, k, v, table, lens)
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, table, lens)
    for a, b in zip(got, expect):
        assert torch.equal(a, b)
    meta = [x.to("meta") for x in (q, k, v, table, lens)]
    out, lse = step(*meta)
    assert out.device.type == "meta" and out.shape == q.shape and lse.shape == (3, 4, 2)


@needs_torch
def test_opcheck_with_paged_arguments():
    rng = seeded("opcheck")
    cache = Paged(rng, 2, 2, 16, 4, 3, [5, 12], extra=1)
    k, v, table, lens = cache.inputs("torch", "f32")
    k, v = (torch.nan_to_num(x) for x in (k, v))  # opcheck compares outputs with NaN-free inputs
    q = torch.randn(2, 3, 4, 16, generator=torch.Generator().manual_seed(3))
    from flashcore import _torch_ops
    opts = tuple(_torch_ops.Options(None, None, -1, -1, 0.0, 0.0, True, -1, -1, False, "auto", 0, False))
    res = torch.library.opcheck(torch.ops.flashcore.attention_fwd.default, (q, k, v) + opts + (table, lens))
    assert set(res.values()) == {"SUCCESS"}, res
