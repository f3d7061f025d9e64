"""FlashCore as torch operators: flashcore::attention_fwd and
flashcore::attention_bwd (torch.library custom ops), their fake
implementations (shapes, dtypes, the lse shape: what torch.compile and meta
tensors need) and autograd (register_autograd), so a model that calls
flashcore compiles with fullgraph=True and loss.backward() runs the
library's backward. attention_fwd also takes a paged KV cache (block_table,
seqused_k: flashcore.attention_with_kvcache), whose gradient raises.

Imported only where torch already is (flashcore/__init__ when torch was
imported first, else the first call that needs it), so importing flashcore
never imports torch. The ops pass tensors as they are (any strides, no
copy) and run on torch's current CUDA stream, like flashcore.attention.
"""

import collections

import torch

from . import _attention, _backward, _request
from .errors import InvalidArgumentError, UnsupportedError

# The options both ops take, after their tensors. scale 0 = 1/sqrt(head_dim);
# max_seqlen -1 = found from the offsets; cuda_path 0 = automatic.
_OPTIONS = ("Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, "
            "float scale, float softcap, bool causal, int window_left, int window_right, "
            "bool bhsd, str backend, int cuda_path, bool deterministic")
Options = collections.namedtuple("Options", [p.split()[-1] for p in _OPTIONS.split(",")])
# The forward's last arguments, the paged cache (_request.PAGED); defaulted
# so that a call with Options alone is the dense one.
_PAGED = "Tensor? block_table=None, Tensor? seqused_k=None"
_N = len(Options._fields)

# Inductor must hand the ops the strides eager mode would: the library reads
# any layout but wants the last dimension contiguous.
_TAGS = (torch.Tag.needs_exact_strides,) if hasattr(torch.Tag, "needs_exact_strides") else ()


def _common(o, paged=None):
    """Options o as the binding's keyword arguments: the forward's, with
    paged (its block_table, seqused_k), or else attention_backward's."""
    c = _request.common(o.causal, (o.window_left, o.window_right), o.softcap, o.scale or None, o.cu_seqlens_q,
                        o.cu_seqlens_k, None if o.max_seqlen_q < 0 else o.max_seqlen_q,
                        None if o.max_seqlen_k < 0 else o.max_seqlen_k, o.backend, "bhsd" if o.bhsd else "bshd",
                        *(paged or (None, None)))
    if paged is None:
        for name in _request.PAGED:
            del c[name]
    return c


def _lse_shape(q, varlen, bhsd):
    """lse's shape for the caller's q (_request.lse_shape)."""
    return _request.lse_shape((q.shape[0], q.shape[2], q.shape[1], q.shape[3]) if bhsd else q.shape, varlen)


@torch.library.custom_op("flashcore::attention_fwd", mutates_args=(), tags=_TAGS,
                         schema="(Tensor q, Tensor k, Tensor v, %s, %s) -> (Tensor, Tensor)"
                                % (_OPTIONS, _PAGED))
def _fwd(q, k, v, *opts):
    o = Options(*opts[:_N])
    return _attention._forward(q, k, v, True, None, o.cuda_path or None, _common(o, opts[_N:]))


@_fwd.register_fake
def _fwd_fake(q, k, v, *opts):
    # out and lse follow q alone: paged k/v hold pages, not sequences
    o = Options(*opts[:_N])
    lse = q.new_empty(_lse_shape(q, o.cu_seqlens_q is not None, o.bhsd), dtype=torch.float32)
    return q.new_empty(q.shape), lse


@torch.library.custom_op("flashcore::attention_bwd", mutates_args=(), tags=_TAGS,
                         schema="(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, %s)"
                                " -> (Tensor, Tensor, Tensor)" % _OPTIONS)
def _bwd(dout, q, k, v, out, lse, *opts):
    o = Options(*opts)
    # cuda_path is the forward's: the backward picks its own kernel family.
    return _backward.attention_backward(dout, q, k, v, out, lse, deterministic=o.deterministic,
                                        **_common(o))


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, *opts):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k = inputs[:5]
    out, lse = output
    ctx.paged = any(x is not None for x in inputs[3 + _N:])
    if not ctx.paged:  # a paged call has no backward: nothing to keep for one
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.opts = inputs[5:3 + _N]
    ctx.mark_non_differentiable(lse)


def _backward_rule(ctx, dout, _dlse):
    if ctx.paged:
        raise UnsupportedError(
            "backward of a paged KV cache or seqused_k call (flashcore.attention_with_kvcache): "
            "not implemented, as in flash-attn; call it under torch.no_grad() or "
            "torch.inference_mode(), or use dense k, v without seqused_k for training")
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    # out.sum().backward() hands a broadcast dout (stride 0 everywhere); the
    # library reads any strides but a contiguous last dimension.
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = torch.ops.flashcore.attention_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts)
    return (dq, dk, dv) + (None,) * (_N + 2)


def _no_double_backward(ctx, *grads):
    raise UnsupportedError("double backward: the gradients of flashcore attention's gradients "
                           "(create_graph=True, then backward again) are not implemented")


_fwd.register_autograd(_backward_rule, setup_context=_setup_context)
_bwd.register_autograd(_no_double_backward, setup_context=lambda ctx, inputs, output: None)


def routes(q, k, v):
    """Does a call on q, k, v go through the op: torch tensors that autograd
    records, a call being traced by torch.compile, or tensors with no data
    (meta, fake) whose shapes only the fake implementation can give."""
    if torch.compiler.is_compiling() or q.is_meta:
        return True
    # k or v may be of another type (numpy): the direct path names that error
    return torch.is_grad_enabled() and (q.requires_grad or getattr(k, "requires_grad", False)
                                        or getattr(v, "requires_grad", False))


def _tensor(x):
    """An optional integer argument (offsets, block table, key counts) as the
    op's Tensor? (lists and numpy arrays are converted)."""
    return x if x is None or isinstance(x, torch.Tensor) else torch.as_tensor(x)


def attention(q, k, v, *, causal, window, softcap, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
              max_seqlen_k, return_lse, backend, out, layout, cuda_path, deterministic, block_table,
              seqused_k):
    """flashcore.attention through flashcore::attention_fwd (see routes())."""
    if out is not None:
        raise InvalidArgumentError(
            "out: not supported when q, k or v require grad or under torch.compile (the op "
            "returns a new output); pass no out, or call eagerly under torch.no_grad()")
    layout, backend = _request.check_names(layout, backend)
    wl, wr = _request.window_pair(window)
    res, lse = torch.ops.flashcore.attention_fwd(
        q, k, v, _tensor(cu_seqlens_q), _tensor(cu_seqlens_k),
        -1 if max_seqlen_q is None else max_seqlen_q, -1 if max_seqlen_k is None else max_seqlen_k,
        0.0 if scale is None else float(scale), float(softcap or 0.0), bool(causal), wl, wr,
        layout == "bhsd", backend, cuda_path or 0, bool(deterministic), _tensor(block_table),
        _tensor(seqused_k))
    return (res, lse) if return_lse else res
