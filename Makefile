# Two commands do all the set-up on a fresh machine: `make demo` (the main job) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: venv testbin test test-fast lint demo dev-cluster crd bench images clean

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

# The operator on this machine until Ctrl-C: control plane, fake GPU nodes, a CPU node running pods as
# processes, the chart installed with helm, a simulator per server pod (hack/dev-cluster.py).
DEV_CLUSTER_ARGS ?=
dev-cluster: venv testbin
	$(PY) hack/dev-cluster.py $(DEV_CLUSTER_ARGS)

bench: venv
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache demo-output .dev-cluster

# Container images (images/): built only where a container engine answers; elsewhere it says so and fails.
CONTAINER_ENGINE ?= docker
IMAGE_REGISTRY ?= ghcr.io/datagen-operator
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
images:
	@if ! $(CONTAINER_ENGINE) info >/dev/null 2>&1; then \
	  echo "make images: no working container engine here ('$(CONTAINER_ENGINE) info' fails), so no image was built."; \
	  echo "  Start Docker (or set CONTAINER_ENGINE=podman) and rerun; the Dockerfiles are images/Dockerfile.{operator,worker}."; \
	  exit 1; \
	fi
	$(CONTAINER_ENGINE) build -f images/Dockerfile.operator -t $(IMAGE_REGISTRY)/operator:$(IMAGE_TAG) .
	$(CONTAINER_ENGINE) build -f images/Dockerfile.worker -t $(IMAGE_REGISTRY)/datagen:$(IMAGE_TAG) .

# helm lint --strict of the chart, with its default values and every charts/datagen-operator/ci/*-values.yaml.
.PHONY: chart-lint
chart-lint: testbin
	helm="$$(PYTHON=$(PY) bash hack/testbin/build.sh 2>/dev/null | tail -n 1)/helm"; \
	"$$helm" lint --strict charts/datagen-operator && \
	for values in charts/datagen-operator/ci/*-values.yaml; do \
	  "$$helm" lint --strict charts/datagen-operator -f "$$values" || exit 1; \
	done
