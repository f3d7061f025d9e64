"""A bench/ script's --dry-run from a test: run it, check its exit status
and that its JSON says dry_run, hand back the JSON and the printed report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

in_checkout = pytest.mark.skipif(not BENCH.is_dir(), reason="not in a source checkout")


def dry_run(script, tmp_path, timeout, extra=()):
    """(JSON data, stdout) of bench/<script> --dry-run --json [extra...]."""
    out = tmp_path / (Path(script).stem + ".json")
    res = subprocess.run([sys.executable, str(BENCH / script), "--dry-run", "--json", str(out), *extra],
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["meta"]["dry_run"] is True
    return data, res.stdout
