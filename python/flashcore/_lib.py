"""Loading libflashcore and describing its C API to ctypes.

The structs below mirror include/flashcore.h field for field (ctypes applies
the same natural alignment as the C compiler, so offsets match on every
platform the library builds for). Keep them in step with the header: the
binding's tests compare the field names, in order, with the header's; and
new_args(), new_bwd_args() and new_merge_args() leave slack after the struct
so that a library whose struct grew cannot write past the buffer in its
*_init function.

Where the library is looked for, in order:
  1. the path in the environment variable FLASHCORE_LIBRARY (no fallback if set),
  2. the copy installed inside this package, flashcore/lib/ (pip install .),
  3. <repo>/build/ next to this source tree (a CMake build of a checkout).
"""

import ctypes
import os
import sys
import threading
from pathlib import Path

from .errors import LibraryNotFoundError

# ---- enums (values pinned by flashcore.h) -----------------------------------
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_E4M3, DTYPE_E5M2, DTYPE_F64 = 0, 1, 2, 3, 4, 5
DTYPES_FP8 = (DTYPE_E4M3, DTYPE_E5M2)  # forward inputs with descales (flashcore.h, "FP8")
BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2, "cpu_reference": 3}
BACKEND_NAMES = {v: k for k, v in BACKENDS.items()}


class fc_tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),  # enum fc_dtype
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),  # in elements
    ]


class fc_descale(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),  # const float *, [batch, heads_kv] by the strides
        ("batch_stride", ctypes.c_int64),  # elements; 0 broadcasts
        ("head_stride", ctypes.c_int64),
    ]


class fc_attention_args(ctypes.Structure):
    _fields_ = [
        ("q", fc_tensor),
        ("k", fc_tensor),
        ("v", fc_tensor),
        ("out", fc_tensor),
        ("lse", fc_tensor),
        ("scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("cu_seqlens_q", ctypes.c_void_p),  # const int32_t *
        ("cu_seqlens_k", ctypes.c_void_p),
        ("num_seqs", ctypes.c_int32),  # varlen: cu_seqlens hold num_seqs+1 entries
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
        ("backend", ctypes.c_int),  # enum fc_backend
        ("q_descale", fc_descale),  # FP8 dequantisation factors (data NULL: 1)
        ("k_descale", fc_descale),
        ("v_descale", fc_descale),
        ("out_amax", ctypes.c_void_p),  # FP8: float * written, NULL: not asked
        ("p_amax", ctypes.c_void_p),
        ("block_table", ctypes.c_void_p),  # paged KV: int32 [batch, max_pages_per_seq]
        ("max_pages_per_seq", ctypes.c_int32),
        ("block_table_stride", ctypes.c_int64),  # 0 = max_pages_per_seq
        ("seqused_k", ctypes.c_void_p),  # int32 [batch] keys in use, NULL = all
        ("k_new", fc_tensor),  # appended keys, [batch, seqlen_new, heads_kv, d]
        ("v_new", fc_tensor),
        ("rotary_cos", fc_tensor),  # [seqlen_ro, rotary_dim / 2]
        ("rotary_sin", fc_tensor),
        ("rotary_interleaved", ctypes.c_int32),
    ]


class fc_attention_backward_args(ctypes.Structure):
    _fields_ = [
        ("fwd", fc_attention_args),  # the forward's arguments; out and lse are read
        ("dout", fc_tensor),
        ("dq", fc_tensor),
        ("dk", fc_tensor),
        ("dv", fc_tensor),
        ("deterministic", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),  # NULL: the library allocates its scratch
        ("workspace_bytes", ctypes.c_int64),
    ]


MAX_MERGE_PARTS = 1024  # FC_MAX_MERGE_PARTS


class fc_attention_merge_args(ctypes.Structure):
    _fields_ = [
        ("num_parts", ctypes.c_int32),  # 1 to MAX_MERGE_PARTS
        ("parts_out", ctypes.POINTER(fc_tensor)),  # num_parts tensors
        ("parts_lse", ctypes.POINTER(fc_tensor)),
        ("out", fc_tensor),
        ("lse", fc_tensor),  # data NULL: not written
        ("backend", ctypes.c_int),  # enum fc_backend; AUTO: where out lives
    ]


class fc_kernel_info(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("name", ctypes.c_char * 96),
        ("num_splits", ctypes.c_int32),
        ("workspace_bytes", ctypes.c_int64),
        ("tuned", ctypes.c_int32),  # 1: the tuning cache chose the kernel; 0: the planner
    ]


class fc_host_profile(ctypes.Structure):
    _fields_ = [
        ("check_us", ctypes.c_double),
        ("select_us", ctypes.c_double),
        ("launch_us", ctypes.c_double),
        ("total_us", ctypes.c_double),
    ]


class fc_tuning(ctypes.Structure):
    """The experimental tuning hooks (flashcore.h, docs/API.md)."""
    _fields_ = [
        ("sm90_config", ctypes.c_int32),
        ("sm80_config", ctypes.c_int32),
        ("sm90_rotate", ctypes.c_int32),
        ("sm90_tail", ctypes.c_int32),
        ("sm90_grid", ctypes.c_int32),
        ("splits", ctypes.c_int32),
        ("pdl", ctypes.c_int32),
        ("sm80_bwd_config", ctypes.c_int32),
        ("sm90_bwd_config", ctypes.c_int32),
        ("masks", ctypes.c_int32),
        ("sm90_trace_file", ctypes.c_char_p),
    ]


# The one environment variable a new thread's context takes into fc_tuning
# (as the CLI does). Forcing rows, splits and the like goes through a tuning
# cache file now (FLASHCORE_TUNING_CACHE, read by the library; docs/TUNING.md).
TUNING_ENV = {"sm90_trace_file": "FLASHCORE_SM90_TRACE_FILE"}
TUNING_FIELDS = tuple(name for name, _ in fc_tuning._fields_)


def tuning_from_env():
    """The tuning fields the environment sets: the trace file, if named."""
    return {field: os.environ[var] for field, var in TUNING_ENV.items() if os.environ.get(var)}


def _new(struct, init):
    """A struct filled by its C init function, in a buffer with slack behind
    it (see the module doc)."""
    buf = ctypes.create_string_buffer(ctypes.sizeof(struct) + 256)
    args = struct.from_buffer(buf)
    args._buf = buf  # keep the storage alive with the struct
    init(ctypes.byref(args))
    args._init = buf.raw  # what reset() restores
    return args


def reset(args, init=None):
    """Put a struct from new_args/new_bwd_args back to its init values, or
    to the bytes init (a struct of the same kind): a byte copy, cheaper than
    calling the init function through ctypes."""
    args._buf.raw = args._init if init is None else init


def _data_offset(struct, path):
    """Byte offset in struct of the data pointer at path: an fc_tensor's
    ("q", or "fwd.q" inside the backward's args) or a pointer field's."""
    off = 0
    for name in path.split("."):
        field = getattr(struct, name)
        off += field.offset
        struct = dict(struct._fields_)[name]
    return off + (fc_tensor.data.offset if struct is fc_tensor else 0)


FWD_DATA = ("q", "k", "v", "out", "lse", "block_table", "seqused_k", "k_new", "v_new", "rotary_cos",
            "rotary_sin")
BWD_DATA = ("fwd.q", "fwd.k", "fwd.v", "fwd.out", "fwd.lse", "dout", "dq", "dk", "dv")


def data_slots(args, paths):
    """c_void_p views of the data pointers at paths (FWD_DATA, BWD_DATA) of
    args (from new_args / new_bwd_args): setting one's value is the cheapest
    way to point the struct at a new tensor."""
    return tuple(ctypes.c_void_p.from_buffer(args._buf, _data_offset(type(args), p)) for p in paths)


def new_args(lib):
    """An fc_attention_args filled by fc_attention_args_init."""
    return _new(fc_attention_args, lib.fc_attention_args_init)


def new_bwd_args(lib):
    """An fc_attention_backward_args filled by fc_attention_backward_args_init."""
    return _new(fc_attention_backward_args, lib.fc_attention_backward_args_init)


def new_merge_args(lib):
    """An fc_attention_merge_args filled by fc_attention_merge_args_init."""
    return _new(fc_attention_merge_args, lib.fc_attention_merge_args_init)


def _library_filename():
    if sys.platform == "win32":
        return "flashcore.dll"
    if sys.platform == "darwin":
        return "libflashcore.dylib"
    return "libflashcore.so"


def candidate_paths():
    """The places the library is looked for, in order (see module doc)."""
    env = os.environ.get("FLASHCORE_LIBRARY")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    name = _library_filename()
    return [here / "lib" / name, here.parent.parent / "build" / name]


def _declare(lib):
    """Set argtypes/restype of every entry point the binding uses."""
    c = ctypes
    P = c.c_void_p
    sig = {
        "fc_version_number": (c.c_uint, []),
        "fc_version_string": (c.c_char_p, []),
        "fc_build_info": (c.c_char_p, []),
        "fc_status_string": (c.c_char_p, [c.c_int]),
        "fc_context_create": (c.c_int, [c.POINTER(P)]),
        "fc_context_free": (None, [P]),
        "fc_last_error": (c.c_char_p, [P]),
        "fc_context_set_num_threads": (c.c_int, [P, c.c_int]),
        "fc_context_set_check_device_arrays": (c.c_int, [P, c.c_int]),
        "fc_context_set_device": (c.c_int, [P, c.c_int]),
        "fc_context_set_cuda_path": (c.c_int, [P, c.c_int]),
        "fc_tuning_init": (None, [c.POINTER(fc_tuning)]),
        "fc_context_set_tuning": (c.c_int, [P, c.POINTER(fc_tuning)]),
        "fc_context_get_tuning": (c.c_int, [P, c.POINTER(fc_tuning)]),
        "fc_context_load_tuning": (c.c_int, [P, c.c_char_p]),
        "fc_context_save_tuning": (c.c_int, [P, c.c_char_p]),
        "fc_context_record_tuning": (
            c.c_int, [P, c.POINTER(fc_attention_args), c.POINTER(fc_attention_backward_args), c.c_int32,
                      c.POINTER(fc_tuning), c.c_char_p]),
        "fc_context_tuning_info": (c.c_int, [P, c.c_char_p, c.c_size_t, c.POINTER(c.c_size_t)]),
        "fc_attention_args_init": (None, [c.POINTER(fc_attention_args)]),
        "fc_attention_supported": (
            c.c_int, [P, c.POINTER(fc_attention_args), c.POINTER(fc_kernel_info)]),
        "fc_attention_forward": (
            c.c_int, [P, c.POINTER(fc_attention_args), P, c.POINTER(fc_kernel_info)]),
        "fc_attention_backward_args_init": (None, [c.POINTER(fc_attention_backward_args)]),
        "fc_attention_backward_supported": (
            c.c_int, [P, c.POINTER(fc_attention_backward_args), c.POINTER(fc_kernel_info)]),
        "fc_attention_backward": (
            c.c_int, [P, c.POINTER(fc_attention_backward_args), P, c.POINTER(fc_kernel_info)]),
        "fc_attention_merge_args_init": (None, [c.POINTER(fc_attention_merge_args)]),
        "fc_attention_merge": (c.c_int, [P, c.POINTER(fc_attention_merge_args), P]),
        "fc_last_host_profile": (c.c_int, [P, c.POINTER(fc_host_profile)]),
        "fc_cuda_available": (c.c_int, []),
        "fc_cuda_device_info": (c.c_int, [P, c.c_char_p, c.c_size_t]),
    }
    missing = []
    for name, (restype, argtypes) in sig.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    return missing


_lock = threading.Lock()
_lib = None
_lib_path = None


def load():
    """The loaded library (loaded once per process)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidate_paths():
            if not path.is_file():
                tried.append("%s (not found)" % path)
                continue
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            missing = _declare(lib)
            if missing:
                tried.append("%s (not a FlashCore library: missing %s)" % (path, ", ".join(missing)))
                continue
            _lib, _lib_path = lib, path
            return _lib
        raise LibraryNotFoundError(
            "libflashcore could not be loaded; tried: " + "; ".join(tried)
            + ". Set FLASHCORE_LIBRARY to the library's path, install the package "
            "(pip install .), or build the library into <repo>/build.")


def library_path():
    """Path of the loaded library (loads it)."""
    load()
    return str(_lib_path)
