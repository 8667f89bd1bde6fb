#!/usr/bin/env bash
# Prepares .carry/spec (ignored by git) for tests/gpu/spec_check.sh, here on the build
# machine: the CUDA engine (GOLLM_CUDA=1 make build), the bridge/cuda test binary and the
# speculation benchmark.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
GOLLM_CUDA=1 make --no-print-directory build
mkdir -p .carry/spec
cp build/install/backends/gollm/libgollm_cuda.so .carry/spec/
go test -c -trimpath -o .carry/spec/cudatest ./bridge/cuda
go build -trimpath -ldflags=-s -o .carry/spec/specbench ./bench/specbench
du -sh .carry/spec/*
