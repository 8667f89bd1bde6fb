#!/usr/bin/env bash
# The GPU engine's FP8 KV cache (issue 34, kv_cache_dtype fp8) on the GPU machine (about 3
# minutes of build, up to 5 of tests, 4 of benchmark: two calls where one must stay under
# ten minutes — SKIP_BENCH=1 first, then PREBUILT_LIB and SKIP_TESTS=1; PREBUILT_LIB=path
# takes a library of the same tree built before instead — /tmp/gollm-fp8kv/libgollm_cuda.so
# is this script's, kept by a warm machine, so that a second call can run what
# SKIP_TESTS=1 or SKIP_BENCH=1 left out of the first):
#   bash tests/gpu/fp8kv_check.sh CARRY OUTDIR
# after `bash tests/gpu/fp8kv_carry.sh CARRY` here (CARRY default .carry/fp8kv). It
#   1. builds libgollm_cuda.so from cuda/ for sm_90 (tests/gpu/build_lib.sh);
#   2. runs the FP8 KV cache's GPU tests: TestGPUFP8KVCacheMatchesCPU (six models — the
#      WMMA, mma.sync and CUDA-core context kernels, the per-head and grouped decode
#      kernels, heads of 8 to 256 —, fp16 and bf16, batch 1 and 40, against the CPU
#      engine's FP8 pool with the same scales), TestGPUFP8KVCacheDoublesTheBlocks,
#      TestGPUFP8KVCacheCopiesBlocks, TestGPUFP8KVCacheTensorParallel (TP 2 with 2 GPUs,
#      else the tensor-parallel path over one), and, as the auto pool's regression, the
#      GPU tests whose steps run attention (families against transformers, batch
#      invariance bitwise, few-row decode, large batches, block copies and beams, prompt
#      graphs, speculation's chained rows, experts); OUTDIR/gotest.log;
#   3. the austen demo's held-out perplexity on the GPU with an FP8 KV pool within 2% of
#      the auto pool's (TestGPUHeldOutPerplexityFP8KV); OUTDIR/austen.log;
#   4. gpubench on the Llama-2-7B shape (random fp16 weights), the auto pool and the FP8
#      pool alternating (ROUNDS, default 1): decode b1 i128 o128 (ms/token), b64 and b192
#      i128 o128 (tokens/s; b192 is the largest static batch whose auto pool — twice its
#      sequences' blocks, as gpubench sizes it — fits 80 GB beside the weights); with
#      BENCH_LOAD=1 also max load (1,024 requests of 128/128 at once, the pool from 90% of
#      the free memory); rows in BENCH.md's format with "variant" (auto, fp8) in
#      OUTDIR/fp8kv-bench.jsonl, the medians and fp8/auto printed.
# Prints PASS/FAIL per check and a count; exits 1 on a failure. Stage limits: TEST_S
# (default 240), BENCH_S (default 120 a gpubench run); SKIP_TESTS=1, SKIP_BENCH=1.
set -uo pipefail
source "$(dirname "$0")/checks.sh"
check_begin fp8kv "${1:-.carry/fp8kv}" "$2"

# 1. The library (PREBUILT_LIB: one of the same tree built before in this lease — this
# script's own path below, which a warm machine keeps).
lib=$w/libgollm_cuda.so
check_library "$lib"
check_gpu

# 2. The GPU Go tests: the FP8 KV cache's, then the auto pool's attention paths.
if [ -z "${SKIP_TESTS:-}" ]; then
  mine='TestGPUFP8KVCacheMatchesCPU|TestGPUFP8KVCacheDoublesTheBlocks|TestGPUFP8KVCacheCopiesBlocks|TestGPUFP8KVCacheTensorParallel'
  auto='TestGPUDenseFamiliesMatchTransformers|TestGPUBatchInvariance|TestGPUFewRowDecodeMatchesTheInvariantPath|TestGPULargeBatchMatchesCPU|TestGPUBlockCopiesForkASequence|TestGPUBeamSearch$|TestGPUPromptGraphsGiveTheSameTokens|TestGPUVerifyRowsMatchOneTokenSteps|TestGPUSpeculationKeepsGreedyOutput|TestGPUExpertsMatchTransformers|TestGPUFP8CheckpointsMatchTransformers'
  t0=$SECONDS
  (cd "$root/bridge/cuda" && GOLLM_CUDA_LIB=$lib timeout "${TEST_S:-240}" "$w/bin/cudatest" -test.count=1 -test.v \
    -test.run "$mine|$auto" > "$out/gotest.log" 2>&1)
  echo "Go GPU tests: $((SECONDS - t0)) s"
  grep -E '^(\s*--- FAIL|--- |ok|FAIL|PASS|panic)|worst relative L2 from the CPU' "$out/gotest.log" | tail -80
  for t in $(echo "$mine|$auto" | tr '|' ' ' | tr -d '$'); do
    check "$t" "grep -q -- '^--- PASS: $t ' '$out/gotest.log'"
  done

  # 3. Perplexity on the austen demo's held-out text.
  t0=$SECONDS
  (cd "$root/demo/austen" && GOLLM_CUDA_LIB=$lib timeout 120 "$w/bin/austentest" -test.count=1 -test.v \
    -test.run 'TestGPUHeldOutPerplexityFP8KV' > "$out/austen.log" 2>&1)
  echo "austen: $((SECONDS - t0)) s"
  grep -E 'perplexity|agreement|^(--- |ok|FAIL)' "$out/austen.log"
  check "TestGPUHeldOutPerplexityFP8KV (FP8 KV within 2% of auto on the GPU)" "grep -q -- '^--- PASS: TestGPUHeldOutPerplexityFP8KV ' '$out/austen.log'"
fi

# 4. The Llama-2-7B shape, auto and FP8 pools alternating.
if [ -z "${SKIP_BENCH:-}" ]; then
  t0=$SECONDS
  ck=$w/llama2-7b
  mkdir -p "$ck"
  cat > "$ck/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096,
 "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
 "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2}
JSON
  day=$(date -u +%F)
  rows=$out/fp8kv-bench.jsonl
  rm -f "$rows"
  bench() {  # KV WORKLOADS [FLAGS...]
    local kv=$1 wl=$2
    shift 2
    timeout "${BENCH_S:-120}" "$w/bin/gpubench" -ckpt "$ck" -model llama2-7B -random-gb 16 -lib "$lib" \
      -kv-cache-dtype "$kv" -workloads "$wl" -reps 3 "$@" 2>> "$out/gpubench-$kv.err" |
      python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l); r = {"date": sys.argv[1], "commit": sys.argv[2], "machine": sys.argv[3], "variant": sys.argv[4], "kv_cache_dtype": sys.argv[4], **r}; print(json.dumps(r))' \
        "$day" "$commit" "$machine" "$kv" >> "$rows"
    check "gpubench llama2-7B kv $kv: $wl" "grep '\"variant\": \"$kv\"' '$rows' | grep -q '\"workload\": \"${wl%%,*}\"'"
  }
  static=decode_b1_i128_o128,tput_b64_i128_o128,tput_b192_i128_o128
  for round in $(seq "${ROUNDS:-1}"); do
    if [ $((round % 2)) = 1 ]; then order="auto fp8"; else order="fp8 auto"; fi
    for kv in $order; do bench "$kv" "$static"; done
  done
  if [ -n "${BENCH_LOAD:-}" ]; then
    for kv in auto fp8; do
      bench "$kv" load_c0_n1024_i128_o128 -overlap -max-batch 1024 -max-num-tokens 8192 -kv-fraction 0.9
    done
  fi
  grep -h 'KV pool' "$out"/gpubench-*.err | tail -6
  echo "bench: $((SECONDS - t0)) s"
  python3 - "$rows" <<'PY'
import json, statistics, sys
cells = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    cells.setdefault((r["workload"], r["metric"]), {}).setdefault(r["variant"], []).append(r["value"])
print(f"{'workload':28} {'metric':14} {'auto':>10} {'fp8':>10} {'fp8/auto':>8}")
for (wl, m), v in sorted(cells.items()):
    a = statistics.median(v["auto"]) if "auto" in v else None
    f = statistics.median(v["fp8"]) if "fp8" in v else None
    ratio = f"{f / a:8.3f}" if a and f else ""
    print(f"{wl:28} {m:14} {a if a is not None else '':>10.6} {f if f is not None else '':>10.6} {ratio}")
PY
fi

check_end
