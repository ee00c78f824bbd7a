"""``mq consume``: Kafka's console consumer over ``mq.Consumer`` (records to stdout).

Text output writes each value's bytes as they are, one record per line (a value holding a
newline spans lines: use ``--format json`` for exact round trips of arbitrary bytes). JSON output
is one object per record per line; keys, values and header values are text when valid UTF-8,
``null`` when absent, else ``{"base64": ...}`` (as ``mq dump-log --json``).

Without ``--group``, initial positions are set explicitly at start (end of each partition by
default), so records produced after ``mq consume`` started are never skipped; partitions added
while it runs, and a position that retention deleted, are read from their beginning. Nothing is
committed.

With ``--group G`` it is a member of group G (Kafka's console consumer with --group): the broker
assigns its partitions, each starts at the group's committed offset (else at the end, or the
beginning with --from-beginning: Kafka's auto.offset.reset), positions are auto-committed, and
a final commit on exit stores the position after the last *printed* record, so the next run of
the group continues exactly there. For that, a stop signal only raises a flag checked between
polls: a record that poll returned is always printed before the consumer stops. On a Kafka
cluster (``--bootstrap-server``) the command makes those commits itself, every 5 s and on exit
(``_Positions``), instead of the consumer's auto-commit.
"""

from __future__ import annotations

import argparse
import contextlib
import select
import signal
import sys
import time

from mq.cli import json_line
from mq.cli.common import (
    DATETIME_HELP,
    add_broker_arguments,
    client_options,
    formatter,
    non_negative_int,
    on_cluster,
    parse_datetime,
    plural,
    positive_int,
    topic_partitions,
)
from mq.cli.dump_log import json_bytes, timestamp_type_name

__all__ = ["add_parser", "emit", "record_json", "run"]

DESCRIPTION = """\
Print records of TOPIC to stdout (Kafka's kafka-console-consumer): by default the value of
each new record, one per line, as it arrives. Reads every partition of the topic, or only
--partition P. With --bootstrap-server it reads from a Kafka cluster."""

EPILOG = f"""\
where to start (default: the end of each partition, i.e. only new records):
  --from-beginning        the first record still in the log
  --offset O              offset O of --partition P (or 'earliest' / 'latest')
  --from-datetime ISO     the first record with a timestamp at or after ISO in each partition
                          (the end of a partition when it has none)
{DATETIME_HELP}

output:
  text (default)  the value's bytes and a newline ('null' for a null value); --print-timestamp,
                  --print-partition, --print-offset, --print-headers and --print-key prefix
                  tab-separated fields, as Kafka does:
                    CreateTime:1714564800000<TAB>Partition:0<TAB>Offset:42<TAB>h1:v1,h2:v2<TAB>key<TAB>value
  json            one object per record per line: {{"topic", "partition", "offset", "timestamp",
                  "timestampType", "key", "value", "headers": [{{"key", "value"}}, ...]}}; keys
                  and values are strings when valid UTF-8, null when absent, otherwise
                  {{"base64": "..."}}
  At the end 'consumed N records from TOPIC' goes to stderr.

transactions: --isolation-level read_committed prints only records of committed transactions
(and records written outside any): it stops at each partition's last stable offset, so it
waits while a transaction there is open, and skips aborted records. The default,
read_uncommitted, prints every record as it is written (as Kafka's console consumer).

when it stops: after --max-messages N records; when no record arrives for --timeout-ms T
(exit status 0 even if fewer than N came); otherwise it runs until Ctrl-C or SIGTERM, which
print the records already read and exit with status 0 (as Kafka's console consumer does).

with --group G: read as a member of consumer group G: the broker assigns this process its share
of the partitions (shared with the group's other members), each starting at the group's
committed offset; a partition without one starts at the end, or with --from-beginning at the
beginning (Kafka's auto.offset.reset). Positions are committed every 5 s and on exit, after the
last printed record, so the next 'mq consume TOPIC --group G' continues where this one stopped.
--partition, --offset and --from-datetime do not apply to a group (use 'mq groups
reset-offsets' to move its offsets).

exit status: 0 as above; 1 for an unknown topic or partition, an offset out of range, no broker,
or a topic deleted while reading; 2 for bad flags or a bad datetime.

examples:
  mq consume orders --from-beginning --max-messages 10
  mq consume orders --partition 2 --offset 1500 --print-offset --print-key
  mq consume orders --from-datetime 2024-05-01T12:00:00Z --timeout-ms 1000 --format json
  mq consume orders --from-beginning --timeout-ms 500 | wc -l
  mq consume orders --group billing --max-messages 100     (again: the next 100)
  mq consume payments --from-beginning --isolation-level read_committed"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("consume", help="print records of a topic to stdout",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=formatter)
    parser.add_argument("topic", metavar="TOPIC", help="topic to read")
    parser.add_argument("--group", metavar="G",
                        help="read as a member of consumer group G, from its committed "
                             "offsets, committing as it goes")
    parser.add_argument("--partition", type=non_negative_int, metavar="P",
                        help="read only partition P (default: every partition)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--offset", type=_offset, metavar="O",
                       help="start at offset O of --partition (or 'earliest' / 'latest')")
    start.add_argument("--from-beginning", action="store_true",
                       help="start at the first record still in the log")
    start.add_argument("--from-datetime", metavar="ISO",
                       help="start at the first record with a timestamp at or after ISO "
                            "(ISO 8601; naive = local time)")
    parser.add_argument("--max-messages", type=positive_int, metavar="N",
                        help="exit after N records")
    parser.add_argument("--timeout-ms", type=non_negative_int, metavar="T",
                        help="exit when no record arrives for T milliseconds")
    parser.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"),
                        default="read_uncommitted",
                        help="read_committed: only records of committed transactions (default: "
                             "read_uncommitted, every record)")
    parser.add_argument("--format", choices=("text", "json"), default="text",
                        help="text: the value per line (default); json: one object per record")
    for field in ("timestamp", "partition", "offset", "headers", "key"):
        parser.add_argument(f"--print-{field}", action="store_true",
                            help=f"text format: print the {field} before the value")
    add_broker_arguments(parser)
    parser.set_defaults(run=run)


def _offset(text: str) -> int | str:
    if text in ("earliest", "latest"):
        return text
    return non_negative_int(text)


# --- formatting -------------------------------------------------------------------------------

_NULL = b"null"


def record_json(r) -> dict:
    """The ``--format json`` object for one record."""
    return {"topic": r.topic, "partition": r.partition, "offset": r.offset,
            "timestamp": r.timestamp_ms, "timestampType": timestamp_type_name(r.timestamp_type),
            "key": json_bytes(r.key), "value": json_bytes(r.value),
            "headers": [{"key": k, "value": json_bytes(v)} for k, v in r.headers]}


def _renderer(args: argparse.Namespace):
    """A function turning a list of records into the bytes to print for them."""
    if args.format == "json":
        def as_json(records) -> bytes:
            return "".join(json_line(record_json(r)) for r in records).encode("ascii")
        return as_json
    if not (args.print_timestamp or args.print_partition or args.print_offset
            or args.print_headers or args.print_key):
        def values(records) -> bytes:
            return b"\n".join([_NULL if r.value is None else r.value for r in records]) + b"\n"
        return values

    def line(r) -> bytes:
        """Kafka's DefaultMessageFormatter: tab-separated fields, then the value."""
        parts = []
        if args.print_timestamp:
            parts.append(f"{timestamp_type_name(r.timestamp_type)}:{r.timestamp_ms}".encode())
        if args.print_partition:
            parts.append(f"Partition:{r.partition}".encode())
        if args.print_offset:
            parts.append(f"Offset:{r.offset}".encode())
        if args.print_headers:
            parts.append(b",".join(k.encode() + b":" + (_NULL if v is None else bytes(v))
                                   for k, v in r.headers) or b"NO_HEADERS")
        if args.print_key:
            parts.append(_NULL if r.key is None else bytes(r.key))
        parts.append(_NULL if r.value is None else bytes(r.value))
        return b"\t".join(parts) + b"\n"

    def fields(records) -> bytes:
        return b"".join([line(r) for r in records])
    return fields


# --- running ----------------------------------------------------------------------------------

def _terminate(signum, frame):
    raise KeyboardInterrupt            # SIGTERM stops like Ctrl-C: print what was read, exit 0


def run(args: argparse.Namespace) -> int:
    from mq.client.consumer import Consumer
    from mq.errors import OffsetOutOfRangeError

    if args.group is not None:
        if args.partition is not None:
            raise ValueError("--group and --partition cannot be used together: the broker "
                             "assigns a group member its partitions")
        for flag, value in (("--offset", args.offset), ("--from-datetime", args.from_datetime)):
            if value is not None:
                raise ValueError(f"--group and {flag} cannot be used together: a group starts "
                                 "at its committed offsets (move them with 'mq groups "
                                 "reset-offsets')")
        return _run_group(args, _renderer(args))
    if args.offset is not None and args.partition is None:
        raise ValueError("--offset needs --partition P (offsets belong to one partition)")
    start_ms = None if args.from_datetime is None else parse_datetime(args.from_datetime)
    render = _renderer(args)
    topic = args.topic
    previous = signal.signal(signal.SIGTERM, _terminate)
    count = 0
    interrupted = False
    try:
        # Reset to the beginning (partitions added later, positions deleted by retention);
        # the initial positions are set explicitly below.
        with Consumer(topic, **client_options(args), auto_offset_reset="earliest",
                      isolation_level=args.isolation_level) as consumer:
            if args.partition is not None:
                consumer.assign(topic_partitions(consumer, topic, [args.partition]))
            tps = sorted(consumer.assignment())
            if args.from_beginning or args.offset == "earliest":
                consumer.seek_to_beginning()
            elif args.offset is not None and args.offset != "latest":
                tp = tps[0]
                start = consumer.beginning_offsets([tp])[tp]
                end = consumer.end_offsets([tp])[tp]
                if not start <= args.offset <= end:
                    raise OffsetOutOfRangeError(args.offset, start, end,
                                                f"{tp.topic}-{tp.partition}")
                consumer.seek(tp, args.offset)
            elif start_ms is not None:
                found = consumer.offsets_for_times({tp: start_ms for tp in tps})
                for tp in tps:
                    if found[tp] is None:
                        consumer.seek_to_end(tp)
                    else:
                        consumer.seek(tp, found[tp][0])
            else:
                consumer.seek_to_end()
            count, interrupted = _consume(consumer, args, render)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _report(count, topic, interrupted)
    return 0


def _report(count: int, topic: str, interrupted: bool) -> None:
    sys.stderr.write(f"consumed {plural(count, 'record')} from {topic}"
                     f"{' (interrupted)' if interrupted else ''}\n")


def _run_group(args: argparse.Namespace, render) -> int:
    """``--group``: subscribe, print, commit what was printed, leave the group."""
    from mq.client.consumer import Consumer
    from mq.errors import UnknownTopicOrPartitionError

    topic = args.topic
    stop: list[int] = []

    def request_stop(signum, frame) -> None:
        stop.append(signum)

    options = client_options(args)
    # On a cluster the command commits what it printed itself: librdkafka's auto-commit at
    # close commits the positions it stored at the last poll, which would undo the final
    # commit of the records that poll returned.
    cluster = on_cluster(options)
    previous = {sig: signal.signal(sig, request_stop) for sig in _STOP_SIGNALS}
    try:
        with Consumer(group_id=args.group, **options, enable_auto_commit=not cluster,
                      auto_offset_reset="earliest" if args.from_beginning else "latest",
                      isolation_level=args.isolation_level) as consumer:
            # A group may subscribe to a topic that does not exist yet; here that is a typo.
            if consumer.partitions_for_topic(topic) is None:
                raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
            consumer.subscribe([topic])
            positions = _Positions(consumer, _COMMIT_EVERY_S if cluster else None)
            count = _consume_group(consumer, args, render, stop, positions)
            consumer.commit(positions.final())   # after the last printed record
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _report(count, topic, bool(stop))
    return 0


def _consume(consumer, args: argparse.Namespace, render) -> tuple[int, bool]:
    """Poll and print until --max-messages, --timeout-ms or Ctrl-C; (records, interrupted).

    Each poll's records go out in one write with SIGINT and SIGTERM blocked, and are counted
    in the same breath: a signal lands between writes, so the count is exactly what was
    printed (stdout may be unbuffered, PYTHONUNBUFFERED=1)."""
    limit, timeout_ms = args.max_messages, args.timeout_ms
    out = sys.stdout.buffer
    printed = [0]
    try:
        while limit is None or printed[0] < limit:
            want = 500 if limit is None else min(500, limit - printed[0])
            batch = consumer.poll(timeout_ms=60_000 if timeout_ms is None else timeout_ms,
                                  max_records=want)
            if not batch:
                if timeout_ms is not None:
                    break
                continue
            records = [r for rs in batch.values() for r in rs]
            emit(out, render(records), len(records), printed)
    except KeyboardInterrupt:
        return printed[0], True
    return printed[0], False


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
_STOP_CHECK_MS = 200                  # --group: how often an idle poll looks at the stop flag
_COMMIT_EVERY_S = 5.0                 # auto_commit_interval_ms's default


class _Positions:
    """What a group member commits on exit: for each assigned partition the offset after its
    last printed record, or where it started if none was printed. Kafka's consumer gives
    every assigned partition a position in poll; mq's consumers only the partitions they
    read from, and librdkafka's resolves an unread one anew each time it is asked (its end
    then, with auto.offset.reset=latest). Without the start position a partition is not
    committed, or committed at a later end, and the next run would skip what arrived there
    meanwhile. So each assigned partition's position is asked once, when it is first seen.

    ``commit_every_s``: commit these offsets that often (a consumer without auto-commit);
    a commit a rebalance refused is left to the next one."""

    def __init__(self, consumer, commit_every_s: float | None = None) -> None:
        self.consumer = consumer
        self.started: dict = {}                 # tp -> position when first seen assigned
        self.printed: dict = {}                 # (topic, partition) -> after its last printed
        self.every = commit_every_s
        self.due = None if commit_every_s is None else time.monotonic() + commit_every_s

    def track(self, records) -> None:
        """After a poll: note the printed ``records`` and the partitions assigned now."""
        for r in records:
            self.printed[(r.topic, r.partition)] = r.offset + 1
        assigned = self.consumer.assignment()
        for tp in set(self.started) - assigned:     # revoked: another member's now
            del self.started[tp]
            self.printed.pop(tp, None)
        for tp in assigned - set(self.started):
            self.started[tp] = self.consumer.position(tp)
        if self.due is not None and time.monotonic() >= self.due:
            from mq.errors import CommitFailedError
            with contextlib.suppress(CommitFailedError):
                self.consumer.commit(self.final())
            self.due = time.monotonic() + self.every

    def final(self) -> dict:
        """``{tp: offset to commit}`` for the partitions assigned now."""
        assigned = self.consumer.assignment()
        return {tp: self.printed.get(tp, start)
                for tp, start in self.started.items() if tp in assigned}


def _consume_group(consumer, args: argparse.Namespace, render, stop: list,
                   positions: _Positions) -> int:
    """Like ``_consume``, but the stop signals only append to ``stop``, which is checked
    between polls (so an idle poll waits at most 200 ms at a time): records that ``poll``
    returned, and so moved the positions the final commit stores, are always printed.
    Returns the number of records printed."""
    limit, timeout_ms = args.max_messages, args.timeout_ms
    out = sys.stdout.buffer
    printed = [0]
    idle_until = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    while not stop and (limit is None or printed[0] < limit):
        wait_ms: float = _STOP_CHECK_MS
        if idle_until is not None:
            wait_ms = min(wait_ms, max(0.0, (idle_until - time.monotonic()) * 1000))
        want = 500 if limit is None else min(500, limit - printed[0])
        batch = consumer.poll(timeout_ms=wait_ms, max_records=want)
        records = [r for rs in batch.values() for r in rs]
        if records:
            emit(out, render(records), len(records), printed)
            if timeout_ms is not None:
                idle_until = time.monotonic() + timeout_ms / 1000
        positions.track(records)
        if not records and idle_until is not None and time.monotonic() >= idle_until:
            break
    return printed[0]


def _wait_writable(out) -> None:
    """Block until ``out`` takes more bytes (poll, not select: select() fails for a
    descriptor >= 1024)."""
    poller = select.poll()
    poller.register(out.fileno(), select.POLLOUT)
    poller.poll()


def emit(out, data: bytes, n: int, printed: list) -> None:
    """Write all of ``data`` and add ``n`` to ``printed[0]``, with stop signals held back."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        view = memoryview(data)
        while view:
            written = out.write(view)             # a raw FileIO may write part of it
            if written is None:                   # non-blocking stdout, full: wait
                _wait_writable(out)
                continue
            view = view[written:]
        out.flush()
        printed[0] += n
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
