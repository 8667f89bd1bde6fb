#!/usr/bin/env bash
# Prepares OUT (default .carry/blaslt, ignored by git) for tests/gpu/blaslt_check.sh, here on
# the build machine (no GPU or nvcc needed; a minute or two): the test binary of
# bridge/cuda (the GPU Go tests of the Blas path), gpubench of this tree and gpubench of
# BASE (default c46cd65, the commit before cuBLASLt: its ABI is 14, so a library of that
# commit needs its own gpubench) with BASE's cuda/ (base_cuda), and the commit, packed into
# OUT/bins.tar.xz. The libraries are built on the GPU machine, a call before the check:
#   bash tests/gpu/build_lib.sh /tmp/gollm-blaslt-libs/new.so
#   mkdir -p /tmp/gollm-blaslt-libs && tar xJf OUT/bins.tar.xz -C /tmp/gollm-blaslt-libs base_cuda
#   bash tests/gpu/build_lib.sh /tmp/gollm-blaslt-libs/base.so /tmp/gollm-blaslt-libs/base_cuda
# and named by PREBUILT_LIB / BASE_LIB for tests/gpu/blaslt_check.sh.
#   bash tests/gpu/blaslt_carry.sh [OUT] [BASE]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/blaslt}
base=${2:-c46cd65}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
go test -c -trimpath -o "$stage/cudatest" ./bridge/cuda
go build -trimpath -ldflags=-s -o "$stage/gpubench" ./bench/gpubench
mkdir "$stage/base"
git archive "$base" | tar x -C "$stage/base"
(cd "$stage/base" && go build -trimpath -ldflags=-s -o "$stage/gpubench_base" ./bench/gpubench)
mv "$stage/base/cuda" "$stage/base_cuda"
rm -rf "$stage/base"
echo "$(git rev-parse --short HEAD)$(git status --porcelain -- cuda bridge bench | grep -q . && echo ' (dirty)')" > "$stage/commit"
git rev-parse --short "$base" > "$stage/base_commit"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && XZ_OPT=-6 tar cJf "$out/bins.tar.xz" cudatest gpubench gpubench_base base_cuda commit base_commit)
cat "$stage/commit"
du -sh "$out/bins.tar.xz"
