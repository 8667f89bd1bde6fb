#!/usr/bin/env bash
# Issue 34, item 3: the Blas path's GEMMs on cuBLASLt with algorithms timed per shape
# (cuda/blaslt.h), checked on the GPU machine in one call (about 7 minutes with
# PREBUILT_LIB; building the library here adds about 3):
#   PREBUILT_LIB=/path/libgollm_cuda.so [BASE_LIB=/path/base.so] \
#     bash tests/gpu/blaslt_check.sh CARRY OUTDIR
# after `bash tests/gpu/blaslt_carry.sh CARRY` here (CARRY default .carry/blaslt). It
#   1. takes PREBUILT_LIB (this tree's library, tests/gpu/build_lib.sh) or builds it;
#   2. builds and runs bench/gemmbench: the projection shapes of Llama-2-7B, Llama-3.1-8B,
#      TinyLlama, Qwen3-8B and Gemma-3-4B at 16..1024 rows, cublasGemmEx's default
#      against the tuned cuBLASLt, beside the operand bytes' floor (OUTDIR/gemmbench.jsonl);
#   3. runs the GPU Go tests that take the Blas path: TestGPUBlasLtMatchesCPU (cuBLASLt and
#      NoBLASLt against the CPU engine), TestGPULargeBatchMatchesCPU, the dense families
#      against transformers, prompt graphs, two engines in one process, the overlap
#      schedule (a test that skips counts as a failure: engine creation failing skips);
#   4. A/B with gpubench, tput_b64_i128_o128 on llama2-7B and tinyllama-1.1B (fp16) and
#      qwen3-8B (bf16), random weights: BASE_LIB (with the carried gpubench of its commit)
#      against this library, or, without BASE_LIB, this library with GOLLM_CUDA_BLASLT=0
#      (cublasGemmEx) against its default; ROUNDS (default 1) rounds, the order alternating
#      run by run, none started past BUDGET_S (480) seconds into the call; rows in
#      OUTDIR/blaslt-ab.jsonl with "variant", medians and ratios printed.
# Prints PASS/FAIL per check and a count; exits 1 on a failure. Logs in OUTDIR.
set -uo pipefail
source "$(dirname "$0")/checks.sh"
check_begin blaslt "${1:-.carry/blaslt}" "$2"
base_commit=$(cat "$w/bin/base_commit")
echo "base $base_commit"
T0=$SECONDS

# 1. The library.
lib=$w/libgollm_cuda.so
check_library "$lib"
check_gpu
day=$(date -u +%F)

# 2. The micro-benchmark.
t0=$SECONDS
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2> /dev/null)
cublas=$(ls "${cublas_dir:-/nonexistent}/libcublas.so.13" /usr/local/cuda/lib64/libcublas.so.13 \
  /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13 2> /dev/null | head -1)
"$nvcc" -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I"$root/cuda" "$root/bench/gemmbench/gemmbench.cu" \
  "$root/cuda/blaslt.cu" -o "$w/gemmbench" -Xlinker="$cublas" -Xlinker="${cublas%/*}/libcublasLt.so.13" \
  > "$out/gemmbench-build.log" 2>&1
rc=$?
check "gemmbench builds ($((SECONDS - t0)) s)" "[ $rc = 0 ]"
if [ $rc = 0 ]; then
  rm -f "$out/gemmbench.jsonl"
  timeout 150 "$w/gemmbench" -commit "$commit" -out "$out/gemmbench.jsonl" > "$out/gemmbench.txt" 2>&1
  rc=$?
  cat "$out/gemmbench.txt"
  check "gemmbench runs ($((SECONDS - t0)) s)" "[ $rc = 0 ]"
  # A decode step's projections (every layer's four, the LM head once) per impl.
  python3 - "$out/gemmbench.jsonl" <<'PY'
import collections, json, sys
layers = {"llama2-7B": 32, "llama3.1-8B": 32, "tinyllama-1.1B": 22, "qwen3-8B": 36, "gemma3-4B": 34}
t = collections.defaultdict(float)
for l in open(sys.argv[1]):
    r = json.loads(l)
    proj, m = r["workload"].split("_m")[0][5:], int(r["workload"].split("_m")[1].split("_")[0])
    t[(r["model"], m, r["impl"])] += r["value"] * (1 if proj == "lm_head" else layers[r["model"]])
print("a step's projection GEMMs, ms (all layers):")
print(f"{'model':15} {'rows':>5} {'gemmex':>8} {'heur':>8} {'tuned':>8} {'floor':>8} {'tuned/gemmex':>13}")
for (m, rows) in sorted({k[:2] for k in t}):
    g, h, b, f = (t[(m, rows, i)] / 1e3 for i in ("cublas-gemmex", "cublaslt-heuristic", "gollm-blaslt", "floor"))
    print(f"{m:15} {rows:5} {g:8.3f} {h:8.3f} {b:8.3f} {f:8.3f} {b / g:13.3f}")
PY
else
  tail -20 "$out/gemmbench-build.log"
fi

# 3. The GPU Go tests of the Blas path.
t0=$SECONDS
tests='TestGPUBlasLtMatchesCPU|TestGPUDenseFamiliesMatchTransformers|TestGPUPromptGraphsGiveTheSameTokens|TestGPUEnginesOfTwoModelsInOneProcess|TestGPUOverlapScheduleGivesTheSameTokens'
rm -f "$out/gotest.log"
# The large-batch test on its LLaMA-3 shape only (GPT-2's takes the same GEMM code).
for run in "^($tests)\$" 'TestGPULargeBatchMatchesCPU/llama3-tiny'; do
  (cd "$root/bridge/cuda" && GOLLM_CUDA_LIB=$lib timeout "${TEST_S:-150}" "$w/bin/cudatest" -test.count=1 -test.v \
    -test.run "$run" >> "$out/gotest.log" 2>&1)
done
tests="$tests|TestGPULargeBatchMatchesCPU"
echo "Go GPU tests: $((SECONDS - t0)) s"
grep -E '^(\s*--- |ok|FAIL|PASS|panic)|warm-up:|worst relative' "$out/gotest.log" | tail -60
for t in ${tests//|/ }; do
  check "$t" "grep -q -- '^--- PASS: $t ' '$out/gotest.log'"
done
check "no GPU test skipped" "! grep -q -- '--- SKIP' '$out/gotest.log'"

# 4. A/B with gpubench.
t0=$SECONDS
ck=$w/ckpt
mkdir -p "$ck"
python3 "$root/bench/moe_peers.py" --write-configs "$ck" --models llama2-7B,tinyllama-1.1B,qwen3-8B
if [ -n "${BASE_LIB:-}" ]; then
  cp "$BASE_LIB" "$w/base.so"
  A=base B=blaslt
else
  A=gemmex B=blaslt
fi
rows=$out/blaslt-ab.jsonl
rm -f "$rows"
# bench VARIANT MODEL DTYPE: one gpubench run, its rows tagged.
bench() {
  local v=$1 m=$2 dt=$3 gb=$w/bin/gpubench l=$lib envs=()
  case $v in
    base) gb=$w/bin/gpubench_base l=$w/base.so ;;
    gemmex) envs=(GOLLM_CUDA_BLASLT=0) ;;
  esac
  env "${envs[@]}" timeout "${STAGE_S:-100}" "$gb" -ckpt "$ck/$m" -model "$m" -dtype "$dt" -random-gb 20 -lib "$l" \
    -workloads tput_b64_i128_o128 -reps "${REPS:-2}" 2>> "$out/gpubench-$v.err" |
    python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l)
    r = {"date": sys.argv[1], "commit": sys.argv[2] if sys.argv[4] != "base" else sys.argv[3], "machine": sys.argv[5], **r,
         "variant": sys.argv[4], "note": "tests/gpu/blaslt_check.sh: gpubench, random weights; variant base = the base commit'"'"'s library, gemmex = GOLLM_CUDA_BLASLT=0, blaslt = cuBLASLt tuned per shape"}
    print(json.dumps(r))' "$day" "$commit" "$base_commit" "$v" "$machine" >> "$rows"
}
i=0
for round in $(seq "${ROUNDS:-1}"); do
  for m in llama2-7B:float16 tinyllama-1.1B:float16 qwen3-8B:bfloat16; do
    # The order alternates run by run, so that neither variant always goes first.
    i=$((i + 1))
    if [ $((i % 2)) = 1 ]; then order="$A $B"; else order="$B $A"; fi
    for v in $order; do
      # The call's limit: no run starts past BUDGET_S (default 480) seconds.
      if [ $((SECONDS - T0)) -gt "${BUDGET_S:-480}" ]; then echo "budget spent: ${m%%:*} $v not run"; continue; fi
      echo "[$((SECONDS - T0)) s] round $round ${m%%:*} $v"
      bench "$v" "${m%%:*}" "${m#*:}"
    done
  done
done
grep -h "warm-up" "$out"/gpubench-*.err | tail -12
echo "A/B: $((SECONDS - t0)) s"
python3 - "$rows" "$A" "$B" <<'PY'
import collections, json, statistics, sys
rows, A, B = sys.argv[1], sys.argv[2], sys.argv[3]
t = collections.defaultdict(list)
for l in open(rows):
    r = json.loads(l)
    t[(r["model"], r["workload"], r["variant"])].append(r["value"])
keys = sorted({k[:2] for k in t})
print(f"{'model':16} {'workload':20} {A + ' tok/s':>14} {B + ' tok/s':>14} {'ratio':>7}")
for m, wl in keys:
    a, b = t.get((m, wl, A)), t.get((m, wl, B))
    if not a or not b:
        print(f"{m:16} {wl:20} {'-' if not a else statistics.median(a):>14} {'-' if not b else statistics.median(b):>14}")
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{m:16} {wl:20} {ma:14.1f} {mb:14.1f} {mb / ma:7.3f}   ({'/'.join('%.0f' % x for x in a)} vs {'/'.join('%.0f' % x for x in b)})")
PY
check "gpubench rows for both variants" "grep -q '\"variant\": \"$A\"' '$rows' && grep -q '\"variant\": \"$B\"' '$rows'"

echo "total $((SECONDS - T0)) s"
check_end
