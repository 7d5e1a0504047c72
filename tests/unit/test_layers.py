"""The package's import picture: each layer imports only the layers ALLOWED names for it (docs/architecture.md), every
allowed arrow points down the layers, and no modules import each other in a circle; inside, the pure layers
(PURE_LAYERS) import nothing that does I/O (IO_IMPORTS). Read from the source with `ast` (imports inside functions
count too), plus the modules the cli loads by name (`cli.COMMANDS`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import datagen_operator
from datagen_operator.cli import COMMANDS

PACKAGE = Path(datagen_operator.__file__).parent
ROOT = "datagen_operator"
"""The package itself (its `__version__`), named as a layer of its own in ALLOWED."""
LAYERS = (
    "presets", "api", "tokenizer", "engine", "prompts", "output", "checks", "steps", "control", "export",
    "worker", "k8s", "local", "cli",
)  # fmt: skip
"""Lowest first: every allowed arrow points to a layer before its own (the package root is below them all)."""
ALLOWED: dict[str, frozenset[str]] = {
    "presets": frozenset(),
    "api": frozenset({"presets"}),
    "tokenizer": frozenset({"presets"}),
    "engine": frozenset({"tokenizer", "api", "presets"}),
    "prompts": frozenset({"engine", "tokenizer", "api"}),
    "output": frozenset({"prompts", "engine", "api"}),
    "checks": frozenset({"output", "prompts", "engine", "tokenizer", "api", "presets"}),
    "steps": frozenset({"checks", "output", "prompts", "engine", "tokenizer", "api"}),
    "control": frozenset({"checks", "output", "api"}),
    "export": frozenset({"steps", "output", "prompts", "api"}),
    "worker": frozenset({"checks", "output", "prompts", "engine", "api"}),
    "k8s": frozenset({"control", "steps", "checks", "engine", "api", ROOT}),
    "local": frozenset({"export", "control", "steps", "checks", "output", "prompts", "engine", "tokenizer", "api"}),
    "cli": frozenset(
        {"k8s", "local", "worker", "export", "steps", "output", "engine", "tokenizer", "api", "presets", ROOT}
    ),
}
"""Which other layers each layer may import (its own always). As tight as the imports are: an arrow no module
uses is not allowed (test_every_allowed_arrow_is_used), so a new one is a decision written here and in
docs/architecture.md."""


PURE_LAYERS = ("checks",)
"""The functional core: rules over values the step programs read for them. The inner rule: a module of these layers
imports nothing in IO_IMPORTS (the step programs that read, call and print are steps/, the shells above)."""
IO_IMPORTS: dict[str, str] = {
    "argparse": "parses a command line",
    "asyncio": "runs I/O concurrently",
    "concurrent": "runs workers",
    "glob": "lists files",
    "http": "speaks HTTP",
    "io": "reads and writes streams",
    "multiprocessing": "runs processes",
    "os": "touches the file system and the environment",
    "pathlib": "touches the file system",
    "shutil": "copies and removes files",
    "signal": "handles process signals",
    "socket": "opens sockets",
    "subprocess": "runs programs",
    "sys": "writes to the terminal and exits",
    "tempfile": "makes files",
    "urllib": "speaks HTTP",
    "aiohttp": "speaks HTTP",
    "httpx": "speaks HTTP",
    "requests": "speaks HTTP",
    "kopf": "talks to Kubernetes",
    "kubernetes": "talks to Kubernetes",
    "kubernetes_asyncio": "talks to Kubernetes",
    "plotly": "draws pages",
    "pyarrow.parquet": "reads and writes Parquet files",
    "pyarrow.dataset": "reads files",
    "pyarrow.fs": "reads files",
    "rich": "writes to the terminal",
    "transformers": "loads tokenizers from disk",
    f"{ROOT}.steps": "is the step programs' layer",
    f"{ROOT}.api.step_program": "parses a step's command line and writes its verdict file",
    f"{ROOT}.engine.client": "speaks HTTP to SGLang",
    f"{ROOT}.engine.health": "probes servers",
    f"{ROOT}.engine.sim": "is a server",
    f"{ROOT}.engine.model_configs": "reads a model's config files",
    f"{ROOT}.output.lease": "takes and releases the output's lease",
    f"{ROOT}.output.manifest": "reads and writes manifest.json",
    f"{ROOT}.output.readers": "reads the stored records",
    f"{ROOT}.output.rendered": "reads and writes the rendered store",
    f"{ROOT}.output.segments": "reads and writes record segments",
    f"{ROOT}.output.steal": "claims chunks in files",
    f"{ROOT}.output.volume": "measures the volume",
    f"{ROOT}.output.writer": "writes records",
    f"{ROOT}.prompts.dataset_ref": "reads a dataset's first bytes (its format)",
    f"{ROOT}.prompts.plan": "reads the dataset",
    f"{ROOT}.prompts.scan": "reads the dataset",
    f"{ROOT}.prompts.pin": "reads and writes the dataset pin",
    f"{ROOT}.prompts.render": "loads tokenizers and runs render processes",
    f"{ROOT}.tokenizer.standin": "writes tokenizer files",
}
"""What does I/O, by module (a name covers its submodules: `os` covers `os.path`), and what it does; modules of the
package whose job is I/O included. Pure helpers of the standard library and numpy/pyarrow compute are not here."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(name: str, source: str, *, is_package: bool = False) -> Iterator[tuple[str, str | None]]:
    """Each name `source` imports, absolute: `import a.b` gives ("a.b", None), `from a import b` ("a.b", "a")."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield from ((f"{base}.{alias.name}", base) for alias in node.names)


def _imports(name: str, source: str, modules: dict[str, Path], *, is_package: bool = False) -> set[str]:
    """The package's modules `name` imports (a `from package import module` names the module)."""
    found = {
        target if target in modules or base is None else base
        for target, base in _imported(name, source, is_package=is_package)
    }
    return {target for target in found if target in modules and target != name}


def layer(module: str) -> str:
    parts = module.split(".")
    return ROOT if len(parts) == 1 else parts[1]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {
        name: _imports(name, path.read_text(encoding="utf-8"), modules, is_package=path.name == "__init__.py")
        for name, path in modules.items()
    }
    graph[f"{ROOT}.cli"] |= {module for module, _, _ in COMMANDS.values()} - {f"{ROOT}.cli"}
    return graph


def forbidden(graph: dict[str, set[str]]) -> list[str]:
    """Each import whose layer ALLOWED does not let its importer's layer use, with the rule it breaks."""
    out = []
    for importer, targets in sorted(graph.items()):
        here = layer(importer)
        for target in sorted(targets):
            there = layer(target)
            if here != ROOT and there != here and there not in ALLOWED[here]:
                may = ", ".join(sorted(ALLOWED[here])) or "no other layer"
                out.append(f"{importer} imports {target}: {here} may import {may} (ALLOWED[{here!r}])")
    return out


def test_every_module_sits_in_a_layer() -> None:
    strays = [name for name in _modules() if layer(name) not in (ROOT, *LAYERS)]
    assert not strays, f"modules outside the layers {LAYERS}: {strays}"
    assert set(ALLOWED) == set(LAYERS)


def test_every_allowed_arrow_points_down_the_layers() -> None:
    """The table cannot let two layers import each other: each arrow goes to a layer lower in LAYERS."""
    up = [
        f"{here} -> {there}"
        for here, theirs in ALLOWED.items()
        for there in theirs
        if there != ROOT and LAYERS.index(there) >= LAYERS.index(here)
    ]
    assert not up, f"ALLOWED arrows that do not point down LAYERS: {up}"


def test_imports_follow_the_allowed_arrows() -> None:
    wrong = forbidden(_graph())
    assert not wrong, "imports the layers do not allow:\n" + "\n".join(wrong)


def test_every_allowed_arrow_is_used() -> None:
    used = {(layer(a), layer(b)) for a, targets in _graph().items() for b in targets}
    unused = sorted(f"{here} -> {there}" for here, theirs in ALLOWED.items() for there in theirs
                    if (here, there) not in used)  # fmt: skip
    assert not unused, f"ALLOWED arrows no module uses (remove them, here and in docs/architecture.md): {unused}"


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not circles, f"modules importing each other: {circles}"


def test_the_check_sees_a_forbidden_import_however_it_is_written() -> None:
    modules = _modules()
    for source in (
        "from datagen_operator.k8s import object_meta",
        "from ..k8s.object_meta import RunRef",
        "import datagen_operator.k8s.object_meta",
        "def lazy():\n    from datagen_operator.k8s.object_meta import RunRef",
    ):
        found = _imports("datagen_operator.api.spec", source, modules)
        assert found == {"datagen_operator.k8s.object_meta"}, source
        assert forbidden({"datagen_operator.api.spec": found}) == [
            "datagen_operator.api.spec imports datagen_operator.k8s.object_meta: api may import presets (ALLOWED['api'])"
        ]


def test_a_downward_import_the_table_does_not_name_is_refused() -> None:
    """Not a total order: the worker sits above control, and still may not use it."""
    graph = {"datagen_operator.worker.main": {"datagen_operator.control.decide", "datagen_operator.api.spec"}}
    assert forbidden(graph) == [
        "datagen_operator.worker.main imports datagen_operator.control.decide: worker may import api, checks, "
        "engine, output, prompts (ALLOWED['worker'])"
    ]


def _names(name: str, path: Path) -> set[str]:
    return {
        target for target, _ in _imported(name, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py")
    }


def _io_entry(imported: str) -> str | None:
    """The IO_IMPORTS entry that covers `imported`, or None."""
    parts = imported.split(".")
    return next((entry for entry in IO_IMPORTS if parts[: entry.count(".") + 1] == entry.split(".")), None)


def io_imports(names: dict[str, set[str]]) -> list[str]:
    """Each I/O import (IO_IMPORTS) of a module of the pure layers, with the rule."""
    out = []
    for module, imported in sorted(names.items()):
        if layer(module) not in PURE_LAYERS:
            continue
        for name in sorted(imported):
            entry = _io_entry(name)
            if entry is not None:
                out.append(
                    f"{module} imports {name}: {entry} {IO_IMPORTS[entry]}, and {layer(module)} is pure (PURE_LAYERS): "
                    "read or call in steps/ (or the shells) and pass the result in"
                )
    return out


def test_the_pure_layers_import_nothing_that_does_io() -> None:
    wrong = io_imports({name: _names(name, path) for name, path in _modules().items()})
    assert not wrong, "I/O inside the pure layers:\n" + "\n".join(wrong)


def test_the_inner_rule_sees_io_however_it_is_written() -> None:
    readers = f"{ROOT}.output.readers"
    for source, name, entry in (
        ("import subprocess", "subprocess", "subprocess"),
        ("from os import path", "os.path", "os"),
        ("def lazy():\n    import aiohttp", "aiohttp", "aiohttp"),
        ("import pyarrow.parquet as pq", "pyarrow.parquet", "pyarrow.parquet"),
        ("from ..output.readers import RecordBatches", f"{readers}.RecordBatches", readers),
        (f"from {ROOT}.output import readers", readers, readers),
        (f"from {ROOT}.steps.verify import verify_output", f"{ROOT}.steps.verify.verify_output", f"{ROOT}.steps"),
    ):
        imported = {target for target, _ in _imported(f"{ROOT}.checks.rates", source)}
        assert io_imports({f"{ROOT}.checks.rates": imported}) == [
            f"{ROOT}.checks.rates imports {name}: {entry} {IO_IMPORTS[entry]}, and checks is pure (PURE_LAYERS): "
            "read or call in steps/ (or the shells) and pass the result in"
        ], source


def test_the_inner_rule_lets_pure_code_and_the_shells_be() -> None:
    pure = "import math\nimport pyarrow.compute as pc\nfrom collections.abc import Sequence\nfrom os_like import x"
    assert io_imports({f"{ROOT}.checks.rates": {t for t, _ in _imported(f"{ROOT}.checks.rates", pure)}}) == []
    assert io_imports({f"{ROOT}.steps.verify": {"argparse", "sys"}, f"{ROOT}.local.runner": {"subprocess"}}) == []
