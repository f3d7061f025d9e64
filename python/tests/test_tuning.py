"""The tuning cache through the binding, on the CPU with numpy: loading a
cache file (load_tuning), writing it back (save_tuning), describing it
(tuning_info), errors that name the file and line and keep the earlier
cache, one cache per thread, FLASHCORE_TUNING_CACHE at start-up, and
kernel_info.tuned. No GPU needed: a cache's entries apply to CUDA calls
only, so CPU calls always report the planner's kernel."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import flashcore

HEADER = "flashcore-tuning 1\n"
ANY_DEVICE = "device library=* tables=* cc=* sms=* cudart=* gpu=*\n"
ENTRY = "fwd d=64 : splits=2\n"


@pytest.fixture(autouse=True)
def _no_cache_after():
    # The thread's context outlives a test: leave it without a cache for the next.
    yield
    flashcore.load_tuning(None)


def write_cache(tmp_path, text, name="model.tune"):
    path = tmp_path / name
    path.write_text(text)
    return path


def valid_cache(tmp_path, name="model.tune"):
    return write_cache(tmp_path, HEADER + ANY_DEVICE + ENTRY, name)


def test_no_cache_by_default():
    assert "no tuning cache" in flashcore.tuning_info()


def test_load_a_valid_cache_is_described(tmp_path):
    path = valid_cache(tmp_path)
    flashcore.load_tuning(path)  # a Path works as well as a str
    info = flashcore.tuning_info()
    assert str(path) in info and "1 sections" in info and "no tuning cache" not in info
    flashcore.load_tuning(str(path))
    assert flashcore.tuning_info() == info


def test_save_round_trips(tmp_path):
    flashcore.load_tuning(valid_cache(tmp_path))
    first = tmp_path / "first.tune"
    flashcore.save_tuning(first)
    text = first.read_text()
    assert text.startswith(HEADER) and ENTRY in text
    flashcore.load_tuning(first)  # what was saved is a valid cache
    assert str(first) in flashcore.tuning_info()
    second = tmp_path / "second.tune"
    flashcore.save_tuning(str(second))
    assert second.read_text() == text  # canonical: saving again changes nothing


@pytest.mark.parametrize("text, line", [("hello\n", 1), (HEADER + ANY_DEVICE + ENTRY + "hello\n", 4)])
def test_corrupt_file_names_file_and_line_and_keeps_the_cache(tmp_path, text, line):
    flashcore.load_tuning(valid_cache(tmp_path))
    before = flashcore.tuning_info()
    bad = write_cache(tmp_path, text, "bad.tune")
    with pytest.raises(flashcore.InvalidArgumentError) as e:
        flashcore.load_tuning(bad)
    assert "%s:%d" % (bad, line) in str(e.value)
    assert flashcore.tuning_info() == before


def test_missing_file_raises_and_keeps_the_cache(tmp_path):
    flashcore.load_tuning(valid_cache(tmp_path))
    before = flashcore.tuning_info()
    missing = tmp_path / "missing.tune"
    with pytest.raises(flashcore.FlashCoreError, match=str(missing)):
        flashcore.load_tuning(missing)
    with pytest.raises(flashcore.FlashCoreError, match="nodir"):
        flashcore.save_tuning(tmp_path / "nodir" / "out.tune")
    assert flashcore.tuning_info() == before


def test_load_none_drops_the_cache(tmp_path):
    flashcore.load_tuning(valid_cache(tmp_path))
    flashcore.load_tuning(None)
    assert "no tuning cache" in flashcore.tuning_info()
    flashcore.load_tuning(None)  # dropping nothing is fine
    assert "no tuning cache" in flashcore.tuning_info()


@pytest.mark.parametrize("path", ["", b"", 42, "a\0b"])
def test_bad_paths_are_invalid_arguments(path):
    with pytest.raises(flashcore.InvalidArgumentError):
        flashcore.load_tuning(path)
    with pytest.raises(flashcore.InvalidArgumentError):
        flashcore.save_tuning(path)


def test_save_needs_a_path():
    with pytest.raises(flashcore.InvalidArgumentError):
        flashcore.save_tuning(None)


def test_long_description_is_not_cut(tmp_path):
    # More than the first buffer the binding tries (4 KiB) holds.
    sections = "".join(ANY_DEVICE.replace("gpu=*", "gpu=gpu-%d" % i) + ENTRY for i in range(100))
    flashcore.load_tuning(write_cache(tmp_path, HEADER + sections))
    info = flashcore.tuning_info()
    assert len(info) > 4096 and "gpu=gpu-0:" in info and "gpu=gpu-99:" in info


def test_each_thread_has_its_own_cache(tmp_path):
    flashcore.load_tuning(valid_cache(tmp_path))
    seen = {}
    t = threading.Thread(target=lambda: seen.setdefault("info", flashcore.tuning_info()))
    t.start()
    t.join()
    assert "no tuning cache" in seen["info"]
    assert "no tuning cache" not in flashcore.tuning_info()


def test_kernel_info_tuned_is_false_on_cpu(tmp_path):
    flashcore.load_tuning(valid_cache(tmp_path))  # its entries apply to CUDA calls only
    q = np.random.default_rng(3).standard_normal((1, 8, 2, 64)).astype(np.float32)
    flashcore.attention(q, q, q, causal=True)
    info = flashcore.kernel_info
    assert info.backend == "cpu" and info.tuned is False and not info.tuned


def test_set_tuning_still_takes_every_field():
    before = flashcore.get_tuning()
    try:
        flashcore.set_tuning(splits=3, pdl=0, sm80_bwd_config=-1)
        got = flashcore.get_tuning()
        assert (got["splits"], got["pdl"]) == (3, 0)
        with pytest.raises(flashcore.InvalidArgumentError, match="no field"):
            flashcore.set_tuning(no_such_field=1)
    finally:
        flashcore.set_tuning(**{k: v for k, v in before.items() if v is not None})


def run_fresh(code, **env_vars):
    """stdout of code in a new interpreter with env_vars set (the same
    library and package as here)."""
    env = dict(os.environ, FLASHCORE_LIBRARY=flashcore.library_path(), **env_vars)
    pkg_parent = str(Path(flashcore.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_environment_cache_is_loaded_at_start(tmp_path):
    path = valid_cache(tmp_path)
    out = run_fresh("import flashcore; print(flashcore.tuning_info())", FLASHCORE_TUNING_CACHE=str(path))
    assert "tuning cache %s" % path in out


def test_environment_cache_that_fails_is_reported_not_raised(tmp_path):
    bad = write_cache(tmp_path, "hello\n", "bad.tune")
    code = ("import numpy as np, flashcore\n"
            "q = np.ones((1, 4, 1, 32), np.float32)\n"
            "flashcore.attention(q, q, q)\n"  # the context works without the cache
            "print(flashcore.tuning_info())\n")
    out = run_fresh(code, FLASHCORE_TUNING_CACHE=str(bad))
    assert "FLASHCORE_TUNING_CACHE" in out and "%s:1" % bad in out and "no tuning cache" in out


def test_removed_row_forcing_variables_are_ignored():
    removed = dict(FLASHCORE_SM90_CONFIG="1", FLASHCORE_SM80_CONFIG="1", FLASHCORE_SM80_BWD_CONFIG="1",
                   FLASHCORE_SM90_ROTATE="1", FLASHCORE_SM90_TAIL="1", FLASHCORE_SM90_GRID="7",
                   FLASHCORE_SPLITS="3", FLASHCORE_PDL="0")
    out = run_fresh("import flashcore; t = flashcore.get_tuning(); "
                    "print(t['splits'], t['sm90_grid'], t['pdl'], t['sm90_config'])", **removed)
    assert out.split() == ["0", "0", "-1", "-1"]
