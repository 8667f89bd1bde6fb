#!/usr/bin/env bash
# Issue 34's large batches and max load on one H100/H200, in one call: about 2 minutes of
# library build, then about 5 of checks and benchmark; the benchmark's stages share what
# is left of TOTAL_S seconds (default 570, under the device call's 10 minutes).
#   bash tests/gpu/maxload_check.sh CARRY OUTDIR
# after tests/gpu/maxload_carry.sh here (CARRY = .carry/maxload: bins.tar.xz with cudatest,
# gpubench, tritonbench, libtriton_gollm.so; tritonserver.tar.xz). Prints PASS or FAIL for
# each check and a count; exits 1 when a check failed. The issue's speed targets are
# printed as TARGET lines (met or missed, with the figure) and do not fail the script.
# In order:
#   build    libgollm_cuda.so of this tree's cuda/ for sm_90 (nvcc a file on every core),
#            while transformers writes the random fp16 checkpoints (Llama-3.1-8B,
#            Llama-2-7B, TinyLlama-1.1B shapes) in the background
#   gotest   TestGPULargeBatchMatchesCPU (steps of 256 and 1,024 rows — decode graphs of
#            those buckets — against the float32 CPU engine, GPT-2 and LLaMA-3 fixtures, fp16
#            and bf16) and TestGPULaunchFeedsTheSampledToken (the overlap schedule's feed)
#   engine   bench/maxload.sh, engine alone through the batch manager: Llama-3.1-8B
#            i128/o128 at max load (1,024 requests at once) and concurrency 64; Llama-2-7B
#            at max load and tput_b64_i128_o128; TinyLlama tput_b64_i128_o128 (gpubench)
#   triton   Llama-3.1-8B i128/o128 at max load through tritonserver (tritonbench, 8
#            connections, max_batch_size 1,024): the rows, the server's
#            gollm_sequences_per_iteration_max above 64, every KV block free afterwards
# OUTDIR gets maxload.jsonl (BENCH.md rows) and .svg, the logs and the server's metrics.
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
w=/tmp/gollm-maxload
bin=$w/bin
rm -rf "$bin" && mkdir -p "$bin" "$w/ckpt" "$w/lib"
tar xJf "$carry/bins.tar.xz" -C "$bin" || { echo "FAIL unpack $carry/bins.tar.xz"; exit 1; }
[ -f "$carry/tritonserver.tar.xz" ] && ln -sf "$carry/tritonserver.tar.xz" "$bin/"
source "$root/tests/gpu/env.sh"
fails=0 checks=0
pass() { echo "PASS $1"; checks=$((checks + 1)); }
fail() { echo "FAIL $1"; checks=$((checks + 1)); fails=$((fails + 1)); }
echo "== carry: $(tr '\n' ' ' < "$bin/commit")"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

echo "== checkpoints (background) and build"
t0=$SECONDS
python3 - "$root/bench" "$w/ckpt" llama3.1-8B llama2-7B tinyllama-1.1B > "$out/checkpoints.log" 2>&1 <<'PY' &
import sys, time
sys.path.insert(0, sys.argv[1])
import gpu_peers
for name in sys.argv[3:]:
    t = time.time()
    gpu_peers.make_checkpoint(sys.argv[2], name)
    print(f"{name}: {time.time() - t:.0f} s", flush=True)
PY
ckpid=$!
lib=$bin/libgollm_cuda.so
# A warm machine keeps the library of the same sources from the call before.
sum=$(cat "$root"/cuda/* 2> /dev/null | sha1sum | cut -c1-12)
if [ -f "$w/lib/$sum.so" ]; then
  cp "$w/lib/$sum.so" "$lib"
  pass "build: libgollm_cuda.so of these sources from the call before ($sum)"
elif bash "$root/tests/gpu/build_lib.sh" "$lib" > "$out/build.log" 2>&1; then
  cp "$lib" "$w/lib/$sum.so"
  pass "build: libgollm_cuda.so in $((SECONDS - t0)) s"
else
  fail "build: libgollm_cuda.so (the end of $out/build.log follows)"
  tail -20 "$out/build.log"
fi
if [ ! -f "$lib" ]; then
  kill "$ckpid" 2> /dev/null
  echo "$checks checks, $fails failed"
  exit 1
fi

echo "== gotest"
(cd "$root/bridge/cuda" && GOLLM_CUDA_LIB="$lib" timeout "${GOTEST_S:-150}" "$bin/cudatest" \
  -test.run 'TestGPULargeBatchMatchesCPU|TestGPULaunchFeedsTheSampledToken' -test.v -test.count=1 > "$out/gotest.log" 2>&1)
rc=$?
grep -E '^\s*--- (PASS|FAIL|SKIP)' "$out/gotest.log" | sed -E 's/^(\s*)--- (PASS|FAIL|SKIP): /\2 gotest: \1/'
grep -E '_test\.go:[0-9]+: ' "$out/gotest.log" | head -40 | sed 's/^/    /'
[ $rc -eq 0 ] && pass "gotest: exit 0" || { fail "gotest: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')"; tail -15 "$out/gotest.log"; }
n=$(grep -cE '^\s*--- FAIL' "$out/gotest.log")
[ "$n" -gt 0 ] && fail "gotest: $n tests failed"
n=$(grep -cE '^\s*--- SKIP' "$out/gotest.log")
[ "$n" -gt 0 ] && fail "gotest: $n skipped (no library or GPU found: the reasons are in $out/gotest.log)"

echo "== checkpoints"
if wait "$ckpid"; then pass "checkpoints written ($(tr '\n' ' ' < "$out/checkpoints.log"))"; else
  fail "checkpoints (the end of $out/checkpoints.log follows)"
  tail -15 "$out/checkpoints.log"
fi

echo "== engine and tritonserver"
# What is left of TOTAL_S (the call's limit, less a margin) is shared: 8B 55%, 7B 25%,
# TinyLlama the rest; each stage stops at its share, keeping the cells done.
left=$(( ${TOTAL_S:-570} - SECONDS ))
[ "$left" -lt 120 ] && left=120
echo "   $left s left for the benchmark"
# bench/maxload.sh appends to $out/maxload.jsonl; its binaries and library from $bin.
CKPTS=$w/ckpt SHAPES=llama3.1-8B IO=128/128 CONC="max 64" IMPL="engine triton" BUDGET_S=$((left * 55 / 100)) \
  bash "$root/bench/maxload.sh" "$bin" "$out" 2>&1 | tee "$out/maxload-8b.txt"
CKPTS=$w/ckpt SHAPES=llama2-7B IO=128/128 CONC=max IMPL=engine EXTRA=tput_b64_i128_o128 BUDGET_S=$((left * 25 / 100)) \
  bash "$root/bench/maxload.sh" "$bin" "$out" 2>&1 | tee "$out/maxload-7b.txt"
for ov in "" -overlap; do
  timeout $((left / 10)) "$bin/gpubench" -ckpt "$w/ckpt/tinyllama-1.1B" -model tinyllama-1.1B -lib "$lib" $ov -reps 5 \
    -workloads tput_b64_i128_o128 2>> "$out/gpubench-tinyllama.log" |
    python3 -c '
import datetime, json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(json.dumps(dict({"date": datetime.date.today().isoformat(), "commit": sys.argv[1], "machine": sys.argv[2]}, **r)))' \
      "$(head -1 "$bin/commit")" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >> "$out/maxload.jsonl"
done

rows=$out/maxload.jsonl
# value MODEL WORKLOAD IMPL METRIC: a row's value, empty when there is none.
value() {
  python3 - "$rows" "$@" <<'PY'
import json, sys
path, model, workload, impl, metric = sys.argv[1:]
v = [json.loads(l)["value"] for l in open(path) if l.strip() and all(
    json.loads(l).get(k) == x for k, x in (("model", model), ("workload", workload), ("impl", impl), ("metric", metric)))]
print(v[-1] if v else "")
PY
}
e8=$(value llama3.1-8B maxload_i128_o128 gollm-engine-overlap tokens_per_s)
t8=$(value llama3.1-8B maxload_i128_o128 gollm-triton tokens_per_s)
e7=$(value llama2-7B maxload_i128_o128 gollm-engine-overlap tokens_per_s)
b7=$(value llama2-7B tput_b64_i128_o128 gollm-engine-overlap tokens_per_s)
bt=$(value tinyllama-1.1B tput_b64_i128_o128 gollm-engine tokens_per_s)
bto=$(value tinyllama-1.1B tput_b64_i128_o128 gollm-engine-overlap tokens_per_s)
[ -n "$e8" ] && pass "engine: Llama-3.1-8B max load, 1,024 requests of i128/o128 at once ($e8 tokens/s)" || fail "engine: Llama-3.1-8B max load (see $out/gpubench-llama3.1-8B.log)"
[ -n "$(value llama3.1-8B load_c64_i128_o128 gollm-engine-overlap tokens_per_s)" ] && pass "engine: Llama-3.1-8B concurrency 64" || fail "engine: Llama-3.1-8B concurrency 64"
[ -n "$e7" ] && pass "engine: Llama-2-7B max load ($e7 tokens/s)" || fail "engine: Llama-2-7B max load (see $out/gpubench-llama2-7B.log)"
[ -n "$b7" ] && pass "engine: Llama-2-7B tput_b64_i128_o128 ($b7 tokens/s)" || fail "engine: Llama-2-7B tput_b64"
[ -n "$bt" ] && pass "engine: TinyLlama tput_b64_i128_o128 ($bt tokens/s; overlap $bto)" || fail "engine: TinyLlama tput_b64"
if [ -f "$carry/tritonserver.tar.xz" ]; then
  [ -n "$t8" ] && pass "triton: Llama-3.1-8B max load through tritonserver ($t8 tokens/s)" || fail "triton: Llama-3.1-8B max load (see $out/tritonbench-llama3.1-8B.log, $out/tritonserver-llama3.1-8B.log)"
  m=$out/metrics-llama3.1-8B.txt
  [ -f "$m" ] || : > "$m"
  most=$(awk '/^gollm_sequences_per_iteration_max/ {print $2}' "$m" | sort -g | tail -1)
  used=$(awk '/^gollm_kv_blocks_used/ {s += $2} END {print s + 0}' "$m")
  awk -v v="${most:-0}" 'BEGIN {exit !(v > 64)}' && pass "triton: iterations of up to $most sequences (gollm_sequences_per_iteration_max)" ||
    fail "triton: gollm_sequences_per_iteration_max ${most:-absent}, want above 64"
  [ -n "$most" ] && [ "$used" = 0 ] && pass "triton: every KV block free after the load" || fail "triton: $used KV blocks still used after the load"
else
  fail "triton: no tritonserver.tar.xz in $carry"
fi

# target NAME VALUE BAR: a TARGET line, met when VALUE ≥ BAR.
target() {
  if [ -z "$2" ]; then echo "TARGET missed $1: no figure"; return; fi
  awk -v v="$2" -v b="$3" -v n="$1" 'BEGIN {printf "TARGET %s %s: %.0f (target %s)\n", (v >= b ? "met" : "missed"), n, v, b}'
}
echo "== issue 34's targets"
target "Llama-3.1-8B i128/o128 max load fp16, tokens/s" "$e8" 14000
target "Llama-2-7B b64 i128/o128 fp16, tokens/s" "$b7" 8200
target "TinyLlama b64 fp16, tokens/s" "$(printf '%s\n%s\n' "$bt" "$bto" | sort -g | tail -1)" 48000
if [ -n "$e8" ] && [ -n "$t8" ]; then
  target "through tritonserver / engine at max load (×1000)" "$(awk -v t="$t8" -v e="$e8" 'BEGIN {print 1000 * t / e}')" 900
fi
python3 "$root/bench/plot_maxload.py" "$rows" > /dev/null && echo "plot: ${rows%.jsonl}.svg"
echo "$checks checks, $fails failed"
[ "$fails" = 0 ]
