#!/usr/bin/env bash
# Issue 38's custom all-reduce on a machine of 2 or 4 GPUs, in calls of under 9 minutes,
# run from this tree with CARRY = .carry/tpar (tests/gpu/tpar_carry.sh: the Go binaries
# cudatest, gpubench, arbench; the library is built here from cuda/):
#   bash tests/gpu/tpar_check.sh CARRY OUTDIR
# Prints PASS or FAIL for each check and the benchmarks' tables; exits 1 when a check
# failed. In order:
#   build   libgollm_cuda.so of this tree for sm_90 and, beside it at once, a GOLLM_MEASURE
#           one for stagecost (tests/gpu/build_lib.sh; into build/tpar/, kept while the
#           machine stays warm). PREBUILT_LIB (and PREBUILT_MEASURE_LIB) name libraries
#           to take instead
#   ar      TestGPUAllReduceMatchesHost: the custom all-reduce, one-shot and two-shot
#           (fused with the residual add and RMSNorm), over 2 and 4 GPUs, fp16 and bf16,
#           eager and replayed from a graph, against the host's sums — bit for bit in h on
#           every rank — and NCCL's fp32 path against the same sums;
#           TestGPUTensorParallelSampledCandidates: sampled decode rows (top-k ≤ 64, top-p,
#           min-p) drawn from the ranks' candidates give the gathered vocabulary's tokens;
#           TestGPUTensorParallelGuidedGreedy: greedy rows with guided masks keep to them
#   tp      tests/gpu/tp_check.sh's tests (TP_SKIP_BENCH=1 TP_SKIP_1GPU=1): TP 2 and 4
#           against one GPU on the tiny fixtures (llama-tiny with NCCL alone too,
#           llama-tiny and gpt2-tiny with every all-reduce in two shots), the batch
#           manager, the overlap path, an error every rank raises; then the abort tests: a
#           step failing on every rank recovered from, rank 1 failing alone (rank 0
#           released by the abort), and TestGPUTensorParallelFailedRankTimesOut and
#           ...TimesOutTwoShot (rank 0 released by the all-reduce's own 2 s timeout)
#   arbench the all-reduce alone at 2 KB–8 MB, TP 2 and 4: the one-shot, the two-shot,
#           NCCL's fp32 path and NCCL in fp16, rows in OUTDIR/tpar-allreduce.jsonl and a
#           table with the fastest method at each size
#   decode  gpubench with random weights (no files) of the Llama-2-7B and -13B shapes,
#           fp16, decode b1 i128 o128 (ms/token) and b64 i128 o128 (tokens/s) at TP 1, 2
#           and 4 (13B: 1 and 4; 7B also at TP 4 with GOLLM_CUDA_CUSTOM_AR=0: NCCL alone,
#           and b64 at TP 4 with GOLLM_CUDA_AR_TWO_BYTES=-1: the one-shot alone), rows in
#           OUTDIR/tpar-decode.jsonl; a table of speed-ups against TP 1 beside the issue's
#           targets (a missed target is reported, not failed)
#   stagecost bench/stagecost.sh with bench/stagecost_tp.plan on the GOLLM_MEASURE
#           library: each stage's cost in a Llama-2-7B step at TP 1 and 4 (and the
#           all-reduces' own, skip bit 30), into OUTDIR/stagecost/ and BENCH.md's rows
#           into OUTDIR/tpar-stagecost.jsonl
# TPAR_STAGES (default "build ar tp arbench decode") picks stages: everything takes more
# than one call's 10 minutes, so run "build ar tp arbench" (about 7 minutes), then
# "decode" (about 6; the libraries stay built while the machine is warm), then
# "stagecost" (about 7). TPAR_MODELS (default "llama2-7B llama2-13B") and TPAR_TP
# (default "1 2 4" for 7B, "1 4" for 13B, cut to the GPUs there are) narrow the decode
# benchmark; TPAR_REPS its repetitions (default 2); TPAR_STAGECOST_PLAN another plan for
# stagecost (a part of bench/stagecost_tp.plan, where the whole takes too long).
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
stages=${TPAR_STAGES:-build ar tp arbench decode}
has() { [[ " $stages " == *" $1 "* ]]; }
fails=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
b=$root/build/tpar
mkdir -p "$b/bin"
if [ -f "$carry/bins.tar.xz" ]; then tar xJf "$carry/bins.tar.xz" -C "$b/bin"; else cp "$carry"/* "$b/bin/"; fi
commit=$(head -1 "$b/bin/commit" 2> /dev/null)
echo "== carry: $commit $(grep -c dirty "$b/bin/commit" 2> /dev/null) dirty files"
# env.sh: cuBLAS and NCCL on the loader's path ($cublas_dir, $nccl_dir).
source "$root/tests/gpu/env.sh"
# NCCL never on NVLink multicast (KINDS.md).
export NCCL_NVLS_ENABLE=0
lib=$b/libgollm_cuda.so
ngpu=$(nvidia-smi -L | grep -c '^GPU')
machine=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "== $ngpu × $machine"
nvidia-smi topo -m > "$out/topo.txt" 2>&1 && head -$((ngpu + 1)) "$out/topo.txt"

mlib=$b/libgollm_cuda_measure.so
if [ -n "${PREBUILT_LIB:-}" ]; then
  cp "$PREBUILT_LIB" "$lib" && pass "build: took $PREBUILT_LIB"
  [ -n "${PREBUILT_MEASURE_LIB:-}" ] && cp "$PREBUILT_MEASURE_LIB" "$mlib"
elif has build; then
  echo "== build"
  t0=$SECONDS
  rm -f "$lib" "$mlib"
  # Both at once: forward.cu, the longest, bounds each.
  GOLLM_NVCC_EXTRA=-DGOLLM_MEASURE bash "$root/tests/gpu/build_lib.sh" "$mlib" > "$out/build-measure.log" 2>&1 &
  mpid=$!
  if bash "$root/tests/gpu/build_lib.sh" "$lib" > "$out/build.log" 2>&1; then
    pass "build: libgollm_cuda.so in $((SECONDS - t0)) s"
  else
    fail "build"; tail -20 "$out/build.log"
  fi
  if wait $mpid; then pass "build: the GOLLM_MEASURE library in $((SECONDS - t0)) s"; else
    fail "build: the GOLLM_MEASURE library"; tail -10 "$out/build-measure.log"
  fi
fi
[ -f "$lib" ] || { echo "no library: stopping"; echo "== $((fails + 1)) failed"; exit 1; }

# gotests NAME RUN LOG: the bridge/cuda tests matching RUN; PASS/FAIL per test.
gotests() {
  local name=$1 run=$2 log=$3
  (cd "$root/bridge/cuda" && GOLLM_CUDA_LIB="$lib" NCCL_DEBUG=${NCCL_DEBUG:-WARN} timeout 150 \
    "$b/bin/cudatest" -test.run "$run" -test.v -test.count=1 > "$log" 2>&1)
  local rc=$?
  grep -E '^\s*--- (PASS|FAIL|SKIP)' "$log" | grep -vE '^\s{8,}--- PASS' | sed -E 's/^(\s*)--- (PASS|FAIL|SKIP): /\2 \1/' | sed "s/^\(PASS\|FAIL\|SKIP\) /\1 $name: /"
  grep -E '_test\.go:[0-9]+: ' "$log" | head -20 | sed 's/^/    /'
  if [ $rc -eq 0 ]; then pass "$name: exit 0"; else
    fail "$name: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')"
    tail -15 "$log" | sed 's/^/    /'
  fi
  fails=$((fails + $(grep -cE '^\s*--- FAIL' "$log")))
  local skips
  skips=$(grep -cE '^\s*--- SKIP' "$log")
  if [ "$skips" -gt 0 ]; then fail "$name: $skips skipped"; fi
}

if has ar; then
  echo "== ar: the custom all-reduce against the host's sums; sampling from candidates"
  gotests ar 'TestGPUAllReduceMatchesHost|TestGPUTensorParallel(SampledCandidates|GuidedGreedy)' "$out/ar.log"
fi

if has tp; then
  echo "== tp: tests/gpu/tp_check.sh's tests and abort tests"
  mkdir -p "$b/tpcarry"
  cp "$lib" "$b/bin/cudatest" "$b/bin/commit" "$b/tpcarry/" 2> /dev/null
  TP_TEST_S=${TP_TEST_S:-240} TP_SKIP_BENCH=1 TP_SKIP_1GPU=1 bash "$root/tests/gpu/tp_check.sh" "$b/tpcarry" "$out/tp" 2>&1 | grep -E '^(PASS|FAIL|==|    )' | grep -v '^== carry'
  [ "${PIPESTATUS[0]}" -eq 0 ] || fails=$((fails + 1))
fi

# tag FILE [SUFFIX]: BENCH.md's date, commit and machine added to each row of stdin (its
# impl ending in SUFFIX), into FILE.
tag() {
  python3 -c '
import json, sys, datetime
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    r["impl"] += sys.argv[3]
    print(json.dumps({"date": datetime.date.today().isoformat(), "commit": sys.argv[1], "machine": sys.argv[2], **r}), flush=True)
' "$commit" "$machine" "${2:-}" >> "$1"
}

if has arbench; then
  echo "== arbench: the all-reduce alone, custom beside NCCL"
  ways=2
  [ "$ngpu" -ge 4 ] && ways=2,4
  rm -f "$out/tpar-allreduce.jsonl"
  timeout 240 "$b/bin/arbench" -lib "$lib" -tp $ways 2> "$out/arbench.log" | tag "$out/tpar-allreduce.jsonl"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then pass "arbench: TP $ways"; else fail "arbench (exit $rc)"; tail -8 "$out/arbench.log"; fi
  python3 - "$out/tpar-allreduce.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
names = {"gollm-custom-ar": "one-shot", "gollm-custom-ar-2shot": "two-shot", "nccl-f32": "nccl-f32"}
fig = {(r["tp"], r["bytes"], names.get(r["impl"], "nccl")): r["value"] / 1e3 for r in rows}
bad = [r for r in rows if r["impl"].startswith("gollm-custom-ar") and (r["ranks_differ"] or r["max_err_h"] > 0)]
cols = ("one-shot", "two-shot", "nccl-f32")
print("| TP | bytes | one-shot, fused (µs) | two-shot, fused (µs) | NCCL fp32 + norm (µs) | NCCL fp16 alone (µs) | fastest fused |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for tp, b in sorted({(r["tp"], r["bytes"]) for r in rows}):
    f = lambda k: f"{fig[(tp, b, k)]:.2f}" if (tp, b, k) in fig else "—"
    best = min((fig[(tp, b, k)], k) for k in cols if (tp, b, k) in fig)[1] if any((tp, b, k) in fig for k in cols) else "—"
    print(f"| {tp} | {b:,} | {f('one-shot')} | {f('two-shot')} | {f('nccl-f32')} | {f('nccl')} | {best} |")
# Where the two-shot starts to win at each TP: the smallest size from which it beats the
# one-shot at every larger size measured (tuning.allreduce_two_bytes, off by
# default).
for tp in sorted({r["tp"] for r in rows}):
    sizes = sorted(b for (t_, b, k) in fig if t_ == tp and k == "two-shot" and (t_, b, "one-shot") in fig)
    wins = [b for b in sizes if fig[(tp, b, "two-shot")] < fig[(tp, b, "one-shot")]]
    cross = next((b for b in sizes if all(fig[(tp, c, "two-shot")] < fig[(tp, c, "one-shot")] for c in sizes if c >= b)), None)
    print(f"TP {tp}: two-shot faster at {', '.join(f'{b:,}' for b in wins) or 'no size'}; from {cross:,} bytes on" if cross else f"TP {tp}: two-shot faster at {', '.join(f'{b:,}' for b in wins) or 'no size'}")
t = fig.get((4, 8192, "one-shot"))
print(f"8 KB at TP 4: {t:.2f} µs (target ≤ 8): {'TARGET met' if t <= 8 else 'TARGET missed'}" if t else "8 KB at TP 4: not measured")
for r in bad:
    print(f"FAIL arbench check: {r['workload']}: h off by {r['max_err_h']}, {r['ranks_differ']} elements differ between ranks")
sys.exit(1 if bad else 0)
PY
  [ $? -eq 0 ] || fails=$((fails + 1))
fi

if has decode; then
  echo "== decode: gpubench, random weights, TP 1/2/4"
  rm -f "$out/tpar-decode.jsonl"
  W=decode_b1_i128_o128,tput_b64_i128_o128
  for m in ${TPAR_MODELS:-llama2-7B llama2-13B}; do
    d=/tmp/gollm-tpar/$m
    mkdir -p "$d"
    python3 - "$m" "$d/config.json" <<'PY'
import json, sys
h, i, l = {"llama2-7B": (4096, 11008, 32), "llama2-13B": (5120, 13824, 40)}[sys.argv[1]]
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": i,
           "num_hidden_layers": l, "num_attention_heads": h // 128, "num_key_value_heads": h // 128,
           "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
           "torch_dtype": "float16"}, open(sys.argv[2], "w"))
PY
    gb=$([ "$m" = llama2-7B ] && echo 15 || echo 28)
    # 13B at TP 1 and 4 (the issue's target); 7B at each, at TP 4 with NCCL alone, and
    # b64 at TP 4 with the one-shot alone (its 512 KB sums otherwise go in two shots).
    want=${TPAR_TP:-1 2 4}
    [ "$m" = llama2-13B ] && want=${TPAR_TP:-1 4}
    runs=""
    for tp in $want; do [ "$tp" -le "$ngpu" ] && runs="$runs $tp"; done
    [ "$m" = llama2-7B ] && [ "$ngpu" -ge 4 ] && [ -z "${TPAR_TP:-}" ] && runs="$runs 4nccl 4one"
    for run in $runs; do
      tp=${run%nccl} ar=1 two=0 suffix="" wl=$W
      [ "$run" != "$tp" ] && ar=0 suffix=-nccl
      if [ "$run" = 4one ]; then tp=4 ar=1 two=-1 suffix=-oneshot wl=tput_b64_i128_o128; fi
      GOLLM_CUDA_CUSTOM_AR=$ar GOLLM_CUDA_AR_TWO_BYTES=$two timeout 150 "$b/bin/gpubench" -ckpt "$d" -model "$m" -lib "$lib" -dtype float16 \
        -random-gb $gb -workloads $wl -reps "${TPAR_REPS:-2}" -tp "$tp" 2> "$out/decode-$m-$run.log" |
        tag "$out/tpar-decode.jsonl" "$suffix"
      rc=${PIPESTATUS[0]}
      if [ "$rc" -eq 0 ]; then pass "decode: $m TP $run"; else fail "decode: $m TP $run (exit $rc)"; tail -5 "$out/decode-$m-$run.log"; fi
      grep gpubench: "$out/decode-$m-$run.log" | sed 's/^/    /'
    done
  done
  python3 - "$out/tpar-decode.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
kind = lambda impl: "nccl" if impl.endswith("-nccl") else "one" if impl.endswith("-oneshot") else ""
fig = {(r["model"], r.get("tp", 1), kind(r["impl"]), r["workload"]): r["value"] for r in rows}
targets = {("llama2-7B", 2, "decode_b1_i128_o128"): 1.7, ("llama2-7B", 4, "decode_b1_i128_o128"): 2.6,
           ("llama2-13B", 4, "decode_b1_i128_o128"): 2.8, ("llama2-7B", 4, "tput_b64_i128_o128"): 3.3}
print("| model | workload | TP 1 | TP 2 | TP 4 | TP 4, NCCL alone | TP 4, one-shot alone |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for m in ("llama2-7B", "llama2-13B"):
    for w, unit in (("decode_b1_i128_o128", "ms/token"), ("tput_b64_i128_o128", "tokens/s")):
        base = fig.get((m, 1, "", w))
        if base is None:
            continue
        cells = []
        for tp, nccl in ((1, ""), (2, ""), (4, ""), (4, "nccl"), (4, "one")):
            v = fig.get((m, tp, nccl, w))
            if v is None:
                cells.append("—")
                continue
            up = base / v if unit == "ms/token" else v / base
            cells.append(f"{v:.3f} ({up:.2f}×)" if unit == "ms/token" else f"{v:,.0f} ({up:.2f}×)")
        print(f"| {m} | {w} ({unit}) | " + " | ".join(cells) + " |")
for (m, tp, w), want in targets.items():
    a, v = fig.get((m, 1, "", w)), fig.get((m, tp, "", w))
    if a and v:
        up = a / v if w.startswith("decode") else v / a
        print(f"{m} {w} TP {tp}: {up:.2f}× (target ≥ {want}×): {'TARGET met' if up >= want else 'TARGET missed'}")
PY
fi

if has stagecost; then
  echo "== stagecost: where a Llama-2-7B step goes at TP 1 and 4"
  if [ -f "$mlib" ]; then
    rm -rf "$out/stagecost"
    PREBUILT_LIB=$mlib GPUBENCH=$b/bin/gpubench RANDOM_GB=15 REPS=${TPAR_REPS:-2} STAGE_S=90 \
      bash "$root/bench/stagecost.sh" "$out/stagecost" "${TPAR_STAGECOST_PLAN:-$root/bench/stagecost_tp.plan}" > /dev/null 2> "$out/stagecost.log"
    if [ -s "$out/stagecost/stagecost.txt" ]; then
      pass "stagecost: $(($(wc -l < "$out/stagecost/stagecost.txt") - 1)) rows"
      # The GPU machines have no column(1).
      awk '{ printf "%-12s %-22s", $1, $2; for (i = 3; i <= NF; i++) printf " %-10s", $i; print "" }' "$out/stagecost/stagecost.txt"
      # BENCH.md's rows: date, commit and machine added.
      rm -f "$out/tpar-stagecost.jsonl"
      tag "$out/tpar-stagecost.jsonl" < "$out/stagecost/stagecost.jsonl"
    else
      fail "stagecost"; tail -8 "$out/stagecost.log"
    fi
    # Runs that failed leave their error logs.
    for f in "$out"/stagecost/err-*.log; do grep -l -iE 'error|panic' "$f" 2> /dev/null; done | head -3 | sed 's/^/    errors in /'
  else
    fail "stagecost: no GOLLM_MEASURE library ($mlib): run the build stage or set PREBUILT_MEASURE_LIB"
  fi
fi

echo "== $fails failed"
[ "$fails" -eq 0 ]
