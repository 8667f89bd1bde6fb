#!/usr/bin/env bash
# Prepares OUT (default .carry/ep, ignored by git) for tests/gpu/ep_check.sh, here on the
# build machine (no GPU or nvcc needed; a minute or two): the bridge/cuda test binary and
# gpubench of this tree, and the commit, packed into OUT/bins.tar.xz. The library is built
# there, from this tree's cuda/ (tests/gpu/build_lib.sh).
#   bash tests/gpu/ep_carry.sh [OUT]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/ep}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
go test -c -trimpath -o "$stage/cudatest" ./bridge/cuda
go build -trimpath -ldflags=-s -o "$stage/gpubench" ./bench/gpubench
echo "$(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge model engine bench | grep -q . && echo ' (dirty)')" > "$stage/commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && XZ_OPT=-6 tar cJf "$out/bins.tar.xz" cudatest gpubench commit)
cat "$stage/commit"
du -sh "$out/bins.tar.xz"
