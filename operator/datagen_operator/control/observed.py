"""What the shells (operator, local runner) observe, as plain data for the decision core."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from datagen_operator.api.outcome import StepOutcome
from datagen_operator.api.progress import Counts
from datagen_operator.api.status import CheckResult, Progress


@dataclass(frozen=True)
class ServerInstance:
    """One server replica: a pod in a cluster, a process on one machine."""

    name: str
    scheduled: bool = True
    unschedulable_message: str | None = None
    """The scheduler's own words (PodScheduled=False), e.g. '0/3 nodes are available: 3 Insufficient nvidia.com/gpu.'"""
    running: bool = False
    ready: bool = False
    """Passed readiness: /health_generate answered 200 (probe in a cluster, poll locally)."""
    restarts: int = 0
    waiting_reason: str | None = None
    """CrashLoopBackOff, ImagePullBackOff, CreateContainerConfigError, ..."""
    last_exit: str | None = None
    """How the server last ended, e.g. 'exit 2: argument --reasoning-parser: invalid choice'."""
    loading_seconds: float | None = None
    """Seconds since the server container (process) started, while it is not ready yet."""
    endpoint: str | None = None


@dataclass(frozen=True)
class KueueQueued:
    """A Kueue Workload of the server (one per StatefulSet, one per LeaderWorkerSet group) not admitted: its
    pods exist but wait behind Kueue's scheduling gate, holding no node and no GPU (docs/kueue.md)."""

    workload: str
    local_queue: str
    cluster_queue: str | None = None
    """From the Workload's admission, else the LocalQueue's spec.clusterQueue; None when neither is known."""
    kueue_reason: str = "Pending"
    """Kueue's QuotaReserved reason: Pending (no room yet), Inadmissible (the queue is missing or stopped)."""
    message: str = ""
    """Kueue's own words, e.g. 'couldn't assign flavors to pod set main: insufficient unused quota for
    nvidia.com/gpu in flavor gpu, 8 more needed'; empty before Kueue's scheduler has looked at it."""


@dataclass(frozen=True)
class KueueEvicted:
    """A Kueue Workload of the server that Kueue evicted after admitting it (Evicted=True, which Kueue resets only
    when it reserves quota for it again): its pods are deleted (Kueue's TerminationTarget) and made anew behind
    the admission gate until it is admitted again. Not a crash: the run pauses (docs/kueue.md)."""

    workload: str
    local_queue: str
    cluster_queue: str | None = None
    """The ClusterQueue it was admitted to (while Kueue still holds its admission), else the LocalQueue's."""
    kueue_reason: str = "Preempted"
    """Kueue's Evicted reason: Preempted, PodsReadyTimeout, ClusterQueueStopped, LocalQueueStopped, Deactivated,
    NodeFailures, AdmissionCheck, ..."""
    preempted_reason: str | None = None
    """Kueue's Preempted reason when preempted: InClusterQueue, InCohortReclamation, InCohortFairSharing,
    InCohortReclaimWhileBorrowing."""
    message: str = ""
    """Kueue's own words, e.g. 'Preempted to accommodate a workload (UID: ..., JobUID: ...) due to prioritization
    in the ClusterQueue; preemptor path: /cq; preemptee path: /cq'."""
    waiting: str = ""
    """Once requeued: why it is not admitted again, in Kueue's words (QuotaReserved=False's message)."""
    preempted_for: str = ""
    """Who the server made room for, by name: 'DataGenRun ns/name' (the owner of the preempting Workload that
    Kueue's message names by UID only), else its Workload's owner or the Workload; empty when not found."""

    @property
    def preempted(self) -> bool:
        return self.kueue_reason == "Preempted" or self.preempted_reason is not None


@dataclass(frozen=True)
class ServerObservation:
    replicas_wanted: int
    instances: tuple[ServerInstance, ...] = ()
    refused: str | None = None
    """Why a replica could not even be created, in the refuser's words (a quota, an admission policy)."""
    queued: tuple[KueueQueued, ...] = ()
    """The server's Kueue Workloads not admitted yet (spec.queue, or a namespace's default LocalQueue)."""
    evicted: tuple[KueueEvicted, ...] = ()
    """The server's Kueue Workloads evicted (preempted) and not admitted again since."""
    kueue_unread: str | None = None
    """Why the Workloads of a server that carries Kueue's queue label could not be read (Kueue is not installed,
    the operator may not read them): the run cannot say whether Kueue holds it, and says so."""
    external: bool = False
    """server.external: the instances are the external URLs (named by them), probed only; `loading_seconds` is how
    long none of them has answered."""

    @property
    def ready_endpoints(self) -> tuple[str, ...]:
        return tuple(i.endpoint for i in self.instances if i.ready and i.endpoint)


@dataclass(frozen=True)
class ProbeFailures:
    """Parser probes of a ready server that got no answer (/server_info or the chat probe failed)."""

    count: int = 0
    last_error: str = ""


@dataclass(frozen=True)
class HaltedBefore:
    """A halt this generation of the spec already reported (control.remembered.remembered_halt)."""

    reason: str
    failed: bool = False
    """The halt was a failure (its phase read Failed), not a gate's refusal (Halted)."""
    checks: tuple[CheckResult, ...] = ()
    progress: Progress | None = None
    lease_kept: bool = False
    """The halt left the output's lease held: the preflight took it (it passed) and no refusing step gave it
    back (a canary's refusal does). A halt at the parser check would otherwise keep it for the server's startup
    budget plus 30 minutes, refusing every other run on that output."""
    at: float | None = None
    """When the halt was decided (seconds since the epoch): a lease renewed after it is a later attempt's."""


@dataclass(frozen=True)
class WorkersObservation:
    shards_total: int
    shards_done: int = 0
    shards_failed: int = 0
    """Shards whose retries are exhausted (the Job's failed indexes; local: non-zero exits past retries)."""
    active: int = 0
    paused: bool = False
    failure_message: str | None = None
    failure_reason: str | None = None
    """A named cause for the failed shards (e.g. OutputVolumeFull from the worker's exit 7), else WorkersFailed."""


@dataclass(frozen=True)
class ProgressCounters:
    """The shards' progress snapshots summed (control.progress.counters_from_snapshots)."""

    prompts_total: int = 0
    """The prompts the workers have read so far: the whole dataset only once each has read its shard."""
    prompts_done: int = 0
    """Prompts with nothing left, as the workers count them while reading the dataset."""
    tokens_per_second: float = 0.0
    counts: Counts = field(default_factory=Counts)
    """The whole output's counts (api.progress.Counts), the shards' summed: the records resumed from (judged by
    the preflight, with the same checks) and this attempt's; `failed` and `unwritten` this attempt's only. Each
    shard's snapshot counts every set-aside line once, however many attempts read it."""
    records_by_turn: dict[int, int] = field(default_factory=dict)
    """generation.turns all: the workers' records of this attempt by turn, and the flagged ones."""
    flagged_by_turn: dict[int, int] = field(default_factory=dict)
    failure_reason: str | None = None
    failure_message: str | None = None
    """A shard that stopped for a named cause (OutputVolumeFull...), in plain words with the run's counts."""


@dataclass(frozen=True)
class Observed:
    generation: int
    spec_error: str | None = None
    halted: HaltedBefore | None = None
    """A halt that stands until the spec changes (remembered in the status)."""
    suspended: bool = False
    preflight: StepOutcome | None = None
    server: ServerObservation | None = None
    parsers: StepOutcome | None = None
    parser_probes: ProbeFailures = field(default_factory=ProbeFailures)
    """Failed reads of the server's parsers so far; decide() turns too many into ProbeFailed."""
    canary: StepOutcome | None = None
    workers: WorkersObservation | None = None
    progress: ProgressCounters | None = None
    final: StepOutcome | None = None
    export: StepOutcome | None = None
    """spec.export's verdict (its counts in the message); None while not run."""
    job_workloads: Mapping[str, JobWorkload] = field(default_factory=dict)
    """The Kueue Workloads of the run's unfinished Jobs that Kueue manages, by the planner's name of the Job
    (k8s/children.py `Child`): read only where a Job of the run is queued or held (docs/kueue.md)."""


@dataclass(frozen=True)
class JobWorkload:
    """The Kueue Workload of one of the run's Jobs (label kueue.x-k8s.io/job-uid): Kueue owns that Job's
    spec.suspend; the operator pauses and resumes it through the Workload's spec.active instead."""

    workload: str
    active: bool = True
    """The Workload's spec.active (False: deactivated, its Job suspended by Kueue)."""
    queued: KueueQueued | None = None
    """Not admitted: Kueue holds the Job (suspended, no pod), in Kueue's words."""
