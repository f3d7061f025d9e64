"""A float64 numpy reference for the binding's tests, written from the
semantics in include/flashcore.h (not from the library's code), so the tests
check the library against an independent statement of what it computes.

Layout: the library's, q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D]; returns out
[B,Sq,Hq,D] and lse [B,Hq,Sq] (natural log; -inf where a row sees no key,
whose output is 0).
"""

import numpy as np

# The project's per-dtype error gates (tools/kit.c, kit_gate_for): the tests
# hold the binding to the same bounds as the C tests.
GATES = {
    "f32": dict(max_abs=1e-4, rel_l2=2e-5, lse_atol=1e-4, lse_rtol=1e-5),
    "f16": dict(max_abs=5e-3, rel_l2=2e-3, lse_atol=1e-3, lse_rtol=1e-4),
    "bf16": dict(max_abs=3e-2, rel_l2=1.6e-2, lse_atol=1e-3, lse_rtol=1e-4),
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


def attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    assert Hq % Hkv == 0
    group = Hq // Hkv
    k = np.repeat(k, group, axis=2)  # query head h reads kv head h // group
    v = np.repeat(v, group, axis=2)
    scale = 1.0 / np.sqrt(D) if not scale else scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    vis = visible_mask(Sq, Sk, causal, window)
    s = np.where(vis[None, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if Sk else np.full((B, Hq, Sq, 1), -np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)  # exp(-inf) = 0 for masked keys
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.einsum("bhqk,bkhd->bqhd", np.where(l > 0, p / np.where(l > 0, l, 1), 0), v)
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(np.where(l > 0, l, 1)[..., 0]), -np.inf)
    return out, lse


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
