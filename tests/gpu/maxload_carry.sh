#!/usr/bin/env bash
# Prepares OUT (default .carry/maxload, ignored by git) for tests/gpu/maxload_check.sh,
# here on the build machine (no GPU or nvcc needed; a minute or two): the Go binaries the
# GPU machine lacks — the bridge/cuda test binary (cudatest), gpubench, tritonbench and
# the backend (libtriton_gollm.so, `GOLLM_CUDA=0 make build`) — and the commit, packed into
# OUT/bins.tar.xz, and beside it tritonserver.tar.xz: .carry/triton's when there is one,
# else made by tests/gpu/triton_carry.sh (two minutes of xz). libgollm_cuda.so is built on
# the GPU machine from the tree's cuda/ (maxload_check.sh). About 50 MB in all.
#   bash tests/gpu/maxload_carry.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/maxload}
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
GOLLM_CUDA=0 make --no-print-directory build > "$stage/build.log" 2>&1 || { tail -20 "$stage/build.log"; exit 1; }
cp build/install/backends/gollm/libtriton_gollm.so "$stage/"
go test -c -trimpath -o "$stage/cudatest" ./bridge/cuda
go build -trimpath -ldflags=-s -o "$stage/gpubench" ./bench/gpubench
go build -trimpath -ldflags=-s -o "$stage/tritonbench" ./bench/tritonbench
{
  git rev-parse --short HEAD
  git status --porcelain -- cuda bridge bench backend batchmanager engine tests/gpu | sed 's/^/dirty: /'
} > "$stage/commit"
(cd "$stage" && XZ_OPT=-9 tar cJf "$out/bins.tar.xz" cudatest gpubench tritonbench libtriton_gollm.so commit)
if [ ! -f "$out/tritonserver.tar.xz" ]; then
  if [ -f .carry/triton/tritonserver.tar.xz ]; then
    cp .carry/triton/tritonserver.tar.xz "$out/"
  else
    bash tests/gpu/triton_carry.sh "$out/tritonserver.tar.xz"
  fi
fi
cat "$stage/commit"
du -sh "$out"/*
