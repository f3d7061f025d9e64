"""The torch ops' C++ kernels (csrc/op_kernels.cpp): the CPU, CUDA and
autograd kernels of flashcore::attention_fwd and flashcore::attention_bwd,
which fill the C API's args from the tensors without Python. A compiled
graph calls the op on every step: through the Python kernels that cost ~60
us of host time per op (docs/PERF.md, "Python binding and host time").

load() runs once, at the first call of an op's Python kernel: it builds the
source with the system C++ compiler against the installed torch (no ninja,
no CUDA toolkit, no Python headers; ~15 s), keeps the library in a cache
directory keyed by the torch build and the source, loads it, hands it the
entry points of the libflashcore this binding loaded and registers its
kernels. From then on they run the ops on CPU and CUDA tensors; a call
they do not take, and every error, goes to the Python kernel (through the
private ops flashcore::_attention_fwd_py / _attention_bwd_py), so results
and errors are the same; a call autograd records goes to register_autograd's
formula as before. Where anything fails (no compiler, no torch headers,
another platform) the Python kernels stay, with the reason in describe().

Read once, by load(): FLASHCORE_TORCH_EXT=0 keeps the Python kernels;
FLASHCORE_CACHE_DIR (else $XDG_CACHE_HOME/flashcore, else ~/.cache/flashcore)
holds the built library; CXX names the compiler (else c++).
"""

import ctypes
import hashlib
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from . import _context, _lib, _limits

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
_why = "not loaded yet (the first call of an op loads it)"
_tuning = None     # the fc_tuning new thread contexts start from (kept alive for it)


def describe():
    """Which kernels run the torch ops: 'c++ (<library>)' or 'python (<why>)'."""
    return "c++ (%s)" % _loaded._name if _on else "python (%s)" % _why


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
    path, why = _built(header)
    return why if path is None else _start(path)


def _cache_dir():
    env = os.environ.get("FLASHCORE_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashcore"


def _key(cxx, header):
    """What the built library depends on: the source, the header, the torch
    build (version, commit, C++ ABI), the compiler, the machine."""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), (header / "flashcore.h").read_bytes(), torch.__version__,
                 str(getattr(torch.version, "git_version", "")), str(torch._C._GLIBCXX_USE_CXX11_ABI), cxx,
                 platform.machine()):
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _built(header):
    """(the cached library, None), built first if need be; or (None, why)."""
    cxx = os.environ.get("CXX") or "c++"
    d = _cache_dir() / "torch-ops" / ("torch%s-%s" % (torch.__version__.split("+")[0], _key(cxx, header)))
    path = d / "flashcore_op_kernels.so"
    if path.is_file():
        return path, None
    try:
        d.mkdir(parents=True, exist_ok=True)
        # a name of its own, then one rename: processes building at once never load half a file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
    except OSError as e:  # not in a shared temporary directory instead: another user could plant a library
        return None, "cache directory %s: %s (FLASHCORE_CACHE_DIR picks another)" % (d, e)
    os.close(fd)
    _log.info("flashcore: building the torch ops' C++ kernels into %s (once)", d)
    try:
        why = _compile(cxx, header, tmp)
        if why is not None:
            return None, why
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        return path, None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile(cxx, header, out):
    """Compile the source into out: None, or why not (the compiler's last words)."""
    from torch.utils import cpp_extension  # imported to build only (it looks for CUDA)
    libs = cpp_extension.library_paths()
    cmd = [cxx, "-O2", "-fPIC", "-shared", "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]
    cmd += ["-I" + p for p in cpp_extension.include_paths()] + ["-I" + str(header), str(SOURCE), "-o", out]
    cmd += ["-L" + p for p in libs] + ["-Wl,-rpath," + p for p in libs] + ["-lc10", "-ltorch_cpu"]
    why = None
    for std in ("-std=c++20", "-std=c++17"):  # torch's headers want C++20 from 2.10 on, C++17 before
        try:
            res = subprocess.run(cmd[:1] + [std] + cmd[1:], capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as e:
            return "%s: %s" % (cxx, e)
        if res.returncode == 0:
            return None
        why = "%s %s failed: %s" % (cxx, std, (res.stderr or res.stdout).strip()[-1500:])
    return why


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


def _start(path):
    """Load the library at path and switch its kernels in: None, or why not."""
    global _loaded, _tuning
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
