"""The `datagen worker` command line: its arguments, checked against the run's spec, as a WorkerConfig."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from datagen_operator.api.exit_codes import WORKER_DRAIN_S, exit_codes_help
from datagen_operator.api.reasons import Reason
from datagen_operator.api.resolve import ResolvedModel
from datagen_operator.api.spec import DEFAULT_CONCURRENCY, MAX_CONCURRENCY, DataGenRunSpec
from datagen_operator.output.lease import Holder, lease_holder
from datagen_operator.prompts.dataset_ref import DatasetRef


class BadInput(Exception):
    """What the worker cannot start on (its exit 2), with the cause the run names (`reason`)."""

    def __init__(self, message: str, reason: Reason = Reason.BAD_INPUT) -> None:
        super().__init__(message)
        self.reason = reason


class FingerprintMismatch(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="datagen worker",
        description="Generate one shard of a DataGenRun: render prompts, call SGLang /generate, record token ids.",
        epilog="exit codes:\n" + exit_codes_help() + "\nSee docs/worker.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="DataGenRun manifest (YAML)")
    source.add_argument("--spec-json", help="the run's spec as JSON (what the operator passes)")
    parser.add_argument("--output", required=True, help="output directory shared by all shards")
    parser.add_argument("--server", action="append", required=True, help="SGLang base URL (repeat for replicas)")
    parser.add_argument("--shard-index", type=int, default=None, help="default: $JOB_COMPLETION_INDEX")
    parser.add_argument("--shard-count", type=int, default=None, help="default: spec.clients.shards")
    parser.add_argument("--dataset", help="default: spec.dataset.path")
    parser.add_argument("--tokenizer", help="default: spec.model.tokenizerPath, else spec.model.path")
    parser.add_argument("--progress-configmap", help="ConfigMap to patch with progress; {index} is the shard index")
    parser.add_argument("--progress-namespace", help="default: $POD_NAMESPACE or the pod's namespace")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    parser.add_argument("--server-timeout", type=float, default=1800.0, help="give up when no server answers (s)")
    parser.add_argument(
        "--drain-timeout", type=float, default=WORKER_DRAIN_S, help="SIGTERM: wait this long for in-flight (s)"
    )
    parser.add_argument("--backoff-base", type=float, default=0.5, help="first retry delay cap (s)")
    parser.add_argument("--backoff-cap", type=float, default=30.0, help="largest retry delay (s)")
    parser.add_argument("--no-compact", action="store_true", help="leave segments; do not write Parquet at the end")
    parser.add_argument(
        "--no-steal",
        action="store_true",
        help="do not take other shards' unclaimed chunks once this shard's own are sent (claims are kept either way)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="with clients.concurrency auto: the requests in flight per shard the canary resolved (ignored when "
        "the spec sets a number; without it, auto sends at the default 64)",
    )
    parser.add_argument(
        "--render-processes",
        type=int,
        default=None,
        help="helper processes that render prompts (0: in the worker process); default: half the cores, 1..4",
    )
    parser.add_argument("--log-format", choices=("auto", "json", "text"), default="auto")
    parser.add_argument("--termination-log", help="on failure, write the cause here (Kubernetes: /dev/termination-log)")
    parser.add_argument(
        "--lease-holder",
        help="hold the output's lease for this run (its UID; output/lease.py); without it a run's lease is respected",
    )
    return parser


@dataclass
class WorkerConfig:
    spec: DataGenRunSpec
    resolved: ResolvedModel
    output: Path
    servers: list[str]
    shard_index: int
    shard_count: int
    dataset: Path
    tokenizer_dir: Path
    run_file: Path | None = None
    """The --run manifest, kept in the output as run.yaml (what `datagen verify OUTPUT` reads)."""
    progress_configmap: str | None = None
    progress_namespace: str | None = None
    metrics_port: int | None = None
    server_timeout_s: float = 1800.0
    drain_timeout_s: float = WORKER_DRAIN_S
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    compact: bool = True
    steal: bool = True
    """Take other shards' unclaimed chunks once this shard's own are sent (worker/stealing.py)."""
    concurrency: int = DEFAULT_CONCURRENCY
    """Requests in flight (lanes): spec.clients.concurrency, or with auto the canary's number (--concurrency)."""
    render_processes: int = 1
    flush_interval_s: float = 0.2
    sync_interval_s: float = 2.0
    progress_interval_s: float = 2.0
    termination_log: Path | None = None
    lease_holder: Holder | None = None
    """The run this worker generates for: it holds the output's lease and names itself in each record."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dataset_ref(self) -> DatasetRef:
        """spec.dataset as every reader takes it, read at `dataset` (the pod's mount, or --dataset)."""
        return DatasetRef.of(self.spec.dataset, self.dataset)


def config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> WorkerConfig:
    """Validate arguments against the spec; raises BadInput naming what is wrong."""
    from datagen_operator.api import SpecError, load_run, parse_spec
    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.prompts.render import default_render_processes

    try:
        run = None
        if args.run:
            run = load_run(args.run)
            spec = run.spec
        else:
            try:
                document = orjson.loads(args.spec_json)
            except orjson.JSONDecodeError as error:
                raise BadInput(f"--spec-json is not JSON: {error}") from None
            if isinstance(document, dict) and "spec" in document and "apiVersion" in document:
                document = document["spec"]
            spec = parse_spec(document)
        resolved = resolve_model(spec)
    except SpecError as error:
        raise BadInput(f"invalid run spec: {error}") from None
    except OSError as error:
        raise BadInput(f"cannot read the run manifest: {error}") from None

    count = args.shard_count if args.shard_count is not None else spec.clients.shards
    index = args.shard_index
    if index is None:
        raw = environ.get("JOB_COMPLETION_INDEX")
        if raw is None and count == 1:
            raw = "0"  # one shard: nothing to choose
        if raw is None:
            raise BadInput("no --shard-index and no JOB_COMPLETION_INDEX in the environment")
        try:
            index = int(raw)
        except ValueError:
            raise BadInput(f"JOB_COMPLETION_INDEX={raw!r} is not an integer") from None
    if count < 1 or not 0 <= index < count:
        raise BadInput(f"shard index {index} is outside 0..{count - 1} (shard count {count})")
    dataset = Path(args.dataset or spec.dataset.path)
    tokenizer_dir = Path(args.tokenizer or spec.model.tokenizer_dir)
    for url in args.server:
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"--server {url!r} is not an http(s) URL")
    configmap = args.progress_configmap.replace("{index}", str(index)) if args.progress_configmap else None
    if args.concurrency is not None and not 1 <= args.concurrency <= MAX_CONCURRENCY:
        raise BadInput(f"--concurrency {args.concurrency} is outside 1..{MAX_CONCURRENCY}")
    return WorkerConfig(
        spec=spec,
        resolved=resolved,
        output=Path(args.output),
        servers=[url.rstrip("/") for url in args.server],
        shard_index=index,
        shard_count=count,
        dataset=dataset,
        tokenizer_dir=tokenizer_dir,
        run_file=Path(args.run) if args.run else None,
        progress_configmap=configmap,
        progress_namespace=args.progress_namespace,
        metrics_port=args.metrics_port,
        server_timeout_s=args.server_timeout,
        drain_timeout_s=args.drain_timeout,
        backoff_base_s=args.backoff_base,
        backoff_cap_s=args.backoff_cap,
        compact=not args.no_compact,
        steal=not args.no_steal,
        concurrency=spec.clients.per_shard(args.concurrency),
        render_processes=default_render_processes() if args.render_processes is None else max(0, args.render_processes),
        termination_log=Path(args.termination_log) if args.termination_log else None,
        lease_holder=lease_holder(args.lease_holder, run),
    )


def setup_logging(mode: str) -> None:
    from datagen_operator.worker.progress import JsonLogFormatter

    use_json = mode == "json" or (mode == "auto" and not sys.stderr.isatty())
    handler: logging.Handler
    if use_json:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLogFormatter())
    elif sys.stderr.isatty():
        from rich.logging import RichHandler

        from datagen_operator.worker.progress import terminal_console

        handler = RichHandler(console=terminal_console(), show_path=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("datagen")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
