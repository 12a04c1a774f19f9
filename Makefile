# llmlab: `make demo`, `make install`, `make test`, `make all-labs`, `make lab-NAME`, `make gpu-check`, `make browser`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
LLMLAB  := $(BIN)/llmlab
OUT     ?= results
# The CPU build of torch (small, on this disk); a GPU machine takes the default CUDA build.
TORCH_CPU ?= torch==2.13.0
LABS    := train-vs-infer five-steps prefill-decode gpu-parallelism roofline kvcache-growth samplers ttft-breakdown speculative tensor-parallel
HAVE_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: demo install test lint all-labs browser gpu-check bench-roofline bench-samplers bench-speculative clean $(addprefix lab-,$(LABS))

# The main job: install, then one lab on the built-in model pair (no download).
DEMO    ?= speculative --quick
demo: install
	HF_HUB_OFFLINE=1 $(LLMLAB) $(DEMO) --out $(OUT)

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
ifeq ($(HAVE_GPU),1)
	$(BIN)/python -m pip install -q torch
else
	$(BIN)/python -m pip show torch >/dev/null 2>&1 || $(BIN)/python -m pip install -q $(TORCH_CPU)
endif
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

test: install
	$(BIN)/ruff check llmlab tests benchmarks
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check llmlab tests benchmarks

# Every lab that exists, full run, into results/ (one folder per lab).
all-labs: install
	@for lab in $(LABS); do \
	  if $(LLMLAB) $$lab --help >/dev/null 2>&1; then \
	    echo "== llmlab $$lab"; HF_HUB_OFFLINE=1 $(LLMLAB) $$lab --out $(OUT) || exit $$?; \
	  fi; \
	done
	$(LLMLAB) report $(OUT)

# Debian's chromium, for the HTML report's browser test (tests/test_report_browser.py); needs root.
browser:
	@command -v chromium >/dev/null 2>&1 && echo "chromium: $$(command -v chromium)" || \
	  { [ "$$(id -u)" = 0 ] || { echo "make browser: run as root (apt-get install -y chromium)"; exit 1; }; \
	    apt-get update -q && apt-get install -y -q chromium; }

$(addprefix lab-,$(LABS)): lab-%: install  # static pattern: make skips implicit rules for .PHONY targets
	HF_HUB_OFFLINE=1 $(LLMLAB) $* --out $(OUT)

# The one command to run on a GPU machine: every lab in --quick mode on cuda.
gpu-check: install
	@for lab in $(LABS); do \
	  if $(LLMLAB) $$lab --help >/dev/null 2>&1; then \
	    echo "== llmlab $$lab --device cuda --quick"; HF_HUB_OFFLINE=1 $(LLMLAB) $$lab --device cuda --quick --out $(OUT) || exit $$?; \
	  fi; \
	done

bench-roofline bench-samplers bench-speculative: bench-%: install  # static pattern (see lab-%)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.$(subst -,_,$*)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
