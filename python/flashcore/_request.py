"""Checked requests: the arguments of attention() and attention_backward()
put into the C structs. Each check lives here once and both calls use it:
names and options, the q/k/v operands, tensors that must match another one
(out, dout, the gradients), lse, varlen offsets, the paged cache's block
table and key counts, the keys appended to the cache (and the rotary
tables), dense calls without rows."""

from . import _arrays, _lib, _limits
from .errors import InvalidArgumentError, UnsupportedError


class Call:
    """A fully checked request: the C args struct (`args`, what the entry
    point takes), the objects it points into (kept alive until the call
    returns) and the results to hand back."""

    __slots__ = ("args", "keep", "device", "layout", "varlen", "views", "seqlens",
                 "paged", "append", "no_rows", "results", "amax")


def check_names(layout, backend):
    if not isinstance(layout, str) or layout.lower() not in ("bshd", "bhsd"):
        raise InvalidArgumentError("layout: expected 'bshd' ([B,S,H,D]) or 'bhsd' ([B,H,S,D]), got %r"
                                   % (layout,))
    if not isinstance(backend, str) or backend.lower() not in _lib.BACKENDS:
        raise InvalidArgumentError("backend: expected one of %s, got %r"
                                   % (", ".join(sorted(_lib.BACKENDS)), backend))
    return layout.lower(), backend.lower()


def window_pair(window):
    """(left, right) from window, each within int32 (None: (-1, -1))."""
    if window is None:
        return -1, -1
    try:
        wl, wr = window
    except (TypeError, ValueError):
        raise InvalidArgumentError("window: expected (left, right) integers, -1 = unbounded, got %r"
                                   % (window,)) from None
    return _limits.int32(wl, "window left"), _limits.int32(wr, "window right")


def _fill_options(args, causal, window, softcap, scale):
    """The scalar options, range-checked before ctypes narrows them."""
    args.window_left, args.window_right = window_pair(window)
    args.scale = 0.0 if scale is None else _limits.float32(scale, "scale", "1/sqrt(head_dim)")
    args.softcap = _limits.float32(softcap or 0.0, "softcap", "no cap")
    args.causal = 1 if causal else 0


def _check_dtypes(vq, vk, vv):
    """q, k, v of one dtype; or k and v of one FP8 type, under q of that
    type or an f32/f16/bf16 q (an FP8 K/V cache: the library checks which,
    and out's dtype)."""
    if vk.dtype in _lib.DTYPES_FP8 or vv.dtype in _lib.DTYPES_FP8:
        if vv.dtype != vk.dtype:
            raise InvalidArgumentError("v: dtype %s differs from k's %s (FP8 k and v are of one type)"
                                       % (vv.elem_dtype, vk.elem_dtype))
        return
    for name, x in (("k", vk), ("v", vv)):
        if x.dtype != vq.dtype:
            raise InvalidArgumentError("%s: dtype %s differs from q's %s"
                                       % (name, x.elem_dtype, vq.elem_dtype))


def _check_operands(vq, vk, vv, varlen, layout, backend):
    want = 3 if varlen else 4
    what = "[total, heads, head_dim] (varlen)" if varlen else (
        "[batch, seqlen, heads, head_dim]" if layout == "bshd" else "[batch, heads, seqlen, head_dim]")
    for name, x in (("q", vq), ("k", vk), ("v", vv)):
        if len(x.shape) != want:
            raise InvalidArgumentError("%s: expected a %d-D tensor %s, got shape %s"
                                       % (name, want, what, x.user_shape))
        if x.kind != vq.kind:
            raise InvalidArgumentError("%s: is a %s object but q is a %s object" % (name, x.kind, vq.kind))
        if x.device != vq.device:
            raise InvalidArgumentError("%s: is on %s but q is on %s"
                                       % (name, x.device_str(), vq.device_str()))
    _check_dtypes(vq, vk, vv)
    on_cuda = vq.device[0] == "cuda"
    if on_cuda and backend in ("cpu", "cpu_reference"):
        raise InvalidArgumentError("backend=%r: q, k, v are CUDA tensors; the CPU backends read host memory"
                                   % backend)
    if not on_cuda and backend == "cuda":
        raise InvalidArgumentError("backend='cuda': q, k, v are in host memory; pass CUDA tensors")


# The forward-only arguments, last in common(): the paged cache, then the
# append step's tensors (k_new, v_new, the rotary tables). A kept call's
# signature stands their tensors' signatures in for them (_call_cache.key).
PAGED = ("block_table", "seqused_k")
APPEND = ("k_new", "v_new", "rotary_cos", "rotary_sin")
# Every forward-only name in common() (the backward takes none of them):
# rotary_interleaved, a flag, comes before the tensors.
FORWARD = ("rotary_interleaved",) + PAGED + APPEND


def common(causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
           backend, layout, block_table=None, seqused_k=None, k_new=None, v_new=None,
           rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    """The keyword arguments of start(): those that forward and backward
    share, then the forward's (FORWARD; the backward refuses them): the
    paged cache and the append step."""
    # a literal: every call builds it (a dict() of keywords cost ~0.8 us more)
    return {"causal": causal, "window": window, "softcap": softcap, "scale": scale,
            "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k, "max_seqlen_q": max_seqlen_q,
            "max_seqlen_k": max_seqlen_k, "backend": backend, "layout": layout,
            "rotary_interleaved": rotary_interleaved, "block_table": block_table,
            "seqused_k": seqused_k, "k_new": k_new, "v_new": v_new, "rotary_cos": rotary_cos,
            "rotary_sin": rotary_sin}


def _check_varlen(varlen, cu_seqlens_q, cu_seqlens_k, layout, block_table, seqused_k, appends):
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise InvalidArgumentError("cu_seqlens_q and cu_seqlens_k: give both or neither")
    if varlen and layout != "bshd":
        raise InvalidArgumentError("layout: variable-length tensors are [total, heads, head_dim]; "
                                   "layout='bhsd' applies to 4-D tensors only")
    # Before the operand checks, which would name paged k's rank instead.
    if varlen and block_table is not None:
        raise UnsupportedError("block_table with cu_seqlens: a paged KV cache takes dense q "
                               "[batch, seqlen_q, heads_q, head_dim]")
    if varlen and seqused_k is not None:
        raise InvalidArgumentError("seqused_k with cu_seqlens: cu_seqlens_k already gives the key counts")
    if varlen and appends:
        raise UnsupportedError("k_new/v_new (rotary_cos/sin) with cu_seqlens: appending to a KV cache "
                               "takes dense q [batch, seqlen_q, heads_q, head_dim] and the cache "
                               "lengths in seqused_k")


def start(args, q, k, v, *, causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k,
          max_seqlen_q, max_seqlen_k, backend, layout, block_table=None, seqused_k=None,
          k_new=None, v_new=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False):
    """The checks both calls share, in one order: names, varlen, options
    (into args, an fc_attention_args), then q, k, v (k and v written when
    keys are appended). Returns the Call to complete with the call's own
    tensors and finish()."""
    layout, backend = check_names(layout, backend)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    append = (k_new, v_new, rotary_cos, rotary_sin)
    appends = k_new is not None or v_new is not None or rotary_cos is not None or rotary_sin is not None
    _check_varlen(varlen, cu_seqlens_q, cu_seqlens_k, layout, block_table, seqused_k, appends)
    _fill_options(args, causal, window, softcap, scale)
    args.backend = _lib.BACKENDS[backend]
    written = k_new is not None or v_new is not None  # the library writes them into k, v
    views = (_arrays.view(q, "q", layout), _arrays.view(k, "k", layout, written=written),
             _arrays.view(v, "v", layout, written=written))
    _check_operands(*views, varlen, layout, backend)
    call = Call()
    call.args, call.layout, call.varlen, call.views = args, layout, varlen, views
    call.seqlens = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    call.paged = (block_table, seqused_k)
    call.append = (*append, rotary_interleaved) if appends else None
    call.device = views[0].device
    call.keep = list(views)
    return call


def _same_place(vx, name, like, like_name):
    if vx.kind != like.kind or vx.device != like.device:
        raise InvalidArgumentError("%s: is a %s object on %s but %s is a %s object on %s"
                                   % (name, vx.kind, vx.device_str(), like_name, like.kind,
                                      like.device_str()))


def view_like(x, name, like, like_name, layout, written=False, dtype=None):
    """A view of x, which must have like's kind, device, dtype (or dtype:
    (element type, fc_dtype), an FP8 call's out) and shape."""
    vx = _arrays.view(x, name, layout, written=written)
    _same_place(vx, name, like, like_name)
    if dtype is not None and vx.dtype != dtype[1]:
        raise InvalidArgumentError("%s: dtype %s differs from out_dtype %s" % (name, vx.elem_dtype, dtype[0]))
    if dtype is None and vx.dtype != like.dtype:
        raise InvalidArgumentError("%s: dtype %s differs from %s's %s"
                                   % (name, vx.elem_dtype, like_name, like.elem_dtype))
    if vx.user_shape != like.user_shape:
        raise InvalidArgumentError("%s: shape %s differs from %s's %s"
                                   % (name, vx.user_shape, like_name, like.user_shape))
    return vx


def output(x, name, like, like_name, layout, dtype=None):
    """The caller's output x (checked writable and like `like`), or a new
    one. dtype: (element type, fc_dtype) it has instead of like's (an FP8
    call's out)."""
    if x is None:
        return _arrays.empty(like, like.user_shape, layout=layout, dtype=dtype and dtype[0])
    return view_like(x, name, like, like_name, layout, written=True, dtype=dtype)


def lse_shape(shape, varlen):
    """lse's shape for q of the library-order shape ([batch, seqlen_q,
    heads_q, head_dim], or [total_q, heads_q, head_dim]): [heads_q, total_q]
    (varlen) or [batch, heads_q, seqlen_q]."""
    return (shape[1], shape[0]) if varlen else (shape[0], shape[2], shape[1])


def lse_input(lse, vq, varlen):
    """The forward's lse, read by the backward: float32, lse_shape, q's place."""
    if lse is None:
        raise InvalidArgumentError("lse: the backward needs the forward's lse: "
                                   "flashcore.attention(..., return_lse=True) returns it")
    if not _arrays.is_float32(lse):
        raise InvalidArgumentError("lse: dtype %s: the forward's lse is float32"
                                   % getattr(lse, "dtype", type(lse).__name__))
    vl = _arrays.view(lse, "lse")
    _same_place(vl, "lse", vq, "q")
    want = lse_shape(vq.shape, varlen)
    if vl.shape != want:
        raise InvalidArgumentError("lse: shape %s, expected %s = %s (the forward's lse)"
                                   % (vl.user_shape, "[heads_q, total_q]" if varlen
                                      else "[batch, heads_q, seqlen_q]", want))
    return vl


def _fill_varlen(args, call, vq, vk, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    kq, pq, nq, mq = _arrays.seqlens(cu_seqlens_q, "cu_seqlens_q", vq, vq.shape[0])
    kk, pk, nk, mk = _arrays.seqlens(cu_seqlens_k, "cu_seqlens_k", vq, vk.shape[0])
    if nq != nk:
        raise InvalidArgumentError("cu_seqlens_q has %d entries but cu_seqlens_k has %d "
                                   "(both are batch+1)" % (nq, nk))
    call.keep += [kq, kk]
    if max_seqlen_q is None:
        max_seqlen_q = mq if mq is not None else _arrays.device_seqlens_max(kq, "cu_seqlens_q", vq.shape[0])
    if max_seqlen_k is None:
        max_seqlen_k = mk if mk is not None else _arrays.device_seqlens_max(kk, "cu_seqlens_k", vk.shape[0])
    args.cu_seqlens_q, args.cu_seqlens_k = pq, pk
    args.num_seqs = _limits.int32(nq - 1, "cu_seqlens_q entries - 1 (batch)")
    args.max_seqlen_q = _limits.int32(max_seqlen_q, "max_seqlen_q")
    args.max_seqlen_k = _limits.int32(max_seqlen_k, "max_seqlen_k")


def _fill_paged(args, call, vq, fill):
    """block_table and seqused_k (call.paged) into args, as int32 arrays in
    q's memory space. The library cannot see their shapes, so they are
    checked here: [batch, max_pages_per_seq] and [batch]. fill False: only
    checked (a call without query rows reads neither)."""
    table, used = call.paged
    batch = vq.shape[0]
    if table is not None:
        t, _ = _arrays.int32_array(table, "block_table", vq, 2)
        if t.shape[0] != batch or t.shape[1] < 1:
            raise InvalidArgumentError("block_table: shape %s, expected [batch %d, max_pages_per_seq >= 1]"
                                       % (tuple(t.shape), batch))
        call.keep.append(t)
        if fill:
            args.block_table = _arrays.data_ptr(t)
            args.max_pages_per_seq = _limits.int32(t.shape[1], "block_table max_pages_per_seq")
            args.block_table_stride = _arrays.row_stride(t) if batch > 1 else 0
    if used is not None:
        u, _ = _arrays.int32_array(used, "seqused_k", vq, 1)
        if u.shape[0] != batch:
            raise InvalidArgumentError("seqused_k: %d entries, expected one a sequence (batch %d)"
                                       % (u.shape[0], batch))
        call.keep.append(u)
        if fill:
            args.seqused_k = _arrays.data_ptr(u)


def _fill_append(args, call, vq):
    """The append step (call.append: k_new, v_new, rotary_cos, rotary_sin,
    rotary_interleaved) into args. k_new and v_new are read in the call's
    layout, like k and v; the rotary tables are 2-D. Each must be q's kind
    and on q's device; their dtypes, shapes and pairing (k_new with v_new,
    cos with sin, rotary with k_new, k_new with seqused_k) are the
    library's checks, which name them."""
    *tensors, interleaved = call.append
    fields = (args.k_new, args.v_new, args.rotary_cos, args.rotary_sin)
    for x, name, field in zip(tensors, APPEND, fields):
        if x is None:
            continue
        vx = _arrays.view(x, name, call.layout if name in ("k_new", "v_new") else "bshd")
        _same_place(vx, name, vq, "q")
        call.keep.append(vx)
        vx.fill(field)
    args.rotary_interleaved = 1 if interleaved else 0


def finish(call, fwd, tensors):
    """Put q, k, v and tensors [(view or None, fc_tensor field, is_lse)] into
    fwd (call's fc_attention_args) and the fields, with the varlen offsets.

    A dense call whose q has no row (batch or seqlen_q 0) cannot be dense in
    the C API (every dimension >= 1): it goes in as a varlen call of one
    empty sequence, which the library checks in full (heads, head_dim,
    options, outputs) and answers without work. Only what that form drops is
    checked here (k's batch, v's shape, the paged cache's shapes); the shapes
    it drops were matched to q, k, v in Python. Such a call cannot append
    (the C API's append takes dense q): it is refused with k_new."""
    vq, vk, vv = call.views
    call.keep += [t[0] for t in tensors]
    call.no_rows = not call.varlen and (vq.shape[0] == 0 or vq.shape[1] == 0)
    if call.no_rows and call.append is not None:
        raise UnsupportedError("k_new/v_new (rotary_cos/sin) with q of shape %s: appending to the cache "
                               "needs query rows (batch and seqlen_q >= 1)" % (vq.user_shape,))
    if call.no_rows:
        # paged k/v hold pages, not sequences: block_table has q's batch
        if vk.shape[0] != vq.shape[0] and call.paged[0] is None:
            raise InvalidArgumentError("k: batch %d differs from q's %d" % (vk.shape[0], vq.shape[0]))
        if vv.shape != vk.shape:
            raise InvalidArgumentError("v: shape %s differs from k's %s" % (vv.user_shape, vk.user_shape))
        _fill_paged(fwd, call, vq, False)
        vq, vk, vv = (_arrays.no_rows(x) for x in (vq, vk, vv))
        tensors = [(_arrays.no_rows(x, lse) if x is not None else None, f, lse) for x, f, lse in tensors]
        _fill_varlen(fwd, call, vq, vk, [0, 0], [0, 0], 0, 0)
    elif call.varlen:
        _fill_varlen(fwd, call, vq, vk, *call.seqlens)
    else:
        _fill_paged(fwd, call, vq, True)
        if call.append is not None:
            _fill_append(fwd, call, vq)
    for x, field in ((vq, fwd.q), (vk, fwd.k), (vv, fwd.v)):
        x.fill(field)
    for x, field, _ in tensors:
        if x is not None:
            x.fill(field)
    return call
