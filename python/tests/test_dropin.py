"""The drop-in signatures on CPU tensors: flash_attn_func and
flash_attn_varlen_func against the float64 reference under flash-attn's
documented semantics (bottom-right causal, window_size, softcap, GQA),
scaled_dot_product_attention against torch's own SDPA in float64 (its
top-left is_causal included, for L != S), forward and gradients, and the
arguments FlashCore refuses. Skipped without torch."""

import numpy as np
import pytest

import flashcore

import fc_reference as ref

torch = pytest.importorskip("torch")
F = torch.nn.functional

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
DTYPES = list(DT)
lib_np = ref.torch_to_lib  # float64 numpy in the library's [B,S,H,D] order


def leaves(shapes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(DT[dtype]).requires_grad_() for s in shapes]


def dout_like(out, seed):
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)


def forward_and_grads(fn, q, k, v, seed):
    """fn(q, k, v) and the gradients of sum(out * dout) for a random dout."""
    out = fn(q, k, v)
    dout = dout_like(out, seed)
    out.backward(dout)
    return out.detach(), dout, [x.grad for x in (q, k, v)]


# name, B, Sq, Sk, Hq, Hkv, D, flash_attn_func options, the reference's options
# (flash-attn's semantics written out: causal sets the right side to 0, a
# negative side is unbounded).
FLASH_CASES = [
    ("plain", 2, 19, 23, 4, 4, 32, {}, {}),
    ("causal-gqa-sq<sk", 1, 13, 29, 6, 2, 64, dict(causal=True), dict(causal=True)),
    ("causal-sq>sk", 2, 21, 8, 2, 1, 32, dict(causal=True), dict(causal=True)),
    ("window", 1, 25, 25, 4, 2, 32, dict(window_size=(5, 2)), dict(window=(5, 2))),
    ("causal-window-right-ignored", 1, 17, 22, 2, 2, 16, dict(causal=True, window_size=(3, 4)),
     dict(causal=True, window=(3, -1))),
    ("negative-sides-unbounded", 1, 9, 12, 2, 2, 16, dict(window_size=(-7, 2)), dict(window=(-1, 2))),
    ("softcap-scale", 2, 15, 15, 4, 2, 64, dict(softcap=3.0, softmax_scale=0.3),
     dict(softcap=3.0, scale=0.3)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", FLASH_CASES, ids=[c[0] for c in FLASH_CASES])
def test_flash_attn_func_forward_and_grads(case, dtype):
    name, B, Sq, Sk, Hq, Hkv, D, opts, ropts = case
    q, k, v = leaves([(B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)], dtype, seed=len(name) + D)
    fn = lambda q, k, v: flashcore.flash_attn_func(q, k, v, **opts)  # noqa: E731
    out, dout, grads = forward_and_grads(fn, q, k, v, seed=3)
    assert out.shape == q.shape and out.dtype == q.dtype
    qn, kn, vn = (lib_np(x) for x in (q, k, v))
    ro, rl = ref.attention(qn, kn, vn, **ropts)
    ref.check(lib_np(out), None, ro, None, dtype)
    # The backward's gates hold against the reference over the out and lse
    # the backward was given (flashcore.attention's, deterministic on CPU).
    with torch.no_grad():
        o, lse = flashcore.attention(q, k, v, return_lse=True, **ropts)
    assert torch.equal(o, out)
    r = ref.attention_backward(qn, kn, vn, lib_np(dout), out=lib_np(o), lse=lse.numpy(), **ropts)
    ref.check_grads([lib_np(g) for g in grads], r, dtype)
    ref.check_unseen_zero(*(lib_np(g) for g in grads), **ropts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attn_varlen_func(dtype):
    lens_q, lens_k = [5, 0, 11, 3, 1], [7, 4, 9, 0, 6]
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32)
    q, k, v = leaves([(sum(lens_q), 4, 32), (sum(lens_k), 2, 32), (sum(lens_k), 2, 32)], dtype, seed=17)
    fn = lambda q, k, v: flashcore.flash_attn_varlen_func(  # noqa: E731
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, window_size=(4, -1), softcap=5.0)
    out, dout, grads = forward_and_grads(fn, q, k, v, seed=4)
    assert out.shape == q.shape
    ropts = dict(causal=True, window=(4, -1), softcap=5.0)
    qn, kn, vn = (lib_np(x) for x in (q, k, v))
    ro, rl = ref.attention_varlen(qn, kn, vn, cu_q.tolist(), cu_k.tolist(), **ropts)
    ref.check(lib_np(out), None, ro, None, dtype)
    with torch.no_grad():
        o, lse = flashcore.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True,
                                     window=(4, -1), causal=True, softcap=5.0)
    r = ref.attention_backward_varlen(qn, kn, vn, lib_np(dout), cu_q.tolist(), cu_k.tolist(),
                                      out=lib_np(o), lse=lse.numpy(), **ropts)
    ref.check_grads([lib_np(g) for g in grads], r, dtype)
    assert torch.all(grads[1][7:11] == 0) and torch.all(grads[2][7:11] == 0)  # no query sees them


def top_left(sq, sk):
    """torch's is_causal mask: query i sees keys 0..i."""
    return np.tril(np.ones((sq, sk), dtype=bool))


def torch_sdpa_f64(q, k, v, **opts):
    """torch's math SDPA in float64 on copies of q, k, v; (out, grads) of
    sum(out * dout) for dout_like's values."""
    xs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(*xs, **opts)
    out.backward(dout_like(out, 5).double())
    return out.detach(), [x.grad for x in xs]


# name, B, Hq, Hkv, L, S, D, options
SDPA_CASES = [
    ("plain", 2, 4, 4, 17, 23, 32, {}),
    ("causal-square", 1, 4, 4, 24, 24, 64, dict(is_causal=True)),
    ("causal-l>s", 2, 2, 2, 19, 7, 32, dict(is_causal=True)),
    ("causal-l<s-gqa", 1, 6, 2, 9, 26, 32, dict(is_causal=True, enable_gqa=True)),
    ("scale-gqa", 2, 4, 1, 11, 13, 16, dict(scale=0.4, enable_gqa=True)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
def test_sdpa_matches_torch_sdpa(case, dtype):
    name, B, Hq, Hkv, L, S, D, opts = case
    q, k, v = leaves([(B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, D)], dtype, seed=len(name) * 7 + L)
    fn = lambda q, k, v: flashcore.scaled_dot_product_attention(q, k, v, **opts)  # noqa: E731
    out, dout, grads = forward_and_grads(fn, q, k, v, seed=5)
    assert out.shape == (B, Hq, L, D) and out.dtype == q.dtype
    t_out, t_grads = torch_sdpa_f64(q, k, v, **opts)
    ref.check(lib_np(out, "bhsd"), None, lib_np(t_out, "bhsd"), None, dtype)
    if dtype == "f32":  # torch's exact gradients hold the float32 gates
        ref.check_grads([lib_np(g, "bhsd") for g in grads], [lib_np(g, "bhsd") for g in t_grads], dtype)
    # Every dtype: the reference over the out the backward was given (and the
    # exact lse: the library's differs far below the gates), torch's mask.
    mask = top_left(L, S) if opts.get("is_causal") else None
    qn, kn, vn = (lib_np(x, "bhsd") for x in (q, k, v))
    _, lse = ref.attention(qn, kn, vn, scale=opts.get("scale"), mask=mask)
    r = ref.attention_backward(qn, kn, vn, lib_np(dout, "bhsd"), out=lib_np(out, "bhsd"), lse=lse,
                               scale=opts.get("scale"), mask=mask)
    ref.check_grads([lib_np(g, "bhsd") for g in grads], r, dtype)
    if mask is not None and L < S:  # keys past L: no query sees them
        assert torch.all(grads[1][:, :, L:] == 0) and torch.all(grads[2][:, :, L:] == 0)


def test_sdpa_three_dims_and_no_grad():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(3, 10, 16, generator=g) for _ in range(3))
    out = flashcore.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.shape == q.shape and not out.requires_grad
    with torch.no_grad():
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    ref.check(out.numpy(), None, want.numpy(), None, "f32")


def test_unimplemented_arguments_raise_naming_them():
    q, k, v = (torch.randn(1, 6, 2, 16) for _ in range(3))
    U = flashcore.UnsupportedError
    cases = [
        (lambda: flashcore.flash_attn_func(q, k, v, dropout_p=0.1), r"^dropout_p=0\.1: FlashCore has no"),
        (lambda: flashcore.flash_attn_func(q, k, v, alibi_slopes=torch.ones(2)), r"^alibi_slopes: ALiBi"),
        (lambda: flashcore.flash_attn_func(q, k, v, return_attn_probs=True), r"^return_attn_probs=True"),
        (lambda: flashcore.flash_attn_func(q, k, v, softmax_scale=0.0), r"^softmax_scale=0\.0"),
        (lambda: flashcore.flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 6]),
                                                  torch.tensor([0, 6]), 6, 6, block_table=torch.zeros(1)),
         r"^block_table: a paged KV cache"),
        (lambda: flashcore.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(6, 6, dtype=bool)),
         r"^attn_mask: an arbitrary mask"),
        (lambda: flashcore.scaled_dot_product_attention(q, k, v, dropout_p=0.5), r"^dropout_p=0\.5"),
        (lambda: flashcore.scaled_dot_product_attention(q, k, v, scale=0), r"^scale=0\.0"),
        (lambda: flashcore.scaled_dot_product_attention(q, k, v[..., :8]), r"^value: head dim 8"),
        (lambda: flashcore.scaled_dot_product_attention(q[None], k[None], v[None]),
         r"^query, key, value: FlashCore takes"),
    ]
    for call, msg in cases:
        with pytest.raises(U, match=msg):
            call()
    E = flashcore.InvalidArgumentError
    with pytest.raises(E, match=r"^key: 1 heads but query has 6: pass enable_gqa=True"):
        flashcore.scaled_dot_product_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(E, match=r"^window_size: expected \(left, right\)"):
        flashcore.flash_attn_func(q, k, v, window_size=3)
    with pytest.raises(E, match=r"^softcap=-1\.0: use 0\.0"):
        flashcore.flash_attn_func(q, k, v, softcap=-1.0)
