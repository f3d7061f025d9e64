"""bench/compiled.py --dry-run: the tiny decoder with flashcore and with SDPA,
eager and compiled (aot_eager, fullgraph), a training step and an inference
forward, timed and compared, on the CPU. Skipped without torch."""

import pytest

from bench_dry import dry_run, in_checkout

pytest.importorskip("torch")


@in_checkout
def test_dry_run_rows(tmp_path):
    data, stdout = dry_run("compiled.py", tmp_path, timeout=900)
    assert data["meta"]["backend"] == "aot_eager"
    assert {(r["task"], r["mode"]) for r in data["rows"]} == {
        (t, m) for t in ("train", "infer") for m in ("eager", "default")}
    for r in data["rows"]:
        assert r["ms_flashcore"] > 0 and r["ms_sdpa"] > 0
        # same weights and inputs: the loss / logits agree to float32 rounding
        assert r["max_diff"] < 1e-4
    assert "| task | mode | flashcore ms/step |" in stdout
