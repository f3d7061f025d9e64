#!/usr/bin/env python3
"""Decode from a paged KV cache: FlashCore's paged kernel beside its own
contiguous decode and, when importable (a carried wheel), FlashInfer's paged
decode, same run, on the GPU machine.

Rows: B in {1, 8, 64, 128} x Skv in {1k, 8k, 32k} x Hq/Hkv in {32/8, 64/8},
D 128, bf16, one query token, every sequence's cache full (cache_seqlens =
Skv), pages of 16 and 256 keys in a shuffled block table. Systems per row:

  flashcore-paged-p16 / -p256  flashcore.attention_with_kvcache with block_table
  flashcore-contig             the same call on a contiguous [B, Skv, Hkv, D] cache
  flashcore-dense              flashcore.attention on that cache (no cache_seqlens:
                               the full cache, so the Hopper kernels may take it)
  flashinfer-p16 / -p256       BatchDecodeWithPagedKVCacheWrapper (NHD)
  flashcore-append-p16 / -contig  (--append) the paged / contiguous call that
                               also appends the step's key (k_new, v_new: the
                               cache's last row again, cache_seqlens = Skv - 1)
                               with rotary tables of the identity (cos 1, sin 0,
                               all 128 dims), so the result is the same and the
                               difference is the append step's cost

Each output is checked against a float64 reference of the first and last
sequence (rel L2, the bf16 gate of bench/peers.py). Timing is peers.py's:
CUDA graphs of calls, interleaved rounds, p50. Rates: K+V bytes read per
second, and that over the run's measured copy rate (a 1 GiB device copy,
bytes read + written per second).

    python3 bench/paged.py                 # every row
    python3 bench/paged.py --quick         # B 8/64, Skv 8k, 32/8
    python3 bench/paged.py --rows b8-s8k-32/8,b1-s1k-32/8

Writes paged.json and paged.md to --out (default $OUT, else ./out).
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (the timer, ceilings, gates, metadata and peer site)

PAGES = (16, 256)
D = 128


def row_name(B, S, hq, hkv):
    return "b%d-s%dk-%d/%d" % (B, S // 1024, hq, hkv)


def all_rows():
    return [(B, S, hq, 8) for hq in (32, 64) for S in (1024, 8192, 32768) for B in (1, 8, 64, 128)]


QUICK = ["b8-s8k-32/8", "b64-s8k-32/8", "b1-s1k-32/8"]


class Cache:
    """One row's inputs: q, the contiguous cache, and per page size the
    paged cache (pages shuffled) with its block table; all random."""

    def __init__(self, torch, B, S, hq, hkv):
        g = torch.Generator(device="cuda").manual_seed(B * 7919 + S + hq)
        dt = torch.bfloat16
        self.B, self.S, self.hq, self.hkv = B, S, hq, hkv
        self.q = torch.randn(B, 1, hq, D, device="cuda", dtype=dt, generator=g)
        self.k = torch.randn(B, S, hkv, D, device="cuda", dtype=dt, generator=g)
        self.v = torch.randn(B, S, hkv, D, device="cuda", dtype=dt, generator=g)
        self.seqlens = torch.full((B,), S, dtype=torch.int32, device="cuda")
        self.paged = {}
        for ps in PAGES:
            per = S // ps
            perm = torch.randperm(B * per, device="cuda", generator=g)
            table = perm.view(B, per).to(torch.int32)
            kp = torch.empty(B * per, ps, hkv, D, device="cuda", dtype=dt)
            vp = torch.empty_like(kp)
            kp[perm] = self.k.reshape(B * per, ps, hkv, D)
            vp[perm] = self.v.reshape(B * per, ps, hkv, D)
            self.paged[ps] = (kp, vp, table.contiguous(), perm)

    def kv_bytes(self):
        return 2 * self.B * self.S * self.hkv * D * 2

    def reference(self, torch, b):
        """float64 attention of sequence b's one query token over its cache."""
        q = self.q[b, 0].double()                      # [hq, D]
        k = self.k[b].double().repeat_interleave(self.hq // self.hkv, dim=1)  # [S, hq, D]
        v = self.v[b].double().repeat_interleave(self.hq // self.hkv, dim=1)
        s = torch.einsum("hd,shd->hs", q, k) / D ** 0.5
        return torch.einsum("hs,shd->hd", torch.softmax(s, dim=-1), v)


def append_systems(fc, cache):
    """The step appends the last key again (cache_seqlens = Skv - 1) with
    identity rotary tables: the same result, so the difference is the step."""
    out, S, q = {}, cache.S, cache.q
    step = dict(k_new=cache.k[:, S - 1:S].clone(), v_new=cache.v[:, S - 1:S].clone(),
                rotary_cos=q.new_ones(S, D // 2), rotary_sin=q.new_zeros(S, D // 2),
                cache_seqlens=cache.seqlens - 1)
    kp, vp, table, _ = cache.paged[16]
    o = cache.q.new_empty(cache.q.shape)
    out["flashcore-append-p16"] = (lambda o=o: fc.attention_with_kvcache(
        cache.q, kp, vp, block_table=table, out=o, **step), o)
    o = cache.q.new_empty(cache.q.shape)
    out["flashcore-append-contig"] = (lambda o=o: fc.attention_with_kvcache(cache.q, cache.k, cache.v, out=o, **step),
                                      o)
    return out


def flashcore_systems(fc, cache):
    out = {}
    for ps in PAGES:
        kp, vp, table, _ = cache.paged[ps]
        o = cache.q.new_empty(cache.q.shape)
        out["flashcore-paged-p%d" % ps] = (
            lambda o=o, kp=kp, vp=vp, table=table: fc.attention_with_kvcache(
                cache.q, kp, vp, cache_seqlens=cache.seqlens, block_table=table, out=o), o)
    o = cache.q.new_empty(cache.q.shape)
    out["flashcore-contig"] = (lambda o=o: fc.attention_with_kvcache(
        cache.q, cache.k, cache.v, cache_seqlens=cache.seqlens, out=o), o)
    o = cache.q.new_empty(cache.q.shape)
    out["flashcore-dense"] = (lambda o=o: fc.attention(cache.q, cache.k, cache.v, out=o), o)
    return out


def flashinfer_systems(torch, cache):
    try:
        import flashinfer
    except Exception as e:
        return {}, "unavailable: %s" % peers.short_error(e)
    out = {}
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for ps in PAGES:
        kp, vp, table, _ = cache.paged[ps]
        per = cache.S // ps
        indptr = torch.arange(0, (cache.B + 1) * per, per, dtype=torch.int32, device="cuda")
        last = torch.full((cache.B,), ps, dtype=torch.int32, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(indptr, table.reshape(-1), last, cache.hq, cache.hkv, D, ps, q_data_type=torch.bfloat16)
        o = cache.q.new_empty(cache.B, cache.hq, D)
        q3 = cache.q.view(cache.B, cache.hq, D)
        out["flashinfer-p%d" % ps] = (lambda w=w, kp=kp, vp=vp, o=o, q3=q3: w.run(q3, (kp, vp), out=o),
                                      o.view(cache.B, 1, cache.hq, D))
    return out, None


def check(torch, cache, out):
    errs = []
    for b in {0, cache.B - 1}:
        ref = cache.reference(torch, b)
        errs.append(peers.rel_l2([out[b, 0]], ref[None]))
    return max(errs)


def time_row(torch, timer, runs, args):
    """p50 seconds per call of each system: graphs of ~replay_s each, then
    peers.py's warm-up and interleaved rounds."""
    replays, calls = [], {}
    for name, fn in runs.items():
        est = timer.estimate(lambda i, fn=fn: fn(), 1)
        calls[name] = max(1, min(200, int(args.replay_s / max(est, 1e-7))))
        replays.append((name, timer.capture(lambda i, fn=fn: fn(), calls[name], 1)))
    samples = peers.interleaved_rounds(timer, replays, args.warmup_s, args.rounds)
    return {n: statistics.median(v) / calls[n] for n, v in samples.items()}


def run_row(torch, fc, timer, spec, args, copy_tbps, unavailable):
    B, S, hq, hkv = spec
    cache = Cache(torch, B, S, hq, hkv)
    systems = flashcore_systems(fc, cache)
    if args.append:
        systems.update(append_systems(fc, cache))
    if "flashinfer" not in unavailable:
        fi, why = flashinfer_systems(torch, cache)
        if why:
            unavailable["flashinfer"] = why
        systems.update(fi)
    rows, runs = [], {}
    for name, (fn, out) in systems.items():
        row = {"row": row_name(*spec), "system": name, "B": B, "Skv": S, "Hq": hq, "Hkv": hkv, "D": D}
        try:
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            row["rel_err"] = check(torch, cache, out)
            row["check"] = "ok" if row["rel_err"] <= peers.GATES["bf16"] else "FAIL"
            if name.startswith("flashcore"):
                row["kernel"] = fc.kernel_info.name
            runs[name] = fn
        except Exception as e:
            row["error"] = peers.short_error(e)
        rows.append(row)
    times = time_row(torch, timer, runs, args) if runs else {}
    for row in rows:
        t = times.get(row["system"])
        if t:
            row["p50_us"] = round(t * 1e6, 2)
            row["tbps"] = round(cache.kv_bytes() / t / 1e12, 3)
            if copy_tbps:
                row["of_copy"] = round(row["tbps"] / copy_tbps, 3)
        peers.log("  %-22s %s" % (row["system"], {k: row[k] for k in row if k in
                                                   ("p50_us", "tbps", "of_copy", "rel_err", "error", "kernel")}))
    return rows


def markdown(result):
    rows = result["rows"]
    systems = [s for s in ["flashcore-paged-p16", "flashcore-paged-p256", "flashcore-contig", "flashcore-dense",
                           "flashcore-append-p16", "flashcore-append-contig", "flashinfer-p16", "flashinfer-p256"]
               if any(r["system"] == s for r in rows)]
    lines = ["| row | " + " | ".join(systems) + " | p16 / best contiguous | p256 / best contiguous |",
             "|---" * (len(systems) + 3) + "|"]
    by = {(r["row"], r["system"]): r for r in rows}
    for name in dict.fromkeys(r["row"] for r in rows):
        cells, t = [], {}
        for s in systems:
            r = by.get((name, s), {})
            t[s] = r.get("p50_us")
            cells.append("%.1f us (%.0f%%)" % (r["p50_us"], 100 * r.get("of_copy", 0)) if r.get("p50_us")
                         else r.get("error", "-")[:30])
        contig = min([t[c] for c in ("flashcore-contig", "flashcore-dense") if t.get(c)] or [0])
        ratio = [("%.3f" % (contig / t[p]) if t.get(p) and contig else "-")
                 for p in ("flashcore-paged-p16", "flashcore-paged-p256")]
        lines.append("| %s | %s | %s |" % (name, " | ".join(cells), " | ".join(ratio)))
    return "\n".join(lines) + "\n"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", help="comma-separated row names (b8-s8k-32/8 ...)")
    ap.add_argument("--quick", action="store_true", help="three rows, few rounds")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup-s", type=float, default=0.7)
    ap.add_argument("--replay-s", type=float, default=0.01, help="target seconds per graph replay")
    ap.add_argument("--max-total-s", type=float, default=400)
    ap.add_argument("--append", action="store_true", help="also time the calls with the append step")
    ap.add_argument("--out")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    specs = all_rows()
    names = args.rows.split(",") if args.rows else (QUICK if args.quick else None)
    if names:
        specs = [s for s in specs if row_name(*s) in names]
    if args.quick:
        args.rounds = min(args.rounds, 7)
    out_dir = Path(args.out or os.environ.get("OUT") or "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    import flashcore as fc
    meta = {"tool": "bench/paged.py", "argv": sys.argv[1:],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "timing": "CUDA events over CUDA-graph replays; interleaved rounds; p50",
            "rate": "K+V bytes read per second; of_copy: over the run's copy rate (read + write bytes/s)"}
    meta.update(peers.flashcore_meta())
    meta.update(peers.torch_meta(torch, cuda=True))
    copy = meta["ceilings"].get("copy_tbps")
    peers.log("paged.py: %s; copy %.3f TB/s" % (meta.get("flashcore_build"), copy or 0))
    timer, rows, unavailable, t0 = peers.GraphTimer(torch), [], {}, time.perf_counter()
    with torch.no_grad():
        for spec in specs:
            if time.perf_counter() - t0 > args.max_total_s:
                peers.log("== %s skipped: --max-total-s" % row_name(*spec))
                continue
            peers.log("== %s" % row_name(*spec))
            try:
                rows += run_row(torch, fc, timer, spec, args, copy, unavailable)
            except Exception as e:  # out of memory for the biggest rows, most likely
                peers.log("  row FAILED: %s" % peers.short_error(e))
                rows.append({"row": row_name(*spec), "system": "*", "error": peers.short_error(e)})
            torch.cuda.empty_cache()
    meta["unavailable"] = unavailable
    result = {"meta": meta, "rows": rows}
    (out_dir / "paged.json").write_text(json.dumps(result, indent=1))
    (out_dir / "paged.md").write_text(markdown(result))
    print(markdown(result))
    return 1 if any(r.get("check") == "FAIL" and r["system"].startswith("flashcore") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
