#!/usr/bin/env bash
# What each kind of kernel costs in place (issue 17: where a step's time goes), on the
# GPU machine: gpubench with GOLLM_CUDA_SKIP set to one kind at a time (cuda/forward.cu's
# kSkip* bits: 1 QKV, 2 decode attention, 4 output projection, 8 MLP up, 16 MLP down,
# 32 the cuBLAS path's residual norms, 64 LM head, 128 sampling, 256 the QKV epilogue
# kernel (qkv_kv_write; with rotary qkv_rope_write), 512 the activation kernel (bias_act or
# gated_act) — the last two on the many-rows path), so that the difference
# from the whole step is that kind's cost inside the graph, overlap with its neighbours
# included — which ncu's serialized kernels do not show. The skipped steps compute wrong
# tokens; only their time is read.
#   bash bench/skipcost.sh CARRY OUTDIR
# CARRY holds gpubench and libgollm_cuda.so (loose or in bins.tar.xz), and optionally
# more libraries named libgollm_cuda_*.so, each run once with nothing skipped, alternating
# with the first. Rows go to OUTDIR/skipcost.jsonl, with "skip" and "lib" added.
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/device.sh"
device_unpack skipcost "$carry"
mkdir -p "$out"
write_checkpoint gpt2-124M tinyllama-1.1B gpt-350M
lim=${STAGE_S:-90}
# bench MODEL WORKLOADS LIB SKIP
bench() {
  GOLLM_CUDA_SKIP=$4 timeout "$lim" "$w/bin/gpubench" -ckpt "$w/$1" -model "$1" -lib "$w/bin/$3" \
    -workloads "$2" -reps 3 | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line); r["skip"] = int(sys.argv[1]); r["lib"] = sys.argv[2]
    print(json.dumps(r))' "$4" "$3" | tee -a "$out/skipcost.jsonl"
}
G2=decode_b1_i128_o128,tput_b64_i128_o128
for s in 0 1 2 4 8 16 32 64 128; do bench gpt2-124M $G2 libgollm_cuda.so $s; done
for s in 0 1 2 4 8 16 64; do bench tinyllama-1.1B decode_b1_i128_o128,tput_b64_i128_o128 libgollm_cuda.so $s; done
for s in 0 2; do bench gpt-350M decode_b1_i128_o128 libgollm_cuda.so $s; done
for lib in $(cd "$w/bin" && ls libgollm_cuda_*.so 2>/dev/null); do
  for round in 1 2; do
    for l in libgollm_cuda.so "$lib"; do
      bench gpt2-124M $G2 "$l" 0
      bench tinyllama-1.1B decode_b1_i128_o128 "$l" 0
      bench gpt-350M decode_b1_i128_o128 "$l" 0
    done
  done
done
python3 - "$out/skipcost.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {}
for r in rows:
    if r["skip"] == 0 and r["lib"] == "libgollm_cuda.so":
        base.setdefault((r["model"], r["workload"]), r["value"])
print("in place: model workload skip value delta(ms/step)")
for r in rows:
    if r["lib"] != "libgollm_cuda.so" or r["skip"] == 0:
        continue
    b = base[(r["model"], r["workload"])]
    if r["metric"] == "tokens_per_s":
        # ms per generated token of the batch ~ a step: 64 / tokens_per_s
        d = 64e3 / b - 64e3 / r["value"]
    else:
        d = b - r["value"]
    print(r["model"], r["workload"], r["skip"], round(r["value"], 4), round(d, 4))
PY
