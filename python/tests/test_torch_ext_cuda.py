"""The torch ops' C++ kernels on CUDA tensors: the same bits as the Python
kernels (forward, deterministic backward, a paged cache, a forced kernel
family), torch's current stream (a side stream), another device than the
current one, CUDA graph capture, and a compiled step that calls no Python
kernel. Skipped cleanly without torch, a GPU or a CUDA build."""

import pytest

import flashcore

import cuda_only

torch = cuda_only.torch_with_cuda()
from flashcore import _attention, _backward, _torch_ext, _torch_ops  # noqa: E402  (need torch)
import op_options  # noqa: E402
from snippet import torch_rand  # noqa: E402

OPS = torch.ops.flashcore
DEV = torch.device("cuda")


def options(**kw):
    """op_options' with a causal, deterministic call as the default."""
    return op_options.options(**{"causal": True, "deterministic": True, **kw})


def rand(*shapes, seed, device=DEV, dtype=torch.bfloat16):
    return torch_rand(*shapes, seed=seed, device=device, dtype=dtype)


@pytest.fixture(scope="module", autouse=True)
def loaded():
    q, = rand((1, 64, 2, 64), seed=0)
    OPS.attention_fwd(q, q, q, *options())
    if not _torch_ext.active():
        pytest.fail("the C++ kernels did not load: " + _torch_ext.describe())


@pytest.fixture
def python_calls(monkeypatch):
    calls = []
    for mod, name in ((_attention, "_forward"), (_backward, "attention_backward")):
        fn = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _fn=fn, **kw: calls.append(1) or _fn(*a, **kw))
    return calls


def both(fn):
    cpp = fn()
    torch.cuda.synchronize()
    _torch_ext.set_enabled(False)
    try:
        py = fn()
        torch.cuda.synchronize()
    finally:
        _torch_ext.set_enabled(True)
    return cpp, py


def same(a, b):
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.stride() == y.stride() and torch.equal(x, y)


@pytest.mark.parametrize("cuda_path", [0, 80])
def test_forward_and_backward_equal_the_python_kernels(cuda_path, python_calls):
    q, k, v = rand((2, 200, 8, 64), (2, 300, 2, 64), (2, 300, 2, 64), seed=1)
    opts = options(cuda_path=cuda_path)
    cpp, py = both(lambda: OPS.attention_fwd(q, k, v, *opts))
    same(cpp, py)
    OPS.attention_fwd(q, k, v, *opts)  # the C++ kernel's call is this thread's kernel info
    info = flashcore.kernel_info
    assert info.backend == "cuda" and (cuda_path != 80 or info.name.startswith("sm80")), info
    out, lse = cpp
    dout, = rand(tuple(out.shape), seed=2)
    same(*both(lambda: OPS.attention_bwd(dout, q, k, v, out, lse, *opts)))
    assert len(python_calls) == 2


def test_paged_cache_equal(python_calls):
    B, Hq, Hkv, D, ps, pages = 4, 8, 2, 128, 16, 24
    q, = rand((B, 1, Hq, D), seed=3)
    k, v = rand((pages, ps, Hkv, D), (pages, ps, Hkv, D), seed=4)
    table = torch.randperm(pages, device=DEV)[:20].reshape(B, 5).int()
    lens = torch.tensor([1, 17, 80, 33], dtype=torch.int32, device=DEV)
    same(*both(lambda: OPS.attention_fwd(q, k, v, *options(), block_table=table, seqused_k=lens)))
    assert len(python_calls) == 1


def test_side_stream_and_graph_capture(python_calls):
    q, k, v = rand((1, 256, 8, 128), (1, 256, 8, 128), (1, 256, 8, 128), seed=5)
    expect, _ = OPS.attention_fwd(q, k, v, *options())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got, _ = OPS.attention_fwd(q.mul(1.0), k.mul(1.0), v.mul(1.0), *options())  # queued after the muls
    side.synchronize()
    assert torch.equal(got, expect)
    with torch.cuda.stream(side):  # warm-up off the capture, as torch advises
        OPS.attention_fwd(q, k, v, *options())
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = OPS.attention_fwd(q, k, v, *options())
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect) and not python_calls


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="one GPU")
def test_a_device_other_than_the_current_one(python_calls):
    dev = torch.device("cuda", 1)
    q, k, v = rand((1, 128, 4, 64), (1, 128, 4, 64), (1, 128, 4, 64), seed=6, device=dev)
    cpp, py = both(lambda: OPS.attention_fwd(q, k, v, *options()))
    same(cpp, py)
    assert cpp[0].device == dev and len(python_calls) == 1


def test_compiled_step_calls_no_python_kernel(python_calls):
    q0, k0, v0 = rand((2, 8, 256, 64), (2, 2, 256, 64), (2, 2, 256, 64), seed=7)

    def f(q, k, v):
        return flashcore.attention(q, k, v, layout="bhsd", causal=True, deterministic=True).float().square().sum()

    def step(fn):
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        fn(q, k, v).backward()
        return q.grad, k.grad, v.grad

    compiled = torch.compile(f, fullgraph=True)
    step(compiled)
    n = len(python_calls)
    got = step(compiled)
    assert len(python_calls) == n
    for x, y in zip(got, step(f)):
        torch.testing.assert_close(x, y)
