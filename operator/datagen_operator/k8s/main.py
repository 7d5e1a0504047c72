"""`datagen operator`: run the Kubernetes operator (kopf) in this process."""

from __future__ import annotations

import argparse
import logging
import secrets


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="datagen operator",
        description="Reconcile DataGenRuns: server, canary, workers, verification, conditions. "
        "Configuration comes from the environment (docs/operator.md): DATAGEN_WORKER_IMAGE, ...",
    )
    parser.add_argument("--namespace", action="append", default=[], help="watch only these (default: all)")
    parser.add_argument(
        "--liveness", default=None, help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering object name for several replicas (one active, the others paused); default: standalone",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port (default: none)"
    )
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--print-rbac", action="store_true", help="print the operator's ClusterRole (k8s/rbac.py) as YAML and exit"
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.print_rbac:
        import yaml

        from datagen_operator.k8s.rbac import cluster_role

        print(yaml.safe_dump(cluster_role(), sort_keys=False), end="")
        return 0
    import kopf

    import datagen_operator.k8s.handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    from datagen_operator.k8s.settings import Settings

    if args.metrics_port is not None:
        from datagen_operator.k8s import metrics

        metrics.serve(args.metrics_port)
    watch = Settings.from_env().namespace
    namespaces = args.namespace or ([watch] if watch else [])
    kopf.run(
        # One replica needs no peering; several peer under one name and only the highest priority works.
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=secrets.randbelow(1_000_000) + 1 if args.peering else None,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
    )
    return 0
