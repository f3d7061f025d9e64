"""The torch ops' C++ kernels (flashcore/_torch_ext.py, csrc/op_kernels.cpp)
on the CPU: the same bits as the ops' Python kernels on random inputs
(forward, backward, autograd, paged caches), torch.compile(fullgraph=True)
running them, the calls they hand to the Python kernel (varlen, empty
tensors, errors: the same class and message), one fc_context per thread
shared with the binding, and the Python kernels where the C++ ones are
switched off or cannot be built. Skipped without torch, without a C++
compiler and with FLASHCORE_TORCH_EXT=0; fails where a compiler is there
but the kernels do not build."""

import os
import shutil
import threading

import pytest

import flashcore

torch = pytest.importorskip("torch")
_torch_ops = flashcore._attention._torch_ops()
from flashcore import _attention, _backward, _context, _torch_ext  # noqa: E402
from snippet import run_in_threads, run_snippet  # noqa: E402
from snippet import torch_rand as rand  # noqa: E402

OPS = torch.ops.flashcore
if os.environ.get("FLASHCORE_TORCH_EXT") == "0":
    pytest.skip("FLASHCORE_TORCH_EXT=0: the C++ kernels are off", allow_module_level=True)


from op_options import options  # noqa: E402  (needs torch)


@pytest.fixture(scope="module", autouse=True)
def loaded():
    q, = rand((1, 4, 2, 16), seed=0)
    OPS.attention_fwd(q, q, q, *options())  # the first call loads the C++ kernels
    if not _torch_ext.active() and shutil.which(os.environ.get("CXX") or "c++") is None:
        pytest.skip("no C++ compiler: " + _torch_ext.describe())
    assert _torch_ext.active(), _torch_ext.describe()


class PythonCalls:
    """Counts the calls that reach the Python kernels' bodies."""

    def __init__(self, monkeypatch):
        self.n = 0
        for mod, name in ((_attention, "_forward"), (_backward, "attention_backward")):
            monkeypatch.setattr(mod, name, self._counting(getattr(mod, name)))

    def _counting(self, fn):
        def run(*a, **kw):
            self.n += 1
            return fn(*a, **kw)
        return run


@pytest.fixture
def python_calls(monkeypatch):
    return PythonCalls(monkeypatch)


def both(fn):
    """fn() with the C++ kernels, then with the Python kernels."""
    cpp = fn()
    _torch_ext.set_enabled(False)
    try:
        py = fn()
    finally:
        _torch_ext.set_enabled(True)
    return cpp, py


def bits(x):
    """x's elements as integers: equal bits, not just equal values."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}
    return x.detach().contiguous().view(ints[x.element_size()])


def same_bits(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype
        assert torch.equal(bits(x), bits(y))


# name, [B,S,H,D] shapes of q and k/v, dtype, options
FWD_CASES = [
    ("f32-causal-gqa", (2, 9, 4, 16), (2, 12, 2, 16), torch.float32, dict(causal=True)),
    ("f16-bhsd-window-softcap", (2, 7, 2, 32), (2, 7, 2, 32), torch.float16,
     dict(bhsd=True, window_left=2, window_right=1, softcap=3.0, scale=0.2)),
    ("bf16-mqa-scale", (1, 5, 4, 64), (1, 33, 1, 64), torch.bfloat16, dict(scale=-0.1, causal=True)),
    ("f64-reference", (1, 6, 2, 8), (1, 6, 2, 8), torch.float64, dict(backend="cpu_reference")),
    ("f32-backend-CPU", (1, 3, 2, 8), (1, 5, 2, 8), torch.float32, dict(backend="CPU", window_left=1)),
]


@pytest.mark.parametrize("case", FWD_CASES, ids=[c[0] for c in FWD_CASES])
def test_forward_and_backward_bits_equal_the_python_kernels(case, python_calls):
    _, qs, ks, dtype, kw = case
    q, k, v = rand(qs, ks, ks, seed=1, dtype=dtype)
    if kw.get("bhsd"):
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [B,H,S,D] views: any strides
    opts = options(**kw)
    cpp, py = both(lambda: OPS.attention_fwd(q, k, v, *opts))
    same_bits(cpp, py)
    out, lse = cpp
    dout, = rand(tuple(out.shape), seed=2, dtype=dtype)
    cpp_g, py_g = both(lambda: OPS.attention_bwd(dout, q, k, v, out, lse, *opts))
    same_bits(cpp_g, py_g)
    assert python_calls.n == 2  # the Python kernels ran only while the C++ ones were off


def test_autograd_gradients_bits_equal(python_calls):
    def step():
        q, k, v = (x.requires_grad_() for x in rand((2, 11, 4, 32), (2, 13, 2, 32), (2, 13, 2, 32), seed=3))
        out = flashcore.attention(q, k, v, causal=True, softcap=5.0)
        (out.float() * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        return out, q.grad, k.grad, v.grad

    cpp, py = both(step)
    same_bits(cpp, py)
    assert "flashcore::AttentionBackward" in cpp[0].grad_fn.name()  # the C++ formula
    assert "flashcore_attention_fwd" in py[0].grad_fn.name()  # register_autograd's
    assert python_calls.n == 2


def _formula(t):
    """Which autograd formula recorded t: 'c++' or 'python' (register_autograd's)."""
    name = t.grad_fn.name()
    return "c++" if "flashcore::AttentionBackward" in name else "python" if "flashcore_attention_fwd" in name else name


def test_cpp_formula_takes_what_the_python_one_did():
    def step(grads, **kw):
        q, k, v = rand((2, 7, 4, 16), (2, 9, 2, 16), (2, 9, 2, 16), seed=11)
        for x, g in zip((q, k, v), grads):
            x.requires_grad_(g)
        out = flashcore.attention(q, k, v, **kw)
        out.sum().backward()  # a broadcast dout: stride 0 everywhere
        return [out] + [x.grad for x, g in zip((q, k, v), grads) if g], _formula(out)

    for grads in ((True, True, True), (False, False, True), (True, False, False)):
        (cpp, fc), (py, fp) = both(lambda: step(grads, window=(3, 0), scale=0.3))
        assert (fc, fp) == ("c++", "python")
        same_bits(cpp, py)
    # varlen offsets ride along to the backward (whose kernel hands them to Python)
    qv, kv, vv = (x.requires_grad_() for x in rand((10, 4, 16), (8, 2, 16), (8, 2, 16), seed=12))
    cu_q, cu_k = torch.tensor([0, 3, 3, 10], dtype=torch.int32), torch.tensor([0, 5, 8, 8], dtype=torch.int32)

    def varlen():
        for x in (qv, kv, vv):
            x.grad = None
        out = flashcore.attention(qv, kv, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
        (out * out).sum().backward()
        return [out, qv.grad, kv.grad, vv.grad], _formula(out)

    (cpp, fc), (py, fp) = both(varlen)
    assert (fc, fp) == ("c++", "python")
    same_bits(cpp, py)


def test_cpp_formula_autograd_rules():
    q, k, v = (x.requires_grad_() for x in rand((1, 5, 2, 16), (1, 5, 2, 16), (1, 5, 2, 16), seed=13))
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    assert _formula(out) == "c++" and not lse.requires_grad
    dq, = torch.autograd.grad(out.sum(), q, retain_graph=True)
    dq2, = torch.autograd.grad(out.sum(), q)  # the graph kept, run twice: the same gradient
    assert torch.equal(dq, dq2)
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        out.sum().backward()
    out = flashcore.attention(q, k, v)
    with torch.no_grad():
        k.mul_(2)  # a saved input changed in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    out = flashcore.attention(q, k, v)
    g, = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(flashcore.UnsupportedError, match="double backward"):
        g.sum().backward()


def test_python_formula_where_the_cpp_one_does_not_go():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    q, k, v = (x.requires_grad_() for x in rand((1, 5, 2, 16), (1, 5, 2, 16), (1, 5, 2, 16), seed=14))
    with Watch():
        out = flashcore.attention(q, k, v)
    assert _formula(out) == "python"
    B, Hkv, D, ps, pages = 2, 2, 16, 4, 4
    kc, vc = (x.requires_grad_() for x in rand((pages, ps, Hkv, D), (pages, ps, Hkv, D), seed=15))
    table = torch.arange(pages, dtype=torch.int32).reshape(B, 2)
    out = flashcore.attention_with_kvcache(q[:, :1].detach().expand(B, 1, 2, D).contiguous(), kc, vc,
                                           block_table=table, cache_seqlens=torch.tensor([3, 8], dtype=torch.int32))
    assert _formula(out) == "python"
    with pytest.raises(flashcore.UnsupportedError, match="paged KV cache"):
        out.sum().backward()


def test_paged_cache_bits_equal(python_calls):
    B, Hq, Hkv, D, ps, pages = 3, 4, 2, 32, 8, 10
    q, = rand((B, 2, Hq, D), seed=4)
    k, v = rand((pages, ps, Hkv, D), (pages, ps, Hkv, D), seed=5)
    table = torch.randperm(pages, generator=torch.Generator().manual_seed(6))[:9].reshape(B, 3).int()
    lens = torch.tensor([0, 17, 24], dtype=torch.int32)
    opts = options(causal=True)
    cpp, py = both(lambda: OPS.attention_fwd(q, k, v, *opts, block_table=table, seqused_k=lens))
    same_bits(cpp, py)
    assert python_calls.n == 1
    # int64 tables are converted: the Python kernel takes them
    OPS.attention_fwd(q, k, v, *opts, block_table=table.long(), seqused_k=lens)
    assert python_calls.n == 2


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compiled_model_runs_the_cpp_kernels(backend, python_calls):
    q0, k0, v0 = rand((2, 16, 4, 32), (2, 16, 2, 32), (2, 16, 2, 32), seed=7)

    def f(q, k, v):
        return flashcore.attention(q, k, v, causal=True, layout="bhsd").float().square().sum()

    def step(fn):
        q, k, v = (x.transpose(1, 2).clone().requires_grad_() for x in (q0, k0, v0))
        loss = fn(q, k, v)
        loss.backward()
        return loss, q.grad, k.grad, v.grad

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    got = step(compiled)
    n = python_calls.n
    got = step(compiled)
    assert python_calls.n == n  # forward and backward graphs: C++ kernels only
    with torch.no_grad():
        torch.compile(lambda q: flashcore.attention(q, q, q), fullgraph=True, backend=backend)(q0)
    assert python_calls.n == n
    want = step(f)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_calls_the_cpp_kernels_leave_to_python(python_calls):
    qv, kv, vv = rand((10, 4, 16), (8, 2, 16), (8, 2, 16), seed=8)
    cu_q = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 8, 8], dtype=torch.int32)
    cpp, py = both(lambda: OPS.attention_fwd(qv, kv, vv, *options(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)))
    same_bits(cpp, py)
    assert python_calls.n == 2  # varlen: the Python kernel both times
    q, = rand((2, 0, 4, 16), seed=9)
    k, = rand((2, 5, 2, 16), seed=9)
    out, lse = OPS.attention_fwd(q, k, k, *options())  # no query rows
    assert out.shape == q.shape and lse.shape == (2, 4, 0) and python_calls.n == 3


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (compared as they are)
        return type(e), str(e)
    raise AssertionError("no error")


def qkv(edit=lambda i, x: x):
    return [edit(i, x) for i, x in enumerate(rand((1, 4, 2, 16), (1, 6, 2, 16), (1, 6, 2, 16), seed=10))]


def bwd(edit, **kw):
    """attention_bwd on a forward's tensors, edit(i, x) applied to (dout, q, k, v, out, lse)."""
    q, k, v = qkv()
    out, lse = OPS.attention_fwd(q, k, v, *options())
    args = [edit(i, x) for i, x in enumerate((out, q, k, v, out, lse))]
    return OPS.attention_bwd(*args, *options(**kw))


def fwd(edit=lambda i, x: x, *args, **kw):
    """attention_fwd on qkv(edit); args, kw: the options and the paged cache."""
    return OPS.attention_fwd(*qkv(edit), *(args or options()), **kw)


def at(j, change):
    """An edit that changes the j-th tensor only."""
    return lambda i, x: change(x) if i == j else x


# name: a call that raises (its tensors made when it runs: collecting loads nothing)
ERRORS = {
    "library: head dims differ": lambda: fwd(at(1, lambda x: x[..., :8])),
    "library: kv heads differ": lambda: fwd(at(2, lambda x: x[:, :, :1])),
    "binding: backend name": lambda: fwd(at(0, lambda x: x), *options(backend="gpu")),
    "binding: cuda backend on cpu": lambda: fwd(at(0, lambda x: x), *options(backend="cuda")),
    "binding: window past int32": lambda: fwd(at(0, lambda x: x), *options(window_left=2**31)),
    "binding: scale rounds to 0": lambda: fwd(at(0, lambda x: x), *options(scale=1e-50)),
    "binding: softcap inf": lambda: fwd(at(0, lambda x: x), *options(softcap=float("inf"))),
    "binding: cuda_path": lambda: fwd(at(0, lambda x: x), *options(cuda_path=70)),
    "binding: dtypes differ": lambda: fwd(at(1, lambda x: x.double())),
    "binding: 3-D dense": lambda: fwd(lambda i, x: x[0]),
    "binding: head_dim stride": lambda: fwd(at(2, lambda x: x.transpose(1, 3).contiguous().transpose(1, 3))),
    "binding: table rows": lambda: fwd(block_table=torch.zeros(2, 1, dtype=torch.int32)),
    "binding: fp8": lambda: fwd(lambda i, x: x.to(torch.float8_e4m3fn)),
    "backward: lse dtype": lambda: bwd(at(5, lambda x: x.double())),
    "backward: lse shape": lambda: bwd(at(5, lambda x: x[:, :1])),
    "backward: out shape": lambda: bwd(at(4, lambda x: x[:, :2])),
    "backward: dout dtype": lambda: bwd(at(0, lambda x: x.half())),
    "backward: backend name": lambda: bwd(at(0, lambda x: x), backend="nope"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_keep_their_class_and_message(name):
    if "fp8" in name and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no FP8 dtypes in this torch")
    cpp, py = both(lambda: _error(ERRORS[name]))
    assert cpp == py
    assert issubclass(cpp[0], flashcore.FlashCoreError), cpp


def test_one_context_per_thread_shared_with_the_binding():
    q, = rand((1, 4, 2, 16), seed=11)
    flashcore.attention(q.numpy(), q.numpy(), q.numpy())  # a Python call
    OPS.attention_fwd(q, q, q, *options(backend="cpu_reference"))
    ctx = _context.context()
    assert ctx._shared is not None and ctx.handle.value == ctx._shared.ctx
    assert flashcore.kernel_info.backend == "cpu_reference"  # the C++ kernel's call
    prof = flashcore.last_host_profile()
    OPS.attention_fwd(q, q, q, *options(backend="cpu"))
    assert flashcore.kernel_info.backend == "cpu" and flashcore.last_host_profile() != prof
    seen = {}

    def worker():
        OPS.attention_fwd(q, q, q, *options(backend="cpu_reference"))  # the C++ kernel first
        c = _context.context()
        seen["handle"], seen["backend"] = c.handle.value, flashcore.kernel_info.backend

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["backend"] == "cpu_reference" and seen["handle"] not in (None, ctx.handle.value)


def test_threads_at_once():
    # each thread its own context; the results are a single thread's
    cases = [rand((2, 9, 4, 16), (2, 12, 2, 16), (2, 12, 2, 16), seed=20 + i) for i in range(4)]
    want = [OPS.attention_fwd(*c, *options(causal=True)) for c in cases]
    got = {}

    def work(i):
        for _ in range(20):
            got[i] = OPS.attention_fwd(*cases[i], *options(causal=True))

    run_in_threads(4, work)
    for i in range(4):
        same_bits(got[i], want[i])


FALLBACK = """
    import torch, flashcore
    from flashcore import _torch_ext
    q = torch.randn(1, 5, 2, 16, requires_grad=True)
    out = flashcore.attention(q, q, q, causal=True)
    out.sum().backward()
    g = torch.compile(lambda q: flashcore.attention(q, q, q), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        g(q)
    try:
        flashcore.attention(q, q[..., :8], q, causal=True)
    except flashcore.InvalidArgumentError:
        pass
    print(_torch_ext.describe())
"""


def test_switched_off_by_the_environment():
    assert run_snippet(FALLBACK, FLASHCORE_TORCH_EXT="0") == "python (FLASHCORE_TORCH_EXT=0)"


def test_a_failed_build_leaves_the_python_kernels(tmp_path):
    got = run_snippet(FALLBACK, CXX=str(tmp_path / "no-such-compiler"), FLASHCORE_CACHE_DIR=str(tmp_path))
    assert got.startswith("python (") and "no-such-compiler" in got
