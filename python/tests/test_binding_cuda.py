"""The binding on CUDA with torch tensors: bf16/f16 against the float64 CPU
reference and against torch SDPA in fp32, both layouts, both CUDA paths,
lse, varlen, use of torch's current stream (graph capture on a side stream
fails if the library used another), device checks. Skipped cleanly without
torch, without a GPU, or with a library built without CUDA."""

import numpy as np
import pytest

import flashcore

import cuda_only
import fc_reference as ref

torch = cuda_only.torch_with_cuda()

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
DEV = torch.device("cuda")
lib_np = ref.torch_to_lib  # float64 numpy in the library's order


def qkv(B, Sq, Sk, Hq, Hkv, D, dtype, layout, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    if layout == "bhsd":
        shapes = [(B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D)]
    else:
        shapes = [(B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)]
    return [torch.randn(s, generator=g, device=DEV, dtype=DT[dtype]) for s in shapes]


def sdpa_fp32(q, k, v, causal, layout):
    """torch's math SDPA on fp32 upcasts, in the library's order."""
    to_bhsd = (lambda t: t) if layout == "bhsd" else (lambda t: t.transpose(1, 2))
    Q, K, V = (to_bhsd(t).float() for t in (q, k, v))
    if K.shape[1] != Q.shape[1]:
        rep = Q.shape[1] // K.shape[1]
        K, V = K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1)
    Sq, Sk = Q.shape[2], K.shape[2]
    mask = None
    if causal:  # bottom-right aligned, as the library
        mask = torch.from_numpy(ref.visible_mask(Sq, Sk, causal=True)).to(DEV)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.MATH]):
            o = torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return o.transpose(1, 2).double().cpu().numpy()


def paths():
    return [None, 80, 90]


CASES = [  # B, Sq, Sk, Hq, Hkv, D, causal
    (2, 128, 128, 4, 4, 64, False),
    (1, 200, 333, 8, 2, 128, True),
    (3, 1, 513, 8, 8, 128, False),   # decode-like
    (1, 77, 77, 2, 2, 256, True),
]


@pytest.mark.parametrize("cuda_path", paths(), ids=["auto", "sm80", "sm90"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("case", CASES, ids=["plain", "gqa-causal", "decode", "d256-causal"])
def test_matches_references(case, dtype, layout, cuda_path):
    B, Sq, Sk, Hq, Hkv, D, causal = case
    q, k, v = qkv(B, Sq, Sk, Hq, Hkv, D, dtype, layout, seed=Sq * 7 + D)
    ok, why = flashcore.supported(q, k, v, causal=causal, layout=layout, cuda_path=cuda_path)
    if not ok:
        assert why, "unsupported without a reason"
        pytest.skip("cuda_path %s: %s" % (cuda_path, why))
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    res, lse = flashcore.attention(q, k, v, causal=causal, layout=layout, out=out, return_lse=True,
                                   cuda_path=cuda_path)
    assert res is out and lse.device == q.device and lse.shape == (B, Hq, Sq)
    torch.cuda.synchronize()
    info = flashcore.kernel_info
    assert info.backend == "cuda" and info.name
    r_out, r_lse = ref.attention(lib_np(q, layout), lib_np(k, layout), lib_np(v, layout), causal=causal)
    ref.check(lib_np(out, layout), lse.cpu().numpy(), r_out, r_lse, dtype)
    s_out = sdpa_fp32(q, k, v, causal, layout)
    assert ref.rel_l2(lib_np(out, layout), s_out) <= ref.GATES[dtype]["rel_l2"]


def test_current_stream_and_graph_capture():
    q, k, v = qkv(2, 256, 256, 8, 8, 64, "bf16", "bshd", seed=1)
    out = torch.empty_like(q)
    expect = flashcore.attention(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Produce the input on the side stream right before the call: only a
        # call queued on the same (current) stream is ordered after it.
        q2 = q * 1.0
        r = flashcore.attention(q2, k, v, causal=True)
    side.synchronize()
    assert torch.equal(r, expect)
    # Capturing: a launch on any stream but the capturing one breaks the capture.
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        flashcore.attention(q, k, v, causal=True, out=out)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_varlen_cuda(dtype):
    lens_q, lens_k = [3, 0, 130, 64], [10, 5, 130, 200]
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(5)
    q = torch.randn(sum(lens_q), 8, 128, generator=g, device=DEV, dtype=DT[dtype])
    k = torch.randn(sum(lens_k), 2, 128, generator=g, device=DEV, dtype=DT[dtype])
    v = torch.randn(sum(lens_k), 2, 128, generator=g, device=DEV, dtype=DT[dtype])
    ok, why = flashcore.supported(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    if not ok:
        pytest.skip(why)
    out, lse = flashcore.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True,
                                   max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), return_lse=True)
    torch.cuda.synchronize()
    r_out, r_lse = ref.attention_varlen(lib_np(q, "bshd"), lib_np(k, "bshd"), lib_np(v, "bshd"),
                                        cu_q.tolist(), cu_k.tolist(), causal=True)
    ref.check(lib_np(out, "bshd"), lse.cpu().numpy(), r_out, r_lse, dtype)


def test_device_and_backend_checks():
    q, k, v = qkv(1, 16, 16, 2, 2, 64, "bf16", "bshd", seed=2)
    with pytest.raises(flashcore.InvalidArgumentError, match="k: is on cpu but q is on cuda"):
        flashcore.attention(q, k.cpu(), v)
    with pytest.raises(flashcore.InvalidArgumentError, match="CPU backends read host memory"):
        flashcore.attention(q, k, v, backend="cpu")
    with pytest.raises(flashcore.InvalidArgumentError, match="out: is a torch object on cpu"):
        flashcore.attention(q, k, v, out=torch.empty(q.shape, dtype=q.dtype))
    with pytest.raises(flashcore.InvalidArgumentError, match="numpy"):
        flashcore.attention(q, k.cpu().float().numpy(), v)
    assert "sm_" in flashcore.device_info()


def test_cuda_input_classes():
    q, k, v = qkv(1, 16, 16, 2, 2, 64, "bf16", "bshd", seed=3)
    # A dense call without query rows is an empty result, as on the CPU.
    e = q[:, :0]
    out, lse = flashcore.attention(e, k, v, return_lse=True)
    assert out.shape == e.shape and out.device == q.device and lse.shape == (1, 2, 0)
    assert flashcore.attention(q[:0], k[:0], v[:0]).shape == (0, 16, 2, 64)
    # Device cu_seqlens must end at the token count; the binding reads them in
    # the one sync that finds max_seqlen.
    cu_q = torch.tensor([0, 10], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 16], dtype=torch.int32, device=DEV)
    with pytest.raises(flashcore.InvalidArgumentError,
                       match="^cu_seqlens_q: the last offset is 10 but the tensor has 16 tokens"):
        flashcore.attention(q[0], k[0], v[0], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    wrapped = torch.tensor([0, 2**32 + 16], dtype=torch.int64, device=DEV)
    with pytest.raises(flashcore.InvalidArgumentError, match="^cu_seqlens_q: values do not fit int32"):
        flashcore.attention(q[0], k[0], v[0], cu_seqlens_q=wrapped, cu_seqlens_k=cu_k)
    leaf = torch.zeros_like(q, requires_grad=True)
    with pytest.raises(flashcore.InvalidArgumentError, match="^out: a leaf tensor that requires grad"):
        flashcore.attention(q, k, v, out=leaf)
    full = torch.tensor([0, 16], dtype=torch.int32, device=DEV)
    out = flashcore.attention(q[0], k[0], v[0], cu_seqlens_q=full, cu_seqlens_k=cu_k)
    torch.cuda.synchronize()
    r_out, _ = ref.attention(lib_np(q, "bshd"), lib_np(k, "bshd"), lib_np(v, "bshd"))
    ref.check(lib_np(out, "bshd"), None, r_out[0], None, "bf16")
