"""`datagen run RUN.yaml`: the whole run on this machine."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datagen_operator.api import DataGenRun, SpecError, load_run
from datagen_operator.api.exit_codes import EXIT_BAD_INPUT
from datagen_operator.api.paths import run_on_this_machine


def _missing_dataset(run: DataGenRun) -> str | None:
    """Why the dataset stops the run before anything starts, naming the field to fix (the preflight's own
    message names only the file)."""
    dataset = Path(run.spec.dataset.path)
    if dataset.is_file():
        return None
    what = "is a directory, not a file" if dataset.is_dir() else "does not exist on this machine"
    return (
        f"spec.dataset.path: {dataset} {what}; point it at the prompts file (JSONL, one "
        '{"id": "...", "messages": [{"role": "user", "content": "..."}]} a line, or Parquet; README, "The dataset")'
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="datagen run",
        description="Run a DataGenRun on this machine: server, parser check, canary, workers, verification.",
    )
    parser.add_argument("manifest", metavar="RUN.yaml")
    parser.add_argument("--output", type=Path, help="output directory (default: spec.output.path)")
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument("--simulator", action="store_true", help="use the SGLang simulator even where sglang runs")
    engine.add_argument("--sglang", action="store_true", help="require the real SGLang (fail without GPUs)")
    parser.add_argument(
        "--standin",
        action="store_true",
        help="where model.path does not exist, build the preset's stand-in tokenizer there (simulator runs only: "
        "synthetic data, not model output)",
    )
    parser.add_argument(
        "--sim-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra simulator flag, e.g. --sim-arg=--sim-speed=gpu",
    )
    return parser


@dataclass(frozen=True)
class Refusal:
    """A line saying why the run does not start (rich markup); `datagen run` exits EXIT_BAD_INPUT."""

    line: str


def _spec_refusal(run: DataGenRun, manifest: str) -> str | None:
    """Why the manifest cannot run on this machine whatever the flags, as the line to print (rich markup)."""
    from rich.markup import escape

    external = run.spec.server.external
    if external is not None and external.service is not None:
        return (
            f"[red]{manifest}: spec.server.external.service: a Kubernetes Service is resolved by the operator "
            "(kubectl apply -f this manifest); `datagen run` on this machine sends to URLs: set "
            "spec.server.external.urls instead, e.g. [http://127.0.0.1:30000] (a `kubectl port-forward` to the "
            "Service works).[/]"
        )
    if run.spec.server.nodes > 1:
        return (
            f"[red]{manifest}: server.nodes is {run.spec.server.nodes}: a server over several nodes runs in "
            "Kubernetes only, as a LeaderWorkerSet group the operator creates (kubectl apply -f this manifest; "
            "docs/operator.md, 'A server over several nodes'). `datagen run` starts one server on this machine: "
            "set server.nodes to 1 to run it here.[/]"
        )
    missing_dataset = _missing_dataset(run)
    if missing_dataset is not None:
        return f"[red]{manifest}: {escape(missing_dataset)}[/]"
    return None


def _engine_refusal(args: argparse.Namespace, run: DataGenRun, use_real: bool) -> str | None:
    """Why the flags cannot be honoured for this manifest here (the server to start, the model it loads)."""
    from rich.markup import escape

    from datagen_operator.local.servers import real_sglang_available

    if run.spec.server.external is not None and (args.sglang or args.simulator or args.sim_arg):
        flag = "--sglang" if args.sglang else "--simulator" if args.simulator else "--sim-arg"
        return (
            f"[red]{flag}: spec.server.external is set: the run starts no server (neither SGLang nor the "
            "simulator) and sends to server.external.urls; drop the flag[/]"
        )
    if args.sglang and not real_sglang_available():
        return (
            "[red]--sglang: sglang is not installed or no NVIDIA GPU is visible "
            + escape("(pip install -e '.[sglang]' in the checkout installs the pinned SGLang)")
            + "[/]"
        )
    if use_real and not Path(run.spec.model.path).is_dir():
        missing = (
            f"spec.model.path: {run.spec.model.path} does not exist on this machine; point it at the model directory"
        )
        return f"[red]{args.manifest}: {escape(missing)}[/]"
    return None


def _tokenizer(args: argparse.Namespace, run: DataGenRun, use_real: bool, console: Any) -> Any:
    """The run's tokenizer, its stand-in built first where asked (--standin); a Refusal when neither."""
    from rich.markup import escape

    from datagen_operator.api.resolve import resolve_model
    from datagen_operator.steps.tokenizer_source import (
        TokenizerUnavailable,
        load_spec_tokenizer,
        missing_tokenizer_dir,
    )
    from datagen_operator.tokenizer.kimi_tiktoken import build_preset_standin

    model_dir = Path(run.spec.model.tokenizer_dir)
    if not model_dir.is_dir():
        refusal = missing_tokenizer_dir(run.spec, model_dir, standin=args.standin, use_real=use_real)
        if refusal is not None:
            return Refusal(f"[red]{args.manifest}: {escape(refusal)}[/]")
        assert run.spec.model.preset is not None
        # A simulator run needs only a tokenizer of the preset's family: build the stand-in there, once.
        console.print(f"[cyan]--standin: building the {run.spec.model.preset} stand-in tokenizer at {model_dir}[/]")
        build_preset_standin(run.spec.model.preset, model_dir)
    try:
        return load_spec_tokenizer(run.spec, model_dir, resolve_model(run.spec).trust_remote_code)
    except TokenizerUnavailable as error:
        return Refusal(f"[red]{args.manifest}: {escape(str(error))}[/]")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    from rich.console import Console
    from rich.markup import escape

    from datagen_operator.local.runner import LocalRunner
    from datagen_operator.local.servers import real_sglang_available

    console = Console(highlight=False)
    if not console.is_terminal:  # logs and CI: wide enough that the report's verdicts stay readable
        console = Console(highlight=False, width=max(console.width, 140))
    try:
        run = run_on_this_machine(load_run(args.manifest), Path(args.manifest).resolve().parent)
    except (SpecError, FileNotFoundError) as error:
        console.print(f"[red]{args.manifest}: {escape(str(error))}[/]")
        return EXIT_BAD_INPUT
    if args.output is not None:
        output_spec = run.spec.output.model_copy(update={"path": str(args.output.resolve())})
        run = run.model_copy(update={"spec": run.spec.model_copy(update={"output": output_spec})})
    external = run.spec.server.external
    # No server of the run's with server.external: the model directory needs only the tokenizer.
    use_real = external is None and (args.sglang or (not args.simulator and real_sglang_available()))
    refusal = _spec_refusal(run, args.manifest) or _engine_refusal(args, run, use_real)
    tokenizer = Refusal(refusal) if refusal is not None else _tokenizer(args, run, use_real, console)
    if isinstance(tokenizer, Refusal):
        console.print(tokenizer.line)
        return EXIT_BAD_INPUT
    if external is not None:
        console.print(
            f"[cyan]server.external: the run starts no server and sends to {', '.join(external.urls or ())}; it "
            "never stops it.[/]"
        )
    elif not use_real:
        console.print(
            "[bold yellow]No GPU with sglang here: using the SGLang simulator (datagen sim-server).[/] "
            "It serves SGLang 0.5.23's API with a synthetic model of the preset's format; the data is NOT model output."
        )
    runner = LocalRunner(
        run,
        Path(run.spec.output.path),
        simulator=not use_real,
        sim_args=args.sim_arg,
        console=console,
        live=console.is_terminal,
    )
    runner.tokenizer = tokenizer
    return asyncio.run(runner.execute())
