"""bench/eager.py --dry-run: the timing loop, the checks against SDPA's math
backend and the report, on the CPU with tiny shapes. Skipped without torch."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
EAGER = Path(__file__).resolve().parents[2] / "bench" / "eager.py"


@pytest.mark.skipif(not EAGER.is_file(), reason="not in a source checkout")
def test_dry_run_rows(tmp_path):
    out = tmp_path / "eager.json"
    res = subprocess.run([sys.executable, str(EAGER), "--dry-run", "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["meta"]["dry_run"] is True
    systems = {r["system"] for r in data["rows"]}
    assert systems == {"flashcore.attention", "flashcore.flash_attn_func", "sdpa-math"}
    for r in data["rows"]:
        assert r["check"] == "ok" and r["event_us"] > 0 and r["host_us"] > 0
    assert "| shape | system | event us/call |" in res.stdout
