#!/usr/bin/env python3
"""Where the CUDA backward's error gates come from: PyTorch's own backward
(SDPA's flash kernel, FA2, fp32 accumulation like ours) against a float64
reference on the same inputs, beside FlashCore's backward on those inputs.

Cases: fixed shapes plus random ones drawn like tests/test_cuda_backward.c
within what SDPA's flash kernel takes (head dims 32-128, GQA, odd and
unequal lengths, causal with Sq == Sk, a scale, inputs N(0,1) or 3 N(0,1),
dout N(0,1)), and Sq = Sk = 1, where dq and dk are exactly 0 and only
fp32 cancellation noise is left. The reference (per system): the float64
gradient formulas on the GPU with D from the out that system's forward gave,
as the kit's reference backward takes out (tools/kit_bwd.c), rounded to the
dtype as the kit's is; then per gradient the kit's metrics: max_rel =
max|g - ref| / max|ref| (max|g - ref| where the reference is all 0) and
rel_l2 = ||g - ref|| / ||ref||, and the largest |g| where the reference is
exactly 0. The last lines give, per dtype, the worst of each over cases and
gradients for PyTorch and for FlashCore, and 1.5x PyTorch's: the CUDA rows
of kit_bwd_gate_for.

    python3 bench/bwd_gates.py [--cases N]   # GPU machine, torch with CUDA
FlashCore is found as in bench/peers.py (python/, FLASHCORE_LIBRARY); without
it only PyTorch's figures are printed.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

SHAPES = [  # B, Hq, Hkv, Sq, Sk, D, causal
    (2, 4, 4, 128, 128, 64, False), (2, 4, 4, 512, 512, 64, True), (1, 4, 4, 1000, 1000, 64, False),
    (2, 4, 4, 256, 256, 128, False), (1, 4, 4, 1024, 1024, 128, True), (1, 2, 2, 2048, 2048, 128, False),
    (2, 4, 4, 300, 300, 96, True), (2, 4, 4, 512, 512, 32, False),
    # one key per row: dq = dk = 0 exactly, what is left is fp32 noise
    (16, 32, 32, 1, 1, 32, False), (16, 32, 32, 1, 1, 64, False), (16, 32, 32, 1, 1, 128, False),
    (16, 32, 8, 1, 1, 96, False),
]
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def random_case(rng):
    """(B, Hq, Hkv, Sq, Sk, D, causal, scale, input_scale) like the C test's draw."""
    lens = [1, 2, 17, 33, 64, 100, 127, 128, 129, 255, 300, 512, 1000, 1023, 2048]
    r = lambda n: int(rng.integers(n))  # noqa: E731
    hkv = 1 + r(3)
    hq = hkv * [1, 1, 1, 2, 4, 8][r(6)]
    sq = lens[r(15)]
    causal = r(3) == 0
    sk = sq if causal or r(3) == 0 else lens[r(15)]
    d = [32, 64, 64, 96, 128, 128, 128][r(7)]
    b = 1 + r(3)
    scale = 0.02 + 0.04 * r(8) if r(5) == 0 else None
    while 2.0 * b * hq * sq * sk * d > 4e8:  # keeps the float64 reference small
        if b > 1:
            b -= 1
        else:
            sq, sk = max(1, sq // 2), max(1, sk // 2)
    return b, hq, hkv, sq, sk, d, causal, scale, 3.0 if r(12) == 0 else 1.0


def reference(q, k, v, dout, out, causal, scale):
    """float64 gradients ([B,H,S,D], K/V heads shared by groups of query
    heads) as the kit's reference computes them: P exact, D = rowsum(dout *
    out) with the out the system's own forward gave (what its backward reads;
    where the softmax is nearly one-hot, dP - D cancels and the rounding of
    out is the whole difference)."""
    g = q.shape[1] // k.shape[1]
    q, k, v, dout, out = (x.double() for x in (q, k, v, dout, out))
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    sc = scale if scale else q.shape[-1] ** -0.5
    s = q @ kk.transpose(-1, -2) * sc
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    dv = p.transpose(-1, -2) @ dout
    ds = p * (dout @ vv.transpose(-1, -2) - (dout * out).sum(-1, keepdim=True))
    dq, dk = sc * ds @ kk, sc * ds.transpose(-1, -2) @ q
    fold = lambda x: x.unflatten(1, (k.shape[1], g)).sum(2)  # noqa: E731
    return dq, fold(dk), fold(dv)


def metrics(got, ref):
    """max_rel, rel_l2, largest |got| where ref == 0 (ref: rounded, as float64)."""
    e = (got.double() - ref).abs()
    rmax, rnorm = ref.abs().max().item(), ref.norm().item()
    zero = got.double().abs()[ref == 0]
    return (e.max().item() / rmax if rmax > 0 else e.max().item(),
            e.norm().item() / rnorm if rnorm > 0 else e.norm().item(),
            zero.max().item() if zero.numel() else 0.0)


def torch_flash(q, k, v, dout, causal, scale):
    """(out, (dq, dk, dv)) of SDPA's flash kernel."""
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
    return out.detach(), torch.autograd.grad(out, (q, k, v), dout)


def flashcore_grads(fc, q, k, v, dout, causal, scale):
    out, lse = fc.attention(q, k, v, causal=causal, scale=scale, layout="bhsd", return_lse=True)
    return out, fc.attention_backward(dout, q, k, v, out, lse, causal=causal, scale=scale, layout="bhsd",
                                      deterministic=True)


def main():
    import argparse
    import numpy as np
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=40, help="random cases per dtype")
    args = ap.parse_args()
    try:
        import flashcore as fc
        fc.attention_backward  # noqa: B018 (the binding with the backward)
    except Exception as e:  # noqa: BLE001
        print("flashcore unavailable: %s" % e)
        fc = None
    worst = {}
    gen = torch.Generator(device="cuda").manual_seed(1)
    rng = np.random.default_rng(7)
    for dname, dt in DTYPES.items():
        cases = [c + (None, 1.0) for c in SHAPES] + [random_case(rng) for _ in range(args.cases)]
        for (B, Hq, Hkv, Sq, Sk, D, causal, scale, isc) in cases:
            q = (torch.randn(B, Hq, Sq, D, device="cuda", generator=gen) * isc).to(dt)
            k, v = ((torch.randn(B, Hkv, Sk, D, device="cuda", generator=gen) * f).to(dt) for f in (isc, 1.0))
            dout = torch.randn(B, Hq, Sq, D, device="cuda", generator=gen).to(dt)
            systems = {"torch-flash": torch_flash(q, k, v, dout, causal, scale)}
            if fc is not None:
                systems["flashcore"] = flashcore_grads(fc, q, k, v, dout, causal, scale)
            for name, (out, grads) in systems.items():
                ref = [r.to(dt).double() for r in reference(q, k, v, dout, out, causal, scale)]
                row = []
                for gname, g, r in zip(("dq", "dk", "dv"), grads, ref):
                    mr, l2, z = metrics(g, r)
                    w = worst.setdefault((dname, name), [0.0, 0.0, 0.0])
                    w[0], w[1], w[2] = max(w[0], mr), max(w[1], l2), max(w[2], z)
                    row.append("%s %.2e %.2e %.1e" % (gname, mr, l2, z))
                print("%-4s B%d H%d/%d S%d/%d D%d%s%s%s %-11s %s" % (
                    dname, B, Hq, Hkv, Sq, Sk, D, " causal" if causal else "", " scale" if scale else "",
                    " x%g" % isc if isc != 1 else "", name, " | ".join(row)), flush=True)
    print("\ncolumns: max_rel rel_l2 max|g| where ref == 0")
    for (dname, name), (mr, l2, z) in sorted(worst.items()):
        print("worst %-4s %-11s max_rel %.3e rel_l2 %.3e zero-ref %.3e" % (dname, name, mr, l2, z))
    for dname in DTYPES:
        mr, l2, z = worst[(dname, "torch-flash")]
        print("gate  %-4s = 1.5 x torch-flash: max_rel %.2e rel_l2 %.2e atol %.2e" % (dname, 1.5 * mr, 1.5 * l2, 1.5 * z))


if __name__ == "__main__":
    main()
