# kvbench: `make bench` runs the default suite, `make test` the tests. Both create .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUITE ?= suites/default.yaml
OUT ?= results
DEVICE ?=
DEVICE_FLAG := $(if $(DEVICE),--device $(DEVICE),)

.PHONY: install bench test lint fmt clean peers

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
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

# Optional peers (docs/peers.md): mlx-lm, and torch as a CPU build only (a `+cpu` version never
# resolves to the CUDA wheel and its GBs of packages); where none is at hand, torch_sdpa skips.
TORCH_CPU ?= torch==2.13.0+cpu
peers: install
	$(PY) -m pip install -q -e ".[test,peers]"
	$(PY) -m pip install -q "$(TORCH_CPU)" || echo "peers: no $(TORCH_CPU) here; torch_sdpa cases skip"
