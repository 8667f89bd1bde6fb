#!/usr/bin/env bash
# The mixture-of-experts stage's kernels (moe.cuh: one-row gemvs and the fused down
# projection and combination at batch 1, 16-row tensor-core tiles at a few rows an expert)
# on the GPU machine in one call of at most 9 minutes (about 6), against the base's library:
#   PREBUILT_LIB=new.so BASE_LIB=base.so bash tests/gpu/moe_fast_check.sh CARRY OUTDIR
# after `bash tests/gpu/moe_fast_carry.sh CARRY` here (CARRY default .carry/moefast) and
# `bash tests/gpu/build_lib.sh` of this tree (new.so) and of the base's cuda/ (base.so)
# there. It runs
#   1. the GPU Go tests of the experts: TestGPUExpertsMatchTransformers (Mixtral, Qwen2-MoE
#      with its shared expert, Qwen3-MoE; fp16 and bf16; alone and beside 100 rows: logits
#      within 1e-2/4e-2 of transformers' float32, greedy tokens), TestGPUExpertsAtEveryRowCount
#      (one step of 1 to 1,100 rows: every path and two passes, every row against
#      transformers), TestGPUBatchInvariance (the invariant path, unchanged) and
#      TestGPUExpertsAcrossGPUs (skips on one GPU);
#   2. check.py's mixture-of-experts rows (mixtral-2L-8x2, qwen2moe-2L-60x4,
#      qwen3moe-3L-128x8) in fp16 and bf16 with the new library;
#   3. gpubench on Qwen3-30B-A3B's shape (random weights, bf16), base and new library
#      alternating (ROUNDS rounds, default 2, the order reversed every other round), -reps 3:
#      decode_b1_i128_o128 (ms/token) and tput_b64_i128_o128 (tokens/s); rows in BENCH.md's
#      format (variant: base or new) in OUTDIR/moe-fast.jsonl and bench/results/, then each
#      variant's runs and new/base of their medians (for ms, below 1 is faster).
# Prints PASS/FAIL per check and a count; exits 1 on a failure. Logs in OUTDIR.
set -uo pipefail
[ -f "${PREBUILT_LIB:-}" ] && [ -f "${BASE_LIB:-}" ] ||
  { echo "FAIL: PREBUILT_LIB (${PREBUILT_LIB:-}) and BASE_LIB (${BASE_LIB:-}) must name the built libraries"; exit 1; }
new=$(realpath "$PREBUILT_LIB") base=$(realpath "$BASE_LIB")
source "$(dirname "$0")/checks.sh"
check_begin moefast "${1:-.carry/moefast}" "$2"
check_gpu

# 1. The GPU Go tests.
t0=$SECONDS
tests='TestGPUExpertsMatchTransformers|TestGPUExpertsAtEveryRowCount|TestGPUBatchInvariance|TestGPUExpertsAcrossGPUs'
(cd "$root/bridge/cuda" && GOLLM_CUDA_LIB=$new timeout 200 "$w/bin/cudatest" -test.count=1 -test.v \
  -test.run "$tests" > "$out/gotest.log" 2>&1)
echo "Go GPU tests: $((SECONDS - t0)) s"
grep -E '^(\s*--- (FAIL|SKIP)|ok|FAIL|PASS|panic)|worst relative|rows: ' "$out/gotest.log" | tail -60
for t in TestGPUExpertsMatchTransformers TestGPUExpertsAtEveryRowCount TestGPUBatchInvariance; do
  check "$t" "grep -q -- '^--- PASS: $t ' '$out/gotest.log'"
done
# It needs two GPUs for its comparison where the machine has them; a skip is no failure.
check "TestGPUExpertsAcrossGPUs (passes or skips)" \
  "grep -qE -- '^--- (PASS|SKIP): TestGPUExpertsAcrossGPUs ' '$out/gotest.log'"

# 2. check.py's mixture-of-experts rows.
t0=$SECONDS
timeout 170 python3 "$root/tests/gpu/check.py" --bin "$w/bin/gollm-gpucheck" --lib "$new" --work "$w/check" \
  --json "$out/check.json" --only mixtral-2L-8x2,qwen2moe-2L-60x4,qwen3moe-3L-128x8 > "$out/check.log" 2>&1
rc=$?
grep -v '^ *$' "$out/check.log" | tail -20
echo "check.py: $((SECONDS - t0)) s"
check "check.py mixture-of-experts rows" "[ $rc = 0 ]"

# 3. Qwen3-30B-A3B's shape, base and new alternating.
t0=$SECONDS
ck=$w/qwen3-30b-a3b
mkdir -p "$ck"
python3 - "$root/bench" "$ck/config.json" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
src = open(sys.argv[1] + "/moe_peers.py").read()
# moe_peers.py imports torch; only its CONFIGS literal is needed here.
start = src.index("CONFIGS = {")
ns = {}
exec(src[start:src.index("\n}\n", start) + 3], ns)
json.dump(ns["CONFIGS"]["qwen3-30b-a3b"], open(sys.argv[2], "w"))
PY
day=$(date -u +%F)
rows=$out/moe-fast.jsonl
rm -f "$rows"
for round in $(seq "${ROUNDS:-2}"); do
  order="base new"
  [ $((round % 2)) = 0 ] && order="new base"
  for v in $order; do
    # The call's ten minutes: no run starts past BUDGET_S (default 420) of the script.
    if [ "$SECONDS" -gt "${BUDGET_S:-420}" ]; then
      echo "bench: out of time before $v round $round"
      continue
    fi
    lib=$base
    [ "$v" = new ] && lib=$new
    # A base library of an older ABI needs its own gpubench: GPUBENCH_BASE names it.
    gb=$w/bin/gpubench
    [ "$v" = base ] && [ -n "${GPUBENCH_BASE:-}" ] && gb=$GPUBENCH_BASE
    timeout 120 "$gb" -ckpt "$ck" -model qwen3-30b-a3b -dtype bfloat16 -random-gb 70 -lib "$lib" \
      -workloads decode_b1_i128_o128,tput_b64_i128_o128 -reps 3 2>> "$out/gpubench.err" |
      python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l)
    r = {"date": sys.argv[1], "commit": sys.argv[2], "machine": sys.argv[3], **r, "variant": sys.argv[4], "round": int(sys.argv[5])}
    print(json.dumps(r))' "$day" "$commit" "$machine" "$v" "$round" >> "$rows" ||
      echo "FAIL: gpubench $v (round $round): $(tail -2 "$out/gpubench.err")"
  done
done
echo "bench: $((SECONDS - t0)) s"
check "gpubench qwen3-30b-a3b, both libraries" "[ \$(grep -c '\"variant\": \"new\"' '$rows') -ge 2 ] && [ \$(grep -c '\"variant\": \"base\"' '$rows') -ge 2 ]"
short=$(echo "$machine" | tr 'A-Z' 'a-z' | sed 's/nvidia//' | awk '{print $1}')
[ -s "$rows" ] && cp "$rows" "$root/bench/results/$day-moefast-$short.jsonl"
python3 - "$rows" <<'PY'
import collections, json, statistics, sys
t = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["workload"], r["metric"])
    if k not in order:
        order.append(k)
    t[k + (r["variant"],)].append(r["value"])
print(f"{'workload':22} {'metric':13} {'base':>24} {'new':>24} new/base")
for k in order:
    b, n = t[k + ("base",)], t[k + ("new",)]
    f = lambda xs: "/".join("%.4g" % x for x in xs)
    ratio = statistics.median(n) / statistics.median(b) if b and n else float("nan")
    print(f"{k[0]:22} {k[1]:13} {f(b):>24} {f(n):>24} {ratio:.3f}")
PY

check_end
