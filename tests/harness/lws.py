"""The real LeaderWorkerSet controller (sigs.k8s.io/lws) in the test control plane.

hack/testbin/build.sh builds `lws-manager` and copies the module's CRD and webhook manifests into
`<testbin>/lws/`. Here the manager runs as a local process with its internal certificate management
off: it serves its webhooks on loopback with a certificate from the harness's CA, and the webhook
configurations point the API server at `https://127.0.0.1:<port>/<path>` with that CA as caBundle
(tests/harness/webhook_manager.py starts it; this module knows its files, configuration and probe).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness.pki import CertificateAuthority
from tests.harness.webhook_manager import WebhookManager

LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_API_VERSION = f"{LWS_GROUP}/v1"
LWS_CRD_NAME = f"leaderworkersets.{LWS_GROUP}"
# The label LWS puts on every pod of a set; its pod webhooks select on it, so other pods never wait on them.
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"


@dataclass(frozen=True)
class LwsManifests:
    """The files build.sh copies from the module: the CRD, the webhook configurations and the
    kustomize patches that give the pod webhooks their objectSelector."""

    directory: Path

    def crd(self) -> dict[str, Any]:
        crd = yaml.safe_load((self.directory / "crd.yaml").read_text())
        # One served version (v1): the conversion webhook kustomize adds would never be called.
        crd["spec"].pop("conversion", None)
        return dict(crd)

    def webhook_configurations(self, base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
        """The Mutating- and ValidatingWebhookConfiguration, patched as the module's kustomization
        patches them, each webhook's service reference replaced by `base_url` + its path."""
        documents = [d for d in yaml.safe_load_all((self.directory / "webhooks.yaml").read_text()) if d]
        patches = {
            "MutatingWebhookConfiguration": yaml.safe_load((self.directory / "mutating-patch.yaml").read_text()),
            "ValidatingWebhookConfiguration": yaml.safe_load((self.directory / "validating-patch.yaml").read_text()),
        }
        configurations = []
        for document in documents:
            configuration = _apply_json_patch(document, patches[document["kind"]])
            configuration["metadata"] = {"name": f"lws-{configuration['metadata']['name']}"}
            for webhook in configuration["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {
                    "url": f"{base_url}{path}",
                    "caBundle": base64.b64encode(ca_pem).decode(),
                }
            configurations.append(configuration)
        return configurations


def _apply_json_patch(document: Mapping[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON-patch operations the module's webhook patches use (replace/add of a list item or key)."""
    patched = copy.deepcopy(dict(document))
    for operation in operations:
        if operation["op"] not in ("replace", "add"):
            raise ValueError(f"unsupported JSON-patch op {operation['op']!r} in the LWS webhook patches")
        *parents, last = operation["path"].lstrip("/").split("/")
        target: Any = patched
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = operation["value"]
        else:
            target[last] = operation["value"]
    return patched


def _config_yaml(webhook_port: int, cert_dir: Path, probe_port: int) -> str:
    # Fields of config.lws.x-k8s.io/v1alpha1 Configuration (api/config/v1alpha1 in the module).
    return yaml.safe_dump(
        {
            "apiVersion": "config.lws.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
            "metrics": {"bindAddress": "0"},  # controller-runtime: "0" serves no metrics
            "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        },
        sort_keys=False,
    )


def probe_leaderworkerset(name: str) -> dict[str, Any]:
    """A minimal LeaderWorkerSet, for a server-side dry run that passes both LWS webhooks."""
    container = {"name": "probe", "image": "registry.k8s.io/pause:3.10"}
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {"size": 1, "workerTemplate": {"spec": {"containers": [container]}}},
        },
    }


def lws_manager(
    ca: CertificateAuthority, directory: Path, install: Callable[[dict[str, Any], list[dict[str, Any]]], None]
) -> WebhookManager:
    """lws-manager, with the files build.sh copied into `directory`: its CRD and webhook configurations go in
    through `install(crd, webhooks)`; ready once a LeaderWorkerSet dry run passes its webhooks."""
    manifests = LwsManifests(directory)
    return WebhookManager(
        "lws",
        _config_yaml,
        lambda url: install(manifests.crd(), manifests.webhook_configurations(url, ca.pair.cert_pem())),
        probe_leaderworkerset("harness-probe"),
    )
