#!/usr/bin/env python3
"""Summarise a Hopper kernel trace (a trace build: -DFC_SM90_TRACE=1, see
src/cuda/sm90/sm90.h) written to $FLASHCORE_SM90_TRACE_FILE.

    FLASHCORE_SM90_TRACE_FILE=/tmp/t.bin build-trace/flashcore bench --shape s2k-d128 \\
        --iters 1 --warmup-ms 0 --no-graph
    python3 bench/trace_sm90.py /tmp/t.bin [--ghz 1.98]

Events per tile (SM clock stamps, per CTA):
  producer  p0 tile decoded, p1 first K/V load issued, p2 every load issued
  consumer  c0 tile start (its first S issued: Q and K0 have landed),
            c1 first S done, c2 first block's softmax done,
            c3 main loop done (last P.V complete), c4 epilogue done
  globaltimer (ns, common to all SMs), tile slot 0: producer events 5 (CTA
            entry) and 6 (after the PDL wait), consumer event 5 (exit)
Prints, over all CTAs and tiles, the median and mean of each phase in
microseconds, and the share of the kernel's CTA time each phase takes.
Phases convert SM cycles at --ghz; a traced call runs alone (it waits for
the trace copy), and the SM may clock lower than in a benchmark: the
globaltimer line is in absolute time (a mission CTA's phases once summed
to 4.64 us at 1.98 GHz while it lived 6.56 us by globaltimer).
"""
import argparse
import statistics
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        head = struct.unpack("<5i", f.read(20))
        ctas, roles, tiles, events, config = head
        n = ctas * roles * tiles * events
        data = struct.unpack("<%dq" % n, f.read(8 * n))
    def at(c, r, t, e):
        return data[((c * roles + r) * tiles + t) * events + e]
    return head, at


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--ghz", type=float, default=1.98, help="SM clock to convert cycles (H100 boost)")
    a = ap.parse_args()
    (ctas, roles, tiles, events, config), at = load(a.file)
    us = 1e-3 / a.ghz
    phases = {"first S (c1-c0)": [], "first block (c2-c1)": [], "main loop (c3-c2)": [],
              "epilogue (c4-c3)": [], "gap to next tile (c0'-c4)": [], "producer: ring wait (p1-p0)": [],
              "producer: decode -> first tile start (c0-p0)": []}
    span_total = 0.0
    for c in range(ctas):
        first, last = None, None
        for w in range(1, roles):
            for t in range(tiles):
                ev = [at(c, w, t, e) for e in range(5)]
                if ev[0] < 0:
                    continue
                first = ev[0] if first is None else min(first, ev[0])
                if ev[4] >= 0:
                    last = ev[4] if last is None else max(last, ev[4])
                if min(ev) < 0:
                    continue
                phases["first S (c1-c0)"].append((ev[1] - ev[0]) * us)
                phases["first block (c2-c1)"].append((ev[2] - ev[1]) * us)
                phases["main loop (c3-c2)"].append((ev[3] - ev[2]) * us)
                phases["epilogue (c4-c3)"].append((ev[4] - ev[3]) * us)
                if t + 1 < tiles and at(c, w, t + 1, 0) >= 0:
                    phases["gap to next tile (c0'-c4)"].append((at(c, w, t + 1, 0) - ev[4]) * us)
        # the first tile's Q and K0 loads (same SM clock): what c0 does not see
        p00, c00 = at(c, 0, 0, 0), at(c, 1, 0, 0)
        if p00 >= 0 and c00 >= 0:
            phases["producer: decode -> first tile start (c0-p0)"].append((c00 - p00) * us)
        for t in range(tiles):
            p0, p1 = at(c, 0, t, 0), at(c, 0, t, 1)
            if p0 >= 0 and p1 >= 0:
                phases["producer: ring wait (p1-p0)"].append((p1 - p0) * us)
        if first is not None and last is not None:
            span_total += (last - first) * us
    print("trace: %d CTAs, config %d, %.2f GHz" % (ctas, config, a.ghz))
    cons = sum(sum(v) for k, v in phases.items() if not k.startswith("producer")) or 1.0
    for k, v in phases.items():
        if not v:
            print("  %-44s -" % k)
            continue
        share = "" if k.startswith("producer") else "  %5.1f%% of consumer time" % (100 * sum(v) / cons)
        print("  %-44s median %8.3f us  mean %8.3f us  n %5d%s" % (k, statistics.median(v),
                                                                 statistics.fmean(v), len(v), share))
    print("  CTA span (first tile start .. last epilogue), summed over CTAs: %.1f us" % span_total)
    # %globaltimer stamps (ns, common to all SMs): producer role tile 0 events
    # 5 (CTA entry) and 6 (after the PDL wait); consumer roles event 5 (exit).
    entry = [at(c, 0, 0, 5) for c in range(ctas)]
    waited = [at(c, 0, 0, 6) for c in range(ctas)]
    exits = [max([at(c, w, 0, 5) for w in range(1, roles)] + [-1]) for c in range(ctas)]
    ok = [c for c in range(ctas) if entry[c] >= 0 and waited[c] >= 0 and exits[c] >= 0]
    if ok:
        t0 = min(entry[c] for c in ok)
        life = [(exits[c] - entry[c]) / 1e3 for c in ok]
        print("  globaltimer: CTA entries over %.3f us; CTA life median %.3f us, max %.3f us; "
              "entry -> after PDL wait median %.3f us; first entry -> last exit %.3f us"
              % ((max(entry[c] for c in ok) - t0) / 1e3, statistics.median(life), max(life),
                 statistics.median((waited[c] - entry[c]) / 1e3 for c in ok),
                 (max(exits[c] for c in ok) - t0) / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
