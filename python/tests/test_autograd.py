"""torch autograd through flashcore.attention on CPU tensors: loss.backward()
against the float64 reference and against torch's own SDPA backward in
float64, torch.autograd.gradcheck in float64 (the cpu-reference backend), the torch forms of
attention_backward, and what autograd refuses. Skipped without torch (the
numpy tests in test_backward.py carry the CPU coverage then)."""

import numpy as np
import pytest

import flashcore

import fc_reference as ref

torch = pytest.importorskip("torch")

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
lib_np = ref.torch_to_lib  # float64 numpy in the library's order
ERR = flashcore.InvalidArgumentError


def leaves(shapes, dtype, seed, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float32).to(DT[dtype]).requires_grad_(requires_grad)
            for s in shapes]


# name, layout, B, Sq, Sk, Hq, Hkv, D, options
CASES = [
    ("plain-bhsd", "bhsd", 2, 19, 23, 4, 4, 32, {}),
    ("gqa-causal", "bshd", 1, 30, 41, 8, 2, 64, dict(causal=True)),
    ("causal-sq>sk", "bhsd", 1, 33, 12, 2, 1, 32, dict(causal=True)),
    ("window-softcap", "bshd", 2, 25, 25, 4, 2, 64, dict(window=(4, 2), softcap=4.0, scale=0.2)),
]


def shapes(layout, B, Sq, Sk, Hq, Hkv, D):
    if layout == "bhsd":
        return [(B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)]
    return [(B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_loss_backward_matches_reference(case, dtype):
    name, layout, B, Sq, Sk, Hq, Hkv, D, opts = case
    q, k, v = leaves(shapes(layout, B, Sq, Sk, Hq, Hkv, D), dtype, seed=len(name) * 31 + D)
    out = flashcore.attention(q, k, v, layout=layout, **opts)
    assert out.requires_grad and out.grad_fn is not None
    with torch.no_grad():  # the out and lse the backward was given (the CPU forward is deterministic)
        o, lse = flashcore.attention(q, k, v, layout=layout, return_lse=True, **opts)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(out.dtype)
    (out.float() * dout.float()).sum().backward()
    for x in (q, k, v):
        assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == x.dtype
    r = ref.attention_backward(*(lib_np(x, layout) for x in (q, k, v, dout)), out=lib_np(o, layout),
                               lse=lse.numpy(), **opts)
    ref.check_grads([lib_np(x.grad, layout) for x in (q, k, v)], r, dtype)
    ref.check_unseen_zero(*(lib_np(x.grad, layout) for x in (q, k, v)), **opts)


def _sdpa_f64(q, k, v, causal):
    """torch's math SDPA in float64 on [B,H,S,D] tensors (GQA by repeating)."""
    rep = q.shape[1] // k.shape[1]
    K, V = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    mask = torch.from_numpy(ref.visible_mask(q.shape[2], k.shape[2], causal=causal)) if causal else None
    return torch.nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=mask)


def test_gradients_match_torch_sdpa_backward_in_float64():
    # float32 leaves for flashcore; the same values in float64 through torch.
    q, k, v = leaves([(2, 4, 37, 64), (2, 2, 45, 64), (2, 2, 45, 64)], "f32", seed=7)
    out = flashcore.attention(q, k, v, layout="bhsd", causal=True)
    out.square().sum().backward()  # a dout that depends on out
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    o64 = _sdpa_f64(q64, k64, v64, causal=True)
    o64.square().sum().backward()
    assert ref.rel_l2(out.detach().numpy(), o64.detach().numpy()) <= ref.GATES["f32"]["rel_l2"]
    ref.check_grads([x.grad.numpy() for x in (q, k, v)], [x.grad.numpy() for x in (q64, k64, v64)], "f32")


@pytest.mark.parametrize("opts", [dict(causal=True), dict(softcap=1.5, window=(2, 1)),
                                  dict(causal=True, scale=0.4)],
                         ids=["causal", "softcap", "gqa-scale"])
def test_gradcheck_float64(opts):
    # float64 runs on the cpu-reference backend; the backward reads lse in
    # float32, a relative error of ~1e-7 in P, far under gradcheck's atol.
    g = torch.Generator().manual_seed(3)
    hq = 4 if "scale" in opts else 2
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64).requires_grad_()
               for s in [(1, 5, hq, 8), (1, 6, 2, 8), (1, 6, 2, 8)])
    fn = lambda q, k, v: flashcore.attention(q, k, v, **opts)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_float64_refused_off_the_reference():
    q = torch.randn(1, 4, 2, 8, dtype=torch.float64)
    with pytest.raises(flashcore.UnsupportedError, match="f64"):
        flashcore.attention(q, q, q, backend="cpu")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_varlen_autograd_with_tensor_offsets(dtype):
    lens_q, lens_k = [4, 0, 9, 3], [6, 2, 9, 0]
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int64)
    q, k, v = leaves([(16, 4, 32), (17, 2, 32), (17, 2, 32)], dtype, seed=11)
    out, lse = flashcore.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
                                   return_lse=True)
    assert not lse.requires_grad and out.requires_grad
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.dtype)
    out.backward(dout)
    r = ref.attention_backward_varlen(*(lib_np(x) for x in (q, k, v, dout)), cu_q.tolist(),
                                      cu_k.tolist(), out=lib_np(out), lse=lse.numpy(), causal=True)
    ref.check_grads([lib_np(x.grad) for x in (q, k, v)], r, dtype)
    assert torch.all(k.grad[6:8] == 0) and torch.all(q.grad[13:] == 0)  # unseen keys, keyless rows


def test_only_the_tensors_that_require_grad_get_one():
    q, k, v = leaves([(1, 8, 2, 16)] * 3, "f32", seed=4)
    k.requires_grad_(False)
    out = flashcore.attention(q, k, v)
    out.sum().backward()  # a broadcast dout, stride 0
    assert q.grad is not None and v.grad is not None and k.grad is None
    r = ref.attention_backward(*(lib_np(x) for x in (q, k, v)), np.ones(out.shape))
    ref.check_grads([q.grad.numpy(), v.grad.numpy()], [r[0], r[2]], "f32", names=("dq", "dv"))


def test_untracked_calls_and_refusals():
    q, k, v = leaves([(1, 8, 2, 16)] * 3, "f32", seed=6)
    with torch.no_grad():
        assert not flashcore.attention(q, k, v).requires_grad
    with pytest.raises(ERR, match=r"^out: not supported when q, k or v require grad"):
        flashcore.attention(q, k, v, out=torch.empty(q.shape))
    out = flashcore.attention(q, k, v)
    g, = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(flashcore.UnsupportedError, match="^double backward: the gradients of flashcore attention"):
        g.sum().backward()
    with torch.no_grad():
        deterministic = flashcore.attention(q, k, v, deterministic=True)
    assert torch.equal(deterministic, out.detach())


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_attention_backward_with_torch_tensors(dtype):
    q, k, v = leaves([(2, 3, 11, 32), (2, 1, 14, 32), (2, 1, 14, 32)], dtype, seed=8, requires_grad=False)
    out, lse = flashcore.attention(q, k, v, layout="bhsd", return_lse=True, window=(5, -1))
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.dtype)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    res = flashcore.attention_backward(dout, q, k, v, out, lse, layout="bhsd", window=(5, -1),
                                       dq=dq, dk=dk, dv=dv)
    assert res[0] is dq and res[1] is dk and res[2] is dv
    r = ref.attention_backward(*(lib_np(x, "bhsd") for x in (q, k, v, dout)), out=lib_np(out, "bhsd"),
                               lse=lse.numpy(), window=(5, -1))
    ref.check_grads([lib_np(x, "bhsd") for x in res], r, dtype)
    leaf = torch.zeros(q.shape, dtype=q.dtype, requires_grad=True)
    with pytest.raises(ERR, match=r"^dq: a leaf tensor that requires grad"):
        flashcore.attention_backward(dout, q, k, v, out, lse, layout="bhsd", dq=leaf)
    with pytest.raises(ERR, match=r"^lse: is a numpy object on cpu but q is a torch"):
        flashcore.attention_backward(dout, q, k, v, out, lse.numpy(), layout="bhsd")
    with pytest.raises(ERR, match=r"^lse: dtype torch.float16"):
        flashcore.attention_backward(dout, q, k, v, out, lse.half(), layout="bhsd")
    assert torch.all(leaf == 0)
