"""A halted run stays halted when it is suspended and resumed, and across an operator restart: no server pod is
created again (no model reload) and `Succeeded` never leaves False. Before, suspending reopened it (`Succeeded`
Unknown, "work continues where it stopped") and the resume loaded the model again only to halt 4 s later with
the same cause (issue 34 item 3). A change beyond `spec.suspend` is a new spec, judged afresh."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.harness.kubelet import PodRunner
from tests.harness.sim import start_sim
from tests.manifests import cluster_run
from tests.operator.conftest import OperatorFactory, Runs, new_name
from tests.operator.test_counts import server_pod_events

WATCH_PASSES = 3
"""How long each state is watched once a pass has taken it: three more passes of the operator over the run."""


def test_a_halted_run_stays_halted_through_suspend_resume_and_an_operator_restart(
    runs: Runs, operator: OperatorFactory, kubelet: PodRunner, data_dir: Path, standin_tokenizer: Path
) -> None:
    name = new_name("sticky")
    seen: list[tuple[str, str, str]] = []  # Succeeded (status, reason) at every look after the halt, and when

    def applied_suspend() -> bool | None:
        cm = runs.core.read_namespaced_config_map(f"{name}-spec", runs.namespace)
        return bool((yaml.safe_load(cm.data["run.yaml"])["spec"]).get("suspend"))

    def watch(what: str) -> None:
        def look() -> tuple[str, str, str]:
            succeeded = runs.condition(name, "Succeeded") or {}
            return what, succeeded.get("status", ""), succeeded.get("reason", "")

        seen.extend(runs.during_passes(name, WATCH_PASSES, look))

    # The server runs the wrong reasoning parser: a halt at the parser check, after one model load.
    with start_sim(
        "--reasoning-parser", "kimi", "--tool-call-parser", "kimi_k2", tokenizer_dir=standin_tokenizer
    ) as sim:
        handle = operator([sim.url])
        runs.create(cluster_run(name, data_dir, standin_tokenizer))
        runs.wait(name, "Succeeded", "False", "ParsersMismatch", timeout=90)
        assert server_pod_events(runs, name, "SuccessfulCreate") == 1

        runs.patch_spec(name, {"suspend": True})
        runs.wait_for("the suspend taken", lambda: applied_suspend() is True, 30)
        watch("suspended")
        runs.patch_spec(name, {"suspend": False})
        runs.wait_for("the resume taken", lambda: applied_suspend() is False, 30)
        watch("resumed")

        handle.stop()
        operator([sim.url])
        runs.patch_spec(name, {"suspend": True})
        runs.wait_for("the suspend taken by the new operator", lambda: applied_suspend() is True, 60)
        runs.patch_spec(name, {"suspend": False})
        runs.wait_for("the resume taken by the new operator", lambda: applied_suspend() is False, 30)
        watch("restarted and resumed")

        reopened = [look for look in seen if look[1:] != ("False", "ParsersMismatch")]
        assert not reopened, reopened
        assert server_pod_events(runs, name, "SuccessfulCreate") == 1, "no model reload for a halted run"
        assert runs.apps.read_namespaced_stateful_set(f"{name}-server", runs.namespace).spec.replicas == 0

        # The documented retry gesture (a change beyond suspend: here the server's startupTimeout, a live field)
        # is a new spec: the run is judged again, and the server comes back for it.
        runs.patch_spec(name, {"server": {"startupTimeout": "11m"}})
        runs.wait_for("the halt lifted", lambda: (runs.condition(name, "Succeeded") or {}).get("status") != "False"
                      or server_pod_events(runs, name, "SuccessfulCreate") > 1, 60)  # fmt: skip
