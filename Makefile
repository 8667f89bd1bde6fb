# gollm's common commands. `make serve` and `make test` work on a fresh machine: they
# install what is missing into .deps/ (scripts/deps.sh), build the backend into
# build/install/backends/gollm/ and write the demo checkpoint if it is missing.
SHELL := /bin/bash
ROOT := $(CURDIR)
BACKENDS := $(ROOT)/build/install/backends
DEMO := $(ROOT)/model_repository/gpt2/1
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
OPENAI_PORT ?= 9000

.PHONY: all deps build demo serve test check unit clean

all: build

deps:
	@bash scripts/deps.sh

build:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build
	cmake --install build --prefix build/install >/dev/null
	@echo "backend: $(BACKENDS)/gollm/libtriton_gollm.so"

# A demo written before it had a tokenizer_config.json is written again (the same weights).
demo:
	@test -f $(DEMO)/model.safetensors -a -f $(DEMO)/tokenizer_config.json || go run ./cmd/gollm-demo -out $(DEMO)

# tritonserver and, beside it, the OpenAI-compatible server (scripts/serve.sh).
serve: deps build demo
	go build -o build/gollm-openai ./cmd/gollm-openai
	HTTP_PORT=$(HTTP_PORT) GRPC_PORT=$(GRPC_PORT) METRICS_PORT=$(METRICS_PORT) \
	  OPENAI_PORT=$(OPENAI_PORT) exec bash scripts/serve.sh

check:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	go vet ./...
	go run $(STATICCHECK) ./...

unit:
	go test -race -count=1 $$(go list ./... | grep -v /tests)

test: deps build demo check
	go test -count=1 -timeout 45m ./...

clean:
	rm -rf build
