"""Drop-in signatures: flash-attn's flash_attn_func, flash_attn_varlen_func
and flash_attn_with_kvcache (as attention_with_kvcache), torch's
scaled_dot_product_attention, computed by flashcore.attention (so they
differentiate, compile and run on torch's current stream as it does).

Same argument names, layouts and return values, so code switches with one
import. What FlashCore does not implement (dropout, ALiBi, an arbitrary
mask, the attention probabilities, a paged cache with varlen q, cache
batch indices or left padding, a zero scale) raises UnsupportedError
naming the argument: never a silently different answer.
"""

import numbers

from . import _arrays, _attention, _limits
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
        raise UnsupportedError("block_table: a paged KV cache with variable-length q is not "
                               "implemented; flashcore.attention_with_kvcache takes it with dense q "
                               "[batch, seqlen_q, nheads, headdim]")
    opts = _flash_options(dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                          return_attn_probs)
    return _attention.attention(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                deterministic=deterministic, **opts)


# attention_with_kvcache's arguments that FlashCore does not implement, with
# what to do instead.
_KVCACHE_TODO = (
    ("cache_batch_idx", "cache batch indices are not implemented; pass the cache rows in q's "
                        "batch order, or a block_table"),
    ("cache_leftpad", "left-padded caches are not implemented; keep each sequence's keys from "
                      "position 0"),
)


def _kvcache_refusals(given, num_splits):
    for name, todo in _KVCACHE_TODO:
        if given[name] is not None:
            raise UnsupportedError("%s: %s" % (name, todo))
    if num_splits:
        raise UnsupportedError("num_splits=%r: choosing the split count is not implemented; pass 0 "
                               "(the library chooses)" % (num_splits,))


def _cache_seqlens(cache_seqlens, q):
    """flash-attn's int cache_seqlens, one length for every sequence, as an
    int32 array of q's kind and device; anything else as given."""
    if not isinstance(cache_seqlens, numbers.Integral) or isinstance(cache_seqlens, bool):
        return cache_seqlens
    n = _limits.int32(cache_seqlens, "cache_seqlens")
    return _arrays.full_int32(q, q.shape[0], n)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, k_new=None,
                           v_new=None, rotary_cos=None, rotary_sin=None, cache_batch_idx=None,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           rotary_interleaved=True, alibi_slopes=None, return_softmax_lse=False,
                           num_splits=0, out=None, cache_leftpad=None, q_descale=None, k_descale=None,
                           v_descale=None):
    """flash-attn's flash_attn_with_kvcache (k_new/v_new are its k/v):
    attention of q over a KV cache, for decoding, optionally appending new
    keys and values first (with rotary embedding). q (batch, seqlen_q,
    nheads, headdim); k_cache, v_cache (batch, seqlen_cache, nheads_k,
    headdim) (a larger cache: its view k_cache[:batch]), or with block_table (num_pages, page_size, nheads_k, headdim)
    pages, any page size, and block_table (batch, max_pages) int32: key j
    of sequence b is row j % page_size of page block_table[b, j //
    page_size] (a (num_pages, nheads_k, page_size, headdim) storage works
    as the view .transpose(1, 2)). cache_seqlens: int32 (batch,) keys in
    use per sequence, or an int for all; None: the whole cache. causal and
    window_size align to each sequence's last key (bottom-right), as in
    flash-attn. Returns out (batch, seqlen_q, nheads, headdim) (written
    into out= if given), and softmax_lse (batch, nheads, seqlen_q) float32
    when return_softmax_lse. numpy arrays or torch tensors, no copy.

    k_new, v_new (batch, seqlen_new, nheads_k, headdim), q's dtype: written
    into the cache (k_cache/v_cache are modified in place, dense or paged)
    at keys cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1, then the
    attention runs over cache_seqlens[b] + seqlen_new keys. cache_seqlens
    is then required (the lengths before the append; not updated: the
    caller advances it), as in flash-attn. rotary_cos, rotary_sin
    (seqlen_ro, rotary_dim / 2), q's dtype, need k_new: they rotate the
    first rotary_dim dims of k_new (at positions cache_seqlens[b] + t) and
    of q (at cache_seqlens[b] + i when causal or window_size is set, else
    at cache_seqlens[b]; q itself is not modified), pairing dims (2i, 2i+1)
    with rotary_interleaved=True (GPT-J), else (i, i + rotary_dim / 2)
    (GPT-NeoX); every position must be < seqlen_ro. rotary_interleaved only
    matters with rotary_cos/sin.

    FP8 cache (flash-attn 3's descales): k_cache, v_cache of one FP8 type
    (float8_e4m3fn or float8_e5m2) under float32/float16/bfloat16 q (out
    in q's dtype), or q FP8 too (out bfloat16); q_descale, k_descale,
    v_descale as flashcore.attention's ([batch, nheads_k] float32, a
    number, or None = 1). k_new/v_new into an FP8 cache raise
    UnsupportedError (quantising them is the caller's step).

    Inference only (flash-attn's has no backward either): a gradient
    through it raises UnsupportedError. Not implemented, UnsupportedError
    naming the argument: cache_batch_idx, cache_leftpad, alibi_slopes,
    num_splits != 0.
    """
    _kvcache_refusals(dict(cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad), num_splits)
    if cache_seqlens is None and (k_new is not None or v_new is not None):
        raise InvalidArgumentError("cache_seqlens: None, but k_new/v_new are appended after each "
                                   "sequence's cache_seqlens keys: pass the cache lengths before the "
                                   "append (flash-attn requires them too)")
    opts = _flash_options(0.0, softmax_scale, causal, window_size, softcap, alibi_slopes, False)
    return _attention.attention(q, k_cache, v_cache, block_table=block_table,
                                seqused_k=_cache_seqlens(cache_seqlens, q), k_new=k_new, v_new=v_new,
                                rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                rotary_interleaved=rotary_interleaved,
                                return_lse=return_softmax_lse, out=out, q_descale=q_descale,
                                k_descale=k_descale, v_descale=v_descale, **opts)


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
