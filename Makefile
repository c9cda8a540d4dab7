# kvbench: `make bench` runs the default suite, `make test` the tests. Both create .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUITE ?= suites/default.yaml
OUT ?= results
DEVICE ?=
DEVICE_FLAG := $(if $(DEVICE),--device $(DEVICE),)

.PHONY: install bench test lint fmt clean

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

quant: install
	$(PY) -m harness run suites/quant.yaml --out $(OUT) $(DEVICE_FLAG)
