"""CPU benchmark: FlashCore's CPU path (backend="cpu") beside torch's CPU
scaled_dot_product_attention, forward and backward, on the same inputs, in
one process.

    python3 bench/cpu_peers.py [--repeats N] [--pass fwd,bwd]
                               [--shapes mission,...] [--dtypes float32,...] [--json FILE]

Needs the binding (PYTHONPATH=python, FLASHCORE_LIBRARY=.../libflashcore.so)
and torch. Rows: each shape non-causal, and causal where Sq == Sk (FlashCore's
bottom-right causal is torch's top-left is_causal there), in float32, float16
and bfloat16; the backward skips decode shapes (Sq == 1).

Method: per row, one call of each system gives the correctness figures
(relative L2 of FlashCore's out, or dq/dk/dv, against torch's) and sizes the
blocks. Then --repeats rounds of one block per system, in ABBA order (fc,
torch, torch, fc, ...), a 0.05 s pause before each block: a block is one
untimed warm-up call and then timed calls of that system only (about 0.2 s
of them, 1 to 20), so neither system's worker threads (torch's OpenMP ones
spin on after a call) run into the other's timed calls. Reported: the median
over all timed calls of each system; flashcore / torch speed = torch ms /
flashcore ms (above 1: FlashCore is faster). The forward times one attention
call; the backward times flashcore.attention_backward on the out and lse of
its own forward against torch.autograd.grad on an SDPA forward recorded once
(retain_graph=True). FLOPs: forward 4*B*Hq*Sq*Sk*D, halved when causal;
backward 2.5x the forward's. Threads: torch.get_num_threads(), FlashCore
its default (one per online core). The defaults run the full table in a few
minutes on 2 cores."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

import flashcore

# name, B, Hq, Hkv, Sq, Sk, D
SHAPES = [
    ("mission", 1, 8, 8, 512, 512, 64),
    ("s1k-d128", 1, 8, 8, 1024, 1024, 128),
    ("gqa-decode/b4", 4, 32, 8, 1, 8192, 128),
]
DTYPES = ["float32", "float16", "bfloat16"]
PASSES = ["fwd", "bwd"]
ISA_FLAGS = ["avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
BLOCK_S = 0.2     # timed seconds per block, aimed at
MAX_CALLS = 20    # timed calls per block, at most
PAUSE_S = 0.05    # sleep before each block


def cases():
    """(row name, (B, Hq, Hkv, Sq, Sk, D), causal): each shape, and its causal row where Sq == Sk."""
    for name, *dims in SHAPES:
        yield name, tuple(dims), False
        if dims[3] == dims[4]:
            yield name + "-causal", tuple(dims), True


def flops(dims, causal, pass_):
    B, Hq, _, Sq, Sk, D = dims
    f = 4.0 * B * Hq * Sq * Sk * D / (2 if causal else 1)
    return 2.5 * f if pass_ == "bwd" else f


def inputs(dims, dtype):
    """q, k, v, dout in [B, S, H, D] (FlashCore's bshd), from one seeded generator."""
    B, Hq, Hkv, Sq, Sk, D = dims
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, S, H, D, generator=g).to(getattr(torch, dtype))
            for S, H in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv), (Sq, Hq))]


def sdpa(q, k, v, causal):
    """torch's SDPA on bshd tensors (seen as bhsd through a transpose), out in bshd."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                          enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)


def forward_calls(q, k, v, dout, causal):
    """(flashcore, torch) callables, each returning (out,); dout is unused (backward_calls' signature)."""
    return (lambda: (flashcore.attention(q, k, v, causal=causal, backend="cpu"),),
            lambda: (sdpa(q, k, v, causal),))


def backward_calls(q, k, v, dout, causal):
    """(flashcore, torch) callables, each returning (dq, dk, dv); the forwards run here, once."""
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True, backend="cpu")
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out_t = sdpa(*leaves, causal)
    return (lambda: flashcore.attention_backward(dout, q, k, v, out, lse, causal=causal, backend="cpu"),
            lambda: torch.autograd.grad(out_t, leaves, dout, retain_graph=True))


def timed(fn):
    t = time.perf_counter()
    res = fn()
    return res, time.perf_counter() - t


def block(fn, n):
    """One untimed warm-up call, then n timed calls: their times in seconds."""
    fn()
    return [timed(fn)[1] for _ in range(n)]


def median_ms(fns, first_s, repeats):
    """Median ms of each callable over `repeats` rounds of blocks in ABBA order."""
    calls = [max(1, min(MAX_CALLS, round(BLOCK_S / s))) for s in first_s]
    times = [[] for _ in fns]
    for r in range(repeats):
        for i in (range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))):
            time.sleep(PAUSE_S)
            times[i] += block(fns[i], calls[i])
    return [statistics.median(t) * 1e3 for t in times]


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def measure(name, dims, causal, dtype, pass_, repeats):
    """One row: times, GFLOP/s and rel_l2 of FlashCore against torch."""
    make = forward_calls if pass_ == "fwd" else backward_calls
    fns = make(*inputs(dims, dtype), causal)
    (res_fc, s_fc), (res_th, s_th) = timed(fns[0]), timed(fns[1])
    labels = ["out"] if pass_ == "fwd" else ["dq", "dk", "dv"]
    err = {n: rel_l2(a, b) for n, a, b in zip(labels, res_fc, res_th)}
    ms_fc, ms_th = median_ms(fns, (s_fc, s_th), repeats)
    fl = flops(dims, causal, pass_)
    return {"shape": name, "pass": pass_, "dtype": dtype,
            **dict(zip(("B", "Hq", "Hkv", "Sq", "Sk", "D"), dims)), "causal": causal,
            "flashcore_ms": ms_fc, "torch_ms": ms_th,
            "flashcore_gflops": fl / ms_fc / 1e6, "torch_gflops": fl / ms_th / 1e6,
            "speedup_vs_torch": ms_th / ms_fc, "rel_l2_vs_torch": err}


def cpuinfo():
    """(model name, the ISA_FLAGS present) from /proc/cpuinfo's first processor."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = val.strip()
                elif key.strip() == "flags":
                    flags = set(val.split())
                    break
    except OSError:
        pass
    return model, [f for f in ISA_FLAGS if f in flags]


def machine():
    model, isa = cpuinfo()
    capability = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return {"cpu": model, "isa": isa, "cores": os.cpu_count(),
            "torch_cpu_capability": capability() if capability else None,
            "flashcore": flashcore.__version__, "build": flashcore.build_info(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "flashcore_threads": "default (one per online core)",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def table_row(r):
    err = ", ".join(f"{n} {e:.1e}" for n, e in r["rel_l2_vs_torch"].items())
    return (f"| {r['shape']} | {r['pass']} | {r['dtype']} | {r['flashcore_ms']:.2f} | "
            f"{r['flashcore_gflops']:.1f} | {r['torch_ms']:.2f} | {r['torch_gflops']:.1f} | "
            f"{r['speedup_vs_torch']:.2f}x | {err} |")


def csv(choices):
    def parse(text):
        picked = [x for x in text.split(",") if x]
        bad = [x for x in picked if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {choices}")
        return picked
    return parse


def main():
    names = [c[0] for c in cases()]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds of blocks per row (default 5)")
    ap.add_argument("--pass", dest="passes", type=csv(PASSES), default=PASSES, help="fwd,bwd (default both)")
    ap.add_argument("--shapes", type=csv(names), default=names, help="row names: " + ",".join(names))
    ap.add_argument("--dtypes", type=csv(DTYPES), default=DTYPES, help="default all: " + ",".join(DTYPES))
    ap.add_argument("--json", default=None, help="write meta and rows here")
    args = ap.parse_args()
    meta = machine()
    for key, val in meta.items():
        print(f"{key}: {val}")
    print()
    print("| shape | pass | dtype | flashcore ms | GFLOP/s | torch ms | GFLOP/s | flashcore / torch speed "
          "| rel_l2 vs torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    start, rows = time.perf_counter(), []
    for pass_ in args.passes:
        for name, dims, causal in cases():
            if name not in args.shapes or (pass_ == "bwd" and dims[3] == 1):
                continue
            for dtype in args.dtypes:
                rows.append(measure(name, dims, causal, dtype, pass_, args.repeats))
                print(table_row(rows[-1]), flush=True)
    meta["seconds"] = round(time.perf_counter() - start, 1)
    print(f"{len(rows)} rows in {meta['seconds']} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
