#!/usr/bin/env bash
# Everything GPU-side in one device call: build, GPU tests (both CUDA paths),
# compute-sanitizer on small cases of every kernel variant, SASS check for
# HGMMA in the Hopper kernels, and the benchmark beside the peers in the same
# run, forward and backward. Prints a short summary table last. Logs and JSON
# go to $OUT (or out/).
#
#   bash scripts/gpu-check.sh [all|STAGE[,STAGE...]] [--quick]
#   stages: build test sanitize sass bench (the forward, then the backward),
#   and (not in `all`) bench-bwd: the backward's benchmark alone;
#   sanitize-bwd: the three sanitizers on the backward's kernels alone;
#   bench-paged: bench/paged.py (paged decode vs contiguous); ring: context
#   parallelism over NCCL on every GPU (tests, then bench/ring.py); tune: the
#   tuner on bench/tune-shapes.txt (flashcore tune, its verify pass); trace: a
#   trace build of the Hopper kernels (-DFC_SM90_TRACE=1, in $BUILD-trace)
#   timing each tile's phases on TRACE_SHAPES (bench/trace_sm90.py); profile:
#   Nsight Compute on one call per system (PROFILE_SYSTEMS, default our two
#   paths, cuDNN, FA2) on PROFILE_SHAPES (bench/profile_peers.py), summarised
#   by bench/ncu_summary.py (duration, throughput, tensor pipe, stalls)
#   env: BUILD (build dir, default build-gpu), ARCHS (default 90a),
#        PEERS_MAX_S (bench time cap; default: what is left of 440 s, so that
#        `all` fits one 600 s device call), PEERS_EXTRA (more bench/peers.py args),
#        PEERS_BWD_MAX_S (the backward's cap, default 150 s or what is left;
#        0: not run), PEERS_BWD_EXTRA (more bench/peers.py --bwd args)
#   .git-sha: the commit this tree is, written by the sender before the call
#        (`git rev-parse --short HEAD > .git-sha`, carried); the build info,
#        the bench JSON and the summary line record it
#
# Stages run in order; `all` runs every stage; the build runs whenever there is
# no build yet. --quick trims tests and bench
# (for a smoke run). Exit code: non-zero if any stage failed. At the end the
# logs are packed into $OUT/logs.tgz so that what comes back from the device
# (at most 8 files) is: summary.txt, logs.tgz, peers.json, peers.md, peers.png,
# peers-bwd.json, peers-bwd.md (the backward's chart is in logs.tgz).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
stage=${1:-all}
quick=0
for a in "$@"; do [ "$a" = "--quick" ] && quick=1; done
BUILD=${BUILD:-build-gpu}
ARCHS=${ARCHS:-90a}
JOBS=$(nproc)
case "$BUILD" in /*) LIB="$BUILD/libflashcore.so" ;; *) LIB="$PWD/$BUILD/libflashcore.so" ;; esac
declare -A result
t0=$(date +%s)
log() { echo "== [$(($(date +%s) - t0))s] $*"; }
want() { [ "$stage" = all ] || [[ ",$stage," == *",$1,"* ]]; }
want_explicit() { [[ ",$stage," == *",$1,"* ]]; }
# sm80_table_rows WHICH: "row head_dim" for rows of the sm80-class table
# (`flashcore rows --path 80`: index head_dim block_m block_n threads stages
# ctas kvsplit tall arch_class variant kernel), one per kernel (rows of
# several classes or kinds can share one): WHICH = sm90 for the sm90-class
# rows, variant for the rows with code-variant bits
sm80_table_rows() {
  "$BUILD/flashcore" rows --path 80 | awk -v which="$1" '
    ((which == "sm90" && $10 == 90) || (which == "variant" && $11 != 0)) && !($12 in seen) {
      seen[$12] = 1; print $1, $2 }'
}
sm80_rows() { sm80_table_rows sm90; }
sm80_variant_rows() { sm80_table_rows variant; }
# [VAR=value...] gpu_prog KEY PROG ARGS...: test program PROG with ARGS (and
# the variables the call sets), its log in $OUT/gpu-test-KEY.log; prints its
# result line "gpuKEY VALUE" (the test stage's jobs run in the background),
# the failures' diagnostics on stderr
gpu_prog() {
  local key=$1 prog=$2
  shift 2
  if timeout 300 "$BUILD/tests/$prog" "$@" >"$OUT/gpu-test-$key.log" 2>&1; then
    echo "gpu$key ok: $(tail -1 "$OUT/gpu-test-$key.log")"
  else
    echo "gpu$key FAIL: $(tail -1 "$OUT/gpu-test-$key.log")"; grep -m 15 -i fail "$OUT/gpu-test-$key.log" >&2
  fi
}
# [VAR=value...] gpu_matrix KEY ARGS...: the forward's GPU matrix (gpu_prog)
gpu_matrix() {
  local key=$1
  shift
  gpu_prog "$key" test_cuda_forward "$@"
}
# run_rows VAR PATH LIST: the GPU matrix on path PATH once per "row head_dim ..." line
# that LIST prints, with VAR=row forcing the row (log gpu-test-PATH-row-ROW.log);
# prints "gpuPATH-rows VALUE"
# force "FIELD=V ...": the path of a tuning cache file (docs/TUNING.md) with
# one entry, for every forward call on any device, that sets those fields:
# the matrices force rows and hooks through it (FLASHCORE_TUNING_CACHE)
force() {
  local f="$OUT/force-${1//[ =]/_}.tune"
  printf 'flashcore-tuning 1\ndevice library=* tables=* cc=* sms=* cudart=* gpu=*\nfwd : %s\n' "$1" >"$f"
  echo "$f"
}
run_rows() {
  local field=$1 path=$2 list=$3 bad="" n=0 row dim
  while read -r row dim _; do
    n=$((n + 1))
    (export FLASHCORE_TUNING_CACHE="$(force "$field=$row")"; gpu_matrix "$path-row-$row" --path "$path" --head-dim "$dim" --cases "$nr" \
       --seed $((row + 7))) | grep -q "^gpu$path-row-$row ok: " || bad="$bad $row"
  done < <($list)
  if [ -z "$bad" ]; then echo "gpu$path-rows ok: $n rows x $nr cases"
  else echo "gpu$path-rows FAIL: rows$bad"; fi
}
# "row head_dim tall ctas kvsplit" for each row of the Hopper tile table
sm90_rows() { "$BUILD/flashcore" rows --path 90 | awk '{ print $1, $2, $9, $7, $8 }'; }

# collect_results PREFIX: wait for the stage's background jobs, then read the
# "key value" lines they printed into $OUT/PREFIX*.res into result[]
collect_results() {
  wait
  local key val
  while read -r key val; do result[$key]=$val; done < <(cat "$OUT/$1"*.res)
  rm -f "$OUT/$1"*.res
}

# ptxas spill warnings of a build log (nothing when no kernel spills)
spills_in() { grep -i "spill" "$1" | grep -v " 0 bytes spill"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,memory.used --format=csv,noheader | tee "$OUT/gpu.txt"

if want build || [ ! -x "$BUILD/flashcore" ]; then
  log "build ($ARCHS)"
  # The build info records the sender's commit (.git-sha): this machine's
  # copy of .git is the session's first commit, later ones uncommitted.
  if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_CUDA=ON \
       "-DFLASHCORE_CUDA_ARCHS=$ARCHS" "-DFLASHCORE_GIT_SHA=$(cat .git-sha 2>/dev/null)" >"$OUT/build.log" 2>&1 &&
     cmake --build "$BUILD" -j "$JOBS" >>"$OUT/build.log" 2>&1; then
    result[build]=ok
  else
    result[build]=FAIL; tail -40 "$OUT/build.log"; echo "build failed"; exit 1
  fi
  if spills_in "$OUT/build.log" | grep -q .; then
    result[spills]=FAIL; spills_in "$OUT/build.log" | head
  else result[spills]=none; fi
fi

if want test; then
  log "ctest"
  # test_cuda_forward, test_cuda_backward, test_cuda_paged and test_cuda_merge run below, with their own logs
  if ctest --test-dir "$BUILD" --output-on-failure -E "test_cuda_forward|test_cuda_backward|test_cuda_paged|test_cuda_merge|python_binding" >"$OUT/ctest.log" 2>&1; then result[ctest]=ok; else result[ctest]=FAIL; fi
  tail -15 "$OUT/ctest.log"
  n=$([ $quick = 1 ] && echo 60 || echo 300)
  nr=$([ $quick = 1 ] && echo 12 || echo 40)
  # The matrices run side by side, each a background job that prints its
  # result lines into $OUT/t-JOB.res: a test process is mostly the fp64
  # reference on one host core, so on the device's 16 cores eight at once
  # take about as long as the longest (the path-90 matrix) instead of the
  # sum (~200 s of a 454 s check). The GPU runs their small kernels
  # interleaved; no result depends on timing.
  log "GPU matrices side by side: paths 80 and 90 ($n cases), forced rows ($nr cases each), rotated, tail, paged, pytest"
  for path in 80 90; do gpu_matrix $path --path $path --cases $n >"$OUT/t-$path.res" & done
  # the backward (both CUDA paths' kernels) against the reference backward
  gpu_prog bwd test_cuda_backward --cases $n >"$OUT/t-bwd.res" &
  # the paged KV cache and seqused_k: the library's choice and both paths
  # forced, against the reference (each case's reference checked against a
  # dense twin on the host: half the cases for about the same time)
  gpu_prog paged test_cuda_paged --cases $((n / 2)) >"$OUT/t-paged.res" &
  # fc_attention_merge on the device against the CPU backend and a double
  # merge (parts in the kernel's parameters and in a device table)
  gpu_prog merge test_cuda_merge >"$OUT/t-merge.res" &
  # Every row of the Hopper tile table (sm90_config) and every sm90-class
  # row of the sm80 table (sm80_config), forced by a tuning cache file, on
  # random cases of its head_dim: rows the planner picks only for some shapes
  # (tall, small, long-KV) get the same matrix as the defaults.
  run_rows sm90_config 90 sm90_rows >"$OUT/t-rows90.res" &
  run_rows sm80_config 80 sm80_rows >"$OUT/t-rows80.res" &
  # The rotated Hopper tile loop on every case (the planner takes it only
  # where a CTA gets several tiles, which few test shapes reach)
  FLASHCORE_TUNING_CACHE="$(force sm90_rotate=1)" gpu_matrix 90-rot --path 90 --cases $((n / 3)) --seed 91 >"$OUT/t-rot.res" &
  # Tail balancing (the last tiles' KV blocks dealt out over the CTAs, parts
  # merged by the last to finish) on every case that allows it: a 5-CTA grid
  # gives the small test shapes several rounds of tiles and so tails, with
  # tiles split 2-5 ways; the matrix checks every element and the rerun's bits
  FLASHCORE_TUNING_CACHE="$(force "sm90_tail=1 sm90_grid=5")" gpu_matrix 90-tail --path 90 --cases $((n / 3)) --seed 93 \
    >"$OUT/t-tail.res" &
  # --durations: the log names the slowest tests (this stage sets the call's
  # length: 324 s of the 552 s build,test call on an H100)
  (
    if FLASHCORE_LIBRARY="$LIB" PYTHONPATH="$PWD/python" \
         python3 -m pytest -q --durations=15 python/tests >"$OUT/pytest.log" 2>&1; then echo "pytest ok: $(tail -1 "$OUT/pytest.log")"
    else echo "pytest FAIL: $(tail -1 "$OUT/pytest.log")"; tail -20 "$OUT/pytest.log" >&2; fi
  ) >"$OUT/t-pytest.res" &
  collect_results t-
  for k in gpu80 gpu90 gpubwd gpupaged gpumerge gpu90-rows gpu80-rows gpu90-rot gpu90-tail pytest; do
    [ -n "${result[$k]:-}" ] || result[$k]="FAIL: its job printed no result"
  done
  log "GPU matrices done"
fi

if want sanitize || want_explicit sanitize-bwd; then
  # The three tools run side by side, each through its variants in order: an
  # instrumented run is mostly host work, so three at once on the one GPU take
  # about as long as the slowest tool (racecheck) instead of the sum, which
  # keeps `all` inside one 600 s device call (it ran out at 600 s with them in
  # sequence once the tail-balancing variants came). Each tool's
  # results come back through $OUT/san-TOOL.res, one "key value" line each.
  # sanitize-bwd: the backward's variant alone.
  san_run() { # [VAR=value...] [SAN_TEST=prog] san_run TOOL KEY ARGS...: one variant, its log in $OUT/KEY.log
    local tool=$1 key=$2
    shift 2
    log "compute-sanitizer $tool ${key#san-"$tool"-}" >&2
    if timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 \
         "$BUILD/tests/${SAN_TEST:-test_cuda_forward}" --quick "$@" >"$OUT/$key.log" 2>&1
    then echo "$key clean"
    else echo "$key FAIL ($(grep -c -i 'error' "$OUT/$key.log") error lines)"; tail -12 "$OUT/$key.log" >&2; fi
  }
  san_tool() { # san_tool TOOL: every variant of one tool
    local tool=$1 path row dim tall ctas kvs
    for path in 80 90; do san_run "$tool" "san-$tool-$path" --path $path; done
    # the backward's kernels (preprocess, main in both dQ modes, convert)
    SAN_TEST=test_cuda_backward san_run "$tool" "san-$tool-bwd"
    # paged KV: a page index read wrong reads another allocation, which the
    # matrices may not see; memcheck does. Its own rows' kernels (kVarPaged)
    # run only paged calls, so the forced-row runs below never reach them
    # (racecheck and synccheck of its quick cases: ~5 s each, H200)
    SAN_TEST=test_cuda_paged san_run "$tool" "san-$tool-paged"
    # the merge kernel and its part table (shuffles within groups of lanes)
    SAN_TEST=test_cuda_merge san_run "$tool" "san-$tool-merge"
    # the rotated tile loop (the planner takes it only for several tiles per CTA)
    FLASHCORE_TUNING_CACHE="$(force sm90_rotate=1)" san_run "$tool" "san-$tool-90rot" --path 90
    # tail balancing on a 5-CTA grid: split tiles, partials, the arrival
    # counters and the merge
    FLASHCORE_TUNING_CACHE="$(force "sm90_tail=1 sm90_grid=5")" san_run "$tool" "san-$tool-90tail" --path 90
    # the tall rows (3 consumer warpgroups), the 2-CTA/SM rows and the
    # kvsplit rows are not in the default quick set
    while read -r row dim tall ctas kvs; do
      [ "$tall" != 0 ] || [ "$ctas" != 1 ] || [ "$kvs" != 1 ] || continue
      FLASHCORE_TUNING_CACHE="$(force "sm90_config=$row")" san_run "$tool" "san-$tool-row$row" --path 90 \
        --head-dim "$dim"
    done < <(sm90_rows)
    # the sm80 code variants move barriers and loads: racecheck each
    if [ "$tool" = racecheck ]; then
      while read -r row dim; do
        FLASHCORE_TUNING_CACHE="$(force "sm80_config=$row")" san_run "$tool" "san-$tool-80row$row" --path 80 \
          --head-dim "$dim"
      done < <(sm80_variant_rows)
    fi
  }
  for tool in memcheck racecheck synccheck; do
    if want sanitize; then san_tool $tool >"$OUT/san-$tool.res" &
    else SAN_TEST=test_cuda_backward san_run "$tool" "san-$tool-bwd" >"$OUT/san-$tool.res" & fi
  done
  collect_results san-
fi

if want sass; then
  log "SASS: HGMMA in the sm90 kernels"
  # the kernel TUs, forward and backward (plan/tma are host code)
  objs=$(find "$BUILD" -path '*sm90*' \( -name 'fwd_*.o' -o -name 'bwd_*_d*.o' \) | sort)
  total=0; bad=0
  for o in $objs; do
    c=$(cuobjdump -sass "$o" 2>/dev/null | grep -c HGMMA || true)
    echo "$(basename "$o"): HGMMA $c"; total=$((total + c)); [ "$c" -gt 0 ] || bad=$((bad + 1))
  done | tee "$OUT/sass.txt"
  if [ -z "$objs" ]; then result[sass]="no sm90 objects"
  elif grep -q "HGMMA 0$" "$OUT/sass.txt"; then result[sass]="FAIL: a sm90 object without HGMMA"
  else result[sass]="ok: every sm90 object has HGMMA"; fi
fi

# peers_setup: the optional peers into peer_path, once per call. They come
# as carried wheels in .whl/ (FlashInfer) or staged ahead of the call
# (FlashAttention-4: docs/PERF.md says how); without them peers.py notes
# them as unavailable.
peer_path=""
peers_done=0
peers_setup() {
  [ $peers_done = 1 ] && return 0
  peers_done=1
  # FlashAttention-4 is staged over several calls (scripts/stage-peers.sh).
  local st=0; bash scripts/stage-peers.sh unpack >"$OUT/peer-stage.log" 2>&1 || st=$?
  case $st in
    0) peer_path=/tmp/fc-peers ;;
    1) echo "staged peers not used: $(tail -1 "$OUT/peer-stage.log")" ;;
  esac
  if ls .whl/*.whl >/dev/null 2>&1; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
         --target /tmp/fc-peers .whl/*.whl >"$OUT/peer-wheels.log" 2>&1; then peer_path=/tmp/fc-peers
    else echo "carried peer wheels failed to install: $(tail -1 "$OUT/peer-wheels.log")"; fi
  fi
}

# run_peers LOG ARGS...: bench/peers.py on the library just built, its log in $OUT/LOG
run_peers() {
  local logf=$1
  shift
  FLASHCORE_PEER_SITE="${peer_path:-}" FLASHCORE_LIBRARY="$LIB" PYTHONPATH="$PWD/python" PYTHONUNBUFFERED=1 \
    python3 bench/peers.py --out "$OUT" "$@" >"$OUT/$logf" 2>&1
}

if want bench; then
  log "benchmark beside the peers"
  peers_setup
  args=()
  [ $quick = 1 ] && args+=(--quick)
  # One device call may last 600 s: without PEERS_MAX_S the benchmark's
  # timed rounds get what is left of ~440 s after the earlier stages, less
  # ~60 s that peers.py spends beyond --max-total-s (torch start-up, the
  # ceilings, warm-ups) and the demo (the backward's run below has the
  # next 105 s at least). Under 60 s left it does not start: a
  # cold 'all' with more kernel instances to build and load once ran past
  # 600 s and lost every log; then run `bench` in a second call on the warm
  # machine.
  used=$(($(date +%s) - t0))
  left=$((440 - used))
  if [ -z "${PEERS_MAX_S:-}" ] && [ "$left" -lt 60 ]; then
    result[bench]="skipped: ${used} s used of the 600 s call; run the bench stage in a second call"
  else
    args+=(--max-total-s "${PEERS_MAX_S:-$left}")
    # PEERS_EXTRA: more peers.py arguments, e.g. "--sm90-rows 0,7 --shapes s16k-d64"
    read -r -a extra <<< "${PEERS_EXTRA:-}"
    args+=("${extra[@]}")
    if run_peers peers.log "${args[@]}"; then result[bench]=ok
    else result[bench]=FAIL; tail -30 "$OUT/peers.log"; fi
    "$BUILD/flashcore" demo > "$OUT/demo.txt" 2>&1 && result[demo]="ok" || result[demo]=FAIL
    tail -6 "$OUT/demo.txt"
  fi
fi

if want_explicit bench-paged; then
  # Decode from a paged cache beside the contiguous decode (and FlashInfer
  # when carried): bench/paged.py, its own files (paged.json, paged.md).
  # PAGED_EXTRA: more bench/paged.py arguments, e.g. "--quick".
  log "paged decode benchmark"
  read -r -a pextra <<< "${PAGED_EXTRA:-}"
  if FLASHCORE_LIBRARY="$LIB" PYTHONPATH="$PWD/python" PYTHONUNBUFFERED=1 \
       python3 bench/paged.py --out "$OUT" "${pextra[@]}" >"$OUT/paged.log" 2>&1; then result[bench-paged]=ok
  else result[bench-paged]=FAIL; fi
  tail -30 "$OUT/paged.log"
fi

if want_explicit tune; then
  # The tuner on the held-out shapes (bench/tune-shapes.txt, none in the
  # benchmark table): search, write the cache, then the verify pass (planner
  # against cache, fresh interleaved rounds). Files: tuning.tune, tune.json,
  # tune.md (the table). TUNE_EXTRA: more `flashcore tune` arguments.
  log "tune: bench/tune-shapes.txt"
  read -r -a textra <<< "${TUNE_EXTRA:-}"
  if "$BUILD/flashcore" tune --shapes-file bench/tune-shapes.txt --output "$OUT/tuning.tune" \
       --json "$OUT/tune.json" "${textra[@]}" >"$OUT/tune.md" 2>"$OUT/tune.log"; then
    result[tune]="ok: $(grep -o 'tuned .* in [0-9.]* s' "$OUT/tune.md"); $(grep -o 'geometric mean.*' "$OUT/tune.md")"
  else result[tune]=FAIL; tail -20 "$OUT/tune.log"; fi
  cat "$OUT/tune.md"
fi

if want bench || want_explicit bench-bwd; then
  # The backward beside cuDNN's and FA2's (peers.py --bwd), in files of its
  # own (peers-bwd.json and .md come back; its chart goes into logs.tgz) and
  # with a cap of its own: PEERS_BWD_MAX_S (default 150 s; 0: not run), less
  # where the call has less left of 545 s, less the ~45 s peers.py runs past
  # its cap (torch start-up, the ceilings, the shape in progress). Shorter
  # rounds than the forward's (--budget-s 4): its shapes in about two
  # minutes. Under 30 s left it does not start: run `bench-bwd` in a second
  # call on the warm machine.
  used=$(($(date +%s) - t0))
  bwd_max=${PEERS_BWD_MAX_S:-150}
  cap=$((545 - 45 - used))
  [ "$bwd_max" -lt "$cap" ] && cap=$bwd_max
  if [ "$bwd_max" = 0 ]; then
    result[bench-bwd]="skipped: PEERS_BWD_MAX_S=0"
  elif [ "$cap" -lt 30 ]; then
    result[bench-bwd]="skipped: ${used} s used of the 600 s call; run the bench-bwd stage in a second call"
  else
    log "backward beside the peers (cap ${cap} s)"
    peers_setup
    bargs=(--bwd --budget-s 4 --min-repeats 6 --max-total-s "$cap")
    [ $quick = 1 ] && bargs+=(--quick)
    read -r -a extra <<< "${PEERS_BWD_EXTRA:-}"
    bargs+=("${extra[@]}")
    if run_peers peers-bwd.log "${bargs[@]}"; then result[bench-bwd]=ok
    else result[bench-bwd]=FAIL; tail -30 "$OUT/peers-bwd.log"; fi
  fi
fi

if want_explicit trace; then
  log "trace build and per-tile phases"
  if cmake -S . -B "$BUILD-trace" -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_CUDA=ON "-DFLASHCORE_CUDA_ARCHS=$ARCHS" \
       -DCMAKE_CUDA_FLAGS=-DFC_SM90_TRACE=1 >"$OUT/trace-build.log" 2>&1 &&
     cmake --build "$BUILD-trace" -j "$JOBS" --target flashcore_cli >>"$OUT/trace-build.log" 2>&1; then
    result[trace]=ok
    # The stamps cost registers: a spilling trace kernel's phases include
    # local-memory traffic the shipped kernel does not have (some rows spill
    # a few bytes in trace builds only). Say so in the result.
    tspill=$(spills_in "$OUT/trace-build.log" | grep -o "kernelILi[0-9]*" | sort -u | tr '\n' ' ')
    [ -n "$tspill" ] && result[trace]="ok (trace build spills in: $tspill)"
    for sh in ${TRACE_SHAPES:-s512-d64 s2k-d128 s8k-d128}; do
      FLASHCORE_SM90_TRACE_FILE="$OUT/trace-$sh.bin" "$BUILD-trace/flashcore" bench --shape "$sh" --iters 2 \
        --warmup-ms 200 --no-graph >"$OUT/trace-$sh.log" 2>&1
      echo "-- $sh"; python3 bench/trace_sm90.py "$OUT/trace-$sh.bin" | tee -a "$OUT/trace.txt"
    done
  else result[trace]=FAIL; tail -20 "$OUT/trace-build.log"; fi
fi

if want_explicit ring; then
  # Context parallelism over NCCL on this machine's GPUs: the ring's checks
  # (python/tests/test_distributed.py with FC_TEST_RING_BACKEND=nccl, 2
  # ranks up to every GPU), then bench/ring.py (causal, zigzag) for each
  # rank count in RING_RANKS (default: 2 and every GPU), tokens a rank in
  # RING_TOKENS (default 16384 65536) and comm in RING_COMMS (default p2p
  # all_gather); RING_EXTRA: more bench/ring.py arguments. On 4 GPUs the
  # defaults take ~10 minutes: split RING_TOKENS over two calls. The ops'
  # Python kernels (FLASHCORE_TORCH_EXT=0): no rank waits on another's
  # extension build. JSON: ring-P-T-COMM.json.
  ngpu=$(nvidia-smi -L | wc -l)
  if [ "$ngpu" -lt 2 ]; then result[ring]="FAIL: $ngpu GPU (the ring needs 2 or more)"
  else
    log "ring: NCCL checks on 2..$ngpu ranks"
    export FLASHCORE_TORCH_EXT=0
    if FC_TEST_RING_BACKEND=nccl FC_TEST_RING_SIZES=$(seq -s, 2 "$ngpu") FLASHCORE_LIBRARY="$LIB" \
         PYTHONPATH="$PWD/python" timeout 400 python3 -m pytest -q python/tests/test_distributed.py \
         >"$OUT/ring-test.log" 2>&1; then result[ring-test]="ok: $(tail -1 "$OUT/ring-test.log")"
    else result[ring-test]="FAIL: $(tail -1 "$OUT/ring-test.log")"; tail -30 "$OUT/ring-test.log"; fi
    read -r -a rextra <<< "${RING_EXTRA:-}"
    result[ring]=ok
    for P in ${RING_RANKS:-2 $ngpu}; do
      for T in ${RING_TOKENS:-16384 65536}; do
        for C in ${RING_COMMS:-p2p all_gather}; do
          log "ring: $P ranks, $T tokens a rank, comm $C"
          if FLASHCORE_LIBRARY="$LIB" PYTHONPATH="$PWD/python" timeout 300 torchrun --nproc-per-node "$P" \
               bench/ring.py --causal --seq-per-rank "$T" --comm "$C" --json "$OUT/ring-$P-$T-$C.json" \
               "${rextra[@]}" >"$OUT/ring-$P-$T-$C.log" 2>&1; then tail -12 "$OUT/ring-$P-$T-$C.log"
          else result[ring]="FAIL: $P ranks, $T tokens, $C"; tail -30 "$OUT/ring-$P-$T-$C.log"; fi
        done
      done
    done
  fi
fi

if want_explicit profile; then
  # ncu leaves the clocks alone (--clock-control none: the clocks stay as the benchmark runs them);
  # the raw page keeps every metric the sections collect, by name.
  result[profile]=ok
  peers_setup
  for sh in ${PROFILE_SHAPES:-s2k-d128 s512-d64}; do
    log "ncu: one call per system, $sh"
    if FLASHCORE_PEER_SITE="$peer_path" FLASHCORE_LIBRARY="$LIB" PYTHONPATH="$PWD/python" timeout 400 ncu --profile-from-start off \
         --clock-control none --csv --page raw --section SpeedOfLight --section ComputeWorkloadAnalysis \
         --section WarpStateStats --section Occupancy \
         python3 bench/profile_peers.py --shapes "$sh" --systems "${PROFILE_SYSTEMS:-sm90,sm80,cudnn,fa2}" \
         >"$OUT/ncu-$sh.csv" 2>"$OUT/ncu-$sh.log"; then
      echo "-- $sh"; grep -E "^(profiled|skip)" "$OUT/ncu-$sh.log"
      python3 bench/ncu_summary.py "$OUT/ncu-$sh.csv" | tee -a "$OUT/profile.txt"
    else
      result[profile]=FAIL; tail -20 "$OUT/ncu-$sh.log"
    fi
  done
fi

nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader | sed 's/^/after: /'
echo
echo "== gpu-check summary ($(head -1 "$OUT/gpu.txt" | cut -d, -f1), $(cat .git-sha 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo nogit), $(($(date +%s) - t0)) s)"
[ -f "$OUT/peers.md" ] && cat "$OUT/peers.md"
[ -f "$OUT/peers-bwd.md" ] && cat "$OUT/peers-bwd.md"
status=0
for k in $(echo "${!result[@]}" | tr ' ' '\n' | sort); do
  printf '| %-22s | %s |\n' "$k" "${result[$k]}"
  case "${result[$k]}" in FAIL*) status=1 ;; esac
done | tee "$OUT/summary.txt"
grep -q "| FAIL" "$OUT/summary.txt" && status=1
(cd "$OUT" && logs=$(ls | grep -vE '^(summary.txt|peers\.(json|md|png)|peers-bwd\.(json|md)|paged\.(json|md)|tune\.(json|md)|tuning\.tune|ring-.*\.json|logs.tgz)$') &&
  [ -n "$logs" ] && tar czf logs.tgz $logs && rm -f $logs)
exit $status
