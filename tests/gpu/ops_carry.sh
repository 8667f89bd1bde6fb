#!/usr/bin/env bash
# Prepares .carry/ (ignored by git) for tests/gpu/ops_check.sh, here, on the build
# machine: the backend and CUDA engine (GOLLM_CUDA=1 make build), the soak harness, and
# tritonserver with the libraries it links, from .deps/pytriton.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
GOLLM_CUDA=1 make --no-print-directory build
mkdir -p .carry
cp build/install/backends/gollm/libtriton_gollm.so build/install/backends/gollm/libgollm_cuda.so .carry/
go build -trimpath -ldflags=-s -o .carry/soak ./bench/soak
if [ ! -f .carry/tritonserver.tar.xz ]; then
  tar cJf .carry/tritonserver.tar.xz -C .deps/pytriton pytriton/tritonserver/bin nvidia_pytriton.libs
fi
du -sh .carry/*
