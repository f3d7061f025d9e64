"""attention_backward() and attention_backward_supported(): the backward
call (fc_attention_backward / fc_attention_backward_supported), with the
forward's checks from _request."""

from . import _arrays, _call_cache, _context, _lib, _request
from .errors import UnsupportedError


def _prepare(dout, q, k, v, out, lse, dq, dk, dv, deterministic, common):
    bargs = _context.context().args(backward=True)
    fwd = bargs.fwd
    call = _request.start(fwd, q, k, v, **common)
    vq, vk, vv = call.views
    if any(x.dtype in _lib.DTYPES_FP8 for x in call.views):  # before out's dtype check: the reason
        raise UnsupportedError("q %s, k %s, v %s: FP8 inputs are forward-only, the backward takes float32, "
                               "float16 or bfloat16" % (vq.elem_dtype, vk.elem_dtype, vv.elem_dtype))
    layout = call.layout
    vo = _request.view_like(out, "out", vq, "q", layout)  # the forward's output, read
    vl = _request.lse_input(lse, vq, call.varlen)
    vdo = _request.view_like(dout, "dout", vo, "out", layout)
    grads = [_request.output(g, n, like, like_n, layout)
             for g, n, like, like_n in ((dq, "dq", vq, "q"), (dk, "dk", vk, "k"), (dv, "dv", vv, "v"))]
    bargs.deterministic = 1 if deterministic else 0
    fields = (bargs.dq, bargs.dk, bargs.dv)
    _request.finish(call, fwd, [(vo, fwd.out, False), (vl, fwd.lse, True), (vdo, bargs.dout, False)]
                    + [(g, f, False) for g, f in zip(grads, fields)])
    call.args = bargs
    call.results = tuple(g.obj for g in grads)
    return call


def attention_backward(dout, q, k, v, out, lse, *, causal=False, window=(-1, -1), softcap=0.0,
                       scale=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                       max_seqlen_k=None, deterministic=False, layout="bshd", backend="auto",
                       dq=None, dk=None, dv=None, cuda_path=None):
    """Attention backward: the gradients (dq, dk, dv) of a loss given
    dout = dL/dout, for the forward call with the same q, k, v and options
    that returned out and lse (flashcore.attention(..., return_lse=True)).

    Shapes, layouts, dtypes and devices as attention(): dout like out, lse
    float32 [B,Hq,Sq] (varlen [Hq,total_q]), dq/dk/dv like q/k/v (given:
    written in place and returned; else new). dk/dv sum over the query heads
    that share a KV head (GQA/MQA); keys no query sees get 0.
    deterministic=True: bitwise-identical results across runs (the CPU
    backends always are). CUDA tensors run on torch's current stream.
    Raises a FlashCoreError subclass on failure; a failed call has not
    written dq, dk or dv.
    """
    common = _request.common(causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, backend, layout)
    sig = None
    if _arrays.is_torch(q):
        sig = _call_cache.bwd_key((dout, q, k, v, out, lse), (dq, dk, dv), deterministic, cuda_path, common)
        res = None if sig is None else _call_cache.run_bwd(sig, dout, q, k, v, out, lse)
        if res is not None:
            return res
    call = _prepare(dout, q, k, v, out, lse, dq, dk, dv, deterministic, common)
    _context.run(_lib.load().fc_attention_backward, call, cuda_path)
    if call.no_rows:
        # No query row: nothing reaches the keys, so dk = dv = 0 (dq is
        # empty). The library saw the empty form and wrote nothing.
        for x in call.results[1:]:
            _arrays.zero(x)
    _call_cache.keep(sig, call, (q, k, v), cuda_path)
    return call.results


def attention_backward_supported(dout, q, k, v, out, lse, *, causal=False, window=(-1, -1),
                                 softcap=0.0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                                 max_seqlen_q=None, max_seqlen_k=None, deterministic=False,
                                 layout="bshd", backend="auto", dq=None, dk=None, dv=None,
                                 cuda_path=None):
    """Would attention_backward() accept these arguments? (True, kernel
    name) or (False, reason); launches nothing, reads no tensor data (except
    CUDA cu_seqlens)."""
    common = _request.common(causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, backend, layout)
    return _context.ask(_lib.load().fc_attention_backward_supported,
                        lambda: _prepare(dout, q, k, v, out, lse, dq, dk, dv, deterministic, common),
                        cuda_path)
