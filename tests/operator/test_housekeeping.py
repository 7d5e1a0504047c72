"""A run lets Kubernetes tidy up: deleting its namespace, or the run itself (`kubectl delete dgr`), completes
within a minute in every phase (the server loading, bulk generation, finished, halted), with no ERROR in the
operator's log; and a healthy run says what it does in Normal events and INFO lines, not in warnings or one
"succeeded" line per watch event.

Kubernetes deletes a namespace's pods first and the rest (the DataGenRun among it) only once they are gone. A
deleted pod of the workers' Job (an Indexed Job with backoffLimitPerIndex) is held by its tracking finalizer until
a replacement exists, which a namespace being deleted never accepts: the operator lets the run go (stops its
children as a deletion does) or the namespace never goes. The test kubelet gives a deleted pod its terminal
phase before it goes, as a kubelet does, so the Job controller sees what it sees in a cluster.

The operator watches a namespace of its own here (its ServiceAccount lives in the test's namespace, which
stays): deleting the runs' namespace must not take the operator's credentials with it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.harness.controlplane import Cluster
from tests.harness.kubelet import PodRunner
from tests.harness.processes import free_port, wait_until
from tests.harness.sim import SimServer
from tests.manifests import cluster_run
from tests.operator.conftest import (
    KIMI,
    LONG_ANSWERS,
    SLOW,
    STRICT,
    TRUNCATING_LENIENTLY,
    Runs,
    many_prompts,
    new_name,
    operator_account,
    start_kopf,
)

DELETION_S = 60.0
GONE = "Deleted, really deleted, and we are notified."
"""kopf's DEBUG line once the watch reports an object deleted for good."""
API_SERVER_BUSY = re.compile(r"Request attempt #\d+/\d+ failed; will retry: .* -> APITooManyRequestsError\(")
"""kopf's line for a request it retries because the API server said 429 (TooManyRequests)."""
PER_EVENT = re.compile(r"(Handler|Indexer) '[^']+' succeeded\.")
"""kopf's line for every watch event handed to a handler or an indexer."""


class OperatorLog(logging.Handler):
    """Every record the operator logs (kopf's loggers and ours) while it runs in this process."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(("kopf", "datagen")):
            self.records.append(record)

    def lines(self, level: int = logging.INFO) -> list[str]:
        return [f"{r.levelname} {r.name} {r.getMessage()}" for r in self.records if r.levelno >= level]

    def errors(self) -> list[str]:
        """ERROR lines but kopf's own retries of a request the API server answered 429 (its storage re-initializing
        under load): kopf logs each such attempt at ERROR and retries it; a request that fails for good still counts."""
        return [line for line in self.lines(logging.ERROR) if not API_SERVER_BUSY.search(line)]

    def per_event(self) -> list[str]:
        return [line for r in self.records if PER_EVENT.fullmatch(line := r.getMessage())]

    def gone(self, name: str) -> bool:
        """kopf handled the run's last watch event (its DELETED): its daemon, its finalizer and every handler
        for it are done, so nothing more is logged about it. kopf says so at DEBUG (`kopf.objects`)."""
        return any(
            r.getMessage() == GONE and (getattr(r, "k8s_ref", None) or {}).get("name") == name for r in self.records
        )


@pytest.fixture
def run_namespace(control_plane: Cluster) -> Iterator[str]:
    """A namespace for the runs alone (the tests delete it); removed afterwards if a test left it."""
    core = client.CoreV1Api(control_plane.api_client())
    name = f"t-runs-{secrets.token_hex(3)}"
    core.create_namespace({"metadata": {"name": name, "labels": {"datagen.dev/test": "true"}}})
    wait_until(
        lambda: core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
        timeout=30, describe=f"ServiceAccount default in {name}",
    )  # fmt: skip
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


LoggedOperator = Callable[[list[str]], OperatorLog]


@pytest.fixture
def logged_operator(
    control_plane: Cluster, namespace: str, run_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LoggedOperator]:
    """`(server_urls) -> its log`: the operator in-process, watching `run_namespace`, as ServiceAccount
    datagen-operator of the test's namespace bound to exactly k8s/rbac.py's rules (as tests/operator/conftest.py's
    `operator`, which watches the test's own namespace)."""
    kubeconfig, unbind = operator_account(control_plane, namespace)
    log = OperatorLog()
    logging.getLogger().addHandler(log)
    # An in-process worker run earlier in the session (its setup_logging) stops `datagen` records at their own
    # logger; the operator's must reach the root's handler here, as they reach the operator pod's output.
    monkeypatch.setattr(logging.getLogger("datagen"), "propagate", True)
    runners: list[Any] = []

    def start(server_urls: list[str]) -> OperatorLog:
        runners.append(start_kopf(monkeypatch, kubeconfig, run_namespace, server_urls))
        return log

    yield start
    for runner in runners:
        runner.__exit__(None, None, None)
    logging.getLogger().removeHandler(log)
    unbind()


def to_phase(phase: str, runs: Runs, name: str, kubelet: PodRunner, sim: SimServer, data: Path, tok: Path) -> None:
    """Create the run and bring it to `phase`; the simulator is started here except for "loading"."""
    if phase == "halted":
        many_prompts(data)
        runs.create(
            cluster_run(
                name,
                data,
                tok,
                **TRUNCATING_LENIENTLY,
            )
        )
    else:
        runs.create(cluster_run(name, data, tok))
    if phase == "loading":
        runs.wait(name, "InputsVerified", "True", "Passed", timeout=90)
        runs.wait(name, "ServerReady", "False", "Loading", timeout=60)
        return
    sim.spawn().wait_ready()
    if phase == "finished":
        runs.wait(name, "Succeeded", "True", "Completed", timeout=240)
        return
    runs.wait(name, "Progressing", "True", "Running", timeout=150)
    if phase == "bulk":
        runs.wait_for("workers running", lambda: len(kubelet.running(runs.namespace, f"{name}-workers-")) == 2)
        return
    records = lambda: (runs.get(name)["status"].get("progress") or {}).get("records", 0)  # noqa: E731
    runs.wait_for("16 records", lambda: records() >= 16, 120)
    runs.patch_spec(name, {"checks": STRICT})  # the rolling checks halt it: its workers' Job is suspended
    runs.wait(name, "Succeeded", "False", "ChecksFailed", timeout=60)
    runs.wait_for("the workers stopped", lambda: not kubelet.running(runs.namespace, f"{name}-workers-"), 60)


def sim_flags(phase: str) -> tuple[str, ...]:
    return {"finished": KIMI, "halted": (*KIMI, *SLOW, *LONG_ANSWERS)}.get(phase, (*KIMI, *SLOW))


def gone(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl") or str(Path(cluster.binary("kubectl")))  # type: ignore[attr-defined]
    return subprocess.run([binary, f"--kubeconfig={cluster.kubeconfig}", *args], capture_output=True, text=True)


def evidence(cluster: Cluster, line: str) -> None:
    with (cluster.logs_dir / "housekeeping.log").open("a") as log:  # stdout belongs to KopfRunner here
        log.write(line + "\n")


@pytest.fixture
def kopf_object_debug() -> Iterator[None]:
    """kopf's per-object DEBUG lines logged (its word that an object is gone among them, `OperatorLog.gone`)."""
    logger = logging.getLogger("kopf.objects")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield
    logger.setLevel(level)


@pytest.mark.usefixtures("kopf_object_debug")
@pytest.mark.parametrize("how", ["namespace", "run"])
@pytest.mark.parametrize("phase", ["loading", "bulk", "finished", "halted"])
def test_deleting_the_namespace_or_the_run_completes_within_a_minute(
    phase: str,
    how: str,
    control_plane: Cluster,
    run_namespace: str,
    logged_operator: LoggedOperator,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    runs = Runs(control_plane, run_namespace)
    name = new_name(phase)
    sim = SimServer(sim_flags(phase), tokenizer_dir=standin_tokenizer, port=free_port())
    with sim:
        log = logged_operator([sim.url])
        to_phase(phase, runs, name, kubelet, sim, data_dir, standin_tokenizer)
        before = runs.condition(name, "Succeeded")
        assert before is not None
        seen: list[tuple[str, str]] = []

        def done() -> bool:
            with contextlib.suppress(ApiException):  # the run is gone before its namespace
                succeeded = runs.condition(name, "Succeeded") or {}
                seen.append((succeeded.get("status", ""), succeeded.get("reason", "")))
            if how == "namespace":
                return gone(lambda: runs.core.read_namespace(run_namespace))
            return (
                gone(lambda: runs.get(name))
                and not runs.core.list_namespaced_pod(run_namespace, label_selector=f"datagen.dev/run={name}").items
            )

        started = time.monotonic()
        if how == "namespace":
            runs.core.delete_namespace(run_namespace)
        else:
            # Not waited for by kubectl: the test polls the run while its finalizer works.
            deleted = kubectl(control_plane, "-n", run_namespace, "delete", "dgr", name, "--wait=false")
            assert deleted.returncode == 0, deleted.stderr
        finished = False
        while not finished and time.monotonic() - started < DELETION_S:
            finished = done()
            time.sleep(0.3)
        took = time.monotonic() - started
        state = "" if finished else runs.describe()
        if finished:  # what the operator logs as the run goes, up to kopf's last word on it
            runs.wait_for("kopf's word that the run is gone", lambda: log.gone(name), 30)
    errors = log.errors()
    let_go = [line.partition("(")[2].partition(")")[0] for line in log.lines() if "namespace is being deleted" in line]
    evidence(control_plane, f"{phase}/{how}: {'gone' if finished else 'NOT gone'} after {took:.1f} s, "
             f"{len(errors)} ERROR lines, Succeeded seen {sorted(set(seen))}, let go: {let_go}")  # fmt: skip
    assert finished, f"{how} of a {phase} run not done after {took:.0f} s:\n{state}"
    assert not errors, errors[:3]
    # The run's daemon ends on its stop flag: kopf need not cancel it ("... is cancelled. Will escalate.").
    cancelled = [line for line in log.lines(logging.WARNING) if "cancelled" in line]
    assert not cancelled, cancelled
    changed = {s for s in seen if s != ("", "") and s != (before["status"], before["reason"])}
    assert not changed, f"Succeeded was {before['status']} ({before['reason']}), then {changed}: a false verdict"


def test_a_successful_run_warns_of_nothing_and_logs_no_line_per_watch_event(
    control_plane: Cluster,
    run_namespace: str,
    logged_operator: LoggedOperator,
    kubelet: PodRunner,
    data_dir: Path,
    standin_tokenizer: Path,
) -> None:
    runs = Runs(control_plane, run_namespace)
    name = new_name("quiet")
    sim = SimServer(KIMI, tokenizer_dir=standin_tokenizer).spawn()
    with sim:
        sim.wait_ready()
        log = logged_operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"clients.shards": 3}))
        runs.wait(name, "Succeeded", "True", "Completed", timeout=240)
        runs.wait_passes(name, 3)  # passes over the finished run: its last events and log lines
    events = runs.events(name)
    warnings = [(e.reason, e.message) for e in events if e.type == "Warning"]
    info = log.lines()
    evidence(control_plane, f"{name}: {len(events)} events ({len(warnings)} Warning), {len(info)} INFO+ lines, "
             f"{len(log.per_event())} per-event lines:\n  " + "\n  ".join(info))  # fmt: skip
    assert {e.reason for e in events} >= {"InputsVerifiedPassed", "ServerReadyReleased", "SucceededCompleted"}
    assert not warnings, warnings
    assert not log.per_event(), f"{len(log.per_event())} lines like {log.per_event()[:2]}"
    # What a person reading the log needs: each transition, in the events' words.
    said = "\n".join(info)
    for transition in ("InputsVerified=True (Passed)", "CanaryPassed=True (Passed)", "Succeeded=True (Completed)"):
        assert f"{runs.namespace}/{name}: {transition}" in said, transition
