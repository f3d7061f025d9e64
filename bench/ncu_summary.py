#!/usr/bin/env python3
"""Summarise an Nsight Compute raw CSV report (`ncu --csv --page raw ...`,
as scripts/gpu-check.sh profile writes it): per profiled kernel, its
duration, SM and memory throughput, the tensor-pipe metrics the sections
collected (whatever this ncu names them), issue activity, and the largest
warp stall reasons (cycles per issued instruction).

    python3 bench/ncu_summary.py ncu.csv [--stalls 6] [--grep REGEX]

--grep also prints every metric whose name matches REGEX (e.g.
'shared|ldsm|registers' for shared-memory traffic and register use).

Only metric-name patterns are assumed, not exact names, so a newer ncu that
renames a metric drops a line rather than failing.
"""
import argparse
import csv
import re
import sys


def rows_of(path):
    """(header, units, data rows) of the raw page; ncu's own log lines
    (==PROF==, ==WARNING==) and the program's output are skipped. The row
    after the header holds the units when its first cell is not an ID."""
    with open(path, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = list(csv.reader(lines))
    start = next((i for i, r in enumerate(rd) if r and r[0] == "ID"), None)
    if start is None:
        return None, None, []
    head, rest = rd[start], rd[start + 1:]
    units = [""] * len(head)
    if rest and rest[0] and not rest[0][0].isdigit():
        units, rest = rest[0], rest[1:]
    return head, units, [r for r in rest if r and r[0].isdigit()]


def num(s):
    try:
        return float(s.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def short_name(n, width=60):
    n = re.sub(r"\(.*", "", n)  # drop the parameter list
    return n if len(n) <= width else n[:width - 3] + "..."


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--stalls", type=int, default=6, help="stall reasons to list per kernel")
    ap.add_argument("--grep", help="also print every non-empty metric whose name matches this regex")
    a = ap.parse_args(argv)
    head, units, data = rows_of(a.csv)
    if not head:
        print("ncu_summary: no raw CSV table in %s" % a.csv)
        return 1
    col = {h: i for i, h in enumerate(head)}

    def get(r, name):
        i = col.get(name)
        return (r[i], units[i] if i < len(units) else "") if i is not None and i < len(r) else (None, "")

    stall_re = re.compile(r"^smsp__average_warps?_issue_stalled_(.+)_per_issue_active\.ratio$")
    tensor_re = re.compile(r"(tensor|gmma|hmma|imma)", re.I)
    for r in data:
        name, _ = get(r, "Kernel Name")
        grid, _ = get(r, "Grid Size")
        block, _ = get(r, "Block Size")
        print("== kernel %s: %s  grid %s block %s" % (r[0], short_name(name or "?"), grid, block))
        for label, metric in (("duration", "gpu__time_duration.sum"),
                              ("SM throughput %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
                              ("memory throughput %", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
                              ("DRAM throughput %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
                              ("issue slots busy %", "sm__instruction_throughput.avg.pct_of_peak_sustained_active"),
                              ("IPC active", "sm__inst_executed.avg.per_cycle_active"),
                              ("warp cycles / issued inst", "smsp__average_warp_latency_per_inst_issued.ratio"),
                              ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active")):
            v, u = get(r, metric)
            if v not in (None, ""):
                print("   %-28s %s %s" % (label, v, u))
        # one line per tensor pipe that ran: the per-SM average over active
        # cycles (ncu also gives min/max/sum and per-elapsed forms)
        for h, i in col.items():
            if (tensor_re.search(h) and h.endswith(".avg.pct_of_peak_sustained_active") and i < len(r)
                    and num(r[i])):
                print("   %-28s %s %s" % (h[:60], r[i], units[i] if i < len(units) else ""))
        if a.grep:
            pat = re.compile(a.grep)
            for h, i in col.items():
                if pat.search(h) and i < len(r) and r[i] not in ("", None):
                    print("   %-60s %s %s" % (h[:60], r[i], units[i] if i < len(units) else ""))
        stalls = []
        for h, i in col.items():
            m = stall_re.match(h)
            if m and i < len(r):
                v = num(r[i])
                if v:
                    stalls.append((v, m.group(1)))
        if stalls:
            stalls.sort(reverse=True)
            print("   stalls (cycles per issued instruction): " +
                  ", ".join("%s %.2f" % (n, v) for v, n in stalls[:a.stalls]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
