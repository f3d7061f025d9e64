"""Checked calls, kept for reuse.

A call on torch tensors is a function of its signature (each tensor's
shape, strides, dtype and device, and the options) and of its data
pointers. So the args struct that the full checks (_request) built for a
signature is kept as bytes, and the next call with the same signature
copies it into the thread's struct (unless that holds it already) and sets
the data pointers (q, k, v, the new out and lse, a paged call's
block_table and seqused_k, an appending call's k_new, v_new, rotary_cos
and rotary_sin; the backward's dout, q, k, v, out, lse and the new dq, dk,
dv), instead of inspecting and converting every tensor again. The library
runs all of its own checks on every call.

Kept: forward calls and backward calls (attention_backward, the op's
backward) that are dense and have no empty tensor (varlen offsets are data
the checks read, an empty tensor may have no pointer); a paged call where
its block_table and seqused_k are int32 tensors on q's device that the
library reads in place (else the pointer is a converted copy's); an
appending call where k_new, v_new and the rotary tables given are torch
tensors on q's device without an empty dimension, and k and v (written)
do not require grad (the full call refuses a leaf that does). The
signature holds which of these tensors are given, so a call with k_new
never runs a kept struct without it, and a call without it never one with
it (the struct is reset to the kept bytes, whose append fields are NULL).
A given out= is part of the forward's signature, with what its
writability check reads; a backward with given dq, dk or dv is not kept.
No FP8 call is kept (FP8 q, k or v: the kept outputs would take q's
dtype), nor a call given FP8 options (descales, out_dtype, return_amax:
_attention._forward asks for no signature; the kept struct has none).
Per process, at most _MAX signatures (then the cache starts over).
"""

from . import _arrays, _context, _lib, _request

_MAX = 256
_kept = {}


class _Entry:
    """A kept call: its args bytes (init), where it runs, and how to make
    its outputs: (shape, the input whose empty_like has the same strides,
    or None: _arrays.new_output, bhsd or not) each; the forward's lse
    shape."""
    __slots__ = ("init", "backward", "device", "device_index", "cuda_path", "outs", "lse_shape",
                 "torch_device")


def _sig(x):
    return x.shape, x.stride(), x.dtype, x.device


_NTENSORS = len(_request.PAGED) + len(_request.APPEND)


def _forward_sig(common, q):
    """The signatures of block_table and seqused_k, then of k_new, v_new,
    rotary_cos and rotary_sin (None where absent), or False where one is
    not read in place (its pointer would be a copy's) or might not be read
    at all (another device, an empty tensor: the full call checks it)."""
    tensor = _arrays._torch().Tensor
    sig = ()
    for name in _request.PAGED:
        x = common[name]
        if x is None:
            sig += (None,)
        elif isinstance(x, tensor) and x.device == q.device and _arrays.int32_in_place(x):
            sig += (x.shape, x.stride())
        else:
            return False
    for name in _request.APPEND:
        x = common[name]
        if x is None:
            sig += (None,)
        elif isinstance(x, tensor) and x.device == q.device and 0 not in x.shape:
            sig += (x.shape, x.stride(), x.dtype)
        else:
            return False
    return sig


def key(q, k, v, return_lse, out, cuda_path, common):
    """The signature of a forward call that may be kept (q a torch tensor),
    or None. One flat tuple: each nested one would cost its own allocation
    and hash."""
    if common["cu_seqlens_q"] is not None or common["cu_seqlens_k"] is not None:
        return None
    tensor = _arrays._torch().Tensor
    if not (isinstance(k, tensor) and isinstance(v, tensor)):
        return None
    given = None
    if out is not None:
        if not isinstance(out, tensor):
            return None
        given = (*_sig(out), out.requires_grad, out.is_leaf)
    sig = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
           v.shape, v.stride(), v.dtype, v.device, given, bool(return_lse), cuda_path, *common.values())
    # v_new or rotary tables without k_new fail, and a failed call is never
    # kept: these three decide, as in run()
    if common["block_table"] is None and common["seqused_k"] is None and common["k_new"] is None:
        return sig
    if common["k_new"] is not None and (k.requires_grad or v.requires_grad):
        return None  # k and v are written: the full call's writability check decides
    tail = _forward_sig(common, q)
    # the forward-only tensors' signatures replace them (common holds them last)
    return None if tail is False else (*sig[:-_NTENSORS], *tail)


def bwd_key(tensors, grads, deterministic, cuda_path, common):
    """The signature of a backward call on tensors (dout, q, k, v, out,
    lse) that may be kept, or None: the library makes dq, dk, dv (grads all
    None), no varlen, all torch tensors."""
    if common["cu_seqlens_q"] is not None or common["cu_seqlens_k"] is not None or grads != (None, None, None):
        return None
    tensor = _arrays._torch().Tensor
    sig = ["bwd", bool(deterministic), cuda_path, *common.values()]
    for x in tensors:
        if not isinstance(x, tensor):
            return None
        sig += _sig(x)
    return tuple(sig)


def _new_outputs(e, inputs):
    torch = _arrays._torch()
    # empty_like costs half of new_empty; taken where it gives the same strides
    return [torch.empty_like(inputs[like]) if like is not None else _arrays.new_output(inputs[0], shape, bhsd)
            for shape, like, bhsd in e.outs]


def _get(sig):
    try:
        return _kept.get(sig)
    except TypeError:  # an unhashable option (a list as window): never kept
        return None


def _ptr(x):
    return None if x is None else x.data_ptr()


def run(sig, q, k, v, out, cuda_path, common):
    """The kept forward call of signature sig on these tensors (and out, if
    given; block_table, seqused_k, k_new, v_new, rotary_cos and rotary_sin
    from common): (out, lse or None), or None when none is kept."""
    e = _get(sig)
    if e is None:
        return None
    if out is None:
        out = _new_outputs(e, (q,))[0]
    lse = None
    if e.lse_shape is not None:
        torch = _arrays._torch()
        lse = torch.empty(e.lse_shape, dtype=torch.float32, device=e.torch_device)
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), _ptr(lse))
    table, used, k_new = common["block_table"], common["seqused_k"], common["k_new"]
    if table is not None or used is not None or k_new is not None:  # else they stay NULL, as kept
        ptrs += (_ptr(table), _ptr(used))
        if k_new is not None:  # (no call without k_new that gives the others succeeds)
            ptrs += (k_new.data_ptr(), _ptr(common["v_new"]), _ptr(common["rotary_cos"]),
                     _ptr(common["rotary_sin"]))
    _context.context().run_kept(_lib.load().fc_attention_forward, e, ptrs)
    return out, lse


def run_bwd(sig, dout, q, k, v, out, lse):
    """The kept backward call of signature sig: (dq, dk, dv), or None."""
    e = _get(sig)
    if e is None:
        return None
    grads = _new_outputs(e, (q, k, v))
    _context.context().run_kept(_lib.load().fc_attention_backward, e,
                                (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                                 dout.data_ptr(), *(g.data_ptr() for g in grads)))
    return tuple(grads)


def _like(x, y):
    """Does empty_like(y) make what x is (shape, dtype, strides)?"""
    return x.shape == y.shape and x.dtype == y.dtype and _arrays._torch().empty_like(y).stride() == x.stride()


def keep(sig, call, inputs, cuda_path):
    """Keep call (checked and run with success) under sig. inputs: (q,) for
    the forward, (q, k, v) for the backward, as the caller passed them."""
    if sig is None or call.no_rows or any(0 in x.shape or x.dtype in _lib.DTYPES_FP8 for x in call.views):
        return
    e = _Entry()
    e.init = call.args._buf.raw
    e.backward = len(inputs) == 3
    e.device = call.device
    e.device_index = _context.device_index(call.device)
    e.cuda_path = _context.cuda_path_value(cuda_path)
    made = call.results if e.backward else call.results[:1]
    e.outs = [(x.shape, i if _like(x, inputs[i]) else None, not x.is_contiguous()) for i, x in enumerate(made)]
    lse = None if e.backward else call.results[1]
    e.lse_shape = None if lse is None else lse.shape
    e.torch_device = inputs[0].device
    try:
        if len(_kept) >= _MAX:
            _kept.clear()
        _kept[sig] = e
    except TypeError:
        pass
