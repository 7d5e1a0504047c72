"""Every condition reason the package writes: the one-word CamelCase `reason` of status.conditions[], of a
step's verdict (`StepOutcome.reason`, from a Job's termination message or a local child) and of a shard's
`failure_reason`. A StrEnum, so what reaches the status, the termination message and progress.json is the value
itself, byte for byte. Reasons read back from another process (a step's verdict, a remembered condition) are
plain strings; compare them with the members (`reason == Reason.VERIFIED`)."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # --- where a step stands (several conditions) -------------------------------------------------------------
    WAITING = "Waiting"
    """An earlier step is not done yet."""
    RUNNING = "Running"
    VERIFYING = "Verifying"
    NOT_STARTED = "NotStarted"
    COMPLETED = "Completed"
    SUSPENDED = "Suspended"
    """spec.suspend is true."""
    HALTED = "Halted"
    """Progressing=False of a halted run (Succeeded says why)."""
    PAUSED = "Paused"
    """Progressing=True while started workers wait for the server."""
    EXPORTING = "Exporting"

    # --- Succeeded=False --------------------------------------------------------------------------------------
    INVALID_SPEC = "InvalidSpec"
    PREFLIGHT_FAILED = "PreflightFailed"
    SERVER_FAILED = "ServerFailed"
    PARSERS_MISMATCH = "ParsersMismatch"
    PROBE_FAILED = "ProbeFailed"
    """ParsersVerified=False (and Succeeded=False) when the server's parsers could not be read at all."""
    CANARY_FAILED = "CanaryFailed"
    CHECKS_FAILED = "ChecksFailed"
    """The rolling checks (or the final verification) crossed a threshold; DataFaithful=False says which."""
    WORKERS_FAILED = "WorkersFailed"
    EXPORT_FAILED = "ExportFailed"
    """Also the export step's own verdict."""

    # --- a shard's named failure (the worker's progress and exit message; Progressing and Succeeded) ---------
    OUTPUT_VOLUME_FULL = "OutputVolumeFull"
    """ENOSPC or EDQUOT; also the reason when a worker's exit 7 comes without readable words."""
    OUTPUT_VOLUME_READ_ONLY = "OutputVolumeReadOnly"
    OUTPUT_VOLUME_ERROR = "OutputVolumeError"
    """EIO, or any other write failure of the volume."""
    BAD_INPUT = "BadInput"
    """A worker's arguments, spec or tokenizer are unusable (its exit 2 with no more specific cause)."""
    SERVER_UNREACHABLE = "ServerUnreachable"
    """Every server stayed down past the worker's --server-timeout (its exit 4, past the Job's retries)."""
    DRAINED = "Drained"
    """A worker stopped by SIGTERM (a drain, an eviction, a suspend): a disruption, retried, never the run's cause."""
    OUTPUT_DAMAGED = "OutputDamaged"
    """The output's files contradict each other (a conversation's recorded turns without their answers)."""

    # --- InputsVerified: the preflight ------------------------------------------------------------------------
    CHECKING = "Checking"
    """The preflight is running."""
    OUTPUT_IN_USE = "OutputInUse"
    """Another run holds the output's lease."""
    DATASET_UNUSABLE = "DatasetUnusable"
    DATASET_CHANGED = "DatasetChanged"
    """The dataset differs from the one pinned in the output."""
    OUTPUT_VOLUME_TOO_SMALL = "OutputVolumeTooSmall"
    FINGERPRINT_MISMATCH = "FingerprintMismatch"
    """The existing output was made with other tokenizer files, template or generation settings."""
    OUTPUT_FAILS_CHECKS = "OutputFailsChecks"
    """The existing output's records fail the checks a resume would be judged by."""
    PREFLIGHT_ERROR = "PreflightError"
    """`datagen run`: the preflight raised instead of giving a verdict."""

    # --- ServerReady ------------------------------------------------------------------------------------------
    CREATING = "Creating"
    REFUSED = "Refused"
    """The API server refused to create a pod (a quota, an admission policy); also ChildrenAccepted=False."""
    UNSCHEDULABLE = "Unschedulable"
    QUEUED = "Queued"
    """Kueue has not admitted the server (ServerReady and Progressing): it holds no GPU, and no startup budget
    or retry is spent while it waits."""
    PREEMPTED = "Preempted"
    """Kueue preempted the admitted server for a workload of higher priority (ServerReady and Progressing): its pods
    are deleted and the run pauses, spending no retry and no startup budget, until Kueue admits it again."""
    EVICTED = "Evicted"
    """Kueue evicted the admitted server for another cause (PodsReadyTimeout, a stopped queue, deactivation, node
    failures; the message says which): the run pauses as when preempted."""
    INVALID_ARGS = "InvalidArgs"
    """The server exited refusing its command line."""
    IMAGE_PULL = "ImagePull"
    CONTAINER_CONFIG = "ContainerConfig"
    CRASH_LOOP = "CrashLoop"
    PENDING = "Pending"
    LOADING = "Loading"
    """Started, loading the model, inside server.startupTimeout."""
    STARTUP_TIMEOUT = "StartupTimeout"
    READY = "Ready"
    DEGRADED = "Degraded"
    """Some replicas ready, not all: workers use the ready ones."""
    RELEASED = "Released"
    """The run needs no server any more (halted, all shards done, finished): scaled to zero, GPUs released."""
    NOT_NEEDED = "NotNeeded"
    """The output is already complete: no server was started."""
    EXTERNAL_SERVER_READY = "ExternalServerReady"
    """server.external: every external URL answers /health_generate (the run never starts, scales or stops it)."""
    EXTERNAL_SERVER_UNREACHABLE = "ExternalServerUnreachable"
    """server.external: no external URL answers /health_generate yet, inside server.startupTimeout."""

    # --- ParsersVerified, CanaryPassed and the other one-shot steps' verdicts ---------------------------------
    VERIFIED = "Verified"
    """ParsersVerified=True; DataFaithful=True and the verify step's verdict after the final verification."""
    MISMATCH = "Mismatch"
    """The server's parsers are not the ones the preset requires."""
    NOT_RUN = "NotRun"
    """CanaryPassed: halted before the canary."""
    PASSED = "Passed"
    FAILED = "Failed"
    NO_PROMPTS = "NoPrompts"
    """The canary had no prompt it could send."""
    CANARY_ERROR = "CanaryError"
    """`datagen run`: the canary raised instead of giving a verdict."""
    NO_VERDICT = "NoVerdict"
    """A step's pod ended without a verdict in its termination message."""
    ERROR = "Error"
    """A step's Job failed without a verdict."""

    # --- DataFaithful -----------------------------------------------------------------------------------------
    COLLECTING = "Collecting"
    """Too few records yet to judge."""
    WITHIN_THRESHOLDS = "WithinThresholds"
    THRESHOLD_CROSSED = "ThresholdCrossed"
    VERIFICATION_FAILED = "VerificationFailed"
    NO_RECORDS = "NoRecords"
    """`datagen verify` found no records to verify."""

    # --- Exported ---------------------------------------------------------------------------------------------
    EXPORTED = "Exported"

    # --- SpecApplied and ChildrenAccepted (the operator's own conditions) -------------------------------------
    APPLIED = "Applied"
    LIVE_FIELDS_APPLIED = "LiveFieldsApplied"
    """SpecApplied=True after a live field changed: which, old -> new, and when it takes effect."""
    SUSPEND_ON_HALT = "SuspendOnHalt"
    """SpecApplied=True: spec.suspend turned on over a halted run (nothing runs; recorded for after the halt)."""
    RESUME_ON_HALT = "ResumeOnHalt"
    """SpecApplied=True: spec.suspend turned off over a halted run (nothing to resume; the halt stands)."""
    DATA_FIELDS_FROZEN = "DataFieldsFrozen"
    """A data field changed after bulk records were written: the run keeps its applied spec."""
    ACCEPTED = "Accepted"


OUTPUT_VOLUME_REASONS = frozenset(
    {Reason.OUTPUT_VOLUME_FULL, Reason.OUTPUT_VOLUME_READ_ONLY, Reason.OUTPUT_VOLUME_ERROR}
)
"""The causes a worker names when its output volume fails (its exit 7)."""

SHARD_CAUSES = frozenset(
    {
        Reason.BAD_INPUT,
        Reason.DATASET_UNUSABLE,
        Reason.DATASET_CHANGED,
        Reason.FINGERPRINT_MISMATCH,
        Reason.SERVER_UNREACHABLE,
        Reason.OUTPUT_IN_USE,
        Reason.OUTPUT_DAMAGED,
    }
    | OUTPUT_VOLUME_REASONS
)
"""The named causes a shard stops for (its verdict's reason, its progress's `failure_reason`): the run halts with
the cause as its reason and the shard's own words as its message. WorkersFailed (records out of attempts, a
crash) and Drained (a disruption) are not causes a person must act on first."""

KUEUE_WAITING = frozenset({Reason.QUEUED, Reason.PREEMPTED, Reason.EVICTED})
"""ServerReady's reasons while Kueue holds the server, before its admission or after it took the quota back
(docs/kueue.md): the run waits (phase Queued, Progressing says so too), spending no startup budget and no retry,
never halted on."""
KUEUE_TOOK_BACK = frozenset({Reason.PREEMPTED, Reason.EVICTED})
"""Kueue evicted the admitted server: Progressing=False says so even mid-run, while the workers wait for it."""
