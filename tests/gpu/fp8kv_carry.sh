#!/usr/bin/env bash
# Prepares OUT (default .carry/fp8kv, ignored by git) for tests/gpu/fp8kv_check.sh, here on
# the build machine (no GPU or nvcc needed; a minute or two): the test binaries of
# bridge/cuda (TestGPUFP8KVCache… and the attention paths' GPU tests) and demo/austen (the
# FP8 KV cache's perplexity on the GPU), gpubench, and the commit, packed into
# OUT/bins.tar.xz. The library is built on the GPU machine from cuda/ (the checkout
# travels).
#   bash tests/gpu/fp8kv_carry.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/fp8kv}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
go test -c -trimpath -o "$stage/cudatest" ./bridge/cuda
go test -c -trimpath -o "$stage/austentest" ./demo/austen
go build -trimpath -ldflags=-s -o "$stage/gpubench" ./bench/gpubench
echo "$(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge engine bench demo | grep -q . && echo ' (dirty)')" > "$stage/commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && XZ_OPT=-6 tar cJf "$out/bins.tar.xz" cudatest austentest gpubench commit)
cat "$stage/commit"
du -sh "$out/bins.tar.xz"
