#!/usr/bin/env bash
# Round 3 on the GPU machine: the merge of tptwo2 (two-shot all-reduce, TP candidates),
# fp8fast2 (cuBLASLt's block-scaled FP8 GEMMs), fp8kv (the FP8 KV pool) and ep's GPU part
# (expert parallelism), all at ABI 16, against main (ae32bb3, ABI 15). After
# `bash tests/gpu/round3_carry.sh` here (.carry/round3), on the GPU machine:
#   R3_STAGES="..." bash .carry/round3/run.sh OUTDIR              # from main's checkout
#   R3_STAGES="..." bash tests/gpu/round3_check.sh CARRY OUTDIR    # from round3's
# It adapts to the GPUs it finds (1, 2 or 4; NCCL kept off NVLink multicast) and says what
# it left out for lack of them. Libraries go to build/round3/lib/ and benchmark rows to
# build/round3/rows/, kept between the calls of one warm machine, so that the stages can
# be split into calls of at most 9 minutes. Prints PASS/FAIL per check, the counts, the
# parts skipped and tables of medians; OUTDIR gets at most four files: summary.txt (this
# output), logs.tar.xz (every log, check.json, fp8probe's tables), and
# <date>-round3-<gpu>.jsonl (every benchmark row of the lease so far, BENCH.md's format
# with "variant" and "round"), ready for bench/results/.
#
# Stages (R3_STAGES, default all, in this order; minutes from the branches' own scripts'
# estimates, on 4 H100s):
#   build   this tree's libgollm_cuda.so and main's (base/cuda), side by side, through
#           tests/gpu/build_lib.sh (R3_MEASURE=1 adds a GOLLM_MEASURE one for
#           bench/stagecost.sh); fp8probe builds and runs beside them when probe is
#           selected too. ~3 (build_lib.sh: "about 3 minutes"; fp8probe "under three")
#   probe   tests/gpu/fp8probe.sh: what cuBLASLt's block-scaled FP8 GEMMs take and
#           whether they compute fp8lt.cuh's projection (its two PASS lines). ~1.5 alone
#   -- the Go tests (GPU tests of bridge/cuda and demo/austen, on the new library): the
#   selected groups run in lanes at once where there are GPUs to spare (R3_PARALLEL=0:
#   one after the other): lane g0 on GPU 0, g1 on GPU 1, g2 on GPU 2 (GPU 1 with 2-3
#   GPUs), check on the last GPU, and the tensor-parallel lane over every GPU; with one
#   GPU, everything in turn. The new tests:
#   kv      (g0) TestGPUFP8KVCache{MatchesCPU,DoublesTheBlocks,CopiesBlocks,TensorParallel}
#           and demo/austen's TestGPUHeldOutPerplexityFP8KV (fp8kv). ~3 (fp8kv_check.sh:
#           "up to 5 of tests" with the auto pool's regression)
#   fp8lt   (g0) TestGPUFP8RowCountsMatchCPU: every llama-fp8-tiny projection on cuBLASLt
#           at 16-1,024 rows against the CPU (fp8fast2). ~1
#   tpnew   (tp) TestGPUAllReduceMatchesHost (one- and two-shot against the host's sums, 2
#           and 4 GPUs), TestGPUTensorParallel{SampledCandidates,GuidedGreedy,
#           FailedRankTimesOutTwoShot} (tptwo2); 2 GPUs, TP 4 parts 4. ~1.5
#   epnew   (tp) TestGPUExpertParallelMatchesOneGPU (ep); 2 GPUs, EP 4 part 4. ~1.5
#   -- the regression: every other GPU test, so that a break anywhere shows:
#   rest1a  (g1) batch invariance, few-row decode, dense families and experts against
#           transformers, FP8 checkpoints, experts at every row count. ~3
#   rest1b  (g2) every other one-GPU test of bridge/cuda (TestGPU* and TestBuiltLibrary*)
#           and demo/austen's other GPU perplexities. ~3
#   resttp  (tp) the other tensor-parallel tests: TP 2/4 against one GPU, batch manager,
#           overlap, errors, aborts and timeouts, experts across GPUs. ~3 (tpar_check's
#           tp stage)
#   check   (check lane) tests/gpu/check.py on the new library, fp16 and bf16
#           (R3_CHECK_DTYPES, CHECK_ONLY). ~6 (recipe_ab.sh's check call less its build)
#   Aliases: new = kv fp8lt tpnew epnew; rest = rest1a rest1b resttp; tests = new rest.
#   -- benchmarks (gpubench, random weights in memory; never beside anything else), main's
#   library (base: main's gpubench, ABI 15) and this one's alternating, the order reversed
#   every other round; rows tagged variant base/new/new-kvfp8/new-ep; -reps R3_REPS (3):
#   dense   Llama-2-7B shape fp16: decode b1 and tput b64 i128/o128 on both; this library
#           also tput b192 and, with the FP8 KV pool, tput b64 and b192 (new-kvfp8).
#           Rounds R3_ROUNDS ("1 2"). ~4 (6 runs of ~35 s)
#   fp8     Llama-3.1-8B shape, quantization fp8: decode b1 and tput b64 on both.
#           Rounds R3_ROUNDS. ~3.5 (4 runs)
#   tp      (2+ GPUs) Llama-2-7B shape fp16 at TP 2 and 4 (4 GPUs): decode b1 and tput b64
#           on both (TP 1 is dense's). Rounds R3_TP_ROUNDS ("1 2"). ~4.5 on 4 GPUs (8 runs)
#   ep      (2+ GPUs) Qwen3-30B-A3B shape bf16 at TP 2: base, new, and new with expert
#           parallelism (new-ep): decode b1 and tput b64. Rounds R3_EP_ROUNDS ("1"). ~4 (3
#           runs of 60-90 s; ep_check.sh: "1-2 a benchmark run")
#   arbench (2+ GPUs) bench/arbench on the new library: the one-shot, two-shot and NCCL
#           all-reduces at 2 KB-8 MB, TP 2 and 4, checked bitwise; which is fastest where
#           (tptwo2's default: two-shot from 256 KiB at 4 ranks). ~1.5
# A suggested split (each call under 9 minutes on a warm machine; about 30 in all):
#   1. "build probe kv fp8lt"                ~7
#   2. "tpnew epnew rest check"              ~7 (lanes at once on 4 GPUs)
#   3. "dense fp8"                           ~7.5
#   4. "tp ep arbench"                       ~9 (R3_TP_ROUNDS=1 for ~7)
# R3_BUDGET_S (default 480): no test group or benchmark run starts past this many seconds
# of the call (each reported as not run, so that a later call can take it up; benchmark
# rounds can be picked with R3_ROUNDS etc.); R3_DEADLINE_S (default 540): every timeout
# below is cut to end by then, so that the reports print inside a 600 s call. Timeouts:
# R3_TEST_S per Go test group (default 300), R3_CHECK_S (480), R3_BENCH_S per gpubench run
# (150).
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
# Everything printed goes to OUTDIR/summary.txt too (a pipe the call waits for).
if [ -z "${R3_TEED:-}" ]; then
  R3_TEED=1 bash "$0" "$carry" "$out" 2>&1 | tee "$out/summary.txt"
  exit "${PIPESTATUS[0]}"
fi
T0=$SECONDS
stages=" ${R3_STAGES:-build probe new rest check dense fp8 tp ep arbench} "
stages=${stages/ tests / new rest }
stages=${stages/ new / kv fp8lt tpnew epnew }
stages=${stages/ rest / rest1a rest1b resttp }
has() { [[ "$stages" == *" $1 "* ]]; }
budget=${R3_BUDGET_S:-480} deadline=${R3_DEADLINE_S:-540}
b=$root/build/round3
mkdir -p "$b/bin" "$b/lib" "$b/rows"
logs=$(mktemp -d)
# The carry's binaries, once per carry: libraries and rows of another commit go.
if ! cmp -s "$b/commit" <(tar xJOf "$carry/bins.tar.xz" commit); then
  rm -rf "$b/bin" "$b/lib" "$b/rows" && mkdir -p "$b/bin" "$b/lib" "$b/rows"
  tar xJf "$carry/bins.tar.xz" -C "$b/bin"
  cp "$b/bin/commit" "$b/commit"
fi
# Libraries the carry brings for exactly this commit (round3_carry.sh's R3_LIBS): the build
# stage keeps them.
if [ -f "$carry/libs/commit" ] && cmp -s "$carry/libs/commit" "$b/commit"; then
  for v in new base; do
    [ -f "$b/lib/$v.so" ] || xz -dc "$carry/libs/$v.so.xz" > "$b/lib/$v.so" || rm -f "$b/lib/$v.so"
  done
fi
newc=$(awk '$1 == "new" {print $2}' "$b/commit") basec=$(awk '$1 == "base" {print $2}' "$b/commit")
echo "== round3: new $newc, base $basec; stages:$stages"
source "$root/tests/gpu/env.sh"
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
ngpu=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
machine=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
short=$(echo "$machine" | tr 'A-Z' 'a-z' | sed 's/nvidia//' | awk '{print $1}')
day=$(date -u +%F)
echo "== $ngpu × $machine"
nvidia-smi topo -m > "$logs/topo.txt" 2>&1

passes=0 fails=0 failed=() skipped=()
pass() { echo "PASS $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); failed+=("${1:0:220}"); }
skip() { echo "SKIP $1"; skipped+=("${1:0:220}"); }
past_budget() { [ $((SECONDS - T0)) -gt "$budget" ] || [ "$(left)" -lt 45 ]; }
# left: seconds to R3_DEADLINE_S; cap LIMIT: LIMIT or what is left, the smaller, so that
# the reports print before the call's limit.
left() { echo $((deadline - (SECONDS - T0))); }
cap() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }

finish() {
  echo
  echo "== summary ($((SECONDS - T0)) s, $ngpu × $machine, new $newc, base $basec)"
  [ -n "${tables:-}" ] && cat "$tables"
  echo "$passes passed, $fails failed"
  for f in "${failed[@]}"; do echo "  failed: $f"; done
  for s in "${skipped[@]}"; do echo "  skipped: $s"; done
  cp "$b"/*.log "$logs"/ 2> /dev/null
  (cd "$logs" && tar cJf "$out/logs.tar.xz" .)
  rm -rf "$logs"
  [ "$fails" = 0 ]
  exit
}

lib=$b/lib/new.so base=$b/lib/base.so mlib=$b/lib/new_measure.so

# ---- build (and fp8probe beside it)
probe_pid=
start_probe() {
  CUDA_VISIBLE_DEVICES=0 bash "$root/tests/gpu/fp8probe.sh" "$logs/probe" > "$logs/probe.out" 2>&1 &
  probe_pid=$!
}
report_probe() {
  wait "$probe_pid"
  local rc=$?
  grep -E '^(built|PASS|FAIL)' "$logs/probe.out" | sed 's/^/    /'
  if [ $rc = 0 ]; then pass "probe (fp8fast2): fp8lt.cuh's cuBLASLt combinations have algorithms and are right"; else
    fail "probe (fp8fast2): fp8probe.sh exit $rc (logs.tar.xz: probe.out, probe/)"
    tail -5 "$logs/probe.out" | sed 's/^/    /'
  fi
}
if has build; then
  echo "== build"
  has probe && start_probe
  t0=$SECONDS
  n=$(nproc)
  jobs=$((n / 2))
  [ "${R3_MEASURE:-0}" = 1 ] && jobs=$((n / 3))
  bl() { # OUT SRC LOG [EXTRA]
    [ -f "$1" ] && { echo "kept $1" > "$3"; return 0; }
    GOLLM_NVCC_EXTRA=${4:-} JOBS=$((jobs > 0 ? jobs : 1)) bash "$root/tests/gpu/build_lib.sh" "$1.tmp" "$2" > "$3" 2>&1 &&
      mv "$1.tmp" "$1"
  }
  bl "$lib" "$root/cuda" "$b/build-new.log" &
  p1=$!
  bl "$base" "$b/bin/base/cuda" "$b/build-base.log" &
  p2=$!
  p3=
  if [ "${R3_MEASURE:-0}" = 1 ]; then
    bl "$mlib" "$root/cuda" "$b/build-measure.log" -DGOLLM_MEASURE &
    p3=$!
  fi
  if wait $p1; then pass "build: round3's library ($((SECONDS - t0)) s)"; else fail "build: round3's library"; tail -20 "$b/build-new.log"; fi
  if wait $p2; then pass "build: main's library ($((SECONDS - t0)) s)"; else fail "build: main's library"; tail -20 "$b/build-base.log"; fi
  if [ -n "$p3" ]; then
    if wait "$p3"; then pass "build: the GOLLM_MEASURE library"; else fail "build: the GOLLM_MEASURE library"; tail -10 "$b/build-measure.log"; fi
  fi
fi
if has probe; then
  [ -z "$probe_pid" ] && { echo "== probe"; start_probe; }
  report_probe
fi
[ -f "$lib" ] || { fail "no round3 library in $lib: run the build stage"; finish; }
# TestBuiltLibrary* open ../../build/libgollm_cuda.so.
ln -sf "$lib" "$root/build/libgollm_cuda.so"

# ---- the Go tests, in lanes
all=$(cd "$root/bridge/cuda" && "$b/bin/new/cudatest" -test.list '^Test(GPU|BuiltLibrary)' 2> /dev/null)
aus_all=$(cd "$root/demo/austen" && "$b/bin/new/austentest" -test.list '^TestGPU' 2> /dev/null)
re_kv='TestGPUFP8KVCacheMatchesCPU|TestGPUFP8KVCacheDoublesTheBlocks|TestGPUFP8KVCacheCopiesBlocks|TestGPUFP8KVCacheTensorParallel'
re_fp8lt='TestGPUFP8RowCountsMatchCPU'
re_tpnew='TestGPUAllReduceMatchesHost|TestGPUTensorParallelSampledCandidates|TestGPUTensorParallelGuidedGreedy|TestGPUTensorParallelFailedRankTimesOutTwoShot'
re_epnew='TestGPUExpertParallelMatchesOneGPU'
re_1a='TestGPUBatchInvariance|TestGPUFewRowDecodeMatchesTheInvariantPath|TestGPUDenseFamiliesMatchTransformers|TestGPUExpertsMatchTransformers|TestGPUFP8CheckpointsMatchTransformers|TestGPUExpertsAtEveryRowCount|TestGPUQuantizeFP8MatchesCPU'
pick() { # REGEX: the listed tests it names, exactly
  echo "$all" | grep -xE "$1" | paste -sd'|'
}
others=$(echo "$all" | grep -vxE "$re_kv|$re_fp8lt|$re_tpnew|$re_epnew|$re_1a")
re_tp=$(echo "$others" | grep -E 'TensorParallel|AllReduce|AcrossGPUs' | paste -sd'|')
re_1b=$(echo "$others" | grep -vE 'TensorParallel|AllReduce|AcrossGPUs' | paste -sd'|')
aus_other=$(echo "$aus_all" | grep -vx 'TestGPUHeldOutPerplexityFP8KV' | paste -sd'|')

# group NAME BIN DIR REGEX: one test process, its log and exit status in $logs.
group() {
  local name=$1 bin=$2 dir=$3 re=$4
  [ -z "$re" ] && { echo "no tests" > "$logs/go-$name.log"; echo 0 > "$logs/go-$name.rc"; return; }
  if past_budget; then echo budget > "$logs/go-$name.rc"; return; fi
  (cd "$dir" && GOLLM_CUDA_LIB=$lib timeout "$(cap "${R3_TEST_S:-300}")" "$bin" -test.run "^($re)\$" -test.v -test.count=1 \
    > "$logs/go-$name.log" 2>&1)
  echo $? > "$logs/go-$name.rc"
}
# report NAME FROM [EXPECTED]: each top-level test's outcome (FROM: the branch its tests
# come from; EXPECTED: the names, |-separated, that must have run),
# every failed subtest, and the skips with their reasons: a skip for want of GPUs is
# listed, any other fails.
report() {
  local name=$1 from=${2:+ ($2)} log=$logs/go-$1.log rc t why
  rc=$(cat "$logs/go-$name.rc" 2> /dev/null || echo missing)
  if [ "$rc" = budget ]; then fail "$name: not run (past R3_BUDGET_S=$budget s or near R3_DEADLINE_S=$deadline s): run the stage again"; return; fi
  for t in $(echo "${3:-}" | tr '|' ' '); do
    grep -qE "^--- (PASS|FAIL|SKIP): $t " "$log" || fail "$name$from: $t did not run (renamed? see go-$name.log)"
  done
  while read -r t; do pass "$name$from: $t"; done < <(grep -E '^--- PASS' "$log" | sed -E 's/^--- PASS: //')
  while read -r t; do fail "$name$from: $t"; done < <(grep -E '^\s*--- FAIL' "$log" | sed -E 's/^\s*--- FAIL: //')
  # A skip's reason: the first log line after its test's "=== RUN" (or "=== CONT").
  while IFS=$'\t' read -r t why; do
    # For want of GPUs: the machine has some, fewer than the test needs (tpLibrary's words).
    if echo "$why" | grep -qE 'needs [0-9]+ GPUs; this machine has [1-9]' && ! echo "$why" | grep -q 'cannot load'; then
      skip "$name: $t — $why"
    else
      fail "$name: $t skipped — $why"
    fi
  done < <(awk '
    /^=== (RUN|CONT) / { cur = $3; next }
    /_test\.go:[0-9]+: / && !(cur in why) { w = $0; sub(/^[ \t]*[^ ]+_test\.go:[0-9]+: /, "", w); why[cur] = w; next }
    /^[ \t]*--- SKIP: / { n = $3; print n "\t" why[n] }' "$log")
  grep -E '_test\.go:[0-9]+: ' "$log" | grep -iE 'error|want|differ|mismatch|exceed|panic' | head -8 | sed 's/^/    /'
  if [ "$rc" != 0 ]; then
    fail "$name: exit $rc$([ "$rc" = 124 ] && echo " (timed out: R3_TEST_S or R3_DEADLINE_S)")"
    tail -12 "$log" | sed 's/^/    /'
  fi
}
run_check() {
  if past_budget; then echo budget > "$logs/check.rc"; return; fi
  CUDA_VISIBLE_DEVICES=$((ngpu - 1)) timeout "$(cap "${R3_CHECK_S:-480}")" python3 "$root/tests/gpu/check.py" \
    --bin "$b/bin/new/gollm-gpucheck" --lib "$lib" --work /tmp/gollm-round3-check --json "$logs/check.json" \
    --dtypes "${R3_CHECK_DTYPES:-float16,bfloat16}" ${CHECK_ONLY:+--only "$CHECK_ONLY"} > "$logs/check.log" 2>&1
  echo $? > "$logs/check.rc"
}
report_check() {
  local rc
  rc=$(cat "$logs/check.rc" 2> /dev/null || echo missing)
  if [ "$rc" = budget ]; then fail "check: not run (past R3_BUDGET_S=$budget s or near R3_DEADLINE_S=$deadline s)"; return; fi
  grep -v '^ *$' "$logs/check.log" | tail -50
  if [ "$rc" = 0 ]; then pass "check: check.py ${R3_CHECK_DTYPES:-float16,bfloat16} on round3's library"; else
    fail "check: check.py exit $rc$([ "$rc" = 124 ] && echo ' (timed out)')"
  fi
}

cudadir=$root/bridge/cuda ausdir=$root/demo/austen
ct=$b/bin/new/cudatest at=$b/bin/new/austentest
lane_g0() {
  has kv && group kv "$ct" "$cudadir" "$re_kv" && group kv-austen "$at" "$ausdir" TestGPUHeldOutPerplexityFP8KV
  has fp8lt && group fp8lt "$ct" "$cudadir" "$re_fp8lt"
}
lane_g1() { has rest1a && group rest1a "$ct" "$cudadir" "$(pick "$re_1a")"; }
lane_g2() {
  has rest1b && group rest1b "$ct" "$cudadir" "$re_1b" && group rest1b-austen "$at" "$ausdir" "$aus_other"
}
lane_tp() {
  has tpnew && group tpnew "$ct" "$cudadir" "$re_tpnew"
  has epnew && group epnew "$ct" "$cudadir" "$re_epnew"
  has resttp && group resttp "$ct" "$cudadir" "$re_tp"
}
any=0
for s in kv fp8lt tpnew epnew rest1a rest1b resttp check; do has $s && any=1; done
if [ $any = 1 ]; then
  echo "== tests$(has check && echo ' and check.py') on round3's library ($ngpu GPU(s), lanes $([ "${R3_PARALLEL:-1}" = 1 ] && [ "$ngpu" -ge 2 ] && echo 'at once' || echo 'in turn'))"
  t0=$SECONDS
  if [ "${R3_PARALLEL:-1}" = 1 ] && [ "$ngpu" -ge 2 ]; then
    g2=$((ngpu >= 3 ? 2 : 1))
    (export CUDA_VISIBLE_DEVICES=0; lane_g0) &
    (export CUDA_VISIBLE_DEVICES=1; lane_g1) &
    (export CUDA_VISIBLE_DEVICES=$g2; lane_g2) &
    lane_tp &
    has check && run_check &
    wait
  else
    lane_g0; lane_g1; lane_g2; lane_tp
    has check && run_check
  fi
  echo "tests: $((SECONDS - t0)) s"
  has kv && { report kv fp8kv "$re_kv"; report kv-austen fp8kv TestGPUHeldOutPerplexityFP8KV; }
  has fp8lt && report fp8lt fp8fast2 "$re_fp8lt"
  has tpnew && report tpnew tptwo2 "$re_tpnew"
  has epnew && report epnew ep "$re_epnew"
  has rest1a && report rest1a ""
  has rest1b && { report rest1b ""; report rest1b-austen ""; }
  has resttp && report resttp ""
  has check && report_check
  # Every TestGPU test of bridge/cuda was in some selected group when all were selected.
  if has kv && has fp8lt && has tpnew && has epnew && has rest1a && has rest1b && has resttp; then
    ran=$(cat "$logs"/go-*.log | grep -cE '^--- (PASS|FAIL|SKIP)')
    want=$(($(echo "$all" | grep -c .) + $(echo "$aus_all" | grep -c .)))
    if [ "$ran" = "$want" ]; then pass "tests: all $want GPU tests ran"; else fail "tests: $ran of $want GPU tests reported"; fi
  fi
fi
[ "$ngpu" -lt 2 ] && has tpnew && skip "tpnew/resttp/epnew: one GPU — the all-reduce, TP 2/4 and EP parts skip (listed above)"
[ "$ngpu" -ge 2 ] && [ "$ngpu" -lt 4 ] && has tpnew && skip "TP 4 / EP 4 parts of the tests: $ngpu GPUs (listed above)"

# ---- benchmarks
tables=$(mktemp)
ckpts=/tmp/gollm-round3-ckpt
mkdir -p "$ckpts"
writeconfig() { # NAME: a config.json for gpubench -random-gb
  mkdir -p "$ckpts/$1"
  python3 - "$1" "$ckpts/$1/config.json" "$root/bench" <<'PY'
import json, sys
name, path, bench = sys.argv[1:4]
if name == "llama2-7B":
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
         "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
         "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "float16"}
elif name == "llama3.1-8B":
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
         "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192},
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001}
else:
    # moe_peers.py imports torch; only its CONFIGS literal is needed.
    src = open(bench + "/moe_peers.py").read()
    start = src.index("CONFIGS = {")
    ns = {}
    exec(src[start:src.index("\n}\n", start) + 3], ns)
    c = ns["CONFIGS"][name]
json.dump(c, open(path, "w"))
PY
}
# bench STAGE ROUND VARIANT MODEL GB TP WORKLOADS [FLAGS...]: one gpubench run, its rows
# (BENCH.md's fields, the variant's commit, variant, round) in build/round3/rows/.
bench() {
  local stage=$1 round=$2 variant=$3 model=$4 gb=$5 tp=$6 wl=$7
  shift 7
  local gbin=$b/bin/new/gpubench l=$lib c=$newc
  [ "$variant" = base ] && gbin=$b/bin/base/gpubench l=$base c=$basec
  local tag="$stage-r$round-$variant-$model-tp$tp"
  if past_budget; then fail "bench $tag: not run (past R3_BUDGET_S=$budget s or near R3_DEADLINE_S=$deadline s): run it again (R3_ROUNDS etc.)"; return; fi
  [ -f "$l" ] || { fail "bench $tag: no library $l (run the build stage)"; return; }
  [ -f "$ckpts/$model/config.json" ] || writeconfig "$model"
  local t0=$SECONDS
  timeout "$(cap "${R3_BENCH_S:-150}")" "$gbin" -ckpt "$ckpts/$model" -model "$model" -lib "$l" -random-gb "$gb" -tp "$tp" \
    -workloads "$wl" -reps "${R3_REPS:-3}" "$@" 2> "$logs/bench-$tag.log" |
    python3 -c 'import json, sys
day, commit, machine, variant, rnd = sys.argv[1:6]
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        print(json.dumps({"date": day, "commit": commit, "machine": machine, **r, "variant": variant, "round": int(rnd)}))' \
      "$day" "$c" "$machine" "$variant" "$round" > "$b/rows/$tag.jsonl"
  local rc=${PIPESTATUS[0]}
  cp "$logs/bench-$tag.log" "$b/bench-$tag.log" 2> /dev/null
  if [ "$rc" = 0 ] && [ -s "$b/rows/$tag.jsonl" ]; then pass "bench $tag ($((SECONDS - t0)) s)"; else
    fail "bench $tag (exit $rc$([ "$rc" = 124 ] && echo ', timed out'))"
    tail -4 "$logs/bench-$tag.log" | sed 's/^/    /'
    rm -f "$b/rows/$tag.jsonl"
  fi
}
order() { # ROUND VARIANT...: the variants, reversed in even rounds
  local r=$1
  shift
  if [ $((r % 2)) = 1 ]; then echo "$@"; else echo "$@" | tr ' ' '\n' | tac | paste -sd' '; fi
}
W2=decode_b1_i128_o128,tput_b64_i128_o128
if has dense; then
  echo "== dense: Llama-2-7B shape, main and round3 alternating (round3 also with the FP8 KV pool)"
  for r in ${R3_ROUNDS:-1 2}; do
    for v in $(order "$r" base new new-kvfp8); do
      case $v in
      base) bench dense "$r" base llama2-7B 16 1 $W2 ;;
      new) bench dense "$r" new llama2-7B 16 1 $W2,tput_b192_i128_o128 ;;
      new-kvfp8) bench dense "$r" new-kvfp8 llama2-7B 16 1 tput_b64_i128_o128,tput_b192_i128_o128 -kv-cache-dtype fp8 ;;
      esac
    done
  done
fi
if has fp8; then
  echo "== fp8: Llama-3.1-8B shape, quantization fp8, main and round3 alternating"
  for r in ${R3_ROUNDS:-1 2}; do
    for v in $(order "$r" base new); do bench fp8 "$r" "$v" llama3.1-8B 20 1 $W2 -quantization fp8; done
  done
fi
if has tp; then
  if [ "$ngpu" -lt 2 ]; then skip "tp: TP 2/4 decode on Llama-2-7B needs 2 GPUs"; else
    tps=2
    [ "$ngpu" -ge 4 ] && tps="2 4" || skip "tp: TP 4 needs 4 GPUs ($ngpu here)"
    echo "== tp: Llama-2-7B shape at TP $tps, main and round3 alternating"
    for r in ${R3_TP_ROUNDS:-1 2}; do
      for tp in $tps; do
        for v in $(order "$r" base new); do bench tp "$r" "$v" llama2-7B 15 "$tp" $W2; done
      done
    done
  fi
fi
if has ep; then
  if [ "$ngpu" -lt 2 ]; then skip "ep: Qwen3-30B-A3B at TP 2 needs 2 GPUs"; else
    echo "== ep: Qwen3-30B-A3B shape bf16 at TP 2: main, round3, round3 with expert parallelism"
    for r in ${R3_EP_ROUNDS:-1}; do
      for v in $(order "$r" base new new-ep); do
        case $v in
        new-ep) bench ep "$r" new-ep qwen3-30b-a3b 70 2 $W2 -dtype bfloat16 -expert-parallel ;;
        *) bench ep "$r" "$v" qwen3-30b-a3b 70 2 $W2 -dtype bfloat16 ;;
        esac
      done
    done
  fi
fi
if has arbench; then
  if [ "$ngpu" -lt 2 ]; then skip "arbench: the all-reduce needs 2 GPUs"; elif past_budget; then
    fail "arbench: not run (past R3_BUDGET_S=$budget s or near R3_DEADLINE_S=$deadline s)"
  else
    echo "== arbench: the all-reduces alone on round3's library"
    ways=2
    [ "$ngpu" -ge 4 ] && ways=2,4
    timeout "$(cap 240)" "$b/bin/new/arbench" -lib "$lib" -tp $ways 2> "$logs/arbench.log" |
      python3 -c 'import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        r = json.loads(l)
        print(json.dumps({"date": sys.argv[1], "commit": sys.argv[2], "machine": sys.argv[3], **r, "variant": "new", "round": 1}))' \
        "$day" "$newc" "$machine" > "$b/rows/arbench.jsonl"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ]; then pass "arbench: TP $ways"; else fail "arbench (exit $rc)"; tail -6 "$logs/arbench.log" | sed 's/^/    /'; fi
    python3 - "$b/rows/arbench.jsonl" <<'PY' | tee -a "$tables"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    sys.exit(0)
names = {"gollm-custom-ar": "one-shot", "gollm-custom-ar-2shot": "two-shot", "nccl-f32": "nccl-f32"}
fig = {(r["tp"], r["bytes"], names.get(r["impl"], "nccl")): r["value"] / 1e3 for r in rows}
print("arbench (µs a call): | TP | bytes | one-shot | two-shot | NCCL fp32 + norm | NCCL fp16 | fastest fused |")
for tp, b in sorted({(r["tp"], r["bytes"]) for r in rows}):
    f = lambda k: f"{fig[(tp, b, k)]:.2f}" if (tp, b, k) in fig else "—"
    c = [k for k in ("one-shot", "two-shot", "nccl-f32") if (tp, b, k) in fig]
    best = min(c, key=lambda k: fig[(tp, b, k)]) if c else "—"
    print(f"| {tp} | {b:,} | {f('one-shot')} | {f('two-shot')} | {f('nccl-f32')} | {f('nccl')} | {best} |")
bad = [r for r in rows if r["impl"].startswith("gollm-custom-ar") and (r.get("ranks_differ") or r.get("max_err_h", 0) > 0)]
for r in bad:
    print(f"FAIL arbench check: {r['workload']}: h off by {r['max_err_h']}, {r['ranks_differ']} elements differ between ranks")
sys.exit(1 if bad else 0)
PY
    [ "${PIPESTATUS[0]}" = 0 ] || fail "arbench: a custom all-reduce's sums differ from the host's"
  fi
fi

# Every row of the lease so far: one file for bench/results/, and the medians.
rows=$out/$day-round3-$short.jsonl
cat "$b"/rows/*.jsonl > "$rows" 2> /dev/null
[ -s "$rows" ] || rm -f "$rows"
if ls "$b"/rows/*.jsonl > /dev/null 2>&1 && ls "$b"/rows/ | grep -qv '^arbench'; then
  python3 - "$b/rows" <<'PY' | tee -a "$tables"
import collections, glob, json, os, statistics, sys
cells = collections.defaultdict(list)
keys = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    if os.path.basename(f).startswith("arbench"):
        continue
    stage = os.path.basename(f).split("-r")[0]
    for l in open(f):
        r = json.loads(l)
        k = (stage, r["model"], r["dtype"], r.get("tp", 1), r["workload"], r["metric"])
        if k not in keys:
            keys.append(k)
        cells[k + (r["variant"],)].append(r["value"])
variants = ["base", "new", "new-kvfp8", "new-ep"]
med = lambda xs: statistics.median(xs) if xs else None
fmt = lambda v, m: "—" if v is None else (f"{v:.3f}" if m != "tokens_per_s" else f"{v:,.0f}")
print("medians (runs): new/base > 1 is slower for ms_per_token, faster for tokens_per_s; new-kvfp8 and new-ep are to new")
print("| stage | model | dtype | TP | workload | metric | base | new | new-kvfp8 | new-ep | new/base | kvfp8/new | ep/new |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for k in sorted(keys, key=lambda k: (k[0], k[1], k[3], k[4])):
    m = {v: med(cells[k + (v,)]) for v in variants}
    n = {v: len(cells[k + (v,)]) for v in variants}
    ratio = lambda a, b: f"{m[a] / m[b]:.3f}" if m[a] and m[b] else "—"
    cols = [f"{fmt(m[v], k[5])} ({n[v]})" if m[v] is not None else "—" for v in variants]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {k[5]} | " + " | ".join(cols) +
          f" | {ratio('new', 'base')} | {ratio('new-kvfp8', 'new')} | {ratio('new-ep', 'new')} |")
PY
fi
finish
