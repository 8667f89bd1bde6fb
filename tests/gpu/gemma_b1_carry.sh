#!/usr/bin/env bash
# Prepares OUT (default .carry/gemmab1, ignored by git) for tests/gpu/gemma_b1_check.sh,
# here on the build machine (no GPU or nvcc needed; a minute or two): the test binary of
# bridge/cuda, gpubench and the commit, packed into OUT/bins.tar.xz, and the base
# commit's cuda/ (BASE, default c46cd65) in OUT/base_cuda for tests/gpu/build_lib.sh.
#   bash tests/gpu/gemma_b1_carry.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/gemmab1}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
go test -c -trimpath -o "$stage/cudatest" ./bridge/cuda
go build -trimpath -ldflags=-s -o "$stage/gpubench" ./bench/gpubench
echo "$(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge bench | grep -q . && echo ' (dirty)')" > "$stage/commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && XZ_OPT=-6 tar cJf "$out/bins.tar.xz" cudatest gpubench commit)
rm -rf "$out/base_cuda" && mkdir -p "$out/base_cuda"
git archive "${BASE:-c46cd65}" cuda | tar x -C "$out/base_cuda" --strip-components=1
cat "$stage/commit"
du -sh "$out/bins.tar.xz"
