#!/usr/bin/env bash
# Issue 16 on the GPU machine, in about a minute: two KIND_GPU models at
# gpu_memory_utilization 0.45 each get their share and a third is refused with the sizes;
# the per-GPU metrics (NVML) and the instance's device log line; a failed step
# (GOLLM_CUDA_FAIL_STEP=3) fails its request and the instance serves on; a lost context
# (3:lost) leaves it not ready and refusing, without a crash; an allocation that fails at
# load (GOLLM_CUDA_FAIL_ALLOC) is a clear load error; then a short soak at concurrency 64.
#   bash tests/gpu/ops_check.sh .carry OUTDIR [SOAK_DURATION, default 60s]
# after tests/gpu/ops_carry.sh here. Prints PASS/FAIL per check; exits 1 on a failure.
# SOAK_ONLY=1 runs the soak alone (the 8-minute soak of a device call of its own).
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2 soak=${3:-60s}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/gpu/env.sh"
mkdir -p "$out"
work=/tmp/gollm-ops
rm -rf "$work" && mkdir -p "$work/srv" "$work/backends/gollm"
tar xJf "$carry/tritonserver.tar.xz" -C "$work/srv"
ts="$work/srv/pytriton/tritonserver/bin/tritonserver"
cp "$carry/libtriton_gollm.so" "$carry/libgollm_cuda.so" "$work/backends/gollm/"
fails=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

# repo DIR NAME [PARAM VALUE]...: a KIND_GPU copy of the austen demo model.
repo() {
  local dir=$1 name=$2
  shift 2
  mkdir -p "$dir/$name"
  cp -r "$root/model_repository/austen/1" "$dir/$name/1"
  sed -e 's/kind: KIND_CPU/kind: KIND_GPU/' -e "s/^name: \"austen\"/name: \"$name\"/" \
    "$root/model_repository/austen/config.pbtxt" > "$dir/$name/config.pbtxt"
  while [ $# -gt 0 ]; do
    echo "parameters { key: \"$1\" value: { string_value: \"$2\" } }" >> "$dir/$name/config.pbtxt"
    shift 2
  done
}
# serve NAME REPO [ENV=...]...: starts tritonserver, waits up to 60 s for it to answer.
serve() {
  local name=$1 repo=$2
  shift 2
  env "$@" "$ts" --model-repository="$repo" --backend-directory="$work/backends" \
    --http-port=8000 --grpc-port=8001 --metrics-port=8002 --exit-on-error=false \
    --model-load-thread-count=1 \
    --exit-timeout-secs=5 > "$out/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf localhost:8000/v2/health/live >/dev/null && break; sleep 0.5; done
  sleep 1
}
stop() { kill -INT $pid; wait $pid; echo "  tritonserver exit code $?"; }
gen() { curl -s localhost:8000/v2/models/$1/generate -d '{"text_input": "It is a truth universally acknowledged", "max_tokens": 8, "temperature": 0}'; }
metric() { curl -s localhost:8002/metrics | grep "^$1" ; }

repo "$work/one" g
if [ "${SOAK_ONLY:-0}" != 1 ]; then
echo "== gpu_memory_utilization: two models at 0.45, a third refused"
repo "$work/share" a gpu_memory_utilization 0.45
repo "$work/share" b gpu_memory_utilization 0.45
repo "$work/share" c gpu_memory_utilization 0.45
serve share "$work/share"
metric gollm_gpu | tee "$out/share-metrics.txt"
grep -E "instance on GPU|wants|is free|NVML" "$out/share.log" | cut -c1-400
ready=0
for m in a b c; do curl -sf localhost:8000/v2/models/$m/ready && ready=$((ready + 1)); done
check "two of the three models at 0.45 are ready ($ready)" "[ $ready = 2 ]"
check "the third is refused, saying what it wanted and what was free" "grep -q 'wants .* is free' $out/share.log"
check "the instance logs its GPU by name and UUID" "grep -q 'instance on GPU.*GPU-' $out/share.log"
for f in gollm_gpu_memory_total_bytes gollm_gpu_memory_used_bytes gollm_gpu_utilization gollm_gpu_temperature_celsius gollm_gpu_gollm_memory_bytes; do
  check "$f on /metrics" "grep -q '^$f{' $out/share-metrics.txt"
done
check "gollm's share is about 0.9 of the GPU" "python3 - $out/share-metrics.txt <<'PY'
import re, sys
t = open(sys.argv[1]).read()
total = float(re.search(r'^gollm_gpu_memory_total_bytes\{[^}]*\} (\S+)', t, re.M).group(1))
own = sum(float(v) for v in re.findall(r'^gollm_gpu_gollm_memory_bytes\{[^}]*\} (\S+)', t, re.M))
print(f'  gollm holds {own/2**30:.2f} of {total/2**30:.2f} GiB = {own/total:.3f}')
sys.exit(0 if 0.88 <= own / total <= 0.9 else 1)
PY"
gen a; echo
gen b; echo
stop

echo "== GOLLM_CUDA_FAIL_STEP=3: the step's request fails, the instance serves on"
serve failstep "$work/one" GOLLM_CUDA_FAIL_STEP=3
r1=$(gen g); r2=$(gen g); echo "  $r1"; echo "  $r2"
check "the failed step's request gets an error" "echo '$r1' | grep -q 'injected: GOLLM_CUDA_FAIL_STEP=3'"
check "the next request is served" "echo '$r2' | grep -q text_output"
check "gollm_instance_ready 1" "metric gollm_instance_ready | grep -q ' 1$'"
check "the engine recovered (log)" "grep -q 'recovered' $out/failstep.log"
stop

echo "== GOLLM_CUDA_FAIL_STEP=3:lost: not ready, refusing, no crash"
serve lost "$work/one" GOLLM_CUDA_FAIL_STEP=3:lost
r1=$(gen g); r2=$(gen g); echo "  $r1"; echo "  $r2"
check "the failed step's request gets an error" "echo '$r1' | grep -q 'trapped'"
check "a later request is refused as not ready" "echo '$r2' | grep -q 'is not ready'"
check "gollm_instance_ready 0" "metric gollm_instance_ready | grep -q ' 0$'"
check "the server is live" "curl -sf localhost:8000/v2/health/live"
stop

echo "== GOLLM_CUDA_FAIL_ALLOC='KV pool': a clear load error"
serve oom "$work/one" "GOLLM_CUDA_FAIL_ALLOC=KV pool"
grep -E "failed to load" "$out/oom.log" | cut -c1-400
check "the load fails naming the KV pool and out of memory" "grep -q 'failed to load.*KV pool.*out of memory' $out/oom.log"
stop

fi

echo "== soak: $soak at concurrency 64"
serve soak "$work/one"
"$carry/soak" -model g -name austen-kind-gpu -duration "$soak" -concurrency 64 ${COMMIT:+-commit "$COMMIT"} -out "$out/soak-gpu.jsonl" > "$out/soak.txt" 2>&1
soak_rc=$?
grep -v "^soak: *[0-9]* s " "$out/soak.txt"
check "soak: no failure, gauges back to idle (exit code $soak_rc)" "[ $soak_rc = 0 ]"
stop
echo "ops_check: $fails failed"
[ $fails = 0 ]
