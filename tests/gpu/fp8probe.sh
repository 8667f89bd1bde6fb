#!/usr/bin/env bash
# Issue 34: which of cuBLASLt's block-scaled FP8 GEMMs the GPU machine's cuBLASLt 13 takes,
# and whether they compute gollm's projection, in one call (build about 30 s, run under a
# minute; no gollm library, no model):
#   bash tests/gpu/fp8probe.sh OUTDIR
# Builds bench/fp8probe/fp8probe.cu for sm_90 against the libcublasLt.so.13 that env.sh
# finds (the one libgollm_cuda.so links) and runs it:
#   part 1: cublasLtMatmulAlgoGetHeuristic over the Llama-3.1-8B projections and the tiny
#     fixtures' widths at 16…1,024 rows, for each operand assignment, transposes, scale
#     modes (VEC128_32F / BLK128x128_32F, SCALAR / OUTER_VEC as controls), D fp32 / bf16,
#     scale pointers set before the query or not: a line per combination with algorithms;
#   part 2: the TN combinations gollm could use (fp8lt.cuh's W=A BLK128 / x=B VEC128 in
#     fp32 and bf16, VEC128 weights, NVIDIA's sample's x=A order) run on random e4m3 data
#     with distinct random scales against a dequantized fp32 reference (relative L2 on
#     sampled rows), timed beside a bf16 cuBLASLt GEMM of the same shape;
#   verdict: per combination, how many shapes × row counts were right.
# SPEED=1 runs part 3 alone instead: the scale recipes (block, per-channel groups, outer
# vectors, per-tensor) timed at 1,024 and 8,192 rows (fp8probe-speed.tsv, .log).
# OUTDIR gets fp8probe.log (stdout), fp8probe-heuristic.tsv and fp8probe-gemm.tsv. Exits 1
# when either of fp8lt.cuh's combinations (weights as A in BLK128x128 or, per-channel, in
# VEC128; activations as B in VEC128; fp32 D) is refused or wrong anywhere.
set -uo pipefail
out=${1:?usage: fp8probe.sh OUTDIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$root/tests/gpu/env.sh"
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2> /dev/null)
lt=$(ls "${cublas_dir:-/nonexistent}/libcublasLt.so.13" /usr/local/cuda/lib64/libcublasLt.so.13 \
  /usr/local/cuda/targets/x86_64-linux/lib/libcublasLt.so.13 2> /dev/null | head -1)
[ -n "$nvcc" ] && [ -n "$lt" ] || { echo "FAIL: nvcc ($nvcc) or libcublasLt.so.13 ($lt) not found"; exit 1; }
bin=$(mktemp -d)/fp8probe
t0=$SECONDS
"$nvcc" -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 "$root/bench/fp8probe/fp8probe.cu" -o "$bin" \
  -L"$(dirname "$lt")" -Xlinker="$lt" -Xlinker=-rpath,"$(dirname "$lt")" || { echo "FAIL: build of fp8probe"; exit 1; }
echo "built fp8probe in $((SECONDS - t0)) s with $nvcc against $lt"
if [ "${SPEED:-0}" = 1 ]; then
  timeout 300 "$bin" "$out" --speed 2>&1 | tee "$out/fp8probe-speed.log"
  exit "${PIPESTATUS[0]}"
fi
timeout 150 "$bin" "$out" 2>&1 | tee "$out/fp8probe.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || { echo "FAIL: fp8probe exited $rc"; exit 1; }
fails=0
for combo in "W=A:BLK x=B:VEC fp32" "W=A:VEC x=B:VEC fp32"; do
  if grep -q "^$combo .*: \([0-9]*\)/\1 shapes" "$out/fp8probe.log"; then
    echo "PASS: $combo (fp8lt.cuh's) has algorithms and is right for every shape"
  else
    echo "FAIL: $combo (fp8lt.cuh's) is refused or wrong somewhere (see the verdict)"
    fails=$((fails + 1))
  fi
done
[ "$fails" = 0 ]
