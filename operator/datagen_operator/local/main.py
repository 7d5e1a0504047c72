"""`datagen run RUN.yaml`: the whole run on this machine."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from datagen_operator.api import SpecError, anchor_paths, load_run


def main(argv: list[str]) -> int:
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
        "--sim-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra simulator flag, e.g. --sim-arg=--sim-speed=gpu",
    )
    args = parser.parse_args(argv)

    from rich.console import Console

    from datagen_operator.local.runner import LocalRunner, real_sglang_available

    console = Console(highlight=False)
    if not console.is_terminal:  # logs and CI: wide enough that the report's verdicts stay readable
        console = Console(highlight=False, width=max(console.width, 140))
    try:
        run = anchor_paths(load_run(args.manifest), Path(args.manifest).resolve().parent)
    except (SpecError, FileNotFoundError) as error:
        console.print(f"[red]{args.manifest}: {error}[/]")
        return 2
    if args.output is not None:
        output_spec = run.spec.output.model_copy(update={"path": str(args.output.resolve())})
        run = run.model_copy(update={"spec": run.spec.model_copy(update={"output": output_spec})})
    model_dir = Path(run.spec.model.tokenizer_path or run.spec.model.path)
    if not model_dir.is_dir():
        console.print(
            f"[red]model.path {model_dir} does not exist.[/] For a simulator run, build the Kimi-K2-format stand-in "
            f"tokenizer there: datagen standin-tokenizer --out {model_dir}"
        )
        return 2
    use_real = args.sglang or (not args.simulator and real_sglang_available())
    if args.sglang and not real_sglang_available():
        console.print("[red]--sglang: sglang is not installed or no NVIDIA GPU is visible[/]")
        return 2
    if not use_real:
        console.print(
            "[bold yellow]No GPU with sglang here: using the SGLang simulator (datagen sim-server).[/] "
            "It serves SGLang 0.5.23's API with a synthetic Kimi-K2-format model; the data is NOT model output."
        )
    runner = LocalRunner(
        run,
        Path(run.spec.output.path),
        simulator=not use_real,
        sim_args=args.sim_arg,
        console=console,
        live=console.is_terminal,
    )
    return asyncio.run(runner.execute())
