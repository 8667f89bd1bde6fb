#!/usr/bin/env bash
# Where the time goes through tritonserver (issue 4), on the GPU machine, in one go:
#   bash bench/tritonbench/study.sh CARRY OUTDIR
# CARRY holds tritonserver.tar.xz (as tests/gpu/README.md says) and bins.tar.xz:
# new/libtriton_gollm.so, old/libtriton_gollm.so (the backend before, for the same-run
# baseline), libgollm_cuda.so, tritonbench, gpubench. It makes a random GPT-2 124M fp16
# checkpoint with transformers, runs gpubench (engine alone), then one tritonserver with
# two KIND_GPU models, s1 (response_senders 1) and s4 (the default, 4), under
# GOLLM_CPU_PROFILE and GOLLM_ITER_TRACE, and tritonbench against them (a new stream per
# request, or streams opened before the clock; streaming or one response per request),
# then the old backend with the same client. Results go to OUTDIR/results.jsonl; the
# trace summaries are printed last.
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/gpu/env.sh"
w=/tmp/gollm-study
rm -rf "$w" && mkdir -p "$w/srv" "$w/bin" "$w/new/gollm" "$w/old/gollm" "$w/repo" "$w/oldrepo"
tar xJf "$carry/tritonserver.tar.xz" -C "$w/srv"
tar xJf "$carry/bins.tar.xz" -C "$w/bin"
cp "$w/bin/new/libtriton_gollm.so" "$w/bin/libgollm_cuda.so" "$w/new/gollm/"
cp "$w/bin/old/libtriton_gollm.so" "$w/bin/libgollm_cuda.so" "$w/old/gollm/"
ck=$w/gpt2-124M
python3 - "$ck" <<'PY'
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)).eval()
m.to(torch.float16).save_pretrained(sys.argv[1], safe_serialization=True)
PY
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
"$w/bin/gpubench" -ckpt "$ck" -model gpt2-124M -lib "$w/bin/libgollm_cuda.so" \
  -workloads tput_b64_i128_o128,decode_b1_i128_o128 -reps 5 | tee "$out/gpubench.jsonl"
model() { # name senders repo
  mkdir -p "$3/$1/1"
  sed -e 's/kind: KIND_CPU/kind: KIND_GPU/' -e "s|^name: \"gpt2\"|name: \"$1\"|" \
      -e 's|"kv_cache_free_gpu_mem_fraction" value: { string_value: "0.9" }|"kv_cache_free_gpu_mem_fraction" value: { string_value: "0.05" }|' \
      -e "s|^# parameters { key: \"gpt_model_path\" value: { string_value: \"\" } }|parameters { key: \"gpt_model_path\" value: { string_value: \"$ck\" } }|" \
      "$root/model_repository/gpt2/config.pbtxt" > "$3/$1/config.pbtxt"
  [ -n "$2" ] && echo "parameters { key: \"response_senders\" value: { string_value: \"$2\" } }" >> "$3/$1/config.pbtxt"
}
model s1 1 "$w/repo"; model s4 "" "$w/repo"; model old "" "$w/oldrepo"
serve() { # backends repo log
  "$w/srv/pytriton/tritonserver/bin/tritonserver" --model-repository="$2" --backend-directory="$1" \
    --grpc-port=8001 --http-port=8000 --metrics-port=8002 > "$3" 2>&1 &
  pid=$! log=$3
}
tb() { # a dead server ends the study rather than each call waiting for it
  kill -0 $pid 2>/dev/null || { echo "tritonserver exited"; tail -20 "$log"; exit 1; }
  "$w/bin/tritonbench" -addr 127.0.0.1:8001 -name gpt2-124M -reps 5 -wait 90s "$@" | tee -a "$out/results.jsonl"
}
T=tput_b64_i128_o128
GOLLM_CPU_PROFILE=$out/cpu.prof GOLLM_ITER_TRACE=$w/trace serve "$w/new" "$w/repo" "$out/tritonserver.log"
for m in s4 s1; do
  echo "== $m"; tb -model $m -workloads $T; tb -model $m -workloads $T -preopen
done
echo "== s4 non-streaming, decode, again"; tb -model s4 -workloads $T -preopen -streaming=false
tb -model s4 -workloads decode_b1_i128_o128 -preopen; tb -model s4 -workloads $T -preopen; tb -model s4 -workloads $T
kill -INT $pid; wait $pid
serve "$w/old" "$w/oldrepo" "$out/tritonserver-old.log"
echo "== old backend"; tb -model old -workloads $T; tb -model old -workloads $T -preopen
kill -INT $pid; wait $pid
grep -iE "error|panic" "$out/tritonserver.log" "$out/tritonserver-old.log" | grep -v -i "nvml\|dcgm" | head
cat "$w"/trace.* > "$out/traces.txt"
python3 "$root/bench/tritonbench/trace.py" "$w"/trace.*
