#!/usr/bin/env bash
# Prepares .carry/tpar/ (ignored by git) for tests/gpu/tpar_check.sh, here, without a GPU
# or nvcc (the check builds the library from cuda/ on the GPU machine): the bridge/cuda
# test binary (cudatest), gpubench and arbench, packed into bins.tar.xz with the commit.
#   bash tests/gpu/tpar_carry.sh [OUT, default .carry/tpar]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/tpar}
mkdir -p "$out"
rm -f "$out/bins.tar.xz"
go test -c -trimpath -o "$out/cudatest" ./bridge/cuda
go build -trimpath -ldflags=-s -o "$out/gpubench" ./bench/gpubench
go build -trimpath -ldflags=-s -o "$out/arbench" ./bench/arbench
git rev-parse --short HEAD > "$out/commit"
git status --porcelain -- cuda bridge bench tests/gpu | sed 's/^/dirty: /' >> "$out/commit"
(cd "$out" && XZ_OPT=-9 tar cJf bins.tar.xz --remove-files cudatest gpubench arbench commit)
du -sh "$out"/*
