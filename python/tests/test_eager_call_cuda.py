"""flashcore.attention's C++ eager call on CUDA tensors: the same bits,
strides and kernel as the binding's Python path (the mission and decode
shapes, bhsd views, options, out=, lse, a forced kernel family, a paged
cache), torch's current stream (a side stream), CUDA graph capture,
another device than the current one, threads at once. Skipped cleanly
without torch, a GPU or a CUDA build."""

import pytest

import flashcore

import cuda_only

torch = cuda_only.torch_with_cuda()
from flashcore import _attention, _torch_ext  # noqa: E402  (need torch)
from snippet import run_in_threads, torch_rand  # noqa: E402

DEV = torch.device("cuda")


def rand(*shapes, seed, device=DEV, dtype=torch.float16):
    return torch_rand(*shapes, seed=seed, device=device, dtype=dtype)


@pytest.fixture(scope="module", autouse=True)
def loaded():
    q, = rand((1, 64, 2, 64), seed=0)
    flashcore.attention(q, q, q)  # the first eager call loads the kernels
    if _attention._eager is None:
        pytest.fail("no C++ eager call: " + _torch_ext.describe())


def taken(fn):
    n = _torch_ext.eager_calls()
    res = fn()
    return res, _torch_ext.eager_calls() == n + 1


def python_path(fn):
    eager, _attention._eager = _attention._eager, None
    try:
        return fn()
    finally:
        _attention._eager = eager


def same(a, b):
    a, b = (x if isinstance(x, tuple) else (x,) for x in (a, b))
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype and torch.equal(x, y)


def check_both(fn):
    """fn() on the eager call (which must take it) and on the Python path:
    the same bits and kernel."""
    cpp, ran = taken(fn)
    info = flashcore.kernel_info
    assert ran, _torch_ext.describe()
    py = python_path(fn)
    torch.cuda.synchronize()
    same(cpp, py)
    assert flashcore.kernel_info == info and info.backend == "cuda"
    return cpp


# name, q and k/v [B,S,H,D], dtype, options
CASES = [
    ("mission", (1, 512, 8, 64), (1, 512, 8, 64), torch.float16, {}),
    ("mission-bhsd-causal", (1, 512, 8, 64), (1, 512, 8, 64), torch.float16, dict(layout="bhsd", causal=True)),
    ("decode-b8-gqa", (8, 1, 32, 128), (8, 4096, 8, 128), torch.float16, {}),
    ("bf16-window-softcap-lse", (2, 200, 8, 64), (2, 300, 2, 64), torch.bfloat16,
     dict(window=(64, 0), softcap=30.0, return_lse=True)),
    ("sm80-family", (2, 200, 8, 64), (2, 300, 2, 64), torch.bfloat16, dict(causal=True, cuda_path=80)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bits_equal_the_python_path(case):
    _, qs, ks, dtype, kw = case
    q, k, v = rand(qs, ks, ks, seed=1, dtype=dtype)
    if kw.get("layout") == "bhsd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    if kw.get("cuda_path") == 80 and not flashcore.supported(q, k, v, **kw)[0]:
        pytest.skip("no sm80 kernels for this call: %s" % (flashcore.supported(q, k, v, **kw),))
    check_both(lambda: flashcore.attention(q, k, v, **kw))


def test_out_given():
    q, k, v = rand((1, 512, 8, 64), (1, 512, 8, 64), (1, 512, 8, 64), seed=2)
    outs = [torch.full_like(q, float("nan")) for _ in range(2)]
    got, ran = taken(lambda: flashcore.attention(q, k, v, out=outs[0]))
    assert ran and got is outs[0]
    assert python_path(lambda: flashcore.attention(q, k, v, out=outs[1])) is outs[1]
    torch.cuda.synchronize()
    same(outs[0], outs[1])


def test_paged_cache():
    B, Hq, Hkv, D, ps, pages = 4, 8, 2, 128, 16, 24
    q, = rand((B, 1, Hq, D), seed=3)
    k, v = rand((pages, ps, Hkv, D), (pages, ps, Hkv, D), seed=4)
    table = torch.randperm(pages, device=DEV)[:20].reshape(B, 5).int()
    lens = torch.tensor([1, 17, 80, 33], dtype=torch.int32, device=DEV)
    check_both(lambda: flashcore.attention(q, k, v, causal=True, block_table=table, seqused_k=lens))


def test_side_stream_and_graph_capture():
    q, k, v = rand((1, 256, 8, 128), (1, 256, 8, 128), (1, 256, 8, 128), seed=5)
    expect = flashcore.attention(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got, ran = taken(lambda: flashcore.attention(q.mul(1.0), k.mul(1.0), v.mul(1.0), causal=True))  # after the muls
    side.synchronize()
    assert ran and torch.equal(got, expect)
    with torch.cuda.stream(side):  # warm-up off the capture, as torch advises
        flashcore.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, ran = taken(lambda: flashcore.attention(q, k, v, causal=True))
    assert ran
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one GPU")
def test_a_device_other_than_the_current_one():
    dev = torch.device("cuda", 1)
    q, k, v = rand((1, 128, 4, 64), (1, 128, 4, 64), (1, 128, 4, 64), seed=6, device=dev)
    got, ran = taken(lambda: flashcore.attention(q, k, v))
    assert ran and got.device == dev
    want = python_path(lambda: flashcore.attention(q, k, v))
    torch.cuda.synchronize(dev)
    same(got, want)


def test_threads_at_once():
    cases = [rand((2, 128, 8, 64), (2, 160, 2, 64), (2, 160, 2, 64), seed=20 + i) for i in range(4)]
    want = [flashcore.attention(*c, causal=True) for c in cases]
    torch.cuda.synchronize()
    got, ran = {}, {}

    def work(i):
        n = _torch_ext.eager_calls()
        for _ in range(20):
            got[i] = flashcore.attention(*cases[i], causal=True)
        torch.cuda.current_stream().synchronize()
        ran[i] = _torch_ext.eager_calls() - n

    run_in_threads(4, work)
    for i in range(4):
        same(got[i], want[i])
        assert ran[i] == 19  # all but the first, which made the thread's context
