"""The one builder of the DataGenRun manifests tests use: a base per setting, changed by dotted paths.

Bases: the user's example (`examples/*.yaml`), a run on the real control plane (hostPath volumes, the
test GPU toleration), a run on this machine (`datagen run` / the worker against the simulator), and a
bare spec for pure builders. Every change goes through `changed`, so a test says only what differs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from datagen_operator.api.spec import API_GROUP_VERSION

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
API_VERSION = API_GROUP_VERSION
DELETE = object()
"""A change's value that removes the field (which must be there: a change that changes nothing is a mistake)."""


@dataclass(frozen=True)
class Rename:
    """A change's value that moves the field's value to `to` (the snake_case spelling of a camelCase key, say)."""

    to: str


def changed(document: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `document` with each dotted path, in order, set to its value (`DELETE`, `Rename`)."""
    result = copy.deepcopy(dict(document))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = result
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            del node[leaf]
        elif isinstance(value, Rename):
            node[value.to] = node.pop(leaf)
        else:
            node[leaf] = copy.deepcopy(value)
    return result


def run_document(spec: Mapping[str, Any], name: str = "t") -> dict[str, Any]:
    """A whole DataGenRun around a spec."""
    return {"apiVersion": API_VERSION, "kind": "DataGenRun", "metadata": {"name": name}, "spec": dict(spec)}


def example_run(example: str = "kimi-k2.5", **changes: Any) -> dict[str, Any]:
    """`examples/<example>.yaml` as a user writes it; `changes` are dotted paths from the document root
    (`spec.model.preset`)."""
    return changed(yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text()), changes)


def cluster_run(name: str, data_dir: Path, tokenizer: Path, **changes: Any) -> dict[str, Any]:
    """A run for the real control plane: model, dataset and output on hostPath volumes the test kubelet
    mounts, 8-GPU servers that tolerate the fake GPU nodes' taint, short answers; `changes` are dotted spec
    paths."""
    from tests.harness.controlplane import GPU_TOLERATION

    spec = {
        "model": {"preset": "kimi-k2.5", "path": "/models/standin", "volume": {"hostPath": {"path": str(tokenizer)}}},
        "server": {"gpus": 8, "startupTimeout": "10m", "tolerations": [GPU_TOLERATION]},
        "dataset": {"path": "prompts.jsonl", "volume": {"hostPath": {"path": str(data_dir)}}},
        "generation": {"thinking": True, "sampling": {"max_new_tokens": 1024}},
        "clients": {"shards": 2, "concurrency": 4},
        "output": {"path": f"out/{name}", "volume": {"hostPath": {"path": str(data_dir)}}},
        "checks": {"canaryPrompts": 2, "canaryMaxNewTokens": 1024},
    }
    return run_document(changed(spec, changes), name)


def local_spec(model: Path, dataset: Path, output: Path, **changes: Any) -> dict[str, Any]:
    """A kimi-k2.5 spec (thinking on) for this machine, local paths; `changes` are dotted spec paths."""
    spec = {
        "model": {"preset": "kimi-k2.5", "path": str(model)},
        "dataset": {"path": str(dataset)},
        "generation": {"thinking": True, "sampling": {"max_new_tokens": 1024, "temperature": 0.6}},
        "clients": {"shards": 1, "concurrency": 8},
        "output": {"path": str(output)},
    }
    return changed(spec, changes)


def local_run(model: Path, dataset: Path, output: Path, name: str = "t", **changes: Any) -> dict[str, Any]:
    """`local_spec` as a whole DataGenRun, the shape `datagen run` reads."""
    return run_document(local_spec(model, dataset, output, **changes), name)


def write_run(path: Path, document: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(document)))
    return path


def unit_spec(**changes: Any) -> dict[str, Any]:
    """A spec for the pure builders: two 8-GPU replicas of kimi-k2.5 on PVCs, an env var from a Secret,
    GPU placement fields; `changes` are dotted spec paths."""
    spec: dict[str, Any] = {
        "model": {
            "preset": "kimi-k2.5",
            "path": "/models/kimi",
            "volume": {"persistentVolumeClaim": {"claimName": "models"}},
        },
        "server": {
            "gpus": 8,
            "replicas": 2,
            "startupTimeout": "45m",
            "shmSize": "64Gi",
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                {"name": "SGLANG_X", "value": "1"},
            ],
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "gpu-batch",
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        },
        "dataset": {"path": "prompts/b1.jsonl", "volume": {"persistentVolumeClaim": {"claimName": "data"}}},
        "generation": {"thinking": True, "sampling": {"max_new_tokens": 256}},
        "clients": {"shards": 3, "concurrency": 8},
        "output": {"path": "eagle3/b1", "volume": {"persistentVolumeClaim": {"claimName": "data"}}},
    }
    return changed(spec, changes)


def bare_spec(**changes: Any) -> dict[str, Any]:
    """The fewest fields a spec needs (no preset): for resolution rules."""
    spec = {
        "model": {"path": "/m"},
        "dataset": {"path": "d"},
        "output": {"path": "o"},
        "generation": {"sampling": {"max_new_tokens": 8}},
    }
    return changed(spec, changes)
