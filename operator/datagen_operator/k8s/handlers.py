"""kopf handlers: a few lines each. The work is in reconcile.py (shell) over control/ (decisions).

One daemon per DataGenRun runs passes; watches on the run's children and pods (k8s/registry.py WATCHED) keep
in-memory indexes, from which a pass reads them, and wake the run's daemon early. What a pass reads besides
(the server's answers, the LeaderWorkerSet, FailedCreate events, the spec ConfigMap when the cache lacks it)
is k8s/observer.py's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from typing import Any

import aiohttp
import kopf

import datagen_operator.k8s.storage  # noqa: F401  (registers the claims' access-mode check)
from datagen_operator.api.spec import API_GROUP, API_VERSION, PLURAL
from datagen_operator.k8s import metrics, object_meta
from datagen_operator.k8s.callbacks import namespaced
from datagen_operator.k8s.context import OperatorContext
from datagen_operator.k8s.executor import stop_children
from datagen_operator.k8s.kube import Kube
from datagen_operator.k8s.reconcile import Reconciler
from datagen_operator.k8s.registry import WATCHED
from datagen_operator.k8s.release import FINALIZER
from datagen_operator.k8s.settings import Settings

MANAGED = {"app.kubernetes.io/managed-by": object_meta.MANAGED_BY}
REPORTING_COMPONENT = "datagen-operator"
"""The events' source and reportingComponent."""
STOP_WAIT_S = 300.0
"""How long deletion waits in one go for the children to stop before kopf retries it (and logs an error)."""
RUN = (API_GROUP, API_VERSION, PLURAL)


class QuietSuccesses(logging.Filter):
    """kopf logs "Handler 'x' succeeded." and "Indexer 'x' succeeded." at INFO for every watch event it hands to
    a handler: every shard's progress write (~every 6 s per shard), every pod update. They bury what a person
    needs (the transitions, a deletion's wait), so they are dropped; a handler's failure is still logged."""

    PER_EVENT = re.compile(r"(Handler|Indexer) '[^']+' succeeded\.")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno <= logging.INFO and self.PER_EVENT.fullmatch(str(record.msg)))


# kopf's per-object logger; handlers.py is what every way of running the operator imports (datagen operator,
# `kopf run -m`), so the filter is set here.
logging.getLogger("kopf.objects").addFilter(QuietSuccesses())


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """A kubeconfig when one is named (tests, development), else the pod's own ServiceAccount."""
    if os.environ.get("KUBECONFIG"):
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    # kopf keeps its own bookkeeping in annotations: the status belongs to the run's conditions.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=API_GROUP)
    # Events are the transitions, posted by the reconciler itself (k8s/reconcile.py: a namespace being deleted
    # refuses them, which kopf's poster would retry and log as 9 errors each); log lines stay in the log.
    settings.posting.level = logging.ERROR
    # `kubectl describe` shows who said it ("From"): the operator, not the framework under it.
    settings.posting.reporting_component = REPORTING_COMPONENT
    settings.posting.reporting_instance = os.environ.get("POD_NAME") or socket.gethostname()
    settings.posting.event_name_prefix = f"{REPORTING_COMPONENT}-"
    settings.watching.server_timeout = 300
    # No CRD or namespace scanning: resources are known, namespaces are named (or all): no RBAC for either.
    settings.scanning.disabled = True
    operator = Settings.from_env()
    memo.ctx = OperatorContext(
        operator,
        await Kube.connect(),
        aiohttp.ClientSession(),
        children=lambda *a: [],
        reporter=(REPORTING_COMPONENT, settings.posting.reporting_instance),
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.ctx.http.close()
    await memo.ctx.kube.close()


def _run_key(namespace: str | None, labels: kopf.Labels) -> tuple[str, str]:
    return namespaced(namespace), labels.get(object_meta.RUN_LABEL, "")


def index_by_run(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {_run_key(namespace, labels): body}


def child_changed(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.ctx.wake(*_run_key(namespace, labels))


# One index and one wake-up per watched kind (k8s/registry.py WATCHED). Children the operator owns whole (the
# Services, the workers' RBAC) are watched too, so one deleted or edited by hand is put back at once (the next
# pass applies it server-side), not after an operator restart.
for _watched in WATCHED:
    _resource = (_watched.group, _watched.version, _watched.plural) if _watched.group else (_watched.plural,)
    kopf.index(*_resource, labels=MANAGED, id=_watched.index_id)(index_by_run)
    kopf.on.event(*_resource, labels=MANAGED, id=f"{_watched.plural}_changed")(child_changed)


@kopf.on.event(*RUN)
def run_changed(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.ctx.wake(namespaced(namespace), name)


# kopf cancels a daemon not done at once when its run is deleted, unless it is given a backoff first (kopf's
# stop_daemons: without one it goes straight to cancel, and logs "is cancelled. Will escalate." at WARNING).
# A pass takes well under a second; the loop below exits on `stopped` as soon as it ends.
@kopf.daemon(*RUN, cancellation_backoff=10.0, cancellation_timeout=20.0)
async def run_daemon(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    ctx: OperatorContext = memo.ctx
    namespace = namespaced(namespace)
    indexes: dict[str, kopf.Index[Any, Any]] = {watched.kind: kwargs[watched.index_id] for watched in WATCHED}
    ctx.children = lambda kind, ns, run: list(indexes[kind].get((ns, run), ()))
    reconciler = Reconciler(ctx, namespace, name)
    waker = ctx.waker(namespace, name)
    failures = 0
    try:
        while not stopped and not body.metadata.get("deletionTimestamp"):
            waker.clear()
            try:
                await reconciler.run_pass(body)
                metrics.count_pass(namespace, name)
                failures = 0
            except Exception:  # an API hiccup must not end the run's daemon; the next pass retries
                failures += 1
                logger.exception("reconcile pass failed (%d in a row)", failures)
            delay = ctx.settings.resync_s if not failures else min(60.0, 2.0**failures)
            stop = asyncio.ensure_future(stopped.wait())
            wake = asyncio.ensure_future(waker.wait())
            await asyncio.wait({stop, wake}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            wake.cancel()
    finally:
        ctx.wakers.pop((namespace, name), None)


@kopf.on.delete(*RUN)
async def run_deleted(name: str, namespace: str | None, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Workers first (they drain and sync), then the server; the output volume is never touched.

    Waiting for pods to stop is the normal course of a deletion: it is waited out here and logged at INFO.
    Only a wait past STOP_WAIT_S becomes kopf's retry (an error: something keeps the pods alive)."""
    namespace = namespaced(namespace)
    deadline = asyncio.get_running_loop().time() + STOP_WAIT_S
    said = None
    while waiting := await stop_children(memo.ctx.kube, namespace, name):
        if waiting != said:
            logger.info(waiting)
            said = waiting
        if asyncio.get_running_loop().time() > deadline:
            raise kopf.TemporaryError(f"still {waiting} after {STOP_WAIT_S:.0f} s", delay=10)
        await asyncio.sleep(1.0)
    metrics.forget_run(namespace, name)
