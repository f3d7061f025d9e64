"""Run a Python snippet in a fresh interpreter (the tests of what happens
at load time: environment switches, a missing compiler)."""

import os
import subprocess
import sys
import textwrap


def run_snippet(code, timeout=900, **env):
    """code's last printed line; the snippet must exit 0 (its stderr is the
    assertion's message otherwise). env: variables added to this process's."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **env)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-1]
