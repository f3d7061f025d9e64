#!/usr/bin/env python3
"""Per-call host time of the Python binding, without a GPU: flashcore.attention,
flash_attn_func and scaled_dot_product_attention on CPU torch tensors with
the library's entry point replaced by a stub that returns FC_OK at once, so
what is timed is the binding's own work (checks, views, ctypes structs,
output allocation, kernel info) and not the kernel or the library's checks.

Each call is timed on both paths where the torch ops' C++ kernels load
(flashcore._torch_ext): "c++", their eager call, and "python", the
binding's Python path (the eager call switched off). The stub is then their
C function fc_ext_stub_entry for both (the Python path's row includes the
ctypes call, ~0.3 us); where they do not load, only the Python path is
timed, with a Python function as the stub (no foreign call). --device cuda
times the same on CUDA tensors (the stream lookup added; a GPU machine, any
build of the library: the stub replaces its entry point).

Each row: --repeats runs of --calls back-to-back calls, as wall time
(perf_counter, the median run) and as this thread's CPU time (thread_time,
the best run: on a loaded machine the least inflated figure). CPU outputs above glibc's mmap threshold
(the mission's 512 KiB) cost an mmap and munmap per call, which CUDA's
caching allocator does not: the out= row leaves the allocation out.

    PYTHONPATH=python FLASHCORE_LIBRARY=build/libflashcore.so python3 bench/host_overhead.py
"""

import argparse
import statistics
import time

import torch

import flashcore
from flashcore import _attention, _lib


class _StubLaunch:
    """The loaded library with fc_attention_forward answering FC_OK at once:
    stub (a C function), or a Python function."""

    def __init__(self, lib, stub=None):
        self._lib = lib
        if stub is not None:
            self.fc_attention_forward = stub

    def __getattr__(self, name):
        return getattr(self._lib, name)

    @staticmethod
    def fc_attention_forward(ctx, args, stream, info):
        return 0


def stub_launch():
    """Load the C++ kernels (a real call on CPU tensors: any build of the
    library runs it) and put the stub in. Returns the paths to time:
    [(name, eager call or None)]."""
    q = torch.zeros(1, 4, 2, 16)
    flashcore.attention(q, q, q)  # loads the kernels, binds this thread's context
    try:
        from flashcore import _torch_ext
    except ImportError:
        _torch_ext = None
    stub_forward = getattr(_torch_ext, "stub_forward", None)  # an older binding (a "before" run) has none
    stub = stub_forward(True) if stub_forward is not None else None
    _lib._lib = _StubLaunch(_lib.load(), stub)  # every later _lib.load() returns the stub
    eager = getattr(_attention, "_eager", None)
    return ([("c++", eager)] if eager is not None else []) + [("python", None)]


def calls(device):
    """(name, zero-argument callable) for each timed row."""
    g = torch.Generator().manual_seed(0)
    h = torch.float16
    q, k, v = (torch.randn(1, 512, 8, 64, generator=g).to(device, h) for _ in range(3))   # mission
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))                                  # [B,H,S,D] views
    dq = torch.randn(8, 1, 32, 128, generator=g).to(device, h)                            # decode
    dk, dv = (torch.randn(8, 4096, 8, 128, generator=g).to(device, h) for _ in range(2))
    out = torch.empty_like(q)
    rows = [
        ("attention mission bshd", lambda: flashcore.attention(q, k, v)),
        ("attention mission bshd, out=", lambda: flashcore.attention(q, k, v, out=out)),
        ("attention mission bhsd", lambda: flashcore.attention(qt, kt, vt, layout="bhsd")),
        ("attention decode gqa", lambda: flashcore.attention(dq, dk, dv)),
    ]
    if hasattr(flashcore, "flash_attn_func"):  # an older binding (a "before" run) has none
        rows += [
            ("flash_attn_func mission causal", lambda: flashcore.flash_attn_func(q, k, v, causal=True)),
            ("scaled_dot_product_attention mission causal",
             lambda: flashcore.scaled_dot_product_attention(qt, kt, vt, is_causal=True)),
        ]
    return rows


def time_call(fn, n, repeats):
    for _ in range(min(n, 2000)):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            fn()
        c1, t1 = time.thread_time(), time.perf_counter()
        wall.append((t1 - t0) / n * 1e6)
        cpu.append((c1 - c0) / n * 1e6)
    return statistics.median(wall), min(cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per run")
    ap.add_argument("--repeats", type=int, default=30, help="runs per row")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: adds the stream lookup (GPU machine)")
    a = ap.parse_args()
    paths = stub_launch()
    print("| call (%s tensors, stub launch) | path | wall us/call (median) | CPU us/call (best) |" % a.device)
    print("|---|---|---|---|")
    for name, fn in calls(a.device):
        for path, eager in paths:
            if hasattr(_attention, "_eager"):
                _attention._eager = eager
            wall, cpu = time_call(fn, a.calls, a.repeats)
            print("| %s | %s | %.2f | %.2f |" % (name, path, wall, cpu))


if __name__ == "__main__":
    main()
