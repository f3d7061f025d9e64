"""attention_with_kvcache on CUDA: paged and dense caches in bf16/f16 against
the library's cpu-reference backend in float64 on the same inputs (every
CUDA path, both page layouts, page sizes 1 to 256, cache lengths 0, 1 and
full), the library's checks of device tables, torch.compile(fullgraph=True)
without a graph break, and a CUDA graph (captured by hand and by
mode="reduce-overhead") replayed with new cache lengths, tables and keys.
Skipped cleanly without torch, a GPU or a CUDA build."""

import numpy as np
import pytest

import flashcore

import cuda_only
import fc_reference as ref
from test_kvcache import Paged, capacity_lens, flash_to_ref, lib_order, seeded

torch = cuda_only.torch_with_cuda()

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
DEV = torch.device("cuda")
# Unused cache rows hold a large finite value: a key read where it should
# not be dominates its row (NaN would also flag the masked blocks the
# kernels may multiply by 0, docs/API.md "NaN and Inf inputs").
FILL = 100.0


def on_cuda(cache, dtype):
    """(k_cache, v_cache, block_table, cache_seqlens) as CUDA tensors."""
    k, v = (lib_order(torch.from_numpy(x).to(DEV, DT[dtype]), cache.layout) for x in (cache.k, cache.v))
    return k, v, torch.from_numpy(cache.table).to(DEV), torch.from_numpy(cache.lens).to(DEV)


def cpu_reference(q, k, v, table, lens, **opts):
    """out and lse of the cpu-reference backend in float64 on host copies of
    a CUDA call's inputs (table None: dense k, v; opts in attention's names)."""
    host = [x.detach().cpu().double().numpy() for x in (q, k, v)]
    ints = [None if x is None else x.cpu().numpy() for x in (table, lens)]
    return flashcore.attention(*host, block_table=ints[0], seqused_k=ints[1], backend="cpu_reference",
                               return_lse=True, **opts)


def check(out, lse, expect, dtype):
    torch.cuda.synchronize()
    ref.check(ref.torch_to_lib(out), None if lse is None else lse.cpu().numpy(), expect[0],
              None if lse is None else expect[1], dtype)


def skip_unless_supported(q, k, v, table, lens, **opts):
    ok, why = flashcore.supported(q, k, v, block_table=table, seqused_k=lens, **opts)
    if not ok:
        assert why, "unsupported without a reason"
        pytest.skip(why)


PAGE_SIZES = [(1, 300), (16, 40), (64, 12), (256, 4)]  # (page_size, max_pages)

# name, Sq, Hq, Hkv, D, attention_with_kvcache options
CASES = [
    ("decode", 1, 8, 8, 128, {}),
    ("decode-gqa-causal", 1, 32, 4, 128, dict(causal=True)),
    ("sq3-causal-d64", 3, 8, 2, 64, dict(causal=True)),
    ("sq3-window", 3, 4, 1, 128, dict(window_size=(100, 0))),
    ("sq3-causal-window-softcap", 3, 16, 2, 128, dict(causal=True, window_size=(200, -1), softcap=30.0)),
]


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("pages", PAGE_SIZES, ids=["ps1", "ps16", "ps64", "ps256"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_paged_matches_cpu_reference(case, pages, dtype, layout):
    name, Sq, Hq, Hkv, D, opts = case
    ps, max_pages = pages
    rng = seeded("cuda", name, ps, dtype, layout)
    B = 6
    cache = Paged(rng, B, Hkv, D, ps, max_pages, capacity_lens(rng, B, ps * max_pages), layout, fill=FILL)
    k, v, table, lens = on_cuda(cache, dtype)
    q = torch.from_numpy(rng.standard_normal((B, Sq, Hq, D)).astype(np.float32)).to(DEV, DT[dtype])
    skip_unless_supported(q, k, v, table, lens, **flash_to_ref(opts))
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    res, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, out=out,
                                                return_softmax_lse=True, **opts)
    assert res is out and lse.shape == (B, Hq, Sq) and flashcore.kernel_info.backend == "cuda"
    check(out, lse, cpu_reference(q, k, v, table, lens, **flash_to_ref(opts)), dtype)


@pytest.mark.parametrize("cuda_path", [None, 80, 90], ids=["auto", "sm80", "sm90"])
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "dense-seqused"])
def test_cuda_paths(paged, cuda_path):
    rng = seeded("paths", paged, cuda_path)
    B, Sq, Hq, Hkv, D, ps, max_pages = 4, 2, 16, 2, 128, 64, 9
    cache = Paged(rng, B, Hkv, D, ps, max_pages, capacity_lens(rng, B, ps * max_pages), fill=FILL)
    k, v, table, lens = on_cuda(cache, "bf16")
    if not paged:  # the same keys gathered into a dense [B, S, Hkv, D] cache
        j = torch.arange(ps * max_pages, device=DEV)
        k, v = (x[table.long().clamp(0, cache.num_pages - 1)[:, j // ps], j % ps] for x in (k, v))
        table = None
    q = torch.randn(B, Sq, Hq, D, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(1))
    skip_unless_supported(q, k, v, table, lens, causal=True, cuda_path=cuda_path)
    out, lse = flashcore.attention(q, k, v, block_table=table, seqused_k=lens, causal=True, return_lse=True,
                                   cuda_path=cuda_path)
    check(out, lse, cpu_reference(q, k, v, table, lens, causal=True), "bf16")


def test_device_tables_are_checked():
    rng = seeded("checks")
    cache = Paged(rng, 2, 2, 128, 16, 4, [40, 64], fill=FILL)
    k, v, table, lens = on_cuda(cache, "bf16")
    q = torch.randn(2, 1, 4, 128, device=DEV, dtype=torch.bfloat16)
    skip_unless_supported(q, k, v, table, lens)
    out = torch.full_like(q, 7.0)
    bad = table.clone()
    bad[1, 3] = cache.num_pages
    with pytest.raises(flashcore.InvalidArgumentError, match=r"^block_table\[1\]\[3\] is"):
        flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=bad, out=out)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"^seqused_k\[0\] is 65"):
        flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens + 25, block_table=table, out=out)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"^block_table: must be on cuda:0"):
        flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table.cpu(), out=out)
    assert torch.all(out == 7.0)


class Decode:
    """A decode step's static tensors: q, a paged bf16 cache, its table and
    lengths; new_step() rewrites them in place with new values."""

    def __init__(self, seed):
        self.rng = seeded("decode", seed)
        self.B, self.Hq, self.Hkv, self.D, self.ps, self.max_pages = 4, 16, 2, 128, 16, 8
        cache = Paged(self.rng, self.B, self.Hkv, self.D, self.ps, self.max_pages, [1, 100, 128, 37], fill=FILL)
        self.num_pages = cache.num_pages
        self.k, self.v, self.table, self.lens = on_cuda(cache, "bf16")
        self.q = torch.randn(self.B, 1, self.Hq, self.D, device=DEV, dtype=torch.bfloat16)

    def new_step(self):
        """New lengths (0 to full), a new table (pages drawn at random, some
        shared), new q and keys."""
        lens = capacity_lens(self.rng, self.B, self.ps * self.max_pages)[::-1]
        pages = self.rng.integers(0, self.num_pages, size=(self.B, self.max_pages), dtype=np.int32)
        self.lens.copy_(torch.tensor(lens, dtype=torch.int32))
        self.table.copy_(torch.from_numpy(pages))
        for x in (self.q, self.k, self.v):
            x.copy_(torch.randn(x.shape, device=DEV, dtype=x.dtype))

    def call(self):
        return flashcore.attention_with_kvcache(self.q, self.k, self.v, cache_seqlens=self.lens,
                                                block_table=self.table, causal=True, return_softmax_lse=True)

    def expect(self):
        return cpu_reference(self.q, self.k, self.v, self.table, self.lens, causal=True)


def test_cuda_graph_replays_with_new_lengths():
    d = Decode(1)
    skip_unless_supported(d.q, d.k, d.v, d.table, d.lens, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch advises
        d.call()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        out, lse = d.call()
    for _ in range(3):
        d.new_step()
        out.fill_(float("nan"))
        g.replay()
        check(out, lse, d.expect(), "bf16")


def test_compile_fullgraph_and_reduce_overhead():
    d = Decode(2)
    skip_unless_supported(d.q, d.k, d.v, d.table, d.lens, causal=True)

    def step(q, k, v, table, lens):
        return flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, causal=True,
                                                return_softmax_lse=True)

    args = (d.q, d.k, d.v, d.table, d.lens)
    explain = torch._dynamo.explain(step)(*args)
    assert explain.graph_break_count == 0, explain.break_reasons
    with torch.no_grad():
        eager = step(*args)
        compiled = torch.compile(step, fullgraph=True)(*args)
        for a, b in zip(compiled, eager):
            assert torch.equal(a, b)
        graphed = torch.compile(step, fullgraph=True, mode="reduce-overhead")
        for _ in range(4):  # recorded, then replayed with new lengths and tables
            d.new_step()
            out, lse = graphed(*args)
            check(out, lse, d.expect(), "bf16")


@pytest.mark.parametrize("rotary", [None, (128, True), (64, False)], ids=["norot", "interleaved", "half-partial"])
@pytest.mark.parametrize("page_size", [None, 3, 16])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_append_matches_cpu_reference(dtype, page_size, rotary):
    """k_new/v_new (and rotary) on CUDA against the same call on host copies
    through the cpu-reference backend (its append step is checked against a
    float64 oracle in test_kvcache_append.py): out within the dtype's gate,
    the appended v rows bit for bit, k within one rounding, the rest
    untouched."""
    g = torch.Generator(device="cpu").manual_seed(int(seeded("append-cuda", dtype, page_size, rotary).integers(2 ** 31)))
    B, Hq, Hkv, D, new, cap = 3, 8, 2, 128, 2, 48
    dt = DT[dtype]
    rnd = lambda *s: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    q, k_new, v_new = rnd(B, new, Hq, D), rnd(B, new, Hkv, D), rnd(B, new, Hkv, D)
    lens = torch.tensor([0, 17, cap - new], dtype=torch.int32)
    if page_size:
        pages = B * cap // page_size
        k, v = rnd(pages, page_size, Hkv, D), rnd(pages, page_size, Hkv, D)
        table = torch.randperm(pages, generator=g).to(torch.int32).view(B, cap // page_size)
    else:
        k, v, table = rnd(B, cap, Hkv, D), rnd(B, cap, Hkv, D), None
    tables = {}
    if rotary:
        pos = torch.arange(cap + new, dtype=torch.float64)[:, None]
        ang = pos * 10000.0 ** (-torch.arange(0, rotary[0], 2, dtype=torch.float64) / rotary[0])
        tables = dict(rotary_cos=ang.cos().to(dt), rotary_sin=ang.sin().to(dt), rotary_interleaved=rotary[1])
    kh, vh = k.clone(), v.clone()
    expect = flashcore.attention(q, kh, vh, seqused_k=lens, block_table=table, k_new=k_new, v_new=v_new,
                                 causal=True, backend="cpu_reference", **tables)
    cu = lambda x: None if x is None else x.to(DEV)  # noqa: E731
    kd, vd = cu(k), cu(v)
    out = flashcore.attention_with_kvcache(cu(q), kd, vd, cache_seqlens=cu(lens), block_table=cu(table),
                                           k_new=cu(k_new), v_new=cu(v_new), causal=True,
                                           **{n: cu(t) if torch.is_tensor(t) else t for n, t in tables.items()})
    torch.cuda.synchronize()
    ref.check(ref.torch_to_lib(out), None, ref.torch_to_lib(expect), None, dtype)
    assert torch.equal(vd.cpu(), vh), "v cache differs from the cpu-reference's"
    eps = {"bf16": 2.0 ** -7, "f16": 2.0 ** -10}[dtype]
    diff = (kd.cpu().double() - kh.double()).abs()
    assert bool((diff <= eps * kh.double().abs() + 1e-6).all()), "k cache differs by more than one rounding"
