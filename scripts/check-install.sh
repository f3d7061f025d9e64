#!/usr/bin/env bash
# Install a configured build into a scratch prefix, then build and run the C
# example against it twice: through find_package(flashcore) and pkg-config.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null

mkdir -p "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(flashcore REQUIRED)
add_executable(basic $root/examples/basic.c)
target_link_libraries(basic PRIVATE flashcore::flashcore)
CM
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer/build" >/dev/null
libdir=$(ls -d "$tmp"/prefix/lib* | head -1)
LD_LIBRARY_PATH="$libdir" "$tmp/consumer/build/basic"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc "$root/examples/basic.c" $(pkg-config --cflags --libs flashcore) -o "$tmp/basic_pc"
LD_LIBRARY_PATH="$libdir" "$tmp/basic_pc"
echo "install check: find_package and pkg-config consumers built and ran"
