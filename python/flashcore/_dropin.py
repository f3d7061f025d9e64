"""Drop-in signatures: flash-attn's flash_attn_func and flash_attn_varlen_func,
torch's scaled_dot_product_attention, computed by flashcore.attention (so
they differentiate, compile and run on torch's current stream as it does).

Same argument names, layouts and return values, so code switches with one
import. What FlashCore does not implement (dropout, ALiBi, an arbitrary
mask, the attention probabilities, a paged KV cache, a zero scale) raises
UnsupportedError naming the argument: never a silently different answer.
"""

from . import _attention
from .errors import InvalidArgumentError, UnsupportedError


def _no_dropout(dropout_p):
    if dropout_p:
        raise UnsupportedError("dropout_p=%r: FlashCore has no attention dropout; pass dropout_p=0.0 "
                               "(as in evaluation)" % (dropout_p,))


def _scale(name, scale):
    # FlashCore's 0 means 1/sqrt(head_dim); the peers' 0 is a literal zero.
    if scale is not None and float(scale) == 0.0:
        raise UnsupportedError("%s=0.0: a zero scale (uniform weights) is not implemented; pass None "
                               "for 1/sqrt(head_dim) or a nonzero scale" % name)
    return scale


def _flash_options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   return_attn_probs):
    """flash-attn's options as flashcore.attention's keyword arguments."""
    _no_dropout(dropout_p)
    if alibi_slopes is not None:
        raise UnsupportedError("alibi_slopes: ALiBi biases are not implemented; pass alibi_slopes=None")
    if return_attn_probs:
        raise UnsupportedError("return_attn_probs=True: FlashCore never forms the attention "
                               "probabilities; flashcore.attention(..., return_lse=True) gives the "
                               "log-sum-exp")
    try:
        wl, wr = window_size
    except (TypeError, ValueError):
        raise InvalidArgumentError("window_size: expected (left, right), -1 = unbounded, got %r"
                                   % (window_size,)) from None
    if softcap is not None and softcap < 0:
        raise InvalidArgumentError("softcap=%r: use 0.0 (off) or a positive cap" % (softcap,))
    # flash-attn: any negative side is unbounded, and causal sets the right
    # side to 0 whatever window_size says.
    wl, wr = max(wl, -1), max(wr, -1)
    if causal:
        wr = 0
    return dict(causal=bool(causal), window=(wl, wr), softcap=softcap or 0.0,
                scale=_scale("softmax_scale", softmax_scale))


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's flash_attn_func: q (batch, seqlen_q, nheads, headdim), k
    and v (batch, seqlen_k, nheads_k, headdim), nheads % nheads_k == 0
    (GQA/MQA). causal is aligned to the bottom-right corner; window_size
    (left, right) keeps keys in [i + seqlen_k - seqlen_q - left,
    i + seqlen_k - seqlen_q + right]; softcap > 0 caps the scores;
    deterministic=True makes the backward bitwise reproducible. Returns out
    (batch, seqlen_q, nheads, headdim). Rows that see no key give 0.
    """
    opts = _flash_options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                          return_attn_probs)
    return _attention.attention(q, k, v, deterministic=deterministic, **opts)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """flash-attn's flash_attn_varlen_func: q (total_q, nheads, headdim), k
    and v (total_k, nheads_k, headdim), cu_seqlens_q/k (batch + 1,) int32
    offsets, max_seqlen_q/k the longest sequence of each. Options as
    flash_attn_func, per sequence. Returns out (total_q, nheads, headdim).
    """
    if block_table is not None:
        raise UnsupportedError("block_table: a paged KV cache is not implemented; pass "
                               "block_table=None with contiguous k, v")
    opts = _flash_options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                          return_attn_probs)
    return _attention.attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                deterministic=deterministic, **opts)


def _sdpa_operands(query, key, value, enable_gqa):
    nd = query.dim()
    if nd not in (3, 4) or key.dim() != nd or value.dim() != nd:
        raise UnsupportedError("query, key, value: FlashCore takes [batch, heads, seqlen, head_dim] "
                               "or [heads, seqlen, head_dim] tensors, got %d-D, %d-D, %d-D"
                               % (nd, key.dim(), value.dim()))
    if value.shape[-1] != query.shape[-1]:
        raise UnsupportedError("value: head dim %d differs from query's %d: FlashCore needs one head "
                               "dim" % (value.shape[-1], query.shape[-1]))
    if key.shape[-3] != query.shape[-3] and not enable_gqa:
        raise InvalidArgumentError("key: %d heads but query has %d: pass enable_gqa=True for "
                                   "grouped-query attention (torch requires it too)"
                                   % (key.shape[-3], query.shape[-3]))
    if nd == 3:  # [heads, seqlen, head_dim]: one batch, as views
        return query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    return query, key, value


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention on FlashCore: query
    [B, Hq, L, E], key and value [B, Hkv, S, E] (or 3-D without B); Hq ==
    Hkv unless enable_gqa. is_causal is torch's top-left aligned mask (query
    i sees keys 0..i), also where L != S. Returns [B, Hq, L, E].
    """
    if attn_mask is not None:
        raise UnsupportedError("attn_mask: an arbitrary mask is not implemented; use is_causal=True, "
                               "or flashcore.attention(window=...) for a sliding window")
    _no_dropout(dropout_p)
    q, k, v = _sdpa_operands(query, key, value, enable_gqa)
    causal, window = False, (-1, -1)
    if is_causal:
        # Top-left: key j is visible to query i iff j <= i. FlashCore aligns
        # bottom-right (j <= i + S - L), so: L > S moves the diagonal with
        # window_right = L - S; L < S drops the keys past L, which no query
        # sees (a view: their gradients are 0, as torch's).
        sq, sk = q.shape[2], k.shape[2]
        causal = sq <= sk
        if sq > sk:
            window = (-1, sq - sk)
        elif sq < sk:
            k, v = k[:, :, :sq], v[:, :, :sq]
    out = _attention.attention(q, k, v, layout="bhsd", causal=causal, window=window,
                               scale=_scale("scale", scale))
    return out.squeeze(0) if query.dim() == 3 else out
