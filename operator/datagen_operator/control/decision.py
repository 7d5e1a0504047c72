"""What one pass decides: the run's step (`Step`), and the `Decision` both shells carry out (the phase it reads as,
whether the server and the workers are wanted). The rules that make it are control/decide.py's."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from datagen_operator.api.reasons import KUEUE_WAITING
from datagen_operator.api.status import SERVER_READY, CheckResult, Phase, Progress
from datagen_operator.control.conditions import ConditionUpdate


class Step(StrEnum):
    INVALID = "Invalid"
    SUSPENDED = "Suspended"
    PREFLIGHT = "Preflight"
    WAIT_FOR_SERVER = "WaitForServer"
    VERIFY_PARSERS = "VerifyParsers"
    RUN_CANARY = "RunCanary"
    RUN_WORKERS = "RunWorkers"
    FINAL_VERIFY = "FinalVerify"
    EXPORT = "Export"
    HALTED = "Halted"
    DONE = "Done"


_PHASE_OF_STEP = {
    Step.INVALID: Phase.INVALID,
    Step.SUSPENDED: Phase.SUSPENDED,
    Step.PREFLIGHT: Phase.PREFLIGHT,
    Step.VERIFY_PARSERS: Phase.VERIFYING,
    Step.RUN_CANARY: Phase.CANARY,
    Step.RUN_WORKERS: Phase.RUNNING,
    Step.FINAL_VERIFY: Phase.VERIFYING,
    Step.EXPORT: Phase.EXPORTING,
}


@dataclass(frozen=True, kw_only=True)
class Decision:
    step: Step
    failed: bool = False
    """A halt or an end because something broke (a server that never loaded, failed shards, a failed
    verification or export), not a gate that refused the run: the phase reads Failed, not Halted or
    Succeeded."""
    server_wanted: bool = False
    """Keep the server (and its GPUs); False releases them."""
    workers_wanted: bool = False
    """Workers should be running now (False: not started yet, paused, or finished)."""
    updates: tuple[ConditionUpdate, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    progress: Progress | None = None

    @property
    def phase(self) -> Phase:
        match self.step:
            case Step.WAIT_FOR_SERVER:
                if self.server_queued:
                    return Phase.QUEUED
                # Workers that started keep running while the server is away.
                return Phase.RUNNING if self.workers_wanted else Phase.STARTING
            case Step.HALTED:
                return Phase.FAILED if self.failed else Phase.HALTED
            case Step.DONE:
                return Phase.FAILED if self.failed else Phase.SUCCEEDED
        return _PHASE_OF_STEP[self.step]

    @property
    def server_queued(self) -> bool:
        """Kueue holds the server (ServerReady's reason says so): the run waits for quota, not for a failure."""
        return any(u.type == SERVER_READY and u.reason in KUEUE_WAITING for u in self.updates)

    @property
    def halted(self) -> bool:
        """Stopped for this generation of the spec, whatever the cause (status.halted: read back by
        control/remembered.py, so the halt stands until the spec changes)."""
        return self.step is Step.HALTED

    @property
    def canary_wanted(self) -> bool:
        """The canary starts once the parsers are verified, never alongside: a run halted on its parsers
        sends no canary prompt (CanaryPassed reads NotRun)."""
        return self.step is Step.RUN_CANARY

    @property
    def finished(self) -> bool:
        """Nothing more happens for this spec: the shells stop passing (local) or only report (operator)."""
        return self.step in (Step.DONE, Step.HALTED, Step.INVALID)
