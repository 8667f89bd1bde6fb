#!/usr/bin/env bash
# `make serve`: runs tritonserver on the project's model repository and, beside it,
# gollm's OpenAI-compatible server (build/gollm-openai) in front of it; Ctrl-C (or
# either one exiting) stops both. Ports come from the environment, as make passes them;
# TRITON_FLAGS adds tritonserver flags (make's CPU_SERVER_FLAGS on a machine without a GPU).
#
# tritonserver's own HTTP API and metrics listen on loopback only (TRITON_HTTP_PORT and
# TRITON_METRICS_PORT, HTTP_PORT + 10 and METRICS_PORT + 10 unless set) and are served on
# HTTP_PORT and METRICS_PORT by gollm-openai's guard, which refuses request bodies over
# MAX_REQUEST_BYTES (4 MiB) before they reach tritonserver 2.51's HTTP parser: that
# parser crashes the whole server on a form-encoded body of about 4 MB, on either
# endpoint (triton-inference-server/server#5840), and 2.51 has no option to bound bodies.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
: "${HTTP_PORT:=8000}" "${GRPC_PORT:=8001}" "${METRICS_PORT:=8002}" "${OPENAI_PORT:=9000}" "${EXIT_TIMEOUT:=5}"
: "${TRITON_HTTP_PORT:=$((HTTP_PORT + 10))}" "${TRITON_METRICS_PORT:=$((METRICS_PORT + 10))}" "${MAX_REQUEST_BYTES:=4194304}"

"$root/.deps/bin/tritonserver" --model-repository="$root/model_repository" \
  --backend-directory="$root/build/install/backends" --http-address=127.0.0.1 --http-port="$TRITON_HTTP_PORT" \
  --grpc-port="$GRPC_PORT" --metrics-address=127.0.0.1 --metrics-port="$TRITON_METRICS_PORT" \
  --exit-timeout-secs="$EXIT_TIMEOUT" ${TRITON_FLAGS:-} &
triton=$!
# The OpenAI server reads each model's chat template and tokenizer from its checkpoint
# folder, found through the model repository as tritonserver finds it.
"$root/build/gollm-openai" -triton "127.0.0.1:$GRPC_PORT" -listen ":$OPENAI_PORT" \
  -model-repository "$root/model_repository" \
  -http-front ":$HTTP_PORT=127.0.0.1:$TRITON_HTTP_PORT" -http-front ":$METRICS_PORT=127.0.0.1:$TRITON_METRICS_PORT" \
  -max-request-bytes "$MAX_REQUEST_BYTES" &
api=$!
trap 'kill "$triton" "$api" 2>/dev/null || true; wait || true' EXIT INT TERM
echo "serve: tritonserver starting (ready once it logs \"Started HTTPService\"; Ctrl-C stops it): Triton HTTP :$HTTP_PORT (request bodies up to $MAX_REQUEST_BYTES bytes), gRPC :$GRPC_PORT, metrics :$METRICS_PORT; OpenAI API :$OPENAI_PORT/v1"
# Return when either exits; the trap stops the other.
wait -n "$triton" "$api"
