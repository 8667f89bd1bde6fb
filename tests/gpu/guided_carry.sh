#!/usr/bin/env bash
# Prepares .carry/guided (ignored by git) for tests/gpu/guided_gpu.sh, here on the build
# machine: the backend (make build; with GOLLM_CUDA=1 the CUDA engine too — else
# guided_gpu.sh takes $GOLLM_CUDA_LIB built there) and make demo for GPT-2's tokenizer.json, gpubench, gollm-openai, abload and the bridge/cuda test binary in
# bins.tar.xz, and tritonserver (tests/gpu/triton_carry.sh) unless carried already.
#   bash tests/gpu/guided_carry.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
GOLLM_CUDA=${GOLLM_CUDA:-0} make --no-print-directory build demo
c=.carry/guided
mkdir -p "$c/bins"
cp build/install/backends/gollm/libtriton_gollm.so model_repository/gpt2/1/tokenizer.json "$c/bins/"
[ "${GOLLM_CUDA:-0}" = 0 ] || cp build/install/backends/gollm/libgollm_cuda.so "$c/bins/"
go build -trimpath -ldflags=-s -o "$c/bins/gpubench" ./bench/gpubench
go build -trimpath -ldflags=-s -o "$c/bins/gollm-openai" ./cmd/gollm-openai
go build -trimpath -ldflags=-s -o "$c/bins/abload" ./bench/openai/abload
go test -c -trimpath -o "$c/bins/cudatest" ./bridge/cuda
tar cJf "$c/bins.tar.xz" -C "$c/bins" .
rm -rf "$c/bins"
[ -f "$c/tritonserver.tar.xz" ] || bash tests/gpu/triton_carry.sh "$c/tritonserver.tar.xz"
du -sh "$c"/*
