# gollm's common commands. `make serve` and `make test` work on a fresh machine: they
# install what is missing into .deps/ (scripts/deps.sh), build the backend into
# build/install/backends/gollm/ and write the demo checkpoint if it is missing. Each
# set-up step prints one line (scripts/step.sh); VERBOSE=1 shows their whole output.
SHELL := /bin/bash
ROOT := $(CURDIR)
BACKENDS := $(ROOT)/build/install/backends
DEMO := $(ROOT)/model_repository/gpt2/1
LLAMA_DEMO := $(ROOT)/model_repository/llama/1
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
OPENAI_PORT ?= 9000
# tritonserver's own HTTP and metrics ports, on loopback: HTTP_PORT and METRICS_PORT are
# gollm-openai's guard in front of them, which refuses request bodies over
# MAX_REQUEST_BYTES (scripts/serve.sh says why).
TRITON_HTTP_PORT ?= $(shell expr $(HTTP_PORT) + 10)
TRITON_METRICS_PORT ?= $(shell expr $(METRICS_PORT) + 10)
MAX_REQUEST_BYTES ?= 4194304
# gollm ends its requests in flight at once when the server stops (shutdown_grace_secs
# 0), so a short exit timeout costs nothing; it bounds the wait for a model that
# tritonserver 2.51's gRPC frontend keeps alive after a cancelled stream (README, Known
# limits), which would otherwise hold every exit for 30 s.
EXIT_TIMEOUT ?= 5

# GOLLM_CUDA: whether the CUDA engine (cuda/ → libgollm_cuda.so) and the CUDA wheels its
# compiler comes from are built and installed: 1, 0, or auto — only on a machine with an
# NVIDIA driver (scripts/cuda.sh). `make test` defaults to 1, so that CI, which has no GPU,
# still compiles every .cu file; everything else defaults to auto.
test: CUDA_DEFAULT := 1
# make test also installs what only the tests use (genai-perf).
test: TEST_DEPS := 1
cuda = $(shell GOLLM_CUDA=$(or $(GOLLM_CUDA),$(CUDA_DEFAULT),auto) bash scripts/cuda.sh)
# GOLLM_CUDA_ARCHS: the SM versions libgollm_cuda.so is compiled for, the last also as
# PTX for newer GPUs. `make build` takes CMakeLists.txt's list (every architecture the
# project supports) unless it is set (GOLLM_CUDA_ARCHS=90 for an H100 or H200 alone).
# `make test` only checks that cuda/ compiles, beside the Go tests: for sm_80 and sm_90.
TEST_CUDA_ARCHS := 80;90
cuda_archs = $(if $(GOLLM_CUDA_ARCHS),-DGOLLM_CUDA_ARCHS="$(GOLLM_CUDA_ARCHS)",-UGOLLM_CUDA_ARCHS)
# tritonserver's flags on a machine without a GPU: no GPU metrics (NVML and DCGM are
# absent, and it would say so in two error lines) and no pinned host memory pool (it
# needs the CUDA driver; gollm's tensors are all in ordinary host memory).
CPU_SERVER_FLAGS := --allow-gpu-metrics=false --pinned-memory-pool-byte-size=0

# FUZZ lists the fuzz targets (package:Target:executions) that `make fuzz` runs, from their
# seed corpora (and the inputs go test keeps in its cache between runs). Budgets are
# execution counts, about 15-25 s each on a 2-core machine, not durations: with a
# duration, Go's fuzz coordinator can race its own deadline and fail a clean run with a
# bare "context deadline exceeded" (golang/go#75804; it failed CI once on FuzzWordList).
# FUZZTIME=30s (or 1000x) overrides every target's budget.
FUZZ := ./model:FuzzOpen:20000x ./model:FuzzOpenGGUF:20000x ./tokenizer:FuzzTokenizer:500000x ./backend:FuzzParseRequest:300000x \
	./backend:FuzzWordList:350000x ./backend:FuzzStopStrings:250000x ./guide:FuzzCompileJSONSchema:2000x \
	./guide:FuzzCompileEBNF:2000x ./guide:FuzzCompileRegex:1000x
FUZZTIME ?=

.PHONY: all deps build demo demo-gpt2 demo-llama serve test test-go test-cuda check unit fuzz clean

all: build

deps:
	@GOLLM_CUDA=$(if $(BACKEND_ONLY),0,$(cuda)) GOLLM_TEST_DEPS=$(TEST_DEPS) bash scripts/deps.sh

build: $(if $(filter 1,$(cuda)),deps)
	@c=$(if $(BACKEND_ONLY),0,$(cuda)); bash scripts/step.sh "build: build/install/backends/gollm/libtriton_gollm.so$$( [ $$c = 1 ] && echo ' and libgollm_cuda.so')" \
	  bash -c 'cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DGOLLM_CUDA='$$c' $(cuda_archs) && cmake --build build && cmake --install build --prefix build/install'

# A demo written before it had a tokenizer_config.json is written again (the same
# weights). After the backend's build: -trimpath as there, so that the two share Go's
# build cache (the standard library is compiled once on a fresh machine). The llama demo
# converts its tokenizer from the file scripts/deps.sh installs, so it alone waits for
# deps (make serve's downloads outlast the build).
demo: demo-gpt2 demo-llama

demo-gpt2: | build
	@test -f $(DEMO)/model.safetensors -a -f $(DEMO)/tokenizer_config.json || \
	  bash scripts/step.sh "demo: the random-weight gpt2 checkpoint in model_repository/gpt2/1" go run -trimpath ./cmd/gollm-demo -out $(DEMO)

demo-llama: | build deps
	@test -f $(LLAMA_DEMO)/model.safetensors || \
	  bash scripts/step.sh "demo: the random-weight LLaMA-shaped checkpoint with Mistral's real tokenizer in model_repository/llama/1" \
	  go run -trimpath ./cmd/gollm-demo -arch llama -out $(LLAMA_DEMO)

# tritonserver and, beside it, the OpenAI-compatible server (scripts/serve.sh). The
# downloads of scripts/deps.sh go on while Go compiles, unless the build needs them
# (nvcc, from the CUDA wheels).
serve:
	@$(MAKE) --no-print-directory -j3 deps build demo
	@bash scripts/step.sh "build: build/gollm-openai" go build -trimpath -o build/gollm-openai ./cmd/gollm-openai
	@HTTP_PORT=$(HTTP_PORT) GRPC_PORT=$(GRPC_PORT) METRICS_PORT=$(METRICS_PORT) \
	  OPENAI_PORT=$(OPENAI_PORT) EXIT_TIMEOUT=$(EXIT_TIMEOUT) \
	  TRITON_HTTP_PORT=$(TRITON_HTTP_PORT) TRITON_METRICS_PORT=$(TRITON_METRICS_PORT) MAX_REQUEST_BYTES=$(MAX_REQUEST_BYTES) \
	  TRITON_FLAGS="$(if $(filter 0,$(cuda)),$(CPU_SERVER_FLAGS))" exec bash scripts/serve.sh

check:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	go vet ./...
	go run $(STATICCHECK) ./...

unit:
	go test -race -count=1 $$(go list ./... | grep -v /tests)

fuzz:
	@for t in $(FUZZ); do IFS=: read -r pkg name budget <<<"$$t"; budget=$(or $(FUZZTIME),$$budget); \
	  echo "fuzz $$name ($$pkg, $$budget)"; \
	  go test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$$budget -fuzzminimizetime=50x $$pkg || exit 1; \
	done

# make test installs and builds what the tests need; the CUDA wheels' download and the
# CUDA engine's compile (in build/cuda, not installed) run beside the checks and tests
# (-k: both run to their end, and either failing fails make test).
test: BACKEND_ONLY := 1
test: deps build demo
	@$(MAKE) --no-print-directory -k -j2 test-go $(if $(filter 1,$(cuda)),test-cuda)

test-go: check
	go test -count=1 -timeout 45m ./...
	$(MAKE) --no-print-directory fuzz

test-cuda:
	@GOLLM_CUDA=1 bash scripts/deps.sh
	@bash scripts/step.sh "build: build/cuda/libgollm_cuda.so (sm $(TEST_CUDA_ARCHS) + PTX)" \
	  bash -c 'cmake -S . -B build/cuda -DCMAKE_BUILD_TYPE=Release -DGOLLM_CUDA=ON -DGOLLM_CUDA_ARCHS="$(TEST_CUDA_ARCHS)" && cmake --build build/cuda --target gollm_cuda'

clean:
	rm -rf build
