"""``mq top``: a live terminal view of the broker (rich), or one snapshot for scripts.

Every frame is one ``Admin.broker_stats()`` round trip; ``mq.cli.top_model`` turns two
consecutive snapshots into the tables (rates are differences of the broker's counters), and
this module only draws them and runs the loop. On a Kafka cluster (``--bootstrap-server``) a
snapshot is a few admin calls instead (``cluster_snapshot``: each topic's offsets, leaders and
replicas, each group's offsets), and the view shows the cluster's health in place of the
broker's figures.

The loop's promises: q or Ctrl-C quits with status 0 and the terminal as it was (rich's
alternate screen, and the tty's mode put back); a broker that goes away after the first frame
is a red "unreachable, retrying" line over the last tables, not an exit, and the view comes
back by itself with the next broker on the socket (its counters start again, so the first
frame after has no rates). A broker that is not there at the start is the usual one-line
error (a wrong --socket should fail at once, not spin). With stdout not a terminal the live
mode prints the plain tables every interval instead (as ``top -b`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import time

from mq.cli import error_message
from mq.cli.common import add_broker_arguments, client_options, formatter, on_cluster, table
from mq.cli.top_model import (
    GROUP_COLUMNS,
    ClusterView,
    View,
    build_cluster_view,
    build_view,
    group_cells,
    summary_lines,
    to_json,
    topics_table,
)
from mq.errors import GroupIdNotFoundError, MQError, UnknownTopicOrPartitionError

__all__ = ["add_parser", "cluster_snapshot", "plain", "render", "run"]

DESCRIPTION = """\
A live view of the running broker, refreshed every --interval seconds: its topics (partitions,
size, records, rate in), its consumer groups (state, members, lag in records and the age of the
oldest unconsumed record) and the broker itself (pid, uptime, connections, fsync latency over
the last interval, the log cleaner); or of a Kafka cluster with --bootstrap-server (below). q or
Ctrl-C quits.

Rate in is what producers append. Rate out is what consumer groups commit, summed over groups:
consumers read the log directly through memory maps, so the broker sees consumption only
through committed offsets (it moves in steps as often as the groups commit)."""

EPILOG = """\
output:
  --once prints one snapshot as plain text (no colours, no box drawing; table cells hold no
  spaces, group ids aside, so awk can split them) and exits 0: two summary lines, the topics
  table, the groups table. To show rates it takes two snapshots --interval seconds apart;
  --interval 0 takes one and prints '-' for the rates (fsync figures are then since the broker
  started).
  --once --json prints one JSON object instead: {"broker": {...}, "topics": [...],
  "groups": [...], "intervalSeconds", "hiddenTopics"} with rates per second and null where
  unknown. Internal topics (__cluster_metadata, __consumer_offsets, __transaction_state) show
  with --all.

examples:
  mq top                                        live view, every second
  mq top --interval 5 --all                     every 5 s, internal topics too
  mq top --once                                 one snapshot (rates over 1 s) for a script
  mq top --once --json | jq '.groups[] | {group, lag}'
  mq top --bootstrap-server kafka1:9092          a Kafka cluster's topics and groups

on a Kafka cluster (--bootstrap-server): the first line names the cluster, its controller and
how many partitions are under-replicated (fewer in-sync replicas than replicas) or offline (no
leader), the second its brokers. The topics table is TOPIC PARTS RF URP OFFLINE RECORDS
IN-REC/S OUT-REC/S: RF the replication factor, IN-REC/S how fast the high watermarks move
(offsets per second). There is no size, fsync or lag age; --all shows nothing more (the
cluster's admin API lists no internal topics). --json has "cluster" in place of "broker".
Each refresh is a few admin requests per topic and group."""

_MIN_TIMEOUT_S = 5.0      # a stats call slower than this is a broker that does not answer
# The longest --interval: a view refreshed less than daily is no live view, and a sleep of 1e300
# seconds overflows time_t.
_MAX_INTERVAL_S = 86_400


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("top", help="live view: topics, rates, groups, lag",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=formatter)
    parser.add_argument("--once", action="store_true",
                        help="print one snapshot as plain text and exit")
    parser.add_argument("--interval", type=_seconds, default=1.0, metavar="S",
                        help="seconds between frames, and between --once's two snapshots "
                             "(default 1)")
    parser.add_argument("--all", action="store_true",
                        help="show internal topics (__consumer_offsets, ...) too")
    parser.add_argument("--json", action="store_true", help="with --once: one JSON object")
    add_broker_arguments(parser)
    parser.set_defaults(run=run)


def _seconds(text: str) -> float:
    """argparse type: a number of seconds from 0 to ``_MAX_INTERVAL_S``."""
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from err
    if not 0 <= value <= _MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"must be 0 to {_MAX_INTERVAL_S} seconds (a day), "
                                         f"got {text}")
    return value


# --- the data ---------------------------------------------------------------------------------

class Source:
    """Snapshots over one admin connection, made again after a failure (broker restarts)."""

    def __init__(self, options: dict, timeout: float) -> None:
        self.options = options
        self.timeout = timeout
        self.cluster = on_cluster(options)
        self._admin = None

    def snapshot(self) -> dict:
        """``Admin.broker_stats()``, or a cluster's ``cluster_snapshot``; raises ``MQError``
        or ``OSError`` (the connection is then dropped, and the next call connects again)."""
        from mq.client.admin import Admin
        try:
            if self._admin is None:
                self._admin = Admin(**self.options, timeout=self.timeout)
            if self.cluster:
                return cluster_snapshot(self._admin)
            return self._admin.broker_stats()
        except BaseException:
            self.close()
            raise

    def view(self, cur: dict, prev: dict | None, show_internal: bool) -> View | ClusterView:
        if self.cluster:
            return build_cluster_view(cur, prev)
        return build_view(cur, prev, show_internal)

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(MQError, OSError):
                admin.close()


def cluster_snapshot(admin) -> dict:
    """A Kafka cluster as ``mq.cli.top_model`` reads it (the format above
    ``build_cluster_view``), from ``admin``'s topic and group descriptions. A topic or
    group deleted while it is read is left out."""
    now_ms = time.time_ns() // 1_000_000
    partitions = []
    for name in admin.list_topics():
        try:
            info = admin.describe_topic(name)
        except UnknownTopicOrPartitionError:
            continue
        partitions += [{"topic": name, "partition": p, "log_start_offset": start,
                        "high_watermark": end, "leader": leader, "replicas": replicas,
                        "isr": isr}
                       for p, ((start, end), leader, replicas, isr) in enumerate(zip(
                           info["offsets"], info["leaders"], info["replicas"], info["isr"],
                           strict=True))]
    groups = []
    for g in admin.list_groups():
        try:
            desc = admin.describe_group(g["group"])
        except GroupIdNotFoundError:
            continue
        groups.append({"group": g["group"], "state": desc["state"], "members": g["members"],
                       "offsets": desc["offsets"]})
    return {"cluster": {**admin.broker_info, "now_ms": now_ms}, "partitions": partitions,
            "groups": groups}


# --- plain text (--once, and live without a terminal) -----------------------------------------

def plain(view: View | ClusterView) -> str:
    """The snapshot as text: the summary lines, then the topics and groups tables."""
    topics = table(*topics_table(view))
    groups = table(GROUP_COLUMNS, (group_cells(g) for g in view.groups))
    return "\n".join([*summary_lines(view), "", topics, groups])


# --- rich -------------------------------------------------------------------------------------

def render(view: View | ClusterView, interval: float, error: str | None = None):
    """The live frame (a rich renderable): summary lines, topics, groups and a key line;
    ``error`` (the broker is unreachable) in red on top of the last ``view``. It fits any
    width: number columns keep their width and names are cut with an ellipsis."""
    return _Frame(view, interval, error)


# Columns whose texts are names: they share what the number columns leave of the width.
_NAMES = {"TOPIC", "GROUP", "TOPICS"}
_LEFT = _NAMES | {"STATE"}
_GAP = 3            # between two columns: 1 padding + 1 divider + 1 padding (box.SIMPLE_HEAD)


class _Frame:
    def __init__(self, view: View | ClusterView, interval: float, error: str | None) -> None:
        self.view, self.interval, self.error = view, interval, error

    def __rich_console__(self, console, options):
        from rich.text import Text

        def line(text: str, style: str = "") -> Text:
            return Text(text, style=style, no_wrap=True, overflow="ellipsis")

        view, width = self.view, options.max_width
        if self.error is not None:
            what = "cluster" if isinstance(view, ClusterView) else "broker"
            yield line(f"{what} unreachable, retrying: {self.error}", "bold red")
        for text in summary_lines(view):
            yield line(text, "" if self.error is None else "dim")
        yield line("")
        yield _table(*topics_table(view), width)
        yield line("")
        yield _table(GROUP_COLUMNS, [group_cells(g) for g in view.groups], width)
        hidden = (f"  {view.hidden_topics} internal topic(s) hidden (--all)"
                  if view.hidden_topics else "")
        yield line(f"q quit  every {self.interval:g}s  rate out = groups' commits{hidden}",
                   "dim")


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]], width: int):
    """A rich table of ``rows`` no wider than ``width``: every column as wide as its widest
    text, but the name columns cut to a fair share of what the others leave (the narrower
    keep their width, the wider split the rest)."""
    from rich import box
    from rich.table import Table

    natural = [max([len(name)] + [len(r[i]) for r in rows]) for i, name in enumerate(columns)]
    names = [i for i, name in enumerate(columns) if name in _NAMES]
    left = width - _GAP * (len(columns) - 1) - sum(
        w for i, w in enumerate(natural) if i not in names)
    widths = list(natural)
    pending = sorted(names, key=natural.__getitem__)
    while pending:
        i = pending.pop(0)
        widths[i] = max(min(natural[i], left // (len(pending) + 1)), len(columns[i]))
        left -= widths[i]
    out = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), show_edge=False,
                header_style="bold")
    for name, w in zip(columns, widths, strict=True):
        out.add_column(name, justify="left" if name in _LEFT else "right", no_wrap=True,
                       overflow="ellipsis", width=w)
    for row in rows:
        out.add_row(*row)
    return out


class Keys:
    """Keystrokes from a terminal on stdin, read without echo or Enter (cbreak: Ctrl-C still
    raises KeyboardInterrupt). Without a terminal, ``wait`` just waits."""

    def __init__(self, stream=None) -> None:
        self.stream = sys.stdin if stream is None else stream
        self._fd: int | None = None
        self._saved = None

    def __enter__(self) -> Keys:
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            return self
        if os.isatty(fd):
            import termios
            import tty
            self._saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
            self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            import termios
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._fd = None

    def wait_quit(self, deadline: float) -> bool:
        """Wait until ``deadline`` (``time.monotonic``); True as soon as q is pressed."""
        while (left := deadline - time.monotonic()) > 0:
            if self._fd is None:
                time.sleep(left)
                return False
            if select.select([self._fd], [], [], left)[0]:
                pressed = os.read(self._fd, 64)
                if not pressed or pressed.lower().startswith(b"q"):
                    return True             # q, or the terminal went away
        return False


# --- commands ---------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    if args.json and not args.once:
        raise ValueError("--json needs --once (the live view is for a terminal)")
    if not args.once and args.interval <= 0:
        raise ValueError("the live view needs an --interval above 0")
    source = Source(client_options(args), max(_MIN_TIMEOUT_S, 2 * args.interval))
    try:
        first = source.snapshot()       # no broker at the start: one error line, exit 1
        if args.once:
            return _once(source, first, args)
        if not sys.stdout.isatty():
            return _batch(source, first, args)
        return _live(source, first, args)
    finally:
        source.close()


def _once(source: Source, first: dict, args: argparse.Namespace) -> int:
    prev, cur = None, first
    if args.interval > 0:
        time.sleep(args.interval)       # the interval is what the rates are measured over
        prev, cur = first, source.snapshot()
    view = source.view(cur, prev, args.all)
    if args.json:
        sys.stdout.write(json.dumps(to_json(view)) + "\n")
    else:
        sys.stdout.write(plain(view))
    return 0


def _batch(source: Source, first: dict, args: argparse.Namespace) -> int:
    """Live mode into a pipe or file: the plain tables every interval, a blank line between.
    Ctrl-C ends it with status 0; an unreachable broker is one line on stderr per try."""
    prev = None
    cur: dict | None = first
    try:
        while True:
            if cur is not None:
                sys.stdout.write(plain(source.view(cur, prev, args.all)) + "\n")
                sys.stdout.flush()
            time.sleep(args.interval)
            prev = cur
            try:
                cur = source.snapshot()
            except (MQError, OSError) as err:
                what = "cluster" if source.cluster else "broker"
                sys.stderr.write(f"mq top: {what} unreachable, retrying: {err}\n")
                prev = cur = None
    except KeyboardInterrupt:
        return 0


def _live(source: Source, first: dict, args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    view = source.view(first, None, args.all)
    prev: dict | None = first
    try:
        with Keys() as keys, Live(render(view, args.interval), console=console, screen=True,
                                  auto_refresh=False, redirect_stdout=False,
                                  redirect_stderr=False) as live:
            deadline = time.monotonic()
            while True:
                deadline = max(deadline + args.interval, time.monotonic())
                if keys.wait_quit(deadline):
                    return 0
                try:
                    cur = source.snapshot()
                except (MQError, OSError) as err:
                    prev = None
                    live.update(render(view, args.interval, error_message(err)), refresh=True)
                    continue
                view, prev = source.view(cur, prev, args.all), cur
                live.update(render(view, args.interval), refresh=True)
    except KeyboardInterrupt:
        return 0
