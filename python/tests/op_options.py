"""The torch ops' options after their tensors, in schema order
(_torch_ops.Options): a dense call's defaults, overridden by keyword. For
the torch op tests; import it after torch (it imports _torch_ops)."""

from flashcore import _torch_ops


def options(**kw):
    base = dict(cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=-1, max_seqlen_k=-1, scale=0.0,
                softcap=0.0, causal=False, window_left=-1, window_right=-1, bhsd=False,
                backend="auto", cuda_path=0, deterministic=False)
    base.update(kw)
    return tuple(_torch_ops.Options(**base))
