"""What `kubectl get dgr -o wide` says, poll by poll, over a run that is halted by its rolling checks and
resumed (new worker pods), and meets a refused data change, beside a run halted at the preflight:

- the total is the dataset's prompt count (the preflight's) from the first poll that shows one;
- the count done never goes backwards, not even when the resumed workers start over reading the dataset;
- the Phase column says Halted while halted, and the Spec column names a refused data change;
- a run halted at the preflight never reads "workers starting".
"""

from __future__ import annotations

import itertools
import re
import subprocess
import threading
from pathlib import Path

from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import STRICT, TRUNCATING_LENIENTLY, OperatorFactory, Runs, many_prompts, new_name

PROMPTS = 300
"""Each shard reads ~100 prompts ahead of its requests: more than that shows a total counted as read."""
SIM = (
    "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--sim-mean-reasoning-tokens", "8",
    "--sim-mean-answer-tokens", "80", "--sim-speed", "gpu", "--sim-tokens-per-s", "200", "--sim-ttft-s", "0.05",
)  # fmt: skip
"""Answers longer than max_new_tokens (64): truncated records, which a strict maxTruncationRate halts on."""
LENIENT = {"maxTruncationRate": 1.0, "minReasoningRate": 0.0}
SUMMARY = re.compile(r"^(\d+)/(\d+) prompts")


def table(text: str) -> list[dict[str, str]]:
    """`kubectl get -o wide` rows by column name (kubectl pads every column to its header's offset)."""
    header, *rows = text.splitlines()
    names = re.findall(r"\S+", header)
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return [
        {name: row[start:end].strip() for name, start, end in zip(names, starts, ends, strict=True)}
        for row in rows
        if row.strip()
    ]


class Poller:
    """`kubectl get dgr -o wide` every 0.4 s in the background: every row of every poll, in order.

    A kubectl that fails to start or exits non-zero (a fork under a loaded CI has failed with EFAULT) is one
    lost poll, kept in `failures`, not the end of the polling: a dead poller would leave only the last word.
    """

    def __init__(self, runs: Runs, log: Path) -> None:
        self.runs, self.log = runs, log
        self.polls: list[list[dict[str, str]]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubectl-poller", daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.polls.append(table(self.runs.kubectl_get_wide(self.log)))  # the last word, after the waits

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                text = self.runs.kubectl_get_wide(self.log)
            except (OSError, subprocess.CalledProcessError) as error:
                self.failures.append(repr(error))
            else:
                if text.strip():
                    self.polls.append(table(text))
            self._stop.wait(0.4)

    def rows(self, name: str) -> list[dict[str, str]]:
        return [row for poll in self.polls for row in poll if row["NAME"] == name]

    def wait_for(self, runs: Runs, name: str, column: str, value: str, polls: int, timeout: float = 60) -> None:
        """Until `polls` polls taken from now show the run's `column` reading `value` (kubectl's own word, not a
        sleep that a slow kubectl on a loaded machine outlasts)."""
        start = len(self.polls)
        runs.wait_for(
            f"{polls} polls of {name} with {column} {value}",
            lambda: sum(r["NAME"] == name and r.get(column) == value for p in self.polls[start:] for r in p) >= polls,
            timeout,
        )


def progress(row: dict[str, str]) -> tuple[int, int] | None:
    match = SUMMARY.match(row["PROGRESS"])
    return (int(match[1]), int(match[2])) if match else None


def test_kubectl_get_wide_tells_the_total_monotone_progress_halts_and_refused_changes(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    many_prompts(data_dir, PROMPTS, "why is the sky blue?")
    (data_dir / "broken.jsonl").write_text('{"id": "x", "messages": "not a list"}\nnot json\n')
    name, broken = new_name("columns"), new_name("broken")
    log = runs.cluster.logs_dir / f"kubectl-get-dgr-{name}.log"
    with start_sim(*SIM, tokenizer_dir=standin_tokenizer) as sim, Poller(runs, log) as poller:
        operator([sim.url])
        runs.create(
            cluster_run(
                name,
                data_dir,
                standin_tokenizer,
                **TRUNCATING_LENIENTLY,
                **{"clients.shards": 2},
            )
        )
        runs.create(cluster_run(broken, data_dir, standin_tokenizer, **{"dataset.path": "broken.jsonl"}))
        runs.wait(broken, "Succeeded", "False", "PreflightFailed", timeout=90)
        # Its refusal recorded, the refused preflight's Job goes: no pod of the run is left in Error.
        runs.wait_for(
            "the refused preflight's pod gone",
            lambda: not runs.core.list_namespaced_pod(runs.namespace, label_selector=f"datagen.dev/run={broken}").items,
            60,
        )

        runs.wait(name, "Progressing", "True", "Running", timeout=150)
        runs.wait_for(
            "40 records", lambda: (runs.get(name)["status"].get("progress") or {}).get("records", 0) >= 40, 120
        )
        # A halt by the rolling checks (a live field): the workers Job is suspended, its pods drain.
        runs.patch_spec(name, {"checks": STRICT})
        runs.wait(name, "Succeeded", "False", "ChecksFailed", timeout=60)
        runs.wait_for("the workers stopped", lambda: not kubelet.running(runs.namespace, f"{name}-workers-"), 60)
        poller.wait_for(runs, name, "PHASE", "Halted", polls=3)  # a few polls of the halted run
        # The resume: new worker pods, which read the dataset from its start again.
        runs.patch_spec(name, {"checks": LENIENT})
        runs.wait(name, "Progressing", "True", "Running", timeout=60)
        runs.wait_for("workers running again", lambda: kubelet.running(runs.namespace, f"{name}-workers-"), 60)
        # A data change after bulk records: refused, and said where people look.
        runs.patch_spec(name, {"model": {"path": "/models/other"}})
        runs.wait(name, "SpecApplied", "False", "DataFieldsFrozen")
        poller.wait_for(runs, name, "SPEC", "DataFieldsFrozen", polls=2)
        runs.patch_spec(name, {"model": {"path": "/models/standin"}})
        runs.wait(name, "SpecApplied", "True", "Applied")
        runs.wait(name, "Succeeded", "True", "Completed", timeout=240)

    assert len(poller.failures) <= len(poller.polls) // 10, f"most polls answered: {poller.failures}"
    rows = poller.rows(name)
    shown = [progress(row) for row in rows]
    first = next(i for i, p in enumerate(shown) if p is not None)
    assert all(p is not None for p in shown[first:]), [r["PROGRESS"] for r in rows[first:] if progress(r) is None]
    totals = {p[1] for p in shown if p is not None}
    assert totals == {PROMPTS}, f"the total is the dataset's count at every poll, not {sorted(totals)}"
    done = [p[0] for p in shown if p is not None]
    backwards = [(a, b) for a, b in itertools.pairwise(done) if b < a]
    assert not backwards, f"progress went backwards: {backwards} (polls: {done})"
    assert 0 < min(d for d in done if d) < PROMPTS and done[-1] == PROMPTS, done

    phases = [row.get("PHASE") for row in rows]
    halted_at = phases.index("Halted")
    assert "Running" in phases[halted_at:], "resumed after the halt"
    assert any(row.get("SPEC") == "DataFieldsFrozen" for row in rows), "a refused data change is shown"
    assert any(row.get("SPEC") == "LiveFieldsApplied" for row in rows), "a live change (checks) is acknowledged"
    acknowledged = [e for e in runs.events(name) if e.reason == "SpecAppliedLiveFieldsApplied"]
    assert acknowledged and all(e.type == "Normal" for e in acknowledged), acknowledged
    said = acknowledged[0].message
    assert "spec.checks.maxTruncationRate 1.0 → 0.0: takes effect at once" in said and "{" not in said, said
    assert rows[-1].get("PHASE") == "Succeeded" and rows[-1].get("SPEC") == "Applied", rows[-1]

    halted = poller.rows(broken)
    assert halted and halted[-1].get("PHASE") == "Halted" and halted[-1]["REASON"] == "PreflightFailed", halted[-1]
    assert not any("workers" in row["PROGRESS"] for row in halted), {row["PROGRESS"] for row in halted}
