"""Test setup: test the source tree's python/flashcore (which finds the
library through FLASHCORE_LIBRARY or <repo>/build/, see flashcore/_lib.py),
not a copy some earlier `pip install .` left in site-packages. Set
FLASHCORE_TEST_INSTALLED=1 to test the installed package instead."""

import os
import sys

if os.environ.get("FLASHCORE_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
