#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS] [CASES] -- build the fuzz target (fuzz/) with
# ASan and UBSan in its own build directory and run it for a bounded time:
# libFuzzer where clang has it, else the seeded driver (same target). Exits
# non-zero on any failure, printing the reproducer and the call it makes.
#   SECONDS  run time (default 60)        CASES  stop after this many (default: no limit)
# Environment: FUZZ_BUILD (build dir, default build-fuzz), FUZZ_ENGINE
# (libfuzzer|driver), FUZZ_SEED (driver seed, default: the time),
# FC_FUZZ_SKIP (input classes to leave out, docs/ARCHITECTURE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
cases=${2:-0}
build=${FUZZ_BUILD:-build-fuzz}

cc=${CC:-cc}
engine=${FUZZ_ENGINE:-}
if [ -z "$engine" ]; then
  if command -v clang >/dev/null && echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
       clang -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then engine=libfuzzer; else engine=driver; fi
fi
[ "$engine" = libfuzzer ] && cc=clang

targets=(--target fc_fuzz_driver)
[ "$engine" = libfuzzer ] && targets+=(--target fc_fuzz)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" -DFLASHCORE_CUDA=OFF \
  -DFLASHCORE_BUILD_FUZZ=ON -DFLASHCORE_BUILD_TESTS=OFF -DFLASHCORE_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" "${targets[@]}" >/dev/null
driver=$(realpath "$build/fuzz/fc_fuzz_driver")
libfuzzer=$(realpath "$build/fuzz")/fc_fuzz
work=$(realpath "$build")/fuzz-run
rm -rf "$work" && mkdir -p "$work/corpus"
echo "== fuzz: $engine, ${secs} s${FC_FUZZ_SKIP:+, skipping $FC_FUZZ_SKIP} =="

if [ "$engine" = libfuzzer ]; then
  cp fuzz/corpus/* "$work/corpus/" 2>/dev/null || true
  runs=()
  [ "$cases" -gt 0 ] && runs=(-runs="$cases")
  set +e
  (cd "$work" && "$libfuzzer" corpus -max_total_time="$secs" "${runs[@]}" \
     -max_len=1024 -timeout=30 -print_final_stats=1 -artifact_prefix="$work/" >log.txt 2>&1)
  rc=$?
  set -e
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec)|^Done" "$work/log.txt" || true
  if [ $rc -ne 0 ]; then
    grep -v "^    #" "$work/log.txt" | tail -40
    for f in "$work"/crash-* "$work"/oom-* "$work"/timeout-* "$work"/leak-*; do
      [ -e "$f" ] || continue
      echo "reproducer: $f (replay: FC_FUZZ_SKIP=${FC_FUZZ_SKIP:-} $driver $f); the call it makes:"
      "$driver" "$f" 2>&1 | grep -v "^    #" | grep -A12 "^forward call" || true
    done
    echo "fuzz: FAILED"
    exit 1
  fi
else
  lim=()
  [ "$cases" -gt 0 ] && lim=(--cases "$cases")
  # A case that hangs is a failure too: the whole run gets two minutes of grace.
  if ! (cd "$work" && timeout $((secs + 120)) "$driver" --seconds "$secs" "${lim[@]}" --seed "${FUZZ_SEED:-$(date +%s)}"); then
    f="$work/fuzz-current.bin"
    echo "reproducer: $f (replay: FC_FUZZ_SKIP=${FC_FUZZ_SKIP:-} $driver $f); the call it makes:"
    "$driver" "$f" 2>&1 | grep -v "^    #" | grep -A12 "^forward call" || true
    echo "fuzz: FAILED"
    exit 1
  fi
fi
echo "fuzz: passed"
