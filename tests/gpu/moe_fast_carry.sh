#!/usr/bin/env bash
# Prepares OUT (default .carry/moefast, ignored by git) for tests/gpu/moe_fast_check.sh,
# here on the build machine (no GPU or nvcc needed; a minute or two): the bridge/cuda test
# binary (the mixture-of-experts GPU tests), gpubench and gollm-gpucheck of this tree, and
# the commit, packed into OUT/bins.tar.xz. The libraries (this tree's and the base's) are
# built separately (tests/gpu/build_lib.sh) and passed to the check; the ABI is the base's,
# so one gpubench drives both.
#   bash tests/gpu/moe_fast_carry.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/moefast}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
go test -c -trimpath -o "$stage/cudatest" ./bridge/cuda
go build -trimpath -ldflags=-s -o "$stage/gpubench" ./bench/gpubench
go build -trimpath -ldflags=-s -o "$stage/gollm-gpucheck" ./cmd/gollm-gpucheck
echo "$(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge model engine bench cmd | grep -q . && echo ' (dirty)')" > "$stage/commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && XZ_OPT=-6 tar cJf "$out/bins.tar.xz" cudatest gpubench gollm-gpucheck commit)
cat "$stage/commit"
du -sh "$out/bins.tar.xz"
