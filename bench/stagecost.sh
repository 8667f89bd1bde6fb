#!/usr/bin/env bash
# Where a step's time goes on the full-size shapes the open targets name (issues 34, 37):
# bench/skipcost.sh's method (gpubench with GOLLM_CUDA_SKIP = one stage kind's bit at a
# time; the difference from the whole step is that stage's cost in place) on random
# weights held in memory (-random-gb, no files), one gpubench run per skip.
#   bash bench/stagecost.sh OUTDIR [PLAN]
# Builds a GOLLM_MEASURE library with tests/gpu/build_lib.sh unless $PREBUILT_LIB names
# one; gpubench comes from $GPUBENCH (go build -o X ./bench/gpubench here). PLAN lines:
#   MODEL DTYPE WORKLOADS SKIPS [TP [ENV]]   (SKIPS comma-separated bit masks; 0 first)
# MODEL is a name bench/gpu_peers.py or bench/moe_peers.py knows. TP is gpubench's -tp
# (default $TP, else 1: GPUs 0..TP-1); ENV comma-separated NAME=VALUE settings for the
# line's runs (GOLLM_CUDA_CUSTOM_AR=0: NCCL alone). Rows go to OUTDIR/stagecost.jsonl
# with "skip", "tp" and "env" added; the table of deltas, each against its line's skip 0,
# to OUTDIR/stagecost.txt.
# Bits (1 << gollm_stage_kind): 2 norms, 4 QKV, 8 rotary, 16 KV write, 32 attention,
# 64 output projection, 128 MLP, 256 residual adds, 512 LM head and sampling, 1024 q/k
# norms, 2048 post-norms, 4096 experts; 1073741824 (bit 30) tensor parallelism's
# all-reduces (each rank's share added and normed alone: the communication's cost).
# bench/stagecost_tp.plan: where a TP 4 step of Llama-2-7B goes, beside TP 1.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "$1")
plan=${2:-$root/bench/stagecost.plan}
mkdir -p "$out"
source "$root/tests/gpu/env.sh" > /dev/null
lib=${PREBUILT_LIB:-$out/libgollm_cuda_measure.so}
if [ -z "${PREBUILT_LIB:-}" ]; then
  GOLLM_NVCC_EXTRA=-DGOLLM_MEASURE bash "$root/tests/gpu/build_lib.sh" "$lib" || exit 1
fi
work=/tmp/gollm-stagecost
mkdir -p "$work"
# The configs of the plan's models (bench/gpu_peers.py's or bench/moe_peers.py's shapes).
python3 "$root/bench/moe_peers.py" --write-configs "$work" \
  --models "$(grep -v '^#' "$plan" | awk 'NF { print $1 }' | sort -u | paste -sd, -)"
t0=$SECONDS
grep -v '^#' "$plan" | while read -r m dt wl skips tp envs; do
  [ -n "$m" ] || continue
  tp=${tp:-${TP:-1}}
  sets=()
  [ -n "${envs:-}" ] && IFS=, read -ra sets <<< "$envs"
  for s in ${skips//,/ }; do
    echo "[$((SECONDS - t0)) s] $m $wl TP $tp ${envs:-} skip $s" >&2
    tag=$m-tp$tp-${envs//[^A-Za-z0-9]/_}-$s
    env "${sets[@]}" GOLLM_CUDA_SKIP=$s timeout "${STAGE_S:-120}" "$GPUBENCH" -ckpt "$work/$m" -model "$m" -dtype "$dt" \
      -random-gb "${RANDOM_GB:-70}" -lib "$lib" -workloads "$wl" -reps "${REPS:-3}" -tp "$tp" 2> "$out/err-$tag.log" |
      python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l); r["skip"]=int(sys.argv[1]); r["tp"]=int(sys.argv[2]); r["env"]=sys.argv[3]; print(json.dumps(r))' \
        "$s" "$tp" "${envs:-}" | tee -a "$out/stagecost.jsonl"
  done
done
python3 - "$out/stagecost.jsonl" <<'PY' | tee "$out/stagecost.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = lambda r: (r["model"], r["workload"], r.get("tp", 1), r.get("env", ""))
base = {key(r): r["value"] for r in rows if r["skip"] == 0}
def ms(r, v):
    if r["metric"] == "tokens_per_s":
        B = int(r["workload"].split("_b")[1].split("_")[0])
        return 1e3 * B / v
    return v
print("model workload tp env skip ms/step delta(ms/step) share")
for r in rows:
    b = base.get(key(r))
    if b is None:
        continue
    whole = ms(r, b)
    d = whole - ms(r, r["value"])
    print(r["model"], r["workload"], r.get("tp", 1), r.get("env") or "-", r["skip"], round(ms(r, r["value"]), 4), round(d, 4), f"{d / whole:.1%}")
PY
