#!/usr/bin/env bash
# Tensor parallelism (issue 20) on a machine of 2 or more GPUs, in about 6 minutes of an
# 8-minute call:
#   bash tests/gpu/tp_check.sh CARRY OUTDIR
# after tests/gpu/tp_carry.sh here (CARRY = .carry/tp: libgollm_cuda.so for sm_90,
# cudatest — the bridge/cuda test binary —, gpubench, and for the triton stage
# libtriton_gollm.so, tritonbench and tritonserver.tar.xz; `tp_carry.sh OUT pack` packs the
# binaries into bins.tar.xz). Prints PASS or FAIL for each
# check, then the benchmark's table; exits 1 when a check failed. In order:
#   env      the GPUs and their links, cuBLAS and NCCL found (tests/gpu/env.sh)
#   tp       TestGPUTensorParallel{MatchesOneGPU,BatchManager,Overlap,AllMasked}: TP 2 (and
#            4 with 4 GPUs) against one GPU on the tiny fixtures, the batch manager, the
#            overlap path, an error every rank raises
#   triton   (when CARRY has tritonserver.tar.xz, libtriton_gollm.so and tritonbench)
#            tritonserver serving the tiny LLaMA, Qwen2 and GPT-2 fixtures (fp16) twice,
#            tensor_parallel_size 2 and 1, on gpus [0]: tritonbench -against, 48 greedy
#            streams each
#   1gpu     the other GPU tests (one GPU: TP = 1 must not have changed); TP_SKIP_1GPU=1
#            leaves them out
#   bench    a random Llama-2-7B-shaped fp16 checkpoint (TP_MODEL=llama2-13B: the 13B
#            shape; written with torch on GPU 0), gpubench
#            at TP 1 and TP 2: decode b1 i128 o128 (ms/token) and b64 i128 o128 (tokens/s);
#            with the triton stage's files, the same two workloads through tritonserver
#            (tritonbench; a server for each TP size, its model on gpus [0])
#   abort    TestGPUTensorParallelFailed{StepRecovers,RankAborts}, on their own and last: a
#            step failing on every rank is recovered from; one failing on rank 1 alone before
#            its collectives leaves rank 0 waiting until the communicators are aborted
#            (ncclCommAbort) — no crash, no hang — and a new engine then serves
# Logs and OUTDIR/tp-bench.jsonl stay in OUTDIR. Stage limits: TP_TEST_S (default 150),
# TP_BENCH_S (default 150 each); TP_SKIP_BENCH=1 leaves the benchmark out, TP_SKIP_TESTS=1
# the test stages (tp, triton, 1gpu, abort).
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
# A carry may hold its binaries as bins.tar.xz (to fit the device call's limit): unpacked
# beside its tritonserver.tar.xz.
if [ -f "$carry/bins.tar.xz" ]; then
  rm -rf /tmp/gollm-tpcarry && mkdir -p /tmp/gollm-tpcarry
  tar xJf "$carry/bins.tar.xz" -C /tmp/gollm-tpcarry
  [ -f "$carry/tritonserver.tar.xz" ] && ln -s "$carry/tritonserver.tar.xz" /tmp/gollm-tpcarry/
  carry=/tmp/gollm-tpcarry
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
# bench/device.sh: env.sh (cuBLAS and NCCL on the loader's path), then the triton stage's
# and the benchmark's helpers (device_unpack, gpt2_model, triton_start, write_checkpoint).
source "$root/bench/device.sh"
lib="$carry/libgollm_cuda.so"
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
echo "== carry: $(head -1 "$carry/commit" 2>/dev/null) $(grep -c dirty "$carry/commit" 2>/dev/null) dirty files"

echo "== env"
nvidia-smi -L | tee "$out/gpus.txt"
nvidia-smi topo -m > "$out/topo.txt" 2>&1 && head -6 "$out/topo.txt"
ngpu=$(nvidia-smi -L | grep -c '^GPU')
if [ "$ngpu" -ge 2 ]; then pass "env: $ngpu GPUs"; else fail "env: $ngpu GPU(s), tensor parallelism needs 2"; fi
if [ -n "${nccl_dir:-}" ]; then pass "env: libnccl.so.2 in $nccl_dir"; else fail "env: no libnccl.so.2 found (pip install nvidia-nccl-cu13, or set GOLLM_NCCL_LIB)"; fi

# gotests NAME RUN SKIP LOG: runs the bridge/cuda tests matching RUN and not SKIP; PASS/FAIL
# per test (subtests indented), FAIL for a crash or a timeout.
gotests() {
  local name=$1 run=$2 skip=$3 log=$4
  (cd "$root/bridge/cuda" && GOLLM_CUDA_LIB="$lib" NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout "${TP_TEST_S:-150}" \
    "$carry/cudatest" -test.run "$run" -test.skip "$skip" -test.v -test.count=1 > "$log" 2>&1)
  local rc=$?
  grep -E '^\s*--- (PASS|FAIL|SKIP)' "$log" | sed -E 's/^(\s*)--- (PASS|FAIL|SKIP): /\2 \1/' | sed "s/^\(PASS\|FAIL\|SKIP\) /\1 $name: /"
  grep -E '(tp_gpu_test|_test)\.go:[0-9]+: ' "$log" | grep -vE 'NCCL [0-9]+ from' | head -40 | sed 's/^/    /'
  if [ $rc -eq 0 ]; then pass "$name: exit 0"; else
    fail "$name: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')"
    echo "    the log's end ($log):"; tail -25 "$log" | sed 's/^/    /'
  fi
  fails=$((fails + $(grep -cE '^\s*--- FAIL' "$log")))
  # On the GPU machine nothing may skip: a skip is a library, cuBLAS or GPU not found.
  local skips
  skips=$(grep -cE '^\s*--- SKIP' "$log")
  if [ "$skips" -gt 0 ]; then fail "$name: $skips skipped (the reasons are above)"; fi
}

tests=1
[ "${TP_SKIP_TESTS:-0}" = 1 ] && tests=0
if [ "$tests" = 1 ]; then
echo "== tp: tensor parallel tests"
gotests tp 'TestGPUTensorParallel(MatchesOneGPU|BatchManager|Overlap|AllMasked)$' '^$' "$out/tp.log"
fi
# tpmodel NAME CHECKPOINT TP [KEY VALUE]...: a KIND_GPU model on gpus [0] (bench/device.sh's
# gpt2_model) with tensor_parallel_size TP.
tpmodel() {
  local name=$1 ck=$2 tp=$3
  shift 3
  gpt2_model "$name" "$ck" KIND_GPU tensor_parallel_size "$tp" "$@"
  sed -i 's/^\(\s*\)kind: KIND_GPU/\1kind: KIND_GPU\n\1gpus: [ 0 ]/' "$w/repo/$name/config.pbtxt"
}
triton=0
if [ -f "$carry/tritonserver.tar.xz" ] && [ -f "$carry/libtriton_gollm.so" ] && [ -f "$carry/tritonbench" ]; then
  triton=1
  device_unpack tptriton "$carry"
fi
if [ "$triton" = 1 ] && [ "$tests" = 1 ]; then
  echo "== triton: tensor_parallel_size 2 through tritonserver, against one GPU"
  for fx in llama-tiny qwen2-tiny gpt2-tiny; do
    # Six models on GPU 0: each asks for 10% of it (the default takes 90% of what is free).
    tpmodel "$fx-tp2" "$root/testdata/$fx" 2 gpu_memory_utilization 0.1
    tpmodel "$fx-tp1" "$root/testdata/$fx" 1 gpu_memory_utilization 0.1
  done
  if triton_start "$out/triton-tiny.log"; then
    for fx in llama-tiny qwen2-tiny gpt2-tiny; do
      vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$root/testdata/$fx/config.json")
      if timeout 120 "$w/bin/tritonbench" -addr 127.0.0.1:8001 -model "$fx-tp2" -against "$fx-tp1" -vocab "$vocab" > "$out/triton-$fx.txt" 2>&1; then
        pass "triton: $(grep TRITON "$out/triton-$fx.txt")"
      else
        fail "triton: $fx"; tail -6 "$out/triton-$fx.txt" | sed 's/^/    /'
      fi
    done
    grep -E "tensor parallel|GPU engine" "$out/triton-tiny.log" | head -4 | sed 's/^/    /'
    triton_stop "$out/triton-tiny.log"
  else
    fail "triton: tritonserver did not start"
  fi
fi
if [ "${TP_SKIP_1GPU:-0}" != 1 ] && [ "$tests" = 1 ]; then
  echo "== 1gpu: the one-GPU tests"
  gotests 1gpu '^TestGPU' 'TensorParallel' "$out/1gpu.log"
fi

if [ "${TP_SKIP_BENCH:-0}" != 1 ]; then
  tm=${TP_MODEL:-llama2-7B}
  echo "== bench: $tm shape, TP 1 and 2"
  ck=/tmp/gollm-tp/$tm
  if [ ! -f "$ck/config.json" ]; then
    t0=$(date +%s)
    # The shape and seed bench/gpu_peers.py gives the model, into /tmp/gollm-tp.
    (w=$(dirname "$ck") && write_checkpoint "$tm") > "$out/ckpt.log" 2>&1
    if [ $? -eq 0 ]; then pass "bench: checkpoint written in $(( $(date +%s) - t0 )) s"; else fail "bench: checkpoint"; tail -5 "$out/ckpt.log"; fi
  fi
  W=decode_b1_i128_o128,tput_b64_i128_o128
  for tp in 1 2; do
    timeout "${TP_BENCH_S:-150}" "$carry/gpubench" -ckpt "$ck" -model "$tm" -lib "$lib" -workloads $W -reps 3 -tp $tp \
      2> "$out/bench-tp$tp.log" | tee -a "$out/tp-bench.jsonl"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then pass "bench: TP $tp"; else fail "bench: TP $tp (exit $rc)"; tail -8 "$out/bench-tp$tp.log"; fi
    grep gpubench: "$out/bench-tp$tp.log"
  done
  python3 - "$out/tp-bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
fig = {(r.get("tp", 1), r["workload"]): r["value"] for r in rows}
print("| workload | TP 1 | TP 2 | speed-up | scaling efficiency |")
print("| --- | --- | --- | --- | --- |")
for w, unit in (("decode_b1_i128_o128", "ms/token"), ("tput_b64_i128_o128", "tokens/s")):
    a, b = fig.get((1, w)), fig.get((2, w))
    up = (a / b if unit == "ms/token" else b / a) if a and b else None
    f = lambda v: "—" if v is None else (f"{v:.3f}" if unit == "ms/token" else f"{v:,.0f}")
    print(f"| {w} ({unit}) | {f(a)} | {f(b)} | {'—' if up is None else f'{up:.2f}x'} | {'—' if up is None else f'{up / 2:.0%}'} |")
PY
  if [ "$triton" = 1 ]; then
    echo "== bench: the same through tritonserver"
    for tp in 1 2; do
      # A server a TP size: the model takes the GPUs' default share.
      rm -rf "$w/repo"/*
      tpmodel "$tm-tp$tp" "$ck" $tp
      if triton_start "$out/triton-$tm-tp$tp.log"; then
        timeout "${TP_BENCH_S:-150}" "$w/bin/tritonbench" -addr 127.0.0.1:8001 -model "$tm-tp$tp" -name "$tm" -vocab 32000 \
          -workloads $W -reps 3 2> "$out/triton-bench-tp$tp.log" | sed "s/}\$/, \"tp\": $tp}/" | tee -a "$out/tp-triton.jsonl"
        if [ "${PIPESTATUS[0]}" -eq 0 ]; then pass "bench: TP $tp through tritonserver"; else fail "bench: TP $tp through tritonserver"; tail -5 "$out/triton-bench-tp$tp.log"; fi
        triton_stop "$out/triton-$tm-tp$tp.log"
      else
        fail "bench: tritonserver with $tm at TP $tp did not start"
      fi
    done
  fi
fi

# Last: it aborts NCCL communicators on purpose.
if [ "$tests" = 1 ]; then
  echo "== abort: failed steps — recovered from on every rank, aborted on one"
  gotests abort 'TestGPUTensorParallelFailed' '^$' "$out/abort.log"
fi

echo "== $fails failed"
[ "$fails" -eq 0 ]
