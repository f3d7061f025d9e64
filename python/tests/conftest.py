"""Test setup: test the source tree's python/flashcore (which finds the
library through FLASHCORE_LIBRARY or <repo>/build/, see flashcore/_lib.py),
not a copy some earlier `pip install .` left in site-packages. Set
FLASHCORE_TEST_INSTALLED=1 to test the installed package instead."""

import os
import sys

if os.environ.get("FLASHCORE_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


import pytest  # noqa: E402


@pytest.fixture
def python_eager_path(monkeypatch):
    """flashcore.attention's Python path for this test (the kept calls,
    _call_cache): the torch ops' C++ kernels are loaded first (as the first
    eager call on torch tensors would load them) and their C++ eager call
    switched off until the test ends. Skipped without torch."""
    pytest.importorskip("torch")
    from flashcore import _attention
    _attention._torch_ops().load_kernels()
    monkeypatch.setattr(_attention, "_eager", None)
