#!/usr/bin/env bash
# admission_window_us on the GPU machine (issue 18): the engine alone (gpubench) beside
# tritonserver with the window off and on, for the FasterTransformer table's GPT-350M
# latency rows and GPT-2 124M at batch 64, streams opened on the clock (so that they
# reach the server over milliseconds, as clients' do):
#   bash bench/tritonbench/admission.sh CARRY OUTDIR "0 1000 3000"
# CARRY holds tritonserver.tar.xz and the binaries libtriton_gollm.so, libgollm_cuda.so,
# tritonbench and gpubench. Rows go to OUTDIR/admission.jsonl (impl gollm-triton-wN for a
# window of N µs; gpubench's gollm-engine).
set -uo pipefail
carry=$1 out=$2 windows=${3:-"0 1000 3000"}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/gpu/env.sh"
w=/tmp/gollm-admission
rm -rf "$w" && mkdir -p "$w/srv" "$w/backends/gollm" "$w/repo" "$out"
tar xJf "$carry/tritonserver.tar.xz" -C "$w/srv"
cp "$carry/libtriton_gollm.so" "$carry/libgollm_cuda.so" "$w/backends/gollm/"
python3 - "$w" <<'PY'
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
for name, c in {"gpt2-124M": GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
                "gpt-350M": GPT2Config(vocab_size=51200, n_positions=1024, n_embd=1024, n_layer=24, n_head=16)}.items():
    with torch.device("cuda"):
        m = GPT2LMHeadModel(c).half().eval()
    m.save_pretrained(f"{sys.argv[1]}/{name}", safe_serialization=True)
PY
G2=tput_b64_i128_o128 G350=lat_b1_i128_o8,lat_b8_i128_o8,lat_b64_i128_o8
"$carry/gpubench" -ckpt "$w/gpt2-124M" -model gpt2-124M -lib "$carry/libgollm_cuda.so" -workloads $G2 | tee -a "$out/admission.jsonl"
"$carry/gpubench" -ckpt "$w/gpt-350M" -model gpt-350M -lib "$carry/libgollm_cuda.so" -workloads $G350 | tee -a "$out/admission.jsonl"
# model NAME CHECKPOINT WINDOW: a KIND_GPU model with a 64 × 1024-token KV pool.
model() {
  mkdir -p "$w/repo/$1/1"
  sed -e 's/kind: KIND_CPU/kind: KIND_GPU/' -e "s|^name: \"gpt2\"|name: \"$1\"|" \
      -e "s|^# parameters { key: \"gpt_model_path\" value: { string_value: \"\" } }|parameters { key: \"gpt_model_path\" value: { string_value: \"$2\" } }|" \
      "$root/model_repository/gpt2/config.pbtxt" > "$w/repo/$1/config.pbtxt"
  printf 'parameters { key: "max_tokens_in_paged_kv_cache" value: { string_value: "65536" } }\nparameters { key: "admission_window_us" value: { string_value: "%s" } }\n' "$3" >> "$w/repo/$1/config.pbtxt"
}
for win in $windows; do model "g2w$win" "$w/gpt2-124M" "$win"; model "g350w$win" "$w/gpt-350M" "$win"; done
"$w/srv/pytriton/tritonserver/bin/tritonserver" --model-repository="$w/repo" --backend-directory="$w/backends" \
  --grpc-port=8001 --http-port=8000 --metrics-port=8002 > "$out/tritonserver.log" 2>&1 &
pid=$!
# Two rounds, the windows alternating within each.
for round in $(seq ${ROUNDS:-2}); do
  for win in $windows; do
    "$carry/tritonbench" -addr 127.0.0.1:8001 -model "g350w$win" -name gpt-350M -workloads $G350 -reps 5 \
      | sed "s/\"gollm-triton\"/\"gollm-triton-w$win\"/" | tee -a "$out/admission.jsonl"
    "$carry/tritonbench" -addr 127.0.0.1:8001 -model "g2w$win" -name gpt2-124M -workloads $G2 -reps 3 \
      | sed "s/\"gollm-triton\"/\"gollm-triton-w$win\"/" | tee -a "$out/admission.jsonl"
  done
done
kill -INT $pid; wait $pid
grep -iE "error|panic" "$out/tritonserver.log" | head -5
