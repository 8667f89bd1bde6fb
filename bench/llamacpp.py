"""gollm's CPU engine against llama.cpp on the same files, alternating in one run (issue 40):

    python3 bench/llamacpp.py [--rounds 3] [--threads 2] [--work /tmp/gollm-llamacpp]

1. llama.cpp's llama-bench and llama-quantize, built once from the llama.cpp that
   llama-cpp-python's source package (PyPI, LLAMA_CPP_PYTHON below) vendors, with its
   native CPU flags, into .deps/llamacpp/bin;
2. a TinyLlama-1.1B-shaped LLaMA with random weights in bfloat16 (cmd/gollm-demo: 22
   layers, hidden 2048, 32 heads, 4 KV heads, MLP 5632, Mistral's 32,000-token
   vocabulary) and its GGUF forms: BF16 written by testdata/make_gguf.py, F32, F16, Q8_0 and
   Q4_K_M by llama-quantize (llama.cpp's own Q4_K_M mixture) — in --work;
3. --rounds rounds, each running, for every format (each run once the load average is
   below --max-load, where given, or --max-wait seconds have passed), bench/cpubench (gollm's engine alone)
   then llama-bench on the same GGUF file, both with --threads threads and --reps
   repetitions of each test: pp128 (one prompt of 128 tokens) and tg128 (128 tokens
   generated one by one), each process's peak RSS read by /usr/bin/time; gollm also on
   the safetensors checkpoint quantized at load (cpu_weight_format q8_0 and q4_k).

The medians of every repetition and the best of them (on a shared machine, the least
disturbed) go to bench/results/<date>-llamacpp-cpu.jsonl (BENCH.md's format, with every
repetition's figure and the load averages at start and end), and a table to stdout. Not
run in CI.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
LLAMA_BIN = os.path.join(ROOT, ".deps", "llamacpp", "bin")
SHAPE = ["-layers", "22", "-hidden", "2048", "-heads", "32", "-kv-heads", "4", "-inner", "5632", "-positions", "2048"]
MODEL = "tinyllama-1.1B-random"


def log(msg):
    print(f"llamacpp.py: {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log(" ".join(cmd))
    return subprocess.run(cmd, check=True, **kw)


def build_llama_cpp():
    """llama-bench and llama-quantize from llama-cpp-python's sdist, unless built."""
    if all(os.path.exists(os.path.join(LLAMA_BIN, b)) for b in ("llama-bench", "llama-quantize")):
        return
    tmp = tempfile.mkdtemp(prefix="llamacpp-")
    try:
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "--no-cache-dir",
             LLAMA_CPP_PYTHON, "-d", tmp])
        sdist = [f for f in os.listdir(tmp) if f.endswith(".tar.gz")][0]
        with tarfile.open(os.path.join(tmp, sdist)) as t:
            t.extractall(tmp, filter="data")
        src = os.path.join(tmp, sdist[:-len(".tar.gz")], "vendor", "llama.cpp")
        build = os.path.join(tmp, "build")
        run(["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
             "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
            stdout=subprocess.DEVNULL)
        run(["cmake", "--build", build, "-j", str(os.cpu_count()), "--target", "llama-bench", "llama-quantize"],
            stdout=subprocess.DEVNULL)
        os.makedirs(LLAMA_BIN, exist_ok=True)
        for b in ("llama-bench", "llama-quantize"):
            shutil.copy2(os.path.join(build, "bin", b), os.path.join(LLAMA_BIN, b))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def models(work):
    """The checkpoint and its GGUF files, written unless present."""
    ckpt = os.path.join(work, "bf16")
    if not os.path.exists(os.path.join(ckpt, "model.safetensors")):
        run(["go", "run", "./cmd/gollm-demo", "-arch", "llama", *SHAPE, "-dtype", "bfloat16", "-out", ckpt], cwd=ROOT)
    files = {t: os.path.join(work, t + ".gguf") for t in ("F32", "F16", "BF16", "Q8_0", "Q4_K_M")}
    if not os.path.exists(files["BF16"]):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, ".deps", "gguf") + os.pathsep + os.path.join(ROOT, ".deps", "py"))
        run([sys.executable, os.path.join(ROOT, "testdata", "make_gguf.py"), "model", ckpt, work, "BF16", "--no-ref"], env=env)
    for t, path in files.items():
        if not os.path.exists(path):
            run([os.path.join(LLAMA_BIN, "llama-quantize"), files["BF16"], path, t, str(os.cpu_count())],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return ckpt, files


def timed(cmd, env=None):
    """Runs cmd under /usr/bin/time; returns its stdout and peak RSS in GB."""
    fd, rss_file = tempfile.mkstemp()
    os.close(fd)
    try:
        out = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_file, *cmd], check=True, capture_output=True,
                             text=True, env=env).stdout
        with open(rss_file) as f:
            kb = int(f.read().strip().splitlines()[-1])
        return out, kb * 1024 / 1e9
    finally:
        os.remove(rss_file)


def gollm(cpubench, path, fmt, threads, reps):
    """pp128 and tg128 of gollm's engine: every repetition's tokens/s, and the peak RSS."""
    out, rss = timed([cpubench, "-model", path, "-format", fmt, "-threads", str(threads), "-p", "128", "-n", "128",
                      "-reps", str(reps)])
    r = json.loads(out)
    return {"pp128": r["prompt_runs"], "tg128": r["decode_runs"], "rss": [rss]}


def llama(path, threads, reps):
    """pp128 and tg128 of llama-bench: every repetition's tokens/s, and the peak RSS."""
    out, rss = timed([os.path.join(LLAMA_BIN, "llama-bench"), "-m", path, "-t", str(threads), "-p", "128", "-n", "128",
                      "-r", str(reps), "-o", "json"])
    res = {"rss": [rss]}
    for t in json.loads(out):
        key = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
        res[key] = t["samples_ts"]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each test inside each run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/gollm-llamacpp")
    ap.add_argument("--formats", default="F32,F16,BF16,Q8_0,Q4_K_M")
    ap.add_argument("--max-load", type=float, default=0,
                    help="before each run, wait until the 1-minute load average is below this (0: do not wait)")
    ap.add_argument("--max-wait", type=float, default=3600,
                    help="seconds to wait for --max-load before running anyway (the runs alternate, so the ratio stays fair)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    build_llama_cpp()
    ckpt, files = models(args.work)
    cpubench = os.path.join(args.work, "cpubench")
    run(["go", "build", "-o", cpubench, "./bench/cpubench"], cwd=ROOT)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    fmts = args.formats.split(",")
    # What runs: (impl, dtype, label, thunk), alternated within each round.
    cases = []
    for t in fmts:
        cases.append(("gollm-engine", t, f"gollm {t}.gguf", lambda t=t: gollm(cpubench, files[t], "auto", args.threads, args.reps)))
        cases.append(("llama.cpp", t, f"llama.cpp {t}.gguf", lambda t=t: llama(files[t], args.threads, args.reps)))
        if t in ("Q8_0", "Q4_K_M"):
            fmt = {"Q8_0": "q8_0", "Q4_K_M": "q4_k"}[t]
            cases.append(("gollm-engine-quantized-at-load", t, f"gollm bf16 safetensors as {fmt}",
                          lambda fmt=fmt: gollm(cpubench, ckpt, fmt, args.threads, args.reps)))
    load_start = os.getloadavg()
    runs = {}
    for r in range(args.rounds):
        for impl, dtype, label, thunk in cases:
            wait_for_quiet(args.max_load, args.max_wait)
            res = thunk()
            log(f"round {r + 1}: {label}: " + ", ".join(f"{k} " + "/".join(f"{x:.2f}" for x in v) for k, v in res.items())
                + f" (load {os.getloadavg()[0]:.1f})")
            for k, v in res.items():
                runs.setdefault((impl, dtype, k), []).extend(v)
    load_end = os.getloadavg()
    date = time.strftime("%Y-%m-%d", time.gmtime())
    machine = f"{cpu_name()} ({os.cpu_count()} cores)"
    path = os.path.join(ROOT, "bench", "results", f"{date}-llamacpp-cpu.jsonl")
    with open(path, "a") as f:
        for (impl, dtype, k), vs in sorted(runs.items()):
            base = {"date": date, "commit": commit, "machine": machine, "model": MODEL, "dtype": dtype,
                    "workload": k if k != "rss" else "pp128_tg128", "impl": impl, "rounds": args.rounds,
                    "runs": [round(v, 3) for v in vs], "threads": args.threads,
                    "load_avg_start": round(load_start[0], 2), "load_avg_end": round(load_end[0], 2)}
            if k == "rss":
                rows = [dict(base, metric="peak_rss_gb", value=round(max(vs), 3))]
            else:
                # The median of every repetition, and the best: on a shared machine the
                # least disturbed run is the closest to what the engine does alone.
                rows = [dict(base, metric="tokens_per_s", value=round(statistics.median(vs), 3)),
                        dict(base, metric="tokens_per_s_best", value=round(max(vs), 3))]
            for row in rows:
                f.write(json.dumps(row) + "\n")
    log(f"wrote {path}")
    print(f"{'dtype':8} {'impl':32} {'pp128 t/s':>16} {'tg128 t/s':>16} {'peak RSS GB':>12}")
    for impl, dtype, label, _ in cases:
        pp, tg, rss = (runs[(impl, dtype, k)] for k in ("pp128", "tg128", "rss"))
        print(f"{dtype:8} {impl:32} {statistics.median(pp):7.2f} ({max(pp):6.2f}) {statistics.median(tg):7.2f} ({max(tg):6.2f}) {max(rss):12.3f}")
    print(f"load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end; {args.rounds} rounds × {args.reps} "
          "repetitions: medians (best)")


def wait_for_quiet(limit, most):
    """Waits (up to most seconds) until the 1-minute load average is below limit: on a
    shared machine, llama.cpp's spinning threads lose far more to other processes than
    gollm's."""
    if limit <= 0:
        return
    deadline = time.time() + most
    while os.getloadavg()[0] >= limit and time.time() < deadline:
        time.sleep(10)


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    main()
