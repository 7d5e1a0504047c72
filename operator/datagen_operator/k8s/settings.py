"""The operator's own configuration, from its environment (the Helm chart sets these)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from datagen_operator import __version__

DEFAULT_WORKER_IMAGE = f"ghcr.io/datagen-operator/datagen:{__version__}"


@dataclass(frozen=True)
class Settings:
    worker_image: str = DEFAULT_WORKER_IMAGE
    """Image for the canary, worker and verify pods (they run `datagen ...`); spec.clients.image overrides."""
    resync_s: float = 10.0
    """Longest pause between two passes over a run; child changes wake a run earlier."""
    progress_write_s: float = 5.0
    """Status writes that only move progress numbers are spaced this far apart (condition changes are not): with
    the workers' ConfigMaps patched every 5 s, status.progress is at most about 10 s behind the workers."""
    message_write_s: float = 30.0
    """Spacing of status writes where only words move and no count does (a loading timer, "31s of 45m"): a model
    loads for minutes, and a run waiting on it need not cost the API server a write every few seconds."""
    progress_writes_per_s: float = 20.0
    """All runs' progress-only status writes together, a second (control/throttle.progress_spacing): 100 runs
    still write every 5 s; beyond that each run's spacing grows to runs / 20 s, and the API server's load stays
    flat."""
    namespace: str | None = None
    """Watch one namespace; None: all namespaces."""
    test_server_urls: tuple[str, ...] = ()
    """TEST ONLY: talk to these URLs (replica i -> entry i) instead of the server Services' cluster DNS names.
    The test control plane has no kubelet (kwok fakes it), so no pod really serves; a loopback simulator does.
    Set only by the operator's deployer (an environment variable, never a field a run's author controls)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        urls = tuple(u.strip().rstrip("/") for u in env.get("DATAGEN_TEST_SERVER_URLS", "").split(",") if u.strip())
        return cls(
            worker_image=env.get("DATAGEN_WORKER_IMAGE") or DEFAULT_WORKER_IMAGE,
            resync_s=float(env.get("DATAGEN_RESYNC_SECONDS", cls.resync_s)),
            progress_write_s=float(env.get("DATAGEN_PROGRESS_WRITE_SECONDS", cls.progress_write_s)),
            message_write_s=float(env.get("DATAGEN_MESSAGE_WRITE_SECONDS", cls.message_write_s)),
            progress_writes_per_s=float(env.get("DATAGEN_PROGRESS_WRITES_PER_SECOND", cls.progress_writes_per_s)),
            namespace=env.get("DATAGEN_WATCH_NAMESPACE") or None,
            test_server_urls=urls,
        )
