#!/usr/bin/env bash
# The overlap schedule on the GPU machine (issue 18), in one lease:
#   bash bench/overlap.sh CARRY OUTDIR
# CARRY holds bins.tar.xz (libgollm_cuda.so, libtriton_gollm.so, gpubench, tritonbench,
# gollm-gpucheck and cudatest, the bridge/cuda test binary) and tritonserver.tar.xz. First the GPU Go tests
# (a launched step fed on the GPU gives Step's tokens; the batch manager's tokens with
# and without the schedule; beams against transformers), then GPT-2 124M with and without
# -overlap, alternating (gpubench: the engine's decode at batch 1, its batch-64 throughput,
# and batch 64 through the batch manager), then through tritonserver with
# overlap_scheduler false and true, alternating; last tests/gpu/check.py on GPT-2 and
# TinyLlama in float16 (the steps' new launch-and-wait path against transformers). Rows go
# to OUTDIR/overlap.jsonl; each stage is bounded by STAGE_S seconds (default 90).
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/device.sh"
device_unpack overlap "$carry"
mkdir -p "$out"
lim=${STAGE_S:-90}
echo "== GPU Go tests"
(cd "$root/bridge/cuda" && GOLLM_CUDA_LIB="$w/bin/libgollm_cuda.so" timeout "$lim" "$w/bin/cudatest" -test.run 'TestGPU' -test.v 2>&1 | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|_test.go' | tee "$out/gputests.txt")
write_checkpoint gpt2-124M
echo "== gpubench"
G=decode_b1_i128_o128,tput_b64_i128_o128,serve_b64_i128_o128
for round in 1 2; do
  for ov in false true; do
    timeout "$lim" "$w/bin/gpubench" -ckpt "$w/gpt2-124M" -model gpt2-124M -lib "$w/bin/libgollm_cuda.so" \
      -workloads $G -overlap=$ov | tee -a "$out/overlap.jsonl"
  done
done
echo "== through tritonserver"
gpt2_model g2off "$w/gpt2-124M" KIND_GPU max_tokens_in_paged_kv_cache 65536 overlap_scheduler false
gpt2_model g2on "$w/gpt2-124M" KIND_GPU max_tokens_in_paged_kv_cache 65536 overlap_scheduler true
triton_start "$out/tritonserver.log"
for round in 1 2; do
  for m in g2off g2on; do
    timeout "$lim" "$w/bin/tritonbench" -addr 127.0.0.1:8001 -model $m -name gpt2-124M \
      -workloads tput_b64_i128_o128,decode_b1_i128_o128 -reps 3 \
      | sed "s/\"gollm-triton\"/\"gollm-triton-$m\"/" | tee -a "$out/overlap.jsonl"
  done
done
triton_stop "$out/tritonserver.log"
echo "== check.py"
timeout "$lim" python3 "$root/tests/gpu/check.py" --bin "$w/bin/gollm-gpucheck" --lib "$w/bin/libgollm_cuda.so" \
  --only gpt2-124M,tinyllama-1.1B --dtypes float16 --json "$out/check.json" 2>&1 | tail -15 | tee "$out/check.txt"
