#!/usr/bin/env bash
# Where a request's latency goes through tritonserver (issues 17 and 18: GPT-350M's
# i128 o8 rows at 1.2-1.3x the engine), on the GPU machine. For each workload, in one
# lease: the engine alone (gpubench: the whole run and its prompt step), the batch manager
# alone with the overlap schedule (gpubench serve_), and tritonserver with streams opened
# on the clock and preopened (tritonbench: the wall, the median stream's first token, the
# median gap after it), with GOLLM_ITER_TRACE on (bench/tritonbench/trace.py's summary: the
# wait from an execute's hand-over to the next iteration, the iterations' engine steps):
#   bash bench/tritonbench/latency.sh CARRY OUTDIR
# CARRY holds tritonserver.tar.xz and libtriton_gollm.so, libgollm_cuda.so, tritonbench and
# gpubench (loose, or in bins.tar.xz). Rows go to OUTDIR/latency.jsonl, traces to OUTDIR.
# BACKEND=path serves another libtriton_gollm.so and TAG=name marks its rows (impl
# gollm-triton-name), for comparing builds in one lease.
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/bench/device.sh"
device_unpack latency "$carry"
[ -n "${BACKEND:-}" ] && cp "$BACKEND" "$w/backends/gollm/libtriton_gollm.so"
tag=${TAG:+-$TAG}
mkdir -p "$out"
write_checkpoint gpt-350M
L=${WORKLOADS:-lat_b1_i128_o8,lat_b8_i128_o8,lat_b64_i128_o8}
S=${L//lat_/serve_}
g=(-ckpt "$w/gpt-350M" -model gpt-350M -lib "$w/bin/libgollm_cuda.so")
if [ -z "${NO_ENGINE:-}" ]; then
  "$w/bin/gpubench" "${g[@]}" -workloads "$L" | tee -a "$out/latency.jsonl"
  "$w/bin/gpubench" "${g[@]}" -overlap -workloads "$S" | tee -a "$out/latency.jsonl"
fi
gpt2_model g350 "$w/gpt-350M" KIND_GPU max_tokens_in_paged_kv_cache 65536
GOLLM_ITER_TRACE="$out/trace$tag" triton_start "$out/tritonserver.log" || exit 1
for round in 1 2; do
  "$w/bin/tritonbench" -addr 127.0.0.1:8001 -model g350 -name gpt-350M -workloads "$L" -reps 5 \
    | sed "s/\"gollm-triton\"/\"gollm-triton$tag\"/" | tee -a "$out/latency.jsonl"
  "$w/bin/tritonbench" -addr 127.0.0.1:8001 -model g350 -name gpt-350M -workloads "$L" -reps 5 -preopen \
    | sed "s/\"gollm-triton\"/\"gollm-triton$tag\"/" | tee -a "$out/latency.jsonl"
done
triton_stop "$out/tritonserver.log"
python3 "$root/bench/tritonbench/trace.py" "$out/trace$tag".* | tee "$out/trace-summary$tag.txt"
