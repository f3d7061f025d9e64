"""The torch ops on CUDA: torch's current stream (forward and backward on a
side stream), CUDA graph capture of the op, torch.compile with inductor and
with CUDA graphs (mode="reduce-overhead") against eager, and the drop-in
signatures against torch's SDPA. Skipped cleanly without torch, a GPU or a
CUDA build."""

import pytest

import flashcore

import cuda_only
import fc_reference as ref

torch = cuda_only.torch_with_cuda()
from flashcore import _torch_ops  # noqa: E402  (needs torch)

DEV = torch.device("cuda")
lib_np = ref.torch_to_lib


def rand(shapes, seed, grad=False):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(s, generator=g, device=DEV, dtype=torch.bfloat16).requires_grad_(grad)
            for s in shapes]


def step(q, k, v, dout):
    """Forward and backward through flash_attn_func, deterministic."""
    for x in (q, k, v):
        x.grad = None
    out = flashcore.flash_attn_func(q, k, v, causal=True, deterministic=True)
    out.backward(dout)
    return out.detach(), [x.grad for x in (q, k, v)]


def test_forward_and_backward_on_a_side_stream():
    q, k, v = rand([(2, 200, 8, 64), (2, 300, 2, 64), (2, 300, 2, 64)], seed=1, grad=True)
    dout, = rand([(2, 200, 8, 64)], seed=2)
    expect = step(q, k, v, dout)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Inputs produced on the side stream just before the call: only work
        # queued on the same (current) stream is ordered after them.
        got = step(*(x.detach().mul(1.0).requires_grad_() for x in (q, k, v)), dout.mul(1.0))
    side.synchronize()
    assert torch.equal(got[0], expect[0])
    for a, b in zip(got[1], expect[1]):
        assert torch.equal(a, b)


def test_graph_capture_of_the_op():
    q, k, v = rand([(1, 256, 8, 128), (1, 256, 8, 128), (1, 256, 8, 128)], seed=3)
    opts = tuple(_torch_ops.Options(None, None, -1, -1, 0.0, 0.0, True, -1, -1, False, "auto", 0, False))
    expect, _ = torch.ops.flashcore.attention_fwd(q, k, v, *opts)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch advises
        torch.ops.flashcore.attention_fwd(q, k, v, *opts)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        out, lse = torch.ops.flashcore.attention_fwd(q, k, v, *opts)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect)


class Block(torch.nn.Module):
    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.h, self.d = heads, dim // heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.h, self.d).transpose(1, 3).unbind(2)
        y = flashcore.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, S, -1))


def test_compile_inductor_and_cudagraphs():
    torch.manual_seed(0)
    model = Block().to(DEV, torch.bfloat16)
    x = torch.randn(2, 128, 256, device=DEV, dtype=torch.bfloat16)
    y0 = model(x)
    y0.float().square().mean().backward()
    g0 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)
    y1 = compiled(x)
    y1.float().square().mean().backward()
    # Inductor fuses the projections around the op: bf16 rounding, not bits.
    torch.testing.assert_close(y1, y0, rtol=2e-2, atol=2e-2)
    for p, g in zip(model.parameters(), g0):
        torch.testing.assert_close(p.grad, g, rtol=5e-2, atol=5e-2)
    with torch.no_grad():
        graphed = torch.compile(model, fullgraph=True, mode="reduce-overhead")
        for _ in range(3):  # recorded, then replayed
            y2 = graphed(x)
        torch.testing.assert_close(y2, y0.detach(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("L,S", [(128, 128), (200, 90), (90, 200)])
def test_sdpa_matches_torch_sdpa_cuda(L, S):
    q, k, v = rand([(2, 8, L, 64), (2, 2, S, 64), (2, 2, S, 64)], seed=L + S)
    out = flashcore.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(x.double() for x in (q, k, v)), is_causal=True, enable_gqa=True)
    ref.check(lib_np(out, "bhsd"), None, lib_np(want, "bhsd"), None, "bf16")
