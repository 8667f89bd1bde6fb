#!/usr/bin/env bash
# Prepares OUT (default .carry/fp8, ignored by git) for tests/gpu/fp8_check.sh, here on the
# build machine (no GPU or nvcc needed; a minute or two): the test binaries of
# bridge/cuda (the GPU Go tests: TestGPUFP8…, TestGPUQuantizeFP8MatchesCPU, the dense
# families' as a regression) and demo/austen (the FP8 perplexity on the GPU), gpubench and
# gollm-gpucheck, and the commit, packed into OUT/bins.tar.xz. The library itself is built
# on the GPU machine from cuda/ (the checkout travels); with BASE=<commit>, that commit's
# cuda/ goes to OUT/base/cuda too, for the A/B's BASE_LIB (fp8_check.sh's step 5):
#   bash tests/gpu/build_lib.sh OUT/base.so OUT/base/cuda   (on the GPU machine)
#   [BASE=<commit>] bash tests/gpu/fp8_carry.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/fp8}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
go test -c -trimpath -o "$stage/cudatest" ./bridge/cuda
go test -c -trimpath -o "$stage/austentest" ./demo/austen
go build -trimpath -ldflags=-s -o "$stage/gpubench" ./bench/gpubench
go build -trimpath -ldflags=-s -o "$stage/gollm-gpucheck" ./cmd/gollm-gpucheck
echo "$(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge model engine bench cmd | grep -q . && echo ' (dirty)')" > "$stage/commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && XZ_OPT=-6 tar cJf "$out/bins.tar.xz" cudatest austentest gpubench gollm-gpucheck commit)
if [ -n "${BASE:-}" ]; then
  rm -rf "$out/base"
  mkdir -p "$out/base"
  git archive "$BASE" cuda | tar x -C "$out/base"
  echo "base $(git rev-parse --short "$BASE") in $out/base/cuda"
fi
cat "$stage/commit"
du -sh "$out/bins.tar.xz"
