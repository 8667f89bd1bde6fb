#!/usr/bin/env bash
# The OpenAI frontend's overhead where the cores are not the limit (issue 15): the CPU
# demo (the random gpt2 that make demo writes, KIND_CPU) served by tritonserver with
# gollm-openai in front, on the GPU machine's 16 cores, where run.sh's 2-core machine
# makes the frontend and the engine compete for the same cores. abload sends the same
# greedy streaming requests to Triton over gRPC and through gollm-openai in alternating
# phases, at each concurrency, and reads both servers' CPU time per token.
#   bash bench/openai/device.sh CARRY OUTDIR
# CARRY holds tritonserver.tar.xz and bins.tar.xz with libtriton_gollm.so, gollm-openai,
# abload and gollm-demo. Rows (BENCH.md's format, COMMIT from the environment) go to
# OUTDIR/openai.jsonl, the table to OUTDIR/openai.txt.
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/bench/device.sh"
device_unpack openai "$carry"
mkdir -p "$out"
"$w/bin/gollm-demo" -out "$w/repo/gpt2/1" || exit 1
cp "$root/model_repository/gpt2/config.pbtxt" "$w/repo/gpt2/"
triton_start "$out/tritonserver.log" --allow-gpu-metrics=false || exit 1
"$w/bin/gollm-openai" -triton 127.0.0.1:8001 -listen 127.0.0.1:9000 -model-repository "$w/repo" > "$out/openai.log" 2>&1 &
api=$!
for _ in $(seq 30); do curl -sf localhost:9000/health > /dev/null && break; sleep 1; done
for c in ${CONCURRENCY:-1 4 16}; do
  echo "== abload, concurrency $c"
  "$w/bin/abload" -triton 127.0.0.1:8001 -openai http://127.0.0.1:9000 -concurrency "$c" \
    -requests $((16 * c)) -rounds "${ROUNDS:-8}" -max-tokens 64 -openai-pid "$api" -triton-pid "$triton_pid" \
    >> "$out/abload.jsonl" 2>> "$out/abload.log" || tail -5 "$out/abload.log"
done
kill "$api"
wait "$api"
triton_stop "$out/tritonserver.log"
python3 "$root/bench/openai/summarize.py" "$out" "${COMMIT:-unknown}" 64 64 > "$out/openai.jsonl" 2> "$out/openai.txt"
cat "$out/openai.txt"
