#!/usr/bin/env bash
# Load against the GPU model (issue 18): perf_analyzer at concurrency 1 to 64 against
# GPT-2 124M (fp16, KIND_GPU, the shipped config's settings with the overlap schedule on,
# as by default), each request a 128-token prompt and 128 new tokens streamed; then
# transformers on the same checkpoint at batch sizes equal to the concurrencies (eager
# generate; static-cache generate, which compiles, at 1, 8 and 64). The server runs with
# GOLLM_ITER_TRACE, so bench/tritonbench/trace.py can say where a step's time went.
#   bash bench/concurrency.sh CARRY OUTDIR
# CARRY holds bins.tar.xz (libgollm_cuda.so, libtriton_gollm.so, perf_analyzer) and
# tritonserver.tar.xz. Rows go to OUTDIR/concurrency.jsonl (impl gollm-triton, workload
# perf_analyzer_c<C>: tokens_per_s, latency_ms and latency_ms_p99 of whole requests;
# hf-eager and hf-static: tokens_per_s of tput_b<C>_i128_o128).
set -uo pipefail
carry=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/device.sh"
device_unpack conc "$carry"
mkdir -p "$out"
# perf_analyzer links libb64.so.0d and libcudart.so.12 by soname; the tritonserver wheel's
# libraries folder has both under hashed names.
libs="$w/srv/nvidia_pytriton.libs"
ln -s "$libs"/libb64-*.so.0d "$w/lib/libb64.so.0d"
ln -s "$libs"/libcudart-*.so.12* "$w/lib/libcudart.so.12"
write_checkpoint gpt2-124M
python3 - "$w" <<'PY'
import json, random, sys
rng = random.Random(1)
data = [{"input_ids": {"content": [rng.randrange(50257) for _ in range(128)], "shape": [128]},
         "input_lengths": {"content": [128], "shape": [1]},
         "request_output_len": {"content": [128], "shape": [1]},
         "end_id": {"content": [-1], "shape": [1]},
         "streaming": {"content": [True], "shape": [1]}} for _ in range(64)]
json.dump({"data": data}, open(f"{sys.argv[1]}/input.json", "w"))
PY
gpt2_model g2 "$w/gpt2-124M" KIND_GPU max_tokens_in_paged_kv_cache 65536
GOLLM_ITER_TRACE="$w/trace" triton_start "$out/tritonserver.log"
# Time windows, not --request-count: with a request count perf_analyzer 2.51 divides by
# whole seconds and counts its ramp, and on 2026-11-24 it kept 0.7-10.6 requests in flight
# for C = 1-64 (its requests/s × its latency); three 2-second windows keep C in flight.
for c in 1 2 4 8 16 32 64; do
  LD_LIBRARY_PATH="$w/lib:${LD_LIBRARY_PATH:-}" timeout 120 "$w/bin/perf_analyzer" -m g2 -i grpc -u localhost:8001 \
    --streaming --async --concurrency-range $c --measurement-interval 2000 --stability-percentage 999 \
    --input-data "$w/input.json" > "$w/pa_c$c.txt" 2>&1
  { echo "== concurrency $c"; cat "$w/pa_c$c.txt"; } >> "$out/perf_analyzer.txt"
  python3 - "$w/pa_c$c.txt" "$c" >> "$out/concurrency.jsonl" <<'PY'
import json, re, sys
t = open(sys.argv[1]).read()
c = int(sys.argv[2])
def num(pat):
    m = re.search(pat, t)
    return float(m.group(1)) if m else None
thr, p50, p99 = num(r"Throughput: ([\d.]+) infer/sec"), num(r"p50 latency: (\d+) usec"), num(r"p99 latency: (\d+) usec")
base = {"model": "gpt2-124M", "dtype": "fp16", "workload": f"perf_analyzer_c{c}", "impl": "gollm-triton"}
if thr is None:
    print(json.dumps(dict(base, metric="error", value=0, note=t[-300:])))
else:
    # Little's law: the requests the client kept in flight, to check it kept C.
    base["note"] = "requests in flight (requests/s × p50 latency): %.1f" % (thr * p50 / 1e6)
    print(json.dumps(dict(base, metric="tokens_per_s", value=thr * 128)))
    print(json.dumps(dict(base, metric="latency_ms", value=p50 / 1e3)))
    print(json.dumps(dict(base, metric="latency_ms_p99", value=p99 / 1e3)))
PY
  tail -1 "$out/concurrency.jsonl"
done
triton_stop "$out/tritonserver.log"
echo "== transformers"
timeout ${HF_S:-200} python3 - "$w/gpt2-124M" >> "$out/concurrency.jsonl" <<'PY'
import json, sys, time, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float16).cuda().eval()
def run(b, static):
    ids = torch.randint(0, 50257, (b, 128), device="cuda")
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=torch.ones_like(ids),
              max_new_tokens=128, min_new_tokens=128)
    if static:
        kw["cache_implementation"] = "static"
    ts = []
    for _ in range(4):
        torch.cuda.synchronize(); t = time.perf_counter()
        m.generate(ids, **kw)
        torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    return b * 128 / sorted(ts[1:])[1]
with torch.no_grad():
    for static in (False, True):
        for b in ((1, 2, 4, 8, 16, 32, 64) if not static else (1, 8, 64)):
            v = run(b, static)
            print(json.dumps({"model": "gpt2-124M", "dtype": "fp16", "workload": f"tput_b{b}_i128_o128",
                              "impl": "hf-static" if static else "hf-eager", "metric": "tokens_per_s", "value": v}), flush=True)
PY
tail -12 "$out/concurrency.jsonl"
python3 "$root/bench/tritonbench/trace.py" "$w"/trace.* 2>&1 | tail -20 | tee "$out/trace_summary.txt"
