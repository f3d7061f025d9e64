"""bench/ring.py --dry-run: ring_attention's scaling benchmark on 2 CPU
ranks over gloo (the whole sequence on one rank, the ring, the ring with
its transfers stubbed out), forward and forward + backward. Skipped
without torch or gloo."""

import pytest

from bench_dry import dry_run, in_checkout

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed without gloo", allow_module_level=True)


@in_checkout
@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_dry_run_rows(tmp_path, comm):
    data, stdout = dry_run("ring.py", tmp_path, timeout=600, extra=("--comm", comm, "--causal"))
    assert data["meta"]["ranks"] == 2 and data["meta"]["check"]["ok"] and data["meta"]["comm"] == comm
    assert data["meta"]["check"]["max_rel_err"] < 1e-4
    assert [r["pass_"] for r in data["rows"]] == ["fwd", "fwd+bwd"]
    for r in data["rows"]:
        assert r["single_ms"] > 0 and r["ring_ms"] > 0 and r["compute_ms"] > 0
        assert r["efficiency"] == pytest.approx(r["single_ms"] / (2 * r["ring_ms"]))
    assert "| pass | single device ms | ring ms |" in stdout


@in_checkout
def test_dry_run_profile(tmp_path):
    """--profile: rank 0's op table after the timings (CPU ops here)."""
    data, stdout = dry_run("ring.py", tmp_path, timeout=600, extra=("--no-bwd", "--profile"))
    assert [r["pass_"] for r in data["rows"]] == ["fwd"]
    assert "profile, fwd, 3 ring steps, rank 0:" in stdout and "c10d::" in stdout


@in_checkout
def test_dry_run_layers_memo_check(tmp_path):
    """--layers 2 --memo-check: two chained calls a step, the shapes check
    made once per shape; the check against one call still runs."""
    data, _ = dry_run("ring.py", tmp_path, timeout=600, extra=("--no-bwd", "--layers", "2", "--memo-check"))
    assert data["meta"]["layers"] == 2 and data["meta"]["memo_check"] is True and data["meta"]["check"]["ok"]
    assert [r["pass_"] for r in data["rows"]] == ["fwd"] and data["rows"][0]["ring_ms"] > 0
