"""``mq topics``: Kafka's kafka-topics over ``mq.Admin`` (create, list, describe, alter, delete)."""

from __future__ import annotations

import argparse
import contextlib
import sys

from mq.broker.space import format_bytes
from mq.cli import json_line
from mq.cli.common import (
    add_command_group,
    add_socket_argument,
    formatter,
    parse_key_values,
    plural,
    socket_of,
)
from mq.errors import InvalidPartitionsError
from mq.protocol.limits import MAX_PARTITIONS_PER_TOPIC, check_partition_count

__all__ = ["add_parser", "run_alter", "run_create", "run_delete", "run_describe", "run_list"]

DESCRIPTION = """\
Create, list, describe, alter and delete topics on the running broker (Kafka's kafka-topics).
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
  Topic: orders  TopicId: 6f1c...  PartitionCount: 2
    Partition: 0  StartOffset: 0  EndOffset: 1200
    Partition: 1  StartOffset: 0  EndOffset: 1185
  Configs (* = set on this topic; the others are the broker's defaults):
    * retention.ms=604800000
      segment.bytes=1073741824
    ...
  StartOffset is the log start offset (first readable record), EndOffset the high watermark
  (the offset the next record gets). --json prints one object:
  {"topic", "topicId", "partitions": [{"partition", "startOffset", "endOffset"}, ...],
   "configs": {key: value, ...} (effective), "overrides": {key: value, ...}}

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
                                 description=DESCRIPTION, epilog=EPILOG)

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
    create.add_argument("--replication-factor", type=replication_factor, metavar="1",
                        help="Kafka's option, for its scripts: mq keeps one copy of each "
                             "partition, so only 1")
    add_socket_argument(create)
    create.set_defaults(run=run_create)

    lst = commands.add_parser("list", help="list topic names, one per line",
                              description="Print the name of every topic, one per line, "
                                          "sorted.",
                              epilog="examples:\n  mq topics list\n  mq topics list | wc -l",
                              formatter_class=formatter)
    add_socket_argument(lst)
    lst.set_defaults(run=run_list)

    describe = commands.add_parser("describe", help="partitions, offsets and configs of a topic",
                                   description="Print a topic's partitions with their start "
                                               "and end offsets, and its effective config\n"
                                               "with the topic's own overrides marked.",
                                   epilog=DESCRIBE_EPILOG, formatter_class=formatter)
    describe.add_argument("name", metavar="NAME", help="topic name")
    describe.add_argument("--json", action="store_true", help="print one JSON object")
    add_socket_argument(describe)
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
    add_socket_argument(alter)
    alter.set_defaults(run=run_alter)

    delete = commands.add_parser("delete", help="delete a topic and all its data",
                                 description="Delete a topic: its partitions and all their "
                                             "records are removed.",
                                 epilog="examples:\n  mq topics delete orders",
                                 formatter_class=formatter)
    delete.add_argument("name", metavar="NAME", help="topic name")
    add_socket_argument(delete)
    delete.set_defaults(run=run_delete)


def partition_count(text: str) -> int:
    """argparse type: a partition count a topic may have (``mq.protocol.limits``)."""
    try:
        return check_partition_count(int(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from err
    except InvalidPartitionsError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def replication_factor(text: str) -> int:
    """argparse type: Kafka's --replication-factor, which only 1 can satisfy on one host."""
    if text.strip() != "1":
        raise argparse.ArgumentTypeError(f"mq keeps one copy of each partition (on one host), "
                                         f"so only 1 is possible, got {text}")
    return 1


@contextlib.contextmanager
def _partitions_flag(count: int):
    """Name ``--partitions N`` in a refusal of the count (the broker's message does not)."""
    try:
        yield
    except InvalidPartitionsError as err:
        raise InvalidPartitionsError(f"--partitions {count}: {err}") from err


def _admin(args: argparse.Namespace):
    from mq.client.admin import Admin
    return Admin(socket_of(args))


def run_create(args: argparse.Namespace) -> int:
    config = parse_key_values(args.config, "--config")
    with _admin(args) as admin, _partitions_flag(args.partitions):
        meta = admin.create_topic(args.name, args.partitions, config)
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
    if args.json:
        sys.stdout.write(json_line({
            "topic": info["name"], "topicId": info["id"],
            "partitions": [{"partition": p, "startOffset": start, "endOffset": end,
                            "sizeBytes": size, "offline": offline}
                           for p, ((start, end), size, offline) in enumerate(zip(
                               info["offsets"], info["size_bytes"], info["offline"]))],
            "configs": dict(sorted(config.items())), "overrides": dict(sorted(overrides.items())),
        }))
        return 0
    total = sum(size or 0 for size in info["size_bytes"])
    lines = [(f"Topic: {info['name']}\tTopicId: {info['id']}\t"
              f"PartitionCount: {info['partitions']}\tSize: {format_bytes(total)}")]
    for p, ((start, end), size, offline) in enumerate(zip(info["offsets"], info["size_bytes"],
                                                          info["offline"])):
        line = f"\tPartition: {p}\tStartOffset: {start}\tEndOffset: {end}"
        if size is not None:
            line += f"\tSize: {format_bytes(size)}"
        if offline:
            line += f"\tOFFLINE: {offline}"
        lines.append(line)

    lines.append("Configs (* = set on this topic; the others are the broker's defaults):")
    for key in sorted(config):
        mark = "*" if key in overrides else " "
        lines.append(f"\t{mark} {key}={config[key]}")
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


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
