"""``mq migrate``: copy the running broker's topics, records and committed group offsets into
an Apache Kafka cluster (``mq.migrate`` has the design; this module parses and prints).

stdout: one line per partition copied (or to copy, with ``--dry-run``), one per group
partition moved; ``--json``: one object per line instead. stderr: the partition being copied,
its offsets and records (a line that rewrites itself on a terminal; off a terminal, a line
every few seconds), and a refusal as one ``mq: error:`` line (exit status 1).
"""

from __future__ import annotations

import argparse
import sys

from mq.cli import json_line
from mq.cli.common import (
    ProgressLine,
    add_socket_argument,
    formatter,
    parse_key_values,
    plural,
    positive_int,
    table,
)
from mq.client.kafka.config import read_properties
from mq.errors import MQError
from mq.protocol.paths import path_argument

__all__ = ["add_parser", "run"]


DESCRIPTION = """\
Copy the mq broker's topics, their records and its groups' committed offsets into an Apache
Kafka cluster (at BOOTSTRAP, e.g. kafka1:9092,kafka2:9092), so that each group continues on
Kafka at the next record it has not processed: none lost, none read twice.

Each topic is created on Kafka with the same partition count and the configs that matter
(cleanup.policy, retention.ms, retention.bytes, segment.bytes, max.message.bytes, ...; the
cluster's default replication factor unless --replication-factor). Records keep partition,
order, key, value, headers and timestamp; aborted transactions and transaction markers are
not copied. Each gains one header, mq.source.offset (its offset on mq), which lets a run that
was interrupted be run again: it continues after the last record copied. A non-empty Kafka
partition that mq migrate did not write is refused. mq is only read.

A group's committed offset becomes the Kafka offset of the first copied record at or after
it, written only once the group has no live consumers on either side and no open
transaction on mq holds offsets. Records alone (--no-groups) can be copied while producers
and consumers still run, and a later run copies what came since: copy first, then stop the
clients and run again for the rest and the offsets."""

EPILOG = """\
--to-config takes librdkafka's client properties: security.protocol, sasl.mechanism,
sasl.username, sasl.password, ssl.ca.location, ... (a Java client.properties' SASL JAAS line
does not apply); --to-config-file (or --command-config, as the other commands call it) reads
them from a file of key=value lines.

examples:
  mq migrate --to kafka1:9092 --dry-run                      what would be copied
  mq migrate --to kafka1:9092 --no-groups                    copy records; clients keep running
  mq migrate --to kafka1:9092                                stop clients first: the rest, offsets
  mq migrate --to kafka1:9093 --to-config security.protocol=SASL_SSL \\
      --to-config sasl.mechanism=SCRAM-SHA-512 --to-config-file creds.properties
  mq migrate --to kafka1:9092 --topic orders --group billing --replication-factor 3 \\
      --topic-config min.insync.replicas=2

exit status: 0 when done; 1 when refused or failed (one 'mq: error:' line; run it again once
the cause is fixed: it continues where it stopped); 2 for bad arguments."""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("migrate", help="copy topics, records and group offsets "
                                   "into a Kafka cluster", description=DESCRIPTION,
                                   epilog=EPILOG, formatter_class=formatter)
    parser.add_argument("--to", required=True, metavar="BOOTSTRAP",
                        help="the Kafka cluster's bootstrap servers (host:port,...)")
    parser.add_argument("--topic", action="append", metavar="T",
                        help="copy topic T (repeatable; default: every topic but __*)")
    parser.add_argument("--group", action="append", metavar="G",
                        help="move group G's offsets (repeatable; default: every group)")
    parser.add_argument("--no-groups", action="store_true",
                        help="copy records only; move no group offsets")
    parser.add_argument("--dry-run", action="store_true",
                        help="check everything and print what would be copied; write nothing")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--to-config", action="append", metavar="KEY=VALUE",
                        help="a librdkafka client property for the Kafka cluster (repeatable)")
    parser.add_argument("--to-config-file", "--command-config", metavar="PATH",
                        type=path_argument, help="a client.properties file of key=value "
                        "client properties (--to-config wins)")
    parser.add_argument("--replication-factor", type=positive_int, metavar="N",
                        help="of the topics created (default: the cluster's)")
    parser.add_argument("--topic-config", action="append", metavar="KEY=VALUE",
                        help="a config of every topic created, over the copied ones "
                             "(repeatable)")
    parser.add_argument("--timeout", type=positive_int, default=30, metavar="SECONDS",
                        help="wait this long for each request to Kafka (default 30)")
    add_socket_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from mq.migrate import Migration
        from mq.migrate.target import Target
    except ImportError as err:
        if err.name != "confluent_kafka":
            raise
        raise MQError("mq migrate needs confluent-kafka: pip install 'mq[kafka]'") from err
    if args.group and args.no_groups:
        raise ValueError("--group and --no-groups exclude each other (see 'mq migrate --help')")
    config = read_properties(args.to_config_file) if args.to_config_file else {}
    config.update(parse_key_values(args.to_config, "--to-config"))
    topic_config = parse_key_values(args.topic_config, "--topic-config")
    with Target(args.to, config, timeout=args.timeout) as target, \
            Migration(args.socket, target, args.replication_factor or -1,
                      topic_config) as migration:
        plans, groups = migration.plan(args.topic, args.group, with_groups=not args.no_groups)
        if args.dry_run:
            _print_plan(plans, groups, args.json)
            return 0
        progress = _Progress()
        try:
            copied = migration.copy(plans, progress)
        finally:
            progress.done()
        translated = migration.translate(groups)
        migration.commit(translated)
    _print_result(plans, copied, groups, translated, args.json)
    return 0


def _print_plan(plans, groups, as_json: bool) -> None:
    rows = [(part, plan) for plan in plans for part in plan.partitions]
    if as_json:
        sys.stdout.write("".join(json_line({
            "topic": p.topic, "partition": p.partition, "from_offset": p.resume,
            "to_offset": p.source_end, "create": plan.create, "config": plan.config,
            "target_end": p.target_end}) for p, plan in rows))
        sys.stdout.write("".join(json_line({
            "group": g.group, "topic": t, "partition": p, "source_offset": o})
            for g in groups for (t, p), o in g.offsets.items()))
        return
    for plan in plans:
        if plan.create:
            configs = " ".join(f"{k}={v}" for k, v in sorted(plan.config.items()))
            sys.stdout.write(f"would create {plan.name} ({len(plan.partitions)} partitions) "
                             f"with {configs}\n")
    sys.stdout.write(table(
        ("TOPIC", "PARTITION", "FROM-OFFSET", "TO-OFFSET", "AT-MOST", "KAFKA-END"),
        [(p.topic, p.partition, p.resume, p.source_end, max(0, p.source_end - p.resume),
          p.target_end) for p, _ in rows]))
    if groups:
        sys.stdout.write(table(("GROUP", "TOPIC", "PARTITION", "MQ-OFFSET"),
                               [(g.group, t, p, o) for g in groups
                                for (t, p), o in g.offsets.items()]))
    most = sum(max(0, p.source_end - p.resume) for p, _ in rows)
    sys.stdout.write(f"would copy up to {plural(most, 'record')} of "
                     f"{plural(len(plans), 'topic')} and move the offsets of "
                     f"{plural(len(groups), 'group')} (AT-MOST counts offsets: aborted records "
                     f"and transaction markers are not copied)\n")


def _print_result(plans, copied, groups, translated, as_json: bool) -> None:
    parts = [p for plan in plans for p in plan.partitions]
    moves = [(g.group, t, p, o, new.offsets[t, p]) for g, new in zip(groups, translated)
             for (t, p), o in g.offsets.items()]
    if as_json:
        sys.stdout.write("".join(json_line({
            "topic": p.topic, "partition": p.partition, "from_offset": p.resume,
            "to_offset": p.source_end, "copied": copied[p.topic, p.partition],
            "target_end": p.target_end + copied[p.topic, p.partition]}) for p in parts))
        sys.stdout.write("".join(json_line({
            "group": g, "topic": t, "partition": p, "source_offset": o, "target_offset": n})
            for g, t, p, o, n in moves))
        return
    sys.stdout.write(table(
        ("TOPIC", "PARTITION", "FROM-OFFSET", "TO-OFFSET", "COPIED", "KAFKA-END"),
        [(p.topic, p.partition, p.resume, p.source_end, copied[p.topic, p.partition],
          p.target_end + copied[p.topic, p.partition]) for p in parts]))
    if moves:
        sys.stdout.write(table(("GROUP", "TOPIC", "PARTITION", "MQ-OFFSET", "KAFKA-OFFSET"),
                               moves))
    gone = [p for p in parts if p.gone]
    for p in gone:
        sys.stderr.write(f"mq: warning: {p.topic}-{p.partition}: {p.gone} offsets after the "
                         f"last copied were deleted by mq's retention before this run\n")
    sys.stdout.write(f"copied {plural(sum(copied.values()), 'record')} of "
                     f"{plural(len(plans), 'topic')}; moved the offsets of "
                     f"{plural(len(groups), 'group')}\n")


class _Progress(ProgressLine):
    """``progress(partition, position, records)`` for ``Migration.copy``, on stderr."""

    def __call__(self, part, position: int, records: int) -> None:
        if self.due():
            done = position - part.resume
            total = max(part.source_end - part.resume, 1)
            self.show(f"copying {part.topic}-{part.partition}: offset {position} of "
                      f"{part.source_end} ({100 * done // total}%), {records} records")
