#!/usr/bin/env bash
# The max-load benchmark (issue 34), in the manner of trtllm-bench, on the GPU machine:
# random-weight fp16 checkpoints written as real files (bench/gpu_peers.py's shapes, by
# transformers on the GPU), then for each shape a grid of load cells — input/output
# lengths × concurrency — run by gpubench through the batch manager as the server drives
# it (engine alone: the overlap schedule, chunked prompts under max_num_tokens 8192 a
# step, max_batch_size 1,024, the KV pool from 0.9 of the free memory) and by tritonbench
# through tritonserver (streaming gRPC, a stream per request, KIND_GPU with the same
# settings). Each cell reports output tokens/s and TTFT and inter-token latency at p50,
# p90 and p99 (bench/loadstat).
#   bash bench/maxload.sh BINDIR OUTDIR
# BINDIR holds gpubench, tritonbench, libgollm_cuda.so, libtriton_gollm.so and, for the
# tritonserver part, tritonserver.tar.xz (tests/gpu/triton_carry.sh). Rows (BENCH.md's
# format) go to OUTDIR/maxload.jsonl, the logs beside them, a table last.
#
# The grid, by environment (defaults in brackets):
#   SHAPES   checkpoint shapes ["llama3.1-8B llama2-7B"]
#   IO       input/output lengths ["128/128 2048/128"; 128/2048 too: see below]
#   CONC     concurrencies, max = every request offered at once ["max 256 64 8 1"]
#   IMPL     engine, triton or both ["engine triton"]
#   BUDGET_S seconds for the whole grid [480]: each shape × impl gets its share (its load
#            included) and stops where it runs out, the cells done so far kept; cells run
#            in the order of IO, then CONC, so the first named are the ones kept
#   CKPTS    where the checkpoints go [/tmp/gollm-maxload/ckpt]; written once, reused
#   EXTRA    workloads added to every engine run (gpubench's, e.g. tput_b64_i128_o128)
#   PORT     tritonserver's HTTP port, gRPC and metrics the next two [8000]
#   KIND     the tritonserver model's instance kind [KIND_GPU]; KIND_CPU tries the script
#            on a machine without a GPU (IMPL=triton, a small checkpoint in CKPTS/SHAPE)
#   QUANT    fp8: the projections quantized at load (gpubench -quantization, the model's
#            quantization parameter) [none]
#   KV_DTYPE fp8: an FP8 KV cache (-kv-cache-dtype, kv_cache_dtype) [the compute type]
# A cell's request count keeps it to seconds on an H100 for the 8B shape: under max load
# 1,024 requests of input 128 (256 of input 2,048 or output 2,048); at concurrency C, 2C
# (at least 4) of input and output 128, C (at least 4) of input 2,048, C of output 2,048. The default grid (2 shapes × 2 impls × 10
# cells) fits one device call of 9 minutes with the checkpoints' writing. Output 2,048 is
# 2,048 steps a cell whatever the count (13-60 s each, and Llama-2-7B's KV pool holds only
# about 45 such sequences, so its concurrency 64 and up run in waves): IO=128/2048 is a
# call of its own per shape (IMPL=engine, then IMPL=triton, BUDGET_S=500).
set -uo pipefail
bins=$(cd "$1" && pwd) out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
source "$root/tests/gpu/env.sh"
SHAPES=${SHAPES:-"llama3.1-8B llama2-7B"}
IO=${IO:-"128/128 2048/128"}
CONC=${CONC:-"max 256 64 8 1"}
IMPL=${IMPL:-"engine triton"}
BUDGET_S=${BUDGET_S:-480}
CKPTS=${CKPTS:-/tmp/gollm-maxload/ckpt}
port=${PORT:-8000}
w=/tmp/gollm-maxload
mkdir -p "$w" "$CKPTS"
commit=$(head -1 "$bins/commit" 2> /dev/null || echo unknown)
machine=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)
rows="$out/maxload.jsonl"
raw="$w/rows.jsonl"
: > "$raw"

# cells: the grid's load workloads, one a line.
cells() {
  local io c i o n
  for io in $IO; do
    i=${io%/*} o=${io#*/}
    for c in $CONC; do
      if [ "$c" = max ]; then
        if [ "$o" -ge 1024 ] || [ "$i" -ge 1024 ]; then n=256; else n=1024; fi
        c=0
      elif [ "$o" -ge 1024 ]; then
        n=$c
      elif [ "$i" -ge 1024 ]; then
        n=$((c < 4 ? 4 : c))
      else
        n=$((2 * c < 4 ? 4 : 2 * c))
      fi
      echo "load_c${c}_n${n}_i${i}_o${o}"
    done
  done
}
list=$(cells | paste -sd, -)
[ -n "${EXTRA:-}" ] && list="$list,$EXTRA"
nshapes=$(echo $SHAPES | wc -w) nimpl=$(echo $IMPL | wc -w)
share=$((BUDGET_S / (nshapes * nimpl)))
echo "== grid: $list"
echo "== $nshapes shapes × $nimpl impls, $share s each (budget $BUDGET_S s)"

missing=
for shape in $SHAPES; do
  # A checkpoint with weights is reused (as gpu_peers.make_checkpoint reuses one with a
  # config.json); importing torch alone costs seconds.
  ls "$CKPTS/$shape"/model*.safetensors > /dev/null 2>&1 || missing="$missing $shape"
done
echo "== checkpoints to write:${missing:- none}"
[ -z "$missing" ] || python3 - "$root/bench" "$CKPTS" $missing <<'PY' || { echo "FAIL writing the checkpoints"; exit 1; }
import sys, time
sys.path.insert(0, sys.argv[1])
import gpu_peers
for name in sys.argv[3:]:
    t = time.time()
    gpu_peers.make_checkpoint(sys.argv[2], name)
    print(f"  {name}: {time.time() - t:.0f} s", flush=True)
PY

if [[ " $IMPL " == *" triton "* ]] && [ -f "$bins/tritonserver.tar.xz" ]; then
  rm -rf "$w/srv" "$w/backends" && mkdir -p "$w/srv" "$w/backends/gollm"
  tar xJf "$bins/tritonserver.tar.xz" -C "$w/srv"
  cp "$bins/libtriton_gollm.so" "$bins/libgollm_cuda.so" "$w/backends/gollm/"
fi

for shape in $SHAPES; do
  ckpt="$CKPTS/$shape"
  for impl in $IMPL; do
    t0=$SECONDS
    if [ "$impl" = engine ]; then
      echo "== $shape: engine alone (gpubench)"
      timeout "$share" "$bins/gpubench" -ckpt "$ckpt" -model "$shape" -lib "$bins/libgollm_cuda.so" -overlap \
        -max-batch 1024 -max-num-tokens 8192 -reps 3 -workloads "$list" \
        ${QUANT:+-quantization "$QUANT"} ${KV_DTYPE:+-kv-cache-dtype "$KV_DTYPE"} \
        > "$w/engine-$shape.jsonl" 2> "$out/gpubench-$shape.log"
      rc=$?
      grep '^gpubench: ' "$out/gpubench-$shape.log" | sed 's/^/   /'
      cat "$w/engine-$shape.jsonl" >> "$raw"
    elif [ -x "$w/srv/pytriton/tritonserver/bin/tritonserver" ]; then
      echo "== $shape: through tritonserver (tritonbench)"
      repo="$w/repo-$shape" && rm -rf "$repo" && mkdir -p "$repo/m/1"
      sed -e "s/kind: KIND_CPU/kind: ${KIND:-KIND_GPU}/" -e 's/^name: "gpt2"/name: "m"/' -e 's/^max_batch_size: .*/max_batch_size: 1024/' \
        "$root/model_repository/gpt2/config.pbtxt" > "$repo/m/config.pbtxt"
      settings=("gpt_model_path $ckpt" "enable_chunked_context true" "max_num_tokens 8192")
      [ -n "${QUANT:-}" ] && settings+=("quantization $QUANT")
      [ -n "${KV_DTYPE:-}" ] && settings+=("kv_cache_dtype $KV_DTYPE")
      for kv in "${settings[@]}"; do
        set -- $kv
        sed -i "/key: \"$1\"/d" "$repo/m/config.pbtxt"
        printf 'parameters { key: "%s" value: { string_value: "%s" } }\n' "$1" "$2" >> "$repo/m/config.pbtxt"
      done
      rm -f "$w/trace-$shape".*
      # The iteration trace (backend/profile.go) says where a step's time went: the engine,
      # the batch manager, the response senders (bench/tritonbench/trace.py).
      GOLLM_ITER_TRACE="$w/trace-$shape" "$w/srv/pytriton/tritonserver/bin/tritonserver" --model-repository="$repo" --backend-directory="$w/backends" \
        --http-port="$port" --grpc-port=$((port + 1)) --metrics-port=$((port + 2)) > "$out/tritonserver-$shape.log" 2>&1 &
      pid=$!
      remaining=$((share - (SECONDS - t0)))
      timeout "$remaining" "$bins/tritonbench" -addr 127.0.0.1:$((port + 1)) -model m -name "$shape" -conns 8 \
        -dtype "${QUANT:-fp16}" -kv-fp8="$([ "${KV_DTYPE:-}" = fp8 ] && echo true || echo false)" \
        -vocab "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$ckpt/config.json")" \
        -wait 150s -workloads "$(cells | paste -sd, -)" > "$w/triton-$shape.jsonl" 2> "$out/tritonbench-$shape.log"
      rc=$?
      grep '^tritonbench: ' "$out/tritonbench-$shape.log" | sed 's/^/   /'
      grep -oE 'gollm: (instance ready|instance on GPU|batch size limited).*' "$out/tritonserver-$shape.log" | cut -c1-300 | sed 's/^/   /'
      sleep 1 # the last final responses' bookkeeping
      curl -s localhost:$((port + 2))/metrics | grep '^gollm_' > "$out/metrics-$shape.txt"
      kill -INT "$pid" 2> /dev/null
      wait "$pid"
      cat "$w/triton-$shape.jsonl" >> "$raw"
      python3 "$root/bench/tritonbench/trace.py" "$w/trace-$shape".* > "$out/trace-$shape.txt" 2>&1 &&
        tail -8 "$out/trace-$shape.txt" | sed 's/^/   /'
    else
      echo "   no tritonserver.tar.xz in $bins: the tritonserver part is left out"
      continue
    fi
    done_cells=$(grep -c '"tokens_per_s"' "$w/$impl-$shape.jsonl" 2> /dev/null)
    echo "   $shape $impl: exit $rc$([ "$rc" = 124 ] && echo ' (budget spent)'), $done_cells cells in $((SECONDS - t0)) s"
  done
done

python3 - "$raw" "$rows" "$commit" "$machine" <<'PY'
import datetime, json, sys
raw, path, commit, machine = sys.argv[1:]
date = datetime.date.today().isoformat()
rows = []
for line in open(raw):
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    rows.append(dict({"date": date, "commit": commit, "machine": machine}, **r))
with open(path, "a") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
cells = {}
for r in rows:
    if "concurrency" not in r:
        continue
    key = (r["model"], r["workload"], r["impl"])
    c = cells.setdefault(key, {"requests": r.get("requests")})
    c[r["metric"]] = r["value"]
    for k in ("seqs_per_iteration_mean", "engine_ms_per_iteration"):
        if k in r:
            c[k] = r[k]
print(f"{'model':<13} {'workload':<22} {'impl':<21} {'reqs':>5} {'tokens/s':>9} {'TTFT p50':>9} {'p99':>9} {'ITL p50':>8} {'p99':>8} {'seq/it':>7} {'eng ms/it':>9}  (ms)")
for (m, wl, impl), c in sorted(cells.items()):
    g = lambda k: c.get(k, float("nan"))
    print(f"{m:<13} {wl:<22} {impl:<21} {c['requests']:>5} {g('tokens_per_s'):>9.0f} {g('ttft_ms'):>9.1f} "
          f"{g('ttft_ms_p99'):>9.1f} {g('itl_ms'):>8.2f} {g('itl_ms_p99'):>8.2f} "
          f"{g('seqs_per_iteration_mean'):>7.1f} {g('engine_ms_per_iteration'):>9.2f}")
for r in rows:
    if "concurrency" not in r:
        print(f"{r['model']:<13} {r['workload']:<22} {r['impl']:<21} {r['metric']} {r['value']:.1f}")
for (m, wl, impl), c in sorted(cells.items()):
    # The engine's cell of the same settings: gollm-triton[-kvfp8] beside gollm-engine-overlap[-kvfp8].
    e = cells.get((m, wl, impl.replace("gollm-triton", "gollm-engine-overlap", 1)))
    if impl in ("gollm-triton", "gollm-triton-kvfp8") and e and "tokens_per_s" in c and "tokens_per_s" in e:
        print(f"{m} {wl}: through tritonserver {c['tokens_per_s'] / e['tokens_per_s']:.2f}× the engine")
PY
echo "rows: $rows"
