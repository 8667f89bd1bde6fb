#!/usr/bin/env bash
# What each stage of the recipe costs in place (issue 17: where a step's time goes), on
# the GPU machine: gpubench with GOLLM_CUDA_SKIP set to one stage kind at a time (bit
# 1 << gollm_stage_kind: 4 QKV, 16 the KV write's own kernel, 32 attention, 64 the output
# projection, 128 the MLP, 256 the residual adds with their norms, 512 the LM head and
# sampling), so that the difference from the whole step is that stage's cost inside the
# graph, overlap with its neighbours included — which ncu's serialized kernels do not show.
# The skipped steps compute wrong tokens; only their time is read. The library must be
# built with GOLLM_MEASURE (cmake -DGOLLM_MEASURE=ON, or nvcc -DGOLLM_MEASURE): others
# refuse a skip.
#   bash bench/skipcost.sh CARRY OUTDIR
# CARRY holds gpubench and libgollm_cuda.so (loose or in bins.tar.xz). Rows go to
# OUTDIR/skipcost.jsonl, with "skip" added. (Builds against each other: bench/libab.sh.)
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/device.sh"
device_unpack skipcost "$carry"
mkdir -p "$out"
write_checkpoint gpt2-124M tinyllama-1.1B gpt-350M
lim=${STAGE_S:-90}
# bench MODEL WORKLOADS SKIP
bench() {
  GOLLM_CUDA_SKIP=$3 timeout "$lim" "$w/bin/gpubench" -ckpt "$w/$1" -model "$1" \
    -lib "$w/bin/libgollm_cuda.so" -workloads "$2" -reps 3 | tag_rows skip "$3" |
    tee -a "$out/skipcost.jsonl"
}
W=decode_b1_i128_o128,tput_b64_i128_o128
for s in 0 4 16 32 64 128 256 512; do bench gpt2-124M $W $s; done
for s in 0 4 16 32 64 128 256 512; do bench tinyllama-1.1B $W $s; done
for s in 0 32; do bench gpt-350M decode_b1_i128_o128 $s; done
python3 - "$out/skipcost.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {}
for r in rows:
    if r["skip"] == 0:
        base.setdefault((r["model"], r["workload"]), r["value"])
print("in place: model workload skip value delta(ms/step)")
for r in rows:
    if r["skip"] == 0:
        continue
    b = base[(r["model"], r["workload"])]
    if r["metric"] == "tokens_per_s":
        # A step makes B tokens (the workload's batch): ms a step = 1e3 · B / tokens_per_s.
        B = int(r["workload"].split("_b")[1].split("_")[0])
        d = 1e3 * B / b - 1e3 * B / r["value"]
    else:
        d = b - r["value"]
    print(r["model"], r["workload"], r["skip"], round(r["value"], 4), round(d, 4))
PY
