"""What several tests share: a Python snippet run in a fresh interpreter
(what happens at load time: environment switches, a missing compiler),
work run in several threads at once, and seeded random torch inputs."""

import os
import subprocess
import sys
import textwrap
import threading


def run_snippet(code, timeout=900, **env):
    """code's last printed line; the snippet must exit 0 (its stderr is the
    assertion's message otherwise). env: variables added to this process's."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **env)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-1]


def run_in_threads(n, work):
    """work(i) for i in range(n), each in its own thread, all at once; fails
    with the exceptions any of them raised."""
    errors = []

    def worker(i):
        try:
            work(i)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def torch_rand(*shapes, seed, dtype=None, device=None):
    """N(0,1) torch tensors of these shapes (never zeros) from one seeded
    generator: on the CPU (device None) drawn in float32 and rounded to
    dtype (default float32); on a device drawn there in dtype."""
    import torch
    if device is None:
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(s, generator=g).to(dtype or torch.float32) for s in shapes]
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(s, generator=g, device=device, dtype=dtype) for s in shapes]
