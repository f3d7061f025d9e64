#!/usr/bin/env bash
# ctest entry for the Python binding's tests: runs pytest on python/tests
# against the library just built. Exits 77 (ctest SKIP) where numpy or
# pytest are missing, so a bare machine still runs every C test.
set -u
lib=$1
root=$(cd "$(dirname "$0")/.." && pwd)
if ! python3 -c "import numpy, pytest" 2>/dev/null; then
  echo "SKIP: numpy and pytest are needed for the Python binding's tests"
  exit 77
fi
FLASHCORE_LIBRARY="$lib" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
  python3 -m pytest -q -p no:cacheprovider "$root/python/tests"
