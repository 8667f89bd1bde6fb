# Sourced by the scripts that run on the GPU machine (bench/overlap.sh,
# bench/concurrency.sh, bench/tritonbench/admission.sh, bench/openai/device.sh): the
# carry unpacked, random GPT-2 checkpoints written, Triton models made from the shipped
# gpt2 config, tritonserver started and stopped. Not a script of its own.
#
# After device_unpack NAME CARRY: $w=/tmp/gollm-NAME holds bin/ (CARRY's bins.tar.xz
# unpacked, else CARRY's loose files), srv/ (CARRY's tritonserver.tar.xz), backends/gollm/
# (the two libraries, when carried), repo/ and lib/; $ts is tritonserver.
root=${root:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
source "$root/tests/gpu/env.sh"

device_unpack() {
  local carry=$2
  w=/tmp/gollm-$1
  rm -rf "$w" && mkdir -p "$w/bin" "$w/srv" "$w/lib" "$w/backends/gollm" "$w/repo"
  if [ -f "$carry/bins.tar.xz" ]; then
    tar xJf "$carry/bins.tar.xz" -C "$w/bin"
  else
    find "$carry" -maxdepth 1 -type f ! -name '*.tar.xz' -exec cp {} "$w/bin/" \;
  fi
  if [ -f "$carry/tritonserver.tar.xz" ]; then
    tar xJf "$carry/tritonserver.tar.xz" -C "$w/srv"
  fi
  local f
  for f in libtriton_gollm.so libgollm_cuda.so; do
    if [ -f "$w/bin/$f" ]; then cp "$w/bin/$f" "$w/backends/gollm/"; fi
  done
  ts="$w/srv/pytriton/tritonserver/bin/tritonserver"
}

# write_checkpoint NAME...: random-weight fp16 checkpoints in $w/NAME, of the shapes
# bench/gpu_peers.py knows (gpt2-124M, gpt-350M — the FasterTransformer table's —,
# tinyllama-1.1B, llama2-7B), made as it makes them (seed 1, on the GPU).
write_checkpoint() {
  python3 - "$root/bench" "$w" "$@" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import gpu_peers
for name in sys.argv[3:]:
    gpu_peers.make_checkpoint(sys.argv[2], name)
PY
}

# write_config NAME...: only the config.json of write_checkpoint's shapes, in $w/NAME,
# for gpubench -random-gb (random weights made in GPU memory: nothing written or read).
write_config() {
  python3 - "$root/bench" "$w" "$@" <<'PY'
import os
import sys
sys.path.insert(0, sys.argv[1])
import gpu_peers
for name in sys.argv[3:]:
    d = os.path.join(sys.argv[2], name)
    os.makedirs(d, exist_ok=True)
    gpu_peers.MODELS[name].to_json_file(os.path.join(d, "config.json"))
PY
}

# gpt2_model NAME CHECKPOINT KIND [KEY VALUE]...: the Triton model $w/repo/NAME, the
# shipped model_repository/gpt2/config.pbtxt pointed at CHECKPOINT, with instance kind
# KIND (KIND_GPU or KIND_CPU) and the given parameters added.
gpt2_model() {
  local name=$1 ckpt=$2 kind=$3
  shift 3
  mkdir -p "$w/repo/$name/1"
  sed -e "s/kind: KIND_CPU/kind: $kind/" -e "s|^name: \"gpt2\"|name: \"$name\"|" \
      -e "s|^# parameters { key: \"gpt_model_path\" value: { string_value: \"\" } }|parameters { key: \"gpt_model_path\" value: { string_value: \"$ckpt\" } }|" \
      "$root/model_repository/gpt2/config.pbtxt" > "$w/repo/$name/config.pbtxt"
  while [ $# -ge 2 ]; do
    printf 'parameters { key: "%s" value: { string_value: "%s" } }\n' "$1" "$2" >> "$w/repo/$name/config.pbtxt"
    shift 2
  done
}

# triton_start LOG [FLAG]...: tritonserver on $w/repo (HTTP 8000, gRPC 8001, metrics
# 8002) in the background, waited for until every model is ready (two minutes at most);
# $triton_pid is its process. Environment assignments before the call reach the server.
triton_start() {
  local log=$1
  shift
  "$ts" --model-repository="$w/repo" --backend-directory="$w/backends" \
    --grpc-port=8001 --http-port=8000 --metrics-port=8002 "$@" > "$log" 2>&1 &
  triton_pid=$!
  local i
  for i in $(seq 120); do
    curl -sf localhost:8000/v2/health/ready > /dev/null && return 0
    kill -0 "$triton_pid" 2> /dev/null || break
    sleep 1
  done
  echo "tritonserver did not become ready; the end of $log:" >&2
  tail -20 "$log" >&2
  return 1
}

# triton_stop LOG: stops the server and prints the log's first errors, if any.
triton_stop() {
  kill -INT "$triton_pid" 2> /dev/null
  wait "$triton_pid"
  grep -iE "error|panic" "$1" | head -5
}

# tag_rows KEY VALUE...: the JSON lines on stdin with the fields KEY: VALUE added (integers
# as numbers, the rest as strings) — gpubench's rows marked with what a run varied.
tag_rows() {
  python3 -c '
import json, sys
kv = sys.argv[1:]
extra = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in zip(kv[::2], kv[1::2])}
for line in sys.stdin:
    r = json.loads(line)
    r.update(extra)
    print(json.dumps(r))' "$@"
}
