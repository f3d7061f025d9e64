#!/usr/bin/env python3
"""Compiled-model step time: the decoder of examples/torch_decoder.py with
FlashCore's custom ops as its attention against the same model with torch's
SDPA, same weights, same inputs, one run.

Tasks: `train`, a training step (forward over a batch of sequences, cross-
entropy loss, backward; gradients set to None between steps), and `infer`,
an inference forward (no_grad, a causal prefill). Modes: `eager` (no
compilation, for reference), `default` (torch.compile(fullgraph=True)) and
`reduce-overhead` (the same with CUDA graphs). Step time: CUDA events around
--steps back-to-back steps after warm-up (compilation, graph recording),
median over --rounds rounds, the two attention implementations interleaved;
the ratio is the median of the rounds' ratios (with their range). Each
row also has the difference of the outputs (loss, or the largest
logit difference) between the two. The header (and the JSON's meta,
flashcore_ops) says which kernels ran flashcore's ops: their C++ kernels
(python/flashcore/csrc, built at the first op call) or the Python ones.

    python3 bench/compiled.py                    # GPU machine; --json compiled.json
    python3 bench/compiled.py --dry-run          # CPU: tiny model, aot_eager: the plumbing only
"""

import argparse
import copy
import json
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "examples"))
import flashcore  # noqa: E402,F401  (imported before the model: the ops exist when it compiles)
from torch_decoder import Config, Decoder  # noqa: E402

IMPLS = ("flashcore", "sdpa")


def models(cfg, device, dtype):
    """The same weights twice, one per attention implementation."""
    torch.manual_seed(0)
    base = Decoder(cfg).to(device, dtype)
    out = {}
    for name in IMPLS:
        m = copy.deepcopy(base)
        m.cfg.attn_implementation = name
        out[name] = m
    return out


def step_fn(model, task, ids, targets):
    """The step as a function of no arguments (compiled or not by the caller)."""
    layers = len(model.blocks)

    def loss():
        logits, _ = model(ids, 0, [None] * layers)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def logits():
        return model(ids, 0, [None] * layers)[0]

    return loss if task == "train" else logits


def runner(model, task, fn):
    """One step: for train, gradients to None, the loss, its backward."""
    if task == "train":
        def run():
            model.zero_grad(set_to_none=True)
            out = fn()
            out.backward()
            return out
        return run

    def infer():
        with torch.no_grad():
            return fn()
    return infer


def own_code(fn, tag):
    """fn with a code object of its own: dynamo keeps its compiled entries
    on the code object, and two models compiled from one shared step
    function would each check the other's guards first on every call."""
    code = fn.__code__.replace(co_name="%s_%s" % (fn.__code__.co_name, tag))
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def build(model, task, mode, ids, targets, backend):
    fn = own_code(step_fn(model, task, ids, targets), model.cfg.attn_implementation)
    if mode != "eager":
        kw = dict(fullgraph=True, backend=backend)
        if mode != "default":
            kw["mode"] = mode
        fn = torch.compile(fn, **kw)
    run = runner(model, task, fn)
    if mode == "reduce-overhead":
        def marked():
            torch.compiler.cudagraph_mark_step_begin()
            return run()
        return marked
    return run


def time_steps(run, n, cuda):
    """Milliseconds per step over n back-to-back steps."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - t0) * 1e3 / n


def measure(task, mode, mods, ids, targets, a, cuda):
    """One row: ms/step of each implementation and the outputs' difference."""
    row = dict(task=task, mode=mode)
    runs, outs = {}, {}
    try:
        for name in IMPLS:
            t0 = time.perf_counter()
            runs[name] = build(mods[name], task, mode, ids, targets, a.backend)
            for _ in range(3):  # compile, record graphs, settle
                outs[name] = runs[name]()
            outs[name] = outs[name].detach().float().clone()
            row["warmup_s_" + name] = round(time.perf_counter() - t0, 2)
    except Exception as e:  # a mode this build of torch cannot run: say why
        row["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
        return row
    samples = {name: [] for name in IMPLS}
    for r in range(a.rounds):
        for name in (IMPLS if r % 2 == 0 else IMPLS[::-1]):
            samples[name].append(time_steps(runs[name], a.steps, cuda))
    for name in IMPLS:
        row["ms_" + name] = statistics.median(samples[name])
        if a.profile:
            row["profile_" + name] = profile(runs[name], cuda)
    # per-round ratios of neighbouring timings: the host's speed drifts
    # by 10-100% between runs and more slowly within one, so a round's pair
    # shares its drift; the row's ratio is their median, with the range
    ratios = [f / s for f, s in zip(samples["flashcore"], samples["sdpa"])]
    row["ratio"] = statistics.median(ratios)
    row["ratio_range"] = [min(ratios), max(ratios)]
    row["max_diff"] = (outs["flashcore"] - outs["sdpa"]).abs().max().item()
    return row


def profile(run, cuda, steps=10):
    """torch.profiler's table of steps back-to-back steps: host time per op,
    then device time (what a step's difference between the two is made of)."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            run()
        if cuda:
            torch.cuda.synchronize()
    ka = prof.key_averages()
    tables = [ka.table(sort_by="self_cpu_time_total", row_limit=14)]
    if cuda:
        tables.append(ka.table(sort_by="self_device_time_total", row_limit=14))
    return "\n".join(tables)


def ops_path():
    """Which kernels ran flashcore's ops: 'c++ (<library>)' or 'python (<why>)'
    (flashcore._torch_ext; a binding without it has Python kernels only)."""
    try:
        from flashcore import _torch_ext
    except ImportError:
        return "python (this binding has no C++ kernels)"
    return _torch_ext.describe()


def table(rows, meta):
    lines = ["compiled decoder step time, %s, torch %s, %s, %d steps x %d rounds (medians)"
             % (meta["device"], meta["torch"], meta["model"], meta["steps"], meta["rounds"]),
             "flashcore's op kernels: %s" % meta["flashcore_ops"], "",
             "| task | mode | flashcore ms/step | SDPA ms/step | flashcore / SDPA (rounds' range) | max diff |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append("| %s | %s | - | - | - | %s |" % (r["task"], r["mode"], r["error"]))
        else:
            lines.append("| %s | %s | %.3f | %.3f | %.3fx (%.3f-%.3f) | %.2g |" % (
                r["task"], r["mode"], r["ms_flashcore"], r["ms_sdpa"], r["ratio"], *r["ratio_range"],
                r["max_diff"]))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dim", type=int, default=512, help="model width (heads x head_dim)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--tasks", default="train,infer")
    ap.add_argument("--modes", default="eager,default,reduce-overhead")
    ap.add_argument("--steps", type=int, default=50, help="back-to-back steps per timing")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend")
    ap.add_argument("--json", default=None, help="write meta and rows here")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model, aot_eager: plumbing only")
    ap.add_argument("--profile", action="store_true",
                    help="after each row's timing, torch.profiler over 10 steps of each (printed, not in the JSON)")
    a = ap.parse_args()
    if a.dry_run:
        a.batch, a.seq, a.dim, a.heads, a.kv_heads, a.layers = 2, 16, 32, 4, 2, 1
        a.dtype, a.backend, a.steps, a.rounds = "float32", "aot_eager", 2, 2
        a.modes = ",".join(m for m in a.modes.split(",") if m != "reduce-overhead")
    device = "cpu" if a.dry_run else "cuda"
    cfg = Config(vocab=1024 if not a.dry_run else 64, dim=a.dim, heads=a.heads, kv_heads=a.kv_heads,
                 layers=a.layers, hidden=a.dim * 3)
    mods = models(cfg, device, getattr(torch, a.dtype))
    g = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, cfg.vocab, (a.batch, a.seq), device=device, generator=g)
    targets = torch.randint(0, cfg.vocab, (a.batch, a.seq), device=device, generator=g)
    meta = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
                flashcore=flashcore.__version__, steps=a.steps, rounds=a.rounds, backend=a.backend,
                dry_run=a.dry_run, model="B%d S%d dim %d heads %d/%d (d%d) layers %d %s" % (
                    a.batch, a.seq, a.dim, a.heads, a.kv_heads, a.dim // a.heads, a.layers, a.dtype))
    rows = [measure(t, m, mods, ids, targets, a, device == "cuda")
            for t in a.tasks.split(",") for m in a.modes.split(",")]
    meta["flashcore_ops"] = ops_path()  # after the runs: the first op call loads the C++ kernels
    print(table(rows, meta))
    for r in rows:
        for name in IMPLS:
            if "profile_" + name in r:
                print("\n== profile: %s %s, %s\n%s" % (r["task"], r["mode"], name, r.pop("profile_" + name)))
    if a.json:
        Path(a.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
