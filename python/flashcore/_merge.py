"""merge_attention(): the attention over the union of disjoint key blocks,
from each block's (out, lse) as attention(..., return_lse=True) returns
them, through fc_attention_merge.

The binding checks what the C struct cannot say: the sequences of parts,
their kind and device, the layout, and out= against outs[0]. The library
checks the rest (dtypes, shapes, strides, aliasing), naming the parts
parts_out[i] and parts_lse[i]. A dense merge without query rows goes in as
the empty varlen merge, as the forward's call does. CUDA tensors merge on
the library's CUDA backend: the context's device set to theirs, torch's
current stream of it, as _context.run does for the forward. The merge has
no backward (autograd does not record it)."""

import ctypes

import numpy as np

from . import _arrays, _context, _lib, _limits, _request
from .errors import InvalidArgumentError, UnsupportedError

_OUT_DTYPES = (_lib.DTYPE_F32, _lib.DTYPE_F16, _lib.DTYPE_BF16)


def _sequence(x, name):
    """x, one entry per part, as a list. An array or tensor is refused: its
    rows would be taken for parts."""
    if isinstance(x, (np.ndarray, str, bytes)) or _arrays.is_torch(x):
        raise InvalidArgumentError("%s: expected a list or tuple of arrays/tensors, one per part, got %s"
                                   % (name, type(x).__name__))
    try:
        return list(x)
    except TypeError:
        raise InvalidArgumentError("%s: expected a list or tuple of arrays/tensors, one per part, got %s"
                                   % (name, type(x).__name__)) from None


def _check_rank(first, layout):
    """outs[0] sets the form: 4-D dense (in layout) or 3-D varlen."""
    if len(first.shape) not in (3, 4):
        dense = ("[batch, seqlen_q, heads, head_dim]" if layout == "bshd"
                 else "[batch, heads, seqlen_q, head_dim]")
        raise InvalidArgumentError("outs[0]: expected a 4-D tensor %s or a 3-D [total_q, heads, head_dim] "
                                   "(varlen), got shape %s" % (dense, first.user_shape))
    if len(first.shape) == 3 and layout == "bhsd":
        raise InvalidArgumentError("layout: variable-length tensors are [total, heads, head_dim]; "
                                   "layout='bhsd' applies to 4-D tensors only")


def _parts(outs, lses, layout):
    """Views of the parts' outs (in layout) and lses, all of outs[0]'s kind
    and device."""
    outs, lses = _sequence(outs, "outs"), _sequence(lses, "lses")
    if not outs:
        raise InvalidArgumentError("outs: no parts; give one (out, lse) pair per key block, at least one")
    if len(lses) != len(outs):
        raise InvalidArgumentError("lses: %d entries but outs has %d: one lse per part"
                                   % (len(lses), len(outs)))
    vouts = [_arrays.view(x, "outs[%d]" % i, layout) for i, x in enumerate(outs)]
    _check_rank(vouts[0], layout)
    vlses = [_arrays.view(x, "lses[%d]" % i) for i, x in enumerate(lses)]
    for i, (vo, vl) in enumerate(zip(vouts, vlses)):
        _request._same_place(vo, "outs[%d]" % i, vouts[0], "outs[0]")
        _request._same_place(vl, "lses[%d]" % i, vouts[0], "outs[0]")
    return vouts, vlses


def _check_no_grad(views):
    """Refuse torch parts that autograd would need a backward for."""
    if views[0].kind != "torch" or not _arrays._torch().is_grad_enabled():
        return
    if any(v.obj.requires_grad for v in views):
        raise UnsupportedError("merge_attention has no backward: the parts require grad; pass them "
                               "detached or call it under torch.no_grad()")


def _backend_code(backend, device):
    """The fc_backend for backend (a checked name) and the parts' device.
    CUDA memory under 'auto' asks for the CUDA backend by name, so the
    library answers for it even in a build that cannot tell device
    pointers from host ones."""
    if device[0] == "cuda":
        if backend in ("cpu", "cpu_reference"):
            raise InvalidArgumentError("backend=%r: the parts are CUDA tensors; the CPU backends read "
                                       "host memory" % backend)
        return _lib.BACKENDS["cuda"]
    return _lib.BACKENDS[backend]


def _out_type(out_dtype, first):
    """(element type, fc_dtype) of out_dtype in outs[0]'s kind."""
    dt, code = _arrays.element_type(first, out_dtype)
    if code not in _OUT_DTYPES:
        raise InvalidArgumentError("out_dtype: %r is not float32, float16 or bfloat16 of outs[0]'s kind (%s)"
                                   % (out_dtype, first.kind))
    return dt, code


def _output(out, out_dtype, first, layout):
    """The merged output's view: out (writable, like outs[0] in kind,
    device and shape; out_dtype's dtype if given), or a new one like
    outs[0] in out_dtype (default: outs[0]'s dtype)."""
    dt = None if out_dtype is None else _out_type(out_dtype, first)
    if out is None:
        return _arrays.empty(first, first.user_shape, layout=layout, dtype=None if dt is None else dt[0])
    vo = _arrays.view(out, "out", layout, written=True)
    _request._same_place(vo, "out", first, "outs[0]")
    if dt is not None and vo.dtype != dt[1]:
        raise InvalidArgumentError("out: dtype %s differs from out_dtype %s" % (vo.elem_dtype, dt[0]))
    if vo.user_shape != first.user_shape:
        raise InvalidArgumentError("out: shape %s differs from outs[0]'s %s"
                                   % (vo.user_shape, first.user_shape))
    return vo


def _as_empty_varlen(vouts, vlses, vo, vl):
    """A dense merge without query rows (batch or seqlen_q 0) as the empty
    varlen merge ([0, heads, head_dim], lse [heads, 0]): the C API's dense
    shapes are >= 1. The shapes that form drops are checked here."""
    first = vouts[0]
    want = _request.lse_shape(first.shape, False)
    for i, (x, l) in enumerate(zip(vouts, vlses)):
        if x.user_shape != first.user_shape:
            raise InvalidArgumentError("outs[%d]: shape %s differs from outs[0]'s %s"
                                       % (i, x.user_shape, first.user_shape))
        if l.shape != want:
            raise InvalidArgumentError("lses[%d]: shape %s, expected [batch, heads, seqlen_q] = %s"
                                       % (i, l.user_shape, want))
    return ([_arrays.no_rows(x) for x in vouts], [_arrays.no_rows(x, True) for x in vlses],
            _arrays.no_rows(vo), None if vl is None else _arrays.no_rows(vl, True))


def _fill(args, vouts, vlses, vo, vl):
    """The views into args; returns the two fc_tensor arrays args points
    to (to keep alive through the call)."""
    n = _limits.int32(len(vouts), "number of parts")
    parts_out, parts_lse = (_lib.fc_tensor * n)(), (_lib.fc_tensor * n)()
    for views, tensors in ((vouts, parts_out), (vlses, parts_lse)):
        for v, t in zip(views, tensors):
            v.fill(t)
    args.num_parts = n
    args.parts_out, args.parts_lse = parts_out, parts_lse
    vo.fill(args.out)
    if vl is not None:
        vl.fill(args.lse)
    return parts_out, parts_lse


def merge_attention(outs, lses, *, out=None, out_dtype=None, return_lse=False, layout="bshd", backend="auto"):
    """The attention over the union of disjoint key blocks, from each
    block's attention: outs[i], lses[i] as flashcore.attention(q, k_i, v_i,
    return_lse=True) returns them for the same queries, one block of keys
    each. Per row, lse = log sum_i exp(lse_i) and out = sum_i exp(lse_i -
    lse) * out_i (fp32 sums in part order: the same bits on any thread
    count); a part whose lse row is -inf saw no key there and is skipped, a
    row that no part saw gets out 0 and lse -inf.

    outs: in the caller's layout, 'bshd' [B,S,H,D] or 'bhsd' [B,H,S,D]
    (strides permuted as attention() does), or 3-D varlen [total_q, H, D];
    float32, float16 or bfloat16, each part its own. lses: float32
    [B,H,S] (varlen [H,total_q]). 1 to 1024 parts, numpy arrays or torch
    tensors (CPU or CUDA), all of one kind and device (out= too).

    out=None: a new output like outs[0] (kind, device, layout) in out_dtype
    (default: outs[0]'s dtype); a given out (writable, outs[0]'s shape,
    float32, float16 or bfloat16; out_dtype's if both are given) is written
    and returned. Returns out, or (out, lse) with return_lse (lse new,
    float32, the parts' lse shape). backend: 'auto' (where the tensors
    are), 'cpu' or 'cpu_reference' (the same code; host memory) or 'cuda'.
    CUDA tensors merge on their device, queued on torch's current stream of
    it (asynchronous, as attention(); a CUDA graph can capture the call); a
    library built without CUDA raises UnsupportedError for them. No
    backward: torch parts that require grad are refused while grad mode is
    on.

    Raises a FlashCoreError subclass with the library's message on
    failure; a failed call has not written out.
    """
    layout, backend = _request.check_names(layout, backend)
    vouts, vlses = _parts(outs, lses, layout)
    first = vouts[0]
    varlen = len(first.shape) == 3
    _check_no_grad(vouts + vlses)
    code = _backend_code(backend, first.device)
    vo = _output(out, out_dtype, first, layout)
    vl = _arrays.empty(first, _request.lse_shape(first.shape, varlen), float32=True) if return_lse else None
    results = (vo.obj, None if vl is None else vl.obj)
    if not varlen and (first.shape[0] == 0 or first.shape[1] == 0):
        vouts, vlses, vo, vl = _as_empty_varlen(vouts, vlses, vo, vl)
    lib = _lib.load()
    args = _lib.new_merge_args(lib)
    args.backend = code
    keep = _fill(args, vouts, vlses, vo, vl)  # noqa: F841 (args points into these)
    ctx = _context.context()
    ctx.set_device(_context.device_index(first.device))  # as the forward's _context.run: the tensors' device
    ctx.check(lib.fc_attention_merge(ctx.handle, ctypes.byref(args), _context.stream(first.device)))
    return results if return_lse else results[0]
