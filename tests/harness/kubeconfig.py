"""Self-contained kubeconfig files (credentials embedded) and reading a cluster's endpoint from one."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness.pki import KeyPair


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca_pem: bytes | None,
    user_name: str,
    client: KeyPair | None = None,
    token: str | None = None,
    insecure: bool = False,
) -> Path:
    """A self-contained kubeconfig (certificates embedded) for one user of one cluster."""
    cluster: dict[str, Any] = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = _b64(ca_pem)
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    user: dict[str, Any] = {}
    if client is not None:
        user["client-certificate-data"] = _b64(client.cert_pem())
        user["client-key-data"] = _b64(client.key_pem())
    if token is not None:
        user["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user_name}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class ClusterEndpoint:
    server: str
    ca_pem: bytes | None
    insecure: bool


def read_cluster_endpoint(kubeconfig: Path) -> ClusterEndpoint:
    """Server and CA of the current context, so a ServiceAccount kubeconfig can reach the same cluster."""
    config = yaml.safe_load(kubeconfig.read_text())
    context_name = config.get("current-context")
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    ca_pem: bytes | None = None
    if "certificate-authority-data" in cluster:
        ca_pem = base64.b64decode(cluster["certificate-authority-data"])
    elif "certificate-authority" in cluster:
        ca_path = Path(cluster["certificate-authority"])
        ca_pem = (ca_path if ca_path.is_absolute() else kubeconfig.parent / ca_path).read_bytes()
    return ClusterEndpoint(cluster["server"], ca_pem, bool(cluster.get("insecure-skip-tls-verify")))
