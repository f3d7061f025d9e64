#!/usr/bin/env python3
"""FlashCore beside its peers: attention forward (or, with --bwd, backward) on the
benchmark shapes (docs/PERF.md), in one process on the GPU machine.

Systems: FlashCore on each CUDA path it has (forced with cuda_path=90 / 80),
PyTorch SDPA's flash (FA2), cuDNN and memory-efficient backends, compiled
FlexAttention, and, when importable (carried wheels), FlashAttention-4 and
FlashInfer. Every system gets the same random inputs (each in the memory
layout it takes natively, copied outside the timed region), its output is
checked against a float64 reference on a subset of rows/heads/batches
(rel L2 per system), then it is timed:

  - each system's calls are captured into a CUDA graph (n calls per replay,
    cycling over several input sets so that small shapes do not sit in L2);
  - >= --warmup-s seconds of replays of every system first (the clock ramps);
  - then rounds A, B, C / B, C, A / ... (interleaved, the order turned by one
    each round, each round behind an untimed replay), one CUDA-event-timed
    replay per system per round; each system's median over the rounds;
  - SM clock and temperature (nvidia-smi) before, after each shape, after.

TFLOP/s = 4*B*Hq*Sq*Sk*D / time (halved when causal with Sq == Sk).
Outputs in --out (default $OUT, else ./out): peers.json (meta + one row per
(shape, system), row keys as `flashcore bench` writes them: shape, system,
p50_us, tflops, ...), peers.md (TFLOP/s table with FlashCore / best peer per
shape) and peers.png (bar chart).

--bwd times the backward instead, into peers-bwd.{json,md,png} (rows carry
"pass": "bwd", as `flashcore bench --bwd` writes them): FlashCore's
flashcore.attention_backward on each CUDA path (flashcore-sm90, -sm80;
deterministic 1 as flashcore-sm90-det, -sm80-det)
on the out and lse of its own forward, and SDPA's cuDNN and flash (FA2)
backwards through torch.autograd.grad on a forward kept from outside the
timing. The shapes: the forward's prefill shapes, gqa-train and gqa-step. Each
system's dq, dk, dv are checked against float64 gradients of the first and
last batch and KV head (with every query head of their groups, all rows),
rel L2 per gradient against the CUDA backward's gate. TFLOP/s count 2.5x the forward's FLOPs (five matrix
products against two). The peers' backward runs where their forward ran
(autograd follows the forward's stream): the shape's work all goes on one
side stream, which the graphs are captured on.

    python3 bench/peers.py                        # every shape (GPU machine)
    python3 bench/peers.py --quick                # 2 small shapes, few rounds
    python3 bench/peers.py --shapes mission,gqa-decode --systems flashcore,cudnn
    python3 bench/peers.py --dry-run              # no GPU: CPU smoke + fake rows
    python3 bench/peers.py --bwd --quick          # the backward, 2 shapes

The binding is found as python/flashcore (this checkout) and the library via
FLASHCORE_LIBRARY or build/ (see python/flashcore/_lib.py).
"""

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

# Optional peers carried as wheels are installed with `pip --target` into a
# folder named by FLASHCORE_PEER_SITE; addsitedir (unlike PYTHONPATH) also
# runs that folder's .pth files, which nvidia-cutlass-dsl needs for FA4.
if os.environ.get("FLASHCORE_PEER_SITE"):
    import site
    site.addsitedir(os.environ["FLASHCORE_PEER_SITE"])


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))


# ---- shapes (docs/PERF.md; the same names as tools/cli_shapes.c) -------------

@dataclass(frozen=True)
class Shape:
    name: str
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    causal: bool
    dtype: str  # "f16" | "bf16" | "f32"
    sets: str = "fwd bwd"  # the default runs it is in: "fwd", "bwd" or both (as tools/cli_shapes.c)

    @property
    def flops(self):
        f = 4.0 * self.B * self.Hq * self.Sq * self.Sk * self.D
        return f / 2 if self.causal and self.Sq == self.Sk else f


SHAPES = [
    Shape("mission", 1, 8, 8, 512, 512, 64, False, "f16"),
    Shape("mission-causal", 1, 8, 8, 512, 512, 64, True, "f16"),
    Shape("s512-d64", 32, 32, 32, 512, 512, 64, False, "bf16"),
    Shape("s2k-d128", 8, 16, 16, 2048, 2048, 128, False, "bf16"),
    Shape("s2k-d128-causal", 8, 16, 16, 2048, 2048, 128, True, "bf16"),
    Shape("s8k-d128", 2, 16, 16, 8192, 8192, 128, False, "bf16"),
    Shape("s8k-d128-causal", 2, 16, 16, 8192, 8192, 128, True, "bf16"),
    Shape("s16k-d64", 1, 32, 32, 16384, 16384, 64, False, "f16"),
    Shape("s4k-d256", 4, 8, 8, 4096, 4096, 256, False, "bf16"),
    Shape("gqa-prefill", 1, 32, 8, 4096, 4096, 128, True, "bf16"),
    Shape("gqa-decode", 32, 32, 8, 1, 8192, 128, False, "bf16", "fwd"),  # a decode step has no backward
    Shape("gqa-train", 4, 32, 8, 4096, 4096, 128, True, "bf16", "bwd"),
    Shape("gqa-step", 4, 8, 2, 512, 512, 64, True, "bf16"),  # bench/compiled.py's decoder: a small grid, both passes
]
QUICK_SHAPES = {"fwd": ["mission", "s2k-d128-causal"], "bwd": ["mission", "gqa-train"]}
# The CPU smoke of --dry-run: tiny, f32, GQA, causal.
DRY_SHAPE = Shape("dry-cpu-tiny", 2, 4, 2, 64, 64, 64, True, "f32")

# rel L2 gates per dtype: the project's (tools/kit.c kit_gate_for; the
# backward's: the rel_l2 of tools/kit_bwd.c's CUDA rows, 1.5x the worst of
# PyTorch's own backward on the kit's cases).
GATES = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2}
BWD_GATES = {"f32": 2e-5, "f16": 6.45e-4, "bf16": 5.13e-3}
# The backward's FLOPs against the forward's: five matrix products (S
# recomputed, dV, dP, dQ, dK) against two (kit_flops_backward).
BWD_FLOP_FACTOR = 2.5

SYSTEM_ORDER = ["flashcore-sm90", "flashcore-sm80", "flashcore-sm90-det", "flashcore-sm80-det", "torch-cudnn",
                "torch-flash(FA2)", "torch-efficient", "torch-flex(Triton)", "fa4", "flashinfer", "torch-math"]


def pass_name(bwd):
    return "bwd" if bwd else "fwd"


def pass_flops(shape, bwd):
    return shape.flops * (BWD_FLOP_FACTOR if bwd else 1.0)


def is_flashcore(name):
    return name.startswith("flashcore")


def is_peer(name):
    """Another library: neither a FlashCore path nor one of its A/B variants
    (sm90-NAME, sm80-row<N>: --sm90-env, --sm90-rows and the like)."""
    return not is_flashcore(name) and not re.match(r"sm\d+-", name)


# ---- small helpers ----------------------------------------------------------

def log(*a):
    print(*a, flush=True)


def short_error(e, n=300):
    s = ("%s: %s" % (type(e).__name__, e)).strip().replace("\n", " ")
    return s[:n]


def gpu_state():
    """SM clock and temperature now (nvidia-smi), or why not."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip() or r.stderr.strip()
    except Exception as e:  # no nvidia-smi (dry run) or it hung
        return "unavailable: %s" % short_error(e, 120)


class SkipSystem(Exception):
    """A system that does not handle this shape (recorded as the row's error)."""


# ---- inputs and reference -----------------------------------------------------

class Inputs:
    """n_sets independent random (q, k, v) sets of one shape. bshd[i] holds
    [B,S,H,D] contiguous tensors (the library's order, FA4's, FlashInfer's);
    bhsd(i) gives [B,H,S,D] contiguous copies (torch SDPA's / flex's order),
    made once, outside any timing. Values are identical in both. With
    with_dout (the backward) each set also has dout[i] (like out, [B,Sq,Hq,D])
    and dout_bhsd(i)."""

    def __init__(self, torch, shape, n_sets, device, seed, with_dout=False):
        dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[shape.dtype]
        self.torch, self.dtype = torch, dt
        g = torch.Generator(device=device).manual_seed(seed)
        s = shape

        def randn(dims):
            return torch.randn(dims, generator=g, device=device, dtype=torch.float32).to(dt)

        self.bshd, self.dout = [], []
        for _ in range(n_sets):
            self.bshd.append(tuple(randn(d) for d in ((s.B, s.Sq, s.Hq, s.D), (s.B, s.Sk, s.Hkv, s.D),
                                                      (s.B, s.Sk, s.Hkv, s.D))))
            if with_dout:
                self.dout.append(randn((s.B, s.Sq, s.Hq, s.D)))
        self._bhsd = {}

    def bhsd(self, i):
        if i not in self._bhsd:
            self._bhsd[i] = tuple(t.transpose(1, 2).contiguous() for t in self.bshd[i])
        return self._bhsd[i]

    def dout_bhsd(self, i):
        key = ("dout", i)
        if key not in self._bhsd:
            self._bhsd[key] = self.dout[i].transpose(1, 2).contiguous()
        return self._bhsd[key]

    @property
    def n_sets(self):
        return len(self.bshd)


class Reference:
    """float64 attention on a subset of set 0: batches, heads and query rows
    chosen to bound memory/time on big shapes (first/last of each, rows evenly
    spaced including the last, which sees every key when causal)."""

    def __init__(self, torch, shape, inputs, max_rows=1024, max_score_elems=1 << 25):
        s = shape
        q, k, v = inputs.bshd[0]
        dev = q.device
        self.batches = sorted({0, s.B - 1})
        self.heads = sorted({0, s.Hq // 2, s.Hq - 1})
        budget = max(16, max_score_elems // max(1, s.Sk * len(self.heads)))
        n_rows = min(s.Sq, max_rows, budget)
        if n_rows >= s.Sq:
            rows = torch.arange(s.Sq, device=dev)
        else:
            rows = torch.linspace(0, s.Sq - 1, n_rows, device=dev).round().long().unique()
        self.rows = rows
        group = s.Hq // s.Hkv
        kv_heads = [h // group for h in self.heads]
        scale = 1.0 / math.sqrt(s.D)
        out = []
        for b in self.batches:
            qs = q[b].index_select(0, rows)[:, self.heads].double()      # [R, Hs, D]
            ks = k[b][:, kv_heads].double()                                # [Sk, Hs, D]
            vs = v[b][:, kv_heads].double()
            sc = torch.einsum("rhd,khd->hrk", qs, ks) * scale
            if s.causal:  # bottom-right aligned, as the library (and FA)
                diag = rows + (s.Sk - s.Sq)
                vis = torch.arange(s.Sk, device=dev)[None, :] <= diag[:, None]
                sc = sc.masked_fill(~vis[None], float("-inf"))
            p = torch.softmax(sc, dim=-1)
            out.append(torch.einsum("hrk,khd->rhd", p, vs))
            del sc, p
        self.out = torch.stack(out)  # [nb, R, Hs, D] float64

    def describe(self):
        return "%d batch x %d heads x %d rows" % (len(self.batches), len(self.heads), len(self.rows))

    def rel_err(self, o):
        """||o - ref|| / ||ref|| on the subset; o is [B,Sq,Hq,D]-indexed."""
        sub = [o[b].index_select(0, self.rows)[:, self.heads] for b in self.batches]
        return rel_l2(sub, self.out)

    def details(self, o):
        return {}


def rel_l2(parts, ref):
    """||stack(parts) - ref|| / ||ref|| in float64 (||.|| alone when ref is 0)."""
    torch = sys.modules["torch"]
    num = torch.linalg.vector_norm(torch.stack(parts).double() - ref)
    den = torch.linalg.vector_norm(ref)
    return float(num / den) if float(den) > 0 else float(num)


def attention_grads(torch, q, k, v, do, scale, causal, max_elems):
    """float64 dq, dk, dv of one KV head's group: q, do [Sq, G, D] (the G
    query heads sharing k, v [Sk, D]), bottom-right causal. Query rows go in
    blocks of at most max_elems scores; out, the softmax and D = rowsum(dO*O)
    are the block's own (exact), so nothing depends on a system's lse."""
    Sq, G, _ = q.shape
    Sk = k.shape[0]
    dq = torch.empty_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    step = max(1, max_elems // max(1, G * Sk))
    for r0 in range(0, Sq, step):
        r1 = min(Sq, r0 + step)
        qb, dob = q[r0:r1], do[r0:r1]
        s = torch.einsum("rgd,kd->grk", qb, k) * scale
        if causal:
            diag = torch.arange(r0, r1, device=q.device) + (Sk - Sq)
            hidden = torch.arange(Sk, device=q.device)[None, :] > diag[:, None]
            s = s.masked_fill(hidden[None], float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key: p = 0
        o = torch.einsum("grk,kd->rgd", p, v)
        dv += torch.einsum("grk,rgd->kd", p, dob)
        dp = torch.einsum("rgd,kd->grk", dob, v)
        ds = p * (dp - (dob * o).sum(-1).transpose(0, 1)[:, :, None])
        dq[r0:r1] = torch.einsum("grk,kd->rgd", ds, k) * scale
        dk += torch.einsum("grk,rgd->kd", ds, qb) * scale
        del s, p, dp, ds
    return dq, dk, dv


class BwdReference:
    """float64 gradients of set 0 on a subset: the first and last batch, the
    first and last KV head with every query head of their groups and every
    row (dk and dv sum over all of them), from q, k, v and dout alone, then
    rounded to the dtype as the kit's reference backward is (the gates were
    set against that)."""

    def __init__(self, torch, shape, inputs, max_elems=1 << 24):
        s = shape
        q, k, v = inputs.bshd[0]
        do = inputs.dout[0]
        group = s.Hq // s.Hkv
        self.batches = sorted({0, s.B - 1})
        self.kv_heads = sorted({0, s.Hkv - 1})
        self.heads = [g * group + j for g in self.kv_heads for j in range(group)]
        scale = 1.0 / math.sqrt(s.D)
        per_batch = []
        for b in self.batches:
            per_kv = []
            for g in self.kv_heads:
                hs = slice(g * group, (g + 1) * group)
                per_kv.append(attention_grads(torch, q[b][:, hs].double(), k[b][:, g].double(),
                                              v[b][:, g].double(), do[b][:, hs].double(), scale, s.causal,
                                              max_elems))
            per_batch.append((torch.cat([x[0] for x in per_kv], dim=1),   # [Sq, heads, D]
                              torch.stack([x[1] for x in per_kv], dim=1),  # [Sk, kv_heads, D]
                              torch.stack([x[2] for x in per_kv], dim=1)))
        self.grads = [torch.stack([pb[i] for pb in per_batch]).to(inputs.dtype).double() for i in range(3)]

    def describe(self):
        return "%d batch x %d KV heads (%d query heads), every row" % (len(self.batches), len(self.kv_heads),
                                                                      len(self.heads))

    def errors(self, grads):
        """rel L2 of dq, dk, dv on the subset; grads are [B,S,H,D]-indexed."""
        heads = (self.heads, self.kv_heads, self.kv_heads)
        return [rel_l2([g[b][:, h] for b in self.batches], ref) for g, h, ref in zip(grads, heads, self.grads)]

    def rel_err(self, grads):
        return max(self.errors(grads))

    def details(self, grads):
        return {"rel_err_" + n: e for n, e in zip(("dq", "dk", "dv"), self.errors(grads))}


# ---- systems ------------------------------------------------------------------
# A system's prepare(shape, inputs) returns run(i) (one call on input set i,
# the unit that is captured and timed) and output(i) (its last output on set
# i as a [B,Sq,Hq,D]-indexed tensor), or raises SkipSystem / any error.

class System:
    name = "?"
    kernel = ""

    def available(self):
        """None if usable here, else the reason."""
        return None

    def prepare(self, shape, inputs):
        raise NotImplementedError


class FlashCore(System):
    def __init__(self, path, backend="cuda"):
        self.path, self.backend = path, backend
        self.name = "flashcore-sm%d" % path if path else "flashcore-%s" % backend
        try:
            import flashcore
            self.fc = flashcore
            self.fc.__version__  # loads the library
            self.err = None
        except Exception as e:
            self.fc, self.err = None, "unavailable: %s" % short_error(e)

    def available(self):
        if self.err:
            return self.err
        if self.backend == "cuda" and not self.fc.cuda_available():
            return "unavailable: libflashcore has no CUDA backend or no device of a compiled architecture"
        return None

    def prepare(self, shape, inputs):
        torch, fc = inputs.torch, self.fc
        outs = [torch.empty_like(inputs.bshd[i][0]) for i in range(inputs.n_sets)]
        kw = dict(causal=shape.causal, backend=self.backend, cuda_path=self.path or None)
        ok, why = fc.supported(*inputs.bshd[0], out=outs[0], **kw)
        if not ok:
            raise SkipSystem("unsupported: " + why)
        self.kernel = why
        self.info = None

        def run(i):
            fc.attention(*inputs.bshd[i], out=outs[i], **kw)
            self.info = fc.kernel_info  # what ran (this thread's last call)

        return run, lambda i: outs[i]


class _Forced:
    """A tuning hook forced around every call (prepare, run, graph capture)
    of the FlashCore system it is mixed into, named by its fc_tuning field:
    an A/B of the hook. A column of its own, not counted as FlashCore in
    FC/peer."""

    def __init__(self, name, key, value, path=90):
        super().__init__(path)
        self.name, self.KEY, self.value = name, key, str(value)

    def _forced(self, fn, *a):
        fc = self.fc
        field = self.KEY if self.KEY in fc._lib.TUNING_FIELDS else None
        if field is None:
            raise SystemExit("%s is not a tuning field (%s)" % (self.KEY, ", ".join(fc._lib.TUNING_FIELDS)))
        old = fc.get_tuning()
        fc.set_tuning(**dict(old, **{field: self.value if field == "sm90_trace_file" else int(self.value)}))
        try:
            return fn(*a)
        finally:
            fc.set_tuning(**old)

    def prepare(self, shape, inputs):
        run, out = self._forced(super().prepare, shape, inputs)
        return (lambda i: self._forced(run, i)), out


class FlashCoreEnv(_Forced, FlashCore):
    """One CUDA path's forward with a tuning hook forced (_Forced)."""


class FlashCoreRow(FlashCoreEnv):
    """One path with one row of its tile table forced through
    the sm90_config (path 90) or sm80_config (path 80) hook: an A/B
    of rows (or code variants) the planner would not pick here. Named
    sm90-row<N> / sm80-row<N>."""

    def __init__(self, row, path=90):
        super().__init__("sm%d-row%s" % (path, row), "sm%d_config" % path, row, path)
        self.row = str(row)


class TorchSDPA(System):
    BACKENDS = {"torch-flash(FA2)": "FLASH_ATTENTION", "torch-cudnn": "CUDNN_ATTENTION",
                "torch-efficient": "EFFICIENT_ATTENTION", "torch-math": "MATH"}

    def __init__(self, name):
        self.name = name

    def check_shape(self, shape):
        if shape.causal and shape.Sq != shape.Sk:
            raise SkipSystem("torch SDPA is_causal is top-left aligned; FlashCore's is bottom-right "
                             "(they differ when Sq != Sk)")

    def backend(self):
        from torch.nn.attention import SDPBackend
        return getattr(SDPBackend, self.BACKENDS[self.name])

    def prepare(self, shape, inputs):
        from torch.nn.attention import sdpa_kernel
        import torch.nn.functional as F
        self.check_shape(shape)
        backend = self.backend()
        gqa = shape.Hq != shape.Hkv
        outs = {}

        def run(i):
            q, k, v = inputs.bhsd(i)
            with sdpa_kernel([backend]):
                outs[i] = F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, enable_gqa=gqa)

        return run, lambda i: outs[i].transpose(1, 2)


class FlashCoreBwd(FlashCore):
    """FlashCore's backward (flashcore.attention_backward), deterministic or
    not, on the out and lse of its own forward, computed once per input set
    before any timing; dq, dk, dv are preallocated per set."""

    def __init__(self, path, deterministic=False, backend="cuda"):
        super().__init__(path, backend)
        self.det = deterministic
        self.name += "-det" if deterministic else ""

    def available(self):
        why = super().available()
        if why is None and not hasattr(self.fc, "attention_backward"):
            why = "unavailable: this flashcore binding has no attention_backward"
        return why

    def prepare(self, shape, inputs):
        torch, fc = inputs.torch, self.fc
        kw = dict(causal=shape.causal, backend=self.backend)
        ok, why = fc.supported(*inputs.bshd[0], **kw)
        if not ok:
            raise SkipSystem("unsupported (forward): " + why)
        saved = [fc.attention(*inputs.bshd[i], return_lse=True, **kw) for i in range(inputs.n_sets)]
        kw["cuda_path"] = self.path or None  # the backward's kernel family
        grads = [tuple(torch.empty_like(t) for t in inputs.bshd[i]) for i in range(inputs.n_sets)]

        def call(fn, i):
            dq, dk, dv = grads[i]
            return fn(inputs.dout[i], *inputs.bshd[i], *saved[i], dq=dq, dk=dk, dv=dv,
                      deterministic=self.det, **kw)

        ok, why = call(fc.attention_backward_supported, 0)
        if not ok:
            raise SkipSystem("unsupported: " + why)
        self.kernel = why
        self.info = None

        def run(i):
            call(fc.attention_backward, i)
            self.info = fc.kernel_info

        return run, lambda i: grads[i]


class FlashCoreBwdEnv(_Forced, FlashCoreBwd):
    """One CUDA path's backward with a tuning hook forced (_Forced): with
    --bwd, --sm90-env/--sm80-env, e.g. m64:sm90_bwd_config=1 (a row of
    `flashcore rows --path 90 --bwd`)."""


class TorchSDPABwd(TorchSDPA):
    """The backward of one SDPA backend through autograd: per input set the
    forward once (leaves that require grad, its graph kept), then each call
    is torch.autograd.grad(out, (q, k, v), dout, retain_graph=True): the
    backend's backward alone."""

    def prepare(self, shape, inputs):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel
        self.check_shape(shape)
        backend = self.backend()
        gqa = shape.Hq != shape.Hkv
        leaves, outs, grads = [], [], {}
        with torch.enable_grad(), sdpa_kernel([backend]):
            for i in range(inputs.n_sets):
                leaves.append(tuple(t.detach().requires_grad_() for t in inputs.bhsd(i)))
                outs.append(F.scaled_dot_product_attention(*leaves[i], is_causal=shape.causal, enable_gqa=gqa))

        def run(i):
            grads[i] = torch.autograd.grad(outs[i], leaves[i], inputs.dout_bhsd(i), retain_graph=True)

        return run, lambda i: tuple(g.transpose(1, 2) for g in grads[i])


class Flex(System):
    name = "torch-flex(Triton)"

    def __init__(self):
        self.compiled = None

    def available(self):
        try:
            import torch
            from torch.nn.attention.flex_attention import flex_attention
            # One compiled kernel per shape: the default recompile limit (8)
            # would silently drop later shapes to the slow eager path.
            cfg = torch._dynamo.config
            for attr in ("recompile_limit", "cache_size_limit"):
                if hasattr(cfg, attr):
                    setattr(cfg, attr, max(getattr(cfg, attr), 256))
            if hasattr(cfg, "accumulated_recompile_limit"):
                cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 2048)
            if hasattr(cfg, "accumulated_cache_size_limit"):
                cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 2048)
            self.compiled = torch.compile(flex_attention, dynamic=False)
        except Exception as e:
            return "unavailable: %s" % short_error(e)
        return None

    def prepare(self, shape, inputs):
        from torch.nn.attention.flex_attention import create_block_mask
        off = shape.Sk - shape.Sq
        if shape.causal:
            def mask(b, h, q_idx, kv_idx):  # bottom-right aligned
                return kv_idx <= q_idx + off
        else:
            def mask(b, h, q_idx, kv_idx):  # every block full: no mask work
                return q_idx >= 0
        # Built once here: building it inside a captured call copies from the host.
        bm = create_block_mask(mask, None, None, shape.Sq, shape.Sk, device=inputs.bshd[0][0].device)
        gqa = shape.Hq != shape.Hkv
        outs = {}

        def run(i):
            q, k, v = inputs.bhsd(i)
            outs[i] = self.compiled(q, k, v, block_mask=bm, enable_gqa=gqa)

        return run, lambda i: outs[i].transpose(1, 2)


class FA4(System):
    name = "fa4"

    def available(self):
        try:
            # Carried wheels go in with `pip install --target DIR` + PYTHONPATH=DIR,
            # which skips .pth files; nvidia-cutlass-dsl's .pth puts its
            # dsl_packages folder (the `cutlass` module) on sys.path: do it here.
            try:
                import nvidia_cutlass_dsl
                for root in list(nvidia_cutlass_dsl.__path__):
                    d = os.path.join(root, "dsl_packages")
                    if os.path.isdir(d) and d not in sys.path:
                        sys.path.insert(0, d)
            except ImportError:
                pass
            from flash_attn.cute import flash_attn_func
            self.fn = flash_attn_func
        except Exception as e:
            return "unavailable: %s" % short_error(e)
        return None

    def prepare(self, shape, inputs):
        outs = {}  # FA's causal is bottom-right aligned, like FlashCore's

        def run(i):
            r = self.fn(*inputs.bshd[i], causal=shape.causal)
            outs[i] = r[0] if isinstance(r, tuple) else r

        return run, lambda i: outs[i]


class FA4Bwd(FA4):
    """FlashAttention-4's backward through autograd, as TorchSDPABwd: the
    forward once per input set, its graph kept, then each call is
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)."""
    name = "fa4"

    def prepare(self, shape, inputs):
        import torch
        leaves, outs, grads = [], [], {}
        with torch.enable_grad():
            for i in range(inputs.n_sets):
                leaves.append(tuple(t.detach().requires_grad_() for t in inputs.bshd[i]))
                r = self.fn(*leaves[i], causal=shape.causal)
                outs.append(r[0] if isinstance(r, tuple) else r)

        def run(i):
            grads[i] = torch.autograd.grad(outs[i], leaves[i], inputs.dout[i], retain_graph=True)

        return run, lambda i: grads[i]


class FlashInfer(System):
    name = "flashinfer"

    def available(self):
        try:
            import flashinfer
            self.fi = flashinfer
        except Exception as e:
            return "unavailable: %s" % short_error(e)
        return None

    def prepare(self, shape, inputs):
        torch, fi, s = inputs.torch, self.fi, shape
        outs = {}
        if s.B == 1:
            def run(i):
                q, k, v = (t[0] for t in inputs.bshd[i])
                outs[i] = fi.single_prefill_with_kv_cache(q, k, v, causal=s.causal, kv_layout="NHD")[None]
            return run, lambda i: outs[i]
        dev = inputs.bshd[0][0].device
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        qo = torch.arange(0, (s.B + 1) * s.Sq, s.Sq, dtype=torch.int32, device=dev)
        kv = torch.arange(0, (s.B + 1) * s.Sk, s.Sk, dtype=torch.int32, device=dev)
        w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        w.plan(qo, kv, s.Hq, s.Hkv, s.D, causal=s.causal, q_data_type=inputs.dtype)

        def run(i):
            q, k, v = (t.reshape(-1, t.shape[2], t.shape[3]) for t in inputs.bshd[i])
            outs[i] = w.run(q, k, v).view(s.B, s.Sq, s.Hq, s.D)

        return run, lambda i: outs[i]


def select_systems(systems, selected):
    """The systems whose names contain one of the comma-separated keys."""
    if not selected:
        return systems
    keys = [k.strip().lower() for k in selected.split(",") if k.strip()]
    return [s for s in systems if any(k in s.name.lower() for k in keys)]


def env_systems(cls, sm90_env, sm80_env):
    """The --sm90-env/--sm80-env systems (NAME:KEY=VALUE, comma-separated)
    as cls (FlashCoreEnv or FlashCoreBwdEnv), named sm<path>-NAME."""
    systems = []
    for path, specs in ((90, sm90_env), (80, sm80_env)):
        for spec in (specs or "").split(","):
            if spec.strip():
                name, kv = spec.split(":", 1)
                key, value = kv.split("=", 1)
                systems.append(cls("sm%d-%s" % (path, name.strip()), key.strip(), value.strip(), path))
    return systems


def make_bwd_systems(selected, sm90_env=None, sm80_env=None):
    return select_systems([FlashCoreBwd(90), FlashCoreBwd(90, deterministic=True), FlashCoreBwd(80),
                           FlashCoreBwd(80, deterministic=True), TorchSDPABwd("torch-cudnn"),
                           TorchSDPABwd("torch-flash(FA2)"), FA4Bwd()], selected) + \
        env_systems(FlashCoreBwdEnv, sm90_env, sm80_env)


def make_systems(selected, sm90_rows=None, sm90_env=None, sm80_rows=None, sm80_env=None):
    systems = select_systems([FlashCore(90), FlashCore(80), TorchSDPA("torch-cudnn"), TorchSDPA("torch-flash(FA2)"),
                              TorchSDPA("torch-efficient"), Flex(), FA4(), FlashInfer()], selected)
    if sm90_rows:
        systems += [FlashCoreRow(int(r)) for r in sm90_rows.split(",") if r.strip()]
    systems += env_systems(FlashCoreEnv, sm90_env, sm80_env)
    if sm80_rows:
        systems += [FlashCoreRow(int(r), 80) for r in sm80_rows.split(",") if r.strip()]
    return systems


# ---- timing ---------------------------------------------------------------------

class GraphTimer:
    """CUDA graphs of n_calls calls; replays timed with CUDA events. With a
    stream, streamed() makes it the current stream (a shape's whole work
    goes there: inputs, forwards, checks, replays) and graphs are captured
    on it: autograd runs a backward on its forward's stream, so a peer's
    backward is captured only where its forward ran."""

    def __init__(self, torch, stream=None):
        self.torch, self.stream = torch, stream

    def streamed(self):
        if self.stream is None:
            return contextlib.nullcontext()
        return self.torch.cuda.stream(self.stream)

    def capture(self, run, n_calls, n_sets):
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=self.stream):
            for c in range(n_calls):
                run(c % n_sets)
        torch.cuda.synchronize()
        g.replay()  # a replay that fails surfaces here, not in the timed rounds
        torch.cuda.synchronize()
        return g.replay

    def estimate(self, run, n_sets):
        """Seconds per eager call (after one warm call per set)."""
        torch = self.torch
        for i in range(n_sets):
            run(i)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for c in range(3):
            run(c % n_sets)
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / 3e3

    def sync(self):
        self.torch.cuda.synchronize()

    def round(self, replays, lead=None):
        """One interleaved round: every replay once, back to back; seconds each.
        `lead` is replayed first, untimed, so that the first timed replay is
        queued behind work and not launched onto an idle GPU (on an H100 the
        first system of a round timed 2-5% slow, with twice the spread)."""
        torch = self.torch
        if lead is not None:
            lead()
        evs = []
        for rp in replays:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            rp()
            b.record()
            evs.append((a, b))
        torch.cuda.synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in evs]


class WallTimer:
    """The CPU stand-in of --dry-run: eager loops, wall clock."""

    def streamed(self):
        return contextlib.nullcontext()

    def capture(self, run, n_calls, n_sets):
        def replay():
            for c in range(n_calls):
                run(c % n_sets)
        replay()
        return replay

    def estimate(self, run, n_sets):
        for i in range(n_sets):
            run(i)
        t = time.perf_counter()
        run(0)
        return time.perf_counter() - t

    def sync(self):
        pass

    def round(self, replays, lead=None):
        out = []
        for rp in replays:
            t = time.perf_counter()
            rp()
            out.append(time.perf_counter() - t)
        return out


def interleaved_rounds(timer, replays, warmup_s, repeats, min_repeats=None, budget_s=None):
    """Seconds per replay of each (name, replay) pair, {name: [...]}. Warm-up:
    >= warmup_s of real work, all replays in turn. Then timed rounds,
    interleaved: A, B, C, then B, C, A, ...: the order turns by one each
    round so that no system always comes first or follows the same
    neighbour; each round starts behind an untimed replay (GraphTimer).
    Stops after min_repeats rounds once budget_s has passed."""
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < warmup_s:
        timer.round([rp for _, rp in replays])
    samples = {name: [] for name, _ in replays}
    t1 = time.perf_counter()
    for r in range(repeats):
        k = r % len(replays)
        order = replays[k:] + replays[:k]
        for (name, _), sec in zip(order, timer.round([rp for _, rp in order], lead=order[-1][1])):
            samples[name].append(sec)
        if min_repeats is not None and r + 1 >= min_repeats and time.perf_counter() - t1 > budget_s:
            break
    return samples


# ---- one shape --------------------------------------------------------------------

def base_row(shape, system, bwd=False):
    return {"system": system, "shape": shape.name, "pass": pass_name(bwd), "B": shape.B, "Hq": shape.Hq,
            "Hkv": shape.Hkv, "Sq": shape.Sq, "Sk": shape.Sk, "D": shape.D, "causal": shape.causal,
            "dtype": shape.dtype, "flops": pass_flops(shape, bwd)}


def run_shape(torch, shape, systems, unavailable, timer, device, args, l2_bytes):
    rows = {}
    for s in systems:
        rows[s.name] = base_row(shape, s.name, args.bwd)
        if s.name in unavailable:
            rows[s.name]["error"] = unavailable[s.name]
    live = [s for s in systems if s.name not in unavailable]
    if not live:
        return list(rows.values())

    # bytes a call touches: q, k, v, out (the backward also dout, dq, dk, dv)
    elem = (4 if shape.dtype == "f32" else 2) * (2 if args.bwd else 1)
    set_bytes = elem * shape.D * (2 * shape.B * shape.Sq * shape.Hq + 2 * shape.B * shape.Sk * shape.Hkv)
    n_sets = 1
    if args.rotate and l2_bytes:  # inputs of all sets together >= 2x L2: none stays cached
        n_sets = int(min(args.max_sets, max(1, math.ceil(2 * l2_bytes / set_bytes))))
    t0 = time.perf_counter()
    inputs = Inputs(torch, shape, n_sets, device, args.seed, with_dout=args.bwd)
    ref = (BwdReference if args.bwd else Reference)(torch, shape, inputs)
    gate = (BWD_GATES if args.bwd else GATES)[shape.dtype]
    log("  inputs: %d set(s) of %.1f MB; reference on %s (%.1f s)"
        % (n_sets, set_bytes / 1e6, ref.describe(), time.perf_counter() - t0))

    # Prepare, check, estimate.
    ready = []
    for s in live:
        row = rows[s.name]
        try:
            t1 = time.perf_counter()
            run, output = s.prepare(shape, inputs)
            run(0)
            timer.sync()
            err = ref.rel_err(output(0))
            row["rel_err"] = err
            row.update(ref.details(output(0)))
            row["gate"] = gate
            row["check"] = "ok" if err <= gate else "FAIL"
            if s.kernel:
                row["kernel"] = s.kernel
            est = timer.estimate(run, n_sets)
            ready.append((s, run, est))
            log("  %-20s rel_err %.2e %s  ~%.1f us/call  (prepare %.1f s)%s"
                % (s.name, err, row["check"], est * 1e6, time.perf_counter() - t1,
                   "  [%s]" % s.kernel if s.kernel else ""))
        except SkipSystem as e:
            row["error"] = str(e)
            log("  %-20s skipped: %s" % (s.name, e))
        except Exception as e:
            row["error"] = short_error(e)
            log("  %-20s FAILED: %s" % (s.name, short_error(e)))
            if args.verbose:
                traceback.print_exc()
            try:
                timer.sync()
            except Exception:
                pass
    if not ready:
        return list(rows.values())

    # Calls per replay: enough to make a replay >= target (launch gaps out), the
    # same for every system of the shape, and at least one per input set.
    fastest = max(min(est for _, _, est in ready), 1e-7)
    n_calls = int(max(n_sets, 2, min(args.max_calls, math.ceil(args.target_replay_ms * 1e-3 / fastest))))
    replays = []
    for s, run, _ in ready:
        try:
            replays.append((s, timer.capture(run, n_calls, n_sets)))
        except Exception as e:
            rows[s.name]["error"] = "graph capture: " + short_error(e)
            log("  %-20s capture FAILED: %s" % (s.name, short_error(e)))
            try:
                timer.sync()
            except Exception:
                pass
    if not replays:
        return list(rows.values())

    t1 = time.perf_counter()
    samples = interleaved_rounds(timer, [(s.name, rp) for s, rp in replays], args.warmup_s, args.repeats,
                                 args.min_repeats, args.budget_s)
    samples = {name: [sec / n_calls for sec in v] for name, v in samples.items()}
    clock = gpu_state() if device != "cpu" else "n/a"
    for s, _ in replays:
        v = sorted(samples[s.name])
        p50 = statistics.median(v)
        row = rows[s.name]
        row.update({
            "p50_us": p50 * 1e6,
            "p90_us": v[min(len(v) - 1, int(round(0.9 * (len(v) - 1))))] * 1e6,
            "min_us": v[0] * 1e6,
            "mean_us": statistics.fmean(v) * 1e6,
            "std_us": (statistics.stdev(v) if len(v) > 1 else 0.0) * 1e6,
            "graph_us": p50 * 1e6,  # p50_us is graph-timed already (flashcore bench's key)
            "tflops": pass_flops(shape, args.bwd) / p50 / 1e12,
            "iters": len(v),
            "calls_per_replay": n_calls,
            "input_sets": n_sets,
            "gpu_after": clock,
        })
        if getattr(s, "info", None) is not None:
            row["kernel"], row["num_splits"] = s.info.name, s.info.num_splits
    log("  timed %d rounds x %d calls (%.1f s); after: %s"
        % (len(next(iter(samples.values()))), n_calls, time.perf_counter() - t1, clock))
    del replays, inputs, ref
    return list(rows.values())


# ---- report -------------------------------------------------------------------------

def fmt_tflops(row):
    if row.get("tflops") is None:
        quiet = ("unsupported", "unavailable", "torch SDPA is_causal")
        return "-" if row.get("error", "").startswith(quiet) else "err"
    mark = "" if row.get("check", "ok") == "ok" else "!"
    t = row["tflops"]
    return ("%.1f%s" if t >= 10 else "%.3g%s") % (t, mark)


def best(rows, flashcore_side):
    side = is_flashcore if flashcore_side else is_peer
    ok = [r for r in rows if r.get("tflops") and r.get("check", "ok") == "ok" and side(r["system"])]
    return max(ok, key=lambda r: r["tflops"]) if ok else None


def pass_title(meta):
    """"forward" or "backward": what a result timed."""
    return "backward" if meta.get("pass") == "bwd" else "forward"


def markdown(result):
    meta, rows = result["meta"], result["rows"]
    systems = [s for s in SYSTEM_ORDER if any(r["system"] == s for r in rows)]
    systems += sorted({r["system"] for r in rows} - set(systems))
    shapes = []
    for r in rows:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    by = {(r["shape"], r["system"]): r for r in rows}
    out = ["## FlashCore beside its peers: attention %s, TFLOP/s" % pass_title(meta),
           "",
           "%s; flashcore %s (git %s); torch %s, cuDNN %s; %s. "
           % (meta.get("device_name"), meta.get("flashcore_version"), meta.get("git_sha"),
              meta.get("torch"), meta.get("cudnn"), meta.get("date")),
           "Median of interleaved CUDA-graph replays; FC/peer = best FlashCore path over best "
           "peer (both correct). `!` = rel_err over the dtype gate; `-` = not applicable / "
           "unsupported; `err` = failed (see notes). FLOPs: %s. SM clock/temp before: %s; after: %s. "
           "Ceilings this run: %s."
           % (meta.get("flops"), meta.get("gpu_before"), meta.get("gpu_after"), meta.get("ceilings")),
           ""]
    if meta.get("dry_run"):
        out.insert(2, "**DRY RUN: the numbers below are fake (table/chart plumbing check).**\n")
    out.append("| shape | dtype | " + " | ".join(systems) + " | FC/peer |")
    out.append("|---|---|" + "---|" * len(systems) + "---|")
    for sh in shapes:
        cells = []
        for s in systems:
            r = by.get((sh, s))
            cells.append(fmt_tflops(r) if r else "")
        any_row = next(r for r in rows if r["shape"] == sh)
        srows = [r for r in rows if r["shape"] == sh]
        f, p = best(srows, True), best(srows, False)
        ratio = "%.2fx vs %s" % (f["tflops"] / p["tflops"], p["system"]) if f and p else "n/a"
        out.append("| %s | %s | %s | %s |" % (sh, any_row["dtype"], " | ".join(cells), ratio))
    notes = [r for r in rows if r.get("error") and not r["error"].startswith("unavailable")]
    unavail = sorted({(r["system"], r["error"]) for r in rows
                      if r.get("error", "").startswith("unavailable")})
    fails = [r for r in rows if r.get("check") == "FAIL"]
    if notes or unavail or fails:
        out += ["", "Notes:"]
    for r in fails:
        out.append("- %s / %s: rel_err %.2e over the %s gate %.1e" % (r["shape"], r["system"], r["rel_err"],
                                                                     r["dtype"], r["gate"]))
    for r in notes:
        out.append("- %s / %s: %s" % (r["shape"], r["system"], r["error"][:160]))
    for s, e in unavail:
        out.append("- %s: %s" % (s, e[:160]))
    return "\n".join(out) + "\n"


def chart(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["rows"]
    systems = [s for s in SYSTEM_ORDER if any(r["system"] == s and r.get("tflops") for r in rows)]
    systems += sorted({r["system"] for r in rows if r.get("tflops")} - set(systems))
    shapes = []
    for r in rows:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    by = {(r["shape"], r["system"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(shapes) + 3), 5.5))
    width = 0.8 / max(1, len(systems))
    cmap = plt.get_cmap("tab10")
    for j, s in enumerate(systems):
        xs, ys = [], []
        for i, sh in enumerate(shapes):
            r = by.get((sh, s))
            if r and r.get("tflops"):
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(r["tflops"])
        bars = ax.bar(xs, ys, width, label=s, color=cmap(j % 10),
                      edgecolor="black" if is_flashcore(s) else None, linewidth=0.6)
        for b, r in zip(bars, [by[(sh, s)] for sh in shapes if by.get((sh, s)) and by[(sh, s)].get("tflops")]):
            if r.get("check") == "FAIL":
                b.set_hatch("//")
    top = max([r["tflops"] for r in rows if r.get("tflops")] or [1.0])
    for i, sh in enumerate(shapes):  # FlashCore / best peer above each group
        srows = [r for r in rows if r["shape"] == sh]
        f, p = best(srows, True), best(srows, False)
        if f and p:
            ax.text(i, max(f["tflops"], p["tflops"]) * 1.04, "%.2fx" % (f["tflops"] / p["tflops"]),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels(shapes, rotation=30, ha="right")
    m = result["meta"]
    ax.set_ylabel("TFLOP/s (%s4·B·Hq·Sq·Sk·D / t; causal halved)" % ("2.5·" if m.get("pass") == "bwd" else ""))
    title = "Attention %s on %s (flashcore %s, git %s)" % (pass_title(m), m.get("device_name"),
                                                          m.get("flashcore_version"), m.get("git_sha"))
    if m.get("dry_run"):
        title = "DRY RUN (fake numbers): " + title
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    low = min([r["tflops"] for r in rows if r.get("tflops")] or [1.0])
    if low < top / 20:  # decode-like shapes run at a few % of the others: log scale keeps them visible
        ax.set_yscale("log")
        ax.set_ylim(low / 2, top * 2)
    else:
        ax.set_ylim(0, top * 1.12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result, out_dir, final=True):
    """peers.json and peers.md (also after each shape: final=False), and the
    chart and a printed table at the end; peers-bwd.* for the backward."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "peers-bwd" if result["meta"].get("pass") == "bwd" else "peers"
    for r in result["rows"]:
        for k in ("p50_us", "p90_us", "min_us", "mean_us", "std_us", "graph_us"):
            if isinstance(r.get(k), float):
                r[k] = round(r[k], 3)
        if isinstance(r.get("tflops"), float):
            r["tflops"] = float("%.6g" % r["tflops"])
    (out_dir / (stem + ".json")).write_text(json.dumps(result, indent=1, default=str) + "\n")
    md = markdown(result)
    (out_dir / (stem + ".md")).write_text(md)
    if not final:
        return
    try:
        chart(result, out_dir / (stem + ".png"))
    except Exception as e:  # no matplotlib: the JSON and table still stand
        log("chart not written: %s" % short_error(e))
    log("\n" + md)
    log("wrote %s/%s.json, %s.md, %s.png" % (out_dir, stem, stem, stem))


# ---- meta ---------------------------------------------------------------------------

def flashcore_meta():
    m = {}
    try:
        import flashcore
        m["flashcore_version"] = m["library_version"] = flashcore.__version__
        m["flashcore_build"] = flashcore.build_info()
        m["flashcore_library"] = flashcore.library_path()
        bi = m["flashcore_build"].split()
        m["git_sha"] = bi[bi.index("git") + 1].rstrip(";") if "git" in bi else "unknown"
    except Exception as e:
        m["flashcore_error"] = short_error(e)
        m.setdefault("git_sha", "unknown")
    return m


def torch_meta(torch, cuda):
    m = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        m["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        m["cudnn"] = None
    try:
        import triton
        m["triton"] = triton.__version__
    except Exception:
        m["triton"] = None
    if cuda:
        p = torch.cuda.get_device_properties(0)
        m.update(device_name=p.name, sms=p.multi_processor_count, cc="%d.%d" % (p.major, p.minor),
                 cuda_runtime=torch.version.cuda,
                 l2_bytes=getattr(p, "L2_cache_size", None), memory_bytes=p.total_memory)
        m["ceilings"] = measure_ceilings(torch)
    return m


def measure_ceilings(torch):
    """The two ceilings of this run (the ceilings of docs/PERF.md): a 1 GiB device-to-device
    copy (bytes read + written) and an 8192^3 bf16 matrix product on random
    data, each the median of 10 event-timed repeats after 3 warm-ups."""
    def timed(fn):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) * 1e-3)
        return sorted(ts)[len(ts) // 2]
    try:
        x = torch.randn(1 << 29, device="cuda", dtype=torch.float16)  # 1 GiB
        y = torch.empty_like(x)
        copy_tbps = 2 * x.numel() * 2 / timed(lambda: y.copy_(x)) / 1e12
        del x, y
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        mm_tflops = 2 * 8192 ** 3 / timed(lambda: a @ b) / 1e12
        del a, b
        torch.cuda.empty_cache()
        return {"copy_tbps": round(copy_tbps, 3), "bf16_matmul_tflops": round(mm_tflops, 1)}
    except Exception as e:
        return {"error": short_error(e)}


# ---- main -------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="comma-separated shape names (default: every benchmark shape of docs/PERF.md)")
    ap.add_argument("--systems", help="comma-separated substrings of system names to run "
                                      "(e.g. flashcore,cudnn,flex)")
    ap.add_argument("--sm90-rows", help="comma-separated rows of src/cuda/sm90/tiles.cuh to time as extra "
                    "systems sm90-row<N>, each forced with the sm90_config hook (A/B of tile rows)")
    ap.add_argument("--sm90-env", help="comma-separated NAME:FIELD=VALUE: the Hopper path with the fc_tuning "
                    "hook FIELD=VALUE around its calls, timed as an extra system sm90-NAME (A/B of a hook, "
                    "e.g. nopdl:pdl=0; with --bwd a backward row, e.g. m64:sm90_bwd_config=1)")
    ap.add_argument("--sm80-env", help="the same for the sm80-class path: extra systems sm80-NAME")
    ap.add_argument("--sm80-rows", help="comma-separated rows of src/cuda/sm80/tiles.cuh to time as extra "
                    "systems sm80-row<N>, each forced with the sm80_config hook (A/B of tile rows and "
                    "code variants; a row that does not fit a shape falls back to the planned one)")
    ap.add_argument("--bwd", action="store_true",
                    help="time the backward (FlashCore, cuDNN, FA2) into peers-bwd.{json,md,png}; default "
                         "shapes: the prefill shapes, gqa-train and gqa-step")
    ap.add_argument("--out", help="output folder (default $OUT, else ./out)")
    ap.add_argument("--quick", action="store_true", help="2 small shapes, few rounds (smoke run)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: CPU smoke of the pipeline (if torch and the library load) plus fake rows "
                         "for the table/chart")
    ap.add_argument("--repeats", type=int, default=30, help="timed rounds per shape (max)")
    ap.add_argument("--min-repeats", type=int, default=10, help="rounds before --budget-s may stop a shape")
    ap.add_argument("--budget-s", type=float, default=10.0, help="seconds of timed rounds per shape")
    ap.add_argument("--max-total-s", type=float, default=520.0,
                    help="start no new shape after this many seconds (outputs are written after each "
                         "shape, so a run cut short still leaves its results)")
    ap.add_argument("--warmup-s", type=float, default=1.0, help="seconds of warm-up replays per shape")
    ap.add_argument("--target-replay-ms", type=float, default=1.0, help="calls per replay: at least this long")
    ap.add_argument("--max-calls", type=int, default=20, help="max calls per graph replay for the time target")
    ap.add_argument("--max-sets", type=int, default=64,
                    help="max input sets rotated through (a replay makes at least one call per set)")
    ap.add_argument("--no-rotate", dest="rotate", action="store_false",
                    help="one input set (inputs may sit in L2 on small shapes)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--list", action="store_true", help="list shapes and systems, then exit")
    ap.add_argument("--render", metavar="PEERS_JSON",
                    help="no run: redraw peers.md and peers.png (peers-bwd.*) from a peers.json into --out")
    ap.add_argument("-v", "--verbose", action="store_true", help="tracebacks of failing systems")
    a = ap.parse_args(argv)
    if a.bwd and (a.sm90_rows or a.sm80_rows):
        ap.error("--sm90-rows/--sm80-rows are forward rows: with --bwd force a backward row by --sm90-env/--sm80-env "
                 "(NAME:sm90_bwd_config=N)")
    if a.quick:
        a.repeats, a.min_repeats, a.budget_s, a.warmup_s = min(a.repeats, 8), 4, 4.0, 1.0
    return a


def select_shapes(args):
    run = pass_name(args.bwd)
    names = (args.shapes.split(",") if args.shapes else QUICK_SHAPES[run] if args.quick
             else [s.name for s in SHAPES if run in s.sets.split()])
    known = {s.name: s for s in SHAPES}
    bad = [n for n in names if n not in known]
    if bad:
        sys.exit("unknown shape(s) %s; known: %s" % (", ".join(bad), ", ".join(known)))
    return [known[n] for n in names]


def fake_rows(shapes, systems, bwd):
    """Deterministic made-up rows (dry run): exercises table/chart/JSON code."""
    rows = []
    for i, sh in enumerate(shapes):
        for j, s in enumerate(systems):
            r = base_row(sh, s, bwd)
            if s == "torch-efficient" and sh.Hq != sh.Hkv:
                r["error"] = "RuntimeError: No available kernel. Aborting execution. (fake)"
            elif s in ("fa4", "flashinfer"):
                r["error"] = "unavailable: ModuleNotFoundError (fake)"
            else:
                tf = 50.0 + 40.0 * ((i * 7 + j * 3) % 11)
                r.update(p50_us=pass_flops(sh, bwd) / tf / 1e6, tflops=tf, rel_err=1e-3 * (1 + j % 3),
                         gate=GATES[sh.dtype], check="ok", iters=10, calls_per_replay=20, input_sets=1)
                if s in ("flashcore-sm80", "flashcore-sm80-det") and i == 1:
                    r.update(check="FAIL", rel_err=0.5)
            rows.append(r)
    return rows


def main(argv=None):
    args = parse_args(argv)
    out_dir = Path(args.out or os.environ.get("OUT") or "out")
    shapes = select_shapes(args)
    if args.list:
        for s in SHAPES:
            log("%-16s %s" % (s.name, asdict(s)))
        log("systems: " + ", ".join(SYSTEM_ORDER))
        return 0
    if args.render:
        write_outputs(json.loads(Path(args.render).read_text()), out_dir)
        return 0
    meta = {"tool": "bench/peers.py",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "host": platform.node(), "dry_run": bool(args.dry_run),
            "timing": "CUDA events over CUDA-graph replays of calls_per_replay calls cycling input_sets "
                      "input sets; warm-up >= %.1f s; systems interleaved per round; p50 over rounds"
                      % args.warmup_s,
            "pass": pass_name(args.bwd),
            "reference": "float64 on a subset (first/last batch, first/middle/last head, <=1024 rows)",
            "flops": "4*B*Hq*Sq*Sk*D, halved when causal with Sq == Sk"}
    if args.bwd:
        meta.update(reference="float64 dq, dk, dv on a subset (first/last batch, first/last KV head with "
                              "their query heads, every row), rel L2 per gradient; rel_err is the largest",
                    flops="2.5 x 4*B*Hq*Sq*Sk*D, halved when causal with Sq == Sk",
                    timing=meta["timing"] + "; one side stream for all of a shape's work (autograd runs a "
                                            "backward on its forward's stream)")
    meta.update(flashcore_meta())
    meta["gpu_before"] = gpu_state()
    log("peers.py: %s; gpu: %s" % (meta.get("flashcore_build", meta.get("flashcore_error")), meta["gpu_before"]))

    if args.dry_run:
        return dry_run(args, meta, shapes, out_dir)

    import torch
    if not torch.cuda.is_available():
        sys.exit("peers.py: no CUDA device (use --dry-run for a CPU smoke run)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    meta.update(torch_meta(torch, cuda=True))
    if args.bwd:
        systems = make_bwd_systems(args.systems, args.sm90_env, args.sm80_env)
    else:
        systems = make_systems(args.systems, args.sm90_rows, args.sm90_env, args.sm80_rows, args.sm80_env)
    unavailable = {}
    for s in systems:
        why = s.available()
        if why:
            unavailable[s.name] = why
            log("%-20s %s" % (s.name, why))
    timer = GraphTimer(torch, torch.cuda.Stream() if args.bwd else None)
    rows = []
    t0 = time.perf_counter()
    with torch.no_grad():
        for sh in shapes:
            if time.perf_counter() - t0 > args.max_total_s:
                log("\n== %s skipped: --max-total-s %.0f reached" % (sh.name, args.max_total_s))
                rows += error_rows(sh, systems, args.bwd, "not run: --max-total-s reached")
                continue
            log("\n== %s  B=%d Hq=%d Hkv=%d Sq=%d Sk=%d D=%d causal=%s %s  (%.1f GFLOP %s)"
                % (sh.name, sh.B, sh.Hq, sh.Hkv, sh.Sq, sh.Sk, sh.D, sh.causal, sh.dtype,
                   pass_flops(sh, args.bwd) / 1e9, pass_title(meta)))
            try:
                with timer.streamed():
                    rows += run_shape(torch, sh, systems, unavailable, timer, "cuda", args,
                                      meta.get("l2_bytes") or 0)
            except Exception as e:  # a shape-level failure (e.g. out of memory for inputs)
                log("  shape FAILED: %s" % short_error(e))
                rows += error_rows(sh, systems, args.bwd, "shape: " + short_error(e))
            torch.cuda.synchronize()  # the side stream's work, before its memory is reused
            gc.collect()
            torch.cuda.empty_cache()
            write_outputs({"meta": meta, "rows": rows}, out_dir, final=False)
    meta["gpu_after"] = gpu_state()
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    write_outputs({"meta": meta, "rows": rows}, out_dir)
    bad = [r for r in rows if is_flashcore(r["system"]) and r.get("check") == "FAIL"]
    return 1 if bad else 0


def error_rows(shape, systems, bwd, why):
    rows = []
    for s in systems:
        rows.append(base_row(shape, s.name, bwd))
        rows[-1]["error"] = why
    return rows


def dry_run(args, meta, shapes, out_dir):
    """Everything but the GPU: the real pipeline on the CPU on one tiny shape
    (FlashCore's CPU backend beside torch's math SDPA, eager loops timed by
    wall clock) when torch and the library load; then fake rows for the
    chosen shapes through the same JSON/table/chart code."""
    rows = []
    try:
        import torch
        meta.update(torch_meta(torch, cuda=False))
        if args.bwd:
            systems = [FlashCoreBwd(0, backend="cpu"), TorchSDPABwd("torch-math")]
        else:
            systems = [FlashCore(0, backend="cpu"), TorchSDPA("torch-math")]
        unavailable = {s.name: s.available() for s in systems if s.available()}
        a = argparse.Namespace(**vars(args))
        a.repeats, a.min_repeats, a.budget_s, a.warmup_s, a.rotate = 3, 1, 1.0, 0.05, False
        log("\n== %s (CPU smoke)" % DRY_SHAPE.name)
        smoke = run_shape(torch, DRY_SHAPE, systems, unavailable, WallTimer(), "cpu", a, 0)
        for r in smoke:
            log("  %s" % json.dumps({k: r.get(k) for k in ("system", "rel_err", "check", "p50_us", "error")}))
        rows += smoke
        if any(r.get("check") == "FAIL" or (r.get("error") and not r["error"].startswith("unavailable"))
               for r in smoke):
            meta["dry_run_smoke"] = "FAILED"
        else:
            meta["dry_run_smoke"] = "ok"
    except ImportError as e:
        meta["dry_run_smoke"] = "skipped: %s" % short_error(e)
        log("CPU smoke skipped: %s" % short_error(e))
    meta.setdefault("device_name", "dry-run (no GPU)")
    meta["gpu_after"] = gpu_state()
    rows += fake_rows(shapes, [s.name for s in make_bwd_systems(None)] if args.bwd else SYSTEM_ORDER, args.bwd)
    write_outputs({"meta": meta, "rows": rows}, out_dir)
    return 0 if meta.get("dry_run_smoke", "").startswith(("ok", "skipped")) else 1


if __name__ == "__main__":
    sys.exit(main())
