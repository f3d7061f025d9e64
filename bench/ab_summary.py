#!/usr/bin/env python3
"""Median same-pass FlashCore/peer ratios of two sides of an A/B.

    ab_summary.py A1.json [A2.json ...] -- B1.json [B2.json ...]

Each JSON is one bench/peers.py pass. Per shape and side: sm90 over cuDNN and
sm80 over FA2 (with --bwd the same for the backward, and each path's
deterministic mode), each ratio taken within its pass (so the peers normalise the
machine's state), then the median over the side's passes; B/A is the change.
"""
import json, statistics, sys

PAIRS = (("flashcore-sm90", "torch-cudnn", "sm90/cuDNN"), ("flashcore-sm80", "torch-flash(FA2)", "sm80/FA2"),
         ("flashcore-sm90-det", "torch-cudnn", "sm90det/cuDNN"), ("flashcore-sm80-det", "torch-flash(FA2)", "det/FA2"))


def ratios(path):
    rows = json.load(open(path))["rows"]
    us = {(r["system"], r["shape"]): r.get("p50_us") for r in rows}
    out = {}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for ours, peer, name in PAIRS:
            a, b = us.get((ours, shape)), us.get((peer, shape))
            if a and b:
                out[(shape, name)] = b / a
    return out


def side(paths):
    per = [ratios(p) for p in paths]
    keys = dict.fromkeys(k for r in per for k in r)
    return {k: statistics.median(r[k] for r in per if k in r) for k in keys}


def main():
    if "--" not in sys.argv:
        sys.exit(__doc__)
    i = sys.argv.index("--")
    a, b = side(sys.argv[1:i]), side(sys.argv[i + 1:])
    print("| shape | ratio | A | B | B/A |\n|---|---|---|---|---|")
    for k in a:
        if k in b:
            print("| %s | %s | %.3fx | %.3fx | %+.1f%% |" % (k[0], k[1], a[k], b[k], 100 * (b[k] / a[k] - 1)))


if __name__ == "__main__":
    main()
