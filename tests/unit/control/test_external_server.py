"""server.external in the pure core: the URLs the run sends to, the children it plans (no server), the decision
(the preflight still comes first, the parsers are read after it) and ServerReady's words."""

from __future__ import annotations

from typing import Any

from datagen_operator.api import parse_spec
from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import resolve_model
from datagen_operator.api.status import SERVER_READY
from datagen_operator.checks.evaluate import check_context
from datagen_operator.control.decide import decide, parsers_to_read
from datagen_operator.control.decision import Decision, Step
from datagen_operator.control.observed import Observed, ServerInstance, ServerObservation
from datagen_operator.k8s import server_manifests
from datagen_operator.k8s.children import Apply, Child, Children, Serve, WantedServer, plan
from tests.manifests import changed, unit_spec

PASSED = StepOutcome(True, "Passed", "ok", prompts=10)


def external_spec(external: dict[str, Any]) -> Any:
    """unit_spec's run on an external server: its server section is `external` alone."""
    return parse_spec(changed(unit_spec(), {"server": {"external": external}}))


SERVICE = external_spec({"service": {"name": "sglang", "port": 8080}})
URLS = external_spec({"urls": ["http://a.example:30000/", "http://b.example:30000"]})


def observed_external(*ready: bool, waited: float | None = 5.0, **changes: Any) -> Observed:
    instances = tuple(
        ServerInstance(url, running=True, ready=ok, loading_seconds=None if ok else waited, endpoint=url)
        for url, ok in zip(("http://a.example:30000", "http://b.example:30000"), ready, strict=False)
    )
    return Observed(1, server=ServerObservation(len(instances), instances, external=True), **changes)


def decided(spec: Any, observed: Observed) -> Decision:
    return decide(spec, observed, check_context(resolve_model(spec), spec.checks))


def server_ready(decision: Decision) -> tuple[str, str, str]:
    update = next(u for u in decision.updates if u.type == SERVER_READY)
    return update.status, update.reason, update.message


def test_the_urls_are_the_services_dns_name_or_the_urls_as_written_never_the_test_override() -> None:
    assert server_manifests.server_urls("run", "ml", SERVICE, ("http://127.0.0.1:9",)) == ["http://sglang.ml.svc:8080"]
    other = external_spec({"service": {"name": "sglang", "port": 8080, "namespace": "serving"}})
    assert server_manifests.server_urls("run", "ml", other) == ["http://sglang.serving.svc:8080"]
    assert server_manifests.server_urls("run", "ml", URLS) == ["http://a.example:30000", "http://b.example:30000"]


def test_the_plan_makes_no_server_and_stops_one_left_from_an_owned_spec() -> None:
    wanted = WantedServer(restart_hash="h", admission_hash="a")
    running = Decision(step=Step.RUN_WORKERS, server_wanted=True, workers_wanted=True)
    actions = plan(SERVICE, running, Observed(1), Children(), 1, urls=["http://sglang.ml.svc:8080"], server=wanted)
    server_children = (Child.HEADLESS_SERVICE, Child.REPLICA_SERVICE, Child.SERVER_STATEFULSET, Child.SERVER_GROUP)
    assert not [a for a in actions if isinstance(a, Serve) or (isinstance(a, Apply) and a.child in server_children)]
    left = Children(statefulset=True, server_replicas=1, server_holds_a_node=True)
    actions = plan(SERVICE, running, Observed(1), left, 1, urls=["http://sglang.ml.svc:8080"], server=wanted)
    assert [a for a in actions if isinstance(a, Serve)] == [Serve(0, keep_template=True)]


def test_an_answering_external_server_neither_skips_the_preflight_nor_has_its_parsers_read_before_it() -> None:
    observed = observed_external(True, True)
    assert decided(URLS, observed).step is Step.PREFLIGHT
    assert not parsers_to_read(URLS, observed)
    after = observed_external(True, True, preflight=PASSED)
    assert parsers_to_read(URLS, after)
    assert decided(URLS, after).step is Step.VERIFY_PARSERS


def test_server_ready_says_external_with_the_urls_and_never_stopped() -> None:
    status, reason, message = server_ready(decided(URLS, observed_external(True, True, preflight=PASSED)))
    assert (status, reason) == ("True", Reason.EXTERNAL_SERVER_READY)
    assert message == (
        "external server http://a.example:30000, http://b.example:30000 answers /health_generate "
        "(not the run's: it never starts, scales or stops it)"
    )
    status, reason, message = server_ready(decided(URLS, observed_external(True, False, preflight=PASSED)))
    assert (status, reason) == ("True", Reason.DEGRADED) and "not answering: http://b.example:30000" in message
    status, reason, message = server_ready(decided(URLS, observed_external(False, False, preflight=PASSED)))
    assert (status, reason) == ("False", Reason.EXTERNAL_SERVER_UNREACHABLE)
    assert message.startswith("waiting for the external server to answer /health_generate: http://a.example:30000")
    timed_out = decided(URLS, observed_external(False, False, waited=1e6, preflight=PASSED))
    assert timed_out.step is Step.HALTED and server_ready(timed_out)[1] == Reason.STARTUP_TIMEOUT
    suspended = server_ready(decided(URLS, observed_external(True, True, preflight=PASSED, suspended=True)))
    assert "the external server keeps running" in suspended[2] and "GPUs" not in suspended[2]


def test_a_seed_the_server_would_ignore_is_named_with_the_flag() -> None:
    from datagen_operator.checks.server_truth import seed_ignored

    seeded = parse_spec(changed(unit_spec(), {"generation.sampling.sampling_seed": 7}))
    said = seed_ignored({"enable_deterministic_inference": False}, seeded)
    assert said is not None and "launch it with --enable-deterministic-inference" in said
    assert seed_ignored({"enable_deterministic_inference": True}, seeded) is None
    assert seed_ignored({"enable_deterministic_inference": False}, SERVICE) is None  # no seed asked for


def test_servers_serving_another_model_or_with_other_data_flags_are_named() -> None:
    from datagen_operator.checks.server_truth import servers_differ

    kimi = {"version": "0.5.23", "served_model_name": "kimi-k2.5", "model_path": "/models/kimi", "dtype": "auto"}
    assert servers_differ([("http://a", kimi), ("http://b", {**kimi, "model_path": "/mnt/kimi"})]) is None
    other = servers_differ([("http://a", kimi), ("http://b", {**kimi, "served_model_name": "qwen3"})])
    assert other is not None and other.startswith("servers http://a and http://b differ: model: kimi-k2.5 -> qwen3")
    flags = servers_differ([("http://a", kimi), ("http://b", {**kimi, "dtype": "float16"})])
    assert flags is not None and "dtype" in flags
