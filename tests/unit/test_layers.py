"""The package's import picture: every import points down the layers, and no modules import each other in a
circle. Read from the source with `ast` (imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import datagen_operator

PACKAGE = Path(datagen_operator.__file__).parent
LAYERS = (
    "presets", "api", "tokenizer", "engine", "prompts", "output", "checks", "control", "export", "worker",
    "k8s", "local", "cli",
)  # fmt: skip
"""Lowest first: a layer may import itself and the layers before it (the package root is below them all)."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["datagen_operator", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, source: str, modules: dict[str, Path], *, is_package: bool = False) -> set[str]:
    """The package's modules `name` imports (a `from package import module` names the module)."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {target for target in found if target in modules and target != name}


def _layer(module: str) -> int:
    parts = module.split(".")
    return -1 if len(parts) == 1 else LAYERS.index(parts[1])


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: _imports(name, path.read_text(encoding="utf-8"), modules, is_package=path.name == "__init__.py")
        for name, path in modules.items()
    }


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if _layer(b) > _layer(a))


def test_every_module_sits_in_a_layer() -> None:
    strays = [name for name in _modules() if len(name.split(".")) > 1 and name.split(".")[1] not in LAYERS]
    assert not strays, f"modules outside the layers {LAYERS}: {strays}"


def test_imports_only_point_down() -> None:
    up = _upward(_graph())
    assert not up, "imports that run up the layers:\n" + "\n".join(up)


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


def test_the_check_sees_an_upward_import_however_it_is_written() -> None:
    modules = _modules()
    for source in (
        "from datagen_operator.k8s import manifests",
        "from ..k8s.manifests import RunRef",
        "import datagen_operator.k8s.manifests",
        "def lazy():\n    from datagen_operator.k8s.manifests import RunRef",
    ):
        found = _imports("datagen_operator.api.spec", source, modules)
        assert found == {"datagen_operator.k8s.manifests"}, source
        assert _upward({"datagen_operator.api.spec": found}) == [
            "datagen_operator.api.spec -> datagen_operator.k8s.manifests"
        ]
