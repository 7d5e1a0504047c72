"""A controller-runtime manager (lws-manager, kueue-manager) run as a local process against the test control plane.

Both serve admission webhooks: with their internal certificate management off, each serves on loopback with a
certificate from the harness's CA, and its webhook configurations point the API server at
`https://127.0.0.1:<port>/<path>` with that CA as caBundle. Each runs as a client-certificate user in
`system:masters` (its own ClusterRole is not installed here). Ready once its /readyz answers, its webhook server
speaks TLS with our CA, and a server-side dry run of one of its objects passes its webhooks.
"""

from __future__ import annotations

import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.kubeconfig import write_kubeconfig
from tests.harness.pki import CertificateAuthority
from tests.harness.processes import ManagedProcess, free_port, wait_until


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def webhook_serving(port: int, ca_file: Path) -> bool:
    # The webhook server answers 404 to a path it has not registered, so any HTTP answer means TLS
    # works with our CA; whether the handlers are registered is what the dry run checks.
    context = ssl.create_default_context(cafile=str(ca_file))
    try:
        urllib.request.urlopen(f"https://127.0.0.1:{port}/", context=context, timeout=2)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True


@dataclass(frozen=True)
class WebhookManager:
    """What differs between the managers."""

    name: str
    """Its short name: lws, kueue (the process is `<name>-manager`)."""
    config_yaml: Callable[[int, Path, int], str]
    """(webhook port, certificate folder, probe port) -> its Configuration file."""
    install: Callable[[str], None]
    """Installs its CRDs and webhook configurations, given the webhooks' base URL."""
    probe: dict[str, Any]
    """An object whose server-side dry run passes its webhooks once they are served."""
    ready_timeout: float = 60
    env: Callable[[Path], Mapping[str, str]] = field(default=lambda _cert_dir: {})
    """Extra environment, given the serving certificate's folder."""


def start_webhook_manager(
    manager: WebhookManager,
    binary: str,
    *,
    ca: CertificateAuthority,
    server: str,
    workdir: Path,
    logs_dir: Path,
    dry_run_create: Callable[[dict[str, Any]], None],
    watched: list[ManagedProcess],
) -> ManagedProcess:
    """Starts the manager, installs what it serves, and returns once a dry run of its probe passes its webhooks."""
    name = manager.name
    cert_dir = workdir / f"{name}-serving"
    cert_dir.mkdir(parents=True, exist_ok=True)
    serving = ca.issue(f"{name}-webhook", f"{name}-webhook", ip_addresses=("127.0.0.1",), server=True)
    # controller-runtime's webhook server reads tls.crt and tls.key from certDir.
    (cert_dir / "tls.crt").write_bytes(serving.cert_pem())
    (cert_dir / "tls.key").write_bytes(serving.key_pem())
    webhook_port, probe_port = free_port(), free_port()
    config = workdir / f"{name}-config.yaml"
    config.write_text(manager.config_yaml(webhook_port, cert_dir, probe_port))
    client = ca.issue(f"{name}-controller", f"{name}-controller", organizations=("system:masters",))
    kubeconfig = write_kubeconfig(
        workdir / f"{name}-controller.kubeconfig",
        server=server,
        ca_pem=ca.pair.cert_pem(),
        user_name=f"{name}-controller",
        client=client,
    )
    manager.install(f"https://127.0.0.1:{webhook_port}")
    process = ManagedProcess.start(
        f"{name}-manager",
        [binary, f"--config={config}", "--zap-log-level=info"],
        logs_dir,
        {**os.environ, "KUBECONFIG": str(kubeconfig), **manager.env(cert_dir)},
    )
    every = [*watched, process]
    wait_until(
        lambda: http_ok(f"http://127.0.0.1:{probe_port}/readyz"),
        timeout=manager.ready_timeout,
        describe=f"{name}-manager /readyz",
        watched=every,
    )
    wait_until(
        lambda: webhook_serving(webhook_port, ca.pair.cert),
        timeout=60,
        describe=f"{name}-manager's webhook server",
        watched=every,
    )

    def admitted() -> bool:
        dry_run_create(manager.probe)
        return True

    wait_until(
        admitted,
        timeout=60,
        describe=f"a {manager.probe['kind']} dry run through {name}-manager's webhooks",
        watched=every,
        interval=0.5,
    )
    return process
