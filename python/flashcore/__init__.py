"""FlashCore: fused exact attention (forward and backward), Python binding.

A ctypes layer over the shared library libflashcore. numpy arrays and
torch tensors (CPU or CUDA) go straight to the C API as pointers with
strides; nothing is copied. With torch, C++ kernels built once against the
installed torch (flashcore._torch_ext, at the first call on torch tensors;
the Python path where they cannot be built) run the torch ops and the plain
eager calls without Python.

    import flashcore
    out = flashcore.attention(q, k, v, causal=True)              # [B,S,H,D]
    out, lse = flashcore.attention(q, k, v, layout="bhsd", return_lse=True)
    dq, dk, dv = flashcore.attention_backward(dout, q, k, v, out, lse, layout="bhsd")
    out = flashcore.merge_attention([out1, out2], [lse1, lse2])  # keys split in two blocks (CPU)
    out = flashcore.attention(q, k, v)   # torch tensors that require grad:
    out.sum().backward()                 # autograd runs the library's backward
    out = flashcore.flash_attn_func(q, k, v, causal=True)            # flash-attn's signature
    out = flashcore.scaled_dot_product_attention(q, k, v, is_causal=True)  # torch's
    out = flashcore.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                           block_table=pages, causal=True)  # decoding
    out = flashcore.attention(q8, k8, v8, k_descale=kd, out_dtype=torch.float16)  # FP8 (CPU)
    ok, why = flashcore.supported(q, k, v, cuda_path=90)
    flashcore.kernel_info       # what the last call on this thread ran
    flashcore.last_host_profile()  # its host time in the library, per phase
    flashcore.load_tuning("model.tune")  # measured kernel choices (docs/TUNING.md)
    flashcore.save_tuning(path), flashcore.tuning_info()  # write it back, describe it

The library is loaded on first use (see flashcore._lib for where it is
looked for; FLASHCORE_LIBRARY overrides). __version__ is the loaded
library's fc_version_string(), which is also the package version (both come
from FLASHCORE_VERSION_STRING in include/flashcore.h).

attention_with_kvcache is flash-attn's flash_attn_with_kvcache: attention
over a KV cache, dense or paged (block_table: int32 [B, max_pages] page
indices into k_cache/v_cache [num_pages, page_size, Hkv, D]), with
per-sequence cache lengths (cache_seqlens), optionally appending k_new/v_new
(rotated by rotary_cos/sin) to the cache first; forward only.
flashcore.attention takes the same as block_table=, seqused_k=, k_new=, ...

With torch, the calls are the custom ops flashcore::attention_fwd and
flashcore::attention_bwd (flashcore._torch_ops; an append is
flashcore::attention_fwd_append): torch.compile traces them without a
graph break. They are registered when flashcore is imported after
torch, else on the first call with torch tensors.
"""

import ctypes
import sys

from . import _attention, _context, _lib, _limits
from ._attention import attention, supported
from ._backward import attention_backward, attention_backward_supported
from ._context import KernelInfo, last_host_profile, last_kernel_info
from ._dropin import (attention_with_kvcache, flash_attn_func, flash_attn_varlen_func,
                      scaled_dot_product_attention)
from ._hadamard import hadamard
from ._merge import merge_attention
from .errors import (CudaError, FlashCoreError, InternalError, InvalidArgumentError,
                     LibraryNotFoundError, NoDeviceError, OutOfMemoryError, UnsupportedError)

__all__ = [
    "attention", "supported", "attention_backward", "attention_backward_supported",
    "flash_attn_func", "flash_attn_varlen_func", "scaled_dot_product_attention",
    "attention_with_kvcache", "merge_attention", "hadamard",
    "build_info", "cuda_available", "device_info", "version_number",
    "library_path", "set_num_threads", "set_check_device_arrays", "set_tuning", "get_tuning", "last_kernel_info",
    "last_host_profile", "KernelInfo", "load_tuning", "save_tuning", "tuning_info",
    "FlashCoreError",
    "InvalidArgumentError", "UnsupportedError", "OutOfMemoryError", "CudaError", "NoDeviceError",
    "InternalError", "LibraryNotFoundError",
]

if "torch" in sys.modules:  # register the ops now, before torch.compile traces a call
    _attention._torch_ops()


def build_info():
    """The library's build description (compiler, flags, CUDA archs, git SHA)."""
    return _lib.load().fc_build_info().decode("utf-8", "replace")


def version_number():
    """MAJOR*10000 + MINOR*100 + PATCH of the loaded library."""
    return int(_lib.load().fc_version_number())


def cuda_available():
    """True if the library has the CUDA backend and a device of a compiled
    architecture is present (never raises for a missing GPU)."""
    return bool(_lib.load().fc_cuda_available())


def device_info():
    """Description of the CUDA device the library would use; raises
    NoDeviceError (with the library's reason) when there is none."""
    lib = _lib.load()
    ctx = _context.context()
    buf = ctypes.create_string_buffer(1024)
    ctx.check(lib.fc_cuda_device_info(ctx.handle, buf, len(buf)))
    return buf.value.decode("utf-8", "replace")


def set_num_threads(n):
    """CPU backend worker threads for calls made from this thread (0 = one
    per online core, the default). A new count releases this thread's
    parked workers and their scratch; the next CPU call starts its own."""
    _context.context().set_num_threads(_limits.int32(n, "num_threads"))


def set_check_device_arrays(on):
    """For calls made from this thread: whether CUDA calls copy their device
    int32 arrays (cu_seqlens, seqused_k / cache_seqlens, block_table) to the
    host and check them first (True, the default: one synchronous round trip
    per call, skipped while a CUDA graph is captured), or trust them (False:
    invalid contents read out of bounds; fc_context_set_check_device_arrays)."""
    _context.context().set_check_device_arrays(bool(on))


def set_tuning(**fields):
    """Experimental: the tuning hooks (fc_tuning in flashcore.h, docs/API.md)
    for calls made from this thread: the named fields (sm90_config,
    sm80_config, sm90_rotate, sm90_tail, sm90_grid, splits, pdl,
    sm80_bwd_config, sm90_bwd_config, masks, sm90_trace_file), every other
    one at its default. A
    new thread starts with only FLASHCORE_SM90_TRACE_FILE from the
    environment (trace builds). Fields set here win over a loaded tuning
    cache's (load_tuning); fields left at their defaults let its entries
    apply."""
    _context.context().set_tuning(**fields)


def get_tuning():
    """Experimental: this thread's tuning hooks, as a dict of fields."""
    return _context.context().get_tuning()


def load_tuning(path):
    """Load the tuning cache file at path (docs/TUNING.md; `flashcore tune`
    writes one) for calls made from this thread, replacing the one it had;
    None drops it (the planners choose). A file that cannot be read or is
    not a valid cache raises, naming the file and line, and keeps the
    earlier cache. A new thread starts with FLASHCORE_TUNING_CACHE's file,
    if the environment names one. kernel_info.tuned says whether a call's
    kernel came from the cache."""
    _context.context().load_tuning(path)


def save_tuning(path):
    """Write this thread's tuning cache (every section, in canonical order)
    to path."""
    _context.context().save_tuning(path)


def tuning_info():
    """A description of this thread's tuning cache: its file, sections and
    entries, and which apply to this build and device ("no tuning cache"
    when there is none). A FLASHCORE_TUNING_CACHE file that could not be
    loaded is reported here, at the top, rather than raised."""
    return _context.context().tuning_info()


def library_path():
    """Path of the loaded libflashcore."""
    return _lib.library_path()


def __getattr__(name):
    # Module attributes computed on access (PEP 562), so importing flashcore
    # never fails for want of the library and kernel_info is per thread.
    if name == "__version__":
        return _lib.load().fc_version_string().decode("ascii")
    if name == "kernel_info":
        return last_kernel_info()
    raise AttributeError("module 'flashcore' has no attribute %r" % name)
