#!/usr/bin/env bash
# Same-run A/B of two source trees on the GPU (a change against its base):
# builds each tree's library for 90a, then runs bench/peers.py passes in
# alternating order (A B, B A, ...) with the peers timed in every pass, and
# prints per shape the median FlashCore/peer ratios of each side
# (bench/ab_summary.py). Each side runs its own tree's binding and peers.py.
#
#   bash scripts/ab-bench.sh DIR_A DIR_B [PASSES] [peers.py args...]
#   (with --bwd the backward's peers-bwd.json are summarised)
#   e.g. the base as a tree of its own, carried to the device (.ab/ is
#   ignored): git archive REV | tar -x -C .ab/base (mkdir it first), then
#   run(carry .ab): bash scripts/ab-bench.sh .ab/base . 4 --systems sm90,sm80,cudnn,FA2
#   env: BUILD_A / BUILD_B (reuse a build dir, e.g. gpu-check's build-gpu),
#        OUT (results; default ./out)
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,13p "$0"; exit 2; }
A=$(cd "$1" && pwd) B=$(cd "$2" && pwd)
passes=${3:-2}
shift $(($# < 3 ? $# : 3))
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
summary=$(cd "$(dirname "$0")/.." && pwd)/bench/ab_summary.py
declare -A dir=([A]=$A [B]=$B) build=([A]=${BUILD_A:-/tmp/ab-A} [B]=${BUILD_B:-/tmp/ab-B})
for s in A B; do
  b=${build[$s]}
  case "$b" in /*) ;; *) b=${dir[$s]}/$b; build[$s]=$b ;; esac
  if [ ! -f "$b/libflashcore.so" ]; then
    echo "== building $s (${dir[$s]}) in $b"
    cmake -S "${dir[$s]}" -B "$b" -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_CUDA=ON -DFLASHCORE_CUDA_ARCHS=90a \
      >"$OUT/ab-build-$s.log" 2>&1 &&
      cmake --build "$b" -j "$(nproc)" --target flashcore >>"$OUT/ab-build-$s.log" 2>&1 ||
      { echo "build of $s failed"; tail -20 "$OUT/ab-build-$s.log"; exit 1; }
  fi
done
for ((i = 0; i < passes; i++)); do
  order="A B"; [ $((i % 2)) = 1 ] && order="B A"
  for s in $order; do
    echo "== pass $i: $s"
    (cd "${dir[$s]}" && FLASHCORE_LIBRARY="${build[$s]}/libflashcore.so" PYTHONPATH="${dir[$s]}/python" \
       PYTHONUNBUFFERED=1 python3 bench/peers.py --out "$OUT/ab-$s-$i" "$@" >"$OUT/ab-$s-$i.log" 2>&1) ||
      { echo "pass $i of $s failed"; tail -20 "$OUT/ab-$s-$i.log"; }
  done
done
stem=peers
for a in "$@"; do [ "$a" = --bwd ] && stem=peers-bwd; done
python3 "$summary" "$OUT"/ab-A-*/$stem.json -- "$OUT"/ab-B-*/$stem.json | tee "$OUT/ab.md"
