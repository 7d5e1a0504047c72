"""`datagen validate`, `datagen crd`, `datagen server-args`, `datagen presets`."""

from __future__ import annotations

import argparse
import shlex
import sys

from datagen_operator.api import load_run
from datagen_operator.api.errors import SpecError
from datagen_operator.api.spec import DataGenRun, DataGenRunSpec

EXIT_INVALID = 1


def _load_or_report(path: str) -> DataGenRun | None:
    try:
        return load_run(path)
    except FileNotFoundError:
        print(f"error: {path}: no such file", file=sys.stderr)
    except SpecError as error:
        print(
            f"{path}: invalid DataGenRun ({len(error.errors)} error{'s' if len(error.errors) > 1 else ''})",
            file=sys.stderr,
        )
        for item in error.errors:
            print(f"  {item}", file=sys.stderr)
    return None


NOT_CHECKED = (
    "Not checked here: the files the run reads (the dataset's lines, the tokenizer and chat template, an existing "
    "output's fingerprint) and what fits the model's context: `datagen preflight --run RUN.yaml` judges those before any "
    "server, as the run does first."
)


def validate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="datagen validate",
        description="Check DataGenRun manifests: every field, the preset's rules and the same rules as the CRD's "
        "CEL validations. " + NOT_CHECKED,
    )
    parser.add_argument("manifests", nargs="+", metavar="RUN.yaml")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.manifests:
        run = _load_or_report(path)
        if run is None:
            failed += 1
        else:
            print(f"{path}: valid DataGenRun {run.metadata.name}")
            print(f"  {NOT_CHECKED}")
            hint = _attention_dp_hint(run.spec)
            if hint:
                print(f"  hint: {hint}")
    return EXIT_INVALID if failed else 0


def _attention_dp_hint(spec: DataGenRunSpec) -> str | None:
    """MLA presets recommend attention data parallelism; only a hint, the run is valid without it."""
    from datagen_operator.presets import get_preset

    server = spec.server
    if spec.model.preset is None or not get_preset(spec.model.preset).mla or server.external is not None:
        return None
    if server.attention_data_parallel is not None or server.tp_size == 1 or server.dp_size > 1:
        return None
    return (
        f"{spec.model.preset} is an MLA model: with plain tensor parallelism each of the {server.tp_size} ranks "
        f"holds the whole KV cache; server.attentionDataParallel: {server.tp_size} (SGLang's --attn-dp-size) "
        "gives each its own, which is what serving guides use for concurrency"
    )


def crd_main(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="datagen crd", description="Print the DataGenRun CRD (generated).").parse_args(argv)
    from datagen_operator.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def server_args_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="datagen server-args", description="Print the SGLang launch command.")
    parser.add_argument("manifest", metavar="RUN.yaml")
    parser.add_argument("--one-line", action="store_true", help="print a single shell-quoted line")
    args = parser.parse_args(argv)
    run = _load_or_report(args.manifest)
    if run is None:
        return EXIT_INVALID
    from datagen_operator.engine.launch import server_argv

    spec = run.spec
    argv_out = server_argv(spec)
    if args.one_line:
        print(shlex.join(argv_out))
        return 0
    if spec.server.external is not None:
        print(
            "# server.external: the run starts no server. Its deployer sets the parsers shown here (the parser check "
            "holds the server to them); the rest is how the run would launch one of its own."
        )
    if spec.server.nodes > 1:
        print(_group_comment(spec.server.nodes, spec.server.gpus, spec.server.port))
    # One flag (with its value) per line, shell-continued, so a diff shows exactly what changed.
    lines, current = [], shlex.join(argv_out[:3])
    for token in argv_out[3:]:
        if token.startswith("--"):
            lines.append(current)
            current = token
        else:
            current += " " + shlex.quote(token)
    lines.append(current)
    print(" \\\n  ".join(lines))
    return 0


def _group_comment(nodes: int, gpus: int, port: int) -> str:
    from datagen_operator.engine.launch import DIST_INIT_PORT, LEADER_ADDRESS_ENV, WORKER_INDEX_ENV

    workers = "pod 1 (worker)" if nodes == 2 else f"pods 1..{nodes - 1} (workers)"
    return "\n".join(
        [
            f"# One LeaderWorkerSet group of {nodes} pods x {gpus} GPUs; every pod runs this command, Kubernetes",
            f"# expanding $({WORKER_INDEX_ENV}) and $({LEADER_ADDRESS_ENV}) from the variables LWS gives each pod:",
            f"#   pod 0 (leader): --node-rank 0; serves the HTTP API on :{port} (probes, the workers' requests)",
            f"#     and the torch.distributed rendezvous on :{DIST_INIT_PORT}",
            f"#   {workers}: --node-rank = its index; joins the leader; SGLang serves only a health",
            f"#     endpoint on :{port} there (/health answers 200 once its schedulers run)",
        ]
    )


def _table_width(rows: list[tuple[str, ...]]) -> int:
    """Columns the presets table needs with no cell cut: each column's widest cell, 1 space of padding either
    side, and the borders between and around them."""
    from rich.cells import cell_len

    widths = [max(cell_len(cell) for cell in column) for column in zip(PRESET_COLUMNS, *rows, strict=True)]
    return sum(width + 2 for width in widths) + len(widths) + 1


PRESET_COLUMNS = ("preset", "reasoning parser", "tool-call parser", "thinking", "think tokens", "stop", "attention")


def _preset_rows() -> list[tuple[str, ...]]:
    from datagen_operator.presets import presets

    rows: list[tuple[str, ...]] = []
    for name, p in sorted(presets().items()):
        thinking = (
            "no" if not p.thinking.supported else ("always" if p.thinking.switch is None else f"`{p.thinking.switch}`")
        )
        if p.thinking.prompt_prefills_opener:
            thinking += ", opener in prompt"
        tokens = f"{p.think_start.text} {p.think_end.text}" if p.think_start and p.think_end else "-"
        stops = " ".join(t.text for t in p.stop_tokens)
        attention = "MLA: set attentionDataParallel" if p.mla else "-"
        rows.append(
            (name, p.reasoning_parser or "none", p.tool_call_parser or "none", thinking, tokens, stops, attention)
        )
    return rows


def presets_main(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="datagen presets", description="List the model presets.").parse_args(argv)
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    rows = _preset_rows()
    table = Table(title="model presets")
    for column in PRESET_COLUMNS:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    width = _table_width(rows)
    console = Console(highlight=False)
    if not console.is_terminal:  # a pipe or a file has no width: rich's 80 would cut every name
        console = Console(highlight=False, width=width)
    if width <= console.width:
        console.print(table)
        return 0
    # A terminal narrower than the table: one block per preset, so no name is cut to "deepsee…".
    for row in rows:
        console.print(f"[bold]{escape(row[0])}[/]")
        for column, value in zip(PRESET_COLUMNS[1:], row[1:], strict=True):
            console.print(f"  {column + ':':<18}{escape(value)}", soft_wrap=True)
    return 0
