"""FP8 calls (flashcore.h, "FP8"): attention()'s out_dtype, q/k/v
descales and amax outputs, checked and put into the C struct.

An FP8 call has q, k, v of one FP8 type (ml_dtypes.float8_e4m3fn or
float8_e5m2 numpy arrays, torch.float8_e4m3fn or torch.float8_e5m2
tensors) and writes out in out_dtype (float32, float16 or bfloat16,
default bfloat16); or k and v FP8 (an FP8 K/V cache) under q of another
type, and out in q's dtype. The library computes attention on x *
descale, forward only. Which dtype combinations it takes, and that a
descale belongs to an FP8 tensor, are the library's checks (its message
names the tensor); what the library cannot see is checked here: the
descales' kind, device, dtype and shape, and out_dtype.
"""

import math
import numbers

import numpy as np

from . import _arrays, _lib
from .errors import InvalidArgumentError

NAMES = ("q_descale", "k_descale", "v_descale")
_OUT_CODES = (_lib.DTYPE_F32, _lib.DTYPE_F16, _lib.DTYPE_BF16)


class Options:
    """attention()'s FP8 arguments: the descales (q, k, v; None = 1),
    out_dtype (None: the default) and return_amax."""

    __slots__ = ("descales", "out_dtype", "return_amax")


def options(q_descale, k_descale, v_descale, out_dtype, return_amax):
    """The Options of a call, or None when every one is its default (the
    plain call, which _call_cache may keep)."""
    if q_descale is None and k_descale is None and v_descale is None and out_dtype is None \
            and not return_amax:
        return None
    o = Options()
    o.descales = (q_descale, k_descale, v_descale)
    o.out_dtype = out_dtype
    o.return_amax = bool(return_amax)
    return o


def plain(fp8, q):
    """Is a call on the torch tensor q with Options fp8 a plain one: none
    given, or only out_dtype and it is q's own dtype?"""
    return fp8 is None or (fp8.descales == (None, None, None) and not fp8.return_amax
                           and fp8.out_dtype == q.dtype)


def _out_names(vq):
    if vq.kind == "numpy":
        return "numpy.float32, numpy.float16 or ml_dtypes.bfloat16"
    return "torch.float32, torch.float16 or torch.bfloat16"


def _default(vq):
    """bfloat16 of q's kind: ml_dtypes (which numpy FP8 arrays come from) or torch."""
    if vq.kind == "numpy":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return _arrays._torch().bfloat16


def out_type(fp8, vq, out):
    """The (element type, fc_dtype) of out for q (its view vq), or None for
    q's own: FP8 q writes out_dtype (default out's dtype where out is given,
    else bfloat16); any other q writes its own dtype, which out_dtype may
    only repeat."""
    given = None if fp8 is None else fp8.out_dtype
    if vq.dtype not in _lib.DTYPES_FP8:
        dt, code = (None, vq.dtype) if given is None else _arrays.element_type(vq, given)
        if code != vq.dtype:
            raise InvalidArgumentError(
                "out_dtype: %s differs from q's dtype %s: only FP8 q takes another output dtype (an "
                "FP8 K/V cache under %s q writes %s)" % (dt, vq.elem_dtype, vq.elem_dtype, vq.elem_dtype))
        return None
    name = "out_dtype"
    if given is None and out is not None and _arrays.is_torch(out) == (vq.kind == "torch"):
        given, name = out.dtype, "out"  # out's kind: else the place check names it
    dt, code = _arrays.element_type(vq, _default(vq) if given is None else given)
    if code not in _OUT_CODES:
        raise InvalidArgumentError("%s: dtype %s: an FP8 call writes %s" % (name, dt, _out_names(vq)))
    return dt, code


def _number(x, name, vq):
    """A per-tensor descale, one float32 in q's memory space: (its array,
    pointer, 0, 0)."""
    with np.errstate(over="ignore"):  # a value past float32's range: refused below
        f = np.float32(x)
    if not math.isfinite(f):
        raise InvalidArgumentError("%s: %r is not a finite float32" % (name, x))
    if vq.device[0] == "cuda":
        torch = _arrays._torch()
        t = torch.full((1,), float(f), dtype=torch.float32, device=vq.obj.device)
        return t, t.data_ptr(), 0, 0
    a = np.full(1, f, dtype=np.float32)
    return a, a.ctypes.data, 0, 0


def _numpy_array(x, name):
    """(shape, strides in elements, pointer) of a float32 numpy descale."""
    if not (x.dtype == np.float32 and x.dtype.isnative):
        raise InvalidArgumentError("%s: dtype %s, expected float32 (in the machine's byte order)"
                                   % (name, x.dtype))
    if not x.flags.aligned or any(s < 0 or s % 4 for s in x.strides):
        raise InvalidArgumentError("%s: strides %s (bytes) must be non-negative multiples of 4, the data "
                                   "aligned; pass np.ascontiguousarray(%s)" % (name, x.strides, name))
    return x.shape, tuple(s // 4 for s in x.strides), x.ctypes.data


def _torch_tensor(x, name, vq):
    """(shape, strides, pointer) of a float32 torch descale on q's device."""
    torch = _arrays._torch()
    if x.device != vq.obj.device:
        raise InvalidArgumentError("%s: is on %s but q is on %s" % (name, x.device, vq.obj.device))
    if x.dtype != torch.float32 or x.layout is not torch.strided:
        raise InvalidArgumentError("%s: dtype %s (%s), expected a strided torch.float32 tensor"
                                   % (name, x.dtype, x.layout))
    return tuple(x.shape), x.stride(), x.data_ptr()


def _array(x, name, vq, batch, heads_kv):
    """A descale array or tensor: 0-d (one value) or [batch, heads_kv], any
    strides (0 broadcasts), float32, q's kind and device: (x, pointer,
    batch stride, head stride); pointer 0 where it holds no element (no
    query row: nothing is read)."""
    if vq.kind == "numpy" and isinstance(x, np.ndarray):
        shape, strides, ptr = _numpy_array(x, name)
    elif vq.kind == "torch" and _arrays.is_torch(x):
        shape, strides, ptr = _torch_tensor(x, name, vq)
    else:
        raise InvalidArgumentError("%s: expected a number, or a float32 %s like q, got %s"
                                   % (name, "numpy array" if vq.kind == "numpy" else "torch tensor",
                                      type(x).__name__))
    if shape == ():
        return x, ptr, 0, 0
    if shape != (batch, heads_kv):
        raise InvalidArgumentError("%s: shape %s, expected [batch, heads_kv] = [%d, %d] (or 0-d, or a "
                                   "number: one value for all)" % (name, shape, batch, heads_kv))
    if batch == 0 or heads_kv == 0:
        return x, 0, 0, 0
    return x, ptr, strides[0], strides[1]


def _descale(x, name, vq, batch, heads_kv):
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return _number(x, name, vq)
    return _array(x, name, vq, batch, heads_kv)


def fill(call, args, fp8):
    """Put the Options fp8 (None: nothing) into args, an fc_attention_args
    that finish() filled (so the varlen sequence count is known): the
    descales, and the amax outputs, whose new float32 [2] array
    (out_amax, p_amax) of q's kind and device becomes call.amax (else
    None)."""
    call.amax = None
    if fp8 is None:
        return
    vq, vk = call.views[:2]
    batch = args.num_seqs if call.varlen else vq.shape[0]
    heads_kv = vk.shape[1 if call.varlen else 2]
    for x, name, field in zip(fp8.descales, NAMES, (args.q_descale, args.k_descale, args.v_descale)):
        if x is not None:
            keep, field.data, field.batch_stride, field.head_stride = _descale(x, name, vq, batch, heads_kv)
            call.keep.append(keep)
    if fp8.return_amax:
        amax = _arrays.empty(vq, (2,), float32=True)
        args.out_amax, args.p_amax = amax.ptr, amax.ptr + 4
        call.amax = amax.obj
