#!/usr/bin/env bash
# Issue 16 on the GPU machine, in about a minute: two KIND_GPU models at
# gpu_memory_utilization 0.45 each get their share (each model's GiB printed) and a third
# is refused with the sizes; the per-GPU metrics (NVML, power included — or said to be
# unsupported where NVML says so) and the instance's device log line; a failed step
# (GOLLM_CUDA_FAIL_STEP=70, under the overlap schedule) fails its request,
# the instance serves on, and the same greedy request gets the same text after the
# recovery as before the fault; a lost context (3:lost) leaves it not ready and refusing,
# without a crash; an allocation that fails at load (GOLLM_CUDA_FAIL_ALLOC) is a clear
# load error; then a short soak at concurrency 64.
#   bash tests/gpu/ops_check.sh .carry OUTDIR [SOAK_DURATION, default 60s]
# after tests/gpu/ops_carry.sh here. Prints PASS/FAIL per check and a count at the end;
# exits 1 on a failure. OUTDIR ends up holding ops.tar.gz (every log, metrics page and
# response the checks read) and the soak's soak-gpu.jsonl and .svg: the device machine
# returns only a few files.
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
fails=0 checks=0 failed=()
check() {
  checks=$((checks + 1))
  if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); failed+=("$1"); fi
}

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
# gen MODEL [MAX_TOKENS]: a greedy request's response body.
gen() { curl -s "localhost:8000/v2/models/$1/generate" -d "{\"text_input\": \"It is a truth universally acknowledged\", \"max_tokens\": ${2:-8}, \"temperature\": 0}"; }
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
# Power: a series NVML never set stays 0 (backend/gpumetrics.go sets it only when
# NVML's power query succeeds, and treats NVML's NOT_SUPPORTED as no reading, without a
# log line); nvidia-smi, where there is one, tells unsupported from a reading lost.
nvidia-smi --query-gpu=uuid,power.draw --format=csv,noheader > "$out/nvidia-smi-power.txt" 2>&1
power=$(python3 - "$out/share-metrics.txt" "$out/share.log" "$out/nvidia-smi-power.txt" <<'PY'
import re, sys
metrics, log, smi = (open(p, errors="replace").read() for p in sys.argv[1:4])
rows = re.findall(r'^gollm_gpu_power_watts\{([^}]*)\} (\S+)', metrics, re.M)
if not rows:
    print("fail: no gollm_gpu_power_watts series"); sys.exit()
verdicts = []
for labels, v in rows:
    uuid = (re.search(r'uuid="([^"]*)"', labels) or [None, "?"])[1]
    w = float(v)
    smi_w = None
    for line in smi.splitlines():
        if line.startswith(uuid):
            try:
                smi_w = float(line.split(",")[1].strip().split()[0])
            except (IndexError, ValueError):
                smi_w = None  # [N/A], [Not Supported]
            smi_say = line.split(",", 1)[1].strip() if "," in line else line
    if w > 0:
        verdicts.append(("ok" if w < 5000 else "fail", f"{w:.1f} W on {uuid}"))
    elif "reading the GPU with NVML failed" in log:
        verdicts.append(("fail", f"0 W on {uuid}: NVML's read failed (see share.log)"))
    elif smi_w:
        verdicts.append(("fail", f"0 W on {uuid}, but nvidia-smi reads {smi_w} W"))
    else:
        says = f"nvidia-smi: {smi_say}" if smi_w is None and uuid in smi else "no nvidia-smi reading to compare"
        verdicts.append(("unsupported", f"0 W on {uuid}; {says}"))
worst = "fail" if any(k == "fail" for k, _ in verdicts) else "unsupported" if any(k == "unsupported" for k, _ in verdicts) else "ok"
print(worst + ": " + "; ".join(t for _, t in verdicts))
PY
)
case $power in
  unsupported:*) check "gollm_gpu_power_watts: NVML reports power unsupported on this GPU, so the series stays 0 (${power#unsupported: })" true ;;
  *) check "gollm_gpu_power_watts on /metrics (${power#*: })" "[ '${power%%:*}' = ok ]" ;;
esac
check "gollm's share is about 0.9 of the GPU" "python3 - $out/share-metrics.txt <<'PY'
import re, sys
t = open(sys.argv[1]).read()
total = float(re.search(r'^gollm_gpu_memory_total_bytes\{[^}]*\} (\S+)', t, re.M).group(1))
own = sum(float(v) for v in re.findall(r'^gollm_gpu_gollm_memory_bytes\{[^}]*\} (\S+)', t, re.M))
print(f'  gollm holds {own/2**30:.2f} of {total/2**30:.2f} GiB = {own/total:.3f}')
sys.exit(0 if 0.88 <= own / total <= 0.9 else 1)
PY"
# Each model's own share, from its instance's log line (weights once per model), and the
# line to archive with the result.
python3 - "$out/share-metrics.txt" "$out/share.log" > "$out/share-models.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
total = float(re.search(r'^gollm_gpu_memory_total_bytes\{[^}]*\} (\S+)', t, re.M).group(1))
models = {}
for line in open(sys.argv[2], errors="replace"):
    if "instance on GPU" not in line:
        continue
    # Triton's log quotes the message: the fields' quotes come as \".
    f = dict(re.findall(r'"(\w+)": ("[^"]*"|\d+)', line.replace('\\"', '"')))
    m = models.setdefault(f["model"].strip('"'), [0, 0, 0])
    m[0] = max(m[0], int(f["weight_bytes"]))  # one copy per model
    m[1] += int(f["kv_bytes"])
    m[2] += int(f["scratch_bytes"])
g = 2**30
print(f"  per-model GiB of the GPU's {total / g:.2f}: " + "; ".join(
    f"{n} {sum(m) / g:.2f} (weights {m[0] / g:.2f}, kv {m[1] / g:.2f}, scratch {m[2] / g:.2f}) = {sum(m) / total:.3f}"
    for n, m in sorted(models.items())))
shares = [sum(m) / total for m in models.values()]
sys.exit(0 if len(shares) == 2 and all(0.43 <= x <= 0.4501 for x in shares) else 1)
PY
permodel=$?
cat "$out/share-models.txt"
check "each model at 0.45 holds 0.43 to 0.45 of the GPU, weights included" "[ $permodel = 0 ]"
gen a; echo
gen b; echo
stop

echo "== GOLLM_CUDA_FAIL_STEP=70: the step's request fails, the instance serves on, greedy text as before"
# The same greedy request of at most 32 tokens until one meets step 70: a step a token
# (one more where an end token stops it while the overlap schedule, on by default for
# GPU instances, has launched the next step ahead), so the first two are served and the
# fault fails a later one, in a step launched ahead unless it is that request's first.
# The answers before it are the reference and must agree; the answer after the recovery
# must be theirs — no silent wrong answer.
serve failstep "$work/one" GOLLM_CUDA_FAIL_STEP=70
n=0
while [ $n -lt 70 ]; do
  n=$((n + 1))
  gen g 32 > "$out/failstep-$n.json"
  echo "  $n: $(cut -c1-400 "$out/failstep-$n.json")"
  grep -q '"error"' "$out/failstep-$n.json" && break
done
gen g 32 > "$out/failstep-after.json"
echo "  after: $(cut -c1-400 "$out/failstep-after.json")"
check "greedy requests before the fault are served, the same answer each ($((n - 1)))" \
  "[ $n -gt 2 ] && grep -q text_output $out/failstep-1.json && cmp -s $out/failstep-1.json $out/failstep-2.json"
check "the failed step's request gets an error" "grep -q 'injected: GOLLM_CUDA_FAIL_STEP=70' $out/failstep-$n.json"
check "after the recovery the same greedy request gets the answer it got before the fault" \
  "grep -q text_output $out/failstep-after.json && cmp -s $out/failstep-1.json $out/failstep-after.json"
check "gollm_instance_ready 1" "metric gollm_instance_ready | grep -q ' 1$'"
check "the engine recovered (log)" "grep -q 'recovered' $out/failstep.log"
stop

echo "== GOLLM_CUDA_FAIL_STEP=3:lost: not ready, refusing, no crash"
serve lost "$work/one" GOLLM_CUDA_FAIL_STEP=3:lost
gen g > "$out/lost-1.json"; gen g > "$out/lost-2.json"
echo "  $(cat "$out/lost-1.json")"; echo "  $(cat "$out/lost-2.json")"
check "the failed step's request gets an error" "grep -q 'trapped' $out/lost-1.json"
check "a later request is refused as not ready" "grep -q 'is not ready' $out/lost-2.json"
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

# One file for the device to return: everything the checks wrote, the soak's results
# kept beside it for bench/results.
(cd "$out" && find . -mindepth 1 -maxdepth 1 ! -name ops.tar.gz -print0 | tar czf "$work/ops.tar.gz" --null -T -) &&
  mv "$work/ops.tar.gz" "$out/ops.tar.gz" &&
  find "$out" -mindepth 1 -maxdepth 1 ! -name ops.tar.gz ! -name 'soak-gpu.*' -exec rm -rf {} +
echo "ops_check: logs, metrics and responses in $out/ops.tar.gz ($(du -h "$out/ops.tar.gz" | cut -f1))"
for f in "${failed[@]}"; do echo "  failed: $f"; done
echo "ops_check: $checks checks, $((checks - fails)) passed, $fails failed"
[ $fails = 0 ]
