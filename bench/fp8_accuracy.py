#!/usr/bin/env python3
"""FP8 attention's accuracy against the float64 reference, with and without
incoherent processing (flashcore.hadamard on q and k before they are
quantised): RMSE and largest absolute error of out, on N(0, 1) inputs and
on FlashAttention-3's outlier distribution (N(0, 1) + N(0, 100) x
Bernoulli(0.001), every element of q, k and v), same inputs for every row.
The rotation is applied to q and k (scores unchanged), or to q, k and v
with out rotated back (out = attention(qR, kR, vR) R: R is its own inverse),
which takes V's outliers out of its scale too.

Modes: `qkv`, q, k and v in e4m3 with per-tensor descales (amax / 448);
`kv`, bf16 q over an e4m3 K/V cache (the serving form); and `bf16`, the
inputs rounded to bf16 (the baseline). out is bf16. The reference is the
library's float64 oracle (cpu_reference) on the unquantised inputs; a
rotation leaves its scores unchanged, so every row is judged against the
same reference. What the
CPU backend measures is the inputs' quantisation alone (it computes P and
the sums in fp32); a GPU kernel that rounds P to FP8 adds its own error.

    python3 bench/fp8_accuracy.py                       # CPU backend
    python3 bench/fp8_accuracy.py --backend cuda        # where FP8 runs on the GPU
    python3 bench/fp8_accuracy.py --dry-run             # tiny shape (CI)
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
import flashcore  # noqa: E402

try:
    import ml_dtypes
except ImportError:  # FP8 and bf16 numpy arrays need it
    ml_dtypes = None

E4M3_MAX = 448.0
# what hadamard() rotates: nothing; q and k; q, k and v (out rotated back)
ROTATIONS = ("none", "qk", "qkv")
ROTATION_NAMES = {"none": "no", "qk": "q, k", "qkv": "q, k, v (out back)"}


def inputs(dist, shape, seed):
    """q, k, v (float64, [B, S, H, D]) of distribution dist."""
    rng = np.random.default_rng(seed)
    xs = []
    for _ in range(3):
        x = rng.standard_normal(shape)
        if dist == "outliers":
            x += rng.standard_normal(shape) * 10.0 * (rng.random(shape) < 1e-3)  # N(0, 100): sd 10
        xs.append(x)
    return xs


def reference(q, k, v, causal):
    """The library's float64 oracle (backend 'cpu_reference') on the
    unquantised inputs."""
    return np.asarray(flashcore.attention(q, k, v, causal=causal, backend="cpu_reference"))


def fp8(x):
    """x in e4m3 with its per-tensor descale (amax / 448)."""
    ds = float(np.abs(x).max()) / E4M3_MAX or 1.0
    return (x / ds).astype(ml_dtypes.float8_e4m3fn), ds


def on_device(x, backend):
    """x (a bf16 or e4m3 numpy array) as the backend takes it: a torch CUDA
    tensor of the same bits for 'cuda', else x itself."""
    if backend != "cuda":
        return x
    import torch
    if x.dtype == ml_dtypes.float8_e4m3fn:
        return torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn).cuda()
    return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda()


def to_host(out):
    """out (numpy, or a torch tensor on any device) as float64 numpy."""
    if hasattr(out, "detach"):
        return out.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(out).astype(np.float64)


def run(mode, q, k, v, causal, backend):
    """out (float64) of one mode, or the reason it cannot run."""
    bf16 = ml_dtypes.bfloat16
    kw = dict(causal=causal, backend=backend)
    dev = lambda x: on_device(x, backend)  # noqa: E731
    try:
        if mode == "bf16":
            out = flashcore.attention(dev(q.astype(bf16)), dev(k.astype(bf16)), dev(v.astype(bf16)), **kw)
        elif mode == "kv":
            (k8, kd), (v8, vd) = fp8(k), fp8(v)
            out = flashcore.attention(dev(q.astype(bf16)), dev(k8), dev(v8), k_descale=kd, v_descale=vd, **kw)
        else:
            (q8, qd), (k8, kd), (v8, vd) = fp8(q), fp8(k), fp8(v)
            if backend == "cuda":
                import torch
                bf16 = torch.bfloat16
            out = flashcore.attention(dev(q8), dev(k8), dev(v8), q_descale=qd, k_descale=kd, v_descale=vd,
                                      out_dtype=bf16, **kw)
    except flashcore.FlashCoreError as e:
        return None, "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:160])
    return to_host(out), None


def rows(a):
    shape = (a.batch, a.seq, a.heads, a.dim)
    out = []
    for dist in ("normal", "outliers"):
        q, k, v = inputs(dist, shape, a.seed)
        want = reference(q, k, v, a.causal)
        rq, rk, rv = (flashcore.hadamard(x) for x in (q, k, v))
        for mode in ("bf16", "kv", "qkv"):
            for rotated in (("none",) if mode == "bf16" else ROTATIONS):
                ops = {"none": (q, k, v), "qk": (rq, rk, v), "qkv": (rq, rk, rv)}[rotated]
                got, why = run(mode, *ops, a.causal, a.backend)
                if got is not None and rotated == "qkv":
                    got = flashcore.hadamard(got)
                row = dict(distribution=dist, mode=mode, rotated=rotated)
                if got is None:
                    row["error"] = why
                else:
                    err = got - want
                    row.update(rmse=float(np.sqrt(np.mean(err ** 2))), max_abs=float(np.abs(err).max()))
                out.append(row)
    return out


def table(rs, meta):
    lines = ["FP8 attention accuracy, %s; out vs the float64 attention of the unquantised inputs" % meta["setup"],
             "", "| distribution | mode | hadamard on | RMSE | max abs error |", "|---|---|---|---|---|"]
    for r in rs:
        vals = "%.3g | %.3g" % (r["rmse"], r["max_abs"]) if "rmse" in r else "- | %s" % r["error"]
        lines.append("| %s | %s | %s | %s |" % (r["distribution"], r["mode"], ROTATION_NAMES[r["rotated"]], vals))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="a tiny shape (CI)")
    a = ap.parse_args()
    if ml_dtypes is None:
        print("fp8_accuracy: needs ml_dtypes (numpy FP8 and bf16 arrays)", file=sys.stderr)
        return 2
    if a.dry_run:
        a.seq, a.heads, a.dim = 64, 2, 64
    meta = dict(setup="B%d S%d H%d D%d%s, backend %s, seed %d" % (a.batch, a.seq, a.heads, a.dim,
                                                                 " causal" if a.causal else "", a.backend, a.seed),
                dry_run=a.dry_run, flashcore=flashcore.__version__, build=flashcore.build_info())
    rs = rows(a)
    print(table(rs, meta))
    if a.json:
        Path(a.json).write_text(json.dumps(dict(meta=meta, rows=rs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
