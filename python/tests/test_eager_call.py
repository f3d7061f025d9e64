"""flashcore.attention's C++ eager call (csrc/op_kernels.cpp, built with
the torch ops' kernels by _torch_ext) on CPU tensors: it takes the plain
calls (a per-thread counter says so), with the same bits, strides, kernel
and returned objects as the binding's Python path; it leaves every other
call to the Python path, whose errors (class and message) stay as they
were; threads at once; torch.compile and autograd still go through the
ops; and where the kernels are off, or were built without the eager call,
the Python path runs everything. Skipped without torch, without a C++
compiler and with FLASHCORE_TORCH_EXT=0."""

import os
import shutil
import threading

import numpy as np
import pytest

import flashcore

torch = pytest.importorskip("torch")
from flashcore import _attention, _context, _torch_ext  # noqa: E402
from snippet import run_in_threads, run_snippet  # noqa: E402
from snippet import torch_rand as rand  # noqa: E402

if os.environ.get("FLASHCORE_TORCH_EXT") == "0":
    pytest.skip("FLASHCORE_TORCH_EXT=0: the C++ kernels are off", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def loaded():
    q = torch.zeros(1, 4, 2, 16)
    flashcore.attention(q, q, q)  # the first eager call loads the kernels
    if not _torch_ext.active() and shutil.which(os.environ.get("CXX") or "c++") is None:
        pytest.skip("no C++ compiler: " + _torch_ext.describe())
    assert _torch_ext.active(), _torch_ext.describe()
    if _attention._eager is None and "no Python.h" in _torch_ext.describe():
        pytest.skip(_torch_ext.describe())
    assert _attention._eager is not None, _torch_ext.describe()
    assert _torch_ext.describe().endswith("eager calls c++")


def bits(x):
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}
    return x.detach().contiguous().view(ints[x.element_size()])


def same_bits(a, b):
    a, b = (x if isinstance(x, tuple) else (x,) for x in (a, b))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.stride() == y.stride() and x.dtype == y.dtype
        assert torch.equal(bits(x), bits(y))


class Paths:
    """Runs a call on the C++ eager call, then on the Python path, and
    counts which took it."""

    def __init__(self, monkeypatch):
        self.python = 0
        forward = _attention._forward

        def counting(*a, **kw):
            self.python += 1
            return forward(*a, **kw)
        monkeypatch.setattr(_attention, "_forward", counting)

    def both(self, fn):
        """(fn() on the eager call, its kernel info, fn() on the Python path, its kernel info)."""
        cpp = fn()
        cpp_info = flashcore.kernel_info
        eager, _attention._eager = _attention._eager, None
        try:
            py = fn()
            py_info = flashcore.kernel_info
        finally:
            _attention._eager = eager
        return cpp, cpp_info, py, py_info


@pytest.fixture
def paths(monkeypatch):
    return Paths(monkeypatch)


def taken(fn):
    """fn()'s result, and whether the eager call ran it."""
    n = _torch_ext.eager_calls()
    res = fn()
    return res, _torch_ext.eager_calls() == n + 1


# name, q and k/v shapes ([B,S,H,D]; bhsd: transposed views of them), dtype, attention() options
CASES = [
    ("f32-causal-gqa", (2, 9, 4, 16), (2, 12, 2, 16), torch.float32, dict(causal=True)),
    ("f16-bhsd-window-softcap-scale", (2, 7, 2, 32), (2, 7, 2, 32), torch.float16,
     dict(layout="bhsd", window=(2, 1), softcap=3.0, scale=0.2)),
    ("bf16-mqa-negative-scale-lse", (1, 5, 4, 64), (1, 33, 1, 64), torch.bfloat16,
     dict(scale=-0.1, causal=True, return_lse=True)),
    ("f64-reference", (1, 6, 2, 8), (1, 6, 2, 8), torch.float64, dict(backend="cpu_reference")),
    ("f32-backend-CPU-layout-BSHD", (1, 3, 2, 8), (1, 5, 2, 8), torch.float32,
     dict(backend="CPU", layout="BSHD", window=(1, -1), softcap=2, scale=1)),
    ("f32-none-options", (1, 4, 2, 16), (1, 4, 2, 16), torch.float32,
     dict(window=None, softcap=None, scale=None, cuda_path=None, return_lse=True)),
    ("f32-cuda-path-90", (1, 4, 2, 16), (1, 6, 2, 16), torch.float32, dict(cuda_path=90, deterministic=True)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bits_equal_the_python_path(case, paths):
    _, qs, ks, dtype, kw = case
    q, k, v = rand(qs, ks, ks, seed=1, dtype=dtype)
    if kw.get("layout", "").lower() == "bhsd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # any strides, no copy
    (cpp, ran), = [taken(lambda: flashcore.attention(q, k, v, **kw))]
    assert ran and paths.python == 0
    _, cpp_info, py, py_info = paths.both(lambda: flashcore.attention(q, k, v, **kw))
    assert paths.python == 1
    same_bits(cpp, py)
    assert cpp_info == py_info and cpp_info.backend.startswith("cpu")


def test_strided_inputs_and_out(paths):
    # a sliced q, k with a broadcast (stride-0) batch, v from a wider tensor; out= given, poisoned
    big, = rand((2, 12, 4, 32), seed=2)
    q = big[:, 2:9, :, :16]
    k = rand((1, 10, 2, 16), seed=3)[0].expand(2, 10, 2, 16)
    v = rand((2, 10, 3, 16), seed=4)[0][:, :, 1:]
    outs = [torch.full_like(q, float("nan")) for _ in range(2)]
    cpp, ran = taken(lambda: flashcore.attention(q, k, v, out=outs[0], causal=True))
    assert ran and cpp is outs[0]
    eager, _attention._eager = _attention._eager, None
    try:
        py = flashcore.attention(q, k, v, out=outs[1], causal=True)
    finally:
        _attention._eager = eager
    assert py is outs[1] and paths.python == 1
    same_bits(cpp, py)
    # out= in bhsd, with the lse
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    out = torch.empty_like(qt)
    cpp, _, py, _ = paths.both(lambda: flashcore.attention(qt, kt, vt, layout="bhsd", out=out, return_lse=True))
    assert cpp[0] is out and py[0] is out and paths.python == 2
    same_bits(cpp[1], py[1])


def test_paged_cache_bits_equal(paths):
    B, Hq, Hkv, D, ps, pages = 3, 4, 2, 32, 8, 10
    q, = rand((B, 2, Hq, D), seed=5)
    k, v = rand((pages, ps, Hkv, D), (pages, ps, Hkv, D), seed=6)
    table = torch.randperm(pages, generator=torch.Generator().manual_seed(7))[:9].reshape(B, 3).int()
    lens = torch.tensor([0, 17, 24], dtype=torch.int32)
    dense_lens = torch.tensor([5], dtype=torch.int32)
    for kw in (dict(block_table=table, seqused_k=lens), dict(block_table=table), dict(seqused_k=dense_lens)):
        qq = q if "block_table" in kw else q[1:2]
        kk, vv = (k, v) if "block_table" in kw else (k[:1].reshape(1, ps, Hkv, D), v[:1].reshape(1, ps, Hkv, D))
        cpp, ran = taken(lambda: flashcore.attention(qq, kk, vv, causal=True, **kw))
        assert ran
        _, _, py, _ = paths.both(lambda: flashcore.attention(qq, kk, vv, causal=True, **kw))
        same_bits(cpp, py)


def test_inference_mode_and_no_grad(paths):
    q, k, v = rand((1, 6, 2, 16), (1, 6, 2, 16), (1, 6, 2, 16), seed=8)
    with torch.inference_mode():
        qi, ki, vi = (x.clone() for x in (q, k, v))  # inference tensors: fewer dispatch keys
        cpp, ran = taken(lambda: flashcore.attention(qi, ki, vi))
        assert ran
    leaf = [x.clone().requires_grad_() for x in (q, k, v)]
    with torch.no_grad():  # autograd records nothing: the eager call takes tensors that require grad
        res, ran = taken(lambda: flashcore.attention(*leaf))
        assert ran and not res.requires_grad
    same_bits(cpp, res)
    assert paths.python == 0


class _Sub(torch.Tensor):
    pass


class _FunctionMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _DispatchMode(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _not_taken_cases():
    q, k, v = rand((1, 6, 2, 16), (1, 6, 2, 16), (1, 6, 2, 16), seed=9)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    lens = torch.tensor([6], dtype=torch.int32)
    table = torch.zeros(1, 1, dtype=torch.int32)
    return [  # (name, call): each runs on the Python path, and succeeds there
        ("window list", lambda: flashcore.attention(q, k, v, window=[2, 0])),
        ("window numpy ints", lambda: flashcore.attention(q, k, v, window=(np.int64(2), 0))),
        ("causal int", lambda: flashcore.attention(q, k, v, causal=1)),
        ("return_lse int", lambda: flashcore.attention(q, k, v, return_lse=1)),
        ("softcap bool", lambda: flashcore.attention(q, k, v, softcap=False)),
        ("scale numpy", lambda: flashcore.attention(q, k, v, scale=np.float32(0.5))),
        ("cuda_path numpy", lambda: flashcore.attention(q, k, v, cuda_path=np.int64(90))),
        ("max_seqlen on a dense call", lambda: flashcore.attention(q, k, v, max_seqlen_q=6)),
        ("varlen", lambda: flashcore.attention(q[0], k[0], v[0], cu_seqlens_q=cu, cu_seqlens_k=cu)),
        ("all numpy", lambda: flashcore.attention(q.numpy(), k.numpy(), v.numpy())),
        ("no query rows", lambda: flashcore.attention(q[:, :0], k, v)),
        ("int64 seqused_k", lambda: flashcore.attention(q, k, v, seqused_k=lens.long())),
        ("int64 block_table", lambda: flashcore.attention(q, k, v, block_table=table.long(), seqused_k=lens)),
        ("list block_table, int32 seqused_k", lambda: flashcore.attention(q, k, v, block_table=[[0]],
                                                                          seqused_k=lens)),
        ("out requires grad, not a leaf", lambda: flashcore.attention(
            q, k, v, out=torch.zeros(1, requires_grad=True).expand(1, 6, 2, 16) * 1)),
        ("subclass", lambda: flashcore.attention(q.as_subclass(_Sub), k, v)),
        ("torch function mode", lambda: _in(_FunctionMode(), lambda: flashcore.attention(q, k, v))),
        ("dispatch mode", lambda: _in(_DispatchMode(), lambda: flashcore.attention(q, k, v))),
        ("negative view", lambda: flashcore.attention(torch._neg_view(q), k, v)),
        ("k_new", lambda: flashcore.attention(q, k.clone(), v.clone(), k_new=k[:, :1], v_new=v[:, :1],
                                              seqused_k=torch.tensor([2], dtype=torch.int32))),
        ("fp8 options", lambda: flashcore.attention(q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn),
                                                    k_descale=2.0)),
        ("out_dtype", lambda: flashcore.attention(q, k, v, out_dtype=torch.float32)),
        ("fp8 tensors", lambda: flashcore.attention(*(x.to(torch.float8_e4m3fn) for x in (q, k, v)))),
    ]


def _in(mode, fn):
    with mode:
        return fn()


NOT_TAKEN = [name for name, _ in _not_taken_cases()]


@pytest.mark.parametrize("name", NOT_TAKEN)
def test_calls_left_to_the_python_path(name, paths):
    if "fp8" in name and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no FP8 dtypes in this torch")
    fn = dict(_not_taken_cases())[name]
    res, ran = taken(fn)
    assert not ran and paths.python == 1
    assert res is not None


def test_autograd_and_compile_take_the_ops():
    q, k, v = (x.requires_grad_() for x in rand((1, 6, 4, 16), (1, 6, 2, 16), (1, 6, 2, 16), seed=10))
    n = _torch_ext.eager_calls()
    out = flashcore.attention(q, k, v, causal=True)
    assert "flashcore::AttentionBackward" in out.grad_fn.name()  # the op's C++ formula
    out.sum().backward()
    assert q.grad is not None and _torch_ext.eager_calls() == n
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, causal=True), fullgraph=True,
                      backend="aot_eager")
    with torch.no_grad():
        got = f(q, k, v)
        _torch_ext.set_enabled(False)  # the eager call comes and goes: the graph reads none of it
        try:
            with torch._dynamo.config.patch(error_on_recompile=True):
                f(q, k, v)
        finally:
            _torch_ext.set_enabled(True)
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = f(q, k, v)
        assert _torch_ext.eager_calls() == n  # the graph calls the op
        same_bits(got, flashcore.attention(q, k, v, causal=True))
    assert _torch_ext.eager_calls() == n + 1


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (compared as they are)
        return type(e), str(e)
    raise AssertionError("no error")


def _error_cases():
    q, k, v = rand((1, 4, 2, 16), (1, 6, 2, 16), (1, 6, 2, 16), seed=11)
    return {
        "k dtype": lambda: flashcore.attention(q, k.double(), v),
        "k numpy": lambda: flashcore.attention(q, k.numpy(), v),
        "head dims differ (library)": lambda: flashcore.attention(q, k[..., :8], v),
        "kv heads differ (library)": lambda: flashcore.attention(q, k, v[:, :, :1]),
        "heads not a multiple (library)": lambda: flashcore.attention(q, k[:, :, :1].expand(1, 6, 3, 16),
                                                                      v[:, :, :1].expand(1, 6, 3, 16)),
        "out aliases q (library)": lambda: flashcore.attention(q, q, q, out=q),
        "out dtype": lambda: flashcore.attention(q, k, v, out=torch.empty(1, 4, 2, 16, dtype=torch.float64)),
        "out shape": lambda: flashcore.attention(q, k, v, out=torch.empty(1, 4, 2, 8)),
        "out leaf requires grad": lambda: _no_grad(lambda: flashcore.attention(
            q, k, v, out=torch.zeros(1, 4, 2, 16, requires_grad=True))),
        "backend name": lambda: flashcore.attention(q, k, v, backend="gpu"),
        "cuda backend on cpu": lambda: flashcore.attention(q, k, v, backend="cuda"),
        "layout name": lambda: flashcore.attention(q, k, v, layout="bsdh"),
        "window past int32": lambda: flashcore.attention(q, k, v, window=(2**31, 0)),
        "scale rounds to 0": lambda: flashcore.attention(q, k, v, scale=1e-50),
        "softcap inf": lambda: flashcore.attention(q, k, v, softcap=float("inf")),
        "scale nan": lambda: flashcore.attention(q, k, v, scale=float("nan")),
        "cuda_path": lambda: flashcore.attention(q, k, v, cuda_path=70),
        "3-D dense": lambda: flashcore.attention(q[0], k[0], v[0]),
        "head_dim stride": lambda: flashcore.attention(q, k, v.transpose(1, 3).contiguous().transpose(1, 3)),
        "table rows": lambda: flashcore.attention(q, k, v, block_table=torch.zeros(2, 1, dtype=torch.int32)),
        "table on another device": lambda: flashcore.attention(q, k, v, block_table=torch.zeros(
            1, 1, dtype=torch.int32, device="meta")),
        "descale on a plain call (library)": lambda: flashcore.attention(q, k, v, q_descale=2.0),
    }


def _no_grad(fn):
    with torch.no_grad():
        return fn()


@pytest.mark.parametrize("name", list(_error_cases()))
def test_errors_keep_their_class_and_message(name, paths):
    fn = _error_cases()[name]
    n = _torch_ext.eager_calls()
    cpp, _, py, _ = paths.both(lambda: _error(fn))
    assert cpp == py and _torch_ext.eager_calls() == n
    assert issubclass(cpp[0], flashcore.FlashCoreError), cpp


def test_a_refused_call_writes_nothing():
    q, = rand((1, 4, 2, 16), seed=12)
    out = torch.full_like(q, 7.0)
    with pytest.raises(flashcore.InvalidArgumentError, match="overlap"):
        flashcore.attention(q, out, q, out=out)
    assert torch.all(out == 7.0)


def test_threads_at_once():
    # each thread its own context (its first call binds it on the Python path); the results are a single thread's
    cases = [rand((2, 9, 4, 16), (2, 12, 2, 16), (2, 12, 2, 16), seed=20 + i) for i in range(4)]
    opts = [dict(causal=True), dict(window=(3, 0), return_lse=True), dict(softcap=2.0, layout="bshd"),
            dict(scale=0.5, backend="cpu")]
    want = [flashcore.attention(*c, **o) for c, o in zip(cases, opts)]
    got, ran, handles = {}, {}, {}
    alive = threading.Barrier(4, timeout=300)  # no context freed (its address reused) before all are seen

    def work(i):
        try:
            n = _torch_ext.eager_calls()
            for _ in range(20):
                got[i] = flashcore.attention(*cases[i], **opts[i])
            ran[i] = _torch_ext.eager_calls() - n
            handles[i] = _context.context().handle.value
        finally:
            alive.wait()

    run_in_threads(4, work)
    for i in range(4):
        same_bits(got[i], want[i])
        assert ran[i] == 19  # all but the first, which made the thread's context
    assert len(set(handles.values()) | {_context.context().handle.value}) == 5


def test_a_context_made_while_switched_off_keeps_its_settings():
    # a thread's context made while the kernels were off is its own; the
    # eager call runs on it only once the binding has handed it over
    q, = rand((1, 8, 2, 16), seed=13)
    seen = {}
    start, go = threading.Event(), threading.Event()

    def worker():
        flashcore.set_num_threads(1)  # a Python-owned context, with a setting
        handle = _context.context().handle.value
        start.set()
        go.wait()
        n = _torch_ext.eager_calls()
        flashcore.attention(q, q, q)  # the Python path: context() hands it to the kernels
        first = _torch_ext.eager_calls() - n
        flashcore.attention(q, q, q)
        seen.update(first=first, second=_torch_ext.eager_calls() - n - first, handle=handle,
                    now=_context.context().handle.value, threads=_context.context().num_threads)

    t = threading.Thread(target=worker)
    _torch_ext.set_enabled(False)
    try:
        assert _attention._eager is None and _torch_ext.describe().startswith("python (")
        t.start()
        start.wait(300)
    finally:
        _torch_ext.set_enabled(True)
        go.set()
    t.join()
    assert seen == dict(first=0, second=1, handle=seen["handle"], now=seen["handle"], threads=1)


def test_kernel_info_and_host_profile_follow_the_eager_call():
    q, = rand((1, 8, 2, 16), seed=14)
    _, ran = taken(lambda: flashcore.attention(q, q, q, backend="cpu_reference"))
    assert ran and flashcore.kernel_info.backend == "cpu_reference"
    prof = flashcore.last_host_profile()
    _, ran = taken(lambda: flashcore.attention(q, q, q, backend="cpu"))
    assert ran and flashcore.kernel_info.backend == "cpu" and flashcore.last_host_profile() != prof


PYTHON_PATH = """
    import torch, flashcore
    from flashcore import _attention, _torch_ext
    q = torch.randn(1, 5, 2, 16)
    a = flashcore.attention(q, q, q, causal=True)
    b = flashcore.attention(q, q, q, causal=True)
    assert torch.equal(a, b) and _torch_ext.eager_calls() == 0
    try:
        flashcore.attention(q, q[..., :8], q)
    except flashcore.InvalidArgumentError:
        pass
    print(_attention._eager is None, _torch_ext.describe())
"""


def test_switched_off_by_the_environment():
    assert run_snippet(PYTHON_PATH, FLASHCORE_TORCH_EXT="0") == "True python (FLASHCORE_TORCH_EXT=0)"


def test_a_failed_build_leaves_the_python_path(tmp_path):
    got = run_snippet(PYTHON_PATH, CXX=str(tmp_path / "no-such-compiler"), FLASHCORE_CACHE_DIR=str(tmp_path))
    assert got.startswith("True python (") and "no-such-compiler" in got


def test_a_refused_eager_build_leaves_the_op_kernels(tmp_path):
    # a compiler that refuses the eager call's build (and builds the rest):
    # the op kernels load without it, and the refusal is remembered
    cxx = shutil.which(os.environ.get("CXX") or "c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    wrapper = tmp_path / "cxx"
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do [ "$a" = -DFLASHCORE_EAGER ] && '
                       '{ echo "refused: eager" >&2; exit 1; }; done\nexec %s "$@"\n' % cxx)
    wrapper.chmod(0o755)
    env = dict(CXX=str(wrapper), FLASHCORE_CACHE_DIR=str(tmp_path / "cache"))
    first = run_snippet(PYTHON_PATH, **env)
    assert first.startswith("True c++ (") and "eager calls python (" in first and "refused: eager" in first
    again = run_snippet(PYTHON_PATH, **env)
    assert again.startswith("True c++ (") and "remembered in" in again
