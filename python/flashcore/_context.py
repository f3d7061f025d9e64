"""The per-thread fc_context, and running a checked request through it: the
forward and the backward call (and their *_supported questions) go through
run() and ask() here, so both record kernel info and map errors one way."""

import collections
import ctypes
import os
import threading

from . import _arrays, _lib, _limits
from .errors import InvalidArgumentError, NoDeviceError, UnsupportedError, error_for_status

# tuned: the context's tuning cache chose the kernel (else the planner did)
KernelInfo = collections.namedtuple("KernelInfo", "backend name num_splits workspace_bytes tuned")

_CUDA_PATHS = (0, 80, 90)

# The C API: "an fc_context may be used by one thread at a time". Each Python
# thread gets its own, created on first use and freed with the thread-local.
_tls = threading.local()


class _Args:
    """One entry point's args struct, its byref(), the views of its data
    pointers, and the kept call whose bytes it holds (None: other bytes)."""
    __slots__ = ("args", "ref", "slots", "kept")

    def __init__(self, args, paths):
        self.args = args
        self.ref = ctypes.byref(args)
        self.slots = _lib.data_slots(args, paths)
        self.kept = None


class ExtThread(ctypes.Structure):
    """fc_ext_thread of the torch ops' C++ kernels (csrc/op_kernels.cpp):
    one thread's fc_context, shared with them."""
    _fields_ = [
        ("ctx", ctypes.c_void_p),
        ("device", ctypes.c_int32),     # what the context holds between calls (this
        ("cuda_path", ctypes.c_int32),  # binding's cache; the kernels restore it)
        ("ran", ctypes.c_int32),        # a kernel's call succeeded: info holds it
        ("info", _lib.fc_kernel_info * 2),  # _Context._infos; a kernel's call writes both
    ]


# Set by _torch_ext while the C++ kernels are in: ext_thread() returns this
# thread's ExtThread (or None), whose context a new _Context takes as its
# own; ext_adopt(ctx) hands them a _Context made before (its settings
# stay), returning the ExtThread.
ext_thread = None
ext_adopt = None


class _Context:
    def __init__(self, lib):
        self._lib = lib
        shared = ext_thread() if ext_thread is not None else None
        if shared is None:
            handle = ctypes.c_void_p()
            status = lib.fc_context_create(ctypes.byref(handle))
            if status != 0:
                raise error_for_status(status, "fc_context_create failed")
            self.handle = handle
            self.device = -1     # what the C context holds now (library defaults)
            self.cuda_path = 0
        self._shared = None  # the ExtThread whose context this is, if any
        self.num_threads = 0
        # One args struct per entry point and two kernel-info structs, made
        # once with their byref() and the views of the args' data pointers:
        # building them is a large share of a call's host time.
        self._fwd = _Args(_lib.new_args(lib), _lib.FWD_DATA)
        self._bwd = _Args(_lib.new_bwd_args(lib), _lib.BWD_DATA)
        self._set_infos(_lib.fc_kernel_info(), _lib.fc_kernel_info())
        self.info_last = None  # that of the last successful call
        if shared is not None:
            self.share(shared)  # the kernels made it with the environment's trace file
            return
        env = _lib.tuning_from_env()  # the library itself loads FLASHCORE_TUNING_CACHE
        if env:
            self.set_tuning(**env)

    def _set_infos(self, a, b):
        self._infos = (a, b)
        self._info_refs = tuple(ctypes.byref(i) for i in self._infos)
        self._info_next = 0

    def share(self, shared):
        """Use the ExtThread shared's context (the C++ kernels' for this
        thread, which frees it) from now on: its device, CUDA path and
        kernel info. Where this context is not that one (it was made
        before the kernels were loaded), fc_ext_adopt has made it so."""
        last = self.info_last
        self.handle = ctypes.c_void_p(shared.ctx)
        self.device, self.cuda_path = shared.device, shared.cuda_path
        self._shared = shared
        self._set_infos(shared.info[0], shared.info[1])
        if last is not None:
            shared.info[0] = last
        self.info_last = self._infos[0] if last is not None or shared.ran else None
        self._info_next = 1

    def args(self, backward=False):
        """This thread's fc_attention_args (or backward args), every field
        back at its init value."""
        a = self._bwd if backward else self._fwd
        _lib.reset(a.args)
        a.kept = None
        return a.args

    def launch(self, entry, args_ref, stream):
        """Call entry (fc_attention_forward or fc_attention_backward) with
        the args behind args_ref; raises on failure."""
        i = self._info_next
        self.check(entry(self.handle, args_ref, stream, self._info_refs[i]))
        # Swapped only on success: a failed call leaves the last one's info.
        self.info_last, self._info_next = self._infos[i], 1 - i

    def run_kept(self, entry, kept, ptrs):
        """Run the kept call `kept` (_call_cache) on these data pointers
        (_lib.FWD_DATA or BWD_DATA order; None: NULL as kept)."""
        if self.cuda_path != kept.cuda_path:
            self.set_cuda_path(kept.cuda_path)
        if self.device != kept.device_index:
            self.set_device(kept.device_index)
        a = self._bwd if kept.backward else self._fwd
        if a.kept is not kept.init:  # else the struct differs only in its pointers
            _lib.reset(a.args, kept.init)
            a.kept = kept.init
        for slot, ptr in zip(a.slots, ptrs):
            if ptr is not None:
                slot.value = ptr
        self.launch(entry, a.ref, stream(kept.device))

    def last_error(self):
        msg = self._lib.fc_last_error(self.handle)
        return msg.decode("utf-8", "replace") if msg else ""

    def check(self, status):
        if status != 0:
            raise error_for_status(status, self.last_error())

    def set_device(self, device):
        if device != self.device:
            self.check(self._lib.fc_context_set_device(self.handle, device))
            self.device = device
            if self._shared is not None:
                self._shared.device = device

    def set_cuda_path(self, path):
        if path != self.cuda_path:
            self.check(self._lib.fc_context_set_cuda_path(self.handle, path))
            self.cuda_path = path
            if self._shared is not None:
                self._shared.cuda_path = path

    def set_num_threads(self, n):
        self.check(self._lib.fc_context_set_num_threads(self.handle, n))
        self.num_threads = n

    def set_check_device_arrays(self, on):
        self.check(self._lib.fc_context_set_check_device_arrays(self.handle, 1 if on else 0))

    def set_tuning(self, **fields):
        """Set the experimental tuning hooks: the given fields, every other
        field at its default (fc_tuning_init)."""
        t = _lib.fc_tuning()
        self._lib.fc_tuning_init(ctypes.byref(t))
        for name, value in fields.items():
            if name not in _lib.TUNING_FIELDS:
                raise InvalidArgumentError("tuning: no field %r (fields: %s)"
                                           % (name, ", ".join(_lib.TUNING_FIELDS)))
            if name == "sm90_trace_file":
                value = value.encode() if isinstance(value, str) else value
            else:
                value = _limits.int32(value, "tuning %s" % name)
            setattr(t, name, value)
        self.check(self._lib.fc_context_set_tuning(self.handle, ctypes.byref(t)))

    def get_tuning(self):
        t = _lib.fc_tuning()
        self.check(self._lib.fc_context_get_tuning(self.handle, ctypes.byref(t)))
        out = {name: getattr(t, name) for name, _ in t._fields_}
        if out["sm90_trace_file"] is not None:
            out["sm90_trace_file"] = out["sm90_trace_file"].decode("utf-8", "replace")
        return out

    def load_tuning(self, path):
        """Load the tuning cache file at path into this context (None: drop
        its cache). A failure leaves the cache it had."""
        self.check(self._lib.fc_context_load_tuning(self.handle, _c_path(path, allow_none=True)))

    def save_tuning(self, path):
        """Write this context's tuning cache to path."""
        self.check(self._lib.fc_context_save_tuning(self.handle, _c_path(path)))

    def tuning_info(self):
        """The library's description of this context's tuning cache. A
        FLASHCORE_TUNING_CACHE file that failed to load is reported in the
        text (the context runs without it), not raised."""
        need = ctypes.c_size_t(0)
        self._lib.fc_context_tuning_info(self.handle, None, 0, ctypes.byref(need))
        buf = ctypes.create_string_buffer(need.value)
        self._lib.fc_context_tuning_info(self.handle, buf, need.value, None)
        return buf.value.decode("utf-8", "replace")

    def __del__(self):
        if getattr(self, "_shared", None) is not None:
            return  # the C++ kernels' context: freed at thread exit there
        try:
            self._lib.fc_context_free(self.handle)
        except Exception:  # interpreter shutdown: nothing useful to do
            pass


def context():
    """This thread's context (created on first use)."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        ctx = _Context(_lib.load())
        _tls.ctx = ctx
    elif ctx._shared is None and ext_adopt is not None:
        ctx.share(ext_adopt(ctx))  # made before the C++ kernels came in: one context for both
    return ctx


def last_kernel_info():
    """KernelInfo of this thread's last successful attention() or
    attention_backward() call, or None."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        return None
    info = ctx.info_last
    if info is None and ctx._shared is not None and ctx._shared.ran:
        info = ctx._infos[0]  # a C++ kernel's call was this thread's first
    return None if info is None else _kernel_info(info)  # decoded on request, not on every call


def last_host_profile():
    """Host time of this thread's last successful call inside the library, as
    a dict of microseconds: check_us, select_us, launch_us, total_us
    (fc_last_host_profile; zeros before the first call)."""
    ctx = context()
    prof = _lib.fc_host_profile()
    ctx.check(ctx._lib.fc_last_host_profile(ctx.handle, ctypes.byref(prof)))
    return {name: float(getattr(prof, name)) for name, _ in _lib.fc_host_profile._fields_}


def _kernel_info(info):
    return KernelInfo(_lib.BACKEND_NAMES.get(info.backend, str(info.backend)),
                      info.name.decode("utf-8", "replace"), int(info.num_splits),
                      int(info.workspace_bytes), bool(info.tuned))


def _c_path(path, allow_none=False):
    """path (str, bytes or os.PathLike) as the C API's char *, checked."""
    if path is None and allow_none:
        return None
    try:
        raw = os.fsencode(path)
    except TypeError:
        raw = None
    if not raw or b"\0" in raw:  # C would see an empty or a cut-short name
        raise InvalidArgumentError("tuning cache path: expected a non-empty str, bytes or os.PathLike "
                                   "without NUL%s, got %r" % (" or None" if allow_none else "", path))
    return raw


def cuda_path_value(cuda_path):
    """The context's cuda path for the cuda_path argument (checked)."""
    path = 0 if cuda_path is None else cuda_path
    if path not in _CUDA_PATHS:
        raise InvalidArgumentError("cuda_path: expected None/0 (automatic), 80 or 90, got %r" % (cuda_path,))
    return path


def device_index(device):
    """The context's device for a view's device ("cuda", i) or ("cpu", ...)."""
    return device[1] if device[0] == "cuda" else -1


def _setup(ctx, call, cuda_path):
    ctx.set_cuda_path(cuda_path_value(cuda_path))
    ctx.set_device(device_index(call.device))


def stream(device):
    """torch's current stream of a view's device (None off CUDA)."""
    if device[0] != "cuda":
        return None
    torch = _arrays._torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:  # the cudaStream_t itself, no Stream object (as inductor's code gets it)
        return raw(device[1])
    return torch.cuda.current_stream(torch.device("cuda", device[1])).cuda_stream


def run(entry, call, cuda_path):
    """Run a checked call (a _request.Call) through the C entry point
    (fc_attention_forward or fc_attention_backward) on this thread's
    context, on torch's current stream for CUDA tensors; raises on failure."""
    ctx = context()
    _setup(ctx, call, cuda_path)
    ctx.launch(entry, ctypes.byref(call.args), stream(call.device))


def ask(entry, prepare, cuda_path):
    """(True, kernel name) or (False, reason) for the request prepare()
    builds, from the C *_supported entry point; nothing is launched."""
    ctx = context()
    try:
        call = prepare()
        _setup(ctx, call, cuda_path)
    except (InvalidArgumentError, UnsupportedError, NoDeviceError) as e:
        return False, str(e)
    info = _lib.fc_kernel_info()
    if entry(ctx.handle, ctypes.byref(call.args), ctypes.byref(info)) != 0:
        return False, ctx.last_error()
    return True, info.name.decode("utf-8", "replace")
