#!/usr/bin/env bash
# stage-peers.sh -- FlashAttention-4 (the peer over one call's 64 MiB carry)
# onto the GPU machine, for gpu-check's benchmark.
#
#   bash scripts/stage-peers.sh pack      (here) download the pinned wheels,
#        install them into one folder, xz it and split it into parts of at
#        most 56 MiB (the tree travels with them) under .peers/stage/
#        (git-ignored), with a MANIFEST of their sha256 sums. Prints the
#        device calls to make.
#   bash scripts/stage-peers.sh put       (device) copy the carried parts and
#        the MANIFEST to /tmp/fc-stage; one call per part, back to back (the
#        machine stays warm ~30 s between calls, and /tmp with it).
#   bash scripts/stage-peers.sh unpack    (device) once /tmp/fc-stage holds
#        every part the MANIFEST names, with its sum: extract into
#        /tmp/fc-peers. gpu-check's bench stage calls it and passes the folder
#        to bench/peers.py (FLASHCORE_PEER_SITE), which then times FA4.
#
# The wheels are those the anchors used (CPython 3.12, manylinux_2_28
# x86_64); the versions are pinned so that tables stay comparable.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
      apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 cuda-bindings==13.5.0 protobuf==6.33.6
      einops==0.9.0.dev0)
STAGE=.peers/stage
DEV_STAGE=/tmp/fc-stage
DEV_SITE=/tmp/fc-peers

pack() {
  local wheels=.peers/wheels site=.peers/site
  mkdir -p "$wheels" "$STAGE"
  python3 -m pip download -q --pre --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --dest "$wheels" "${PINS[@]}"
  rm -rf "$site" "$STAGE"/*
  python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --target "$site" "$wheels"/*.whl
  # Runtime stubs for other platforms: never loaded on an x86_64 Linux host.
  find "$site" -path '*/stubs/aarch64-*' -prune -exec rm -rf {} +
  tar -C "$site" -cf - . | xz -T0 -6 | split -b 56M -d - "$STAGE/site.tar.xz.part"
  (cd "$STAGE" && sha256sum site.tar.xz.part* > MANIFEST)
  echo "staged $(ls "$STAGE"/site.tar.xz.part* | wc -l) parts in $STAGE:"
  ls -l "$STAGE"
  echo "device calls, back to back (carry each part with the MANIFEST):"
  local first=1
  for p in "$STAGE"/site.tar.xz.part*; do
    if [ $first = 1 ]; then echo "  carry [\"$p\", \"$STAGE/MANIFEST\"]: bash scripts/stage-peers.sh put"
    else echo "  carry [\"$p\", \"$STAGE/MANIFEST\"]: bash scripts/stage-peers.sh put && <gpu-check command>"; fi
    first=0
  done
}

put() {
  mkdir -p "$DEV_STAGE"
  [ -f "$STAGE/MANIFEST" ] || { echo "stage-peers: no $STAGE/MANIFEST carried" >&2; exit 1; }
  cp "$STAGE/MANIFEST" "$DEV_STAGE/"
  local n=0
  for p in "$STAGE"/site.tar.xz.part*; do [ -f "$p" ] && cp "$p" "$DEV_STAGE/" && n=$((n + 1)); done
  echo "stage-peers: $n part(s) put; $DEV_STAGE holds $(ls "$DEV_STAGE"/site.tar.xz.part* 2>/dev/null | wc -l) of $(wc -l < "$DEV_STAGE/MANIFEST")"
}

# Exit 0 with the site extracted, 2 when nothing is staged, 1 when the
# staging is incomplete or corrupt (then nothing is extracted).
unpack() {
  [ -f "$DEV_STAGE/MANIFEST" ] || return 2
  if ! (cd "$DEV_STAGE" && sha256sum --quiet -c MANIFEST); then
    echo "stage-peers: $DEV_STAGE is incomplete or corrupt (the machine went back between the calls?)" >&2
    return 1
  fi
  rm -rf "$DEV_SITE" && mkdir -p "$DEV_SITE"
  cat "$DEV_STAGE"/site.tar.xz.part* | xz -d | tar -C "$DEV_SITE" -xf -
  echo "stage-peers: peers unpacked into $DEV_SITE"
}

case "${1:-}" in
  pack) pack ;;
  put) put ;;
  unpack) unpack ;;
  *) echo "usage: $0 pack|put|unpack" >&2; exit 64 ;;
esac
