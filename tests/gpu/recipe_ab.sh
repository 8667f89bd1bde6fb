#!/usr/bin/env bash
# The per-layer recipe (issue 33) against its base on the GPU machine, in two calls of
# under ten minutes each, run from this tree with CARRY = .carry/recipe
# (tests/gpu/recipe_carry.sh):
#   bash tests/gpu/recipe_ab.sh CARRY OUTDIR check   # both libraries built, then check.py
#   bash tests/gpu/recipe_ab.sh CARRY OUTDIR bench   # the two libraries alternating
#   bash tests/gpu/recipe_ab.sh CARRY OUTDIR gotest  # bridge/cuda's GPU tests, new library
# Both stages build what is missing first: libgollm_cuda.so of this tree (new) and of the
# base's cuda/ (base), for sm_90, one nvcc a source file on every core at once (CMake needs
# Go, which the GPU machine lacks; the flags are CMake's), into build/recipe-ab/, which
# outlives a call while the machine stays warm.
#   check  check.py in fp16 and bf16 on every model with the new library (and its Go
#          binaries): its table, PASS/FAIL, OUTDIR/check.json. CHECK_ONLY / CHECK_DTYPES
#          pass --only / --dtypes.
#   gotest the bridge's TestGPU* tests (beams, the overlap schedule's fed tokens, prompt
#          graphs, two models in one process; the tensor-parallel ones skip on one GPU)
#          against the new library, OUTDIR/gotest.log.
#   bench  gpubench, base and new alternating (ROUNDS rounds, default 2, the order
#          reversed every other round), -reps 3: GPT-2 124M, TinyLlama-1.1B and Llama-2-7B
#          shapes at decode b1 i128 o128 (ms/token) and b64 i128 o128 (tokens/s), GPT-350M
#          at lat b1, b8 and b64 i128 o8 (ms); rows in OUTDIR/recipe-ab.jsonl, then a table
#          of each variant's runs and new/base of their medians (for ms, above 1 is slower).
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2 what=${3:-check}
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
# bench/device.sh: env.sh (cuBLAS on the loader's path) and write_checkpoint, tag_rows.
source "$root/bench/device.sh"
w=/tmp/gollm-recipe
mkdir -p "$w"
# build NAME SRC JOBS: SRC (a cuda/) into $b/lib/libgollm_cuda_NAME.so with JOBS nvcc
# processes (tests/gpu/build_lib.sh), unless built.
build() {
  local lib=$b/lib/libgollm_cuda_$1.so
  [ -f "$lib" ] && return 0
  JOBS=$3 bash "$root/tests/gpu/build_lib.sh" "$lib" "$2" || { echo "FAIL: build $1"; return 1; }
}
build new "$root/cuda" 8 &
newb=$!
build base "$b/bin/base/cuda" 8 &
baseb=$!
wait "$newb" || exit 1

if [ "$what" = check ]; then
  # The base's library finishes meanwhile; check.py reads the new one only.
  python3 "$root/tests/gpu/check.py" --bin "$b/bin/new/gollm-gpucheck" --lib "$b/lib/libgollm_cuda_new.so" \
    --work /tmp/gollm-recipe-check --json "$out/check.json" ${CHECK_ONLY:+--only "$CHECK_ONLY"} \
    ${CHECK_DTYPES:+--dtypes "$CHECK_DTYPES"} 2>&1 | grep -v '^ *$' | tail -60
  rc=${PIPESTATUS[0]}
  wait "$baseb"
  [ "$rc" = 0 ] && echo "PASS check.py" || echo "FAIL check.py ($rc)"
  exit "$rc"
fi

if [ "$what" = gotest ]; then
  (cd "$root/bridge/cuda" && GOLLM_CUDA_LIB="$b/lib/libgollm_cuda_new.so" timeout 400 "$b/bin/new/cudatest" \
    -test.run GPU -test.v -test.count=1 > "$out/gotest.log" 2>&1)
  rc=$?
  grep -E '^(--- |ok|FAIL|PASS)' "$out/gotest.log" | tail -40
  wait "$baseb"
  [ "$rc" = 0 ] && echo "PASS GPU Go tests" || echo "FAIL GPU Go tests ($rc)"
  exit "$rc"
fi

wait "$baseb" || exit 1
runs="gpt2-124M:decode_b1_i128_o128,tput_b64_i128_o128 tinyllama-1.1B:decode_b1_i128_o128,tput_b64_i128_o128
llama2-7B:decode_b1_i128_o128,tput_b64_i128_o128 gpt-350M:lat_b1_i128_o8,lat_b8_i128_o8,lat_b64_i128_o8"
t0=$SECONDS
# shellcheck disable=SC2046
write_checkpoint $(for r in $runs; do echo "${r%%:*}"; done)
echo "checkpoints in $((SECONDS - t0)) s"
rm -f "$out/recipe-ab.jsonl"
for round in $(seq "${ROUNDS:-2}"); do
  order="base new"
  [ $((round % 2)) = 0 ] && order="new base"
  for v in $order; do
    for r in $runs; do
      m=${r%%:*} wl=${r#*:}
      timeout "${STAGE_S:-120}" "$b/bin/$v/gpubench" -ckpt "$w/$m" -model "$m" -lib "$b/lib/libgollm_cuda_$v.so" \
        -workloads "$wl" -reps 3 2>> "$out/gpubench.err" | tag_rows variant "$v" round "$round" >> "$out/recipe-ab.jsonl" ||
        echo "FAIL: gpubench $v $m (round $round): $(tail -2 "$out/gpubench.err")"
    done
  done
done
echo "bench in $((SECONDS - t0)) s"
python3 - "$out/recipe-ab.jsonl" <<'PY'
import collections, json, statistics, sys
t = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["model"], r["workload"], r["metric"])
    if k not in order:
        order.append(k)
    t[k + (r["variant"],)].append(r["value"])
print(f"{'model':15} {'workload':22} {'metric':13} {'base':>24} {'new':>24} new/base")
for k in order:
    b, n = t[k + ("base",)], t[k + ("new",)]
    f = lambda xs: "/".join("%.4g" % x for x in xs)
    ratio = statistics.median(n) / statistics.median(b) if b and n else float("nan")
    print(f"{k[0]:15} {k[1]:22} {k[2]:13} {f(b):>24} {f(n):>24} {ratio:.3f}")
PY
