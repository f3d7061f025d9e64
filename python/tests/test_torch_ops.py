"""The torch custom ops on the CPU: torch.library.opcheck (schema, fake
tensors, autograd registration, AOT dispatch), torch.compile(fullgraph=True)
of a small model calling flashcore.attention, flash_attn_func and
scaled_dot_product_attention (no graph break; outputs and gradients equal
to eager), meta tensors, and the routing between the op and the direct
call. Skipped without torch."""

import os
import subprocess
import sys
import textwrap

import pytest

import flashcore

torch = pytest.importorskip("torch")
# flashcore was imported before torch here: what flashcore/__init__ does for
# torch users who import it after torch (else the first compiled call of a
# function is compiled twice: test_compile_when_flashcore_was_imported_before_torch).
_torch_ops = flashcore._attention._torch_ops()

OPS = torch.ops.flashcore


from op_options import options  # noqa: E402  (needs torch)


def rand(*shapes, seed, grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_(grad) for s in shapes]


def opcheck_cases():
    q, k, v = rand((2, 9, 4, 16), (2, 12, 2, 16), (2, 12, 2, 16), seed=1)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in rand(
        (2, 7, 2, 32), (2, 7, 2, 32), (2, 7, 2, 32), seed=2))  # [B,H,S,D] views of [B,S,H,D]
    cu_q = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 8, 8], dtype=torch.int32)
    qv, kv, vv = rand((10, 4, 16), (8, 2, 16), (8, 2, 16), seed=3)
    return {
        "causal-gqa": (q, k, v, options(causal=True)),
        "bhsd-window-softcap": (qt, kt, vt, options(bhsd=True, window_left=2, window_right=1,
                                                    softcap=3.0, scale=0.2)),
        "varlen": (qv, kv, vv, options(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=7,
                                       max_seqlen_k=5, causal=True)),
    }


@pytest.mark.parametrize("name", list(opcheck_cases()))
def test_opcheck(name):
    q, k, v, opts = opcheck_cases()[name]
    res = torch.library.opcheck(OPS.attention_fwd.default, (q, k, v) + opts)
    assert set(res.values()) == {"SUCCESS"}, res
    with torch.no_grad():
        out, lse = OPS.attention_fwd(q, k, v, *opts)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    args = tuple(x.detach() for x in (dout, q, k, v, out, lse))
    res = torch.library.opcheck(OPS.attention_bwd.default, args + opts)
    assert set(res.values()) == {"SUCCESS"}, res


class TinyDecoder(torch.nn.Module):
    """Two attention layers through the three entry points, with projections."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.d)
        self.proj = torch.nn.Linear(dim, dim)

    def split(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        return q.view(B, S, self.h, self.d), k.view(B, S, self.kvh, self.d), v.view(B, S, self.kvh, self.d)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.split(x)
        a = flashcore.flash_attn_func(q, k, v, causal=True, softcap=20.0)
        b = flashcore.attention(q, k, v, window=(3, 0))
        c = flashcore.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                   v.transpose(1, 2), is_causal=True, enable_gqa=True)
        y = a + b + c.transpose(1, 2)
        return self.proj(y.reshape(B, S, -1))


def run_model(model, x):
    model.zero_grad()
    y = model(x)
    y.square().mean().backward()
    return y.detach(), [p.grad.clone() for p in model.parameters()]


def test_compile_fullgraph_no_graph_break():
    torch.manual_seed(0)
    model, x = TinyDecoder(), torch.randn(2, 11, 32)
    explain = torch._dynamo.explain(model)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1
    ops = [str(n.target) for g in explain.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum(op.startswith("flashcore.attention_fwd") for op in ops) == 3
    y0, g0 = run_model(model, x)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    y1, g1 = run_model(compiled, x)
    # The same kernels run in both (the CPU paths are deterministic).
    assert torch.equal(y0, y1)
    for a, b in zip(g0, g1):
        assert torch.equal(a, b)


def test_compile_dynamic_shapes():
    # One graph for every sequence length: the fake implementation's shapes
    # are symbolic, varlen's max_seqlen a SymInt.
    def f(q, k, v, cu, mx):
        a = flashcore.flash_attn_func(q, k, v, causal=True)
        b = flashcore.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, mx, mx, causal=True)
        return a[0] + b

    from torch._dynamo.testing import CompileCounterWithBackend
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend=counter)
    compiles = []
    for S in (7, 12, 5):
        q, k, v = rand((1, S, 2, 16), (1, S, 2, 16), (1, S, 2, 16), seed=S)
        cu = torch.tensor([0, S - 2, S], dtype=torch.int32)
        got = compiled(q, k, v, cu, S - 2)
        got.sum().backward()
        assert torch.equal(got, f(q, k, v, cu, S - 2))
        compiles.append(counter.frame_count)
    assert compiles[0] >= 1 and compiles[1:] == compiles[:1] * 2  # no recompile for a new S


def test_compile_inductor_matches_eager():
    # Inductor fuses the projections around the ops, so the results agree
    # to float32 rounding, not bitwise.
    torch.manual_seed(1)
    model, x = TinyDecoder(), torch.randn(1, 9, 32)
    y0, g0 = run_model(model, x)
    y1, g1 = run_model(torch.compile(model, fullgraph=True), x)
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_compile_when_flashcore_was_imported_before_torch():
    # The ops register on the first call with torch tensors, here while
    # dynamo traces it.
    code = textwrap.dedent("""
        import flashcore
        import torch
        def f(q, k, v):
            return flashcore.flash_attn_func(q, k, v, causal=True).sum()
        q = torch.randn(1, 6, 2, 16, requires_grad=True)
        y = torch.compile(f, fullgraph=True, backend="aot_eager")(q, q, q)
        y.backward()
        assert torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_meta_tensors_give_shapes():
    q = torch.empty(2, 5, 4, 16, device="meta")
    k = torch.empty(2, 9, 2, 16, device="meta")
    out, lse = flashcore.attention(q, k, k, return_lse=True)
    assert out.device.type == "meta" and out.shape == q.shape and lse.shape == (2, 4, 5)
    assert lse.dtype == torch.float32
    qb = torch.empty(2, 4, 5, 16, device="meta", dtype=torch.bfloat16)
    kb = torch.empty(2, 2, 9, 16, device="meta", dtype=torch.bfloat16)
    out, lse = flashcore.attention(qb, kb, kb, layout="bhsd", return_lse=True)
    assert out.shape == qb.shape and out.dtype == torch.bfloat16 and lse.shape == (2, 4, 5)
    qv = torch.empty(13, 4, 16, device="meta")
    out, lse = flashcore.attention(qv, qv[:, :2], qv[:, :2], cu_seqlens_q=torch.tensor([0, 13]),
                                   cu_seqlens_k=torch.tensor([0, 13]), return_lse=True)
    assert out.shape == qv.shape and lse.shape == (4, 13)
    assert flashcore.scaled_dot_product_attention(qb, kb, kb, is_causal=True, enable_gqa=True).shape == qb.shape


def test_bhsd_outputs_are_bshd_memory():
    """New bhsd outputs (out, dq, dk, dv) are [B,H,S,D] views of [B,S,H,D]
    memory, as SDPA's out, on every path: the direct call (full and kept),
    the op, its fake; bshd ones are contiguous."""
    q, k, v = rand((2, 4, 7, 16), (2, 2, 9, 16), (2, 2, 9, 16), seed=20)  # [B,H,S,D], contiguous

    def bshd_memory(x):
        return x.transpose(1, 2).is_contiguous()

    with torch.no_grad():
        for _ in range(2):  # the second call is the kept one
            assert bshd_memory(flashcore.attention(q, k, v, layout="bhsd"))
            qb, kb, vb = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            assert flashcore.attention(qb, kb, vb, layout="bshd").is_contiguous()
            assert all(bshd_memory(g) for g in flashcore.attention_backward(
                torch.randn(q.shape), q, k, v, *flashcore.attention(q, k, v, layout="bhsd", return_lse=True),
                layout="bhsd"))
    out = flashcore.attention(q, k, v, layout="bhsd")  # recorded: the op
    grads = torch.autograd.grad(out.sum(), (q, k, v))  # (x.grad would take x's strides)
    assert bshd_memory(out) and all(bshd_memory(g) for g in grads)
    plain = [x.detach() for x in (q, k, v)]
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(x) for x in plain)
        fo, flse = torch.ops.flashcore.attention_fwd(fq, fk, fv, *options(bhsd=True))
        assert bshd_memory(fo) and flse.is_contiguous()
        assert all(bshd_memory(g) for g in torch.ops.flashcore.attention_bwd(fo, fq, fk, fv, fo, flse,
                                                                             *options(bhsd=True)))


def test_routing():
    q, k, v = rand((1, 6, 2, 16), (1, 6, 2, 16), (1, 6, 2, 16), seed=5)
    out = flashcore.attention(q, k, v)
    name = out.grad_fn.name()  # recorded through the op: its C++ formula or register_autograd's
    assert "flashcore::AttentionBackward" in name or "flashcore_attention_fwd" in name
    with torch.no_grad():
        direct = flashcore.attention(q, k, v)
    assert direct.grad_fn is None and torch.equal(direct, out.detach())
    assert not _torch_ops.routes(q.detach(), k.detach(), v.detach())
    with pytest.raises(flashcore.InvalidArgumentError, match=r"^out: not supported when"):
        flashcore.attention(q, k, v, out=torch.empty(q.shape))
    with pytest.raises(flashcore.InvalidArgumentError, match=r"^window: expected \(left, right\)"):
        flashcore.attention(q, k, v, window=4)


def test_op_errors_are_the_binding_errors():
    q, k, v = rand((1, 6, 4, 16), (1, 6, 3, 16), (1, 6, 3, 16), seed=6)
    with pytest.raises(flashcore.InvalidArgumentError, match="heads_q 4 is not a multiple of heads_kv 3"):
        flashcore.attention(q, k, v)
