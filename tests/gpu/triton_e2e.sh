#!/usr/bin/env bash
# End to end on the GPU machine: tritonserver (from the nvidia-pytriton wheel, carried as
# .carry/tritonserver.tar.xz) serving a KIND_GPU instance of gollm answers streaming
# requests with the same tokens as the engine alone, then the same workloads as gpubench
# through it (impl gollm-triton). Run after tests/gpu/check.py, whose checkpoint, prompts
# and engine tokens it reuses:
#   bash tests/gpu/triton_e2e.sh .carry OUTDIR
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/gpu/env.sh"
work=/tmp/gollm-e2e
rm -rf "$work" && mkdir -p "$work/srv" "$work/backends/gollm" "$work/repo/gpt2gpu/1"
tar xJf "$carry/tritonserver.tar.xz" -C "$work/srv"
cp "$carry/libtriton_gollm.so" "$carry/libgollm_cuda.so" "$work/backends/gollm/"
ckpt=/tmp/gollm-gpucheck/gpt2-124M/f16
sed -e 's/kind: KIND_CPU/kind: KIND_GPU/' -e 's|^name: "gpt2"|name: "gpt2gpu"|' \
    -e "s|^# parameters { key: \"gpt_model_path\" value: { string_value: \"\" } }|parameters { key: \"gpt_model_path\" value: { string_value: \"$ckpt\" } }|" \
    "$root/model_repository/gpt2/config.pbtxt" > "$work/repo/gpt2gpu/config.pbtxt"
grep -E "KIND_GPU|gpt_model_path\"" "$work/repo/gpt2gpu/config.pbtxt"
"$work/srv/pytriton/tritonserver/bin/tritonserver" --model-repository="$work/repo" \
  --backend-directory="$work/backends" --grpc-port=8001 --http-port=8000 --metrics-port=8002 \
  > "$out/tritonserver.log" 2>&1 &
pid=$!
rc=0
"$carry/tritonbench" -addr 127.0.0.1:8001 -model gpt2gpu -check /tmp/gollm-gpucheck/prompts-50257.json \
  -expect /tmp/gollm-gpucheck/gpt2-124M-float16.safetensors || rc=1
"$carry/tritonbench" -addr 127.0.0.1:8001 -model gpt2gpu -name gpt2-124M \
  -workloads decode_b1_i128_o128,tput_b64_i128_o128 | tee "$out/triton.jsonl" || rc=1
kill $pid; wait $pid
grep -iE "error|gpu engine|instance ready" "$out/tritonserver.log" | head -20
exit $rc
