"""The ``mq`` command line: a thin argparse layer over the clients, ``mq.log`` and ``workers``.

Every subcommand lives in its own module that exposes ``add_parser(subparsers)``; the parser it
adds carries ``run(args) -> int`` as its ``run`` default. ``mq.cli.main`` lists the modules.

Error contract (``docs/api.md``, "The command line"): expected errors print exactly one line
``mq: error: ...`` on stderr and exit non-zero (2 for usage errors, 1 otherwise); a traceback
means a bug in mq. The helpers below are what subcommands use to honour it.
"""

from __future__ import annotations

import json
import sys

__all__ = ["PROG", "error_message", "json_line", "print_error"]

PROG = "mq"


def error_message(exc: BaseException) -> str:
    """One line describing an expected error: ``OSError`` as ``path: strerror``, anything
    else as its message."""
    if isinstance(exc, OSError) and exc.strerror:
        where = [str(f) for f in (exc.filename, exc.filename2) if f is not None]
        text = f"{' -> '.join(where)}: {exc.strerror}" if where else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split("\n")).strip()


def print_error(message: str | BaseException) -> None:
    """Write one ``mq: error: ...`` line on stderr, after whatever stdout holds so far."""
    text = error_message(message) if isinstance(message, BaseException) else message
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    sys.stderr.write(f"{PROG}: error: {' '.join(text.splitlines())}\n")
    sys.stderr.flush()


def json_line(obj) -> str:
    """One JSON object and a newline (ASCII-only, so any terminal or pipe can carry it)."""
    return json.dumps(obj, separators=(", ", ": ")) + "\n"
