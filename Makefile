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
# gollm ends its requests in flight at once when the server stops (shutdown_grace_secs
# 0), so a short exit timeout costs nothing; it bounds the wait for a model that
# tritonserver 2.51's gRPC frontend keeps alive after a cancelled stream (README, Known
# limits), which would otherwise hold every exit for 30 s.
EXIT_TIMEOUT ?= 5

# FUZZ lists the fuzz targets (package:Target) that `make fuzz` runs for FUZZTIME each,
# from their seed corpora (and the inputs go test keeps in its cache between runs).
FUZZ := ./model:FuzzOpen ./model:FuzzTokenizer ./backend:FuzzParseRequest ./backend:FuzzWordList ./backend:FuzzStopStrings
FUZZTIME ?= 20s

.PHONY: all deps build demo serve test check unit fuzz clean

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
	  OPENAI_PORT=$(OPENAI_PORT) EXIT_TIMEOUT=$(EXIT_TIMEOUT) exec bash scripts/serve.sh

check:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	go vet ./...
	go run $(STATICCHECK) ./...

unit:
	go test -race -count=1 $$(go list ./... | grep -v /tests)

fuzz:
	@for t in $(FUZZ); do pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzz $$name ($$pkg, $(FUZZTIME))"; \
	  go test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=50x $$pkg || exit 1; \
	done

test: deps build demo check
	go test -count=1 -timeout 45m ./...
	$(MAKE) --no-print-directory fuzz

clean:
	rm -rf build
