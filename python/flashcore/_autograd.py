"""torch autograd for attention(): a torch.autograd.Function whose forward
runs the library's forward with lse and saves q, k, v, out, lse, and whose
backward runs attention_backward with the same options. The class is
defined on first use: only a caller that already holds torch tensors gets
here, so importing flashcore never imports torch."""

from . import _arrays, _backward
from .errors import InvalidArgumentError

_function = None


def tracks(q, k, v):
    """Would autograd record a call on q, k, v: torch tensors, grad mode on,
    at least one of them requiring grad."""
    if not _arrays.is_torch(q):
        return False
    return _arrays._torch().is_grad_enabled() and any(
        _arrays.is_torch(x) and x.requires_grad for x in (q, k, v))


def _define():
    torch = _arrays._torch()
    from torch.autograd.function import once_differentiable

    class FlashCoreAttention(torch.autograd.Function):
        """out = attention(q, k, v); the other inputs are options (no grad)."""

        @staticmethod
        def forward(ctx, run_forward, q, k, v, return_lse, cuda_path, deterministic, common):
            out, lse = run_forward(q, k, v, True, None, cuda_path, common)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.deterministic, ctx.common = deterministic, common
            if not return_lse:
                return out
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, dout, *_):
            q, k, v, out, lse = ctx.saved_tensors
            # out.sum().backward() hands a broadcast dout (stride 0): give the
            # library a dense one (a no-op when it already is).
            dout = dout.contiguous()
            dq, dk, dv = _backward.attention_backward(dout, q, k, v, out, lse,
                                                      deterministic=ctx.deterministic, **ctx.common)
            return None, dq, dk, dv, None, None, None, None

    return FlashCoreAttention


def attention(run_forward, q, k, v, return_lse, out, cuda_path, deterministic, common):
    """attention() recorded by autograd; run_forward is the untracked forward
    (_attention._forward)."""
    global _function
    if out is not None:
        raise InvalidArgumentError(
            "out: not supported when q, k or v require grad (autograd records the output it "
            "creates); pass no out, or call under torch.no_grad()")
    if _function is None:
        _function = _define()
    return _function.apply(run_forward, q, k, v, bool(return_lse), cuda_path, bool(deterministic),
                           common)
