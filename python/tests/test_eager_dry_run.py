"""bench/eager.py --dry-run: the timing loop, the checks against SDPA's math
backend and the report, on the CPU with tiny shapes. Skipped without torch."""

import pytest

from bench_dry import dry_run, in_checkout

pytest.importorskip("torch")


@in_checkout
def test_dry_run_rows(tmp_path):
    data, stdout = dry_run("eager.py", tmp_path, timeout=300)
    systems = {r["system"] for r in data["rows"]}
    assert systems == {"flashcore.attention", "flashcore.attention-py", "flashcore.flash_attn_func", "sdpa-math"}
    for r in data["rows"]:
        assert r["check"] == "ok" and r["event_us"] > 0 and r["host_us"] > 0
    assert "| shape | system | event us/call |" in stdout
