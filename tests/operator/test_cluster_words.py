"""What a person reads of a run on the cluster (`kubectl get dgr -o wide`, `describe`'s status and conditions, the
run's events), over the field pass of issue 46 item 7:

- the Progress column and status.progress carry an ETA while the workers generate (the rule `datagen run` says it
  by: records left at the rate records were done since the workers began);
- a live field changed names the changed field in words, old → new, never the spec section as JSON, and on a
  finished run says that it changes nothing;
- `spec.suspend` turned on and off over a halted run is acknowledged: observedGeneration follows the generation,
  SpecApplied says what the suspend does there, with an event each time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import KIMI, SLOW, OperatorFactory, Runs, many_prompts, new_name
from tests.operator.test_progress_columns import Poller

JSON_IN_WORDS = re.compile(r"[{\[]\s*\"|\":")
"""What raw JSON looks like in a message: an object's or a list's quoted key."""


def status(runs: Runs, name: str) -> dict[str, Any]:
    return runs.get(name).get("status") or {}


def test_the_progress_column_and_status_say_the_eta_and_a_live_change_is_said_in_words(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    many_prompts(data_dir, 60)
    name = new_name("eta")
    log = runs.cluster.logs_dir / f"kubectl-get-dgr-{name}.log"
    lenient = {"maxTruncationRate": 1.0, "minReasoningRate": 0.0}
    with start_sim(*KIMI, *SLOW, tokenizer_dir=standin_tokenizer) as sim, Poller(runs, log) as poller:
        operator([sim.url])
        runs.create(
            cluster_run(
                name,
                data_dir,
                standin_tokenizer,
                **{"checks.maxTruncationRate": 1.0, "checks.minReasoningRate": 0.0, "clients.shards": 2},
            )
        )
        runs.wait(name, "Progressing", "True", "Running", timeout=150)
        progress = runs.wait_for(
            "an ETA in status.progress", lambda: (status(runs, name).get("progress") or {}).get("eta"), 90
        )
        assert re.fullmatch(r"(\d+h)?(\d+m)?(\d+s)?", progress), progress
        eta_at = (status(runs, name).get("progress") or {}).get("etaAt") or ""
        assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ", eta_at), eta_at
        poller.wait_for(runs, name, "PHASE", "Running", polls=2)
        runs.wait_for(
            "the ETA in the Progress column", lambda: any(", ETA " in r["PROGRESS"] for r in poller.rows(name))
        )

        # A live field while generating: named at its leaf, old → new, in words.
        runs.patch_spec(name, {"checks": {**lenient, "minReasoningRate": 0.01}})
        applied = runs.wait(name, "SpecApplied", "True", "LiveFieldsApplied")
        message = applied["message"]
        assert "spec.checks.minReasoningRate 0.0 → 0.01: takes effect at once" in message, message
        assert not JSON_IN_WORDS.search(message), message

        runs.wait(name, "Succeeded", "True", "Completed", timeout=240)
        finished = poller.rows(name)[-1]
        assert ", ETA " not in finished["PROGRESS"], finished
        assert "eta" not in (status(runs, name).get("progress") or {})

        # On a finished run the same change is said to change nothing: the final verdict stands.
        runs.patch_spec(name, {"checks": {**lenient, "minReasoningRate": 0.02}})
        said = runs.wait_for(
            "the change acknowledged on the finished run",
            lambda: "0.01 → 0.02" in ((runs.condition(name, "SpecApplied") or {}).get("message") or ""),
            30,
        )
        assert said
        message = (runs.condition(name, "SpecApplied") or {})["message"]
        assert message == (
            "spec.checks.minReasoningRate 0.01 → 0.02: recorded; the run has finished, so it changes nothing now "
            "(its final verdict stands)"
        ), message
        assert "takes effect at once" not in message and "next pass" not in message
        assert runs.condition(name, "Succeeded")["reason"] == "Completed"  # type: ignore[index]
    events = [e.message for e in runs.events(name) if e.reason == "SpecAppliedLiveFieldsApplied"]
    assert events and not any(JSON_IN_WORDS.search(m) for m in events), events


def test_suspend_on_a_halted_run_is_acknowledged(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("halted")
    # The server runs the wrong reasoning parser: a halt at the parser check.
    with start_sim(
        "--reasoning-parser", "kimi", "--tool-call-parser", "kimi_k2", tokenizer_dir=standin_tokenizer
    ) as sim:
        operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        runs.wait(name, "Succeeded", "False", "ParsersMismatch", timeout=90)

        generation = runs.patch_spec(name, {"suspend": True})["metadata"]["generation"]
        runs.wait_for(
            "observedGeneration to follow the suspend",
            lambda: status(runs, name).get("observedGeneration") == generation,
            30,
        )
        suspended = runs.wait(name, "SpecApplied", "True", "SuspendOnHalt", timeout=10)
        assert suspended["message"].startswith("spec.suspend false → true on a run halted (ParsersMismatch): "), (
            suspended
        )
        assert "nothing runs to suspend" in suspended["message"] and "starts suspended" in suspended["message"]
        assert status(runs, name)["phase"] == "Halted"

        generation = runs.patch_spec(name, {"suspend": False})["metadata"]["generation"]
        runs.wait_for(
            "observedGeneration to follow the resume",
            lambda: status(runs, name).get("observedGeneration") == generation,
            30,
        )
        resumed = runs.wait(name, "SpecApplied", "True", "ResumeOnHalt", timeout=10)
        assert "nothing to resume" in resumed["message"] and "halt stands" in resumed["message"], resumed
        assert runs.condition(name, "Succeeded")["reason"] == "ParsersMismatch"  # type: ignore[index]
        events = [e.reason for e in runs.events(name) if e.reason.startswith("SpecApplied")]
        assert events.count("SpecAppliedSuspendOnHalt") == 1 and events.count("SpecAppliedResumeOnHalt") == 1, events
