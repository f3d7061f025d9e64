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


@pytest.mark.skipif(not PEERS.is_file(), reason="not in a source checkout")
def test_bwd_dry_run_writes_its_own_files(tmp_path):
    """--bwd: peers-bwd.{json,md}, rows with "pass": "bwd" and 2.5x the
    forward's FLOPs, the backward's default shapes (no decode, gqa-train),
    and with torch the CPU smoke's gradients checked per dq, dk, dv."""
    res = subprocess.run([sys.executable, str(PEERS), "--bwd", "--dry-run", "--out", str(tmp_path)],
                         env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert not (tmp_path / "peers.json").exists()
    data = json.loads((tmp_path / "peers-bwd.json").read_text())
    assert data["meta"]["pass"] == "bwd"
    rows = data["rows"]
    shapes = {r["shape"] for r in rows}
    assert "gqa-train" in shapes and "s2k-d128" in shapes and "gqa-decode" not in shapes
    for r in rows:
        assert r["pass"] == "bwd"
        fwd = 4.0 * r["B"] * r["Hq"] * r["Sq"] * r["Sk"] * r["D"] / (2 if r["causal"] and r["Sq"] == r["Sk"] else 1)
        assert r["flops"] == 2.5 * fwd
        if "tflops" in r:
            assert abs(r["tflops"] - r["flops"] / r["p50_us"] / 1e6) <= 1e-3 * r["tflops"]
    if data["meta"].get("dry_run_smoke") == "ok":  # torch was there
        smoke = {r["system"]: r for r in rows if r["shape"] == "dry-cpu-tiny"}
        assert set(smoke) == {"flashcore-cpu", "torch-math"}
        for r in smoke.values():  # FlashCore may lack attention_backward in an older binding
            if not r.get("error", "").startswith("unavailable"):
                assert r["check"] == "ok" and {"rel_err_dq", "rel_err_dk", "rel_err_dv"} <= set(r)
    md = (tmp_path / "peers-bwd.md").read_text()
    assert "attention backward" in md and "2.5 x" in md and "DRY RUN" in md


@pytest.mark.skipif(not PEERS.is_file(), reason="not in a source checkout")
def test_render_compares_with_peers_only(tmp_path):
    """FC/peer: the best FlashCore path over the best other library. A/B
    variants of our own paths (--sm90-env NAME, --sm90-rows N: systems
    sm90-NAME, sm80-rowN) are neither side, however fast."""
    def row(system, tflops):
        return {"system": system, "shape": "s2k-d128", "B": 8, "Hq": 16, "Hkv": 16, "Sq": 2048, "Sk": 2048,
                "D": 128, "causal": False, "dtype": "bf16", "p50_us": 275e3 / tflops, "tflops": tflops,
                "check": "ok"}
    data = {"meta": {"device_name": "test", "flashcore_version": "0", "git_sha": "0", "torch": "-",
                     "cudnn": "-", "date": "-", "gpu_before": "-", "gpu_after": "-", "ceilings": {}},
            "rows": [row("flashcore-sm90", 660.0), row("flashcore-sm80", 350.0), row("torch-cudnn", 600.0),
                     row("torch-flash(FA2)", 330.0), row("sm90-tail", 700.0), row("sm80-row18", 800.0)]}
    src = tmp_path / "in.json"
    src.write_text(json.dumps(data))
    res = subprocess.run([sys.executable, str(PEERS), "--render", str(src), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    md = (tmp_path / "out" / "peers.md").read_text()
    line = next(l for l in md.splitlines() if l.startswith("| s2k-d128 |"))
    assert line.rstrip().endswith("| 1.10x vs torch-cudnn |"), line
