"""flashcore.hadamard: the orthonormal Walsh-Hadamard rotation of the head
dim (incoherent processing for FP8). Against the explicit matrix (Sylvester
order, 1/sqrt(n)), its own inverse, numpy and torch alike, blocks for head
dims that are not powers of two, dtypes kept, attention unchanged when q
and k are rotated (and with v too, out rotated back), FP8 attention on
outlier inputs closer to the reference when rotated, bad arguments
refused; and bench/fp8_accuracy.py's dry run."""

import numpy as np
import pytest

import flashcore
from bench_dry import BENCH, dry_run, in_checkout

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

try:
    import torch
except ImportError:
    torch = None


def load_bench(name):
    """bench/<name>.py as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, BENCH / (name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sylvester(n):
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("d,block", [(64, None), (128, None), (256, None), (96, None), (192, None), (128, 32),
                                     (8, 1)])
def test_matches_the_matrix_and_inverts_itself(d, block):
    x = rand((3, 5, d))
    n = block or (d & -d)
    want = (x.reshape(3, 5, d // n, n) @ sylvester(n)).reshape(x.shape)
    y = flashcore.hadamard(x, block=block)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(flashcore.hadamard(y, block=block), x, rtol=0, atol=1e-12)


def test_float32_and_narrow_dtypes_kept():
    x = rand((4, 64)).astype(np.float32)
    y = flashcore.hadamard(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, x @ sylvester(64), rtol=0, atol=1e-5)
    if ml_dtypes is not None:
        b = x.astype(ml_dtypes.bfloat16)
        assert flashcore.hadamard(b).dtype == b.dtype


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_torch_like_numpy():
    x = rand((2, 7, 3, 128)).astype(np.float32)
    t = flashcore.hadamard(torch.from_numpy(x))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == x.shape
    np.testing.assert_allclose(t.numpy(), flashcore.hadamard(x), rtol=0, atol=1e-6)
    assert flashcore.hadamard(torch.from_numpy(x).bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("causal", [False, True])
def test_attention_unchanged(causal):
    q, k, v = (rand((1, 33, 4, 64), s).astype(np.float32) for s in range(3))
    want = np.asarray(flashcore.attention(q, k, v, causal=causal, backend="cpu"))
    rq, rk, rv = (flashcore.hadamard(x) for x in (q, k, v))
    got = np.asarray(flashcore.attention(rq, rk, v, causal=causal, backend="cpu"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    back = flashcore.hadamard(np.asarray(flashcore.attention(rq, rk, rv, causal=causal, backend="cpu")))
    np.testing.assert_allclose(back, want, rtol=1e-4, atol=2e-5)


@in_checkout
@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed (numpy FP8)")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outliers_quantise_better(seed):
    """FlashAttention-3's outlier distribution, q, k and v in e4m3: with q
    and k rotated, out is closer to the float64 attention (the CPU
    backend: the inputs' quantisation alone)."""
    fa = load_bench("fp8_accuracy")
    q, k, v = fa.inputs("outliers", (1, 256, 2, 128), seed)
    want = fa.reference(q, k, v, False)

    def rmse(qq, kk):
        got, why = fa.run("qkv", qq, kk, v, False, "cpu")
        assert why is None, why
        return np.sqrt(np.mean((got - want) ** 2))

    plain, rotated = rmse(q, k), rmse(flashcore.hadamard(q), flashcore.hadamard(k))
    assert rotated < 0.95 * plain, (plain, rotated)


@pytest.mark.parametrize("x,block,match", [
    (np.zeros((2, 96)), 64, "power of two dividing"), (np.zeros((2, 64)), 3, "power of two dividing"),
    (np.zeros((2, 64)), True, "power of two dividing"), (np.zeros((2, 64), dtype=np.int32), None, "floating"),
    (np.zeros((2, 0)), None, "at least 1"), ([1.0, 2.0], None, "numpy array or a torch tensor")])
def test_bad_arguments(x, block, match):
    with pytest.raises(flashcore.InvalidArgumentError, match=match):
        flashcore.hadamard(x, block=block)


@in_checkout
@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed (numpy FP8)")
def test_accuracy_dry_run(tmp_path):
    data, stdout = dry_run("fp8_accuracy.py", tmp_path, timeout=300)
    rows = data["rows"]
    assert {(r["distribution"], r["mode"], r["rotated"]) for r in rows} == {
        (d, m, r) for d in ("normal", "outliers") for m, rs in (("bf16", ("none",)), ("kv", ("none", "qk", "qkv")),
                                                                ("qkv", ("none", "qk", "qkv"))) for r in rs}
    for r in rows:  # the CPU backend runs every mode
        assert r["rmse"] > 0 and r["max_abs"] >= r["rmse"]
    assert "| distribution | mode | hadamard on |" in stdout
