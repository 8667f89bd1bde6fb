#!/usr/bin/env bash
# admission_window_us on the GPU machine (issue 18): the engine alone (gpubench) beside
# tritonserver with the window off and on, for the FasterTransformer table's GPT-350M
# latency rows and GPT-2 124M at batch 64, streams opened on the clock (so that they
# reach the server over milliseconds, as clients' do):
#   bash bench/tritonbench/admission.sh CARRY OUTDIR "0 1000 3000"
# CARRY holds tritonserver.tar.xz and libtriton_gollm.so, libgollm_cuda.so, tritonbench and
# gpubench (loose, or in bins.tar.xz). Rows go to OUTDIR/admission.jsonl (impl gollm-triton-wN for a
# window of N µs; gpubench's gollm-engine).
set -uo pipefail
carry=$1 out=$2 windows=${3:-"0 1000 3000"}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/bench/device.sh"
device_unpack admission "$carry"
mkdir -p "$out"
write_checkpoint gpt2-124M gpt-350M
G2=tput_b64_i128_o128 G350=lat_b1_i128_o8,lat_b8_i128_o8,lat_b64_i128_o8
"$w/bin/gpubench" -ckpt "$w/gpt2-124M" -model gpt2-124M -lib "$w/bin/libgollm_cuda.so" -workloads $G2 | tee -a "$out/admission.jsonl"
"$w/bin/gpubench" -ckpt "$w/gpt-350M" -model gpt-350M -lib "$w/bin/libgollm_cuda.so" -workloads $G350 | tee -a "$out/admission.jsonl"
# Models with a 64 × 1024-token KV pool.
for win in $windows; do
  gpt2_model "g2w$win" "$w/gpt2-124M" KIND_GPU max_tokens_in_paged_kv_cache 65536 admission_window_us "$win"
  gpt2_model "g350w$win" "$w/gpt-350M" KIND_GPU max_tokens_in_paged_kv_cache 65536 admission_window_us "$win"
done
triton_start "$out/tritonserver.log"
# Two rounds, the windows alternating within each.
for round in $(seq ${ROUNDS:-2}); do
  for win in $windows; do
    "$w/bin/tritonbench" -addr 127.0.0.1:8001 -model "g350w$win" -name gpt-350M -workloads $G350 -reps 5 \
      | sed "s/\"gollm-triton\"/\"gollm-triton-w$win\"/" | tee -a "$out/admission.jsonl"
    "$w/bin/tritonbench" -addr 127.0.0.1:8001 -model "g2w$win" -name gpt2-124M -workloads $G2 -reps 3 \
      | sed "s/\"gollm-triton\"/\"gollm-triton-w$win\"/" | tee -a "$out/admission.jsonl"
  done
done
triton_stop "$out/tritonserver.log"
