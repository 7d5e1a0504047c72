#!/usr/bin/env bash
# `make images`: builds images/Dockerfile.operator and images/Dockerfile.worker, then writes OCI archives
# (dist/images/{operator,worker}.tar) that `kind load image-archive` and `ctr images import` take.
#
# Engine: CONTAINER_ENGINE=docker|podman|nerdctl|buildah, or unset: the first of docker, podman, nerdctl that
# answers `<engine> info` and has or can pull the Dockerfiles' base image (from a registry); where none
# does, the Debian route (CONTAINER_ENGINE=buildah): the base made here by mmdebstrap from Debian's packages,
# built by buildah and run by podman with this project's configuration (images/containers.conf), the base and
# the build layers cached outside the repo (like the testbin), keyed on the base's recipe.
# dist/images/engine runs the built images (the smoke tests use it); dist/images/refs names them.
set -euo pipefail
cd "${0%/*}/../.."

IMAGE_REGISTRY="${IMAGE_REGISTRY:-ghcr.io/datagen-operator}"
IMAGE_TAG="${IMAGE_TAG:?IMAGE_TAG is set by the Makefile}"
# The base the Dockerfiles name (an engine with a registry must have it or pull it).
PYTHON_IMAGE="$(sed -n 's/^ARG PYTHON_IMAGE=//p' images/Dockerfile.operator)"
OUT="${IMAGES_OUT:-dist/images}"
ENGINES=(docker podman nerdctl)
DEBIAN_TOOLS=(buildah podman mmdebstrap runc skopeo)
version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
operator_ref="$IMAGE_REGISTRY/operator:$IMAGE_TAG"
worker_ref="$IMAGE_REGISTRY/datagen:$IMAGE_TAG"

say() { echo "make images: $*"; }
fail() { echo "make images: $*" >&2; exit 1; }

engine_works() { command -v "$1" >/dev/null 2>&1 && "$1" info >/dev/null 2>&1; }
base_reachable() { "$1" image inspect "$PYTHON_IMAGE" >/dev/null 2>&1 || "$1" pull "$PYTHON_IMAGE" >/dev/null 2>&1; }
debian_route_possible() {
  local tool
  for tool in "${DEBIAN_TOOLS[@]}"; do command -v "$tool" >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1; return; }; done
}

choose_engine() {
  local engine="${CONTAINER_ENGINE:-}" candidate
  if [ -n "$engine" ]; then
    [ "$engine" = buildah ] && { echo buildah; return; }
    engine_works "$engine" || fail "CONTAINER_ENGINE=$engine does not work here ('$engine info' fails); start it, or unset CONTAINER_ENGINE to use the first of ${ENGINES[*]} that works (or the Debian route, CONTAINER_ENGINE=buildah)."
    echo "$engine"; return
  fi
  for candidate in "${ENGINES[@]}"; do
    if engine_works "$candidate"; then
      if base_reachable "$candidate"; then echo "$candidate"; return; fi
      echo "make images: $candidate works but cannot pull $PYTHON_IMAGE; trying the next" >&2
    fi
  done
  debian_route_possible && { echo buildah; return; }
  echo "make images: no working container engine here: none of ${ENGINES[*]} is installed and answers '<engine> info' with $PYTHON_IMAGE at hand, so no image was built." >&2
  echo "  Install or start one (e.g. Docker Desktop, 'systemctl start docker', 'podman machine start') and rerun; or, on Debian/Ubuntu, install ${DEBIAN_TOOLS[*]} (apt-get) for the route that needs no registry. The Dockerfiles are images/Dockerfile.{operator,worker}." >&2
  exit 1
}

# --- an engine with a registry ------------------------------------------------------------------
# Each route builds both images and sets engine (the one holding them), engine_env (its configuration) and
# save_format.
build_with_engine() {
  say "building with $engine"
  ( set -x
    "$engine" build --build-arg "VERSION=$version" -f images/Dockerfile.operator -t "$operator_ref" .
    "$engine" build --build-arg "VERSION=$version" -f images/Dockerfile.worker -t "$worker_ref" . )
  engine_env=""
  # docker and nerdctl save a docker-archive, which kind and `ctr images import` take as well.
  save_format=()
  [ "$engine" = podman ] && save_format=(--format oci-archive)
  return 0
}

# --- the Debian route: no registry, only Debian's packages and PyPI ------------------------------
CACHE="${DATAGEN_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/datagen-operator/images}"
BASE_PACKAGES=python3,python3-venv,ca-certificates
# The official python image's layout: python and pip in /usr/local/bin (the Dockerfiles call `python`).
BASE_HOOK='chroot "$1" python3 -m venv /usr/local'
HOST_CA=/etc/ssl/certs/ca-certificates.crt

install_debian_tools() {
  local tool missing=()
  for tool in "${DEBIAN_TOOLS[@]}"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  [ "${#missing[@]}" -eq 0 ] && return
  if [ "$(id -u)" -ne 0 ]; then
    fail "the Debian route needs ${missing[*]}: run 'sudo apt-get install ${DEBIAN_TOOLS[*]}' (about 150 MB) and rerun, or run this as root."
  fi
  say "installing ${DEBIAN_TOOLS[*]} with apt-get (about 150 MB)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${DEBIAN_TOOLS[@]}"
}

# The engine's configuration: the repo's containers.conf, the storage (images and build layers) in the cache.
engine_environment() {
  mkdir -p "$CACHE/storage" "$CACHE/run"
  cat > "$CACHE/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$CACHE/storage"
runroot = "$CACHE/run"
CONF
  export CONTAINERS_CONF="$PWD/images/containers.conf" CONTAINERS_STORAGE_CONF="$CACHE/storage.conf"
}

# The base, made once per recipe (suite, packages, hook) and imported into the cache's storage: sets base.
debian_base() {
  local suite sources key tarball
  suite="$(. /etc/os-release && echo "${VERSION_CODENAME:?}")"
  sources=/etc/apt/sources.list
  [ -s "$sources" ] || sources="$(ls /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)"
  key="$(printf '%s\n' "$suite" "$BASE_PACKAGES" "$BASE_HOOK" | sha256sum | cut -c1-12)"
  tarball="$CACHE/base-$suite-$key.tar"
  base="localhost/datagen-base:$suite-$key"
  if [ ! -s "$tarball" ]; then
    say "making the base $base with mmdebstrap from $sources (once; cached in $CACHE)"
    rm -rf "$tarball.partial"
    ( set -x; mmdebstrap --variant=minbase --format=tar --include="$BASE_PACKAGES" --customize-hook="$BASE_HOOK" \
        "$suite" "$tarball.partial" "$sources" </dev/null )
    mv "$tarball.partial" "$tarball"
  fi
  podman image exists "$base" || ( set -x; podman import "$tarball" "$base" )
}

build_debian() {
  install_debian_tools
  engine_environment
  local base
  debian_base
  say "building with buildah on $base (layers cached in $CACHE/storage)"
  # The host's CA bundle is mounted for pip's HTTPS during the build only, never copied into an image.
  local name ref previous
  for name in operator worker; do
    [ "$name" = operator ] && ref="$operator_ref" || ref="$worker_ref"
    previous="$(podman image inspect --format '{{.Id}}' "$ref" 2>/dev/null || true)"
    ( set -x; buildah bud --layers --isolation chroot --network host --build-arg "PYTHON_IMAGE=$base" --build-arg "VERSION=$version" \
        -v "$HOST_CA:$HOST_CA:ro" --ignorefile "images/Dockerfile.$name.dockerignore" \
        -f "images/Dockerfile.$name" -t "$ref" . )
    # The image this one replaces holds a ~600 MB layer of its own; the build stages stay (the layer cache).
    if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$ref")" ]; then
      podman rmi "$previous" >/dev/null 2>&1 || true
    fi
  done
  engine=podman
  engine_env="$(printf 'CONTAINERS_CONF=%q CONTAINERS_STORAGE_CONF=%q' "$CONTAINERS_CONF" "$CONTAINERS_STORAGE_CONF")"
  save_format=(--format oci-archive)
}

# PUSH=1: both to the registry. Else the archives, and for the smoke tests (tests/images) dist/images/engine,
# which runs the engine holding the images, and dist/images/refs, which names them.
publish() {
  if [ -n "${PUSH:-}" ]; then
    ( set -x; eval "$engine_env $engine push $operator_ref"; eval "$engine_env $engine push $worker_ref" )
    say "pushed to $IMAGE_REGISTRY (no archives written; make images without PUSH writes them)"
    return
  fi
  mkdir -p "$OUT"
  rm -f "$OUT/refs" "$OUT/engine"
  local name ref id
  for name in operator worker; do
    [ "$name" = operator ] && ref="$operator_ref" || ref="$worker_ref"
    # An archive of the same image (its id recorded next to it) is kept: saving compresses ~850 MB again.
    id="$(eval "$engine_env $engine image inspect --format '{{.Id}}' $ref")"
    if [ -s "$OUT/$name.tar" ] && [ "$(cat "$OUT/$name.id" 2>/dev/null)" = "$id" ]; then
      say "$OUT/$name.tar holds $ref already (image $id)"
      continue
    fi
    rm -f "$OUT/$name.tar" "$OUT/$name.id"
    ( set -x; eval "$engine_env $engine save ${save_format[*]} -o $OUT/$name.tar $ref" )
    [ -s "$OUT/$name.tar" ] || fail "saving $ref wrote nothing to $OUT/$name.tar"
    echo "$id" > "$OUT/$name.id"
  done
  printf '#!/bin/sh\n%s exec %s "$@"\n' "$engine_env" "$engine" > "$OUT/engine"
  chmod +x "$OUT/engine"
  printf 'operator=%s\nworker=%s\n' "$operator_ref" "$worker_ref" > "$OUT/refs"
  say "built, not pushed (PUSH=1 pushes them to $IMAGE_REGISTRY); archives: $(du -h "$OUT/operator.tar" "$OUT/worker.tar" | tr '\n\t' '  ')"
  say "kind load image-archive $OUT/<name>.tar, or on a node: ctr -n k8s.io images import $OUT/<name>.tar"
}

engine="$(choose_engine)"
if [ "$engine" = buildah ]; then build_debian; else build_with_engine; fi
publish
"$OUT/engine" images --filter "reference=$IMAGE_REGISTRY/*" 2>/dev/null || true
say "the chart runs them with --set image.repository=$IMAGE_REGISTRY/operator --set image.tag=$IMAGE_TAG --set workerImage.repository=$IMAGE_REGISTRY/datagen --set workerImage.tag=$IMAGE_TAG"
