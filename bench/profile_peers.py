#!/usr/bin/env python3
"""One call of each selected system on each selected shape, inside a CUDA
profiler range, for Nsight Compute (`ncu --profile-from-start off`): the
systems, shapes and inputs are bench/peers.py's. Warm-up calls run outside
the range, so ncu profiles exactly one forward call per (shape, system);
the order of the profiled calls is printed (stderr) so that the kernels in
ncu's report can be told apart (their names tell too). With --bwd, one
backward call per system instead (peers.py --bwd's systems: FlashCore,
deterministic or not, cuDNN and FA2 through autograd).

    ncu --profile-from-start off --clock-control none --csv --page details \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        python3 bench/profile_peers.py --shapes s2k-d128 --systems sm90,cudnn > ncu.csv
    python3 bench/ncu_summary.py ncu.csv

scripts/gpu-check.sh profile runs exactly this (PROFILE_SHAPES, PROFILE_SYSTEMS).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (bench/peers.py: shapes, inputs, systems)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", required=True, help="comma-separated benchmark shape names")
    ap.add_argument("--systems", default="sm90,cudnn",
                    help="comma-separated substrings of peers.py system names (default sm90,cudnn)")
    ap.add_argument("--sm90-rows", help="also forced Hopper tile rows (systems sm90-row<N>)")
    ap.add_argument("--bwd", action="store_true", help="profile the backward (peers.py --bwd's systems)")
    ap.add_argument("--warmup", type=int, default=3, help="calls before the profiled one (outside the range)")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        sys.exit("profile_peers.py: no CUDA device")
    a.quick = False  # peers.select_shapes reads both
    shapes = peers.select_shapes(a)
    systems = peers.make_bwd_systems(a.systems) if a.bwd else peers.make_systems(a.systems, a.sm90_rows)
    cudart = torch.cuda.cudart()
    order = 0
    with torch.no_grad():
        for shape in shapes:
            name = shape.name
            inputs = peers.Inputs(torch, shape, 1, "cuda", a.seed, with_dout=a.bwd)
            for s in systems:
                why = s.available()
                if why:
                    print("skip %s / %s: %s" % (name, s.name, why), file=sys.stderr)
                    continue
                try:
                    run, _ = s.prepare(shape, inputs)
                    for _ in range(a.warmup):
                        run(0)
                    torch.cuda.synchronize()
                    cudart.cudaProfilerStart()
                    run(0)
                    torch.cuda.synchronize()
                    cudart.cudaProfilerStop()
                    order += 1
                    print("profiled %d: %s / %s %s" % (order, name, s.name,
                                                       "[%s]" % s.kernel if s.kernel else ""), file=sys.stderr)
                except Exception as e:  # unsupported shape, missing backend: go on with the rest
                    print("skip %s / %s: %s" % (name, s.name, peers.short_error(e)), file=sys.stderr)
            del inputs
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
