#!/usr/bin/env bash
# Issue 37's mixture-of-experts targets in one device call (≤ 9 minutes, one H200): the
# Qwen3-30B-A3B shape with random bf16 weights in memory (61 GB: no files), decode at
# batch 1 against the floor of the experts a step routes to and at batch 64 against
# transformers' static-cache generate, as bench/moe_peers.py measures them.
#
#   bash bench/moe_peers.sh OUT [CARRY]
# CARRY holds gpubench and libgollm_cuda.so (built here: cmake -S . -B build
# -DGOLLM_CUDA=ON -DGOLLM_CUDA_ARCHS=90 && cmake --build build; go build -ldflags=-s -o
# CARRY/gpubench ./bench/gpubench; cp build/libgollm_cuda.so CARRY/). Without CARRY it takes
# what tests/gpu/recipe_ab.sh built on this machine (build/recipe-ab), so that it follows a
# recipe_ab.sh call on a warm machine. It writes $OUT/moe-peers.jsonl (BENCH.md's rows; also
# appended to bench/results/) and $OUT/moe-peers.log, whose last lines are the table and the
# targets' ratios:
#   qwen3-30b-a3b decode_b1 gollm / floor ≤ 1.5;  tput_b64 gollm / hf-static ≥ 3.
# MODELS=mixtral-8x7b TP=2 runs Mixtral-8x7B over two GPUs instead (93 GB; transformers only
# where one GPU holds it). BUDGET (seconds, 500) bounds the whole run.
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
python3 "$root/bench/moe_peers.py" --gpubench "$gpubench" --lib "$lib" --models "${MODELS:-qwen3-30b-a3b}" \
  --tp "${TP:-1}" --budget "${BUDGET:-500}" --out "$out/moe-peers.jsonl" 2>&1 | tee "$out/moe-peers.log"
python3 - "$out/moe-peers.jsonl" <<'PY' | tee -a "$out/moe-peers.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
val = {}
for r in rows:
    impl = "gollm" if r["impl"].startswith("gollm-engine") else r["impl"]
    val[(r["model"], r["workload"], impl)] = r["value"]
for model in sorted({r["model"] for r in rows}):
    g, f = val.get((model, "decode_b1_i128_o128", "gollm")), val.get((model, "decode_b1_i128_o128", "floor"))
    if g and f:
        print(f"{model} decode_b1: {g:.3f} ms/token, floor {f:.3f}: {g / f:.3f}× (target ≤ 1.5)")
    g, h = val.get((model, "tput_b64_i128_o128", "gollm")), val.get((model, "tput_b64_i128_o128", "hf-static"))
    if g and h:
        print(f"{model} tput_b64: {g:.0f} tokens/s, transformers static {h:.0f}: {g / h:.2f}× (target ≥ 3)")
PY
