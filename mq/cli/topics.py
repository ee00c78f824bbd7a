"""``mq topics``: Kafka's kafka-topics over ``mq.Admin`` (create, list, describe, alter, delete)."""

from __future__ import annotations

import argparse
import contextlib
import sys

from mq.broker.space import format_bytes
from mq.cli import json_line
from mq.cli.common import (
    add_broker_arguments,
    add_command_group,
    client_options,
    formatter,
    on_cluster,
    parse_key_values,
    plural,
    positive_int,
)
from mq.errors import InvalidPartitionsError
from mq.protocol.limits import MAX_PARTITIONS_PER_TOPIC, check_partition_count

__all__ = ["add_parser", "run_alter", "run_create", "run_delete", "run_describe", "run_list"]

DESCRIPTION = """\
Create, list, describe, alter and delete topics on the running broker, or on a Kafka cluster
with --bootstrap-server (Kafka's kafka-topics).
Topic configs use Kafka's names: retention.ms, retention.bytes, segment.bytes, segment.ms,
max.message.bytes, cleanup.policy, message.timestamp.type, ..."""

EPILOG = """\
examples:
  mq topics create orders --partitions 6 --config retention.ms=604800000
  mq topics list
  mq topics describe orders
  mq topics alter orders --config retention.bytes=1073741824 --partitions 8
  mq topics delete orders"""

CREATE_EPILOG = """\
prints 'Created topic NAME with N partition(s).'; an existing topic, a bad name, an unknown
config key or a bad value is one 'mq: error:' line and exit status 1 (2 for bad flags).

examples:
  mq topics create orders --partitions 6
  mq topics create clicks --partitions 3 --config retention.ms=86400000 \\
      --config segment.bytes=104857600"""

DESCRIBE_EPILOG = """\
output:
  Topic: orders  TopicId: 6f1c...  PartitionCount: 2  Size: 2.1 MiB
    Partition: 0  StartOffset: 0  EndOffset: 1200  Size: 1.1 MiB
    Partition: 1  StartOffset: 0  EndOffset: 1185  Size: 1.0 MiB
  Configs (* = set on this topic; the others are the broker's defaults):
    * retention.ms=604800000
      segment.bytes=1073741824
    ...
  StartOffset is the log start offset (first readable record), EndOffset the high watermark
  (the offset the next record gets), Size the bytes of its segments on disk; OFFLINE: why a
  partition takes no writes. --json prints one object:
  {"topic", "topicId", "partitions": [{"partition", "startOffset", "endOffset", "sizeBytes",
   "offline"}, ...], "configs": {key: value, ...} (effective), "overrides": {key: value, ...}}
  On a Kafka cluster (--bootstrap-server) the header ends in ReplicationFactor: N instead of
  Size, and each partition shows Leader, Replicas and Isr (broker ids, as kafka-topics; Leader
  'none' when it has none) instead of Size; in --json "leader", "replicas" and "isr".

examples:
  mq topics describe orders
  mq topics describe orders --json | jq .partitions"""

ALTER_EPILOG = """\
--config changes (or adds) topic overrides; keys not named keep their values. --partitions
raises the partition count (it can only grow; keyed records may then map to other partitions).

examples:
  mq topics alter orders --config retention.ms=3600000
  mq topics alter orders --config retention.bytes=1073741824 --config segment.ms=600000
  mq topics alter orders --partitions 12"""


def add_parser(subparsers) -> None:
    commands = add_command_group(subparsers, "topics",
                                 "create, list, describe, alter or delete",
                                 help="create, list, describe, alter, delete topics",
                                 description=DESCRIPTION, epilog=EPILOG, cluster=True)

    create = commands.add_parser("create", help="create a topic",
                                 description="Create a topic with N partitions and optional "
                                             "config overrides.",
                                 epilog=CREATE_EPILOG, formatter_class=formatter)
    create.add_argument("name", metavar="NAME", help="topic name: letters, digits, '.', '_', "
                        "'-' (at most 249 characters)")
    create.add_argument("--partitions", type=partition_count, default=1, metavar="N",
                        help=f"number of partitions, 1 to {MAX_PARTITIONS_PER_TOPIC} "
                             "(default 1)")
    create.add_argument("--config", action="append", metavar="KEY=VALUE",
                        help="a topic config override, e.g. retention.ms=604800000 "
                             "(repeatable)")
    create.add_argument("--replication-factor", type=positive_int, metavar="N",
                        help="copies of each partition: a Kafka cluster's (default: its "
                             "default.replication.factor); mq keeps one copy, so only 1")
    add_broker_arguments(create)
    create.set_defaults(run=run_create)

    lst = commands.add_parser("list", help="list topic names, one per line",
                              description="Print the name of every topic, one per line, "
                                          "sorted.",
                              epilog="examples:\n  mq topics list\n  mq topics list | wc -l",
                              formatter_class=formatter)
    add_broker_arguments(lst)
    lst.set_defaults(run=run_list)

    describe = commands.add_parser("describe", help="partitions, offsets and configs of a topic",
                                   description="Print a topic's partitions with their start "
                                               "and end offsets, and its effective config\n"
                                               "with the topic's own overrides marked.",
                                   epilog=DESCRIBE_EPILOG, formatter_class=formatter)
    describe.add_argument("name", metavar="NAME", help="topic name")
    describe.add_argument("--json", action="store_true", help="print one JSON object")
    add_broker_arguments(describe)
    describe.set_defaults(run=run_describe)

    alter = commands.add_parser("alter", help="change topic configs or add partitions",
                                description="Change a topic's config overrides and/or raise "
                                            "its partition count.",
                                epilog=ALTER_EPILOG, formatter_class=formatter)
    alter.add_argument("name", metavar="NAME", help="topic name")
    alter.add_argument("--config", action="append", metavar="KEY=VALUE",
                       help="set a topic config override (repeatable)")
    alter.add_argument("--partitions", type=partition_count, metavar="N",
                       help=f"new (larger) total number of partitions, at most "
                            f"{MAX_PARTITIONS_PER_TOPIC}")
    add_broker_arguments(alter)
    alter.set_defaults(run=run_alter)

    delete = commands.add_parser("delete", help="delete a topic and all its data",
                                 description="Delete a topic: its partitions and all their "
                                             "records are removed.",
                                 epilog="examples:\n  mq topics delete orders",
                                 formatter_class=formatter)
    delete.add_argument("name", metavar="NAME", help="topic name")
    add_broker_arguments(delete)
    delete.set_defaults(run=run_delete)


def partition_count(text: str) -> int:
    """argparse type: a partition count a topic may have (``mq.protocol.limits``)."""
    try:
        return check_partition_count(int(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from err
    except InvalidPartitionsError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


@contextlib.contextmanager
def _partitions_flag(count: int):
    """Name ``--partitions N`` in a refusal of the count (the broker's message does not)."""
    try:
        yield
    except InvalidPartitionsError as err:
        raise InvalidPartitionsError(f"--partitions {count}: {err}") from err


def _admin(args: argparse.Namespace):
    from mq.client.admin import Admin
    return Admin(**client_options(args))


def run_create(args: argparse.Namespace) -> int:
    from mq.client.admin import Admin
    config = parse_key_values(args.config, "--config")
    options = client_options(args)
    extra = {}
    if on_cluster(options):
        extra["replication_factor"] = args.replication_factor or -1
    elif args.replication_factor not in (None, 1):
        raise ValueError(f"--replication-factor {args.replication_factor}: mq keeps one copy "
                         "of each partition (on one host), so only 1 is possible (a Kafka "
                         "cluster, --bootstrap-server, takes more)")
    with Admin(**options) as admin, _partitions_flag(args.partitions):
        meta = admin.create_topic(args.name, args.partitions, config, **extra)
    count = meta.get("partitions", args.partitions)
    sys.stdout.write(f"Created topic {args.name} with {plural(count, 'partition')}.\n")
    return 0


def run_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        names = admin.list_topics()
    sys.stdout.write("".join(name + "\n" for name in names))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        info = admin.describe_topic(args.name)
    config, overrides = info["config"], info["overrides"] or {}
    # A Kafka cluster gives each partition's leader, replicas and ISR instead of mq's sizes.
    partitions = _cluster_partitions(info) if "replicas" in info else _local_partitions(info)
    if args.json:
        sys.stdout.write(json_line({
            "topic": info["name"], "topicId": info["id"], "partitions": partitions,
            "configs": dict(sorted(config.items())), "overrides": dict(sorted(overrides.items())),
        }))
        return 0
    lines = [f"Topic: {info['name']}\tTopicId: {info['id']}\t"
             f"PartitionCount: {info['partitions']}\t{_topic_extra(info)}"]
    lines += ["\t" + "\t".join(f"{label}: {value}" for label, value in _partition_fields(p))
              for p in partitions]
    lines.append("Configs (* = set on this topic; the others are the broker's defaults):")
    for key in sorted(config):
        mark = "*" if key in overrides else " "
        lines.append(f"\t{mark} {key}={config[key]}")
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


def _local_partitions(info: dict) -> list[dict]:
    return [{"partition": p, "startOffset": start, "endOffset": end, "sizeBytes": size,
             "offline": offline}
            for p, ((start, end), size, offline) in enumerate(zip(
                info["offsets"], info["size_bytes"], info["offline"], strict=True))]


def _cluster_partitions(info: dict) -> list[dict]:
    return [{"partition": p, "startOffset": start, "endOffset": end, "leader": leader,
             "replicas": replicas, "isr": isr}
            for p, ((start, end), leader, replicas, isr) in enumerate(zip(
                info["offsets"], info["leaders"], info["replicas"], info["isr"], strict=True))]


def _topic_extra(info: dict) -> str:
    """The header's last field: the size on the local broker, the replication factor on a
    Kafka cluster."""
    if "replicas" in info:
        return f"ReplicationFactor: {max(map(len, info['replicas']), default=0)}"
    return f"Size: {format_bytes(sum(size or 0 for size in info['size_bytes']))}"


def _partition_fields(p: dict) -> list[tuple[str, object]]:
    """A partition's text line as (label, value): Kafka's kafka-topics labels for a cluster's
    leader, replicas and ISR ('none': no leader); mq's size and why it is offline."""
    fields = [("Partition", p["partition"]), ("StartOffset", p["startOffset"]),
              ("EndOffset", p["endOffset"])]
    if "replicas" in p:
        fields += [("Leader", "none" if p["leader"] is None else p["leader"]),
                   ("Replicas", ",".join(map(str, p["replicas"]))),
                   ("Isr", ",".join(map(str, p["isr"])))]
        return fields
    if p["sizeBytes"] is not None:
        fields.append(("Size", format_bytes(p["sizeBytes"])))
    if p["offline"]:
        fields.append(("OFFLINE", p["offline"]))
    return fields


def run_alter(args: argparse.Namespace) -> int:
    config = parse_key_values(args.config, "--config")
    if not config and args.partitions is None:
        raise ValueError("nothing to alter: give --config KEY=VALUE and/or --partitions N "
                         "(see 'mq topics alter --help')")
    with _admin(args) as admin, _partitions_flag(args.partitions):
        if config and args.partitions is not None:
            # Check the count first, so that a refused count does not leave the configs
            # half-applied (the broker checks again).
            current = admin.describe_topic(args.name)["partitions"]
            check_partition_count(args.partitions, current, args.name)
        if config:
            admin.alter_config(args.name, config)
        if args.partitions is not None:
            admin.create_partitions(args.name, args.partitions)
    changes = [f"{k}={v}" for k, v in config.items()]
    if args.partitions is not None:
        changes.append(f"partitions={args.partitions}")
    sys.stdout.write(f"Altered topic {args.name}: {', '.join(changes)}.\n")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_topic(args.name)
    sys.stdout.write(f"Deleted topic {args.name}.\n")
    return 0
