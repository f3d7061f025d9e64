"""CPU benchmark: FlashCore's tiled CPU path and its double-precision reference
beside torch's CPU scaled_dot_product_attention, on the same inputs, in one
process. Median wall time over repeats, interleaved round by round.

    python3 bench/cpu_peers.py [--repeats N] [--json FILE]

Needs the binding (PYTHONPATH=python, FLASHCORE_LIBRARY=.../libflashcore.so),
numpy, and torch (optional: rows say 'unavailable' without it)."""
import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

import flashcore

# name, B, Hq, Hkv, Sq, Sk, D, causal
SHAPES = [
    ("mission", 1, 8, 8, 512, 512, 64, False),
    ("mission-causal", 1, 8, 8, 512, 512, 64, True),
    ("s1k-d128", 1, 8, 8, 1024, 1024, 128, False),
    ("gqa-decode/b4", 4, 32, 8, 1, 8192, 128, False),
]
DTYPES = ["float32", "float16", "bfloat16"]


def flops(B, Hq, Sq, Sk, D, causal):
    f = 4.0 * B * Hq * Sq * Sk * D
    return f / 2 if causal and Sq == Sk else f


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    ap.add_argument("--reference", action="store_true", help="also time the fp64 reference (slow)")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    rows = []
    print(f"| shape | dtype | flashcore cpu_tiled ms | GFLOP/s | torch sdpa ms | GFLOP/s | ratio | reference ms |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, B, Hq, Hkv, Sq, Sk, D, causal) in SHAPES:
        for dt in DTYPES:
            if torch is None:
                continue
            tdt = getattr(torch, dt)
            g = torch.Generator().manual_seed(0)
            q = torch.randn(B, Sq, Hq, D, generator=g).to(tdt)
            k = torch.randn(B, Sk, Hkv, D, generator=g).to(tdt)
            v = torch.randn(B, Sk, Hkv, D, generator=g).to(tdt)
            # torch wants [B, H, S, D]: the same storage seen through a transpose
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def fc():
                return flashcore.attention(q, k, v, causal=causal, backend="cpu")

            def th():
                # bottom-right causal equals torch's top-left only when Sq == Sk
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal and Sq == Sk,
                                                      enable_gqa=Hq != Hkv)

            def ref():
                return flashcore.attention(q, k, v, causal=causal, backend="cpu_reference")

            o_fc, o_th = fc(), th().transpose(1, 2)
            err = float(((o_fc.float() - o_th.float()).norm() / o_th.float().norm()).item())
            ts = {"fc": [], "torch": [], "ref": []}
            for _ in range(args.repeats):  # interleaved rounds
                for key, fn in (("fc", fc), ("torch", th)):
                    t = time.perf_counter(); fn(); ts[key].append(time.perf_counter() - t)
            if args.reference and name == "mission":
                t = time.perf_counter(); ref(); ts["ref"].append(time.perf_counter() - t)
            fl = flops(B, Hq, Sq, Sk, D, causal)
            m_fc = statistics.median(ts["fc"]) * 1e3
            m_th = statistics.median(ts["torch"]) * 1e3
            m_ref = statistics.median(ts["ref"]) * 1e3 if ts["ref"] else None
            row = {"shape": name, "dtype": dt, "B": B, "Hq": Hq, "Hkv": Hkv, "Sq": Sq, "Sk": Sk, "D": D,
                   "causal": causal, "flashcore_ms": m_fc, "torch_ms": m_th, "reference_ms": m_ref,
                   "flashcore_gflops": fl / m_fc / 1e6, "torch_gflops": fl / m_th / 1e6,
                   "rel_l2_vs_torch": err}
            rows.append(row)
            print(f"| {name} | {dt} | {m_fc:.2f} | {row['flashcore_gflops']:.1f} | {m_th:.2f} | "
                  f"{row['torch_gflops']:.1f} | {m_th / m_fc:.2f}x | "
                  f"{'' if m_ref is None else f'{m_ref:.0f}'} |", flush=True)
    meta = {"flashcore": flashcore.__version__, "build": flashcore.build_info(),
            "torch": None if torch is None else torch.__version__,
            "torch_threads": None if torch is None else torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(meta))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
