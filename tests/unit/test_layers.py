"""The package's layering, read from the source: which layer may import which, no module
imports another's private names, and no import circle (STYLE.md, "Layout shows the
architecture" and "Composition, not mixins").

Imports inside functions are left out: they are lazy on purpose (the CLI and ``mq.__init__``
import clients on first use). Imports under ``if TYPE_CHECKING:`` count: a circle through
them is still a circle for a reader.
"""

from __future__ import annotations

import ast
import pathlib

import mq

ROOT = pathlib.Path(mq.__file__).parent

# What each layer may import (besides itself and mq.errors, which every layer may use).
ALLOWED = {
    "mq.log": set(),
    "mq.protocol": set(),
    "mq.client": {"mq.protocol", "mq.log"},
    "mq.broker": {"mq.protocol", "mq.log", "mq.systemd", "mq.logformat", "mq.metrics"},
    # Process plumbing below the broker and worker pools: systemd's protocols, log formats,
    # the /metrics endpoint.
    "mq.systemd": set(),
    "mq.logformat": set(),
    "mq.metrics": set(),
}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(tree: ast.Module):
    """(module, names) of imports at module level, including ``if TYPE_CHECKING:`` blocks."""
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop(0)
        if isinstance(node, ast.If):
            nodes[:0] = node.body + node.orelse
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def _graph() -> dict[str, list[tuple[str, list[str]]]]:
    graph = {}
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        graph[_module_name(path)] = [
            (module, names) for module, names in _top_level_imports(tree)
            if module == "mq" or module.startswith("mq.")]
    return graph


def _target(module: str, name: str, graph) -> str:
    """``from module import name``: the module imported, or the module it comes from."""
    candidate = f"{module}.{name}"
    return candidate if candidate in graph else module


def _layer(module: str) -> str | None:
    return next((layer for layer in ALLOWED if module == layer or
                 module.startswith(layer + ".")), None)


def test_layers_import_only_what_is_below_them():
    graph = _graph()
    wrong = []
    for module, imports in graph.items():
        layer = _layer(module)
        if layer is None:
            continue                          # mq.cli, mq.testing, mq/__init__: the top
        for imported, names in imports:
            for target in {_target(imported, n, graph) for n in names} or {imported}:
                if target in ("mq", "mq.errors") or target.startswith(layer):
                    continue
                if _layer(target) not in ALLOWED[layer]:
                    wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_private_names_of_another():
    wrong = [f"{module}: from {imported} import {name}"
             for module, imports in _graph().items() for imported, names in imports
             for name in names if name.startswith("_") and not name.startswith("__")]
    assert not wrong, "\n".join(wrong)


def test_no_import_circle():
    graph = _graph()
    edges = {module: {_target(imported, n, graph) for imported, names in imports
                      for n in (names or [""])} - {module}
             for module, imports in graph.items()}
    edges = {m: {t.rstrip(".") for t in targets if t.rstrip(".") in graph}
             for m, targets in edges.items()}
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            raise AssertionError("import circle: " + " -> ".join(
                path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if target != "mq":                  # the package's __init__ imports lazily
                visit(target)
        path.pop()
        done.add(module)
    for module in sorted(graph):
        visit(module)
