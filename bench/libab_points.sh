#!/usr/bin/env bash
# Builds, here, a carry for bench/libab.sh that sets commits against each other: BASE's
# library and gpubench as libgollm_cuda.so and gpubench, and each POINT's as
# libgollm_cuda_POINT.so and gpubench_POINT (a library answers only its own tree's ABI,
# so each keeps its own gpubench), packed into OUT/bins.tar.xz. The libraries build with
# tests/gpu/build_lib.sh (the project's nvcc: no GPU needed, about five minutes each on two
# cores), so that the GPU machine builds nothing.
#   bash bench/libab_points.sh OUT BASE POINT...
# then on the GPU machine, carrying OUT:
#   RANDOM_GB=16 RUNS="llama2-7B:decode_b1_i128_o128" bash bench/libab.sh OUT OUTDIR
#   GPUBENCH_FLAGS="-quantization fp8" RANDOM_GB=20 RUNS="llama3.1-8B:decode_b1_i128_o128" \
#     bash bench/libab.sh OUT OUTDIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$1 base=$2
shift 2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin"
build() { # COMMIT SUFFIX
  local tree=$stage/tree-$1
  mkdir -p "$tree"
  git -C "$root" archive "$1" | tar x -C "$tree"
  (cd "$tree" && go build -trimpath -ldflags=-s -o "$stage/bin/gpubench$2" ./bench/gpubench)
  JOBS=${JOBS:-$(nproc)} bash "$root/tests/gpu/build_lib.sh" "$stage/bin/libgollm_cuda$2.so" "$tree/cuda"
  rm -rf "$tree"
}
build "$base" ""
for p in "$@"; do build "$p" "_$p"; done
mkdir -p "$out"
(cd "$stage/bin" && XZ_OPT=-6 tar cJf "$(cd "$out" && pwd)/bins.tar.xz" .)
du -sh "$out/bins.tar.xz"
