"""The tree's layering, read from the source: which layer may import which, no module imports
another's private names, ``workers`` uses only mq's public names, and no import circle
(STYLE.md, "Layout shows the architecture" and "Composition, not mixins").

Every module of ``mq``, ``workers``, ``bench`` and ``pyspark_mq.py`` is read, and every import
in it counts: at module level, under ``if TYPE_CHECKING:`` and inside functions (a lazy
import is still a dependency, and a circle through one is still a circle for a reader).
``from mq import Name`` counts as an import of the module ``mq`` takes the name from (its
``_LAZY`` table). A layer is a module name and everything below it on the dot: ``mq.log``
holds ``mq.log.batch``, not ``mq.logformat``.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import mq
import mq.aio
from mq import errors

TOP = pathlib.Path(mq.__file__).parent.parent
PACKAGES = ("mq", "workers", "bench")
FILES = ("pyspark_mq.py",)

# Process plumbing below the broker and the worker pools: systemd's protocols, log formats,
# the /metrics endpoint.
PLUMBING = {"mq.systemd", "mq.logformat", "mq.metrics"}

# What each layer may import besides itself, mq.errors and ``mq`` (whose own imports are
# mq.errors only). The most specific layer of a module applies.
ALLOWED = {
    "mq": set(),
    "mq.log": set(),
    "mq.protocol": set(),
    **{name: set() for name in PLUMBING},
    "mq.client": {"mq.protocol", "mq.log"},
    "mq.broker": {"mq.protocol", "mq.log", *PLUMBING},
    "mq.aio": {"mq.client", "mq.protocol", "mq.log"},
    "mq.spark": {"mq.client", "mq.protocol", "mq.log"},
    "mq.testing": {"mq.protocol", "mq.log"},
    # mq migrate's copy into a Kafka cluster: a client of the broker (and of confluent-kafka)
    "mq.migrate": {"mq.client", "mq.protocol", "mq.log"},
    # the mq command: over the clients and the log; it also starts a broker (mq broker,
    # mq demo), a worker pool (mq workers) and Spark (mq demo --spark), and copies into Kafka
    # (mq migrate)
    "mq.cli": {"mq.client", "mq.protocol", "mq.log", "mq.broker", "mq.spark", "mq.testing",
               "mq.migrate", "workers", *PLUMBING},
    "mq.__main__": {"mq.cli"},
    "pyspark_mq": {"mq.spark"},
    # public names only (test_workers_use_only_public_names)
    "workers": {"mq.client", "mq.protocol", "mq.aio", *PLUMBING},
    "bench": {"mq.client", "mq.aio", "mq.protocol", "mq.log", "mq.broker", "mq.spark",
              "mq.testing", "workers", *PLUMBING},
}

# What ``workers`` may import from mq: the public package's names (mq's and mq.aio's), the
# public errors, and the plumbing modules (any of their names).
PUBLIC = {"mq": set(mq.__all__) | {name.removeprefix("mq.") for name in PLUMBING},
          "mq.aio": set(mq.aio.__all__), "mq.errors": set(errors.__all__),
          **{name: None for name in PLUMBING}}



def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(TOP).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _paths() -> list[pathlib.Path]:
    return sorted([p for package in PACKAGES for p in (TOP / package).rglob("*.py")]
                  + [TOP / name for name in FILES])


def _imports(tree: ast.Module, module: str, is_package: bool):
    """(module, names) of every import in the file, lazy ones included; relative imports
    resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[:len(module.split(".")) - node.level + is_package]
                base = ".".join(package + ([base] if base else []))
            yield base, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


@functools.cache
def _lazy_names() -> dict[str, str]:
    """``mq/__init__.py``'s ``_LAZY``: the module each public name is imported from."""
    tree = ast.parse((TOP / "mq" / "__init__.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and node.targets[0].id == "_LAZY")


@functools.cache
def _graph() -> dict[str, list[tuple[str, list[str]]]]:
    graph = {}
    for path in _paths():
        tree = ast.parse(path.read_text(), str(path))
        module = _module_name(path)
        graph[module] = [(imported, names) for imported, names in
                         _imports(tree, module, path.name == "__init__.py")
                         if imported.partition(".")[0] in (*PACKAGES, "pyspark_mq")]
    return graph


def _targets(imported: str, names: list[str], graph) -> set[str]:
    """The modules an import loads: ``from module import name`` is the module ``name`` if
    there is one, else ``module``; ``from mq import Name`` is where ``mq`` takes it from."""
    lazy = _lazy_names()
    out = set()
    for name in names or [""]:
        candidate = f"{imported}.{name}"
        if candidate in graph:
            out.add(candidate)
        elif imported == "mq" and name in lazy:
            out.add(lazy[name])
        else:
            out.add(imported)
    return out


def _layer(module: str) -> str | None:
    """The most specific layer ``module`` is in (on the dot)."""
    return max((layer for layer in ALLOWED if module == layer or
                module.startswith(layer + ".")), key=len, default=None)


def test_every_module_is_in_a_layer():
    assert [m for m in _graph() if _layer(m) is None] == []


def test_layer_matches_on_the_dot():
    assert _layer("mq.logformat") == "mq.logformat"
    assert _layer("mq.log.batch") == "mq.log"
    assert _layer("mq.spark.offsets") == "mq.spark"
    assert _layer("mq.broker.kafka.data") == "mq.broker"
    assert _layer("workers.engine") == "workers"


def test_layers_import_only_what_is_below_them():
    graph = _graph()
    wrong = []
    for module, imports in graph.items():
        layer = _layer(module)
        for imported, names in imports:
            for target in _targets(imported, names, graph):
                if target in ("mq", "mq.errors") or _layer(target) == layer:
                    continue
                if _layer(target) not in ALLOWED[layer]:
                    wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_workers_use_only_public_names():
    wrong = []
    for module, imports in _graph().items():
        if _layer(module) != "workers":
            continue
        for imported, names in imports:
            if imported.partition(".")[0] != "mq":
                continue
            public = PUBLIC.get(imported, set())        # None: any of its names
            if imported not in PUBLIC or public is not None and not set(names) <= public:
                wrong.append(f"{module}: from {imported} import {', '.join(names) or '*'}")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_private_names_of_another():
    wrong = [f"{module}: from {imported} import {name}"
             for module, imports in _graph().items() for imported, names in imports
             for name in names if name.startswith("_") and not name.startswith("__")]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circle():
    graph = _graph()
    edges = {module: {t for imported, names in imports
                      for t in _targets(imported, names, graph) if t in graph} - {module}
             for module, imports in graph.items()}
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            raise AssertionError("import circle: " + " -> ".join(
                path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for target in sorted(edges[module]):
            visit(target)
        path.pop()
        done.add(module)
    for module in sorted(graph):
        visit(module)
