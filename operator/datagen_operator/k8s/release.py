"""`datagen release-finalizers`: let runs go when their operator is gone for good.

Every run carries the operator's finalizer so that deleting it first stops the workers (they drain and sync)
and then the server. With the operator uninstalled nobody removes it, and deleting a run, or the namespace
holding it, waits forever. Removing the finalizer skips that ordered stop: the garbage collector then deletes
the run's Jobs and StatefulSet at once (pods get SIGTERM as usual). The output volume is never touched.
Run it only when no operator will serve these runs again (a running operator adds the finalizer back).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from datagen_operator.api.spec import API_GROUP, API_VERSION, PLURAL

FINALIZER = f"{API_GROUP}/finalizer"
"""The operator's finalizer on every DataGenRun (kopf's persistence setting; k8s/handlers.py)."""


def finalizer_removal(finalizers: list[str]) -> list[dict[str, Any]] | None:
    """A JSON patch removing only our finalizer, guarded by a test so a concurrent change fails it; None when
    the run does not hold it. Other controllers' finalizers stay."""
    if FINALIZER not in finalizers:
        return None
    index = finalizers.index(FINALIZER)
    path = f"/metadata/finalizers/{index}"
    return [{"op": "test", "path": path, "value": FINALIZER}, {"op": "remove", "path": path}]


async def release(namespace: str | None, names: list[str]) -> list[str]:
    """Removes the finalizer from the named runs (all runs when none is named); returns 'namespace/name' of
    each run released."""
    from datagen_operator.k8s.kube import Kube

    kube = await Kube.connect()
    released: list[str] = []
    try:
        if namespace is None:
            listed = await kube.custom.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL)
        else:
            listed = await kube.custom.list_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL)
        for run in listed.get("items", []):
            meta = run["metadata"]
            if names and meta["name"] not in names:
                continue
            patch = finalizer_removal(meta.get("finalizers") or [])
            if patch is None:
                continue
            await kube.custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, meta["namespace"], PLURAL, meta["name"], patch,
                _content_type="application/json-patch+json",  # type: ignore[call-arg]  # taken in **kwargs
            )  # fmt: skip
            released.append(f"{meta['namespace']}/{meta['name']}")
    finally:
        await kube.close()
    return released


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="datagen release-finalizers",
        description="Remove the operator's finalizer from DataGenRuns, so that deleting them (or their namespace) "
        "completes without the operator. Only when the operator is gone: it skips the ordered stop of workers and "
        "server. Uses $KUBECONFIG (or ~/.kube/config).",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", "-n", help="the runs' namespace")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="runs in every namespace")
    parser.add_argument("names", nargs="*", help="only these runs (default: every run in scope)")
    args = parser.parse_args(argv)
    os.environ.setdefault("KUBECONFIG", os.path.expanduser("~/.kube/config"))
    released = asyncio.run(release(None if args.all_namespaces else args.namespace, args.names))
    for run in released:
        print(f"released {run}")
    if not released:
        print("no run holds the finalizer", file=sys.stderr)
    return 0
