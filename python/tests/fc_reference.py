"""A float64 numpy reference for the binding's tests, written from the
semantics in include/flashcore.h and docs/API.md (not from the library's
code), so the tests check the library against an independent statement of
what it computes.

Layout: the library's, q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D]; attention() returns
out [B,Sq,Hq,D] and lse [B,Hq,Sq] (natural log; -inf where a row sees no
key, whose output is 0); attention_backward() returns dq, dk, dv (dk/dv
summed over the query heads that share a KV head).
"""

import numpy as np

# The project's per-dtype error gates (tools/kit.c, kit_gate_for): the tests
# hold the binding to the same bounds as the C tests.
GATES = {
    "f32": dict(max_abs=1e-4, rel_l2=2e-5, lse_atol=1e-4, lse_rtol=1e-5),
    "f16": dict(max_abs=5e-3, rel_l2=2e-3, lse_atol=1e-3, lse_rtol=1e-4),
    "bf16": dict(max_abs=3e-2, rel_l2=1.6e-2, lse_atol=1e-3, lse_rtol=1e-4),
}


# The backward's gates, mirrored from tools/kit_bwd.c (kit_bwd_gate_for):
# per path and dtype, on each of dq, dk, dv against the reference rounded
# to the dtype. max_rel: the largest error over the largest |reference|
# element (gradient sizes grow with the sequence, so an absolute bound would
# mean nothing); rel_l2 over the tensor; an element fails beyond atol +
# atol_rel * max|ref| + rtol * |ref|, and at most pct_bad percent may. The
# CPU rows: one rounding to the dtype plus fp32 sums (1 ulp); the CUDA rows:
# 1.5x PyTorch's own backward error on the same inputs (the kit says how).
GRAD_GATES = {
    "cpu": {
        "f32": dict(max_rel=1e-4, rel_l2=2e-5, pct_bad=0.0, atol=0.0, atol_rel=1e-5, rtol=1e-4),
        "f16": dict(max_rel=1e-3, rel_l2=5e-4, pct_bad=0.0, atol=2.0**-24, atol_rel=1e-5, rtol=2.0**-10),
        "bf16": dict(max_rel=8e-3, rel_l2=4e-3, pct_bad=0.0, atol=0.0, atol_rel=1e-5, rtol=2.0**-7),
    },
    "cuda": {
        "f32": dict(max_rel=1e-4, rel_l2=2e-5, pct_bad=0.0, atol=0.0, atol_rel=1e-5, rtol=1e-4),
        "f16": dict(max_rel=1.48e-3, rel_l2=6.45e-4, pct_bad=0.0, atol=1.6e-5, atol_rel=1.48e-3, rtol=0.0),
        "bf16": dict(max_rel=1.15e-2, rel_l2=5.13e-3, pct_bad=0.0, atol=8.0e-6, atol_rel=1.15e-2, rtol=0.0),
    },
}


def visible_mask(sq, sk, causal=False, window=(-1, -1)):
    """[sq, sk] bool: key j is visible to query i (bottom-right aligned)."""
    wl, wr = window
    if causal:
        wr = 0
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + (sk - sq)
    vis = np.ones((sq, sk), dtype=bool)
    if wr >= 0:
        vis &= j <= diag + wr
    if wl >= 0:
        vis &= j >= diag - wl
    return vis


def _scores(q, k, causal, window, softcap, scale, mask=None):
    """(s, t, vis): the masked scores [B,Hq,Sq,Sk] (-inf where not visible),
    tanh(raw/softcap) (None without softcap) and the visibility mask (mask,
    an [Sq,Sk] bool array, replaces causal and window: torch's top-left)."""
    D = q.shape[3]
    scale = 1.0 / np.sqrt(D) if not scale else scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    t = None
    if softcap:
        t = np.tanh(s / softcap)
        s = softcap * t
    vis = visible_mask(q.shape[1], k.shape[1], causal, window) if mask is None else mask
    return np.where(vis[None, None], s, -np.inf), t, vis


def _probs(s):
    """(p, lse): softmax probabilities [B,Hq,Sq,Sk] (rows that see no key: 0)
    and lse [B,Hq,Sq] (-inf there)."""
    B, H, Sq, Sk = s.shape
    m = s.max(axis=-1, keepdims=True) if Sk else np.full((B, H, Sq, 1), -np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m_safe)  # exp(-inf) = 0 for masked keys
    l = e.sum(axis=-1, keepdims=True)
    l_safe = np.where(l > 0, l, 1.0)
    p = np.where(l > 0, e / l_safe, 0.0)
    lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l_safe[..., 0]), -np.inf)
    return p, lse


def _expand_kv(q, k, v):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    assert q.shape[2] % k.shape[2] == 0
    group = q.shape[2] // k.shape[2]
    # query head h reads kv head h // group
    return q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2), group


def attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, mask=None):
    q, k, v, _ = _expand_kv(q, k, v)
    s, _, _ = _scores(q, k, causal, window, softcap, scale, mask)
    p, lse = _probs(s)
    return np.einsum("bhqk,bkhd->bqhd", p, v), lse


def attention_backward(q, k, v, dout, causal=False, window=(-1, -1), softcap=0.0, scale=None,
                       out=None, lse=None, mask=None):
    """(dq, dk, dv) of L = sum(out * dout), from the chain rule through
    softmax (dS = P * (dP - rowsum(dout * out))) and the cap (1 - tanh^2).
    out, lse: the forward's results the backward is given, as the C API
    defines it over them (P = exp(S - lse); a row with lse -inf adds
    nothing); None: exact, from q, k, v."""
    q, k, v, group = _expand_kv(q, k, v)
    dout = np.asarray(dout, dtype=np.float64)
    s, t, _ = _scores(q, k, causal, window, softcap, scale, mask)
    p, exact_lse = _probs(s)
    if lse is not None:
        lse = np.asarray(lse, dtype=np.float64)[..., None]
        seen = np.isfinite(lse)
        p = np.where(seen, np.exp(s - np.where(seen, lse, 0.0)), 0.0)  # masked: exp(-inf) = 0
    o = np.einsum("bhqk,bkhd->bqhd", p, v) if out is None else np.asarray(out, dtype=np.float64)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, v)
    ds = p * (dp - np.einsum("bqhd,bqhd->bhq", dout, o)[..., None])
    if t is not None:
        ds = ds * (1.0 - t * t)
    sc = 1.0 / np.sqrt(q.shape[3]) if not scale else scale
    dq = sc * np.einsum("bhqk,bkhd->bqhd", ds, k)
    dk = sc * np.einsum("bhqk,bqhd->bkhd", ds, q)
    dv = np.einsum("bhqk,bqhd->bkhd", p, dout)
    B, Sk, H, D = dk.shape

    def per_kv_head(g):  # sum the query heads h = kv * group + i of each kv head
        return g.reshape(B, Sk, H // group, group, D).sum(axis=3)
    return dq, per_kv_head(dk), per_kv_head(dv)


def attention_varlen(q, k, v, cu_q, cu_k, **kw):
    """q [total_q,Hq,D], k/v [total_k,Hkv,D]; returns out [total_q,Hq,D] and
    lse [Hq,total_q]."""
    q = np.asarray(q, dtype=np.float64)
    Hq = q.shape[1]
    out = np.zeros(q.shape)
    lse = np.full((Hq, q.shape[0]), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0:
            continue
        o, l = attention(q[None, q0:q1], np.asarray(k)[None, k0:k1], np.asarray(v)[None, k0:k1], **kw)
        out[q0:q1] = o[0]
        lse[:, q0:q1] = l[0]
    return out, lse


def attention_backward_varlen(q, k, v, dout, cu_q, cu_k, out=None, lse=None, **kw):
    """Varlen gradients: q/dout/out [total_q,Hq,D], k/v [total_k,Hkv,D], lse
    [Hq,total_q]. Keys of sequences with no query (and tokens past the last
    offset) get 0."""
    dq = np.zeros(np.shape(q))
    dk = np.zeros(np.shape(k))
    dv = np.zeros(np.shape(v))
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        seq = lambda x, a, e: None if x is None else np.asarray(x)[None, a:e]  # noqa: E731
        g = attention_backward(seq(q, q0, q1), seq(k, k0, k1), seq(v, k0, k1), seq(dout, q0, q1),
                               out=seq(out, q0, q1),
                               lse=None if lse is None else np.asarray(lse)[None, :, q0:q1], **kw)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = (x[0] for x in g)
    return dq, dk, dv


def torch_to_lib(t, layout="bshd"):
    """A torch tensor (any device) as float64 numpy in the library's order
    ([B,S,H,D]; layout 'bhsd' is transposed back)."""
    x = t.detach().double().cpu().numpy()
    return x.transpose(0, 2, 1, 3) if layout == "bhsd" and x.ndim == 4 else x


def rel_l2(x, ref):
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / (den if den > 0 else 1.0))


def check(out, lse, ref_out, ref_lse, dtype):
    """Assert out (and lse, if given) meet the dtype's gates."""
    g = GATES[dtype]
    out = np.asarray(out, dtype=np.float64)
    assert np.all(np.isfinite(out)), "non-finite output"
    err = float(np.max(np.abs(out - ref_out))) if out.size else 0.0
    assert err <= g["max_abs"], "max |out - ref| = %g > %g" % (err, g["max_abs"])
    r = rel_l2(out, ref_out)
    assert r <= g["rel_l2"], "rel L2 = %g > %g" % (r, g["rel_l2"])
    if lse is not None:
        lse = np.asarray(lse, dtype=np.float64)
        inf = np.isinf(ref_lse)
        assert np.array_equal(np.isneginf(lse), inf), "lse -inf pattern differs from the reference"
        d = np.abs(lse[~inf] - ref_lse[~inf])
        tol = g["lse_atol"] + g["lse_rtol"] * np.abs(ref_lse[~inf])
        assert np.all(d <= tol), "lse off by up to %g" % (float(d.max()) if d.size else 0.0)


def round_to(x, dtype):
    """x rounded to the dtype (nearest even), as float64."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float64)
    f = x.astype(np.float32)
    if dtype == "bf16":  # keep the top 16 bits of the float32, rounding to nearest even
        u = f.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        f = u.view(np.float32)
    return f.astype(np.float64)


def unseen(sq, sk, causal=False, window=(-1, -1)):
    """(rows that see no key [sq], keys that no row sees [sk]): where dq, and
    dk and dv, must be exactly 0."""
    vis = visible_mask(sq, sk, causal, window)
    return ~vis.any(axis=1), ~vis.any(axis=0)


def check_unseen_zero(dq, dk, dv, causal=False, window=(-1, -1), **_):
    """Dense gradients in the library's order: exact zeros where unseen()
    says (dk, dv sum over heads: a key's zeros hold for every head). Other
    options of the call are ignored."""
    rows, keys = unseen(np.shape(dq)[1], np.shape(dk)[1], causal, window)
    assert np.all(np.asarray(dq)[:, rows] == 0), "dq of rows that see no key is not 0"
    assert np.all(np.asarray(dk)[:, keys] == 0) and np.all(np.asarray(dv)[:, keys] == 0), \
        "dk/dv of keys that no row sees are not 0"


def check_grads(grads, refs, dtype, path="cpu", names=("dq", "dk", "dv")):
    """Assert the gradients (dq, dk, dv; or those names) meet the path's
    gates for dtype against refs rounded to the dtype, as the kit's
    comparison does (every element finite: none left unwritten)."""
    g = GRAD_GATES[path][dtype]
    assert len(grads) == len(refs) == len(names)
    for name, x, r in zip(names, grads, refs):
        x = np.asarray(x, dtype=np.float64)
        r = round_to(r, dtype)
        assert x.shape == r.shape, "%s: shape %s, reference %s" % (name, x.shape, r.shape)
        assert np.all(np.isfinite(x)), "%s: non-finite elements (unwritten?)" % name
        if not r.size:
            continue
        err = np.abs(x - r)
        top = float(np.max(np.abs(r)))
        worst = float(err.max()) / top if top > 0 else float(err.max())
        assert worst <= g["max_rel"], "%s: max |err| / max |ref| = %g > %g" % (name, worst, g["max_rel"])
        rl = rel_l2(x, r)
        assert rl <= g["rel_l2"], "%s: rel L2 = %g > %g" % (name, rl, g["rel_l2"])
        bad = 100.0 * np.count_nonzero(err > g["atol"] + g["atol_rel"] * top + g["rtol"] * np.abs(r)) / r.size
        assert bad <= g["pct_bad"], "%s: %.3g%% of the elements off (gate %g%%)" % (name, bad, g["pct_bad"])
