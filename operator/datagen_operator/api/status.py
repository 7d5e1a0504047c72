"""The DataGenRun status: Kubernetes-convention conditions plus progress, checks and the fingerprint."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Condition types. Each is owned by one decision in control/ and rolled up into Succeeded.
INPUTS_VERIFIED = "InputsVerified"
SERVER_READY = "ServerReady"
PARSERS_VERIFIED = "ParsersVerified"
CANARY_PASSED = "CanaryPassed"
DATA_FAITHFUL = "DataFaithful"
PROGRESSING = "Progressing"
SUCCEEDED = "Succeeded"
EXPORTED = "Exported"
"""Only with spec.export: set after the final verification passes (not in CONDITION_TYPES' metrics)."""
SPEC_APPLIED = "SpecApplied"
"""Shown only once a change was refused: False while data-affecting fields differ from the applied spec."""
CHILDREN_ACCEPTED = "ChildrenAccepted"
"""Shown only once the API server refused a child (or a Job's pod): False, in its words, while any is refused."""
CONDITION_TYPES: tuple[str, ...] = (
    INPUTS_VERIFIED,
    SERVER_READY,
    PARSERS_VERIFIED,
    CANARY_PASSED,
    DATA_FAITHFUL,
    PROGRESSING,
    SUCCEEDED,
)

ConditionStatus = Literal["True", "False", "Unknown"]


class StatusModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )


class Condition(StatusModel):
    type: str
    status: ConditionStatus
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    """One CamelCase word a program can switch on."""
    message: str = Field(default="", max_length=32768)
    """What a person needs to know, including the fix when something is wrong."""
    last_transition_time: str
    observed_generation: int | None = None


class Progress(StatusModel):
    prompts_total: int = 0
    """The dataset's valid prompts, as the preflight counted them before any server: the total from the start
    (summed from the workers' counts only for a run whose preflight did not count)."""
    prompts_done: int = 0
    """Prompts with nothing left to do (every sample recorded, refused or set aside): with one sample a prompt,
    recordsDone; with more, the workers' own count, which starts over on a resume as they read the dataset."""
    records_total: int = 0
    """promptsTotal (datasetTurns for whole conversations) x generation.samplesPerPrompt."""
    records_done: int = 0
    """Samples with nothing left to do in the whole output: recorded, refused by the server or set aside. Never
    goes backwards: a resumed worker counts what the output holds before it reads the dataset again."""
    records: int = 0
    """Records in the output, the earlier attempts' included."""
    dataset_prompts: int | None = None
    """The preflight's count itself, kept here so that it stands across passes and operator restarts."""
    dataset_turns: int | None = None
    """generation.turns all: the preflight's count of the conversations' planned turns (records per sample)."""
    completion_tokens: int = 0
    tokens_per_second: float = 0.0
    shards_total: int = 0
    shards_done: int = 0
    refused: int = 0
    """Records the server refused (HTTP 4xx), in the whole output."""
    set_aside: dict[str, int] = Field(default_factory=dict)
    """cause -> prompts set aside unsent, never sent to the server (api.progress.Counts.set_aside)."""
    summary: str = ""
    """What `kubectl get dgr` shows, e.g. '1234/88000 prompts, 5.1k tok/s, ETA 3m20s' (records with
    samplesPerPrompt > 1)."""
    eta: str | None = None
    """While the workers generate: the time left at the rate records were done since they began (control/progress
    `eta_seconds`, the rule `datagen run` says it by), e.g. '3m20s'; unset before a record moved, and once stopped."""
    eta_at: str | None = None
    """When the run is estimated to be done at that rate (RFC 3339)."""


class CheckResult(StatusModel):
    name: str
    passed: bool
    rate: float | None = None
    threshold: float | None = None
    bound: float | None = None
    """The 95 % confidence bound of the rate that was judged against the threshold (checks/rates.py): the lower
    bound where the threshold is a maximum, the upper where it is a minimum."""
    count: int = 0
    total: int = 0
    verdict: str = ""
    """The likely cause and the fix, or why it passed."""


class ServerStatus(StatusModel):
    endpoints: list[str] = Field(default_factory=list)
    ready_replicas: int = 0
    replicas: int = 0
    version: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    external: bool | None = None
    """server.external: the endpoints are a server the run does not own (it never starts, scales or stops it)."""


class Phase(StrEnum):
    """status.phase: a one-word summary for people (`kubectl get dgr`), derived from the step (control/decide.py
    `Decision.phase`)."""

    INVALID = "Invalid"
    SUSPENDED = "Suspended"
    PREFLIGHT = "Preflight"
    QUEUED = "Queued"
    """Kueue holds the server: it waits for quota (or re-admission after a preemption), holding no GPU."""
    STARTING = "Starting"
    VERIFYING = "Verifying"
    CANARY = "Canary"
    RUNNING = "Running"
    EXPORTING = "Exporting"
    HALTED = "Halted"
    FAILED = "Failed"
    SUCCEEDED = "Succeeded"


class DataGenRunStatus(StatusModel):
    observed_generation: int | None = None
    phase: str | None = None
    """A one-word summary for humans; programs read the conditions."""
    halted: bool | None = None
    """The run is halted for this generation of the spec (a gate refused it, or something broke): nothing is
    started again until the spec changes. Written with every status; read back so the halt stands across
    passes and operator restarts."""
    conditions: list[Condition] = Field(default_factory=list)
    progress: Progress | None = None
    checks: list[CheckResult] = Field(default_factory=list)
    fingerprint: str | None = None
    """sha256 over tokenizer files, chat template, server version and args, sampling params and preset."""
    server: ServerStatus | None = None
    started_at: str | None = None
    completed_at: str | None = None
    worker_image: str | None = None
    """The operator's worker image when the run started (Helm `workerImage`, DATAGEN_WORKER_IMAGE): the run's
    preflight, canary, worker, verify and export pods keep it through an operator upgrade, so one output is
    never made by two images. spec.clients.image, where set, is used instead."""
    concurrency: int | None = None
    """clients.concurrency auto: the requests in flight per shard the canary resolved from the servers' batch
    limits (its verdict's `concurrency`), kept here so that a workers' Job made again (a resume, new server URLs)
    sends at the same number once the canary's pod is gone."""
