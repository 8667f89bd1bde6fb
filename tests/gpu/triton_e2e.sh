#!/usr/bin/env bash
# End to end on the GPU machine: tritonserver (from the nvidia-pytriton wheel, carried as
# .carry/tritonserver.tar.xz) serving a KIND_GPU instance of gollm answers streaming
# requests with the same tokens as the engine alone (or parting from them only at a
# near-tie, by check.py's rule and its gaps file), then the same workloads as gpubench
# through it (impl gollm-triton), for GPT-2 124M and the TinyLlama-1.1B shape. Run after
# tests/gpu/check.py (at least --only gpt2-124M,tinyllama-1.1B --dtypes float16), whose
# checkpoints, prompts and engine tokens it reuses:
#   bash tests/gpu/triton_e2e.sh .carry OUTDIR [BINDIR]
# BINDIR (default .carry) holds libtriton_gollm.so, libgollm_cuda.so and tritonbench.
set -uo pipefail
carry=$1 out=$2 bin=${3:-$1}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/bench/device.sh"
device_unpack e2e "$carry"
cp "$bin/libtriton_gollm.so" "$bin/libgollm_cuda.so" "$w/backends/gollm/"
ckpt=/tmp/gollm-gpucheck/gpt2-124M/f16
# Each model a fifth of the free memory for its KV pool: with the default 0.9 the model
# loaded first takes nearly all of it, and the GPT-350M batch-64 run then queued for
# blocks (112 of them; 45 ms instead of 29).
share="kv_cache_free_gpu_mem_fraction 0.2"
gpt2_model gpt2gpu "$ckpt" KIND_GPU $share
llama=/tmp/gollm-gpucheck/tinyllama-1.1B/f16
[ -d "$llama" ] && gpt2_model tinyllama "$llama" KIND_GPU $share
# The FasterTransformer table's GPT-350M shape, if bench/gpu_peers.py has written it.
big=/tmp/gollm-bench/gpt-350M
[ -d "$big" ] && gpt2_model gpt350 "$big" KIND_GPU $share
triton_start "$out/tritonserver.log" || exit 1
rc=0
"$bin/tritonbench" -addr 127.0.0.1:8001 -model gpt2gpu -check /tmp/gollm-gpucheck/prompts-50257.json \
  -expect /tmp/gollm-gpucheck/gpt2-124M-float16.safetensors -gaps /tmp/gollm-gpucheck/gpt2-124M-float16.gaps.json || rc=1
"$bin/tritonbench" -addr 127.0.0.1:8001 -model gpt2gpu -name gpt2-124M \
  -workloads decode_b1_i128_o128,tput_b64_i128_o128 | tee "$out/triton.jsonl" || rc=1
if [ -d "$llama" ]; then
  "$bin/tritonbench" -addr 127.0.0.1:8001 -model tinyllama -vocab 32000 -check /tmp/gollm-gpucheck/prompts-32000.json \
    -expect /tmp/gollm-gpucheck/tinyllama-1.1B-float16.safetensors \
    -gaps /tmp/gollm-gpucheck/tinyllama-1.1B-float16.gaps.json || rc=1
  "$bin/tritonbench" -addr 127.0.0.1:8001 -model tinyllama -vocab 32000 -name tinyllama-1.1B \
    -workloads decode_b1_i128_o128,tput_b64_i128_o128 | tee -a "$out/triton.jsonl" || rc=1
fi
if [ -d "$big" ]; then
  "$bin/tritonbench" -addr 127.0.0.1:8001 -model gpt350 -name gpt-350M \
    -workloads lat_b1_i128_o8,lat_b8_i128_o8,lat_b64_i128_o8,lat_b1_i512_o32,lat_b16_i512_o32 \
    | tee -a "$out/triton.jsonl" || rc=1
fi
triton_stop "$out/tritonserver.log"
grep -iE "gpu engine|instance ready" "$out/tritonserver.log" | head -20
exit $rc
