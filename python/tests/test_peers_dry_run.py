"""bench/peers.py --dry-run: the report plumbing (JSON rows with the keys
`flashcore compare` reads, the Markdown table, the chart when matplotlib is
there) and, when torch is installed, the real pipeline on the CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PEERS = Path(__file__).resolve().parents[2] / "bench" / "peers.py"


@pytest.mark.skipif(not PEERS.is_file(), reason="not in a source checkout")
def test_dry_run_writes_json_table_and_chart(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res = subprocess.run([sys.executable, str(PEERS), "--dry-run", "--out", str(tmp_path),
                          "--shapes", "mission,gqa-decode"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "peers.json").read_text())
    assert data["meta"]["dry_run"] is True
    rows = data["rows"]
    shapes = {r["shape"] for r in rows}
    assert {"mission", "gqa-decode"} <= shapes
    for r in rows:
        assert {"system", "shape", "B", "Hq", "Hkv", "Sq", "Sk", "D", "causal", "dtype"} <= set(r)
        assert ("p50_us" in r and "tflops" in r) or "error" in r
    smoke = [r for r in rows if r["shape"] == "dry-cpu-tiny"]
    if data["meta"].get("dry_run_smoke") == "ok":  # torch and the library were there
        assert {r["system"] for r in smoke} == {"flashcore-cpu", "torch-math"}
        assert all(r["check"] == "ok" for r in smoke)
    md = (tmp_path / "peers.md").read_text()
    assert "| shape | dtype |" in md and "FC/peer" in md and "DRY RUN" in md
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "peers.png").stat().st_size > 1000
    except ImportError:
        pass
