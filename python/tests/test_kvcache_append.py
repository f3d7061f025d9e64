"""attention_with_kvcache with k_new/v_new (appending to the cache) and
rotary_cos/rotary_sin, and attention(k_new=, ...), on the CPU, against a
float64 numpy oracle written here from flash-attn's flash_attn_with_kvcache
semantics: k_new rotated at key positions cache_seqlens[b] + t, q at
cache_seqlens[b] + i when causal or windowed (else cache_seqlens[b]);
interleaved rotary pairs dims (2i, 2i+1), non-interleaved (i, i +
rotary_dim / 2); x' = x * cos + rotate(x) * sin; then softmax attention over
the cache_seqlens[b] + seqlen_new keys, bottom-right aligned.

Dense and paged caches (page sizes 1, 3, 16; shuffled pages, garbage table
entries past each sequence's pages), rows past each sequence's keys
poisoned with NaN (a read shows in out), out poisoned with NaN. Each call's
cache is checked: the appended v rows exact, k rows within 1 ulp of the
rotated keys, every other element bitwise unchanged. numpy and torch CPU
tensors (the torch cases skip without torch), f32 and f16; the kept-call
path, torch.compile, opcheck, and the errors (nothing written)."""

import numpy as np
import pytest

import flashcore
from flashcore import _call_cache

import fc_reference as ref
from test_kvcache import convert, f64, np_dtype, seeded

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")
ERR = flashcore.InvalidArgumentError


def as_np(x):
    """x as numpy in its own dtype (the bitwise cache checks; f64 widens)."""
    return x.detach().numpy() if torch is not None and isinstance(x, torch.Tensor) else np.asarray(x)


# ---- the oracle ------------------------------------------------------------------------


def rope_tables(seqlen_ro, rotary_dim, dtype):
    """cos, sin [seqlen_ro, rotary_dim / 2] of the dtype (GPT-NeoX frequencies)."""
    inv = 1.0 / 10000.0 ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    ang = np.arange(seqlen_ro)[:, None] * inv[None, :]
    return np.cos(ang).astype(np_dtype(dtype)), np.sin(ang).astype(np_dtype(dtype))


def rotate(x, cos, sin, interleaved):
    """x [..., D] (float64) rotated by cos, sin [..., rotary_dim / 2] (rows
    broadcast against x's leading dims), flash-attn's convention:
    x' = x * cos + rotate(x) * sin over the first rotary_dim dims, where
    rotate maps a pair (a, b) to (-b, a); pairs are (2i, 2i+1) interleaved,
    else (i, i + rotary_dim / 2). The rest of x is kept."""
    x = np.array(x, dtype=np.float64)
    cos, sin = np.asarray(cos, np.float64), np.asarray(sin, np.float64)
    rd = 2 * cos.shape[-1]
    r = x[..., :rd]
    if interleaved:
        c, s = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1)
        rot = np.stack([-r[..., 1::2], r[..., 0::2]], axis=-1).reshape(r.shape)
    else:
        c, s = np.concatenate([cos, cos], axis=-1), np.concatenate([sin, sin], axis=-1)
        rot = np.concatenate([-r[..., rd // 2:], r[..., :rd // 2]], axis=-1)
    x[..., :rd] = r * c + rot * s
    return x


def oracle(q, keys, vals, lens, k_new, v_new, rotary, causal, window=(-1, -1), scale=None):
    """out [B,Sq,Hq,D] (float64) and the rotated new keys [B,Snew,Hkv,D].
    keys/vals: each sequence's cache keys before the append, [B][n, Hkv, D]
    (the first lens[b] are read). rotary: None or (cos, sin, interleaved)."""
    q, k_new, v_new = (np.asarray(x, np.float64) for x in (q, k_new, v_new))
    B, Sq = q.shape[:2]
    new = k_new.shape[1]
    k_rot = k_new.copy()
    out = np.zeros(q.shape)
    step = 1 if (causal or window != (-1, -1)) else 0
    for b in range(B):
        n = int(lens[b])
        qb = q[b]
        if rotary is not None:
            cos, sin, inter = rotary
            kp = n + np.arange(new)
            k_rot[b] = rotate(k_new[b], cos[kp][:, None], sin[kp][:, None], inter)
            qp = n + step * np.arange(Sq)
            qb = rotate(q[b], cos[qp][:, None], sin[qp][:, None], inter)
        kb = np.concatenate([np.asarray(keys[b][:n], np.float64), k_rot[b]])
        vb = np.concatenate([np.asarray(vals[b][:n], np.float64), v_new[b]])
        o, _ = ref.attention(qb[None], kb[None], vb[None], causal=causal, window=window, scale=scale)
        out[b] = o[0]
    return out, k_rot


# ---- caches ------------------------------------------------------------------------------


class Cache:
    """A dense ([B, cap, Hkv, D]) or paged ([num_pages, page_size, Hkv, D]
    with a shuffled block table) cache of random keys, each sequence's
    lens[b] keys set and every other row NaN; the pages hold room for
    lens[b] + new keys (paged: no shared page, since they are written)."""

    def __init__(self, rng, B, Hkv, D, page_size, capacity, lens, new, dtype):
        self.lens = np.asarray(lens, np.int32)
        self.page_size, self.capacity, self.dtype = page_size, capacity, dtype
        if page_size is None:
            shape = (B, capacity, Hkv, D)
            self.table = None
        else:
            max_pages = capacity // page_size
            need = [-(-(int(n) + new) // page_size) for n in lens]
            num_pages = sum(need) + 2  # two pages no sequence uses
            order = iter(rng.permutation(num_pages))
            table = rng.choice([-1, num_pages, num_pages + 5], size=(B, max_pages)).astype(np.int32)
            for b in range(B):
                for j in range(need[b]):
                    table[b, j] = next(order)
            self.table = table
            shape = (num_pages, page_size, Hkv, D)
        self.k = np.full(shape, np.nan, np_dtype(dtype))
        self.v = np.full(shape, np.nan, np_dtype(dtype))
        for b in range(B):
            j = np.arange(int(lens[b]))
            slot = self.slot(b, j)
            self.k[slot] = rng.standard_normal((len(j), Hkv, D))
            self.v[slot] = rng.standard_normal((len(j), Hkv, D))

    def slot(self, b, j):
        """The index of keys j (an array) of sequence b in k/v."""
        if self.table is None:
            return (b, j)
        return (self.table[b, j // self.page_size], j % self.page_size)

    def seq(self, x, b, n):
        """Sequence b's first n keys of x (k or v, any kind) as float64."""
        return np.asarray(f64(x)[self.slot(b, np.arange(n))], np.float64)


def ulps(dtype):
    return lambda x: np.spacing(np.abs(x).astype(np_dtype(dtype))).astype(np.float64)


def check_cache(cache, k_before, v_before, k_after, v_after, k_rot, v_new):
    """The appended rows (k within 1 ulp of the rotated keys, v exact),
    everything else bitwise as before."""
    k_after, v_after = as_np(k_after), as_np(v_after)
    written = np.zeros(k_before.shape[:2], bool)
    new = k_rot.shape[1]
    for b in range(len(cache.lens)):
        j = int(cache.lens[b]) + np.arange(new)
        slot = cache.slot(b, j)
        written[slot] = True
        got_k = k_after[slot].astype(np.float64)
        assert np.all(np.abs(got_k - k_rot[b]) <= ulps(cache.dtype)(k_rot[b])), \
            "sequence %d: appended keys off by more than 1 ulp" % b
        assert np.array_equal(v_after[slot], np.asarray(v_new[b]).astype(v_after.dtype)), \
            "sequence %d: appended values differ from v_new" % b
    bits = {2: np.uint16, 4: np.uint32}[k_before.itemsize]
    for before, after, name in ((k_before, k_after, "k"), (v_before, v_after, "v")):
        assert np.array_equal(before.view(bits)[~written], np.ascontiguousarray(after).view(bits)[~written]), \
            "%s: rows other than the appended ones changed" % name


# ---- the matrix --------------------------------------------------------------------------

B, HQ, HKV, D = 4, 4, 2, 32
CACHES = {  # name: (page_size, capacity)
    "dense": (None, 37), "ps1": (1, 37), "ps3": (3, 39), "ps16": (16, 48),
}
ROTARY = {  # name: (rotary_dim, interleaved) or None
    "norot": None, "interleaved": (D, True), "half": (D, False),
    "partial-interleaved": (D // 2, True), "partial-half": (D // 2, False),
}
KINDS = [("numpy", "f32"), ("numpy", "f16"), pytest.param(("torch", "f32"), marks=needs_torch),
         pytest.param(("torch", "f16"), marks=needs_torch)]


def setup(rng, cache_name, new, kind, dtype, Sq=None, lens=None):
    page_size, cap = CACHES[cache_name]
    if lens is None:  # empty, short, full after the append, random
        lens = [0, 5, cap - new, int(rng.integers(0, cap - new + 1))]
    cache = Cache(rng, B, HKV, D, page_size, cap, lens, new, dtype)
    Sq = new if Sq is None else Sq
    q = rng.standard_normal((B, Sq, HQ, D)).astype(np_dtype(dtype))
    k_new = rng.standard_normal((B, new, HKV, D)).astype(np_dtype(dtype))
    v_new = rng.standard_normal((B, new, HKV, D)).astype(np_dtype(dtype))
    return cache, q, k_new, v_new


def run_case(rng, cache_name, new, rot, causal, kind, dtype, Sq=None, window=(-1, -1), via="dropin"):
    cache, q, k_new, v_new = setup(rng, cache_name, new, kind, dtype, Sq)
    rotary = None
    tables = {}
    if ROTARY[rot] is not None:
        rd, inter = ROTARY[rot]
        # q's rows may sit past the cache's last key (Sq > seqlen_new, windowed)
        cos, sin = rope_tables(cache.capacity + max(q.shape[1] - new, 0), rd, dtype)
        rotary = (cos, sin, inter)
        tables = dict(rotary_cos=convert(cos, kind, dtype), rotary_sin=convert(sin, kind, dtype),
                      rotary_interleaved=inter)
    keys = [cache.seq(cache.k, b, int(n)) for b, n in enumerate(cache.lens)]
    vals = [cache.seq(cache.v, b, int(n)) for b, n in enumerate(cache.lens)]
    r_out, k_rot = oracle(q, keys, vals, cache.lens, k_new, v_new, rotary, causal, window)
    k_before, v_before = cache.k.copy(), cache.v.copy()

    kc, vc = convert(cache.k, kind, dtype), convert(cache.v, kind, dtype)
    qx, knx, vnx = (convert(x, kind, dtype) for x in (q, k_new, v_new))
    table = None if cache.table is None else convert(cache.table, kind)
    lens = convert(cache.lens.copy(), kind)
    out = convert(np.full(q.shape, np.nan, np.float32), kind, dtype)
    if via == "dropin":
        res = flashcore.attention_with_kvcache(qx, kc, vc, cache_seqlens=lens, block_table=table, k_new=knx,
                                               v_new=vnx, causal=causal, window_size=window, out=out,
                                               **tables)
    else:
        tables.setdefault("rotary_interleaved", False)
        res = flashcore.attention(qx, kc, vc, seqused_k=lens, block_table=table, k_new=knx, v_new=vnx,
                                  causal=causal, window=window, out=out, **tables)
    assert res is out
    ref.check(f64(out), None, r_out, None, dtype)
    check_cache(cache, k_before, v_before, kc, vc, k_rot, v_new)
    assert np.array_equal(f64(lens), cache.lens), "cache_seqlens was modified"
    assert np.array_equal(f64(qx), q), "q was modified"
    return cache


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("rot", list(ROTARY))
@pytest.mark.parametrize("new", [1, 3], ids=["new1", "new3"])
@pytest.mark.parametrize("cache_name", list(CACHES))
@pytest.mark.parametrize("kind_dtype", KINDS, ids=["numpy-f32", "numpy-f16", "torch-f32", "torch-f16"])
def test_append_matches_oracle(kind_dtype, cache_name, new, rot, causal):
    kind, dtype = kind_dtype
    rng = seeded(kind, dtype, cache_name, new, rot, causal)
    run_case(rng, cache_name, new, rot, causal, kind, dtype)


@pytest.mark.parametrize("cache_name", ["dense", "ps3"])
@pytest.mark.parametrize("case", [
    # Sq, seqlen_new, causal, window: q rows step through the positions when
    # windowed (as causal), else all sit at cache_seqlens
    (2, 3, False, (4, 1)), (3, 1, False, (-1, 0)), (4, 2, True, (3, -1)), (3, 2, False, (-1, -1)),
], ids=["sq2-new3-window", "sq3-new1-right0", "sq4-new2-causal-window", "sq3-new2-full"])
def test_windows_and_query_lengths(case, cache_name):
    Sq, new, causal, window = case
    for rot in ("half", "partial-interleaved"):
        rng = seeded("windows", case, cache_name, rot)
        run_case(rng, cache_name, new, rot, causal, "numpy", "f32", Sq=Sq, window=window)


@pytest.mark.parametrize("kind", ["numpy", pytest.param("torch", marks=needs_torch)])
def test_attention_entry_point(kind):
    # flashcore.attention(k_new=, seqused_k=) is the same call in FlashCore's names
    for rot in ("norot", "interleaved", "half"):
        rng = seeded("attention", kind, rot)
        run_case(rng, "ps3", 2, rot, True, kind, "f32", via="attention")


def test_bhsd_layout_and_supported():
    # layout='bhsd': q, k, v and k_new, v_new all [B, H, S, D]
    rng = seeded("bhsd")
    cache, q, k_new, v_new = setup(rng, "dense", 2, "numpy", "f32")
    cos, sin = rope_tables(cache.capacity, D, "f32")
    keys = [cache.seq(cache.k, b, int(n)) for b, n in enumerate(cache.lens)]
    vals = [cache.seq(cache.v, b, int(n)) for b, n in enumerate(cache.lens)]
    r_out, k_rot = oracle(q, keys, vals, cache.lens, k_new, v_new, (cos, sin, False), True)
    k_before, v_before = cache.k.copy(), cache.v.copy()
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    kc, vc = t(cache.k), t(cache.v)
    kw = dict(seqused_k=cache.lens, k_new=t(k_new), v_new=t(v_new), rotary_cos=cos, rotary_sin=sin,
              causal=True, layout="bhsd")
    ok, name = flashcore.supported(t(q), kc, vc, **kw)
    assert ok, name
    assert np.array_equal(kc.view(np.uint32), t(k_before).view(np.uint32)), "supported() wrote the cache"
    out = flashcore.attention(t(q), kc, vc, **kw)
    ref.check(out.transpose(0, 2, 1, 3), None, r_out, None, "f32")
    check_cache(cache, k_before, v_before, kc.transpose(0, 2, 1, 3), vc.transpose(0, 2, 1, 3), k_rot, v_new)


def test_int_cache_seqlens_and_successive_steps():
    # Three decode steps on one cache: each appends after the last, with one
    # int length for every sequence, as flash-attn's int cache_seqlens.
    rng = seeded("steps")
    cache, _, _, _ = setup(rng, "ps16", 1, "numpy", "f32", lens=[6] * B)
    cos, sin = rope_tables(cache.capacity, D, "f32")
    for step in range(3):
        n = 6 + step
        q = rng.standard_normal((B, 1, HQ, D)).astype(np.float32)
        k_new, v_new = (rng.standard_normal((B, 1, HKV, D)).astype(np.float32) for _ in range(2))
        keys = [cache.seq(cache.k, b, n) for b in range(B)]
        vals = [cache.seq(cache.v, b, n) for b in range(B)]
        cache.lens = np.full(B, n, np.int32)
        r_out, k_rot = oracle(q, keys, vals, cache.lens, k_new, v_new, (cos, sin, True), True)
        k_before, v_before = cache.k.copy(), cache.v.copy()
        out, lse = flashcore.attention_with_kvcache(q, cache.k, cache.v, cache_seqlens=n, block_table=cache.table,
                                                    k_new=k_new, v_new=v_new, rotary_cos=cos, rotary_sin=sin,
                                                    causal=True, return_softmax_lse=True)
        ref.check(out, None, r_out, None, "f32")
        assert lse.shape == (B, HQ, 1) and np.all(np.isfinite(lse))
        check_cache(cache, k_before, v_before, cache.k, cache.v, k_rot, v_new)


# ---- errors: refused before anything is written ------------------------------------------


def error_case():
    rng = seeded("errors")
    cache, q, k_new, v_new = setup(rng, "ps3", 2, "numpy", "f32", lens=[4, 0, 9, 30])
    cos, sin = rope_tables(cache.capacity, D, "f32")
    return cache, q, k_new, v_new, cos, sin


def refused(exc, msg, cache, q, **kw):
    """attention_with_kvcache(**kw) raises exc matching msg, writing neither
    the cache nor out."""
    k_before, v_before = cache.k.copy(), cache.v.copy()
    out = np.full(q.shape, 7.0, np.float32)
    kw.setdefault("block_table", cache.table)
    with pytest.raises(exc, match=msg):
        flashcore.attention_with_kvcache(q, cache.k, cache.v, out=out, **kw)
    assert np.all(out == 7.0)
    for before, after in ((k_before, cache.k), (v_before, cache.v)):
        assert np.array_equal(before.view(np.uint32), after.view(np.uint32)), "a refused call wrote the cache"


def test_k_new_needs_cache_seqlens():
    cache, q, k_new, v_new, _, _ = error_case()
    refused(ERR, r"^cache_seqlens: None, but k_new/v_new are appended", cache, q, k_new=k_new, v_new=v_new)
    # attention()'s own name for it, from the library
    with pytest.raises(ERR, match=r"^k_new needs seqused_k"):
        flashcore.attention(q, cache.k, cache.v, block_table=cache.table, k_new=k_new, v_new=v_new)


def test_rotary_needs_k_new():
    cache, q, _, _, cos, sin = error_case()
    refused(ERR, r"^rotary_cos/sin rotate q and k_new: set k_new and v_new too", cache, q,
            cache_seqlens=cache.lens, rotary_cos=cos, rotary_sin=sin)


@pytest.mark.parametrize("name", ["cache_batch_idx", "cache_leftpad"])
def test_unimplemented_arguments_still_refused(name):
    cache, q, k_new, v_new, _, _ = error_case()
    refused(flashcore.UnsupportedError, "^%s" % name, cache, q, cache_seqlens=cache.lens, k_new=k_new,
            v_new=v_new, **{name: np.zeros(B, np.int32)})


def test_bad_append_arguments():
    cache, q, k_new, v_new, cos, sin = error_case()
    base = dict(cache_seqlens=cache.lens, k_new=k_new, v_new=v_new)
    cases = [
        (dict(base, k_new=None), r"^k_new and v_new go together"),
        (dict(base, v_new=None), r"^k_new and v_new go together"),
        (dict(base, k_new=k_new[:, :, :1]), r"^v_new.shape must equal k_new.shape"),
        (dict(base, k_new=k_new[:, :, :1], v_new=v_new[:, :, :1]), r"^k_new.shape is \[4, 2, 1, 32\]"),
        (dict(base, k_new=k_new.astype(np.float16), v_new=v_new.astype(np.float16)),
         r"^k_new \(f16\) and v_new \(f16\) must have q's dtype f32"),
        (dict(base, rotary_cos=cos), r"^rotary_cos and rotary_sin go together"),
        (dict(base, rotary_cos=cos[:, :-1], rotary_sin=sin), r"^rotary_sin.shape must equal"),
        (dict(base, rotary_cos=np.ones((39, 17), np.float32), rotary_sin=np.ones((39, 17), np.float32)),
         r"rotary_dim 34 exceeds head_dim 32"),
        (dict(base, rotary_cos=cos[:31], rotary_sin=sin[:31], causal=True),  # keys 30, 31 of sequence 3
         r"^sequence 3 needs rotary position 31: rotary_cos/sin have 31 rows"),
        (dict(base, cache_seqlens=np.array([4, 0, 9, 38], np.int32)),
         r"^seqused_k\[3\] is 38 before seqlen_new keys are appended: must be in \[0, 37\]"),
        (dict(base, k_new=list(k_new)), r"^k_new: expected a numpy array or a torch tensor"),
    ]
    for kw, msg in cases:
        refused(ERR, msg, cache, q, **kw)
    read_only = cache.k.copy()
    read_only.flags.writeable = False
    with pytest.raises(ERR, match=r"^k: the array is read-only"):
        flashcore.attention_with_kvcache(q, read_only, cache.v, block_table=cache.table, **base)


def test_varlen_and_empty_queries_cannot_append():
    cache, q, k_new, v_new, _, _ = error_case()
    k, v = np.zeros((12, HKV, D), np.float32), np.zeros((12, HKV, D), np.float32)
    with pytest.raises(flashcore.UnsupportedError, match=r"^k_new/v_new \(rotary_cos/sin\) with cu_seqlens"):
        flashcore.attention(q[0], k, v, cu_seqlens_q=[0, 2], cu_seqlens_k=[0, 12], k_new=k_new, v_new=v_new)
    refused(flashcore.UnsupportedError, r"^k_new/v_new \(rotary_cos/sin\) with q of shape \(4, 0, 4, 32\)",
            cache, q[:, :0], cache_seqlens=cache.lens, k_new=k_new, v_new=v_new)


# ---- torch -------------------------------------------------------------------------------


def same(a, b):
    """Bitwise equal float32 tensors (NaN rows included)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def torch_case(seed="torch", lens=(3, 0, 8, 20)):
    """A paged cache with pages for 5 more keys a sequence, q, k_new, v_new
    (seqlen_new 1) and the rotary tables, as torch tensors."""
    rng = seeded(seed)
    cache = Cache(rng, B, HKV, D, 3, 39, list(lens), 5, "f32")
    q, k_new, v_new = (rng.standard_normal(s).astype(np.float32)
                       for s in ((B, 1, HQ, D), (B, 1, HKV, D), (B, 1, HKV, D)))
    cos, sin = rope_tables(cache.capacity, D, "f32")
    t = torch.from_numpy
    return cache, rng, dict(q=t(q), k_new=t(k_new), v_new=t(v_new), cos=t(cos), sin=t(sin),
                            k=t(cache.k), v=t(cache.v), table=t(cache.table), lens=t(cache.lens.copy()))


@needs_torch
@pytest.mark.usefixtures("python_eager_path")  # the Python path's kept calls
def test_kept_calls_append_and_a_later_read_does_not():
    # Decode steps on torch tensors are served from the kept call (one
    # signature), each appending where the in-place advanced lengths say; a
    # call of the same shapes without k_new is another signature and writes
    # nothing, and a later append is still served.
    _call_cache._kept.clear()
    cache, rng, x = torch_case("kept")
    kw = dict(block_table=x["table"], rotary_cos=x["cos"], rotary_sin=x["sin"], causal=True)
    for step in range(4):
        q, k_new, v_new = (torch.from_numpy(rng.standard_normal(s).astype(np.float32))
                           for s in ((B, 1, HQ, D), (B, 1, HKV, D), (B, 1, HKV, D)))
        lens = x["lens"].numpy().copy()
        keys = [cache.seq(x["k"], b, int(n)) for b, n in enumerate(lens)]
        vals = [cache.seq(x["v"], b, int(n)) for b, n in enumerate(lens)]
        r_out, k_rot = oracle(q, keys, vals, lens, k_new, v_new, (x["cos"].numpy(), x["sin"].numpy(), True), True)
        cache.lens = lens
        k_before, v_before = x["k"].numpy().copy(), x["v"].numpy().copy()
        out = flashcore.attention_with_kvcache(q, x["k"], x["v"], cache_seqlens=x["lens"], k_new=k_new,
                                               v_new=v_new, **kw)
        ref.check(out.numpy(), None, r_out, None, "f32")
        check_cache(cache, k_before, v_before, x["k"], x["v"], k_rot, v_new.numpy())
        assert len(_call_cache._kept) == (1 if step <= 1 else 2)
        if step == 1:  # the same call without k_new (and rotary): reads, writes nothing
            k_before, v_before = x["k"].clone(), x["v"].clone()
            read = flashcore.attention_with_kvcache(q, x["k"], x["v"], cache_seqlens=x["lens"] + 1,
                                                    block_table=x["table"], causal=True)
            assert same(x["k"], k_before) and same(x["v"], v_before)
            assert torch.isfinite(read).all()
            assert len(_call_cache._kept) == 2
        x["lens"] += 1  # in place: the kept pointer's values


@needs_torch
@pytest.mark.usefixtures("python_eager_path")  # the Python path's kept calls
def test_kept_read_then_append_with_the_same_tensors():
    # A kept plain call on (q, k, v) first, then appending calls of the same
    # q, k, v signature: the append fields are never taken from the plain
    # call's struct, nor left behind for the next plain call.
    _call_cache._kept.clear()
    cache, rng, x = torch_case("order")
    plain = dict(cache_seqlens=x["lens"], block_table=x["table"])
    for _ in range(2):
        k_before = x["k"].clone()
        flashcore.attention_with_kvcache(x["q"], x["k"], x["v"], **plain)
        assert same(x["k"], k_before)
        flashcore.attention_with_kvcache(x["q"], x["k"], x["v"], k_new=x["k_new"], v_new=x["v_new"], **plain)
        assert not same(x["k"], k_before)
        x["lens"] += 1
    flashcore.attention_with_kvcache(x["q"], x["k"], x["v"], **plain)  # the last lengths: all appended keys
    assert len(_call_cache._kept) == 2


@needs_torch
def test_gradient_is_refused():
    cache, rng, x = torch_case("grad")
    q = x["q"].clone().requires_grad_()
    kw = dict(cache_seqlens=x["lens"], block_table=x["table"], k_new=x["k_new"], v_new=x["v_new"],
              rotary_cos=x["cos"], rotary_sin=x["sin"], causal=True)
    k_before = x["k"].clone()
    out = flashcore.attention_with_kvcache(q, x["k"], x["v"], **kw)
    assert out.requires_grad and not same(x["k"], k_before)  # appended
    with pytest.raises(flashcore.UnsupportedError, match=r"^backward of a call that appends to a KV cache"):
        out.sum().backward()
    x["k"].copy_(k_before)
    with torch.no_grad():
        expect = flashcore.attention_with_kvcache(x["q"], x["k"], x["v"], **kw)
    assert torch.equal(out.detach(), expect)
    # a cache that requires grad would not see the write in its history
    k = x["k"].clone().requires_grad_() * 1.0
    with pytest.raises(ERR, match=r"^k: requires grad, but k_new/v_new are written into it in place"):
        flashcore.attention_with_kvcache(x["q"], k, x["v"], **kw)
    with pytest.raises(ERR, match=r"^k: a leaf tensor that requires grad cannot be written in place"):
        with torch.no_grad():
            flashcore.attention_with_kvcache(x["q"], x["k"].clone().requires_grad_(), x["v"], **kw)


@needs_torch
def test_numpy_append_tensors_with_torch_q_are_refused():
    cache, rng, x = torch_case("mixed")
    kw = dict(cache_seqlens=x["lens"], block_table=x["table"], v_new=x["v_new"])
    with pytest.raises(ERR, match=r"^k_new: is a numpy object on cpu but q is a torch object on cpu"):
        flashcore.attention_with_kvcache(x["q"], x["k"], x["v"], k_new=x["k_new"].numpy(), **kw)
    with pytest.raises(ERR, match=r"^k_new: a numpy.ndarray, but q is a torch tensor"):
        flashcore.attention_with_kvcache(x["q"].requires_grad_(), x["k"], x["v"], k_new=x["k_new"].numpy(), **kw)


@needs_torch
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_appends_as_eager(backend):
    cache, rng, x = torch_case("compile")

    def step(q, k, v, k_new, v_new, table, lens, cos, sin):
        out = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lens, block_table=table, k_new=k_new,
                                               v_new=v_new, rotary_cos=cos, rotary_sin=sin, causal=True)
        return out * 2.0

    names = ("q", "k", "v", "k_new", "v_new", "table", "lens", "cos", "sin")
    k0, v0 = x["k"].clone(), x["v"].clone()
    with torch.no_grad():
        expect = step(*(x[n] for n in names))
        k1, v1 = x["k"].clone(), x["v"].clone()
        x["k"].copy_(k0)
        x["v"].copy_(v0)
        explain = torch._dynamo.explain(step)(*(x[n] for n in names))
        assert explain.graph_break_count == 0, explain.break_reasons
        x["k"].copy_(k0)
        x["v"].copy_(v0)
        try:
            got = torch.compile(step, fullgraph=True, backend=backend)(*(x[n] for n in names))
        except Exception as e:  # a CPU inductor needs a C++ compiler
            if backend == "inductor" and "compiler" in str(e).lower():
                pytest.skip("inductor cannot compile on this machine: %s" % str(e).splitlines()[0])
            raise
    assert torch.equal(got, expect)
    assert same(x["k"], k1) and same(x["v"], v1)  # the compiled call wrote the cache
    assert not same(k1, k0) and not same(v1, v0)
    meta = [x[n].to("meta") for n in names]
    out = step(*meta)
    assert out.device.type == "meta" and out.shape == x["q"].shape


@needs_torch
def test_opcheck_append_op():
    cache, rng, x = torch_case("opcheck")
    k, v = (torch.nan_to_num(t) for t in (x["k"], x["v"]))  # opcheck compares outputs with NaN-free inputs
    from flashcore import _torch_ops
    opts = tuple(_torch_ops.Options(None, None, -1, -1, 0.0, 0.0, True, -1, 0, False, "auto", 0, False))
    for rotary in ((x["cos"], x["sin"], True), (None, None, False)):
        res = torch.library.opcheck(torch.ops.flashcore.attention_fwd_append.default,
                                    (x["q"], k, v) + opts + (x["table"], x["lens"], x["k_new"], x["v_new"])
                                    + rotary)
        assert set(res.values()) == {"SUCCESS"}, res
