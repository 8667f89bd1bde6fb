#!/usr/bin/env bash
# Builds libgollm_cuda.so from a checkout's cuda/ (on the GPU machine, or here with the
# project's nvcc), one nvcc per source file on every core at once (the longest,
# forward.cu, first), for sm_90 (H100/H200):
#   bash tests/gpu/build_lib.sh OUT.so [SRC_DIR]
# JOBS (default every core) bounds the nvcc processes, for two builds side by side.
# Sourced env.sh first puts cuBLAS 13 on the loader's path; the library links that one and
# cuBLASLt beside it.
set -uo pipefail
out=$(realpath -m "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
src=${2:-$root/cuda}
source "$root/tests/gpu/env.sh" > /dev/null
# Here, or where no toolkit is installed: the project's own (scripts/deps.sh's .deps/cuda,
# the CUDA 13 wheels), which builds the same library for sm_90 without a GPU.
wheels=$root/.deps/cuda/nvidia/cu13
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc "$wheels/bin/nvcc" 2> /dev/null | head -1)
cublas=$(ls "${cublas_dir:-/nonexistent}/libcublas.so.13" /usr/local/cuda/lib64/libcublas.so.13 \
  /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13 "$wheels/lib/libcublas.so.13" 2> /dev/null | head -1)
# The wheels' nvcc keeps its static runtime in ../lib, where it does not look by itself.
link=()
[ -f "$(dirname "$nvcc")/../lib/libcudart_static.a" ] && link=(-L"$(dirname "$nvcc")/../lib")
[ -n "$nvcc" ] && [ -n "$cublas" ] || { echo "FAIL: nvcc ($nvcc) or libcublas.so.13 ($cublas) not found"; exit 1; }
[ -f "${cublas%/*}/libcublasLt.so.13" ] || { echo "FAIL: libcublasLt.so.13 not beside $cublas"; exit 1; }
export NVCC=$nvcc FLAGS="-std=c++17 -O3 ${GOLLM_NVCC_EXTRA:-} -gencode=arch=compute_90,code=sm_90 -Xcompiler=-fPIC,-fvisibility=hidden"
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT
t0=$SECONDS
# shellcheck disable=SC2016
ls "$src"/forward.cu "$src"/*.cu | awk '!seen[$0]++' |
  xargs -P "${JOBS:-$(nproc)}" -I{} bash -c '$NVCC $FLAGS -c "$1" -o "$2/$(basename "$1" .cu).o"' _ {} "$obj" ||
  { echo "FAIL: build of $src"; exit 1; }
mkdir -p "$(dirname "$out")"
# shellcheck disable=SC2086
$NVCC $FLAGS -shared -cudart static ${link[@]+"${link[@]}"} -Xlinker=-rpath,'$ORIGIN',--exclude-libs,ALL \
  -o "$out" "$obj"/*.o -Xlinker="$cublas" -Xlinker="${cublas%/*}/libcublasLt.so.13" -ldl || { echo "FAIL: link $out"; exit 1; }
echo "built $out in $((SECONDS - t0)) s"
