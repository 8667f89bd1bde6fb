#!/usr/bin/env bash
# `make serve`: runs tritonserver on the project's model repository and, beside it,
# gollm's OpenAI-compatible server (build/gollm-openai) in front of it; Ctrl-C (or
# either one exiting) stops both. Ports come from the environment, as make passes them;
# TRITON_FLAGS adds tritonserver flags (make's CPU_SERVER_FLAGS on a machine without a GPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
: "${HTTP_PORT:=8000}" "${GRPC_PORT:=8001}" "${METRICS_PORT:=8002}" "${OPENAI_PORT:=9000}" "${EXIT_TIMEOUT:=5}"

"$root/.deps/bin/tritonserver" --model-repository="$root/model_repository" \
  --backend-directory="$root/build/install/backends" --http-port="$HTTP_PORT" \
  --grpc-port="$GRPC_PORT" --metrics-port="$METRICS_PORT" --exit-timeout-secs="$EXIT_TIMEOUT" ${TRITON_FLAGS:-} &
triton=$!
# The OpenAI server reads each model's chat template and tokenizer from its checkpoint
# folder, found through the model repository as tritonserver finds it.
"$root/build/gollm-openai" -triton "127.0.0.1:$GRPC_PORT" -listen ":$OPENAI_PORT" \
  -model-repository "$root/model_repository" &
api=$!
trap 'kill "$triton" "$api" 2>/dev/null || true; wait || true' EXIT INT TERM
echo "serve: tritonserver starting (ready once it logs \"Started HTTPService\"; Ctrl-C stops it): Triton HTTP :$HTTP_PORT, gRPC :$GRPC_PORT, metrics :$METRICS_PORT; OpenAI API :$OPENAI_PORT/v1"
# Return when either exits; the trap stops the other.
wait -n "$triton" "$api"
