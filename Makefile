# Two commands do all the set-up on a fresh machine: `make demo` (the main job) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: venv testbin test test-fast lint demo crd bench images clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# The real control plane the cluster tests use (built once, cached outside the repo).
testbin: venv
	PYTHON=$(PY) bash hack/testbin/build.sh

test: venv testbin
	PYTHON=$(PY) $(PY) -m pytest -q -ra

# Everything but the tests that need the control plane.
test-fast: venv
	$(PY) -m pytest -q -ra -m 'not cluster'

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

crd: venv
	$(BIN)/datagen crd > crds/datagenrun.yaml

demo: venv
	bash hack/demo.sh

bench: venv
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache demo-output
