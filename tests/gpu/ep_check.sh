#!/usr/bin/env bash
# Expert parallelism (issue 37) on a machine of 2 or more GPUs, in one call of at most 8
# minutes:
#   bash tests/gpu/ep_check.sh CARRY OUTDIR
# after `bash tests/gpu/ep_carry.sh CARRY` here (CARRY default .carry/ep: cudatest — the
# bridge/cuda test binary —, gpubench and the commit, in bins.tar.xz). In order:
#   build   libgollm_cuda.so of this tree for sm_90 (tests/gpu/build_lib.sh; PREBUILT_LIB
#           names one built before in the lease instead)
#   env     2 GPUs or more, NCCL found (tests/gpu/env.sh)
#   tests   TestGPUExpertParallelMatchesOneGPU (the experts whole over 2 GPUs, and 4 with 4,
#           against one GPU: Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE, alone and
#           beside 8 and 100 rows: logits within 1e-2, the same tokens),
#           TestGPUExpertsAcrossGPUs (tensor parallelism of the experts, along their units),
#           TestGPUExpertsMatchTransformers and TestGPUExpertsAtEveryRowCount (one GPU: every
#           path of the expert kernels against transformers, which the expert range must
#           not have changed); a skip is a failure here
#   bench   gpubench on Qwen3-30B-A3B's shape (random weights in memory, bf16) at TP 2,
#           without and with -expert-parallel: decode_b1_i128_o128 (ms/token) and
#           tput_b64_i128_o128 (tokens/s), -reps 3; rows in BENCH.md's format in
#           OUTDIR/ep-bench.jsonl and bench/results/<date>-ep-<gpu>.jsonl, then a table
# Prints PASS or FAIL for each check; exits 1 when one failed. Logs stay in OUTDIR. About 3
# minutes of build, 1-2 of tests, 1-2 a benchmark run. BUDGET_S (default 380): no
# benchmark run starts past it (a run left out fails, saying so: build once, then pass
# PREBUILT_LIB, with EP_SKIP_TESTS=1 for the benchmark alone); EP_TEST_S (default 200)
# bounds the tests, EP_BENCH_S (default 130) each benchmark run.
set -uo pipefail
carry=$(cd "${1:-.carry/ep}" && pwd) out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
w=/tmp/gollm-ep
rm -rf "$w/bin" && mkdir -p "$w/bin"
tar xJf "$carry/bins.tar.xz" -C "$w/bin"
commit=$(cat "$w/bin/commit")
echo "== carry: $commit"
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

echo "== build"
lib=$w/libgollm_cuda.so
t0=$SECONDS
if [ -n "${PREBUILT_LIB:-}" ]; then
  cp "$PREBUILT_LIB" "$lib" && rc=0 || rc=1
  echo "prebuilt $PREBUILT_LIB" > "$out/build.log"
else
  bash "$root/tests/gpu/build_lib.sh" "$lib" > "$out/build.log" 2>&1
  rc=$?
fi
if [ $rc = 0 ]; then pass "build: libgollm_cuda.so in $((SECONDS - t0)) s"; else
  fail "build: libgollm_cuda.so"; tail -30 "$out/build.log"; exit 1
fi

echo "== env"
source "$root/tests/gpu/env.sh" > /dev/null
nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | tee "$out/gpus.txt"
machine=$(head -1 "$out/gpus.txt" | cut -d, -f1)
ngpu=$(grep -c . "$out/gpus.txt")
if [ "$ngpu" -ge 2 ]; then pass "env: $ngpu GPUs"; else fail "env: $ngpu GPU(s), expert parallelism needs 2"; fi
if [ -n "${nccl_dir:-}" ]; then pass "env: libnccl.so.2 in $nccl_dir"; else fail "env: no libnccl.so.2 found"; fi

if [ "${EP_SKIP_TESTS:-0}" != 1 ]; then
echo "== tests"
t0=$SECONDS
run='TestGPUExpertParallelMatchesOneGPU|TestGPUExpertsAcrossGPUs|TestGPUExpertsMatchTransformers|TestGPUExpertsAtEveryRowCount'
(cd "$root/bridge/cuda" && GOLLM_CUDA_LIB="$lib" NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout "${EP_TEST_S:-200}" \
  "$w/bin/cudatest" -test.run "$run" -test.v -test.count=1 > "$out/tests.log" 2>&1)
rc=$?
echo "tests: $((SECONDS - t0)) s"
# Each top-level test's outcome, every failed or skipped subtest, the expert-parallel
# comparisons' worst distances, and the tests' error lines.
grep -E '^--- |^\s+--- (FAIL|SKIP)' "$out/tests.log" | sed 's/^/    /'
grep -E 'experts over [0-9] GPUs, beside' "$out/tests.log" | sed -E 's/^\s*\S+_test\.go:[0-9]+: /    /'
grep -E '_test\.go:[0-9]+: ' "$out/tests.log" | grep -vE 'worst relative L2|rows \([0-9]+ sequences\)|NCCL [0-9]+ from' |
  head -30 | sed 's/^/    /'
skips=$(grep -cE '^\s*--- SKIP' "$out/tests.log")
[ "$skips" -gt 0 ] && fail "tests: $skips skipped (a library, NCCL or a second GPU not found)"
for t in TestGPUExpertParallelMatchesOneGPU TestGPUExpertsAcrossGPUs TestGPUExpertsMatchTransformers TestGPUExpertsAtEveryRowCount; do
  if grep -qE -- "^--- PASS: $t " "$out/tests.log"; then pass "tests: $t"; else fail "tests: $t"; fi
done
if [ $rc != 0 ]; then
  fail "tests: exit $rc$([ $rc = 124 ] && echo ' (timed out)')"
  tail -25 "$out/tests.log" | sed 's/^/    /'
fi
fi

echo "== bench: Qwen3-30B-A3B shape, TP 2 without and with expert parallelism"
ck=$w/qwen3-30b-a3b
mkdir -p "$ck"
python3 - "$root/bench" "$ck/config.json" <<'PY'
import json, sys
src = open(sys.argv[1] + "/moe_peers.py").read()
# moe_peers.py imports torch; only its CONFIGS literal is needed here.
start = src.index("CONFIGS = {")
ns = {}
exec(src[start:src.index("\n}\n", start) + 3], ns)
json.dump(ns["CONFIGS"]["qwen3-30b-a3b"], open(sys.argv[2], "w"))
PY
day=$(date -u +%F)
rows=$out/ep-bench.jsonl
rm -f "$rows"
for ep in false true; do
  if [ "$SECONDS" -gt "${BUDGET_S:-380}" ]; then
    fail "bench: out of time before expert_parallel $ep ($SECONDS s)"
    continue
  fi
  t0=$SECONDS
  timeout "${EP_BENCH_S:-130}" "$w/bin/gpubench" -ckpt "$ck" -model qwen3-30b-a3b -dtype bfloat16 -random-gb 70 \
    -lib "$lib" -tp 2 -expert-parallel="$ep" -workloads decode_b1_i128_o128,tput_b64_i128_o128 -reps 3 \
    2> "$out/bench-ep-$ep.log" |
    python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l)
    r = {"date": sys.argv[1], "commit": sys.argv[2], "machine": sys.argv[3], **r,
         "note": "TP 2 on 2 GPUs of one host, expert_parallel " + sys.argv[4] + "; random weights in memory (-random-gb), engine alone, CUDA graphs"}
    print(json.dumps(r))' "$day" "${commit%% *}" "$machine" "$ep" >> "$rows"
  rc=${PIPESTATUS[0]}
  grep gpubench: "$out/bench-ep-$ep.log" | sed 's/^/    /'
  if [ "$rc" = 0 ]; then pass "bench: TP 2, expert_parallel $ep ($((SECONDS - t0)) s)"; else
    fail "bench: TP 2, expert_parallel $ep (exit $rc)"; tail -8 "$out/bench-ep-$ep.log" | sed 's/^/    /'
  fi
done
short=$(echo "$machine" | tr 'A-Z' 'a-z' | sed 's/nvidia//' | awk '{print $1}')
[ -s "$rows" ] && cp "$rows" "$root/bench/results/$day-ep-$short.jsonl" && cp "$rows" "$out/$day-ep-$short.jsonl"
[ -s "$rows" ] && python3 - "$rows" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fig = {(bool(r.get("expert_parallel")), r["workload"]): r["value"] for r in rows}
print("| workload | TP 2 | TP 2, expert parallel | EP / TP |")
print("| --- | --- | --- | --- |")
for w, unit in (("decode_b1_i128_o128", "ms/token"), ("tput_b64_i128_o128", "tokens/s")):
    a, b = fig.get((False, w)), fig.get((True, w))
    f = lambda v: "—" if v is None else (f"{v:.3f}" if unit == "ms/token" else f"{v:,.0f}")
    print(f"| {w} ({unit}) | {f(a)} | {f(b)} | {'—' if not (a and b) else f'{b / a:.3f}'} |")
PY

echo "== $fails failed ($SECONDS s)"
[ "$fails" -eq 0 ]
