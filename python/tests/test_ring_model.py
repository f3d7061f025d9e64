"""bench/ring_model.py: the zigzag ring's step model fitted to two runs
(compute(P) = d + 2 (P - 1) u per pass) reproduces both and extrapolates;
the single-device time scales quadratically from the smaller run; a slow
link exposes what a step's compute does not cover."""

import importlib.util
import json

import pytest

from bench_dry import BENCH, in_checkout


def model():
    spec = importlib.util.spec_from_file_location("ring_model", BENCH / "ring_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(ranks, d, u, single):
    rows = {p: dict(pass_=p, compute_ms=d[p] + 2 * (ranks - 1) * u[p], single_ms=single[p]) for p in d}
    return ranks, rows


@in_checkout
def test_fit_and_extrapolation(tmp_path):
    m = model()
    d, u = {"fwd": 4.0, "fwd+bwd": 19.0}, {"fwd": 2.0, "fwd+bwd": 7.0}
    runs = [run(2, d, u, {"fwd": 13.0, "fwd+bwd": 56.0}), run(4, d, u, {"fwd": 60.0, "fwd+bwd": 250.0})]
    fitted = m.fit(runs)
    for p in d:
        assert fitted[p] == pytest.approx((d[p], u[p]))
    fast = {r["pass_"]: r for r in m.predict(runs, 8, 1e6, 16384, 8, 128, 2)}
    for p in d:
        r = fast[p]
        assert r["compute_ms"] == pytest.approx(d[p] + 14 * u[p])
        assert r["single_ms"] == pytest.approx(runs[0][1][p]["single_ms"] * 16)  # (8 / 2)^2
        assert r["efficiency"] == pytest.approx(r["single_ms"] / (8 * r["ring_ms"]))
    assert fast["fwd"]["exposed_ms"] == 0.0 and fast["fwd+bwd"]["exposed_ms"] > 0.0  # the sums' last hop
    slow = {r["pass_"]: r for r in m.predict(runs, 8, 1.0, 16384, 8, 128, 2)}  # 1 GB/s: 67 ms a forward step
    assert slow["fwd"]["exposed_ms"] == pytest.approx(7 * (slow["fwd"]["transfer_ms"] - slow["fwd"]["step_ms"]))
    # the CLI on JSON files
    paths = []
    for ranks, rows in runs:
        path = tmp_path / ("r%d.json" % ranks)
        path.write_text(json.dumps(dict(meta=dict(ranks=ranks), rows=list(rows.values()))))
        paths.append(str(path))
    assert m.load(paths[0])[0] == 2
