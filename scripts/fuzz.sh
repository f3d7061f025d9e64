#!/usr/bin/env bash
# scripts/fuzz.sh [--cuda [--memcheck]] [SECONDS] [CASES] -- build the fuzz
# target (fuzz/) with ASan and UBSan in its own build directory and run it
# for a bounded time: libFuzzer where clang has it, else the seeded driver
# (same target). Exits non-zero on any failure, printing the reproducer and
# the call it makes.
#   SECONDS  run time (default 60)        CASES  stop after this many (default: no limit)
#   --cuda   the CUDA fuzz build instead (needs a GPU): the CUDA backend,
#            no ASan/UBSan, every call's memory managed, the seeded driver
#   --memcheck  (with --cuda) run it under compute-sanitizer --tool memcheck
# Environment: FUZZ_BUILD (build dir, default build-fuzz, build-fuzz-cuda with
# --cuda), FUZZ_ENGINE (libfuzzer|driver), FUZZ_SEED (driver seed, default:
# the time), FUZZ_ARCHS (--cuda: FLASHCORE_CUDA_ARCHS, default 90a),
# FUZZ_DRIVER (a seeded driver already built for this mode: no build; its
# run directory is still $FUZZ_BUILD/fuzz-run), FC_FUZZ_SKIP (input classes
# to leave out, docs/ARCHITECTURE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=0
memcheck=0
args=()
for a in "$@"; do
  case "$a" in
    --cuda) cuda=1 ;;
    --memcheck) memcheck=1 ;;
    *) args+=("$a") ;;
  esac
done
[ $memcheck -eq 1 ] && [ $cuda -eq 0 ] && { echo "fuzz.sh: --memcheck needs --cuda" >&2; exit 2; }
secs=${args[0]:-60}
cases=${args[1]:-0}

cc=${CC:-cc}
engine=${FUZZ_ENGINE:-}
config=(-DFLASHCORE_CUDA=OFF)
build=${FUZZ_BUILD:-build-fuzz}
if [ $cuda -eq 1 ]; then
  # ASan and the CUDA runtime do not mix; compute-sanitizer covers the device.
  engine=driver
  config=(-DFLASHCORE_CUDA=ON -DFLASHCORE_CUDA_ARCHS="${FUZZ_ARCHS:-90a}" -DFLASHCORE_FUZZ_SANITIZE=OFF)
  build=${FUZZ_BUILD:-build-fuzz-cuda}
fi
runner=()
if [ $memcheck -eq 1 ]; then
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # API errors the library handles (a pointer query on host memory) are not
  # findings; a device fault is, and the driver fails on it with its input.
  runner=("$san" --tool memcheck --report-api-errors no --error-exitcode 99 --print-limit 20)
fi
if [ -z "$engine" ]; then
  if command -v clang >/dev/null && echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
       clang -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then engine=libfuzzer; else engine=driver; fi
fi
[ "$engine" = libfuzzer ] && cc=clang

if [ -n "${FUZZ_DRIVER:-}" ]; then
  engine=driver
  driver=$(realpath "$FUZZ_DRIVER")
  mkdir -p "$build"
else
  targets=(--target fc_fuzz_driver)
  [ "$engine" = libfuzzer ] && targets+=(--target fc_fuzz)
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" "${config[@]}" \
    -DFLASHCORE_BUILD_FUZZ=ON -DFLASHCORE_BUILD_TESTS=OFF -DFLASHCORE_BUILD_TOOLS=OFF >/dev/null
  cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" "${targets[@]}" >/dev/null
  driver=$(realpath "$build/fuzz/fc_fuzz_driver")
  libfuzzer=$(realpath "$build/fuzz")/fc_fuzz
fi
work=$(realpath "$build")/fuzz-run
rm -rf "$work" && mkdir -p "$work/corpus"
mode=cpu
[ $cuda -eq 1 ] && mode="cuda${runner:+ under compute-sanitizer memcheck}"
echo "== fuzz ($mode): $engine, ${secs} s${FC_FUZZ_SKIP:+, skipping $FC_FUZZ_SKIP} =="

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
      "$driver" "$f" 2>&1 | grep -v "^    #" | grep -E -A14 "^(forward|backward) call" || true
    done
    echo "fuzz: FAILED"
    exit 1
  fi
else
  lim=()
  [ "$cases" -gt 0 ] && lim=(--cases "$cases")
  # A case that hangs is a failure too: the whole run gets two minutes of grace.
  if ! (cd "$work" && timeout $((secs + 120)) "${runner[@]}" "$driver" --seconds "$secs" "${lim[@]}" \
         --seed "${FUZZ_SEED:-$(date +%s)}"); then
    f="$work/fuzz-current.bin"
    echo "reproducer: $f (replay: FC_FUZZ_SKIP=${FC_FUZZ_SKIP:-} ${runner[*]} $driver $f); the call it makes:"
    "$driver" "$f" 2>&1 | grep -v "^    #" | grep -E -A14 "^(forward|backward) call" || true
    echo "fuzz: FAILED"
    exit 1
  fi
fi
echo "fuzz: passed"
