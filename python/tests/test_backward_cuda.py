"""The backward on CUDA with torch tensors: attention_backward and autograd
against the float64 CPU reference in both layouts, GQA, masks, softcap,
varlen with device offsets; given gradients poisoned; torch's current
stream; deterministic=True bitwise. Skipped cleanly without torch, a GPU, a
CUDA build, or a CUDA backward in this library."""

import numpy as np
import pytest

import flashcore

import cuda_only
import fc_reference as ref

torch = cuda_only.torch_with_cuda()

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
DEV = torch.device("cuda")
lib_np = ref.torch_to_lib  # float64 numpy in the library's order


def rand(shapes, dtype, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(s, generator=g, device=DEV, dtype=DT[dtype]) for s in shapes]


def require_backward(*args, **kw):
    ok, why = flashcore.attention_backward_supported(*args, **kw)
    if not ok:
        pytest.skip("the CUDA backward does not take this call: %s" % why)


# B, Sq, Sk, Hq, Hkv, D, options
CASES = [
    (2, 128, 128, 4, 4, 64, {}),
    (1, 200, 333, 8, 2, 128, dict(causal=True)),
    (1, 150, 90, 4, 1, 64, dict(causal=True)),   # Sq > Sk: rows with no key
    (2, 97, 97, 4, 2, 128, dict(window=(16, 8), softcap=10.0)),
    (1, 77, 77, 2, 2, 96, dict(causal=True)),
]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", CASES, ids=["plain", "gqa-causal", "sq>sk", "window-softcap", "d96"])
def test_backward_matches_reference(case, dtype, layout):
    B, Sq, Sk, Hq, Hkv, D, opts = case
    if layout == "bhsd":
        shapes = [(B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)]
    else:
        shapes = [(B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)]
    q, k, v = rand(shapes, dtype, seed=Sq + D)
    out, lse = flashcore.attention(q, k, v, layout=layout, return_lse=True, **opts)
    dout, = rand([out.shape], dtype, seed=3)
    require_backward(dout, q, k, v, out, lse, layout=layout, **opts)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    flashcore.attention_backward(dout, q, k, v, out, lse, layout=layout, dq=dq, dk=dk, dv=dv, **opts)
    torch.cuda.synchronize()
    assert flashcore.kernel_info.backend == "cuda"
    r = ref.attention_backward(*(lib_np(x, layout) for x in (q, k, v, dout)), out=lib_np(out, layout),
                               lse=lse.cpu().numpy(), **opts)
    ref.check_grads([lib_np(x, layout) for x in (dq, dk, dv)], r, dtype, "cuda")
    ref.check_unseen_zero(*(lib_np(x, layout) for x in (dq, dk, dv)), **opts)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_autograd_on_cuda(dtype):
    q, k, v = (x.requires_grad_() for x in rand([(2, 8, 160, 64), (2, 2, 200, 64), (2, 2, 200, 64)],
                                                 dtype, seed=9))
    with torch.no_grad():
        o, lse = flashcore.attention(q, k, v, layout="bhsd", causal=True, return_lse=True)
    dout, = rand([o.shape], dtype, seed=10)
    require_backward(dout, q, k, v, o, lse, layout="bhsd", causal=True)
    out = flashcore.attention(q, k, v, layout="bhsd", causal=True)
    out.backward(dout)
    torch.cuda.synchronize()
    # o, lse: what the recorded forward gave the backward (same kernel, same inputs)
    r = ref.attention_backward(*(lib_np(x, "bhsd") for x in (q, k, v, dout)), out=lib_np(o, "bhsd"),
                               lse=lse.cpu().numpy(), causal=True)
    ref.check_grads([lib_np(x.grad, "bhsd") for x in (q, k, v)], r, dtype, "cuda")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_varlen_backward_with_device_offsets(dtype):
    lens_q, lens_k = [3, 0, 130, 64, 20], [10, 5, 130, 200, 0]
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32, device=DEV)
    q, k, v = rand([(sum(lens_q), 8, 128), (sum(lens_k), 2, 128), (sum(lens_k), 2, 128)], dtype, seed=5)
    opts = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, max_seqlen_q=max(lens_q),
                max_seqlen_k=max(lens_k))
    out, lse = flashcore.attention(q, k, v, return_lse=True, **opts)
    dout, = rand([out.shape], dtype, seed=6)
    require_backward(dout, q, k, v, out, lse, **opts)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
    flashcore.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, **opts)
    torch.cuda.synchronize()
    r = ref.attention_backward_varlen(*(lib_np(x) for x in (q, k, v, dout)), cu_q.tolist(),
                                      cu_k.tolist(), out=lib_np(out), lse=lse.cpu().numpy(), causal=True)
    ref.check_grads([lib_np(x) for x in (dq, dk, dv)], r, dtype, "cuda")
    assert torch.all(dk[10:15] == 0) and torch.all(dv[10:15] == 0)  # the sequence with no query
    assert torch.all(dq[cu_q[-2]:] == 0)                              # the sequence with no key


def test_current_stream_and_deterministic():
    q, k, v = rand([(2, 256, 8, 64), (2, 256, 2, 64), (2, 256, 2, 64)], "bf16", seed=1)
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    dout, = rand([out.shape], "bf16", seed=2)
    require_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    first = flashcore.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # dout made on the side stream right before the call: only a call
        # queued on the same (current) stream is ordered after it.
        dout2 = dout * 1.0
        again = flashcore.attention_backward(dout2, q, k, v, out, lse, causal=True, deterministic=True)
    side.synchronize()
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    r = ref.attention_backward(*(lib_np(x) for x in (q, k, v, dout)), out=lib_np(out),
                               lse=lse.cpu().numpy(), causal=True)
    ref.check_grads([lib_np(x) for x in first], r, "bf16", "cuda")


def test_cuda_refusals():
    q, k, v = rand([(1, 16, 2, 64)] * 3, "bf16", seed=4)
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    with pytest.raises(flashcore.InvalidArgumentError, match=r"^lse: is a torch object on cpu but q"):
        flashcore.attention_backward(out, q, k, v, out, lse.cpu())
    with pytest.raises(flashcore.InvalidArgumentError, match=r"^dq: is a torch object on cpu but q"):
        flashcore.attention_backward(out, q, k, v, out, lse, dq=torch.empty(q.shape, dtype=q.dtype))
    with pytest.raises(flashcore.InvalidArgumentError, match="CPU backends read host memory"):
        flashcore.attention_backward(out, q, k, v, out, lse, backend="cpu")
