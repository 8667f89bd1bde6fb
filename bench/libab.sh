#!/usr/bin/env bash
# Builds or settings against each other on the GPU machine, alternating in one lease
# (cuda/README.md's method): gpubench on each model's workloads with libgollm_cuda.so,
# then each other library in CARRY (libgollm_cuda_NAME.so) and each setting of VARIANTS
# (space-separated; VAR=VALUE, several joined by +; run with libgollm_cuda.so), ROUNDS
# times (default 2).
#   RUNS="gpt2-124M:decode_b1_i128_o128,tput_b64_i128_o128 tinyllama-1.1B:decode_b1_i128_o128" \
#   VARIANTS="GOLLM_CUDA_DECODE_PARTS=1" bash bench/libab.sh CARRY OUTDIR
# CARRY holds gpubench and the libraries (loose or in bins.tar.xz), and beside a library
# libgollm_cuda_NAME.so of another ABI its own gpubench_NAME (bench/libab_points.sh builds
# such a carry from commits). RANDOM_GB=n gives the models random weights in GPU memory
# (gpubench -random-gb n, config.json alone) instead of checkpoint files;
# GPUBENCH_FLAGS are added to every gpubench run (-quantization fp8, say). Rows go to
# OUTDIR/libab.jsonl with "variant" added (base, the library's NAME, or the setting); a
# table of the medians per variant is printed last.
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/device.sh"
device_unpack libab "$carry"
mkdir -p "$out"
runs=${RUNS:-"gpt2-124M:decode_b1_i128_o128,tput_b64_i128_o128 tinyllama-1.1B:decode_b1_i128_o128,tput_b64_i128_o128"}
models=$(for r in $runs; do echo "${r%%:*}"; done | sort -u)
rg=()
if [ -n "${RANDOM_GB:-}" ]; then
  # shellcheck disable=SC2086
  write_config $models
  rg=(-random-gb "$RANDOM_GB")
else
  # shellcheck disable=SC2086
  write_checkpoint $models
fi
lim=${STAGE_S:-120}
variants="base"
for l in $(cd "$w/bin" && ls libgollm_cuda_*.so 2> /dev/null); do
  l=${l#libgollm_cuda_}
  variants="$variants ${l%.so}"
done
variants="$variants ${VARIANTS:-}"
for round in $(seq "${ROUNDS:-2}"); do
  for v in $variants; do
    lib=libgollm_cuda.so envs=() gb=$w/bin/gpubench
    case $v in
      base) ;;
      *=*) IFS=+ read -ra envs <<< "$v" ;;
      *) lib=libgollm_cuda_$v.so && [ -x "$w/bin/gpubench_$v" ] && gb=$w/bin/gpubench_$v ;;
    esac
    for r in $runs; do
      m=${r%%:*} wl=${r#*:}
      env ${envs[@]+"${envs[@]}"} timeout "$lim" "$gb" -ckpt "$w/$m" -model "$m" -lib "$w/bin/$lib" \
        -workloads "$wl" -reps 3 ${rg[@]+"${rg[@]}"} ${GPUBENCH_FLAGS:-} 2> /dev/null | tag_rows variant "$v" round "$round" >> "$out/libab.jsonl"
    done
  done
done
python3 - "$out/libab.jsonl" <<'PY'
import collections, json, sys
t = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    k = (r["model"], r["workload"])
    if k not in order:
        order.append(k)
    t[k + (r["variant"],)].append(r["value"])
vs = []
for line in open(sys.argv[1]):
    v = json.loads(line)["variant"]
    if v not in vs:
        vs.append(v)
print("model workload | " + " | ".join(vs))
for k in order:
    print(k[0], k[1], "|", " | ".join("/".join("%.4g" % x for x in t[k + (v,)]) for v in vs))
PY
