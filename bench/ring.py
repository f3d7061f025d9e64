#!/usr/bin/env python3
"""Context-parallel scaling of flashcore.distributed.ring_attention: the
whole sequence on one device against P ranks holding a slice each, same
run, forward and forward + backward.

    torchrun --nproc-per-node 2 bench/ring.py --causal            # GPUs, NCCL
    torchrun --nproc-per-node 2 bench/ring.py --causal --comm all_gather
    python3 bench/ring.py --dry-run                                # CPU, gloo, 2 spawned ranks, tiny

First every rank checks its slice of out, dq, dk and dv against one call
over the whole sequence (exit status 1 past the dtype's gate). Per pass,
rank 0 prints: the single-device time of the whole sequence
(one flashcore.attention call, and its backward, on rank 0's device while
the others wait at a barrier), the ring's time (with --sm-margin K
its Hopper forward grids capped at the SMs less K: NCCL's kernels then
find SMs free) (the slowest rank's, CUDA
events or wall clock, median over --iters), the same ring with its
transfers stubbed out (each rank reuses its own K/V, and with
--comm all_gather keeps its own share of the dK/dV sums: the compute alone),
scaling efficiency = single / (P x ring), and exposed communication =
ring - compute alone; with --layers N each step is N calls back to back
(all times per step), and --memo-check makes the ring's per-call shapes
check once per shape (what its exchange still costs: over NCCL it goes
through a gloo group on the host, with no device sync). JSON with --json. --profile: afterwards, three more
ring steps (forward, and forward + backward) under torch.profiler on every
rank; rank 0 prints its kernels (CPU ops on the CPU) by self time, and the
busy share of its device: the union of its kernels' intervals over the
steps' wall time (what the host leaves idle between calls).
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import flashcore
from flashcore import _ring_allgather as fag
from flashcore import distributed as fd


def timer(cuda):
    """A function that times fn() once (ms), the device drained around it."""
    def run(fn):
        if cuda:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return run


def slowest(ms, device):
    """The largest of every rank's ms (the ring ends when its last rank does)."""
    t = torch.tensor([ms], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def tensors(a, total, device, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    shapes = [(a.batch, total, h, a.dim) for h in (a.heads, a.kv_heads, a.kv_heads, a.heads)]
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in shapes]


def local_slice(x, a, rank, size):
    """Rank's tokens of the whole-sequence tensor x, as the split assigns them."""
    s = a.seq_per_rank
    if a.split == "contiguous":
        return x[:, rank * s:(rank + 1) * s]
    c = s // 2
    return torch.cat([x[:, rank * c:(rank + 1) * c], x[:, (2 * size - 1 - rank) * c:(2 * size - rank) * c]], 1)


def inputs(a, rank, size, device, seed):
    """The whole sequence's q, k, v, dout and this rank's slices of them."""
    whole = tensors(a, a.seq_per_rank * size, device, getattr(torch, a.dtype), seed)
    return whole, [local_slice(x, a, rank, size).contiguous() for x in whole]


def grid_cap_file(a, device):
    """--sm-margin: a tuning cache whose one entry caps every Hopper
    forward's persistent grid at the SMs less the margin (docs/TUNING.md),
    for the ring's calls; None without it."""
    if not a.sm_margin:
        return None
    import tempfile
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    path = Path(tempfile.mkdtemp()) / "grid-cap.tune"
    path.write_text("flashcore-tuning 1\ndevice library=* tables=* cc=* sms=* cudart=* gpu=*\n"
                    "fwd : sm90_grid=%d\n" % max(1, sms - a.sm_margin))
    return str(path)


def step(q, k, v, dout, a, bwd, ring):
    """--layers calls (ring or whole sequence), each one's out the next
    one's q, with their backward when bwd."""
    q, k, v = (x.detach().requires_grad_(bwd) for x in (q, k, v))
    out = q
    for _ in range(a.layers):
        if ring:
            out = fd.ring_attention(out, k, v, causal=a.causal, split=a.split, comm=a.comm)
        else:
            out = flashcore.attention(out, k, v, causal=a.causal)
    if bwd:
        out.backward(dout)


def memo_check():
    """--memo-check: ring_attention's shapes-and-options all_gather (on
    the host, over gloo) made once per shape, to time what it costs between
    back-to-back calls (--layers). Every rank makes the same calls, so
    every rank skips the same ones."""
    real, memo = fd._gather_shapes, {}

    def cached(q, k, v, plan):
        key = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
        if key not in memo:
            memo[key] = real(q, k, v, plan)
        return memo[key]
    fd._gather_shapes = cached


def measure(a, rank, size, device, bwd):
    (q, k, v, dout), mine = inputs(a, rank, size, device, seed=1)
    run = timer(device.type == "cuda")
    row = dict(pass_="fwd+bwd" if bwd else "fwd")
    single = []
    flashcore.load_tuning(None)
    for i in range(a.warmup + a.iters):  # the whole sequence on rank 0's device
        dist.barrier()
        if rank == 0:
            ms = run(lambda: step(q, k, v, dout, a, bwd, ring=False))
            if i >= a.warmup:
                single.append(ms)
    dist.barrier()
    flashcore.load_tuning(a.cap_file)  # --sm-margin: the ring's calls only
    for name, stub in (("ring", False), ("compute", True)):
        real = fd._exchange, fag._all_gather, fag._reduce_scatter
        if stub:  # each rank keeps its own K/V (and accumulators): the transfers' time taken out
            fd._exchange = lambda xs, plan, src: (list(xs), [])
            fag._all_gather = lambda out, x, plan: out.copy_(x.expand(out.shape))
            fag._reduce_scatter = lambda out, x, plan: out.copy_(x[plan.rank])
        try:
            times = []
            for i in range(a.warmup + a.iters):
                dist.barrier()
                ms = slowest(run(lambda: step(*mine, a, bwd, ring=True)), device)
                if i >= a.warmup:
                    times.append(ms)
        finally:
            fd._exchange, fag._all_gather, fag._reduce_scatter = real
        row[name + "_ms"] = statistics.median(times)
    if rank == 0:
        row["single_ms"] = statistics.median(single)
        row["efficiency"] = row["single_ms"] / (size * row["ring_ms"])
        row["exposed_comm_ms"] = row["ring_ms"] - row["compute_ms"]
    return row


def busy_share(prof, wall_us):
    """The union of the profiled device kernels' intervals over wall_us."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type.name == "CUDA")
    busy, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return busy / wall_us if wall_us > 0 else 0.0


def profile(a, rank, size, device, bwd):
    """Three ring steps under torch.profiler; rank 0 prints the table."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    cuda = device.type == "cuda"
    _, mine = inputs(a, rank, size, device, seed=1)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    flashcore.load_tuning(a.cap_file)
    dist.barrier()
    with torch_profile(activities=acts) as prof:
        t = time.perf_counter()
        for _ in range(3):
            step(*mine, a, bwd, ring=True)
        if cuda:
            torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t) * 1e6
    if rank == 0:
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print("profile, %s, 3 ring steps, rank 0: %.3f ms a step%s" % (
            "fwd+bwd" if bwd else "fwd", wall_us / 3e3,
            ", device busy %.0f%% of it" % (100 * busy_share(prof, wall_us)) if cuda else ""))
        print(prof.key_averages().table(sort_by=key, row_limit=12))


# The largest error of out, dq, dk, dv against one call over the whole
# sequence, relative to each tensor's largest element: float32 differs by
# summation order, f16/bf16 by a rounding of each block's out and
# gradients (flashcore/distributed.py)
GATES = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}


def check(a, rank, size, device):
    """ring_attention's out and gradients on this rank's slice against the
    whole-sequence call: the largest relative error over every rank."""
    whole, mine = inputs(a, rank, size, device, seed=2)
    ref = [x.detach().requires_grad_() for x in whole[:3]]
    out = flashcore.attention(*ref, causal=a.causal)
    out.backward(whole[3])
    got = [x.detach().requires_grad_() for x in mine[:3]]
    flashcore.load_tuning(a.cap_file)
    ring = fd.ring_attention(*got, causal=a.causal, split=a.split, comm=a.comm)
    flashcore.load_tuning(None)
    ring.backward(mine[3])
    worst = 0.0
    for g, r in ((ring, out), (got[0].grad, ref[0].grad), (got[1].grad, ref[1].grad), (got[2].grad, ref[2].grad)):
        r = local_slice(r.detach(), a, rank, size).float()
        worst = max(worst, ((g.detach().float() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item())
    return slowest(worst, device)


def main_rank(rank, size, a):
    cuda = not a.dry_run and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=size)
    a.cap_file = grid_cap_file(a, device)
    err = check(a, rank, size, device)
    if a.memo_check:
        memo_check()
    passes = [False, True] if a.bwd else [False]
    rows = [measure(a, rank, size, device, bwd) for bwd in passes]
    ok = err <= GATES[a.dtype]
    if rank == 0:
        meta = dict(device=torch.cuda.get_device_name() if cuda else "cpu", ranks=size, dry_run=a.dry_run,
                    torch=torch.__version__,
                    flashcore=flashcore.__version__, shape="B%d Hq%d Hkv%d D%d, %d tokens a rank (%d in all), %s%s"
                    % (a.batch, a.heads, a.kv_heads, a.dim, a.seq_per_rank, a.seq_per_rank * size, a.dtype,
                       ", causal, " + a.split + " split" if a.causal else ", " + a.split + " split"),
                    comm=a.comm, sm_margin=a.sm_margin, layers=a.layers, memo_check=a.memo_check)
        meta["check"] = dict(max_rel_err=err, gate=GATES[a.dtype], ok=ok)
        print("ring attention (comm=%s), %s, %d ranks, %s; medians of %d" % (a.comm, meta["device"], size,
                                                                            meta["shape"], a.iters))
        print("check against one call over the whole sequence (out, dq, dk, dv): largest relative error %.3g "
              "(gate %.0e) %s" % (err, GATES[a.dtype], "ok" if ok else "FAIL"))
        print("| pass | single device ms | ring ms | compute alone ms | efficiency | exposed comm ms |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print("| %s | %.3f | %.3f | %.3f | %.3f | %.3f |" % (r["pass_"], r["single_ms"], r["ring_ms"],
                                                               r["compute_ms"], r["efficiency"],
                                                               r["exposed_comm_ms"]))
        if a.json:
            Path(a.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    if a.profile:
        for bwd in passes:
            profile(a, rank, size, device, bwd)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def spawned(rank, size, port, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if main_rank(rank, size, a):
        raise SystemExit("ring_attention's check failed")
    # no interpreter finalisation: gloo's threads can still hold finished
    # work whose tensors need the GIL there (python/tests/test_distributed.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-per-rank", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--split", default=None, choices=["contiguous", "zigzag"],
                    help="default: zigzag when causal, else contiguous")
    ap.add_argument("--comm", default="p2p", choices=["p2p", "all_gather"],
                    help="ring_attention's comm: the ring, or K/V gathered once")
    ap.add_argument("--layers", type=int, default=1,
                    help="calls a step, back to back (each one's out the next one's q)")
    ap.add_argument("--memo-check", action="store_true",
                    help="the ring's shapes check once per shape (what its host exchange costs)")
    ap.add_argument("--sm-margin", type=int, default=0,
                    help="cap the ring's Hopper forward grids at the SMs less this many (a tuning cache entry)")
    ap.add_argument("--bwd", action=argparse.BooleanOptionalAction, default=True, help="also forward + backward")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="CPU, gloo, 2 spawned ranks, tiny shapes")
    ap.add_argument("--profile", action="store_true",
                    help="then 3 ring steps a pass under torch.profiler: rank 0's kernels and device busy share")
    a = ap.parse_args()
    a.split = a.split or ("zigzag" if a.causal else "contiguous")
    if a.dry_run:
        a.seq_per_rank, a.heads, a.kv_heads, a.dim, a.dtype, a.iters, a.warmup = 16, 4, 2, 16, "float32", 2, 1
        import socket
        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.start_processes(spawned, args=(2, port, a), nprocs=2, start_method="spawn")
        return 0
    if "RANK" not in os.environ:
        print("launch with torchrun (e.g. torchrun --nproc-per-node 2 bench/ring.py), or --dry-run",
              file=sys.stderr)
        return 2
    return main_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a)


if __name__ == "__main__":
    sys.exit(main())
