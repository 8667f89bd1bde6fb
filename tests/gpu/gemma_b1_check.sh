#!/usr/bin/env bash
# Issue 37's Gemma-3-4B decode b1 work on the GPU machine in one call (about 8 minutes, H100
# or H200), with two libraries built before in the same lease (tests/gpu/build_lib.sh):
#   BASE_LIB=base.so PREBUILT_LIB=new.so bash tests/gpu/gemma_b1_check.sh CARRY OUTDIR
# (BASE_COMMIT, default c46cd65, is the base library's commit in its rows)
# after `bash tests/gpu/gemma_b1_carry.sh CARRY` here (CARRY default .carry/gemmab1). It
#   1. runs the GPU Go tests with PREBUILT_LIB: TestGPUFewRowDecodeMatchesTheInvariantPath
#      (the one-row decode kernels of Gemma 2 and 3 — the post-norm residual in
#      registers, decode attention's short layout with its parts merged — against the
#      batch-invariant engine's, fixtures and Gemma-3-4B's row and head widened),
#      TestGPUDenseFamiliesMatchTransformers (Qwen3, Gemma 2 and 3, Phi-3/4 against
#      transformers) and TestGPUExpertsMatchTransformers, and, after the A/B as time
#      allows (BUDGET_S, default 500 s from the start), TestGPUBatchInvariance;
#   2. gpubench on random weights (-random-gb, no files) of gemma3-4B (bf16), qwen3-30b-a3b
#      (bf16) and llama2-7B (fp16), decode b1 and b64, BASE_LIB and PREBUILT_LIB
#      alternating (base, new, new, base for gemma3-4B; base, new for the others, as time
#      allows; then new with GOLLM_CUDA_GROUPED=0, variant new-nogqa: gemma3-4B's b64
#      decode attention on the per-head kernel, as before the grouped kernel took
#      head_dim 256): rows in BENCH.md's format with "variant" and "round" in
#      OUTDIR/gemma-b1.jsonl, and each workload's new/base ratio of the medians (ms per
#      token: below 1 is faster; tokens/s: above 1 is faster).
# Prints PASS/FAIL per check and a count; exits 1 on a failure. Logs in OUTDIR.
set -uo pipefail
[ -f "${BASE_LIB:-}" ] && [ -f "${PREBUILT_LIB:-}" ] ||
  { echo "FAIL: BASE_LIB (${BASE_LIB:-}) and PREBUILT_LIB (${PREBUILT_LIB:-}) must name built libraries"; exit 1; }
source "$(dirname "$0")/checks.sh"
check_begin gemmab1 "${1:-.carry/gemmab1}" "$2"
cp "$BASE_LIB" "$w/base.so" && cp "$PREBUILT_LIB" "$w/new.so"
check_gpu
t_all=$SECONDS

# 1. The GPU Go tests (TestGPUBatchInvariance last, after the A/B, as time allows: the
# invariant paths take no new kernel but post_residual_norm4, which no model of it has).
gotest() {  # LOG TIMEOUT TEST...
  local log=$out/$1 lim=$2
  shift 2
  local t0=$SECONDS
  (cd "$root/bridge/cuda" && GOLLM_CUDA_LIB=$w/new.so timeout "$lim" "$w/bin/cudatest" -test.count=1 -test.v \
    -test.run "^($(IFS='|'; echo "$*"))\$" > "$log" 2>&1)
  echo "Go GPU tests ($*): $((SECONDS - t0)) s"
  grep -E '^(\s*--- (FAIL|SKIP)|ok|FAIL|panic)|worst relative' "$log" | tail -40
  local t
  for t in "$@"; do
    # A skipped test or subtest (no library, no GPU) is no pass.
    check "$t" "grep -q -- '^--- PASS: $t ' '$log' && ! grep -qE -- '^ *--- SKIP: $t( |/)' '$log'"
  done
}
gotest gotest.log 200 TestGPUFewRowDecodeMatchesTheInvariantPath TestGPUDenseFamiliesMatchTransformers \
  TestGPUExpertsMatchTransformers

# 2. The A/B.
python3 "$root/bench/moe_peers.py" --write-configs "$w" --models gemma3-4B,llama2-7B,qwen3-30b-a3b
day=$(date -u +%F)
rows=$out/gemma-b1.jsonl
rm -f "$rows"
bench() {  # MODEL DTYPE GB VARIANT ROUND (VARIANT: base, new, or new-nogqa: GOLLM_CUDA_GROUPED=0)
  [ $((SECONDS - t_all)) -lt "${BUDGET_S:-500}" ] || { echo "skip $1 $4 round $5: out of time"; return; }
  local t0=$SECONDS envs=()
  [ "${4#*-}" = nogqa ] && envs=(GOLLM_CUDA_GROUPED=0)
  env "${envs[@]}" timeout "${STAGE_S:-110}" "$w/bin/gpubench" -ckpt "$w/$1" -model "$1" -dtype "$2" -random-gb "$3" \
    -lib "$w/${4%%-*}.so" -workloads decode_b1_i128_o128,tput_b64_i128_o128 -reps 3 2>> "$out/gpubench.err" |
    python3 -c 'import json,sys
d, c, m, v, r = sys.argv[1:6]
for l in sys.stdin:
    x = json.loads(l); print(json.dumps({"date": d, "commit": c, "machine": m, **x, "variant": v, "round": int(r)}))' \
      "$day" "$([ "${4%%-*}" = base ] && echo "${BASE_COMMIT:-c46cd65}" || echo "$commit")" "$machine" "$4" "$5" >> "$rows"
  echo "$1 $4 round $5: $((SECONDS - t0)) s"
}
bench gemma3-4B bfloat16 20 base 1
bench gemma3-4B bfloat16 20 new 1
bench qwen3-30b-a3b bfloat16 70 base 1
bench qwen3-30b-a3b bfloat16 70 new 1
bench llama2-7B float16 20 base 1
bench llama2-7B float16 20 new 1
bench gemma3-4B bfloat16 20 new-nogqa 1
bench gemma3-4B bfloat16 20 new 2
bench gemma3-4B bfloat16 20 base 2
tail -3 "$out/gpubench.err"
if [ $((SECONDS - t_all)) -lt "${BUDGET_S:-500}" ]; then
  gotest invariance.log $((${BUDGET_S:-500} + 30 - (SECONDS - t_all))) TestGPUBatchInvariance
else
  echo "TestGPUBatchInvariance not run: out of time"
fi
python3 - "$rows" <<'PY' | tee "$out/ab.txt"
import collections, json, statistics, sys
t = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["model"], r["workload"], r["metric"])
    if k not in order:
        order.append(k)
    t[k + (r["variant"],)].append(r["value"])
print(f"{'model':14} {'workload':22} {'metric':13} {'base':>10} {'new':>10} new/base  new-nogqa/base")
for k in order:
    b, n, g = t[k + ("base",)], t[k + ("new",)], t[k + ("new-nogqa",)]
    if not b or not n:
        print(f"{k[0]:14} {k[1]:22} {k[2]:13} (missing a variant)")
        continue
    mb, mn = statistics.median(b), statistics.median(n)
    extra = f"  {statistics.median(g) / mb:.3f}" if g else ""
    print(f"{k[0]:14} {k[1]:22} {k[2]:13} {mb:10.4g} {mn:10.4g} {mn / mb:.3f}{extra}")
PY
check "gpubench gemma3-4B both libraries" "grep -q '\"variant\": \"new\"' '$rows' && grep -q '\"variant\": \"base\"' '$rows'"
echo "total $((SECONDS - t_all)) s"
check_end
