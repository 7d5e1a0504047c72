"""`datagen`: one entry point; each subcommand's module owns its arguments."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from datagen_operator.api.commands import STEP_COMMANDS

# name -> (module, function, one-line help). Modules load lazily so `datagen validate` stays fast.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "validate": ("datagen_operator.cli.spec_commands", "validate_main", "check a DataGenRun manifest"),
    "crd": ("datagen_operator.cli.spec_commands", "crd_main", "print the CustomResourceDefinition"),
    "server-args": ("datagen_operator.cli.spec_commands", "server_args_main", "print the SGLang launch command"),
    "presets": ("datagen_operator.cli.spec_commands", "presets_main", "list the model presets"),
    "sim-server": ("datagen_operator.engine.sim.server", "main", "run the SGLang simulator (CPU, no model)"),
    "standin-tokenizer": (
        "datagen_operator.tokenizer.kimi_tiktoken",
        "standin_tokenizer_main",
        "build a preset's stand-in tokenizer directory (--preset NAME, default kimi-k2.5; --kimi-tiktoken: "
        "the real K2.5 layout)",
    ),
    "worker": ("datagen_operator.worker.main", "main", "generate one shard (what worker pods run)"),
    "preflight": ("datagen_operator.steps.preflight", "main", "check dataset, tokenizer and output before a server"),
    "canary": ("datagen_operator.steps.canary", "main", "run the canary against running servers"),
    "verify": ("datagen_operator.steps.verify_program", "main", "check an output directory for faithfulness"),
    "run": ("datagen_operator.local.main", "main", "run a DataGenRun on this machine"),
    "export": ("datagen_operator.export.run", "main", "write a run's exact tokens in a trainer's format"),
    "release-lease": (
        "datagen_operator.output.lease",
        "main",
        "give a halted run's output lease back (what the operator's release Job runs)",
    ),
    "operator": ("datagen_operator.k8s.main", "main", "run the Kubernetes operator"),
    "release-finalizers": (
        "datagen_operator.k8s.release",
        "main",
        "let runs be deleted when the operator is gone (removes its finalizer)",
    ),
}


STEP_PROGRAMS = tuple(command.PROGRAM for command in STEP_COMMANDS)
"""The one-shot steps whose exit says whether a verdict was written (api/exit_codes.py)."""

ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
"""Read by Arrow when pyarrow is first imported (every subcommand imports it lazily, after this is set)."""


def _usage() -> str:
    lines = ["usage: datagen COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<18} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "`datagen COMMAND --help` explains each."]
    return "\n".join(lines)


EXIT_BROKEN_PIPE = 141
"""What a shell reports for a command killed by SIGPIPE (128 + 13): `datagen crd | head` reads as usual."""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # inside the try: buffered output meets a closed pipe here, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader (`head`, `less` quit early) has all it wanted. Python ignores SIGPIPE, so the write raises;
        # point stdout at /dev/null so the interpreter's final flush does not raise (and print) again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _dispatch(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] in ("--version", "version"):
        from datagen_operator import __version__

        print(f"datagen-operator {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"datagen: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    # Arrow's jemalloc pool hands freed pages back; its Linux default (mimalloc) keeps them per thread: verify
    # of 1M records peaks ~55 MB higher with it, compaction ~30 MB (bench/scale.py). A user's choice wins.
    os.environ.setdefault(ARROW_POOL_VARIABLE, "jemalloc")
    module_name, function_name, _ = COMMANDS[name]
    function: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), function_name)
    if name not in STEP_PROGRAMS:
        return function(rest) or 0
    from datagen_operator.api.exit_codes import EXIT_STEP_CRASHED

    try:
        return function(rest) or 0
    except Exception:  # not a verdict: the step's Job retries the pod (a written verdict exits 1)
        traceback.print_exc()
        return EXIT_STEP_CRASHED
