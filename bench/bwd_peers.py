#!/usr/bin/env python3
"""The attention backward beside PyTorch SDPA's flash backward (FA2) and its
cuDNN backward, in one process on the GPU machine.

Per shape: the same bf16 inputs for every system (torch's [B,H,S,D] order;
FlashCore takes it as layout="bhsd", no copy), the forward once (FlashCore's
own forward gives its out and lse; the peers keep their autograd graph), then
each system's backward alone, timed with CUDA events: --warmup-s seconds
of calls, warm-up calls, then --reps calls in rounds alternating the
systems, the median per system.
FlashCore runs in both modes (deterministic 0 and 1). A check per shape:
FlashCore's gradients against FA2's (rel L2). Needs the binding's
flashcore.attention_backward; the library is found as in bench/peers.py.

TFLOP/s = 2.5 x the forward's FLOPs (4*B*Hq*Sq*Sk*D, halved when causal with
Sq == Sk): the backward's five GEMMs against the forward's two.

    python3 bench/bwd_peers.py                 # the default shapes
    python3 bench/bwd_peers.py --shapes B2-H16-S2048-D128-causal --reps 30
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

# name: B, Hq, Hkv, S, D, causal
SHAPES = {
    "B2-H16-S2048-D128": (2, 16, 16, 2048, 128, False),
    "B2-H16-S2048-D128-causal": (2, 16, 16, 2048, 128, True),
    "B4-Hq32-Hkv8-S4096-D128-causal": (4, 32, 8, 4096, 128, True),
    "B4-H16-S2048-D64-causal": (4, 16, 16, 2048, 64, True),
    "B2-H16-S2048-D96": (2, 16, 16, 2048, 96, False),
    "B4-H16-S2048-D32": (4, 16, 16, 2048, 32, False),
}
DEFAULT = "B2-H16-S2048-D128,B2-H16-S2048-D128-causal,B4-Hq32-Hkv8-S4096-D128-causal,B4-H16-S2048-D64-causal"


def flops(B, Hq, S, D, causal):
    f = 4.0 * B * Hq * S * S * D
    return 2.5 * (f / 2 if causal else f)


def torch_system(backend, q, k, v, dout, causal, gqa):
    """A closure running one backward of SDPA with the given backend."""
    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(backend):
        if gqa:
            try:
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=True)
                note = "enable_gqa"
            except RuntimeError:
                # the backend without native GQA: expand K/V (the sum over the
                # group is then part of autograd's backward)
                r = q.shape[1] // k.shape[1]
                out = F.scaled_dot_product_attention(qq, kk.repeat_interleave(r, 1), vv.repeat_interleave(r, 1),
                                                     is_causal=causal)
                note = "K/V expanded"
        else:
            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            note = ""

    def run():
        return torch.autograd.grad(out, (qq, kk, vv), dout, retain_graph=True)
    return run, note


def flashcore_system(fc, q, k, v, dout, causal, det):
    out, lse = fc.attention(q, k, v, causal=causal, layout="bhsd", return_lse=True)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))

    def run():
        return fc.attention_backward(dout, q, k, v, out, lse, causal=causal, layout="bhsd",
                                     deterministic=det, dq=dq, dk=dk, dv=dv)
    return run


def time_systems(systems, reps, warmup, warmup_s):
    """Median seconds per system; first warmup_s seconds of calls (the
    clocks ramp from idle: without it the first shape's figures moved by
    up to 15%), then warmup calls each."""
    import time
    t_end = time.perf_counter() + warmup_s
    while time.perf_counter() < t_end:
        for fn in systems.values():
            fn()
        torch.cuda.synchronize()
    for fn in systems.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in systems}
    names = list(systems)
    for r in range(reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            systems[name]()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) * 1e-3)
    return {name: statistics.median(t) for name, t in times.items()}


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT, help="any of: " + ", ".join(SHAPES))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--warmup-s", type=float, default=2.0, help="seconds of calls before each shape's timing")
    args = ap.parse_args()
    import flashcore as fc
    if not hasattr(fc, "attention_backward"):
        sys.exit("this flashcore binding has no attention_backward (python/flashcore predates the backward)")
    print("device: %s, torch %s, flashcore %s" % (torch.cuda.get_device_name(), torch.__version__, fc.__version__))
    torch.manual_seed(0)
    for name in args.shapes.split(","):
        B, Hq, Hkv, S, D, causal = SHAPES[name]
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        dout = torch.randn_like(q)
        systems, notes = {}, {}
        for sname, det in (("flashcore", False), ("flashcore-det", True)):
            systems[sname] = flashcore_system(fc, q, k, v, dout, causal, det)
        for sname, be in (("torch-flash(FA2)", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                systems[sname], notes[sname] = torch_system(be, q, k, v, dout, causal, Hq != Hkv)
            except RuntimeError as e:
                print("  %s unavailable: %s" % (sname, str(e).splitlines()[0]))
        ours = systems["flashcore"]()
        kernel = fc.last_kernel_info().name
        check = ""
        if "torch-flash(FA2)" in systems:
            ref = systems["torch-flash(FA2)"]()
            check = " vs FA2 rel_l2 dq %.1e dk %.1e dv %.1e" % tuple(rel_l2(a, b) for a, b in zip(ours, ref))
        t = time_systems(systems, args.reps, args.warmup, args.warmup_s)
        f = flops(B, Hq, S, D, causal)
        print("%s [%s]%s" % (name, kernel, check))
        fa2 = t.get("torch-flash(FA2)")
        for sname, sec in t.items():
            print("  %-18s %9.1f us %7.1f TFLOP/s%s%s" % (
                sname, sec * 1e6, f / sec / 1e12,
                "  %.3fx FA2" % (fa2 / sec) if fa2 else "", "  (%s)" % notes[sname] if notes.get(sname) else ""),
                flush=True)


if __name__ == "__main__":
    main()
