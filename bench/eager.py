#!/usr/bin/env python3
"""Eager calls as PyTorch users make them: per-call time of
flashcore.attention, flashcore.flash_attn_func, and torch's SDPA with the
cuDNN and the flash backends, on the mission, decode and prefill shapes, in
one run on the GPU machine. flashcore.attention-py is flashcore.attention
on the binding's Python path (its C++ eager call, flashcore._torch_ext,
switched off); the JSON's meta.torch_ext says which path the plain row took.

No CUDA graphs: each system runs --calls back-to-back eager calls from
Python, --rounds times (systems interleaved, the order turned each round).
Two figures per call, medians over the rounds:

  event_us  CUDA events around the calls / calls: what a user's loop gets
            (for small calls the host is the bound, and this is host time)
  host_us   wall time to issue the calls / calls (no sync inside the loop)

Every system gets the same inputs (in the layout it takes; copies outside
the timed loop) and its output is checked against SDPA's math backend in
float32 (rel L2 against the dtype's gate). A system that cannot run a
shape gets a row with the reason.

    python3 bench/eager.py                      # GPU machine; --json eager.json
    python3 bench/eager.py --dry-run            # CPU: tiny shapes, the plumbing only
"""

import argparse
import contextlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import flashcore  # noqa: E402
from flashcore import _attention, _torch_ext  # noqa: E402
from peers import DRY_SHAPE, GATES, SHAPES as PEER_SHAPES, Shape  # noqa: E402  (bench/)


def peers_shape(name):
    return next(s for s in PEER_SHAPES if s.name == name)



# The decode shape (B8, 4k keys) beside peers.py's named shapes.
SHAPES = [peers_shape("mission"), Shape("decode-b8", 8, 32, 8, 1, 4096, 128, False, "f16"),
          peers_shape("gqa-prefill")]
DRY_SHAPES = [DRY_SHAPE, Shape("dry-decode", 2, 4, 2, 1, 24, 32, False, "f32")]
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def inputs(s, device):
    """q, k, v in [B, S, H, D] (flashcore's layout); [B, H, S, D] views of them
    are what SDPA takes."""
    g = torch.Generator(device=device).manual_seed(0)
    dt = DTYPES[s.dtype]
    return [torch.randn(shape, generator=g, device=device, dtype=dt)
            for shape in ((s.B, s.Sq, s.Hq, s.D), (s.B, s.Sk, s.Hkv, s.D), (s.B, s.Sk, s.Hkv, s.D))]


@dataclass
class System:
    name: str
    call: object      # no arguments; returns the output
    to_bshd: object   # the output in [B, S, H, D]
    context: object   # entered once around a timed loop (SDPA's backend choice)


def sdpa_system(backend, s, q, k, v):
    """SDPA on one backend over [B, H, S, D] contiguous copies (its fast
    layout); GQA by repeating k, v where the backend has no enable_gqa."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    gqa = s.Hq != s.Hkv and backend == "MATH"
    if s.Hq != s.Hkv and not gqa:
        kt, vt = (x.repeat_interleave(s.Hq // s.Hkv, dim=1) for x in (kt, vt))
    return System("sdpa-" + backend.split("_")[0].lower(),
                  lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=s.causal, enable_gqa=gqa),
                  lambda o: o.transpose(1, 2), lambda: sdpa_kernel(getattr(SDPBackend, backend)))


@contextlib.contextmanager
def python_path():
    """flashcore.attention's Python path while entered (the C++ eager call off)."""
    eager, _attention._eager = _attention._eager, None
    try:
        yield
    finally:
        _attention._eager = eager


def systems(s, q, k, v, dry):
    same = lambda o: o  # noqa: E731
    out = [
        System("flashcore.attention", lambda: flashcore.attention(q, k, v, causal=s.causal), same,
               contextlib.nullcontext),
        System("flashcore.attention-py", lambda: flashcore.attention(q, k, v, causal=s.causal), same,
               python_path),
        System("flashcore.flash_attn_func", lambda: flashcore.flash_attn_func(q, k, v, causal=s.causal),
               same, contextlib.nullcontext),
    ]
    return out + [sdpa_system(b, s, q, k, v) for b in (["MATH"] if dry else ["CUDNN_ATTENTION", "FLASH_ATTENTION"])]


def reference(s, q, k, v):
    """SDPA's math backend in float32, [B, S, H, D]."""
    # top-left is_causal equals FlashCore's bottom-right only for Sq == Sk
    assert not s.causal or s.Sq == s.Sk
    ref = sdpa_system("MATH", s, *(x.float() for x in (q, k, v)))
    with ref.context():
        return ref.to_bshd(ref.call())


def time_calls(sys_, n, cuda):
    """(event_us, host_us) per call for n back-to-back calls."""
    call = sys_.call
    with sys_.context():
        return _time_loop(call, n, cuda)


def _time_loop(call, n, cuda):
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    host = (time.perf_counter() - t0) / n * 1e6
    if not cuda:
        return host, host
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n, host


def run_shape(s, a, device):
    q, k, v = inputs(s, device)
    ref = reference(s, q, k, v)
    rows, live = [], []
    for sys_ in systems(s, q, k, v, a.dry_run):
        row = dict(asdict(s), shape=s.name, system=sys_.name)
        try:
            with sys_.context():
                o = sys_.to_bshd(sys_.call()).float()
            err = (torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref)).item()
            row.update(rel_l2=err, check="ok" if err <= GATES[s.dtype] else "FAIL")
            live.append((row, sys_))
        except Exception as e:  # a backend that does not take the shape: say why
            row["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:160])
        rows.append(row)
    cuda = device == "cuda"
    for row, call in live:  # warm-up
        time_calls(call, a.calls, cuda)
    samples = {id(row): [] for row, _ in live}
    for r in range(a.rounds):
        turn = live[r % len(live):] + live[:r % len(live)]
        for row, call in turn:
            samples[id(row)].append(time_calls(call, a.calls, cuda))
    for row, _ in live:
        ev, host = zip(*samples[id(row)])
        row.update(event_us=statistics.median(ev), host_us=statistics.median(host))
    return rows


def table(rows, meta):
    lines = ["eager per-call time, %s, torch %s, %d calls x %d rounds (medians)"
             % (meta["device"], meta["torch"], meta["calls"], meta["rounds"]), "",
             "| shape | system | event us/call | host us/call | rel L2 | check |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append("| %s | %s | - | - | - | %s |" % (r["shape"], r["system"], r["error"]))
        else:
            lines.append("| %s | %s | %.1f | %.1f | %.2g | %s |" % (
                r["shape"], r["system"], r["event_us"], r["host_us"], r["rel_l2"], r["check"]))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="back-to-back calls per timing")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--json", default=None, help="write meta and rows here")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, SDPA math: plumbing only")
    a = ap.parse_args()
    if a.dry_run:
        a.calls, a.rounds = min(a.calls, 20), min(a.rounds, 2)
    device = "cpu" if a.dry_run else "cuda"
    shapes = DRY_SHAPES if a.dry_run else SHAPES
    if a.shapes:
        shapes = [s for s in shapes if s.name in a.shapes.split(",")]
    meta = dict(device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
                torch=torch.__version__, flashcore=flashcore.__version__, calls=a.calls,
                rounds=a.rounds, dry_run=a.dry_run)
    rows = [r for s in shapes for r in run_shape(s, a, device)]
    meta["torch_ext"] = _torch_ext.describe()  # loaded by the first eager call
    print(table(rows, meta))
    print("\ntorch ops' C++ kernels: %s" % meta["torch_ext"])
    if a.json:
        Path(a.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 1 if any(r.get("check") == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
