#!/usr/bin/env bash
# Issue 35's GPU targets in one call on the GPU machine, KIND_GPU throughout:
#  0. with the bridge/cuda test binary carried (cudatest): the GPU Go tests of guided
#     decoding — masks and min-p, late masks against Step, the late masks' order, guided
#     requests pipelined against unpipelined;
#  1. the masks' cost at batch 64: gpubench's serve_ and guided_ workloads (every request
#     under a regex constraint, so each generates all its tokens) on a random GPT-2 124M
#     checkpoint with GPT-2's real tokenizer, unpipelined and under the overlap schedule
#     (-overlap: guided steps' masks made while the forward pass runs), the four runs
#     alternating, two rounds; the target (≤ 5% of the step) holds for the pipelined pair;
#  2. tritonserver serving that checkpoint and the austen demo, gollm-openai in front:
#     abload's same greedy streaming requests straight to Triton's gRPC and through
#     gollm-openai, alternating, at concurrency 64;
#  3. the official openai package's 100 sampled json_schema answers from the austen model
#     (tests/openai/test_openai.py's StructuredOutputs test), each validated.
#   GOLLM_CUDA_LIB=build/libgollm_cuda.so bash tests/gpu/guided_gpu.sh CARRY OUTDIR [BINDIR]
# CARRY holds tritonserver.tar.xz and bins.tar.xz (or BINDIR the files) with
# libtriton_gollm.so, gpubench, gollm-openai, abload, GPT-2's tokenizer.json and optionally
# cudatest (tests/gpu/guided_carry.sh packs them); the CUDA library is
# $GOLLM_CUDA_LIB, else BINDIR's. The openai and jsonschema wheels (Python 3.12) come
# from the checkout's .whl/ (or $WHL_DIR). Rows (BENCH.md's format, COMMIT and MACHINE from the
# environment) go to OUTDIR/guided-gpu.jsonl; PASS/FAIL lines to stdout.
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/bench/device.sh"
device_unpack guided "$carry"
bin=${3:-$w/bin}
lib=${GOLLM_CUDA_LIB:-$bin/libgollm_cuda.so}
cp "$bin/libtriton_gollm.so" "$w/backends/gollm/" && cp "$lib" "$w/backends/gollm/libgollm_cuda.so"
mkdir -p "$out"
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
today=$(date -u +%F)
machine=${MACHINE:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)}

# The GPT-2 124M shape with random weights (bench/gpu_peers.py's) and GPT-2's real
# tokenizer (the one `make demo` writes), carried beside the binaries.
write_checkpoint gpt2-124M > /dev/null 2>&1 && cp "$bin/tokenizer.json" "$w/gpt2-124M/" || { fail "checkpoint"; exit 1; }
ln -s "$w/gpt2-124M" "$w/gpt2"
export GOLLM_CUDA_LIB="$lib"

# 0. The GPU Go tests of guided decoding.
if [ -x "$bin/cudatest" ]; then
  (cd "$root/bridge/cuda" && timeout 300 "$bin/cudatest" -test.count=1 -test.v \
    -test.run 'TestGPUAllowedAndMinP|TestGPUGuided|TestGPULateMasks' > "$out/guided-gotest.log" 2>&1) \
    && ! grep -q -- '--- SKIP' "$out/guided-gotest.log" \
    && pass "GPU Go tests of guided decoding (late masks = Step, pipelined = unpipelined)" \
    || { fail "GPU Go tests of guided decoding"; grep -E '^(---|ok|FAIL|panic)|_test.go' "$out/guided-gotest.log" | head -30; }
  grep -E '^(---|ok|FAIL)' "$out/guided-gotest.log"
fi

# 1. Masks at batch 64, unpipelined and pipelined, the four runs alternating.
for round in 1 2; do
  for ov in "" -overlap; do
    for wl in serve_b64_i128_o128 guided_b64_i128_o128; do
      "$bin/gpubench" -ckpt "$w/gpt2" -model gpt2-124M -workloads "$wl" -reps 3 $ov \
        -guide-regex '[a-zA-Z ,.;:!?]*' 2>> "$out/gpubench.log" | tag_rows round "$round" >> "$out/mask.jsonl"
    done
  done
done
if python3 - "$out/mask.jsonl" "$today" "${COMMIT:-unknown}" "$machine" >> "$out/guided-gpu.jsonl" <<'PY'; then pass "mask cost at b64 ≤ 5% (pipelined)"; else fail "mask cost at b64 ≤ 5% (pipelined; or no rows: $out/gpubench.log)"; fi
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    pipelined = r["impl"].endswith("-overlap")
    by.setdefault((pipelined, r["workload"].split("_")[0]), []).append(r["value"])
ok = True
for pipelined in (False, True):
    serve, guided = by.get((pipelined, "serve")), by.get((pipelined, "guided"))
    if not serve or not guided:
        print(f"no rows for the {'pipelined' if pipelined else 'unpipelined'} pair", file=sys.stderr)
        ok = False
        continue
    s, g = statistics.median(serve), statistics.median(guided)
    cost = 1 - g / s
    impl = "gollm-gpu-overlap" if pipelined else "gollm-gpu"
    print(json.dumps({"date": sys.argv[2], "commit": sys.argv[3], "machine": sys.argv[4], "model": "gpt2-124M",
                      "dtype": "float16", "workload": "mask_cost_b64_i128_o128", "impl": impl, "metric": "share_of_step",
                      "value": round(cost, 4), "note": f"1 - guided/serve tokens/s at batch 64{', overlap schedule' if pipelined else ''}, "
                      f"medians of {len(serve)} and {len(guided)} runs alternating (serve {s:.0f}, guided {g:.0f} tokens/s: "
                      f"{64e3 / s:.3f} and {64e3 / g:.3f} ms a step); regex [a-zA-Z ,.;:!?]* over GPT-2's vocabulary"}))
    print(f"mask cost at b64, {'pipelined' if pipelined else 'unpipelined'}: {cost:.3%} "
          f"(serve {s:.0f}, guided {g:.0f} tokens/s)", file=sys.stderr)
    if pipelined:
        ok = ok and cost <= 0.05
sys.exit(0 if ok else 1)
PY

# 2. and 3. through tritonserver.
gpt2_model gpt2 "$w/gpt2" KIND_GPU kv_cache_free_gpu_mem_fraction 0.3
mkdir -p "$w/repo/austen"
cp -r "$root/model_repository/austen/1" "$w/repo/austen/"
sed -e "s/kind: KIND_CPU/kind: KIND_GPU/" "$root/model_repository/austen/config.pbtxt" > "$w/repo/austen/config.pbtxt"
printf 'parameters { key: "kv_cache_free_gpu_mem_fraction" value: { string_value: "0.3" } }\n' >> "$w/repo/austen/config.pbtxt"
grep -q KIND_GPU "$w/repo/austen/config.pbtxt" || fail "austen config has no KIND_GPU instance"
triton_start "$out/tritonserver.log" || { fail "tritonserver start"; exit 1; }
"$bin/gollm-openai" -triton 127.0.0.1:8001 -listen 127.0.0.1:9000 -model-repository "$w/repo" > "$out/openai.log" 2>&1 &
api=$!
for _ in $(seq 30); do curl -sf localhost:9000/health > /dev/null && break; sleep 1; done
"$bin/abload" -triton 127.0.0.1:8001 -openai http://127.0.0.1:9000 -model gpt2 -concurrency 64 \
  -requests 512 -rounds "${ROUNDS:-4}" -max-tokens 64 -openai-pid "$api" -triton-pid "$triton_pid" \
  > "$out/abload.jsonl" 2> "$out/abload.log" || fail "abload"
tail -8 "$out/abload.log"
python3 "$root/bench/openai/summarize.py" "$out" "${COMMIT:-unknown}" 64 64 2> "$out/openai.txt" |
  python3 -c 'import json, sys
for l in sys.stdin:
    r = json.loads(l)
    r.update(machine=sys.argv[1] + " (host: " + r["machine"] + ")", model="gpt2-124M", dtype="float16",
             note="KIND_GPU, random weights; the same greedy streaming requests to Triton gRPC and through gollm-openai, alternating")
    print(json.dumps(r))' "$machine" > "$out/openai-rows.jsonl"
cat "$out/openai.txt"
python3 - "$out/openai-rows.jsonl" <<'PY' && pass "gollm-openai ≥ 0.95× Triton gRPC tokens/s at c=64" || fail "gollm-openai ≥ 0.95× Triton gRPC tokens/s at c=64"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v = {r["impl"]: r["value"] for r in rows if r["metric"] == "tokens_per_s"}
ratio = v["gollm-openai"] / v["gollm-triton-grpc"]
print(f"gollm-openai / Triton gRPC tokens/s at c=64: {ratio:.3f}")
sys.exit(0 if ratio >= 0.95 else 1)
PY

site=/tmp/gollm-guided-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${WHL_DIR:-$root/.whl}"/*.whl > "$out/pip.log" 2>&1 || fail "wheels"
(cd "$root/tests/openai" && PYTHONPATH="$site" GOLLM_OPENAI_URL=http://127.0.0.1:9000/v1 GOLLM_METRICS_URL=http://127.0.0.1:8002/metrics \
  GOLLM_MODEL=gpt2 GOLLM_CHAT_MODEL=gpt2 GOLLM_AUSTEN_MODEL=austen GOLLM_INTERVAL_MODEL=gpt2 GOLLM_TOOL_MODELS=hermes=austen \
  timeout 300 python3 -m unittest -v test_openai.StructuredOutputs > "$out/structured.log" 2>&1) \
  && pass "openai StructuredOutputs on KIND_GPU (100/100 json_schema answers validate)" \
  || { fail "openai StructuredOutputs on KIND_GPU"; tail -30 "$out/structured.log"; }
grep -q "engine step failed" "$out/tritonserver.log" && fail "a step failed in tritonserver's log"
kill "$api"; wait "$api"
triton_stop "$out/tritonserver.log"
cat "$out/openai-rows.jsonl" >> "$out/guided-gpu.jsonl"
echo "guided_gpu: $fails failed"
exit $((fails > 0))
