"""The chart's Grafana dashboard (charts/datagen-operator/dashboards/datagen-operator.json): valid dashboard
structure, every panel queried through the `${datasource}` variable, and no query on a metric that nothing
exports: every metric name in every PromQL expression (panels and variables) is one the operator's registry
(k8s/metrics.py) or a worker (worker/metrics.py) really serves, with the suffixes Prometheus shows."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric

from datagen_operator.api.progress import ShardProgress
from datagen_operator.control.observed import ServerObservation
from datagen_operator.k8s import metrics
from datagen_operator.worker.metrics import ProgressCollector

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "charts" / "datagen-operator" / "dashboards" / "datagen-operator.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# The series names a family shows in Prometheus, by its type (the OpenMetrics suffixes prometheus_client writes).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def series_names(families: Iterable[Metric]) -> set[str]:
    return {family.name + suffix for family in families for suffix in SUFFIXES[family.type]}


def exported() -> set[str]:
    """Every series name the operator and the workers serve."""
    worker = ProgressCollector(lambda: ShardProgress(shard=0, shard_count=1))
    return series_names(metrics.REGISTRY.collect()) | series_names(worker.collect())


PROBE_STATUS = {
    "phase": "Running",
    "conditions": [{"type": "ServerReady", "status": "True", "reason": "Ready"}],
    "progress": {"recordsTotal": 10, "recordsDone": 5},
    "checks": [{"name": "termination", "passed": True, "rate": 0.0, "bound": 0.1, "threshold": 0.05}],
}


def exported_labels() -> dict[str, set[str]]:
    """The label names of each series name that has samples: one run observed with every field set (then
    forgotten), and a worker's snapshot. A family without samples (a counter nothing counted yet) is absent."""
    metrics.observe_status("dashboard-test", "probe", PROBE_STATUS, ServerObservation(replicas_wanted=1), 1.0)
    try:
        families = [*metrics.REGISTRY.collect()]
    finally:
        metrics.forget_run("dashboard-test", "probe")
    worker = ProgressCollector(lambda: ShardProgress(shard=0, shard_count=1))
    labels: dict[str, set[str]] = {}
    for family in [*families, *worker.collect()]:
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_TOKEN = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*|\d[A-Za-z0-9_.]*")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers less functions and aggregations (followed
    by a parenthesis), keywords, label names (in braces, by/without/on/ignoring lists), numbers and durations."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    names = set()
    for token in _TOKEN.finditer(text):
        word = token.group()
        if word[0].isdigit() or word.lower() in _KEYWORDS or re.match(r"\s*\(", text[token.end() :]):
            continue
        names.add(word)
    return names


def variable_expr(query: str) -> str:
    """The PromQL inside a Prometheus template variable's query (label_values(expr, label), query_result(expr))."""
    for pattern in (r"label_values\((.+),\s*\w+\s*\)", r"query_result\((.+)\)"):
        match = re.fullmatch(pattern, query.strip(), re.DOTALL)
        if match:
            return match[1]
    raise AssertionError(f"a variable query this test cannot read: {query!r}")


_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_LEGEND = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def label_names(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """The label names a PromQL expression matches on, by metric (`m{a="x"}`), and those it groups by."""
    text = _STRING.sub('""', expr)
    matched: dict[str, set[str]] = {}
    for metric, matchers in _SELECTOR.findall(text):
        matched.setdefault(metric, set()).update(_MATCHER.findall(matchers))
    grouped = {name.strip() for names in _GROUPING.findall(text) for name in names.split(",") if name.strip()}
    return matched, grouped


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def data_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows included; rows themselves hold no query."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in data_panels(dashboard):
        for target in panel["targets"]:
            yield f"panel {panel['id']} {panel['title']!r} target {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield f"variable {variable['name']}", variable_expr(query["query"] if isinstance(query, dict) else query)


def unknown_metrics(dashboard: dict[str, Any], known: set[str]) -> dict[str, set[str]]:
    return {where: names - known for where, expr in expressions(dashboard) if (names := metric_names(expr)) - known}


def test_every_query_is_on_a_metric_that_is_exported() -> None:
    dashboard = load()
    assert not unknown_metrics(dashboard, exported()), "queries on metrics nothing exports"
    assert sum(1 for _ in expressions(dashboard)) > 0


def test_a_metric_nothing_exports_is_caught() -> None:
    """The check above can fail: a panel on a made-up metric, or on a counter without its _total, is named."""
    dashboard = load()
    panel = next(data_panels(dashboard))
    panel["targets"].append(
        {"refId": "Z", "expr": 'sum by (phase) (rate(datagen_run_made_up{namespace=~"$namespace"}[5m])) > 0'}
    )
    panel["targets"].append({"refId": "Y", "expr": "increase(datagen_condition_transitions[$__rate_interval])"})
    unknown = unknown_metrics(dashboard, exported())
    assert [sorted(names) for names in unknown.values()] == [["datagen_run_made_up"], ["datagen_condition_transitions"]]
    assert all(where.endswith(("target Z", "target Y")) for where in unknown)


def wrong_labels(dashboard: dict[str, Any], labels: dict[str, set[str]]) -> list[str]:
    """Label names a query matches, groups by or shows in its legend that its metrics do not carry."""
    wrong: list[str] = []
    targets = [
        (f"panel {p['id']} {p['title']!r} {t['refId']}", t) for p in data_panels(dashboard) for t in p["targets"]
    ]
    for where, target in targets:
        matched, grouped = label_names(target["expr"])
        carried = set().union(*(labels.get(m, set()) for m in metric_names(target["expr"])))
        for metric, names in matched.items():
            wrong += [f"{where}: {metric} has no label {name}" for name in sorted(names - labels.get(metric, set()))]
        shown = set(_LEGEND.findall(target.get("legendFormat", "")))
        wrong += [f"{where}: no label {name} to group by or show" for name in sorted((grouped | shown) - carried)]
    return wrong


def test_every_label_a_panel_matches_or_shows_is_carried() -> None:
    """namespace, name, check and phase: a panel filtered on a label its metric lacks shows nothing."""
    labels = exported_labels()
    assert labels["datagen_run_check_rate"] == {"namespace", "name", "check"}
    assert not wrong_labels(load(), labels)
    broken = load()
    first = next(data_panels(broken))
    first["targets"][0]["legendFormat"] = "{{exported_namespace}}/{{name}}"
    first["targets"].append({"refId": "Z", "expr": 'datagen_run_phase{check="termination"}', "legendFormat": ""})
    where = f"panel {first['id']} {first['title']!r}"
    assert wrong_labels(broken, labels) == [
        f"{where} A: no label exported_namespace to group by or show",
        f"{where} Z: datagen_run_phase has no label check",
    ]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (phase) (datagen_run_phase{namespace=~"$namespace", name=~"$run"}) > 0', {"datagen_run_phase"}),
        ("(a_total - b) / (deriv(b[15m]) > 0.5e3)", {"a_total", "b"}),
        ('max_over_time(q{check="x"}[$__range]) offset 5m', {"q"}),
        ("count by (namespace, name) (p == 0) and on (name) group_left (phase) r", {"p", "r"}),
        ("sglang:num_running_reqs", {"sglang:num_running_reqs"}),
    ],
)
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_exported_names_include_counter_suffixes_and_the_workers() -> None:
    names = exported()
    assert {"datagen_condition_transitions_total", "datagen_run_phase", "datagen_worker_records_total"} <= names
    assert "datagen_condition_transitions" not in names  # a counter is queried as _total


def test_dashboard_structure() -> None:
    dashboard = load()
    assert dashboard["uid"] and len(dashboard["uid"]) <= 40 and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]] + [
        p["id"] for row in dashboard["panels"] if row["type"] == "row" for p in row.get("panels", [])
    ]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids), "panel ids must be unique ints"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"namespace", "run"} <= variables.keys()
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]
    for panel in data_panels(dashboard):
        where = f"panel {panel['id']} {panel['title']!r}"
        assert panel["title"] and panel["type"], where
        assert panel["datasource"] == DATASOURCE, where
        assert panel["targets"], f"{where} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
        for target in panel["targets"]:
            assert target["expr"].strip() and target.get("datasource", DATASOURCE) == DATASOURCE, where
        grid = panel["gridPos"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, where
        if "repeat" in panel:
            assert panel["repeat"] in variables, where


def test_the_panels_the_chart_promises_are_there() -> None:
    """Runs by phase, tokens/s, progress and ETA, each check's rate against its threshold, restarts, queue time."""
    used = set().union(*(metric_names(expr) for _, expr in expressions(load())))
    assert {
        "datagen_run_phase",
        "datagen_run_tokens_per_second",
        "datagen_run_records_done",
        "datagen_run_records_expected",
        "datagen_run_check_rate",
        "datagen_run_check_threshold",
        "datagen_run_server_restarts",
        "datagen_run_queued_seconds",
    } <= used
