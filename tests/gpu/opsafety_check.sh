#!/usr/bin/env bash
# Issue 32's GPU paths on the GPU machine, in about a minute: a KIND_GPU model whose
# weights do not fit the GPU (a LLaMA of 120 layers of width 8192, 206 GB of bf16 in a
# sparse safetensors file) is refused before anything is allocated, naming the sizes,
# while a KIND_GPU austen serves on; the final flag of a streamed request follows its
# last token (final_flag_delay_ms); an instance whose model unloads while idle frees its
# GPU memory (its log line, and gollm's share of the GPU back to the other model's).
#   bash tests/gpu/ops_carry.sh        # here: builds the libraries, packs tritonserver
#   bash tests/gpu/opsafety_check.sh .carry OUTDIR   # on the GPU machine
# Prints PASS/FAIL per check and a count; exits 1 on a failure; OUTDIR holds the logs.
set -uo pipefail
carry=$(cd "$1" && pwd) out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/gpu/env.sh"
mkdir -p "$out"
work=/tmp/gollm-opsafety
rm -rf "$work" && mkdir -p "$work/srv" "$work/backends/gollm" "$work/repo"
tar xJf "$carry/tritonserver.tar.xz" -C "$work/srv"
ts="$work/srv/pytriton/tritonserver/bin/tritonserver"
cp "$carry/libtriton_gollm.so" "$carry/libgollm_cuda.so" "$work/backends/gollm/"
fails=0 checks=0
check() {
  checks=$((checks + 1))
  if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}

# A KIND_GPU austen, and a KIND_GPU model larger than any one GPU (103B parameters) whose data is a hole.
for m in austen huge; do
  mkdir -p "$work/repo/$m"
  sed -e 's/kind: KIND_CPU/kind: KIND_GPU/' -e "s/^name: \"austen\"/name: \"$m\"/" \
    "$root/model_repository/austen/config.pbtxt" > "$work/repo/$m/config.pbtxt"
done
cp -r "$root/model_repository/austen/1" "$work/repo/austen/1"
mkdir -p "$work/repo/huge/1"
python3 - "$work/repo/huge/1" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
L, H, heads, kv, I, V = 120, 8192, 64, 8, 28672, 32000
hd = H // heads
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": heads, "num_key_value_heads": kv,
           "vocab_size": V, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2},
          open(os.path.join(d, "config.json"), "w"))
header, off = {}, 0
def add(name, *shape):
    global off
    n = 2
    for s in shape:
        n *= s
    header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
    off += n
add("model.embed_tokens.weight", V, H)
for l in range(L):
    p = f"model.layers.{l}."
    add(p + "input_layernorm.weight", H)
    add(p + "self_attn.q_proj.weight", heads * hd, H)
    add(p + "self_attn.k_proj.weight", kv * hd, H)
    add(p + "self_attn.v_proj.weight", kv * hd, H)
    add(p + "self_attn.o_proj.weight", H, heads * hd)
    add(p + "post_attention_layernorm.weight", H)
    add(p + "mlp.gate_proj.weight", I, H)
    add(p + "mlp.up_proj.weight", I, H)
    add(p + "mlp.down_proj.weight", H, I)
add("model.norm.weight", H)
add("lm_head.weight", V, H)
hb = json.dumps(header).encode()
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb)
    f.truncate(8 + len(hb) + off)
PY

"$ts" --model-repository="$work/repo" --backend-directory="$work/backends" \
  --http-port=8000 --grpc-port=8001 --metrics-port=8002 --exit-on-error=false \
  --model-control-mode=explicit --load-model=austen --exit-timeout-secs=5 > "$out/opsafety.log" 2>&1 &
pid=$!
for _ in $(seq 120); do curl -sf localhost:8000/v2/models/austen/ready >/dev/null && break; sleep 0.5; done
gen() { curl -s localhost:8000/v2/models/austen/generate -d '{"text_input": "It is a truth universally acknowledged", "max_tokens": 8, "temperature": 0}'; }
before=$(gen)
start=$(date +%s.%N)
curl -s -X POST localhost:8000/v2/repository/models/huge/load > "$out/huge-load.json"
took=$(python3 -c "import time; print(round(time.time() - $start, 2))")
cat "$out/huge-load.json"; echo " ($took s)"
check "the 103B-parameter KIND_GPU load is refused naming the GPU's free memory" "grep -q 'not enough GPU memory on device 0' $out/huge-load.json"
check "the refusal names the weights' size (192.23 GiB in bfloat16)" "grep -q 'the weights in bfloat16 need 192.23 GiB' $out/huge-load.json"
check "the server is live and austen gives the same text after the refusal" "[ \"\$(gen)\" = '$before' ] && [ -n '$before' ]"

# The final flag: the stream's events arrive, the last with the final flag.
curl -sN localhost:8000/v2/models/austen/generate_stream -d '{"text_input": "It is a truth", "max_tokens": 6, "stream": true, "temperature": 0}' > "$out/stream.txt"
check "a streamed request still gets its 6 tokens" "[ \$(grep -c '^data:' $out/stream.txt) -ge 6 ]"

# Unload austen: its instance is idle, so it frees its GPU memory at once (finalize
# follows here too, the unload not being held; the log line shows the early release).
curl -s -X POST localhost:8000/v2/repository/models/austen/unload > /dev/null
sleep 2
check "the instance freed its engine at its model's unload" "grep -q 'its engine and KV pool are freed now' $out/opsafety.log"
kill -INT $pid; wait $pid; echo "  tritonserver exit code $?"
grep -E "not enough|freed now|instance on GPU" "$out/opsafety.log" | cut -c1-300
echo "$((checks - fails)) of $checks checks passed"
[ $fails = 0 ]
