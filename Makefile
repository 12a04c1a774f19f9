# llmlab: `make demo`, `make install`, `make test`, `make all-labs`, `make lab-NAME`, `make gpu-check`, `make browser`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
LLMLAB  := $(BIN)/llmlab
OUT     ?= results
# The CPU build of torch (small, on this disk); a GPU machine takes a CUDA build >= TORCH_FLOOR.
TORCH_CPU ?= torch==2.13.0
# The oldest torch the code runs on (SDPA enable_gqa= is 2.5, the CUDA INT8 weight kernel 2.9): the same as
# pyproject.toml's torch>= and llmlab.tools.gpucheck.TORCH_FLOOR.
TORCH_FLOOR := 2.9
TORCH_BELOW_FLOOR := tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]) < tuple(int(x) for x in '$(TORCH_FLOOR)'.split('.'))
LABS    := tokens train-vs-infer five-steps prefill-decode gpu-parallelism roofline kvcache-growth samplers ttft-breakdown speculative serving quantization tensor-parallel
HAVE_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: demo install test lint all-labs reference browser gpu-check bench-roofline bench-samplers bench-speculative bench-engine bench-serve clean $(addprefix lab-,$(LABS))

# The main job: install, then one lab on the built-in model pair (no download).
DEMO    ?= speculative --quick
demo: install
	HF_HUB_OFFLINE=1 $(LLMLAB) $(DEMO) --out $(OUT)

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
ifeq ($(HAVE_GPU),1)
	@# a CPU torch, or one older than TORCH_FLOOR, left in an existing .venv is replaced by a CUDA build >= the floor,
	@# from the PyTorch wheel index the driver runs (gpucheck --pip-index reads nvidia-smi; empty: pip's default index)
	$(BIN)/python -c "import torch, sys; sys.exit(torch.version.cuda is None or $(TORCH_BELOW_FLOOR))" 2>/dev/null \
	  || { $(BIN)/python -m pip uninstall -q -y torch 2>/dev/null; \
	       $(BIN)/python -m pip install -q "torch>=$(TORCH_FLOOR)" $$($(BIN)/python -m llmlab.tools.gpucheck --pip-index); }
else
	@# the CPU build first, and in place of a torch below the floor: pip then never pulls a multi-GB CUDA build
	$(BIN)/python -c "import torch, sys; sys.exit($(TORCH_BELOW_FLOOR))" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_CPU)
endif
	$(BIN)/python -m pip install -q -e ".[dev]"
ifeq ($(HAVE_GPU),1)
	@# nvidia-smi sees a GPU: can torch? If not (CPU build, or a wheel for a newer CUDA than the driver), one line with the pip fix
	@$(BIN)/python -m llmlab.tools.gpucheck --install-check
endif
	touch $@

test: install
	$(BIN)/ruff check llmlab tests benchmarks
	$(BIN)/lint-imports --no-cache
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check llmlab tests benchmarks
	$(BIN)/lint-imports --no-cache

# Every lab that exists, full run, into $(OUT)/<lab>/ (your runs: git ignores them), then the HTML report.
# LAB_ARGS: extra options for every lab (e.g. LAB_ARGS=--quick for a fast pass).
LAB_ARGS ?=
all-labs: install
	@for lab in $(LABS); do \
	  echo "== llmlab $$lab $(LAB_ARGS)"; HF_HUB_OFFLINE=1 $(LLMLAB) $$lab $(LAB_ARGS) --out $(OUT) || exit $$?; \
	done
	$(LLMLAB) report $(OUT)

# The committed reference runs: every lab in --quick mode, one at a time, into results/reference/
# (each lab's old reference run replaced), then its report and the README's claims table from them.
# Only this target writes there, so a user's own runs never change what the tests compare.
REF     := results/reference
reference: install
	@for lab in $(LABS); do \
	  echo "== llmlab $$lab --quick"; rm -rf $(REF)/$$lab; \
	  HF_HUB_OFFLINE=1 $(LLMLAB) $$lab --quick --out $(REF) || exit $$?; \
	done
	$(LLMLAB) report $(REF) -o $(REF)/report.html
	$(BIN)/python -m llmlab.tools.readme --results $(REF) --write

# Debian's chromium, for the HTML report's browser test (tests/test_report_browser.py); needs root.
browser:
	@command -v chromium >/dev/null 2>&1 && echo "chromium: $$(command -v chromium)" || \
	  { [ "$$(id -u)" = 0 ] || { echo "make browser: run as root (apt-get install -y chromium)"; exit 1; }; \
	    apt-get update -q && apt-get install -y -q chromium; }

$(addprefix lab-,$(LABS)): lab-%: install  # static pattern: make skips implicit rules for .PHONY targets
	HF_HUB_OFFLINE=1 $(LLMLAB) $* --out $(OUT)

# The one command to run on a GPU machine: first whether torch can use CUDA (if not: one line saying what to
# install, exit 2, no lab runs); then every lab in --quick mode on cuda, each in its own process (a crash does
# not stop the rest; its traceback is saved under $(OUT)/gpu-check/), llmlab serve under load for a minute and
# a probe of the kernels the labs use, ending in a one-screen summary ($(OUT)/gpu-check/summary.txt).
GPU_CHECK_DEVICE ?= cuda
gpu-check: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m llmlab.tools.gpucheck --device $(GPU_CHECK_DEVICE) --out $(OUT)

bench-roofline bench-samplers bench-speculative bench-engine: bench-%: install  # static pattern (see lab-%)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.$(subst -,_,$*)

# llmlab serve through HTTP at concurrency 1, 8, 32; PEER=URL: the same client against that OpenAI-compatible server
# too (llama.cpp's llama-server: benchmarks/llamacpp.sh), with the ratios against the goals. PEER_NOTE: its threads.
PEER      ?=
PEER_NOTE ?=
bench-serve: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.serve $(if $(PEER),--peer $(PEER)) \
	  $(if $(PEER_NOTE),--peer-note "$(PEER_NOTE)") $(SERVE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
