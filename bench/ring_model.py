#!/usr/bin/env python3
"""The causal zigzag ring's step timing extrapolated to more ranks, from
two measured runs of bench/ring.py (JSON, the same tokens a rank, P1 < P2
ranks) and a link bandwidth: what an 8-GPU run should give where no
8-GPU machine is lent.

The model. With the zigzag split every rank does the same work: step 0
(its own two chunks: two causal diagonals and one full pair) and P - 1
further steps of two full chunk pairs each. So a pass's compute alone is
d + 2 (P - 1) u for some step-0 cost d and pair cost u, which the two
runs' "compute alone" times fix (two equations, two unknowns); a rank's
chunk pairs do not change size with P at a fixed token count a rank. The
single-device time of P x T tokens is the smaller run's scaled by (P /
P1)^2 (attention's work is quadratic: the runs measured 4.0x per doubling
up to 128k tokens; from 128k to 256k the Hopper backward gave 4.7x, a
slowdown of its own, docs/PERF.md, which the smaller run's baseline
leaves out).
Each step's transfer is the K/V slice (forward), or the K/V slice and
the fp32 dK/dV sums (backward); it is hidden behind a step's compute where
it takes less, and the sums' last hop home is exposed (forward +
backward: a forward step and a backward step taken together).

    python3 bench/ring_model.py ring-2-16k.json ring-4-16k.json --tokens 16384 --ranks 8 [--link-gbps 100]
"""

import argparse
import json
import sys


def fit(runs):
    """(d, u) per pass from two runs' compute-alone times: compute(P) = d +
    2 (P - 1) u."""
    (p1, r1), (p2, r2) = runs
    out = {}
    for pass_ in r1:
        c1, c2 = r1[pass_]["compute_ms"], r2[pass_]["compute_ms"]
        u = (c2 - c1) / (2.0 * (p2 - p1))
        out[pass_] = (c1 - 2.0 * (p1 - 1) * u, u)
    return out


def predict(runs, ranks, link_gbps, tokens, kv_heads, dim, elem_bytes):
    """Per pass: the predicted compute, exposed transfer, ring time,
    single-device time and efficiency at `ranks`."""
    model = fit(runs)
    p1, r1 = runs[0]
    kv_bytes = 2.0 * tokens * kv_heads * dim * elem_bytes  # K and V of one slice
    rows = []
    for pass_, (d, u) in model.items():
        compute = d + 2.0 * (ranks - 1) * u
        step = compute / ranks
        # forward: the K/V slice; forward + backward (a step of each taken
        # together): the slice twice and the fp32 dK/dV sums
        moved = kv_bytes if pass_ == "fwd" else kv_bytes * (2.0 + 4.0 / elem_bytes)
        transfer = moved / (link_gbps * 1e9) * 1e3  # ms a step
        exposed = max(0.0, transfer - step) * (ranks - 1)
        if pass_ != "fwd":
            exposed += kv_bytes * 4.0 / elem_bytes / (link_gbps * 1e9) * 1e3  # the sums' last hop home
        single = r1[pass_]["single_ms"] * (ranks / float(p1)) ** 2
        ring = compute + exposed
        rows.append(dict(pass_=pass_, ranks=ranks, compute_ms=compute, step_ms=step, transfer_ms=transfer,
                         exposed_ms=exposed, ring_ms=ring, single_ms=single, efficiency=single / (ranks * ring),
                         step0_ms=d, pair_ms=u))
    return rows


def load(path):
    """(ranks, {pass: row}) of a bench/ring.py JSON."""
    d = json.loads(open(path).read())
    return d["meta"]["ranks"], {r["pass_"]: r for r in d["rows"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs=2, help="bench/ring.py JSON of two rank counts, the same tokens a rank")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--link-gbps", type=float, default=100.0, help="per-direction link bandwidth, GB/s (assumed)")
    ap.add_argument("--tokens", type=int, required=True, help="tokens a rank of the runs")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--elem-bytes", type=int, default=2)
    a = ap.parse_args()
    runs = sorted((load(p) for p in a.runs), key=lambda r: r[0])
    if runs[0][0] == runs[1][0]:
        print("ring_model: the two runs must have different rank counts", file=sys.stderr)
        return 2
    print("| pass | ranks | compute ms | a step | transfer a step | exposed | ring ms | single ms | efficiency |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in predict(runs, a.ranks, a.link_gbps, a.tokens, a.kv_heads, a.dim, a.elem_bytes):
        print("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.3f |" % (
            r["pass_"], r["ranks"], r["compute_ms"], r["step_ms"], r["transfer_ms"], r["exposed_ms"],
            r["ring_ms"], r["single_ms"], r["efficiency"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
