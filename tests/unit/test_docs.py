"""The project's documentation is in the project: code refers to no document outside the
repository, and README.md's "Layout of the repository" names every module of ``mq/``,
``workers/`` and ``bench/``, so a newcomer finds each file there and what it is for.

The rule the layout block follows (and this test reads): an entry line starts with one or more
names, each ending in ``.py`` (modules) or ``/`` (a directory), then says what they are for;
an entry is inside the nearest directory line above it indented less; any other line
continues the description above it. A package's ``__init__.py`` and ``__main__.py`` are named
by its directory line; every other module by its own name."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("mq", "workers", "bench")
SECTION = "## Layout of the repository"


# Design and reference documents that lived beside the repository, not in it.
OUTSIDE = re.compile(r"\.\./shared/|shared/(design|reference)/|perf-anchors|kafka-wire\.md|"
                     r"kafka-log-layer\.md|write-failures\.md|kafka-real-broker\.md|"
                     r"pyspark-datasource\.md|\bAPI\.md\b|\breference §")


def test_code_refers_to_no_document_outside_the_repository():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for top in (*TOP, "tests") for path in sorted((ROOT / top).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if OUTSIDE.search(line) and path != Path(__file__).resolve()]
    assert not found, "point these at docs/ or the README instead:\n" + "\n".join(found)


def layout_block(readme: str) -> list[str]:
    """The lines of the first fenced block in the layout section."""
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^```\n(.*?)^```", section, re.S | re.M)
    assert match, f"no fenced block under {SECTION!r}"
    return match.group(1).splitlines()


def named_paths(lines: list[str]) -> set[str]:
    """Every path the block names: modules (``a/b.py``) and directories (``a/``)."""
    named: set[str] = set()
    parents: list[tuple[int, str]] = []          # (indent, directory path) of open directories
    for line in lines:
        words = line.split()
        names = []
        for word in words:
            if not word.endswith((".py", "/")):
                break
            names.append(word)
        if not names:
            continue                               # a description's continuation
        indent = len(line) - len(line.lstrip())
        while parents and parents[-1][0] >= indent:
            parents.pop()
        prefix = parents[-1][1] if parents else ""
        for name in names:
            named.add(prefix + name)
        directories = [name for name in names if name.endswith("/")]
        if len(directories) == 1 and len(names) == 1:
            parents.append((indent, prefix + directories[0]))
    return named


def modules() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for top in TOP
                  for path in (ROOT / top).rglob("*.py") if "__pycache__" not in path.parts)


def covered(module: str, named: set[str]) -> bool:
    if module in named:
        return True
    directory, _, name = module.rpartition("/")
    return name in ("__init__.py", "__main__.py") and directory + "/" in named


def test_every_module_is_in_the_readme_layout():
    named = named_paths(layout_block((ROOT / "README.md").read_text()))
    missing = [m for m in modules() if not covered(m, named)]
    assert not missing, f"README.md's layout section does not name: {', '.join(missing)}"


def test_the_layout_names_only_what_exists():
    named = named_paths(layout_block((ROOT / "README.md").read_text()))
    gone = sorted(path for path in named if not (ROOT / path).exists())
    assert not gone, f"README.md's layout section names what is not there: {', '.join(gone)}"


def test_the_rule_reads_nesting_and_continuations():
    lines = ["mq/__init__.py   public names", "mq/log/           storage",
             "  a.py b.py       two modules", "                  continued: c.py",
             "  sub/            a package", "    d.py          in sub",
             "  e.py            back in log", "workers/          pools"]
    assert named_paths(lines) == {"mq/__init__.py", "mq/log/", "mq/log/a.py", "mq/log/b.py",
                                  "mq/log/sub/", "mq/log/sub/d.py", "mq/log/e.py", "workers/"}
