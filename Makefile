# Two commands do all the set-up on a fresh machine: `make demo` (the main job) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: venv testbin chromium test test-fast test-consumers lint demo dev-cluster crd bench images clean dist

# The checkout, installed editable with the dev extras. pip's own output is hundreds of lines: show one line
# per package it fetches (the first time this takes a minute or more) instead of nothing.
$(VENV)/.installed: pyproject.toml
	@echo "==> $(VENV): a virtual environment with datagen-operator installed from this checkout (pip install -e '.[dev]')"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@set -o pipefail; $(PY) -m pip install --progress-bar off -e '.[dev]' \
	  | { grep --line-buffered -E '^(Collecting|Building|Successfully built|Installing collected)' || true; } | cut -c1-110 | sed -u 's/^/    /'
	@echo "==> installed: the datagen command is $(VENV)/bin/datagen ('source $(VENV)/bin/activate' puts it on PATH)"
	touch $@

venv: $(VENV)/.installed

# The real control plane the cluster tests use (built once, cached outside the repo).
testbin: venv
	PYTHON=$(PY) bash hack/testbin/build.sh

# Debian's chromium, for the test that opens a `datagen verify --html` page headless (installed once).
chromium:
	bash hack/chromium.sh

# The suite in parallel (pytest-xdist): most tests wait on processes and the control plane, not the CPU (here,
# here: 2,937 tests in 28 min on three workers; 2,366 took 36.5 min in one process). Each file runs whole on
# one worker (its module fixtures built once); each worker that meets a cluster test starts its own control
# plane. TEST_WORKERS=0 runs them all in this process.
TEST_WORKERS ?= 3
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile

test: venv testbin chromium
	PYTHON=$(PY) $(PY) -m pytest -q -ra $(PYTEST_PARALLEL)

# Everything but the tests that need the control plane.
test-fast: venv chromium
	$(PY) -m pytest -q -ra $(PYTEST_PARALLEL) -m 'not cluster'

# Opt-in: SpecForge's and speculators' own loaders on `datagen export`s of four families (torch; a separate venv
# outside the repo: torch 2.14.1 with its CUDA libraries from PyPI, which import and run on CPU; about 8.5 min and
# 6.0 GB to install, docs/testing.md). SpecForge pins sglang, so it goes in without its dependencies; its data code
# needs only what speculators brings. The same torch runs SGLang's own RadixCache against the simulator's cache.
CONSUMERS_VENV ?= $(HOME)/.cache/datagen/consumers-venv
test-consumers: venv
	test -x $(CONSUMERS_VENV)/bin/speculators || ($(PYTHON) -m venv $(CONSUMERS_VENV) && $(CONSUMERS_VENV)/bin/pip install --quiet 'speculators==0.9.0')
	$(CONSUMERS_VENV)/bin/python -c 'import specforge.data.prompt_builder' 2>/dev/null || $(CONSUMERS_VENV)/bin/pip install --quiet --no-deps 'specforge==0.2.0'
	rm -rf .consumers-check && $(PY) tests/export/consumers.py make-export .consumers-check
	$(CONSUMERS_VENV)/bin/python tests/export/consumers.py check .consumers-check && rm -rf .consumers-check
	CONSUMERS_VENV=$(CONSUMERS_VENV) $(PY) -m pytest -q tests/contract/test_radix_cache.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

crd: venv
	$(BIN)/datagen crd > crds/datagenrun.yaml

demo: venv
	bash hack/demo.sh

# The operator on this machine until Ctrl-C: control plane, fake GPU nodes, a CPU node running pods as
# processes, the chart installed with helm, a simulator per server pod (hack/dev-cluster.py).
DEV_CLUSTER_ARGS ?=
dev-cluster: venv testbin
	$(PY) hack/dev-cluster.py $(DEV_CLUSTER_ARGS)

bench: venv
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache demo-output .dev-cluster dist

# A wheel of this checkout, for a machine without it (no release is published on PyPI):
# pip install 'dist/datagen_operator-<version>-py3-none-any.whl[sglang]'. pip fetches setuptools to build it.
DIST ?= dist
dist: venv
	rm -rf $(DIST)/datagen_operator-*.whl
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir $(DIST) .
	@ls $(DIST)/datagen_operator-*.whl

# Container images (images/), with CONTAINER_ENGINE=docker|podman|nerdctl or, unset, the first of those
# that answers `<engine> info`. Where none does it says so and fails. PUSH=1 pushes both to IMAGE_REGISTRY
# (the engine must be logged in there). CI pushes them on version tags (.github/workflows/images.yml); until
# a release is tagged nothing is published, so a cluster needs images built and pushed this way.
CONTAINER_ENGINE ?=
CONTAINER_ENGINES := docker podman nerdctl
IMAGE_REGISTRY ?= ghcr.io/datagen-operator
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
images:
	@engine="$(CONTAINER_ENGINE)"; \
	if [ -n "$$engine" ]; then \
	  if ! "$$engine" info >/dev/null 2>&1; then \
	    echo "make images: CONTAINER_ENGINE=$$engine does not work here ('$$engine info' fails); start it, or unset CONTAINER_ENGINE to use the first of $(CONTAINER_ENGINES) that works." >&2; \
	    exit 1; \
	  fi; \
	else \
	  for candidate in $(CONTAINER_ENGINES); do \
	    if command -v "$$candidate" >/dev/null 2>&1 && "$$candidate" info >/dev/null 2>&1; then engine=$$candidate; break; fi; \
	  done; \
	  if [ -z "$$engine" ]; then \
	    echo "make images: no working container engine here: none of $(CONTAINER_ENGINES) is installed and answers '<engine> info', so no image was built." >&2; \
	    echo "  Install or start one (e.g. Docker Desktop, 'systemctl start docker', 'podman machine start') and rerun; the Dockerfiles are images/Dockerfile.{operator,worker}." >&2; \
	    exit 1; \
	  fi; \
	fi; \
	echo "make images: building with $$engine"; \
	( set -x; \
	"$$engine" build -f images/Dockerfile.operator -t $(IMAGE_REGISTRY)/operator:$(IMAGE_TAG) . && \
	"$$engine" build -f images/Dockerfile.worker -t $(IMAGE_REGISTRY)/datagen:$(IMAGE_TAG) . ) || exit 1; \
	if [ -n "$(PUSH)" ]; then \
	  ( set -x; "$$engine" push $(IMAGE_REGISTRY)/operator:$(IMAGE_TAG) && "$$engine" push $(IMAGE_REGISTRY)/datagen:$(IMAGE_TAG) ) || exit 1; \
	else \
	  echo "make images: built, not pushed (PUSH=1 pushes them to $(IMAGE_REGISTRY))"; \
	fi; \
	echo "make images: the chart runs them with --set image.repository=$(IMAGE_REGISTRY)/operator --set image.tag=$(IMAGE_TAG) --set workerImage.repository=$(IMAGE_REGISTRY)/datagen --set workerImage.tag=$(IMAGE_TAG)"

# helm lint --strict of the chart, with its default values and every charts/datagen-operator/ci/*-values.yaml.
.PHONY: chart-lint
chart-lint: testbin
	helm="$$(PYTHON=$(PY) bash hack/testbin/build.sh 2>/dev/null | tail -n 1)/helm"; \
	"$$helm" lint --strict charts/datagen-operator && \
	for values in charts/datagen-operator/ci/*-values.yaml; do \
	  "$$helm" lint --strict charts/datagen-operator -f "$$values" || exit 1; \
	done
