#!/usr/bin/env bash
# Issue 37's dense targets in one device call (≤ 9 minutes): the Qwen3-8B and Gemma-3-4B
# (text) shapes with random bf16 weights, decode at batch 1 against the bandwidth floor
# and at batch 64 against transformers' static-cache generate, as bench/gpu_peers.py
# measures them (the engine alone: bench/gpubench, CUDA graphs; transformers only at
# batch 64, static cache only, three repetitions each).
#
#   bash bench/dense_peers.sh OUT [CARRY]
# CARRY holds gpubench and libgollm_cuda.so (built here: cmake -S . -B build
# -DGOLLM_CUDA=ON -DGOLLM_CUDA_ARCHS=90 && cmake --build build; go build -ldflags=-s -o
# CARRY/gpubench ./bench/gpubench; cp build/libgollm_cuda.so CARRY/). Without CARRY it takes
# what tests/gpu/recipe_ab.sh built on this machine (build/recipe-ab: the new tree's
# gpubench and library), so that it follows a recipe_ab.sh call on a warm machine.
# It writes $OUT/dense-peers.jsonl (BENCH.md's rows; also appended to bench/results/) and
# $OUT/dense-peers.log, whose last lines are the table and the targets' ratios:
#   Qwen3-8B  decode_b1 gollm / floor ≤ 1.15;  Gemma-3-4B decode_b1 gollm / floor ≤ 1.2;
#   both      tput_b64  gollm / hf-static  ≥ 3.
# Its phases print their elapsed seconds: the checkpoints (16 and 9 GB written), gpubench,
# transformers (a compile per model). MODELS narrows it (MODELS=gemma3-4B).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$1
if [ -n "${2:-}" ]; then
  gpubench=$(cd "$2" && pwd)/gpubench lib=$(cd "$2" && pwd)/libgollm_cuda.so
else
  gpubench=$root/build/recipe-ab/bin/new/gpubench lib=$root/build/recipe-ab/lib/libgollm_cuda_new.so
fi
[ -x "$gpubench" ] && [ -f "$lib" ] || { echo "FAIL: $gpubench or $lib missing"; exit 1; }
mkdir -p "$out"
source "$root/tests/gpu/env.sh"
python3 "$root/bench/gpu_peers.py" --gpubench "$gpubench" --lib "$lib" \
  --models "${MODELS:-qwen3-8B,gemma3-4B}" --skip-eager --graphs-only --reps 3 \
  --hf-workloads tput_b64_i128_o128 --work /tmp/gollm-dense-bench --out "$out/dense-peers.jsonl" \
  2>&1 | tee "$out/dense-peers.log"
python3 - "$out/dense-peers.jsonl" <<'PY' | tee -a "$out/dense-peers.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
val = {(r["model"], r["workload"], r["impl"]): r["value"] for r in rows}
for model, bound in (("qwen3-8B", 1.15), ("gemma3-4B", 1.2)):
    g, f = val.get((model, "decode_b1_i128_o128", "gollm-engine")), val.get((model, "decode_b1_i128_o128", "floor"))
    if g and f:
        print(f"{model} decode_b1: {g:.3f} ms/token, floor {f:.3f}: {g / f:.3f}× (target ≤ {bound})")
    g, h = val.get((model, "tput_b64_i128_o128", "gollm-engine")), val.get((model, "tput_b64_i128_o128", "hf-static"))
    if g and h:
        print(f"{model} tput_b64: {g:.0f} tokens/s, transformers static {h:.0f}: {g / h:.2f}× (target ≥ 3)")
PY
