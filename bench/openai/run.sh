#!/usr/bin/env bash
# Load run of gollm's OpenAI server against Triton directly, with aiperf, on the CPU demo.
#
# Starts tritonserver and gollm-openai (scripts/serve.sh, on ports of its own), then
# runs aiperf with the same synthetic prompts (fixed seed) and streaming, in alternating
# rounds:
#   gollm-triton  Triton's own HTTP endpoint /v2/models/gpt2/generate_stream (SSE)
#   gollm-openai  gollm-openai's /v1/completions (SSE), which talks to Triton over gRPC
# and writes time to first token, inter-token latency and output throughput (medians
# over the rounds) to bench/results/<date>-openai-cpu.jsonl in BENCH.md's format, with
# the frontend's overhead. aiperf (with its ~1 GB of dependencies) is installed into
# .deps/aiperf on first use; it is not needed by `make test`.
#
#   bash bench/openai/run.sh            # defaults below
#   CONCURRENCY="1 4" ROUNDS=3 REQUESTS=64 ISL=64 OSL=64 bash bench/openai/run.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
CONCURRENCY=${CONCURRENCY:-"1 4"}
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-64}
ISL=${ISL:-64}
OSL=${OSL:-64}
HTTP_PORT=${HTTP_PORT:-18100} GRPC_PORT=${GRPC_PORT:-18101} METRICS_PORT=${METRICS_PORT:-18102} OPENAI_PORT=${OPENAI_PORT:-18190}
export HTTP_PORT GRPC_PORT METRICS_PORT OPENAI_PORT

AIPERF=aiperf==0.13.0
stamp=".deps/.stamp-aiperf-$AIPERF"
if [ ! -f "$stamp" ]; then
  rm -rf .deps/aiperf
  python3 -m pip install -q --disable-pip-version-check --no-warn-script-location --target .deps/aiperf "$AIPERF"
  touch "$stamp"
fi

make -s deps build demo >/dev/null
go build -o build/gollm-openai ./cmd/gollm-openai
out=$(mktemp -d)
bash scripts/serve.sh >"$out/serve.log" 2>&1 &
serve=$!
trap 'kill "$serve" 2>/dev/null; wait "$serve" 2>/dev/null || true; rm -rf "$out"' EXIT
for _ in $(seq 120); do
  curl -sf "localhost:$OPENAI_PORT/health" >/dev/null && curl -sf "localhost:$HTTP_PORT/v2/health/ready" >/dev/null && break
  sleep 1
done
curl -sf "localhost:$OPENAI_PORT/health" >/dev/null || { tail -50 "$out/serve.log"; echo "bench: the servers did not come up" >&2; exit 1; }

aiperf() {
  local name=$1 c=$2 r=$3; shift 3
  PYTHONPATH=.deps/aiperf python3 -m aiperf profile -m gpt2 --streaming --tokenizer model_repository/gpt2/1 \
    --synthetic-input-tokens-mean "$ISL" --synthetic-input-tokens-stddev 0 \
    --output-tokens-mean "$OSL" --output-tokens-stddev 0 --concurrency "$c" \
    --request-count "$REQUESTS" --warmup-request-count 4 --random-seed 1 --ui-type none \
    --artifact-dir "$out/$name-c$c-r$r" "$@" >"$out/$name-c$c-r$r.log" 2>&1 ||
    { tail -30 "$out/$name-c$c-r$r.log"; exit 1; }
}
for c in $CONCURRENCY; do
  for r in $(seq "$ROUNDS"); do
    echo "bench: concurrency $c, round $r/$ROUNDS"
    aiperf gollm-triton "$c" "$r" --url "localhost:$HTTP_PORT" --endpoint-type template \
      --custom-endpoint /v2/models/gpt2/generate_stream \
      --extra-inputs payload_template:bench/openai/triton_generate_stream.json.jinja \
      --extra-inputs response_field:text_output
    aiperf gollm-openai "$c" "$r" --url "localhost:$OPENAI_PORT" --endpoint-type completions
  done
done

# The same comparison without aiperf's own load on the machine, and with the CPU time
# each server spends per token: abload sends the same greedy requests to Triton over
# gRPC (as gollm-openai does) and to gollm-openai, in alternating phases.
go build -o build/abload ./bench/openai/abload
api_pid=$(pgrep -f "build/gollm-openai -triton 127.0.0.1:$GRPC_PORT")
triton_pid=$(pgrep -f "tritonserver .*--grpc-port=$GRPC_PORT")
for c in $CONCURRENCY; do
  echo "bench: abload, concurrency $c"
  build/abload -triton "127.0.0.1:$GRPC_PORT" -openai "http://127.0.0.1:$OPENAI_PORT" -concurrency "$c" \
    -requests $((16 * c)) -rounds $((2 * ROUNDS + 2)) -max-tokens "$OSL" \
    -openai-pid "$api_pid" -triton-pid "$triton_pid" >>"$out/abload.jsonl" 2>>"$out/abload.log"
done

# One file per run: a second run on the same day names its commit.
commit=$(git rev-parse --short HEAD)
result="bench/results/$(date -u +%F)-openai-cpu.jsonl"
[ -e "$result" ] && result="bench/results/$(date -u +%F)-openai-$commit-cpu.jsonl"
python3 bench/openai/summarize.py "$out" "$commit" "$ISL" "$OSL" >"$result"
echo "bench: wrote $result"
