#!/usr/bin/env bash
# Prepares OUT (default .carry/spec, ignored by git) for tests/gpu/spec_check.sh, here on
# the build machine (no GPU or nvcc needed; a minute or two): the bridge/cuda test binary
# and the speculation benchmark, with the commit, packed into OUT/bins.tar.xz. The library
# itself is built on the GPU machine from cuda/ (the checkout travels), or taken from
# PREBUILT_LIB there.
#   bash tests/gpu/spec_carry.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/spec}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
go test -c -trimpath -o "$stage/cudatest" ./bridge/cuda
go build -trimpath -ldflags=-s -o "$stage/specbench" ./bench/specbench
echo "$(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge batchmanager speculate engine bench | grep -q . && echo ' (dirty)')" > "$stage/commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/cudatest "$out"/specbench "$out"/libgollm_cuda.so
(cd "$stage" && XZ_OPT=-6 tar cJf "$out/bins.tar.xz" cudatest specbench commit)
cat "$stage/commit"
du -sh "$out/bins.tar.xz"
