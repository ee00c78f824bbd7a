"""What the client commands (``topics``, ``produce``, ``consume``, ``offsets``, ``demo``) share:
the ``--socket`` option, ``key=value`` parsing and ISO 8601 datetimes.

Parsers raise ``ValueError`` with a one-line message; ``mq.cli.main`` prints it as
``mq: error: ...`` and exits 2 (a bad argument).
"""

from __future__ import annotations

import argparse
import datetime as _dt

__all__ = [
    "DATETIME_HELP",
    "SOCKET_HELP",
    "add_socket_argument",
    "formatter",
    "non_negative_int",
    "parse_datetime",
    "parse_key_values",
    "positive_int",
]

SOCKET_HELP = ("broker socket (default: $MQ_SOCKET, else <data dir>/mq.sock, the data dir being "
               "$MQ_DATA_DIR, else $XDG_STATE_HOME/mq, else ~/.local/state/mq)")

DATETIME_HELP = """\
datetimes are ISO 8601: 2024-05-01T12:00:00Z, 2024-05-01T14:00:00+02:00, 2024-05-01 12:00,
2024-05-01 (midnight), with optional fractions of a second. Without 'Z' or an offset the time is
local time (of this machine's time zone)."""

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MS = _dt.timedelta(milliseconds=1)


def formatter(prog: str) -> argparse.HelpFormatter:
    """Keep the descriptions' and epilogs' line breaks (examples, output formats)."""
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def add_socket_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", metavar="PATH", help=SOCKET_HELP)


def parse_datetime(text: str) -> int:
    """Milliseconds since the epoch for an ISO 8601 datetime; naive means local time.
    Raises ``ValueError`` with a one-line message naming the text."""
    try:
        moment = _dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"invalid datetime {text!r}: use ISO 8601 like "
                         "2024-05-01T12:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()          # naive: this machine's local time
    return (moment - _EPOCH) // _MS           # exact integer arithmetic, no float rounding


def parse_key_values(pairs: list[str] | None, option: str) -> dict[str, str]:
    """``["k=v", ...]`` as a dict (later pairs win). Raises ``ValueError`` naming the option
    for an item without ``=`` or with an empty key."""
    out: dict[str, str] = {}
    for item in pairs or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"invalid {option} {item!r}: expected key=value")
        out[key.strip()] = value
    return out


def _int(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int(text, 0, "0 or more")
