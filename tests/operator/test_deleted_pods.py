"""A verdict, once observed, is recorded: Kubernetes deletes finished pods and Jobs whenever it likes (users, pod
GC, TTLs, namespace deletion), and a step whose pod or Job is gone has not failed. Each finished step's pods (or
its Jobs) are deleted at each phase of a run: while the server loads (the preflight's), during bulk generation
(the preflight's, the canary's, a crashed worker's), while verifying (the workers'), while exporting (verify's),
after success (every one), after a halt (every one). Counted on every poll: no recorded condition changes, no Job
is re-created (the UIDs), no step pod runs again (the test kubelet's count of the pods it started)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.harness.kubelet import PodRunner
from tests.harness.processes import free_port
from tests.harness.sim import SimServer
from tests.manifests import cluster_run
from tests.operator.conftest import (
    KIMI,
    LONG_ANSWERS,
    SLOW,
    STRICT,
    TRUNCATING_LENIENTLY,
    OperatorFactory,
    Runs,
    many_prompts,
    new_name,
)

VERDICTS = ("InputsVerified", "ParsersVerified", "CanaryPassed", "DataFaithful", "Exported", "Succeeded")
"""Conditions that hold a step's verdict once they read True or False (DataFaithful: the final verification's)."""
STEPS = ("preflight", "canary", "workers", "verify", "export")
SETTLE_PASSES = 6
"""Passes of the operator over a finished or halted run after its children are deleted, the run polled meanwhile."""

Snapshot = dict[str, tuple[str, str, str]]


def recorded(snapshot: Snapshot) -> Snapshot:
    """The verdicts of a poll: conditions that read True or False (DataFaithful only for the final verdict)."""
    out = {}
    for type_, (status, reason, since) in snapshot.items():
        if type_ not in VERDICTS or status == "Unknown":
            continue
        if type_ == "DataFaithful" and reason not in ("Verified", "ChecksFailed"):
            continue  # the rolling checks' word, which changes as records come in
        out[type_] = (status, reason, since)
    return out


class Polls:
    """The run's conditions every 0.3 s, in the background: every poll, in order."""

    def __init__(self, runs: Runs, name: str) -> None:
        self.runs, self.name = Runs(runs.cluster, runs.namespace), name  # its own client, for its own thread
        self.snapshots: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="condition-poller", daemon=True)

    def __enter__(self) -> Polls:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conditions = (self.runs.get(self.name).get("status") or {}).get("conditions") or []
            except ApiException:  # not created yet
                conditions = []
            if conditions:
                self.snapshots.append(
                    {c["type"]: (c["status"], c["reason"], c["lastTransitionTime"]) for c in conditions}
                )
            self._stop.wait(0.3)

    def changed_verdicts(self, polls: int | None = None) -> list[str]:
        """Each verdict that read otherwise on a later poll than the one where it was first recorded (over the
        first `polls` polls, else all)."""
        first: Snapshot = {}
        changes = []
        for index, snapshot in enumerate(self.snapshots[:polls]):
            now = recorded(snapshot)
            for type_, value in first.items():
                if now.get(type_) != value:
                    changes.append(f"poll {index}: {type_} {value} -> {now.get(type_) or snapshot.get(type_)}")
            first.update({k: v for k, v in now.items() if k not in first})
        return changes


class Steps:
    """The run's step pods and Jobs, deleted as a user (or Kubernetes' housekeeping) deletes them."""

    def __init__(self, runs: Runs, kubelet: PodRunner, name: str) -> None:
        self.runs, self.kubelet, self.name = runs, kubelet, name
        self.uids: dict[str, str] = {}
        """Every step Job seen, by name: its first UID."""
        self.deleted_jobs: set[str] = set()
        self.deleted_pods = 0

    def pods(self, step: str) -> list[Any]:
        selector = f"datagen.dev/run={self.name},datagen.dev/component={'worker' if step == 'workers' else step}"
        return self.runs.core.list_namespaced_pod(self.runs.namespace, label_selector=selector).items

    def jobs(self) -> dict[str, str]:
        listed = self.runs.batch.list_namespaced_job(self.runs.namespace).items
        found = {j.metadata.name: j.metadata.uid for j in listed if j.metadata.name.startswith(f"{self.name}-")}
        for job, uid in found.items():
            self.uids.setdefault(job, uid)
        return found

    def delete(self, steps: tuple[str, ...], what: str) -> None:
        """The finished pods of `steps`, or their Jobs (as `kubectl delete job`: the pods go with them); returns
        once they are gone. A pod already being deleted (a suspended Job's, held by its finalizer) is left."""
        self.jobs()
        doomed: set[str] = set()
        for step in steps:
            if what == "jobs":
                job = f"{self.name}-{step}"
                with contextlib.suppress(ApiException):  # gone already (deleted in an earlier phase)
                    self.runs.batch.delete_namespaced_job(job, self.runs.namespace, propagation_policy="Background")
                    self.deleted_jobs.add(job)
                continue
            for pod in self.finished(step):
                with contextlib.suppress(ApiException):
                    self.runs.core.delete_namespaced_pod(pod.metadata.name, self.runs.namespace)
                    self.deleted_pods += 1
                    doomed.add(pod.metadata.name)

        def gone() -> bool:
            if what == "jobs":
                return not any(self.runs.job(f"{self.name}-{step}") for step in steps)
            return not doomed & {p.metadata.name for step in steps for p in self.pods(step)}

        self.runs.wait_for(f"the {what} of {', '.join(steps)} gone", gone)

    def finished(self, step: str) -> list[Any]:
        """The pods of `step` that ended and are not being deleted."""
        return [
            p
            for p in self.pods(step)
            if p.status.phase in ("Succeeded", "Failed") and not p.metadata.deletion_timestamp
        ]

    def started(self, step: str) -> int:
        """Pods of `step` the test kubelet started (deleted ones included)."""
        prefix = f"{self.name}-{step}-"
        return sum(1 for ns, pod in self.kubelet.started if ns == self.runs.namespace and pod.startswith(prefix))

    def check_jobs(self) -> list[str]:
        """Jobs re-created (a new UID) or back after their deletion."""
        now = self.jobs()
        wrong = [f"{job} re-created" for job, uid in now.items() if self.uids.get(job) != uid]
        return wrong + [f"{job} back after its deletion" for job in self.deleted_jobs if job in now]


@contextlib.contextmanager
def sim_later(tokenizer: Path) -> Iterator[SimServer]:
    """A simulator on a port chosen now and started later: until then the server reads as loading."""
    sim = SimServer((*KIMI, *SLOW), tokenizer_dir=tokenizer, port=free_port())
    try:
        yield sim
    finally:
        sim.stop()


def reached(runs: Runs, name: str, reasons: dict[str, str], timeout: float = 120) -> None:
    """Any of the conditions reads its reason (a phase, or a later one: short phases may pass between polls)."""

    def now() -> bool:
        conditions = (runs.get(name).get("status") or {}).get("conditions") or []
        return any(reasons.get(c["type"]) == c["reason"] for c in conditions)

    runs.wait_for(f"{name}: {reasons}", now, timeout)


def settled(runs: Runs, name: str, passes: int) -> list[Snapshot]:
    """The whole condition list, polled until the operator has made `passes` passes over the run."""

    def look() -> Snapshot:
        conditions = runs.get(name)["status"]["conditions"]
        return {c["type"]: (c["status"], c["reason"], c["lastTransitionTime"]) for c in conditions}

    return runs.during_passes(name, passes, look)


def evidence(runs: Runs, line: str) -> None:
    with (runs.cluster.logs_dir / "deleted-children.log").open("a") as log:  # stdout belongs to KopfRunner
        log.write(line + "\n")


@pytest.mark.parametrize("what", ["pods", "jobs"])
def test_deleting_finished_step_children_at_every_phase_changes_nothing(
    what: str, runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name(f"gc-{what}")
    steps = Steps(runs, kubelet, name)
    with sim_later(standin_tokenizer) as sim, Polls(runs, name) as polls:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer, **{"export.formats": ["speculators"]}))

        # While the server loads: the preflight's verdict is all there is.
        runs.wait(name, "InputsVerified", "True", "Passed", timeout=90)
        runs.wait(name, "ServerReady", "False", "Loading", timeout=60)
        steps.delete(("preflight",), what)
        runs.wait_passes(name, 2)  # passes over a loading server with its preflight gone
        sim.spawn().wait_ready()

        # Bulk generation: the preflight's and the canary's children go; a worker crashes (SIGKILL, its Job
        # counts a failure and makes a new pod) and its failed pod is deleted too: the Job keeps its count.
        runs.wait(name, "CanaryPassed", "True", "Passed", timeout=120)
        runs.wait(name, "Progressing", "True", "Running", timeout=60)
        steps.delete(("preflight", "canary"), what)
        crashed = runs.wait_for("a running worker", lambda: kubelet.running(runs.namespace, f"{name}-workers-"))[0]
        kubelet.kill(crashed)
        runs.wait_for("the crash counted", lambda: (runs.job(f"{name}-workers").status.failed or 0) >= 1)
        runs.wait_for("its replacement", lambda: steps.started("workers") >= 3)
        runs.core.delete_namespaced_pod(crashed.name, runs.namespace)
        runs.wait_for(
            "the crashed pod gone", lambda: crashed.name not in {p.metadata.name for p in steps.pods("workers")}
        )
        workers = runs.job(f"{name}-workers")
        assert workers is not None and workers.status.failed == 1, "the Job keeps counting the deleted pod's failure"

        # Every shard done, verification running: the workers' children go (a finished Job: its count stands).
        reached(runs, name, {"Progressing": "Verifying", "DataFaithful": "Verified"})
        steps.delete(("workers",), what)
        # Verified, exporting: verify's children go.
        reached(runs, name, {"DataFaithful": "Verified"})
        steps.delete(("verify",), what)
        runs.wait(name, "Succeeded", "True", "Completed", timeout=120)
        before = runs.get(name)["status"]

        # After success: every step's children go; the run reads the same on every poll.
        steps.delete(STEPS, what)
        after = settled(runs, name, SETTLE_PASSES)
        status = runs.get(name)["status"]
    final = {c["type"]: (c["status"], c["reason"], c["lastTransitionTime"]) for c in before["conditions"]}
    started = {step: steps.started(step) for step in STEPS}
    evidence(runs, f"{name}: {len(polls.snapshots)} polls, {steps.deleted_pods} pods and {len(steps.deleted_jobs)} "
             f"Jobs deleted, step pods started {started}, Jobs {sorted(steps.uids)}")  # fmt: skip
    assert not polls.changed_verdicts(), polls.changed_verdicts()[:5]
    assert all(snapshot == final for snapshot in after), [s for s in after if s != final][:1]
    assert (final["Exported"][0], final["Succeeded"][:2]) == ("True", ("True", "Completed")), final
    assert not steps.check_jobs(), steps.check_jobs()
    assert started == {"preflight": 1, "canary": 1, "workers": 3, "verify": 1, "export": 1}, started
    assert status["progress"] == before["progress"], "the count stands without the workers' Job"
    assert status["progress"]["shardsDone"] == 2 and status["progress"]["promptsDone"] == 24
    assert runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0


@pytest.mark.parametrize("what", ["pods", "jobs"])
def test_deleting_a_halted_runs_children_changes_nothing(
    what: str, runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name(f"halt-{what}")
    steps = Steps(runs, kubelet, name)
    flags = (*KIMI, *SLOW, *LONG_ANSWERS)
    with SimServer(flags, tokenizer_dir=standin_tokenizer).spawn() as sim, Polls(runs, name) as polls:
        sim.wait_ready()
        operator([sim.url])
        many_prompts(data_dir)
        runs.create(
            cluster_run(
                name,
                data_dir,
                standin_tokenizer,
                **TRUNCATING_LENIENTLY,
            )
        )
        runs.wait(name, "Progressing", "True", "Running", timeout=150)
        records = lambda: (runs.get(name)["status"].get("progress") or {}).get("records", 0)  # noqa: E731
        runs.wait_for("16 records", lambda: records() >= 16, 120)
        # A halt by the rolling checks: the workers' Job is suspended, each shard's last pod held by it.
        runs.patch_spec(name, {"checks": STRICT})
        runs.wait(name, "Succeeded", "False", "ChecksFailed", timeout=60)
        runs.wait_for("the workers stopped", lambda: not kubelet.running(runs.namespace, f"{name}-workers-"), 60)
        runs.wait_passes(name, 2)  # the operator has seen the workers stopped
        before = runs.get(name)["status"]
        started_before = {step: steps.started(step) for step in STEPS}

        steps.delete(("preflight", "canary", "workers"), what)
        after = settled(runs, name, SETTLE_PASSES)
        polled, started = len(polls.snapshots), {step: steps.started(step) for step in STEPS}
        jobs_wrong = steps.check_jobs()
        # A data change now is refused as before: the output holds records whether or not their Job is left.
        # (Any spec change lifts a halt: the run is judged again, which is not what is counted here.)
        runs.patch_spec(name, {"generation": {"sampling": {"max_new_tokens": 1024}}})
        frozen = runs.wait(name, "SpecApplied", "False", "DataFieldsFrozen", timeout=30)
        runs.wait_passes(name, 3)  # passes over the refused change, which must start no step
        # The change lifts the halt (the workers may go on); the refused data change runs no gate step again.
        gates_again = [
            wrong for wrong in steps.check_jobs() if wrong.startswith((f"{name}-preflight ", f"{name}-canary "))
        ]
        reran = {step: steps.started(step) for step in ("preflight", "canary")}
    final = {c["type"]: (c["status"], c["reason"], c["lastTransitionTime"]) for c in before["conditions"]}
    evidence(runs, f"{name}: {polled} polls, {steps.deleted_pods} pods and {len(steps.deleted_jobs)} "
             f"Jobs deleted, step pods started {started}, Jobs {sorted(steps.uids)}")  # fmt: skip
    assert not polls.changed_verdicts(polled), polls.changed_verdicts(polled)[:5]
    assert all(snapshot == final for snapshot in after), [s for s in after if s != final][:1]
    assert not jobs_wrong, jobs_wrong
    assert started == started_before and started["preflight"] == started["canary"] == 1, started
    assert "spec.generation.sampling.max_new_tokens" in frozen["message"]
    assert not gates_again, gates_again
    assert reran == {"preflight": 1, "canary": 1}, "the refused change ran no step again"
    assert runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0


def test_a_step_pod_gone_before_its_verdict_was_read_runs_again(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    """The operator is away while the preflight ends, and its pod is deleted before anyone read it: the Job reads
    Complete with no pod. That is no verdict at all, not a failed one: the step runs again."""
    name = new_name("unread")
    steps = Steps(runs, kubelet, name)
    kubelet.only_label = "datagen.dev/not-yet"  # the preflight's pod waits until the operator is away
    try:
        handle = operator(["http://127.0.0.1:9"])  # no server answers: the run waits there once the inputs pass
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        runs.wait_for("the preflight's pod", lambda: steps.pods("preflight"))
        handle.stop()
    finally:
        kubelet.only_label = None
    runs.wait_for("the preflight ended", lambda: steps.finished("preflight"), 90)
    steps.delete(("preflight",), "pods")
    unread = runs.condition(name, "InputsVerified")
    assert unread is not None and unread["status"] == "Unknown", unread
    with Polls(runs, name) as polls:
        operator(["http://127.0.0.1:9"])
        inputs = runs.wait(name, "InputsVerified", "True", "Passed", timeout=90)
    seen = {recorded(s).get("InputsVerified") for s in polls.snapshots} - {None}
    assert all(status == "True" for status, _, _ in seen), seen
    assert steps.started("preflight") == 2, "the preflight ran again"
    assert "24 prompts" in inputs["message"]
