# Two commands do all the set-up on a fresh machine: `make demo` (the main job) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: venv testbin chromium test test-fast test-images test-consumers lint demo dev-cluster crd bench images clean dist

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
# here: 2,995 tests in 27 min on three workers; 2,366 took 36.5 min in one process). Each file runs whole on
# one worker (its module fixtures built once); each worker that meets a cluster test starts its own control
# plane. TEST_WORKERS=0 runs them all in this process.
TEST_WORKERS ?= 3
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile

# The images' smoke tests (tests/images) join the suite once `make images` has built them (dist/images); `make
# test` then rebuilds them first (warm: the cached layers, under a minute), so it never tests stale images.
# IMAGE_TESTS= leaves them out (CI runs them just before, with `make test-images`).
IMAGE_TESTS ?= $(if $(wildcard dist/images/refs),1)

test: venv testbin chromium $(if $(IMAGE_TESTS),images)
	PYTHON=$(PY) $(PY) -m pytest -q -ra $(PYTEST_PARALLEL) $(if $(IMAGE_TESTS),,--ignore=tests/images)

# Everything but the tests that need the control plane or the images.
test-fast: venv chromium
	$(PY) -m pytest -q -ra $(PYTEST_PARALLEL) -m 'not cluster' --ignore=tests/images

# Builds both images, then their smoke tests, each named in the log (tests/images).
test-images: venv images
	$(PY) -m pytest -v -ra tests/images

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

# Container images (images/) and their OCI archives dist/images/{operator,worker}.tar (`kind load
# image-archive`, `ctr images import`), by hack/images/build.sh: with CONTAINER_ENGINE=docker|podman|nerdctl
# or, unset, the first of those that answers `<engine> info` and has the python base image; where none does,
# the Debian route (CONTAINER_ENGINE=buildah): a base made by mmdebstrap from Debian's packages, built with
# buildah, run with podman, no registry needed (as root it apt-get installs buildah podman mmdebstrap runc
# skopeo when missing; the base and the build layers are cached in ~/.cache/datagen-operator/images).
# PUSH=1 pushes both to IMAGE_REGISTRY (the engine must be logged in there). CI pushes them on version tags
# (.github/workflows/images.yml); until a release is tagged nothing is published, so a cluster needs images
# built and pushed this way.
CONTAINER_ENGINE ?=
IMAGE_REGISTRY ?= ghcr.io/datagen-operator
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
images:
	CONTAINER_ENGINE="$(CONTAINER_ENGINE)" IMAGE_REGISTRY="$(IMAGE_REGISTRY)" IMAGE_TAG="$(IMAGE_TAG)" PUSH="$(PUSH)" \
	  $(SHELL) hack/images/build.sh

# helm lint --strict of the chart, with its default values and every charts/datagen-operator/ci/*-values.yaml.
.PHONY: chart-lint
chart-lint: testbin
	helm="$$(PYTHON=$(PY) bash hack/testbin/build.sh 2>/dev/null | tail -n 1)/helm"; \
	"$$helm" lint --strict charts/datagen-operator && \
	for values in charts/datagen-operator/ci/*-values.yaml; do \
	  "$$helm" lint --strict charts/datagen-operator -f "$$values" || exit 1; \
	done
