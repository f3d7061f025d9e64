"""Turning numpy arrays and torch tensors into fc_tensor views, and making
outputs of the caller's kind.

No data is copied: a view is the object's data pointer with its shape and
strides (in elements) put in the library's order. torch is never imported
here: a torch tensor can only reach us if the caller imported torch already,
so sys.modules tells whether an object is one.
"""

import sys

import numpy as np

from . import _lib
from .errors import InvalidArgumentError

def _torch():
    return sys.modules.get("torch")


def is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


class View:
    """One operand as the C API sees it, plus what is needed to allocate a
    matching output. `obj` keeps the Python object alive during the call."""

    __slots__ = ("obj", "kind", "device", "dtype", "elem_dtype", "shape", "strides",
                 "user_shape", "ptr", "pad")

    def fill(self, t):
        """Write this view into a ctypes fc_tensor."""
        n = len(self.shape)
        t.data = self.ptr
        t.dtype = self.dtype
        t.ndim = n
        pad = (0,) * (4 - n)  # one slice store per array: cheaper than 8 item stores
        t.shape[:] = self.shape + pad
        t.stride[:] = self.strides + pad

    def device_str(self):
        return "cpu" if self.device[0] == "cpu" else "cuda:%d" % self.device[1]


def is_float32(x):
    """x is a float32 numpy array or torch tensor (any byte order: view()
    names a foreign one)."""
    if isinstance(x, np.ndarray):
        return x.dtype.kind == "f" and x.dtype.itemsize == 4
    return is_torch(x) and x.dtype == _torch().float32


def zero(x):
    """Set every element of the array/tensor x to 0 (CUDA: on torch's
    current stream, like the library's own work)."""
    if isinstance(x, np.ndarray):
        x[...] = 0
    else:
        with _torch().no_grad():
            x.zero_()


# ml_dtypes' element types the library reads, by their numpy dtype names.
_ML_DTYPES = {"bfloat16": _lib.DTYPE_BF16, "float8_e4m3fn": _lib.DTYPE_E4M3,
              "float8_e5m2": _lib.DTYPE_E5M2}


def _numpy_dtype_code(dt, name):
    # The library reads native-order elements; a big-endian array of a
    # supported type would be read as other numbers.
    if not dt.isnative:
        raise InvalidArgumentError(
            "%s: dtype %s is %s-endian, not the machine's byte order; pass "
            "%s.astype(%s.dtype.newbyteorder('='))"
            % (name, dt.name, "big" if dt.byteorder == ">" else "little", name, name))
    if dt == np.float32:
        return _lib.DTYPE_F32
    if dt == np.float16:
        return _lib.DTYPE_F16
    if dt == np.float64:  # the cpu-reference backend alone: gradient checks
        return _lib.DTYPE_F64
    # numpy has no bfloat16 nor FP8; ml_dtypes provides them (its dtypes are named so).
    code = _ML_DTYPES.get(dt.name)
    if code is not None and dt.itemsize == (2 if code == _lib.DTYPE_BF16 else 1):
        return code
    raise InvalidArgumentError(
        "%s: dtype %s is not supported: use float32, float16 (or ml_dtypes.bfloat16 "
        "for numpy, torch.bfloat16 for torch), FP8 inputs ml_dtypes.float8_e4m3fn or "
        "float8_e5m2 (torch.float8_e4m3fn, torch.float8_e5m2), or float64 on the "
        "cpu-reference backend" % (name, dt))


_torch_codes = {}  # torch dtype -> fc_dtype, filled on the first torch tensor


def _torch_dtype_code(torch, dt, name):
    if not _torch_codes:
        _torch_codes.update({torch.float32: _lib.DTYPE_F32, torch.float16: _lib.DTYPE_F16,
                             torch.bfloat16: _lib.DTYPE_BF16, torch.float64: _lib.DTYPE_F64})
        for attr, code in (("float8_e4m3fn", _lib.DTYPE_E4M3), ("float8_e5m2", _lib.DTYPE_E5M2)):
            if hasattr(torch, attr):  # torch >= 2.1
                _torch_codes[getattr(torch, attr)] = code
    code = _torch_codes.get(dt)
    if code is None:
        raise InvalidArgumentError(
            "%s: dtype %s is not supported: use torch.float32, torch.float16 or "
            "torch.bfloat16, FP8 inputs torch.float8_e4m3fn or torch.float8_e5m2 "
            "(torch.float64 on the cpu-reference backend)" % (name, dt))
    return code


def element_type(like, dt):
    """dt, an element type asked for an array of like's kind (a View), as
    (the numpy dtype or torch.dtype, its fc_dtype), or (dt, None) where it
    is none the library reads. numpy: what np.dtype() takes; torch: a
    torch.dtype."""
    try:
        if like.kind == "numpy":
            dt = np.dtype(dt)
            return dt, _numpy_dtype_code(dt, "dtype")
        torch = _torch()
        return dt, _torch_dtype_code(torch, dt, "dtype") if isinstance(dt, torch.dtype) else None
    except (TypeError, ValueError):  # not a dtype, or one the library has no code for
        return dt, None


def _writable(x, name):
    """Refuse an output the call may not write: a read-only numpy array (a
    read-only memmap, an array over bytes) or a torch leaf that autograd
    tracks (torch itself refuses in-place writes to those)."""
    if isinstance(x, np.ndarray):
        if not x.flags.writeable:
            raise InvalidArgumentError("%s: the array is read-only (flags.writeable is False)" % name)
    elif is_torch(x) and x.requires_grad and x.is_leaf:
        raise InvalidArgumentError("%s: a leaf tensor that requires grad cannot be written in place"
                                   % name)


def _c_order(shape):
    """Row-major strides in elements (a zero dimension counts as 1)."""
    strides, n = [], 1
    for d in reversed(shape):
        strides.append(n)
        n *= max(int(d), 1)
    return tuple(reversed(strides))


def _numpy_strides(x, name):
    """x's strides in elements. numpy gives a zero-size array stride 0 in
    every dimension; nothing is addressed, so C-order strides stand in."""
    item = x.itemsize
    if x.size == 0:
        return _c_order(x.shape)
    if any(s % item for s in x.strides):
        raise InvalidArgumentError(
            "%s: strides %s (bytes) are not multiples of the element size %d"
            % (name, x.strides, item))
    return tuple(s // item for s in x.strides)


_CPU = ("cpu", -1)


def _torch_view(v, x, name):
    """Fill v from the torch tensor x; returns (shape, strides). Every query
    here is one of torch's cheapest (is_cuda, get_device, not x.device.type):
    this runs for each operand of every call."""
    torch = _torch()
    v.kind = "torch"
    if x.layout is not torch.strided:
        raise InvalidArgumentError("%s: only strided (dense) tensors are supported, got %s"
                                   % (name, x.layout))
    if x.is_cuda:
        v.device = ("cuda", x.get_device())
    elif x.is_cpu:
        v.device = _CPU
    else:
        raise InvalidArgumentError("%s: tensors on device '%s' are not supported (cpu or cuda)"
                                   % (name, x.device))
    v.elem_dtype = x.dtype
    v.dtype = _torch_dtype_code(torch, x.dtype, name)
    v.ptr = x.data_ptr()
    shape = tuple(x.shape)
    if 0 not in shape:
        return shape, x.stride()
    if not v.ptr:
        # An empty tensor may have no storage; the library wants a non-NULL
        # pointer in the right memory space, and reads none.
        v.pad = torch.empty(1, dtype=x.dtype, device=x.device)
        v.ptr = v.pad.data_ptr()
    return shape, _c_order(shape)


def view(x, name, layout="bshd", written=False):
    """A View of x (numpy array or torch tensor). layout 'bhsd' applies to 4-D
    operands: the strides are permuted into the library's [B,S,H,D] order.
    written: x is an output (checked writable)."""
    if written:
        _writable(x, name)
    v = View()
    v.obj = x
    if isinstance(x, np.ndarray):
        v.kind = "numpy"
        v.device = ("cpu", -1)
        v.elem_dtype = x.dtype
        v.dtype = _numpy_dtype_code(x.dtype, name)
        strides = _numpy_strides(x, name)
        if not x.flags.aligned:
            raise InvalidArgumentError("%s: the array's data is not aligned to its element size" % name)
        if any(s < 0 for s in strides):
            raise InvalidArgumentError(
                "%s: negative strides are not supported; pass np.ascontiguousarray(%s)"
                % (name, name))
        v.ptr = x.ctypes.data
        shape = tuple(int(n) for n in x.shape)
    elif is_torch(x):
        shape, strides = _torch_view(v, x, name)
    else:
        raise InvalidArgumentError("%s: expected a numpy array or a torch tensor, got %s"
                                   % (name, type(x).__name__))
    v.user_shape = shape
    if layout == "bhsd" and len(shape) == 4:  # [B,H,S,D] -> the library's [B,S,H,D]
        shape = (shape[0], shape[2], shape[1], shape[3])
        strides = (strides[0], strides[2], strides[1], strides[3])
    if len(shape) >= 1 and shape[-1] == 1:
        strides = strides[:-1] + (1,)  # any stride is fine over one element
    if len(shape) >= 1 and strides[-1] != 1:
        raise InvalidArgumentError(
            "%s: the last dimension (head_dim) must be contiguous (stride 1), got stride %d; "
            "pass a contiguous copy" % (name, strides[-1]))
    v.shape, v.strides = shape, strides
    return v


def no_rows(v, lse=False):
    """v, a dense view with no row, as the empty varlen view of the same
    operand: [0, heads, head_dim] (lse: [heads, 0]). Nothing is addressed."""
    w = View()
    for name in View.__slots__:
        setattr(w, name, getattr(v, name, None))
    w.shape = (v.shape[1], 0) if lse else (0, v.shape[2], v.shape[3])
    w.strides = _c_order(w.shape)
    return w


def empty(like, user_shape, float32=False, layout="bshd", dtype=None):
    """A new uninitialised array/tensor of like's kind and device, in the
    caller's layout, with like's element type (or float32, or dtype: one of
    like's kind), viewed for the C API."""
    if dtype is None:
        dtype = None if float32 else like.elem_dtype
    if like.kind == "numpy":
        obj = np.empty(user_shape, dtype=np.float32 if dtype is None else dtype)
    else:
        obj = new_output(like.obj, user_shape, layout == "bhsd", _torch().float32 if dtype is None else dtype)
    return view(obj, "out", layout)


def new_output(like, shape, bhsd, dtype=None):
    """A new torch tensor of shape on like's device (like's dtype, or
    dtype): a 4-D bhsd one is a [B,H,S,D] view of [B,S,H,D] memory, as
    torch's SDPA makes its out, so that the usual transpose(1, 2).reshape
    after attention copies nothing. (new_empty: like's device without
    building a torch.device, half the cost.)"""
    if bhsd and len(shape) == 4:
        return like.new_empty((shape[0], shape[2], shape[1], shape[3]), dtype=dtype).transpose(1, 2)
    return like.new_empty(shape, dtype=dtype)


def full_int32(like, n, value):
    """An int32 array of n entries equal to value, of like's kind and device
    (like: a numpy array or torch tensor)."""
    if is_torch(like):
        return _torch().full((n,), value, dtype=_torch().int32, device=like.device)
    return np.full(n, value, dtype=np.int32)


def _rows_ok(shape, strides):
    """Can the library read an int array of this shape and element strides
    in place: a contiguous last dimension, rows that do not overlap?"""
    if shape and shape[-1] > 1 and strides[-1] != 1:
        return False
    return len(shape) < 2 or shape[0] <= 1 or strides[0] >= shape[1]


def int32_in_place(x):
    """A torch tensor the binding passes to the library as it is (no cast,
    no copy: int32_array returns it)."""
    return x.dtype == _torch().int32 and _rows_ok(tuple(x.shape), x.stride())


def _host_int32(x, name, ndim):
    """x (a sequence, numpy array or CPU tensor) as an ndim-D int32 numpy
    array the library reads in place: x itself where it is one, else a
    C-order copy of integers that fit int32."""
    if is_torch(x):
        x = x.numpy()
    arr = np.asarray(x)
    if arr.ndim != ndim or arr.dtype.kind not in "iu":
        raise InvalidArgumentError("%s: expected a %d-D integer array, got %s of shape %s"
                                   % (name, ndim, arr.dtype, arr.shape))
    if arr.dtype == np.int32 and arr.flags.aligned and _rows_ok(arr.shape, [s // 4 for s in arr.strides]):
        return arr
    # Only a type wider than int32 pays for the range check.
    dt = arr.dtype
    wide = dt.itemsize > 4 or (dt.kind == "u" and dt.itemsize == 4)
    if wide and arr.size and (arr.min() < -2**31 or arr.max() >= 2**31):
        raise InvalidArgumentError("%s: values do not fit int32" % name)
    return np.ascontiguousarray(arr, dtype=np.int32)


def _device_int32(x, name, like, ndim):
    """x, a CUDA tensor, as int32 on like's device that the library reads in
    place (x itself where it is one: no sync, so graph capture works)."""
    torch = _torch()
    dev = torch.device("cuda", like.device[1])
    if x.device != dev:
        raise InvalidArgumentError("%s: must be on %s like q (got %s)" % (name, dev, x.device))
    if x.dim() != ndim or x.is_floating_point() or x.is_complex():
        raise InvalidArgumentError("%s: expected a %d-D integer tensor, got %s of shape %s"
                                   % (name, ndim, x.dtype, tuple(x.shape)))
    if int32_in_place(x):
        return x
    t = x.to(torch.int32).contiguous()
    # Narrowing wraps silently; only a non-int32 tensor pays this check's sync.
    if x.dtype != torch.int32 and not torch.equal(t.to(x.dtype), x):
        raise InvalidArgumentError("%s: values do not fit int32" % name)
    return t


def int32_array(x, name, like, ndim):
    """x (integers: a sequence, numpy array or torch tensor) as an ndim-D
    int32 array in like's memory space that the library reads in place:
    (that array or tensor, a numpy array of the values or None where they
    are in device memory). x itself where it is one already."""
    if like.device[0] == "cpu" or not is_torch(x):
        if is_torch(x) and x.device.type != "cpu":
            raise InvalidArgumentError("%s: must be on the CPU like q (got %s)" % (name, x.device))
        host = _host_int32(x, name, ndim)
        if like.device[0] == "cpu":
            return host, host
        return _torch().from_numpy(host).to(_torch().device("cuda", like.device[1])), host
    return _device_int32(x, name, like, ndim), None


def data_ptr(x):
    """The data pointer of a numpy array or torch tensor."""
    return x.ctypes.data if isinstance(x, np.ndarray) else x.data_ptr()


def row_stride(x):
    """The element stride between rows of a 2-D numpy array or torch tensor."""
    return x.strides[0] // x.itemsize if isinstance(x, np.ndarray) else x.stride(0)


def _check_last(last, name, total):
    if last != total:
        raise InvalidArgumentError(
            "%s: the last offset is %d but the tensor has %d tokens: the offsets must cover "
            "every token (the rows past the last offset would be left unwritten)"
            % (name, last, total))


def seqlens(x, name, like, total):
    """cu_seqlens as an int32 array in like's memory space; total is the token
    count of the tensor it indexes. Returns (keepalive object, pointer, number
    of entries, max length or None when the offsets are in device memory:
    device_seqlens_max reads them)."""
    arr, host = int32_array(x, name, like, 1)
    n = int(arr.shape[0])
    if n < 2:
        raise InvalidArgumentError("%s: has %d entries: expected batch+1 >= 2" % (name, n))
    mx = None
    if host is not None:
        _check_last(int(host[-1]), name, total)
        mx = int((host[1:] - host[:-1]).max())  # np.diff costs 3x more on small arrays
    return arr, data_ptr(arr), n, mx


def device_seqlens_max(keep, name, total):
    """Longest sequence of a device cu_seqlens tensor, and its last offset
    checked against total, in one synchronising read."""
    torch = _torch()
    mx, last = torch.stack(((keep[1:] - keep[:-1]).max(), keep[-1])).tolist()
    _check_last(int(last), name, total)
    return int(mx)
