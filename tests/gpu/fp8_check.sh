#!/usr/bin/env bash
# Issue 34's FP8 on the GPU machine in one call (about 2 minutes of build, then about 6;
# PREBUILT_LIB=path takes a library of the same tree built before instead, BASE_LIB=path
# the base commit's library for the A/B of step 5):
#   bash tests/gpu/fp8_check.sh CARRY OUTDIR
# after `bash tests/gpu/fp8_carry.sh CARRY` here (CARRY default .carry/fp8). It
#   1. builds libgollm_cuda.so from cuda/ for sm_90 (nvcc, a source file a core);
#   2. runs the GPU Go tests: TestGPUFP8CheckpointsMatchTransformers (both FP8 fixtures,
#      fp16 and bf16, the arena's size proving the projections stayed FP8, logits within
#      2e-2/0.12 of transformers' dequantized float32 on prompt, decode, mixed steps and
#      graph-replayed greedy decoding), TestGPUQuantizeFP8MatchesCPU (quantization fp8
#      against the CPU engine on the same quantized weights, 2e-2),
#      TestGPUFP8RowCountsMatchCPU (cuBLASLt's block-scaled FP8 GEMMs at 16, 64, 256 and
#      1,024 rows, against the CPU engine, 2e-2: every shape of llama-fp8-tiny on
#      cuBLASLt; widths that are not multiples of 128 and per-channel scales on whichever
#      kernel the warm-up chose), TestGPUFP8FewRowsMatchCPU (steps of 1-8 rows: the
#      streaming gemv over FP8 weights and fp8_gemv_kernel, against the CPU engine) and the
#      dense families' test as a regression of the non-FP8 paths;
#   3. the austen demo's held-out perplexity: GPU FP8 within 2% of GPU fp16, fp16 within
#      2% of the CPU's float32; greedy agreement reported (TestGPUHeldOutPerplexityFP8);
#   4. tests/gpu/fp8_check.py: a 1024-wide FP8 checkpoint written by transformers'
#      quantizer, gollm against transformers on it (dequantized fp32, the W8A8 prompts'
#      inputs rounded as gollm rounds them: within 2e-2, greedy tokens; unrounded and
#      transformers' own FP8 path reported beside);
#   5. gpubench on the Llama-3.1-8B shape (random weights, quantization fp8), this tree's
#      library and BASE_LIB's alternating (ROUNDS, default 1): decode b1 (ms/token, target
#      <= 3.0), b64 and max load i128/o128 (tokens/s, target >= 28,000); fp16's max load
#      (target >= 14,000); each decode floor (weight bytes a step over the measured copy
#      bandwidth); OUTDIR/fp8-bench.jsonl in BENCH.md's format with "variant", the
#      medians and new/base ratios printed.
# FP8_TESTS_ONLY=1 stops after step 2 (about 5 minutes with the build), so that one call
# also fits tests/gpu/fp8probe.sh.
# Prints PASS/FAIL per check and a count; exits 1 on a failure. Logs in OUTDIR.
set -uo pipefail
source "$(dirname "$0")/checks.sh"
check_begin fp8 "${1:-.carry/fp8}" "$2"

# 1. The library (PREBUILT_LIB: one another check of the same tree built in this lease).
lib=$w/libgollm_cuda.so
check_library "$lib"
check_gpu

# 2. The GPU Go tests.
t0=$SECONDS
(cd "$root/bridge/cuda" && GOLLM_CUDA_LIB=$lib timeout 300 "$w/bin/cudatest" -test.count=1 -test.v \
  -test.run 'TestGPUFP8CheckpointsMatchTransformers|TestGPUQuantizeFP8MatchesCPU|TestGPUFP8RowCountsMatchCPU|TestGPUFP8FewRowsMatchCPU|TestGPUDenseFamiliesMatchTransformers' \
  > "$out/gotest.log" 2>&1)
echo "Go GPU tests: $((SECONDS - t0)) s"
grep -E '^(\s*--- |ok|FAIL|PASS|panic)|worst relative|warm-up GEMM|^gollm: cuBLASLt' "$out/gotest.log" | tail -40
for t in TestGPUFP8CheckpointsMatchTransformers TestGPUQuantizeFP8MatchesCPU TestGPUFP8RowCountsMatchCPU TestGPUFP8FewRowsMatchCPU \
  TestGPUDenseFamiliesMatchTransformers; do
  check "$t" "grep -q -- '^--- PASS: $t ' '$out/gotest.log'"
done

if [ "${FP8_TESTS_ONLY:-0}" = 1 ]; then
  echo "$((checks - fails)) passed, $fails failed (FP8_TESTS_ONLY: steps 3-5 left out)"
  for f in "${failed[@]}"; do echo "  failed: $f"; done
  [ "$fails" = 0 ]
  exit
fi

# 3. Perplexity on the austen demo's held-out text.
t0=$SECONDS
(cd "$root/demo/austen" && GOLLM_CUDA_LIB=$lib timeout 200 "$w/bin/austentest" -test.count=1 -test.v \
  -test.run 'TestGPUHeldOutPerplexityFP8|TestHeldOutPerplexityFP8' > "$out/austen.log" 2>&1)
echo "austen: $((SECONDS - t0)) s"
grep -E 'perplexity|agreement|^(--- |ok|FAIL)' "$out/austen.log"
check "TestGPUHeldOutPerplexityFP8 (FP8 within 2% of fp16 on the GPU)" "grep -q -- '^--- PASS: TestGPUHeldOutPerplexityFP8 ' '$out/austen.log'"
check "TestHeldOutPerplexityFP8 (CPU)" "grep -q -- '^--- PASS: TestHeldOutPerplexityFP8 ' '$out/austen.log'"

# 4. Against transformers on an FP8 checkpoint.
t0=$SECONDS
timeout 300 python3 "$root/tests/gpu/fp8_check.py" --bin "$w/bin/gollm-gpucheck" --lib "$lib" \
  --json "$out/fp8-check.jsonl" > "$out/fp8-check.log" 2>&1
rc=$?
grep -E '^(PASS|FAIL|INFO|transformers)' "$out/fp8-check.log"
echo "fp8_check.py: $((SECONDS - t0)) s"
check "fp8_check.py: gollm vs transformers on an FP8 checkpoint" "[ $rc = 0 ]"

# 5. The Llama-3.1-8B shape: this tree's library against BASE_LIB's (the base commit's),
#    alternating, ROUNDS times (default 1): FP8 decode b1, b64 and max load (1,024
#    requests of 128/128 offered at once, the overlap schedule, 1,024 sequences and 8,192
#    tokens a step at most: bench/maxload.sh's cell); then fp16's max load (this tree's
#    library: its fp16 path is the base's). Rows with "variant" (base or new) in
#    OUTDIR/fp8-bench.jsonl, the medians and the new/base ratios printed.
t0=$SECONDS
ck=$w/llama31-8b
mkdir -p "$ck"
cat > "$ck/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
 "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001}
JSON
day=$(date -u +%F)
rows=$out/fp8-bench.jsonl
rm -f "$rows"
# A base library of an older ABI needs its own gpubench: GPUBENCH_BASE names it.
bench() {  # LIB VARIANT QUANT WORKLOADS
  local gb=$w/bin/gpubench
  [ "$2" = base ] && [ -n "${GPUBENCH_BASE:-}" ] && gb=$GPUBENCH_BASE
  timeout "${BENCH_S:-170}" "$gb" -ckpt "$ck" -model llama3.1-8B -random-gb 20 -lib "$1" ${3:+-quantization $3} \
    -overlap -max-batch 1024 -max-num-tokens 8192 -workloads "$4" -reps 3 2>> "$out/gpubench-$2.err" |
    python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l); r = {"date": sys.argv[1], "commit": sys.argv[2], "machine": sys.argv[3], "variant": sys.argv[4], **r}; print(json.dumps(r))' \
      "$day" "$commit" "$machine" "$2" >> "$rows"
  check "gpubench llama3.1-8B ${3:-fp16} ($2)" "grep '\"variant\": \"$2\"' '$rows' | grep -q '\"dtype\": \"${3:-fp16}\"'"
}
fp8w=decode_b1_i128_o128,tput_b64_i128_o128,load_c0_n1024_i128_o128
for round in $(seq "${ROUNDS:-1}"); do
  [ -n "${BASE_LIB:-}" ] && bench "$BASE_LIB" base fp8 "$fp8w"
  bench "$lib" new fp8 "$fp8w"
done
bench "$lib" new "" load_c0_n1024_i128_o128
tail -3 "$out"/gpubench-*.err
# The floors: the bytes a decode step reads (every weight but the embedding table; FP8's
# projections a byte and their scales) over the copy bandwidth measured here.
python3 - "$rows" "$day" "$commit" "$machine" <<'PY'
import json, sys, torch
rows, day, commit, machine = sys.argv[1:5]
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): y.copy_(x)
e.record(); torch.cuda.synchronize()
bw = 2 * 10 * x.numel() / (s.elapsed_time(e) / 1e3)
V, H, L, I, KV = 128256, 4096, 32, 14336, 8 * 128
proj = L * (H * (H + 2 * KV) + H * H + 3 * I * H)
head = V * H
scales = L * ((H + 2 * KV) * (H // 128) + H * (H // 128) + 2 * I * (H // 128) + H * (I // 128)) * 4
out = open(rows, "a")
for dt, b in (("fp16", 2 * proj + 2 * head), ("fp8", proj + scales + 2 * head)):
    out.write(json.dumps({"date": day, "commit": commit, "machine": machine, "model": "llama3.1-8B", "dtype": dt,
                          "workload": "decode_b1_i128_o128", "impl": "floor", "metric": "ms_per_token",
                          "value": round(b / bw * 1e3, 3), "bytes": b, "copy_gb_per_s": round(bw / 1e9, 1)}) + "\n")
print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
PY
echo "bench: $((SECONDS - t0)) s"
python3 - "$rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cells = {}
for r in rows:
    if r.get("impl") == "floor":
        print(f"floor  {r['dtype']:5} {r['workload']:26} {r['value']} ms/token")
        continue
    cells.setdefault((r["dtype"], r["workload"], r["metric"]), {}).setdefault(r.get("variant", "new"), []).append(r["value"])
print(f"{'dtype':5} {'workload':26} {'metric':13} {'base':>10} {'new':>10} {'new/base':>8}")
for (dt, wl, m), v in sorted(cells.items()):
    b = statistics.median(v["base"]) if "base" in v else None
    n = statistics.median(v["new"]) if "new" in v else None
    ratio = f"{n / b:8.3f}" if b and n else ""
    print(f"{dt:5} {wl:26} {m:13} {b if b is not None else '':>10.6} {n if n is not None else '':>10.6} {ratio}")
def new(dt, wl, m):
    v = cells.get((dt, wl, m), {}).get("new")
    return statistics.median(v) if v else None
d = new("fp8", "decode_b1_i128_o128", "ms_per_token")
if d is not None:
    print(f"{'PASS' if d <= 3.0 else 'MISS'} target: Llama-3.1-8B shape FP8 decode b1 {d:.3f} ms/token (target <= 3.0)")
for dt, target in (("fp8", 28000), ("fp16", 14000)):
    ml = [new(dt, wl, m) for (x, wl, m) in cells if x == dt and wl.startswith("maxload") and m == "tokens_per_s"]
    ml = [v for v in ml if v is not None]
    if ml:
        print(f"{'PASS' if ml[0] >= target else 'MISS'} target: Llama-3.1-8B shape {dt} max load i128/o128 {ml[0]:.0f} tokens/s (target >= {target})")
PY

check_end
