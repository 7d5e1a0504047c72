"""The condition-reason vocabulary is one enum, `api.reasons.Reason`: every reason the package writes is a member,
and is written as one (no string literal where a reason goes), so a reason is spelled once."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest

from datagen_operator.api.export_spec import ExportSpec
from datagen_operator.api.flags import NO_THINK_END
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts
from datagen_operator.api.reasons import OUTPUT_VOLUME_REASONS, Reason
from datagen_operator.api.status import Condition
from datagen_operator.control import conditions, remembered
from datagen_operator.control.decide import decide
from datagen_operator.control.observed import (
    KueueEvicted,
    KueueQueued,
    Observed,
    ProbeFailures,
    ServerInstance,
    ServerObservation,
    WorkersObservation,
)
from datagen_operator.control.policy import PARSER_PROBE_ATTEMPTS
from tests.unit.decide_world import READY, context, running, spec
from tests.unit.test_layers import PACKAGE

CONVERTED = [
    *sorted(
        path
        for layer in ("control", "checks", "export", "local", "worker", "cli")
        for path in (PACKAGE / layer).glob("*.py")
    ),
    PACKAGE / "k8s" / "object_facts.py",
    PACKAGE / "k8s" / "children.py",
    PACKAGE / "k8s" / "kueue_jobs.py",
    PACKAGE / "output" / "volume.py",
]
"""Modules whose reasons are written as members."""
NOT_YET = [
    PACKAGE / "k8s" / name
    for name in (
        "reconcile.py",
        "handlers.py",
        "object_meta.py",
        "pod_paths.py",
        "pod_parts.py",
        "run_manifests.py",
        "server_manifests.py",
        "server_hashes.py",
        "job_manifests.py",
    )
]
"""Modules that may still spell a reason as a literal, but only one of the vocabulary."""

REASON_ARGUMENT = {"ConditionUpdate": 2, "_u": 2, "verdict": 1, "StepOutcome": 1, "_failed": 0, "HaltedBefore": 0}
"""Callables of the package that take a reason, and its position."""
KUBERNETES_WORDS = {"_CRASH_REASONS", "_IMAGE_REASONS", "_CONFIG_REASONS", "waiting_reason", "kueue_reason"}
"""Kubernetes' own container reasons and Kueue's Workload reasons (read from objects, never written; the local
runner plays a pod's CrashLoopBackOff): not the package's vocabulary."""
CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*")


def _words(node: ast.expr) -> list[ast.Constant]:
    """CamelCase string literals an expression evaluates to (through conditionals, collections, set())."""
    if isinstance(node, ast.Constant):
        return [node] if isinstance(node.value, str) and CAMEL.fullmatch(node.value) else []
    if isinstance(node, ast.IfExp):
        return _words(node.body) + _words(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [c for value in node.values for c in _words(value)]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [c for element in node.elts for c in _words(element)]
    if isinstance(node, ast.BinOp):
        return _words(node.left) + _words(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set"):
        return [c for arg in node.args for c in _words(arg)]
    return []


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_reason(name: str) -> bool:
    return name.lower().endswith("reason") and name not in KUBERNETES_WORDS


def reason_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal that goes where a condition reason goes."""
    return sorted({(c.lineno, c.value) for c in reason_nodes(source)})


def reason_nodes(source: str) -> list[ast.Constant]:
    """The string literals that go where a condition reason goes: a reason argument, a comparison with or an
    assignment to a `...reason`, the members of a `..._REASONS` set, a `for ..., reason in` row."""
    found: list[ast.Constant] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            position = REASON_ARGUMENT.get(_name(node.func))
            if position is not None and len(node.args) > position:
                found += _words(node.args[position])
            found += [c for k in node.keywords if k.arg and _is_reason(k.arg) for c in _words(k.value)]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_reason(_name(side)) for side in sides):
                found += [c for side in sides for c in _words(side)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [_name(t) for t in targets]
            if any(_is_reason(n) for n in names):
                found += _words(node.value)
            if any(n.endswith("REASONS") and n not in KUBERNETES_WORDS for n in names):
                found += _words(node.value)
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Tuple):
            at = [i for i, t in enumerate(node.target.elts) if _is_reason(_name(t))]
            rows = node.iter.elts if isinstance(node.iter, (ast.Tuple, ast.List)) else []
            for row in rows:
                if isinstance(row, ast.Tuple):
                    found += [c for i in at if i < len(row.elts) for c in _words(row.elts[i])]
    return found


def test_the_scan_finds_each_way_a_literal_reason_is_written() -> None:
    source = """
ConditionUpdate(SERVER_READY, "False", "Creating", "m")
_u(SUCCEEDED, "False", "Done" if ok else "Broken")
StepOutcome(False, "NoPrompts", f"{x} Not", ())
Worker(failure_reason="OutputVolumeFull", waiting_reason="CrashLoopBackOff")
if ready.reason != "Loading" or reason in ("Ready", "Degraded"): pass
reason = "Verified" if passed else other
FINAL_REASONS = frozenset({"Verified", "ChecksFailed"})
_CRASH_REASONS = frozenset({"CrashLoopBackOff"})
for reasons, reason in ((_IMAGE, "ImagePull"), (_CONFIG, "ContainerConfig")): pass
_u(SUCCEEDED, "False", Reason.COMPLETED, "Message Words")
phase = "Halted"
"""
    assert sorted(text for _, text in reason_literals(source)) == sorted([
        "Creating", "Done", "Broken", "NoPrompts", "OutputVolumeFull", "Loading", "Ready", "Degraded", "Verified",
        "Verified", "ChecksFailed", "ImagePull", "ContainerConfig",
    ])  # fmt: skip


@pytest.mark.parametrize("path", CONVERTED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_reason_is_spelled_as_a_literal(path: Path) -> None:
    found = reason_literals(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(PACKAGE)}: write these as Reason members: {found}"


@pytest.mark.parametrize("path", NOT_YET, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_literal_reason_left_is_in_the_vocabulary(path: Path) -> None:
    unknown = [
        (line, text) for line, text in reason_literals(path.read_text(encoding="utf-8")) if text not in set(Reason)
    ]
    assert not unknown, f"{path.relative_to(PACKAGE)}: add these to Reason: {unknown}"


def test_the_reason_sets_hold_members() -> None:
    """The rules that read a reason back name it by its member: LEGACY_HALT_REASONS and the rest are Reason members."""
    sets = {
        "LEGACY_HALT_REASONS": remembered.LEGACY_HALT_REASONS,
        "FINAL_FAITHFUL_REASONS": remembered.FINAL_FAITHFUL_REASONS,
        "_EXPECTED_FALSE_REASONS": conditions._EXPECTED_FALSE_REASONS,
        "OUTPUT_VOLUME_REASONS": OUTPUT_VOLUME_REASONS,
    }
    for name, reasons in sets.items():
        assert reasons and all(type(r) is Reason for r in reasons), name
    assert set(Reason) >= remembered.LEGACY_HALT_REASONS and OUTPUT_VOLUME_REASONS <= remembered.LEGACY_HALT_REASONS


NOW = "2026-01-01T00:00:00Z"
FORWARDED = "StepSaidSo"
"""A reason another process wrote (a step's verdict, a shard's failure): decide() passes it on as it is."""
SAID = StepOutcome(True, FORWARDED, "ok")
FAILED = StepOutcome(False, FORWARDED, "no")


def _worlds() -> list[Observed]:
    """Observed worlds over every step of decide(), each step's verdict (when there is one) a forwarded reason."""

    def server(**instance: object) -> ServerObservation:
        return ServerObservation(1, (ServerInstance("srv-0", **instance),))  # type: ignore[arg-type]

    def running_said(counts: Counts, **changes: object) -> Observed:
        return replace(running(counts), parsers=SAID, canary=SAID, **changes)  # type: ignore[arg-type]

    done = running_said(Counts(records=100), workers=WorkersObservation(8, shards_done=8))
    volume = WorkersObservation(8, shards_failed=1, failure_reason=FORWARDED, failure_message="full")
    return [
        Observed(1, spec_error="spec.server: bad"),
        Observed(1),
        Observed(1, suspended=True),
        Observed(1, preflight=FAILED),
        Observed(1, preflight=replace(SAID, complete=True, prompts=100)),
        Observed(1, preflight=SAID),
        Observed(1, preflight=SAID, server=ServerObservation(1, refused="exceeded quota")),
        Observed(1, preflight=SAID, server=server(scheduled=False, unschedulable_message="0/3 nodes")),
        Observed(1, preflight=SAID, server=replace(server(scheduled=False), queued=(KueueQueued("wl", "q"),))),
        Observed(1, preflight=SAID, server=replace(server(scheduled=False), evicted=(KueueEvicted("wl", "q"),))),
        Observed(
            1,
            preflight=SAID,
            server=replace(
                server(scheduled=False), evicted=(KueueEvicted("wl", "q", kueue_reason="PodsReadyTimeout"),)
            ),
        ),
        Observed(1, preflight=SAID, server=server(last_exit="exit 2: invalid choice: 'x'")),
        Observed(1, preflight=SAID, server=server(waiting_reason="ImagePullBackOff")),
        Observed(1, preflight=SAID, server=server(waiting_reason="CreateContainerConfigError")),
        Observed(1, preflight=SAID, server=server(waiting_reason="CrashLoopBackOff")),
        Observed(1, preflight=SAID, server=server(running=True, loading_seconds=60)),
        Observed(1, preflight=SAID, server=server(running=True, loading_seconds=1e6)),
        Observed(1, preflight=SAID, server=server()),
        Observed(1, preflight=SAID, server=ServerObservation(2, READY.instances)),
        Observed(1, preflight=SAID, server=READY),
        Observed(1, preflight=SAID, server=replace(READY, external=True)),
        Observed(1, preflight=SAID, server=replace(server(running=True, loading_seconds=5), external=True)),
        Observed(1, preflight=SAID, server=READY, parser_probes=ProbeFailures(PARSER_PROBE_ATTEMPTS, "refused")),
        Observed(1, preflight=SAID, server=READY, parsers=FAILED),
        Observed(1, preflight=SAID, server=READY, parsers=SAID),
        Observed(1, preflight=SAID, server=READY, parsers=SAID, canary=FAILED),
        running_said(Counts(records=5), preflight=SAID),
        running_said(Counts(records=100)),
        running_said(Counts(records=50, flags={NO_THINK_END: 10})),
        running_said(Counts(records=5), workers=WorkersObservation(8, shards_failed=1)),
        running_said(Counts(records=5), workers=volume),
        running_said(Counts(records=5), server=None, workers=WorkersObservation(8, 2)),
        done,
        replace(done, final=SAID),
        replace(done, final=FAILED),
        replace(done, final=SAID, export=SAID),
        replace(done, final=SAID, export=FAILED),
    ]


def test_every_reason_decide_writes_is_a_member_or_passed_on() -> None:
    s = spec()
    with_export = s.model_copy(update={"export": ExportSpec(formats=["trl"])})
    written: set[str] = set()
    for observed in _worlds():
        for run in (s, with_export):
            decision = decide(run, observed, context(run))
            for update in decision.updates:
                assert type(update.reason) is Reason or update.reason == FORWARDED, (update, observed)
                written.add(update.reason)
    assert written - {FORWARDED} == _named_in("decide.py", "server.py"), "the worlds reach every reason decide names"


def _named_in(*modules: str) -> set[Reason]:
    """The members control/<module> names (`Reason.X`)."""
    return {
        Reason[node.attr]
        for module in modules
        for node in ast.walk(ast.parse((PACKAGE / "control" / module).read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Reason"
    }


@pytest.mark.parametrize("reason", list(Reason), ids=str)
def test_each_reason_is_one_camelcase_word_named_after_itself(reason: Reason) -> None:
    Condition(type="Succeeded", status="False", reason=reason, last_transition_time=NOW)  # the status' own pattern
    assert CAMEL.fullmatch(reason.value)
    assert reason.name == re.sub(r"(?<!^)(?=[A-Z])", "_", reason.value).upper()


def test_members_are_written_byte_for_byte_as_their_words() -> None:
    assert len(Reason.__members__) == len(Reason), "no two names for one reason"
    as_str = StepOutcome(False, "OutputVolumeFull", "m").for_storage()
    assert StepOutcome(False, Reason.OUTPUT_VOLUME_FULL, "m").for_storage() == as_str
    condition = Condition(type="Succeeded", status="False", reason=Reason.OUTPUT_VOLUME_FULL, last_transition_time=NOW)
    assert type(condition.reason) is str and condition.model_dump(mode="json")["reason"] == "OutputVolumeFull"
    assert f"{Reason.OUTPUT_VOLUME_FULL}: x" == "OutputVolumeFull: x"
