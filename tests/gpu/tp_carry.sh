#!/usr/bin/env bash
# Prepares .carry/tp/ (ignored by git) for tests/gpu/tp_check.sh, here, on the build
# machine (no GPU needed, about a minute): libgollm_cuda.so for sm_90 (H100, H200), the
# bridge/cuda test binary (cudatest: the TestGPU* tests, TestGPUTensorParallel* among
# them), gpubench, and for tp_check.sh's triton stage tritonbench and the backend
# (build/install/backends/gollm/libtriton_gollm.so, from `make build`, when built).
# With "pack" the binaries go into OUT/bins.tar.xz (about a third of their size); put the
# slim tritonserver.tar.xz beside it by hand.
#   bash tests/gpu/tp_carry.sh [OUT, default .carry/tp] [pack]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${1:-.carry/tp}
mkdir -p "$out"
NV=${GOLLM_CUDA_HOME:-.deps/cuda/nvidia/cu13}
"$NV/bin/nvcc" -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 --threads 0 \
  -Xcompiler=-fPIC,-fvisibility=hidden -shared -cudart static \
  -Xlinker=-rpath,'$ORIGIN',--exclude-libs,ALL -o "$out/libgollm_cuda.so" cuda/*.cu \
  -L"$NV/lib" -Xlinker="$NV/lib/libcublas.so.13" -Xlinker="$NV/lib/libcublasLt.so.13" -ldl
go test -c -trimpath -o "$out/cudatest" ./bridge/cuda
go build -trimpath -ldflags=-s -o "$out/gpubench" ./bench/gpubench
go build -trimpath -ldflags=-s -o "$out/tritonbench" ./bench/tritonbench
backend=build/install/backends/gollm/libtriton_gollm.so
if [ -f "$backend" ]; then cp "$backend" "$out/"; fi
git rev-parse --short HEAD > "$out/commit"
git status --porcelain -- cuda bridge bench tests/gpu | sed 's/^/dirty: /' >> "$out/commit"
if [ "${2:-}" = pack ]; then
  (cd "$out" && XZ_OPT=-9 tar cJf bins.tar.xz --remove-files libgollm_cuda.so cudatest gpubench tritonbench commit \
    $(ls libtriton_gollm.so 2> /dev/null))
fi
du -sh "$out"/*
