"""What the commands share: where the client commands' broker is (``--socket``, or a Kafka
cluster's ``--bootstrap-server`` and ``--command-config``, also before a subcommand: ``mq topics
--socket S list``), the partitions of a topic, ``key=value`` parsing, ISO 8601
datetimes and integer argument types, tables; the offline tools' one-error-per-item loop; the
broker ``mq demo`` starts (with or without ``--spark``).

Parsers raise ``ValueError`` with a one-line message; ``mq.cli.main`` prints it as
``mq: error: ...`` and exits 2 (a bad argument).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from collections.abc import Callable, Iterable, Sequence

from mq.cli import PROG, print_error
from mq.client.kafka.config import ENV as BOOTSTRAP_ENV
from mq.client.kafka.config import bootstrap, read_properties
from mq.errors import MQError
from mq.protocol.paths import path_argument

__all__ = [
    "BOOTSTRAP_HELP",
    "COMMAND_CONFIG_HELP",
    "DATETIME_HELP",
    "SOCKET_HELP",
    "add_broker_arguments",
    "add_command_group",
    "add_socket_argument",
    "client_options",
    "formatter",
    "integer",
    "non_negative_int",
    "on_cluster",
    "parse_datetime",
    "parse_key_values",
    "plural",
    "positive_int",
    "run_each",
    "socket_of",
    "start_broker",
    "table",
    "topic_partitions",
]

SOCKET_HELP = ("broker socket (default: $MQ_SOCKET, else <data dir>/mq.sock, the data dir being "
               "$MQ_DATA_DIR, else $XDG_STATE_HOME/mq, else ~/.local/state/mq)")

BOOTSTRAP_HELP = (f"a Kafka cluster's HOST:PORT[,HOST:PORT...] instead of the local broker "
                  f"(default: ${BOOTSTRAP_ENV} when no --socket is given)")

COMMAND_CONFIG_HELP = ("with --bootstrap-server: a client.properties file of librdkafka "
                       "properties (security.protocol, sasl.*, ssl.*), as Kafka's tools take it")

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
    parser.add_argument("--socket", metavar="PATH", type=path_argument, help=SOCKET_HELP)


def add_broker_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--socket``, ``--bootstrap-server`` and ``--command-config``: the local broker or a
    Kafka cluster (read them with ``client_options``). ``prefix`` starts their dests (a
    command group's own, so that a subcommand's defaults do not overwrite its values)."""
    parser.add_argument("--socket", dest=f"{prefix}socket", metavar="PATH", type=path_argument,
                        help=SOCKET_HELP)
    parser.add_argument("--bootstrap-server", dest=f"{prefix}bootstrap_server",
                        metavar="HOST:PORT", help=BOOTSTRAP_HELP)
    parser.add_argument("--command-config", dest=f"{prefix}command_config", metavar="FILE",
                        type=path_argument, help=COMMAND_CONFIG_HELP)


def add_command_group(subparsers, name: str, commands: str, cluster: bool = False, **kwargs):
    """Add ``mq NAME``, a command with subcommands (``mq topics``, ``mq groups``), and return
    the subparsers to add them to. It takes ``--socket`` before the subcommand too (read it
    with ``socket_of``), and with ``cluster`` the Kafka cluster's options as well (read them
    with ``client_options``); without a subcommand it is a usage error listing ``commands``."""
    parser = subparsers.add_parser(name, formatter_class=formatter, **kwargs)
    if cluster:
        add_broker_arguments(parser, prefix="outer_")
    else:
        parser.add_argument("--socket", dest="outer_socket", metavar="PATH", type=path_argument,
                            help=SOCKET_HELP)

    def no_command(args: argparse.Namespace) -> int:
        raise ValueError(f"no {name} command given: {commands} (see '{PROG} {name} --help')")
    parser.set_defaults(run=no_command)
    return parser.add_subparsers(title="commands", metavar="COMMAND", dest=f"{name}_command")


def _given(args: argparse.Namespace, name: str):
    """Option ``name`` after the subcommand, else before it (``add_command_group``)."""
    return getattr(args, name, None) or getattr(args, f"outer_{name}", None)


def socket_of(args: argparse.Namespace) -> str | None:
    """``--socket`` after the subcommand, else before it (``add_command_group``)."""
    return _given(args, "socket")


def client_options(args: argparse.Namespace) -> dict:
    """Where the command's clients go, as keyword arguments of ``Admin``, ``Producer`` and
    ``Consumer``: ``{"socket"}`` for the local broker, or ``{"bootstrap_servers",
    "kafka_config"}`` for a Kafka cluster (``--bootstrap-server``, else
    ``$MQ_BOOTSTRAP_SERVERS`` unless ``--socket`` is given). ``ValueError`` (a usage error)
    for both ``--socket`` and ``--bootstrap-server``, an empty server list, or
    ``--command-config`` without a cluster; ``OSError`` for a config file that cannot be
    read."""
    socket, servers = socket_of(args), _given(args, "bootstrap_server")
    config_file = _given(args, "command_config")
    if socket is not None and servers is not None:
        raise ValueError("give --socket (the local broker) or --bootstrap-server (a Kafka "
                         "cluster), not both")
    if servers is not None and not servers.replace(",", "").strip():
        raise ValueError("--bootstrap-server is empty: give HOST:PORT[,HOST:PORT...]")
    servers = bootstrap(socket, servers)
    if servers is None:
        if config_file is not None:
            raise ValueError(f"--command-config is for a Kafka cluster: give --bootstrap-server "
                             f"too (or set ${BOOTSTRAP_ENV})")
        return {"socket": socket}
    config = None if config_file is None else read_properties(config_file)
    return {"bootstrap_servers": servers, "kafka_config": config}


def on_cluster(options: dict) -> bool:
    """Whether ``client_options`` chose a Kafka cluster."""
    return "bootstrap_servers" in options


def topic_partitions(consumer, topic: str, wanted: Iterable[int] | None = None) -> list:
    """``TopicPartition``s of ``topic``, sorted: every partition, or those in ``wanted``.
    Raises ``UnknownTopicOrPartitionError`` for an unknown topic or partition."""
    from mq.client.types import TopicPartition
    from mq.errors import UnknownTopicOrPartitionError
    existing = consumer.partitions_for_topic(topic)
    if existing is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
    chosen = sorted(existing if wanted is None else wanted)
    for p in chosen:
        if p not in existing:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {p} (it has {len(existing)})")
    return [TopicPartition(topic, p) for p in chosen]


def run_each(items: Iterable, check: Callable[..., bool]) -> int:
    """``check(item)`` for every item (the offline tools' files and directories); it returns
    False for a failed item. An expected error (``MQError``, ``OSError``) fails its item as
    one ``mq: error:`` line and the next item still runs. Exit status 1 if any failed."""
    failed = False
    for item in items:
        try:
            ok = check(item)
        except BrokenPipeError:
            raise                                   # main() exits quietly
        except (MQError, OSError) as err:
            print_error(err)
            ok = False
        failed |= not ok
    return 1 if failed else 0


def table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """Left-aligned columns two spaces apart (as Kafka's tools print them); '-' for None."""
    lines = [list(header)] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() + "\n"
                   for line in lines)


def plural(n: int, word: str) -> str:
    """``1 record``, ``2 records``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def parse_datetime(text: str) -> int:
    """Milliseconds since the epoch for an ISO 8601 datetime; naive means local time, and a
    time before the epoch means 0 (the start of every log). Raises ``ValueError`` with a
    one-line message naming the text."""
    try:
        moment = _dt.datetime.fromisoformat(text.strip())
    except ValueError as err:
        raise ValueError(f"invalid datetime {text!r}: use ISO 8601 like "
                         "2024-05-01T12:00:00Z") from err
    if moment.tzinfo is None:
        moment = moment.astimezone()          # naive: this machine's local time
    return max(0, (moment - _EPOCH) // _MS)   # exact integer arithmetic, no float rounding


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


def integer(text: str) -> int:
    """argparse type: any integer (``--shift-by`` goes both ways)."""
    try:
        return int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from err


def _int(text: str, low: int, what: str) -> int:
    value = integer(text)
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int(text, 0, "0 or more")


def start_broker(data_dir: str, socket_path: str | None = None):
    """A ``BrokerProcess`` started on ``data_dir`` for a demo; ``MQError`` naming the broker's
    last line of output and its log when it cannot start."""
    from mq.testing import BrokerProcess

    broker = BrokerProcess(data_dir, socket_path=socket_path, log_level="WARNING")
    try:
        broker.start(timeout=30)
    except RuntimeError as err:
        lines = [line for line in broker.stderr().splitlines() if line.strip()]
        raise MQError(f"could not start a broker on {data_dir}: "
                      f"{lines[-1] if lines else 'no output'} (log: {broker.stderr_path})"
                      ) from err
    return broker


class ProgressLine:
    """One progress line on stderr for long copies: rewritten in place on a terminal (every
    0.2 s at most), a plain line every 5 s otherwise. ``due()`` says whether one is wanted
    now (and counts it shown), ``show(text)`` writes it, ``done()`` ends the line."""

    EVERY_S = (0.2, 5.0)              # seconds between lines: on a terminal, otherwise

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.every = self.EVERY_S[0] if self.tty else self.EVERY_S[1]
        self.start = self.last = time.monotonic()
        self.shown = False

    def due(self) -> bool:
        now = time.monotonic()
        if now - self.last < self.every:
            return False
        self.last = now
        return True

    def show(self, text: str) -> None:
        sys.stderr.write(f"\r{text}\033[K" if self.tty else text + "\n")
        sys.stderr.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
