#!/usr/bin/env bash
# Batch invariance (issue 39) on the GPU machine, in one call of about six minutes, run
# from this tree with CARRY = .carry/invariant (tests/gpu/invariant_carry.sh):
#   bash tests/gpu/invariant_check.sh .carry/invariant $OUT
# 1. builds libgollm_cuda.so of this tree (new) and of the base's cuda/ (base), sm_90, in
#    parallel (tests/gpu/recipe_ab.sh's build, into build/recipe-ab/);
# 2. the bridge's TestGPUBatchInvariance on the new library: a sequence alone against the
#    start, middle and end of batches of 2, 7 and 64, and chunked against whole prefill,
#    bitwise, fp16 and bf16, on GPT-2, LLaMA (GQA), Qwen3 and Mixtral fixtures and widened
#    random-weight shapes (OUT/gotest.log);
# 3. check.py --batch-invariant on CHECK_ONLY (default: GPT-2 124M, the TinyLlama shape,
#    Mixtral), fp16 and bf16: every batch row bitwise its single run, 64/64 tokens
#    (OUT/check.json);
# 4. gpubench on the Llama-2-7B shape, base and new (invariance off, the default)
#    alternating — the throughput limits hold new to the base —, and the new library with
#    each of VARIANTS (default -batch-invariant: its cost; a gpubench flag, variant
#    new-FLAG, or a VAR=VALUE setting such as GOLLM_CUDA_TILE_BLOCKS=3, variant new+VAR=VALUE),
#    ROUNDS rounds (default 2): decode
#    b1 i128 o128 (ms/token) and b64 i128 o128 (tokens/s); rows in OUT/invariant-ab.jsonl
#    (BENCH.md's fields; copy them to bench/results/), then new/base of the medians.
# Prints PASS or FAIL per check; exits non-zero if any failed.
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
b=$root/build/recipe-ab
mkdir -p "$b/lib"
if [ ! -f "$b/commit" ] || ! cmp -s "$b/commit" <(tar xJOf "$carry/bins.tar.xz" commit); then
  rm -rf "$b/bin" "$b/lib"/* && mkdir -p "$b/bin"
  tar xJf "$carry/bins.tar.xz" -C "$b/bin"
  cp "$b/bin/commit" "$b/commit"
fi
echo "commits: $(tr '\n' ' ' < "$b/commit")"
source "$root/bench/device.sh"
w=/tmp/gollm-invariant
mkdir -p "$w"
fails=0
verdict() { # verdict RC WHAT
  if [ "$1" = 0 ]; then echo "PASS $2"; else echo "FAIL $2 ($1)"; fails=$((fails + 1)); fi
}
# build NAME SRC JOBS: SRC (a cuda/) into $b/lib/libgollm_cuda_NAME.so with JOBS nvcc
# processes (tests/gpu/build_lib.sh), unless built.
build() {
  local lib=$b/lib/libgollm_cuda_$1.so
  [ -f "$lib" ] && return 0
  JOBS=$3 bash "$root/tests/gpu/build_lib.sh" "$lib" "$2" || { echo "FAIL: build $1"; return 1; }
}
# The 7B checkpoint is written while the libraries build (its own GPU work is brief).
write_checkpoint llama2-7B > "$out/checkpoint.log" 2>&1 &
ckpt=$!
build new "$root/cuda" 8 &
newb=$!
build base "$b/bin/base/cuda" 8 &
baseb=$!
wait "$newb"
verdict $? "build (new library, sm_90)"
new=$b/lib/libgollm_cuda_new.so
if [ -f "$new" ]; then
  # The Go tests and check.py share the GPU (both small; neither is timed).
  (cd "$root/bridge/cuda" && GOLLM_CUDA_LIB="$new" timeout 300 "$b/bin/new/cudatest" \
    -test.run 'GPUBatchInvariance' -test.v -test.count=1 > "$out/gotest.log" 2>&1) &
  gotest=$!
  python3 "$root/tests/gpu/check.py" --bin "$b/bin/new/gollm-gpucheck" --lib "$new" \
    --work /tmp/gollm-invariant-check --json "$out/check.json" --batch-invariant \
    --only "${CHECK_ONLY:-gpt2-124M,tinyllama-1.1B,mixtral-2L-8x2}" \
    ${CHECK_DTYPES:+--dtypes "$CHECK_DTYPES"} > "$out/check.log" 2>&1
  crc=$?
  wait "$gotest"
  rc=$?
  grep -E '^\s*(--- |ok|FAIL|PASS)|differ|logit' "$out/gotest.log" | head -60
  verdict "$rc" "TestGPUBatchInvariance (bitwise: alone vs batches of 2, 7, 64; chunked vs whole)"
  grep -E '^\||^FAIL|passed|failed' "$out/check.log" | tail -40
  verdict "$crc" "check.py (batch rows bitwise, 64/64 tokens)"
fi
wait "$baseb"
verdict $? "build (base library, sm_90)"
wait "$ckpt"
verdict $? "Llama-2-7B checkpoint"
if [ "$fails" -gt 0 ] && [ ! -f "$new" ]; then exit 1; fi
rm -f "$out/invariant-ab.jsonl"
machine=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
t0=$SECONDS
for round in $(seq "${ROUNDS:-2}"); do
  order="base new"
  [ $((round % 2)) = 0 ] && order="new base"
  for v in $order ${VARIANTS--batch-invariant}; do
    lib=$v envs=() flags=()
    case $v in *=*) lib=new envs=("$v") v=new+$v ;; -*) lib=new flags=("$v") v=new$v ;; esac
    env "${envs[@]}" timeout "${STAGE_S:-90}" "$b/bin/$lib/gpubench" "${flags[@]}" -ckpt "$w/llama2-7B" -model llama2-7B \
      -lib "$b/lib/libgollm_cuda_$lib.so" -workloads decode_b1_i128_o128,tput_b64_i128_o128 -reps 3 \
      2>> "$out/gpubench.err" | tag_rows date "$(date -u +%F)" machine "$machine" variant "$v" round "$round" \
      commit "$(grep "^$lib " "$b/commit" | cut -d' ' -f2)" >> "$out/invariant-ab.jsonl" ||
      echo "FAIL: gpubench $v (round $round): $(tail -2 "$out/gpubench.err")"
  done
done
echo "bench in $((SECONDS - t0)) s"
python3 - "$out/invariant-ab.jsonl" <<'PY'
import collections, json, statistics, sys
t = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["model"], r["workload"], r["metric"])
    if k not in order:
        order.append(k)
    t[k + (r["variant"],)].append(r["value"])
print(f"{'model':10} {'workload':22} {'metric':13} {'base':>22} {'new':>22} new/base")
bad = 0
variants = sorted({v for (*_, v) in t} - {"base", "new"})
for k in order:
    b, n = t[k + ("base",)], t[k + ("new",)]
    f = lambda xs: "/".join("%.4g" % x for x in xs)
    ratio = statistics.median(n) / statistics.median(b) if b and n else float("nan")
    print(f"{k[0]:10} {k[1]:22} {k[2]:13} {f(b):>22} {f(n):>22} {ratio:.3f}")
    for v in variants:
        x = t[k + (v,)]
        if x and b:
            print(f"  {v}: {f(x)}, /base {statistics.median(x) / statistics.median(b):.3f}")
    # The targets: b64 throughput within 3% of the base; b1 not noticeably slower (5%).
    cost = ratio if k[2] == "ms_per_token" else 1 / ratio if ratio else float("inf")
    limit = 1.05 if k[2] == "ms_per_token" else 1.03
    print(f"{'PASS' if cost <= limit else 'FAIL'} {k[0]} {k[1]}: cost {cost:.3f} (limit {limit})")
    bad += not cost <= limit
sys.exit(1 if bad or not order else 0)
PY
verdict $? "throughput A/B (b64 within 3%, b1 within 5% of the base)"
echo "$fails check(s) failed"
[ "$fails" = 0 ]
