"""``mq workers``: run a worker pool in the foreground (``workers.run``), move dead letters back
(``workers.redrive``), and look at a running pool's counters (``workers.read_stats``).

``run`` is meant for a terminal or a service manager: it logs to stderr, drains and exits 0 on
SIGTERM or SIGINT (a second one forces the exit), restarts its children one by one on SIGHUP,
and tells systemd READY=1 once every child has joined its group.
"""

from __future__ import annotations

import argparse
import os
import sys

from mq.cli import json_line
from mq.cli.common import (
    add_command_group,
    add_socket_argument,
    formatter,
    non_negative_int,
    positive_int,
    socket_of,
    table,
)
from mq.errors import MQError

__all__ = ["add_parser"]

DESCRIPTION = """\
Worker pools: a supervised pool of processes, each a member of one consumer group, calling a
Python handler for every record, with retries, a dead-letter topic and exactly-once outputs."""

EPILOG = """\
examples:
  mq workers run jobs:handle --topic jobs --group billing --processes 4 \\
      --dead-letter-topic jobs.dlq
  mq workers redrive jobs.dlq --to jobs
  mq workers stats billing"""

RUN_EPILOG = """\
MODULE:FUNCTION names the handler: a function of one mq.Record (plain or async def), imported
with the current directory on sys.path, in the supervisor (to check it) and again in every
child. It may return outputs: a list of (topic, key, value) tuples, produced by the pool.

A handler that raises is retried in place (--max-retries, exponential backoff from
--retry-backoff-ms, with jitter); after the last attempt the record goes to
--dead-letter-topic with headers mq.dlq.topic, .partition, .offset, .error, .attempts, .group
and .timestamp (without one it is logged and skipped). A handler running longer than
--handler-timeout-s has its child killed and restarted; that counts as a failed attempt.

signals: SIGTERM/SIGINT drain (finish the records in hand, commit, leave the group; at most
--drain-timeout-s) and exit 0; a second one kills the children and exits 128+signal.
SIGHUP restarts the children one at a time, importing the handler anew.

exit status: 0 after a drain; 1 when every child is stopped by a crash loop, or on an error
(no broker, unknown topic); 2 for a bad argument or a handler that cannot be imported.

On a Kafka cluster (--bootstrap-server), pools of one --group on several hosts form one
consumer group; mq workers stats still shows this host's pool.

examples:
  mq workers run jobs:handle --topic jobs --group billing
  mq workers run jobs:handle --topic jobs --group billing --bootstrap-server k1:9092,k2:9092
  mq workers run etl.steps:enrich --topic raw --group enrich --processes 8 --exactly-once
  mq workers run jobs:handle --topic jobs --group billing --log-format json 2>>pool.log
  mq workers run jobs:handle --topic jobs --group billing --metrics 127.0.0.1:9401"""

REDRIVE_EPILOG = """\
Each dead letter after the redrive cursor, up to the topic's end when the command starts, is
produced to --to (default: the topic it came from, its mq.dlq.topic header) with its key,
value and own headers (the mq.dlq.* headers removed). The cursor is group
mq-workers-redrive.<DLQ_TOPIC> (or --group); it moves in the same transaction as the records,
so a redrive run again sends nothing twice. Prints one line per record moved.

examples:
  mq workers redrive jobs.dlq --to jobs
  mq workers redrive jobs.dlq --dry-run --json"""

STATS_EPILOG = """\
Reads the counter tables of the running pools (of GROUP, or all): per slot the child's pid,
state, how many times it was started, records handled, retried attempts, failed attempts,
dead-lettered, skipped, seconds in the handler, hang kills, deaths and records committed.
--json prints one object per slot per line. --openmetrics prints the metrics a pool's
--metrics endpoint serves (mq_worker_handled_records_total and the rest, labels group and
slot), once; --prometheus the same in Prometheus' text format, for node_exporter's textfile
collector.

examples:
  mq workers stats
  mq workers stats billing --json
  mq workers stats --prometheus > /var/lib/node_exporter/mq-workers.prom.$$ &&
      mv /var/lib/node_exporter/mq-workers.prom.$$ /var/lib/node_exporter/mq-workers.prom"""


def add_parser(subparsers) -> None:
    commands = add_command_group(subparsers, "workers", "run, redrive or stats",
                                 help="run a worker pool, redrive dead letters, show counters",
                                 description=DESCRIPTION, epilog=EPILOG)
    run = commands.add_parser("run", help="run a worker pool in the foreground",
                              description="Run a pool of processes calling MODULE:FUNCTION for "
                                          "every record of the topics.",
                              epilog=RUN_EPILOG, formatter_class=formatter)
    run.add_argument("handler", metavar="MODULE:FUNCTION", help="the handler, e.g. jobs:handle")
    run.add_argument("--topic", action="append", required=True, metavar="TOPIC",
                     help="input topic (repeat for more)")
    run.add_argument("--group", required=True, metavar="GROUP", help="consumer group id")
    run.add_argument("--processes", type=positive_int, metavar="N",
                     help="children (default: the CPU count)")
    run.add_argument("--max-retries", type=non_negative_int, default=3, metavar="N",
                     help="retries after the first attempt (default 3)")
    run.add_argument("--retry-backoff-ms", type=_non_negative_float, default=100.0,
                     metavar="MS", help="first retry delay, doubled each time (default 100)")
    run.add_argument("--dead-letter-topic", metavar="TOPIC",
                     help="where records go after their last failed attempt")
    run.add_argument("--exactly-once", action="store_true",
                     help="outputs and consumed offsets commit in one transaction")
    run.add_argument("--handler-timeout-s", type=_positive_float, default=300.0, metavar="S",
                     help="kill a child whose handler runs longer (default 300)")
    run.add_argument("--drain-timeout-s", type=_non_negative_float, default=30.0, metavar="S",
                     help="how long a drain may take (default 30)")
    run.add_argument("--commit-interval-ms", type=_non_negative_float, default=100.0,
                     metavar="MS", help="how often offsets (and, exactly once, transactions) "
                                        "commit (default 100)")
    run.add_argument("--concurrency", type=positive_int, default=16, metavar="N",
                     help="records in flight per child, async handlers (default 16)")
    run.add_argument("--ordering", choices=("key", "partition"), default="key",
                     help="async handlers: keep the order per key (default) or per partition")
    run.add_argument("--transactional-id-prefix", metavar="PREFIX",
                     help="--exactly-once: transactional ids PREFIX-<slot> (default "
                          "GROUP-worker); two pools of one group need different ones")
    run.add_argument("--log-format", choices=("plain", "json"), default="plain",
                     help="stderr lines: plain (default) or one JSON object each")
    run.add_argument("--log-level", default="INFO", metavar="LEVEL",
                     help="DEBUG, INFO (default), WARNING, ERROR")
    run.add_argument("--stats-file", metavar="PATH",
                     help="the counter table (default /dev/shm/mq-workers-GROUP-PID.stats)")
    run.add_argument("--metrics", metavar="HOST:PORT",
                     help="serve the counters as OpenMetrics at http://HOST:PORT/metrics "
                          "(port 0: a free one, logged)")
    add_socket_argument(run)
    _add_cluster_arguments(run)
    run.set_defaults(run=run_pool)

    redrive = commands.add_parser("redrive", help="move dead letters back to a topic",
                                  description="Produce the dead letters of DLQ_TOPIC again, "
                                              "each once.",
                                  epilog=REDRIVE_EPILOG, formatter_class=formatter)
    redrive.add_argument("dlq", metavar="DLQ_TOPIC", help="the dead-letter topic")
    redrive.add_argument("--to", metavar="TOPIC",
                         help="target topic (default: each record's mq.dlq.topic)")
    redrive.add_argument("--group", metavar="GROUP", help="the cursor's group id")
    redrive.add_argument("--max-messages", type=positive_int, metavar="N",
                         help="move at most N records")
    redrive.add_argument("--dry-run", action="store_true", help="list, move nothing")
    redrive.add_argument("--json", action="store_true", help="one JSON object per record")
    add_socket_argument(redrive)
    _add_cluster_arguments(redrive)
    redrive.set_defaults(run=run_redrive)

    stats = commands.add_parser("stats", help="counters of the running pools",
                                description="Print the per-child counters of running pools.",
                                epilog=STATS_EPILOG, formatter_class=formatter)
    stats.add_argument("group", metavar="GROUP", nargs="?", help="only this group's pools")
    stats.add_argument("--file", metavar="PATH", help="read this counter table")
    shown = stats.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="one JSON object per slot")
    shown.add_argument("--openmetrics", action="store_true",
                       help="the OpenMetrics text a pool's --metrics serves")
    shown.add_argument("--prometheus", action="store_true",
                       help="the same in Prometheus' text format (node_exporter's textfile "
                            "collector)")
    stats.set_defaults(run=run_stats)


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT[,...]",
                        help="a Kafka cluster instead of the local broker (default: "
                             "$MQ_BOOTSTRAP_SERVERS when --socket is not given)")
    parser.add_argument("--command-config", metavar="FILE",
                        help="the cluster's client properties (security.protocol, sasl.*, "
                             "ssl.*...; librdkafka's names), as Kafka's tools take them")


def _broker(args: argparse.Namespace) -> dict:
    """The pool's or redrive's ``socket``, ``bootstrap_servers`` and ``kafka_config``."""
    from mq.client.kafka.config import read_properties
    if args.command_config is not None and args.bootstrap_server is None:
        raise ValueError("--command-config is for a Kafka cluster: give --bootstrap-server too")
    return {"socket": socket_of(args), "bootstrap_servers": args.bootstrap_server,
            "kafka_config": None if args.command_config is None
            else read_properties(args.command_config)}


def _float(text: str, low: float, strict: bool) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from err
    if value < low or (strict and value == low):
        raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low:g}, got "
                                         f"{text}")
    return value


def _positive_float(text: str) -> float:
    return _float(text, 0.0, strict=True)


def _non_negative_float(text: str) -> float:
    return _float(text, 0.0, strict=False)


def run_pool(args: argparse.Namespace) -> int:
    import workers
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())          # MODULE is found from the current directory
    try:
        ref = workers.config.HandlerRef.parse(args.handler)
        workers.config.load_handler(ref)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"cannot import handler {args.handler}: {type(err).__name__}: "
                         f"{err}") from err
    return workers.run(args.handler, topics=args.topic, group_id=args.group,
                       processes=args.processes, max_retries=args.max_retries,
                       retry_backoff_ms=args.retry_backoff_ms,
                       dead_letter_topic=args.dead_letter_topic,
                       exactly_once=args.exactly_once,
                       handler_timeout_s=args.handler_timeout_s,
                       drain_timeout_s=args.drain_timeout_s, **_broker(args),
                       concurrency=args.concurrency, ordering=args.ordering,
                       commit_interval_ms=args.commit_interval_ms,
                       transactional_id_prefix=args.transactional_id_prefix,
                       log_format=args.log_format, log_level=args.log_level,
                       stats_path=args.stats_file, metrics_address=args.metrics)


def run_redrive(args: argparse.Namespace) -> int:
    import workers
    moved = workers.redrive(args.dlq, to=args.to, group_id=args.group,
                            max_messages=args.max_messages, dry_run=args.dry_run,
                            **_broker(args))
    for m in moved:
        if args.json:
            sys.stdout.write(json_line({"topic": args.dlq, **m, "dryRun": args.dry_run}))
        else:
            sys.stdout.write(f"{args.dlq}-{m['partition']}@{m['offset']} -> {m['to']}"
                             f"{' (dry run)' if args.dry_run else ''}: {m['error']}\n")
    if not args.json:
        sys.stderr.write(f"{'would move' if args.dry_run else 'moved'} {len(moved)} "
                         f"record(s)\n")
    return 0


def _no_pool(group: str | None) -> None:
    """Say that no pool (of ``group``) runs: for a named group an error (exit status 1), naming
    the pid of a pool of it that was killed, if one left its table behind; without a group a
    note on stderr (nothing to show is an answer)."""
    from workers.stats import find_ended, stats_dir
    if group is None:
        sys.stderr.write(f"mq: no worker pool is running (none has a counter table in "
                         f"{stats_dir()})\n")
        return
    ended = find_ended(group)
    if ended:
        pid = ended[-1].rsplit("-", 1)[-1].removesuffix(".stats")
        raise MQError(f"no worker pool of group {group!r} is running: its pool (pid {pid}) "
                      "has ended")
    raise MQError(f"no worker pool of group {group!r} is running (none has a counter table "
                  f"in {stats_dir()}; 'mq workers stats' lists the running pools)")


_STATS_COLUMNS = ("pid", "state", "incarnations", "handled", "retried", "failed",
                  "dead_lettered", "skipped", "handler_seconds", "hang_kills", "deaths",
                  "committed")


def run_stats(args: argparse.Namespace) -> int:
    import workers
    paths = [args.file] if args.file else workers.find_stats(args.group)
    if not paths:
        _no_pool(args.group)
    if args.openmetrics or args.prometheus:
        from workers.metrics import exposition
        sys.stdout.buffer.write(exposition(paths, openmetrics=args.openmetrics))
        return 0
    rows = []
    for path in paths:
        snap = workers.read_stats(path)
        for s in snap["slots"]:
            if args.json:
                sys.stdout.write(json_line({"group": snap["group"], "file": path, **s}))
            else:
                rows.append((snap["group"], s["slot"], *(
                    f"{s[c]:.3f}" if c == "handler_seconds" else s[c] for c in _STATS_COLUMNS)))
    if rows:
        sys.stdout.write(table(("GROUP", "SLOT", "PID", "STATE", "STARTS", "HANDLED", "RETRIED",
                                "FAILED", "DLQ", "SKIPPED", "HANDLER_S", "HANG_KILLS",
                                "DEATHS", "COMMITTED"), rows))
    return 0
