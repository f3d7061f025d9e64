"""The torch ops' C++ kernels (csrc/op_kernels.cpp): the CPU, CUDA and
autograd kernels of flashcore::attention_fwd and flashcore::attention_bwd,
which fill the C API's args from the tensors without Python, and
flashcore.attention's eager call in C++. A compiled graph calls the op on
every step: through the Python kernels that cost ~60 us of host time per op
(docs/PERF.md, "Python binding and host time"); an eager call through the
binding's Python costs ~8 us before the library's own work.

load() runs once, at the first eager flashcore.attention call on torch
tensors or the first call of an op's Python kernel: it builds the source
with the system C++ compiler against the installed torch (no ninja, no CUDA
toolkit; ~20 s), keeps the library in a cache directory keyed by the torch
build, the Python build and the source, loads it, hands it the entry points
of the libflashcore this binding loaded and registers its kernels. From
then on they run the ops on CPU and CUDA tensors; a call they do not take,
and every error, goes to the Python kernel (through the private ops
flashcore::_attention_fwd_py / _attention_bwd_py), so results and errors
are the same. A dense attention_fwd call autograd records on plain tensors
(no paged cache, no tracer, fake tensor or dispatch mode) records the same
formula in C++ (flashcore::AttentionBackward: saves q, k, v, out, lse and
the options, calls attention_bwd), without the ~100 us of host time of
torch.library's Python autograd kernel; every other recorded call goes to
register_autograd's formula. Where anything fails (no compiler, no torch
headers, another platform) the Python kernels stay, with the reason in
describe().

The eager call (_attention._eager while the kernels are in) is built with
Python's headers (Python.h, torch's python_variable.h) and linked to
libtorch_python; flashcore.attention hands it its arguments first and it
runs the plain calls it takes (csrc/op_kernels.cpp says which), answering
None for the rest, which take the Python path. Without Python.h, or where
that build fails, the library is built without it (a failed build is
remembered in the cache directory) and eager calls take the Python path,
with the reason in describe().

Read once, by load(): FLASHCORE_TORCH_EXT=0 keeps the Python kernels (and
the Python eager path); FLASHCORE_CACHE_DIR (else $XDG_CACHE_HOME/flashcore,
else ~/.cache/flashcore) holds the built library; CXX names the compiler
(else c++).
"""

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

from . import _attention, _context, _lib, _limits

_HERE = Path(__file__).resolve().parent
SOURCE = _HERE / "csrc" / "op_kernels.cpp"
# flashcore.h: installed next to the library (pip install .), or the checkout's
_HEADER_DIRS = (_HERE / "include", _HERE.parent.parent / "include")
# csrc/op_kernels.cpp's Api: the entry points it is handed, in order
_ENTRIES = ("fc_attention_args_init", "fc_attention_backward_args_init", "fc_context_create", "fc_context_free",
            "fc_context_set_device", "fc_context_set_cuda_path", "fc_context_set_tuning", "fc_attention_forward",
            "fc_attention_backward")

_log = logging.getLogger("flashcore")
_lock = threading.Lock()
tried = False      # load() has run (the ops' Python kernels look at this)
_loaded = None     # the built library (ctypes), once loaded
_on = False        # its kernels are registered
_why = "not loaded yet (the first eager call on torch tensors, or of an op, loads it)"
_tuning = None     # the fc_tuning new thread contexts start from (kept alive for it)
_eager = None      # the loaded library's eager call, if it has one
_eager_why = None  # why it has none


def describe():
    """Which kernels run the torch ops and eager calls: 'c++ (<library>),
    eager calls c++', 'c++ (<library>), eager calls python (<why>)', or
    'python (<why>)' (both)."""
    if not _on:
        return "python (%s)" % _why
    return "c++ (%s), eager calls %s" % (_loaded._name, "c++" if _eager is not None else "python (%s)" % _eager_why)


def active():
    """Do the C++ kernels run the ops?"""
    return _on


def load():
    """Build (once per torch build and source), load and switch in the C++
    kernels; a failure leaves the Python kernels, with the reason in
    describe(). Once per process; a thread arriving while another builds
    goes on with the Python kernel."""
    global tried, _why
    if tried or not _lock.acquire(blocking=False):
        return
    try:
        if not tried:
            tried = True
            why = _load()
            if why is not None:
                _why = why
    except Exception as e:  # anything at all: the Python kernels stay
        _why = "%s: %s" % (type(e).__name__, e)
    finally:
        _lock.release()
    if not _on:
        _log.info("flashcore: the torch ops run their Python kernels: %s", _why)


def set_enabled(on):
    """Register the loaded C++ kernels (on) or drop them, which gives the
    ops back to their Python kernels (tests compare the two). False if
    none are loaded."""
    global _on, _why
    if _loaded is None:
        return False
    _loaded.fc_ext_enable(1 if on else 0)
    _on = bool(on)
    _context.ext_thread = _thread_state if on else None
    _context.ext_adopt = _adopt if on else None
    _attention._eager = _eager if on else None
    if not on:
        _why = "switched off (set_enabled(False))"
    return True


def _load():
    """Why the C++ kernels cannot run, or None once they do."""
    if os.environ.get("FLASHCORE_TORCH_EXT", "1") == "0":
        return "FLASHCORE_TORCH_EXT=0"
    if not sys.platform.startswith("linux"):
        return "the C++ kernels are built on Linux only"
    header = next((d for d in _HEADER_DIRS if (d / "flashcore.h").is_file()), None)
    if header is None or not SOURCE.is_file():
        return "flashcore.h or csrc/op_kernels.cpp is not there"
    include = _python_include()
    eager_why = "no Python.h in %s (Python's headers)" % sysconfig.get_paths().get("include")
    if include is not None:
        path, eager_why = _built(header, include)
        if path is not None:
            return _start(path, None)
    path, why = _built(header, None)
    return why if path is None else _start(path, eager_why)


def _python_include():
    """The directory of Python.h, or None."""
    paths = sysconfig.get_paths()
    return next((d for d in (paths.get("include"), paths.get("platinclude")) if d and (Path(d) / "Python.h").is_file()),
                None)


def _cache_dir():
    env = os.environ.get("FLASHCORE_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashcore"


def _key(cxx, header, include):
    """What the built library depends on: the source, the header, the torch
    build (version, commit, C++ ABI), the compiler, the machine; with the
    eager call (include: Python.h's directory), the Python build."""
    h = hashlib.sha256()
    python = "" if include is None else "%s %s %s" % (include, sysconfig.get_config_var("SOABI"), sys.version)
    for part in (SOURCE.read_bytes(), (header / "flashcore.h").read_bytes(), torch.__version__,
                 str(getattr(torch.version, "git_version", "")), str(torch._C._GLIBCXX_USE_CXX11_ABI), cxx,
                 platform.machine(), python):
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _built(header, include):
    """(the cached library, None), built first if need be; or (None, why).
    include: Python.h's directory, to build the eager call in (a build
    that the compiler refuses is remembered: the next process goes
    straight to the build without it)."""
    cxx = os.environ.get("CXX") or "c++"
    d = _cache_dir() / "torch-ops" / ("torch%s-%s" % (torch.__version__.split("+")[0], _key(cxx, header, include)))
    path = d / "flashcore_op_kernels.so"
    failed = d / "failed.txt"
    if path.is_file():
        return path, None
    if failed.is_file():
        return None, "%s (remembered in %s)" % (failed.read_text(errors="replace"), failed)
    try:
        d.mkdir(parents=True, exist_ok=True)
        # a name of its own, then one rename: processes building at once never load half a file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
    except OSError as e:  # not in a shared temporary directory instead: another user could plant a library
        return None, "cache directory %s: %s (FLASHCORE_CACHE_DIR picks another)" % (d, e)
    os.close(fd)
    _log.info("flashcore: building the torch ops' C++ kernels into %s (once)", d)
    try:
        why, refused = _compile(cxx, header, include, tmp)
        if refused and include is not None:
            try:
                failed.write_text(why)
            except OSError:  # not remembered: the next process tries again
                pass
        if why is not None:
            return None, why
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        return path, None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile(cxx, header, include, out):
    """Compile the source into out (with the eager call where include,
    Python.h's directory, is given): (None, False), or (why not: the
    compiler's last words, whether the compiler ran and refused)."""
    from torch.utils import cpp_extension  # imported to build only (it looks for CUDA)
    libs = cpp_extension.library_paths()
    cmd = [cxx, "-O2", "-fPIC", "-shared", "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]
    if include is not None:
        cmd += ["-DFLASHCORE_EAGER", "-I" + include]
    cmd += ["-I" + p for p in cpp_extension.include_paths()] + ["-I" + str(header), str(SOURCE), "-o", out]
    cmd += ["-L" + p for p in libs] + ["-Wl,-rpath," + p for p in libs] + ["-lc10", "-ltorch_cpu"]
    if include is not None:
        cmd += ["-ltorch_python"]
    why = None
    for std in ("-std=c++20", "-std=c++17"):  # torch's headers want C++20 from 2.10 on, C++17 before
        try:
            res = subprocess.run(cmd[:1] + [std] + cmd[1:], capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as e:
            return "%s: %s" % (cxx, e), False
        if res.returncode == 0:
            return None, False
        why = "%s %s failed: %s" % (cxx, std, (res.stderr or res.stdout).strip()[-1500:])
    return why, True


def _layout():
    """fc_ext_layout's values as this binding's ctypes mirrors have them."""
    t = _context.ExtThread
    return (ctypes.sizeof(_lib.fc_attention_args), ctypes.sizeof(_lib.fc_attention_backward_args),
            ctypes.sizeof(_lib.fc_kernel_info), ctypes.sizeof(_lib.fc_tuning), ctypes.sizeof(t), t.info.offset)


def _env_tuning(lib):
    """The environment's tuning (the trace file) as an fc_tuning (None: none
    set), narrowed as _Context.set_tuning narrows it. A value the library
    refuses fails each new thread context in C++, and the Python kernel
    raises its error. The library loads FLASHCORE_TUNING_CACHE itself."""
    env = _lib.tuning_from_env()
    if not env:
        return None
    t = _lib.fc_tuning()
    lib.fc_tuning_init(ctypes.byref(t))
    for name, value in env.items():
        setattr(t, name, value.encode() if name == "sm90_trace_file" else _limits.int32(value, "tuning " + name))
    return t


def _start(path, eager_why):
    """Load the library at path and switch its kernels in: None, or why not.
    eager_why: why it was built without the eager call (None: with it)."""
    global _loaded, _tuning, _eager, _eager_why
    lib = _lib.load()
    torch.ops.load_library(str(path))  # registers nothing by itself: fc_ext_enable does
    ext = ctypes.CDLL(str(path))
    got = (ctypes.c_int64 * 6)()
    ext.fc_ext_layout(got)
    if tuple(got) != _layout():
        return "%s: struct sizes %s, the binding's %s" % (path, tuple(got), _layout())
    _tuning = _env_tuning(lib)
    ext.fc_ext_thread_state.restype = ctypes.POINTER(_context.ExtThread)
    ext.fc_ext_adopt.restype = ctypes.POINTER(_context.ExtThread)
    ext.fc_ext_adopt.argtypes = (ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)
    fns = (ctypes.c_void_p * len(_ENTRIES))(*(ctypes.cast(getattr(lib, n), ctypes.c_void_p) for n in _ENTRIES))
    ext.fc_ext_init(fns, None if _tuning is None else ctypes.byref(_tuning))
    _loaded = ext
    _eager_why = eager_why
    if eager_why is None:
        make = ctypes.PyDLL(str(path)).fc_ext_eager  # called with the GIL held
        make.restype = ctypes.py_object
        _eager = make()
        ext.fc_ext_eager_calls.restype = ctypes.c_int64
    set_enabled(True)
    _context.context()  # this thread's context, shared from now on (another thread's: at its next call)
    return None


def _thread_state():
    """This thread's ExtThread (its context made if need be), or None."""
    p = _loaded.fc_ext_thread_state()
    return p.contents if p else None


def _adopt(ctx):
    """This thread's ExtThread, holding ctx's context from now on (freed at
    thread exit by the C++ side)."""
    return _loaded.fc_ext_adopt(ctx.handle, ctx.device, ctx.cuda_path).contents


def eager_calls():
    """How many calls the C++ eager call ran on this thread (0 without it)."""
    if _eager is None:
        return 0
    return _loaded.fc_ext_eager_calls()


def stub_forward(on):
    """Benchmarks: the C++ kernels and the eager call run a stub that
    answers FC_OK at once in place of fc_attention_forward (on), or the
    library's forward again (off). Returns the stub as a ctypes function of
    fc_attention_forward's signature (for the binding's Python path), or
    None where no kernels are loaded."""
    if _loaded is None:
        return None
    _loaded.fc_ext_stub_forward(1 if on else 0)
    stub = _loaded.fc_ext_stub_entry
    stub.restype = ctypes.c_int
    stub.argtypes = (ctypes.c_void_p, ctypes.POINTER(_lib.fc_attention_args), ctypes.c_void_p,
                     ctypes.POINTER(_lib.fc_kernel_info))
    return stub
