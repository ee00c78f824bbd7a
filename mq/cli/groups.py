"""``mq groups``: Kafka's kafka-consumer-groups over ``mq.Admin`` — list, describe and delete
consumer groups, and reset their committed offsets.

A committed offset is the group's *position* in a partition: the offset of the next record it
will process, so lag = log end offset - committed offset. ``reset-offsets`` computes new
offsets as Kafka's ConsumerGroupCommand does: from the log start / log end offsets, from
ListOffsets by time (the first offset whose timestamp is >= T, else the log end), or from the
committed offset shifted by N; explicit and shifted offsets are clamped into
[log start offset, log end offset]. Nothing changes unless ``--execute`` is given, and then only
while the group has no live member: a live member would overwrite the reset with its next
commit, which is why the broker refuses it too.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from decimal import Decimal

from mq.cli import json_line
from mq.cli.common import (
    DATETIME_HELP,
    add_broker_arguments,
    add_command_group,
    client_options,
    formatter,
    integer,
    non_negative_int,
    parse_datetime,
    plural,
    table,
    topic_partitions,
)

__all__ = ["add_parser", "clamp", "parse_duration", "parse_topic_spec", "partition_rows",
           "run_delete", "run_describe", "run_list", "run_reset_offsets"]

DESCRIPTION = """\
List, describe and delete consumer groups and reset their committed offsets on the running
broker, or on a Kafka cluster with --bootstrap-server (Kafka's kafka-consumer-groups). A group exists while it has live members or committed
offsets."""

EPILOG = """\
examples:
  mq groups list
  mq groups describe billing
  mq groups describe billing --json | jq 'select(.lag > 1000)'
  mq groups reset-offsets billing --topic orders --to-earliest --dry-run
  mq groups reset-offsets billing --topic orders:0,1 --shift-by -100 --execute
  mq groups delete billing"""

LIST_EPILOG = """\
output: a table GROUP STATE MEMBERS, one group a line (nothing when there is no group).
STATE is Kafka's: Stable (every member has its target assignment), Reconciling (partitions
are moving between members) or Empty (no live member, only committed offsets). --json prints
one object per group per line: {"group", "state", "members"}.

examples:
  mq groups list
  mq groups list --json"""

DESCRIBE_EPILOG = """\
output: a line with the group's state, then one row per partition the group has a committed
offset for or is assigned:
  GROUP  TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  LAG-SECONDS  MEMBER-ID  PID
CURRENT-OFFSET is the committed offset (the next record the group will process), LOG-END-OFFSET
the high watermark, LAG their difference, LAG-SECONDS the age of the oldest record not yet
processed; MEMBER-ID and PID name the member that owns the partition. '-' means none. Then the
members: MEMBER-ID INSTANCE-ID PID EPOCH STATE #PARTITIONS ASSIGNMENT (STATE Away: a static
member that is gone but keeps its partitions until its session times out).

--json prints only the partitions, one object per line: {"group", "topic", "partition",
"committedOffset", "endOffset", "lag", "lagSeconds", "memberId", "pid"} (null where the text
shows '-').

On a Kafka cluster (--bootstrap-server) members are named by client and host, as Kafka's
tool does: the partitions' columns end in MEMBER-ID HOST CLIENT-ID (no LAG-SECONDS, no PID;
a partition assigned but never committed shows '-' offsets), the members' are MEMBER-ID
INSTANCE-ID HOST CLIENT-ID #PARTITIONS ASSIGNMENT, and --json has "host" and "clientId" in
place of "lagSeconds" and "pid".

examples:
  mq groups describe billing
  mq groups describe billing --json"""

DELETE_EPILOG = """\
Deletes the group's committed offsets. Refused while the group has live members (stop the
consumers first: a consumer leaves its group when it closes).

examples:
  mq groups delete billing"""

RESET_EPILOG = f"""\
which partitions: --topic T (every partition of T) or --topic T:P[,P...] (those partitions);
repeat --topic for more topics. Other partitions keep their committed offsets.

new offset (exactly one):
  --to-earliest       the log start offset (the first record still in the log)
  --to-latest         the log end offset (only records produced from now on)
  --to-offset N       N, clamped into [log start offset, log end offset]
  --shift-by N        the committed offset + N (N may be negative), clamped likewise; a
                      partition without a committed offset is an error
  --to-datetime ISO   the first offset whose record timestamp is at or after ISO (the log end
                      when there is none)
  --by-duration D     as --to-datetime, at now minus D: ISO 8601 as Kafka takes it (PT10M,
                      P1DT2H, PT1.5S) or 30s, 10m, 2h, 1d, 1h30m

{DATETIME_HELP}

mode (exactly one): --dry-run prints the plan and changes nothing; --execute applies it, which
requires that the group has no live member (stop its consumers first). A group that does not
exist yet gets the committed offsets (as in Kafka: a way to set where a new group starts).
Both print GROUP TOPIC PARTITION CURRENT-OFFSET NEW-OFFSET, one partition a line.

examples:
  mq groups reset-offsets billing --topic orders --to-earliest --dry-run
  mq groups reset-offsets billing --topic orders --to-datetime 2024-05-01T12:00:00Z --execute
  mq groups reset-offsets billing --topic orders:0,3 --topic refunds --by-duration PT30M \\
      --execute
  mq groups reset-offsets billing --topic orders --shift-by -10 --execute"""


def add_parser(subparsers) -> None:
    commands = add_command_group(subparsers, "groups", "list, describe, delete or reset-offsets",
                                 help="list, describe, delete consumer groups; reset their "
                                      "offsets",
                                 description=DESCRIPTION, epilog=EPILOG, cluster=True)

    lst = commands.add_parser("list", help="groups with their state and live member count",
                              description="Print every consumer group with its state and "
                                          "number of live members.",
                              epilog=LIST_EPILOG, formatter_class=formatter)
    lst.add_argument("--json", action="store_true", help="one JSON object per group per line")
    add_broker_arguments(lst)
    lst.set_defaults(run=run_list)

    describe = commands.add_parser("describe", help="offsets, lag and members of a group",
                                   description="Print a group's committed offsets, log end "
                                               "offsets and lag per partition, and its\n"
                                               "members with their assignments.",
                                   epilog=DESCRIBE_EPILOG, formatter_class=formatter)
    describe.add_argument("group", metavar="GROUP", help="group id")
    describe.add_argument("--json", action="store_true",
                          help="one JSON object per partition per line")
    add_broker_arguments(describe)
    describe.set_defaults(run=run_describe)

    delete = commands.add_parser("delete", help="delete a group's committed offsets",
                                 description="Delete a consumer group that has no live "
                                             "members, with its committed offsets.",
                                 epilog=DELETE_EPILOG, formatter_class=formatter)
    delete.add_argument("group", metavar="GROUP", help="group id")
    add_broker_arguments(delete)
    delete.set_defaults(run=run_delete)

    reset = commands.add_parser("reset-offsets", help="set a group's committed offsets",
                                description="Compute new committed offsets for partitions "
                                            "of a group and print them (--dry-run) or\n"
                                            "apply them (--execute, group without live "
                                            "members only).",
                                epilog=RESET_EPILOG, formatter_class=formatter)
    reset.add_argument("group", metavar="GROUP", help="group id")
    reset.add_argument("--topic", action="append", required=True, type=_topic_spec,
                       metavar="T[:P,...]",
                       help="topic, or topic:partition[,partition...] (repeatable)")
    scenario = reset.add_mutually_exclusive_group(required=True)
    scenario.add_argument("--to-earliest", action="store_true",
                          help="reset to the log start offset")
    scenario.add_argument("--to-latest", action="store_true", help="reset to the log end offset")
    scenario.add_argument("--to-offset", type=non_negative_int, metavar="N",
                          help="reset to offset N (clamped into the log)")
    scenario.add_argument("--shift-by", type=integer, metavar="N",
                          help="move the committed offset by N (negative: back)")
    scenario.add_argument("--to-datetime", type=_datetime, metavar="ISO",
                          help="reset to the first record at or after ISO (ISO 8601)")
    scenario.add_argument("--by-duration", type=_duration, metavar="DURATION",
                          help="reset to the first record at or after now minus DURATION")
    mode = reset.add_mutually_exclusive_group(required=True)
    mode.add_argument("--dry-run", action="store_true", help="print the plan only")
    mode.add_argument("--execute", action="store_true", help="apply the plan")
    add_broker_arguments(reset)
    reset.set_defaults(run=run_reset_offsets)


# --- argument parsing (pure) ------------------------------------------------------------------

_TOPIC_SPEC = re.compile(r"([^:]+)(?::([0-9]+(?:,[0-9]+)*))?", re.ASCII)
_ISO_DURATION = re.compile(r"P(?:([0-9]+)D)?(?:T(?:([0-9]+)H)?(?:([0-9]+)M)?"
                           r"(?:([0-9]+(?:[.,][0-9]+)?)S)?)?", re.ASCII | re.IGNORECASE)
_SIMPLE_DURATION = re.compile(r"(?:[0-9]+(?:ms|s|m|h|d))+", re.ASCII)
_SIMPLE_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)", re.ASCII)
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_topic_spec(text: str) -> tuple[str, tuple[int, ...] | None]:
    """``"T"`` -> ``("T", None)`` (every partition); ``"T:0,2"`` -> ``("T", (0, 2))``.
    Raises ``ValueError`` naming the text."""
    match = _TOPIC_SPEC.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid topic {text!r}: expected TOPIC or TOPIC:PARTITION[,...] "
                         "with partitions as numbers, e.g. orders:0,2")
    topic, partitions = match.groups()
    if partitions is None:
        return topic, None
    return topic, tuple(sorted({int(p) for p in partitions.split(",")}))


def parse_duration(text: str) -> int:
    """Milliseconds in an ISO 8601 duration as Kafka's ``Duration.parse`` reads it (days,
    hours, minutes, seconds: ``PT10M``, ``P1DT2H``, ``pt1.5s``) or in a short form (``30s``,
    ``10m``, ``2h``, ``1d``, ``500ms``, ``1h30m``). Raises ``ValueError`` naming the text."""
    text = text.strip()
    iso = _ISO_DURATION.fullmatch(text)
    # "P" and "PT" alone, or a "T" with nothing after it, name no duration (Java refuses them).
    if iso is not None and any(iso.groups()) and not text.upper().endswith("T"):
        days, hours, minutes, seconds = iso.groups()
        total = (Decimal(days or 0) * 86_400 + Decimal(hours or 0) * 3_600
                 + Decimal(minutes or 0) * 60 + Decimal((seconds or "0").replace(",", ".")))
        return int(total * 1000)
    if _SIMPLE_DURATION.fullmatch(text):
        return sum(int(n) * _UNIT_MS[unit] for n, unit in _SIMPLE_PART.findall(text))
    raise ValueError(f"invalid duration {text!r}: use ISO 8601 like PT10M or P1DT2H, or "
                     "30s, 10m, 2h, 1d")


def clamp(offset: int, log_start_offset: int, log_end_offset: int) -> int:
    """``offset`` moved into [log start, log end], as Kafka's checkOffsetsRange does."""
    return max(log_start_offset, min(offset, log_end_offset))


def _argument_type(parse):
    """An argparse type from a parser raising ``ValueError``: argparse then prints the
    parser's message instead of its generic 'invalid value'."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from err
    convert.__name__ = parse.__name__
    return convert


_topic_spec = _argument_type(parse_topic_spec)
_datetime = _argument_type(parse_datetime)
_duration = _argument_type(parse_duration)


# --- output -----------------------------------------------------------------------------------

def _lag_seconds(lag_ms: int | None) -> float | None:
    return None if lag_ms is None else lag_ms / 1000


# --- commands ---------------------------------------------------------------------------------

def _admin(args: argparse.Namespace):
    from mq.client.admin import Admin
    return Admin(**client_options(args))


def _live(members: list[dict]) -> list[dict]:
    """Members that run now: a static member that went away keeps its partitions for a while
    but does not commit, so it does not block an offset change."""
    return [m for m in members if not m.get("away")]


def _refuse_if_live(admin, group: str, cause: BaseException | None = None) -> None:
    """Raise ``NonEmptyGroupError`` (from ``cause``) naming how many live members ``group``
    has, if it has any."""
    from mq.errors import GroupIdNotFoundError, NonEmptyGroupError
    try:
        live = len(_live(admin.describe_group(group)["members"]))
    except GroupIdNotFoundError:
        return
    if live:
        raise NonEmptyGroupError(f"group {group!r} has {live} live member(s); stop them first "
                                 "(consumers must leave the group)") from cause


def run_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        groups = admin.list_groups()
    if args.json:
        sys.stdout.write("".join(json_line({"group": g["group"], "state": g["state"],
                                            "members": g["members"]}) for g in groups))
    elif groups:
        sys.stdout.write(table(("GROUP", "STATE", "MEMBERS"),
                                ((g["group"], g["state"], g["members"]) for g in groups)))
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        desc = admin.describe_group(args.group)
    rows = partition_rows(desc)
    if args.json:
        sys.stdout.write("".join(json_line(row) for row in rows))
        return 0
    columns = _CLUSTER_COLUMNS if _on_cluster(desc) else _LOCAL_COLUMNS
    out = [_status(desc), "", table([c for c, _ in columns],
                                    ([row[key] for _, key in columns] for row in rows)
                                    ).rstrip("\n")]
    if desc["members"]:
        out += ["", _members_table(desc).rstrip("\n")]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


# The partitions table: (header, --json key). A Kafka cluster names a member's client and host
# (Kafka's columns) where mq has its process id and the age of the oldest unconsumed record.
_LOCAL_COLUMNS = (("GROUP", "group"), ("TOPIC", "topic"), ("PARTITION", "partition"),
                  ("CURRENT-OFFSET", "committedOffset"), ("LOG-END-OFFSET", "endOffset"),
                  ("LAG", "lag"), ("LAG-SECONDS", "lagSeconds"), ("MEMBER-ID", "memberId"),
                  ("PID", "pid"))
_CLUSTER_COLUMNS = _LOCAL_COLUMNS[:6] + (("MEMBER-ID", "memberId"), ("HOST", "host"),
                                         ("CLIENT-ID", "clientId"))


def _on_cluster(desc: dict) -> bool:
    """A Kafka cluster's description: no group epoch, members with a client id and host."""
    return "group_epoch" not in desc


def partition_rows(desc: dict) -> list[dict]:
    """``Admin.describe_group``'s partitions as ``--json`` objects (camelCase, None where
    unknown): on a Kafka cluster with each owner's member id, host and client id (from the
    members' assignments), and the assigned partitions without a committed offset too.
    Raises ``GroupIdNotFoundError`` for a cluster's group that does not exist (Kafka
    describes it as Dead with nothing in it)."""
    group = desc["group"]
    if not _on_cluster(desc):
        return [{"group": group, "topic": o["topic"], "partition": o["partition"],
                 "committedOffset": o["committed_offset"], "endOffset": o["end_offset"],
                 "lag": o["lag"], "lagSeconds": _lag_seconds(o["lag_ms"]),
                 "memberId": o["member_id"], "pid": o["pid"]} for o in desc["offsets"]]
    from mq.errors import GroupIdNotFoundError
    if desc["state"] == "Dead" and not desc["members"] and not desc["offsets"]:
        raise GroupIdNotFoundError(f"group {group!r} does not exist")
    owners = {(t, p): m for m in desc["members"] for t, p in m["assignment"]}
    offsets = {(o["topic"], o["partition"]): o for o in desc["offsets"]}
    rows = []
    for key in sorted(offsets.keys() | owners.keys()):
        o, m = offsets.get(key, {}), owners.get(key, {})
        rows.append({"group": group, "topic": key[0], "partition": key[1],
                     "committedOffset": o.get("committed_offset"),
                     "endOffset": o.get("end_offset"), "lag": o.get("lag"),
                     "memberId": m.get("member_id"), "host": m.get("host"),
                     "clientId": m.get("client_id")})
    return rows


def _status(desc: dict) -> str:
    group, live = desc["group"], _live(desc["members"])
    if not live:
        return f"Consumer group {group!r} has no active members."
    epoch = "" if _on_cluster(desc) else f"group epoch {desc['group_epoch']}, "
    return (f"Consumer group {group!r}: {desc['state']}, {plural(len(live), 'member')}, "
            f"{epoch}assignor {desc['assignor']}.")


def _members_table(desc: dict) -> str:
    members = desc["members"]
    if _on_cluster(desc):
        return table(("MEMBER-ID", "INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                      "ASSIGNMENT"),
                     ((m["member_id"], m["instance_id"], m["host"], m["client_id"],
                       len(m["assignment"]), _assignment(m["assignment"])) for m in members))
    return table(("MEMBER-ID", "INSTANCE-ID", "PID", "EPOCH", "STATE", "#PARTITIONS",
                  "ASSIGNMENT"),
                 ((m["member_id"], m["instance_id"], m["pid"], m["member_epoch"],
                   "Away" if m.get("away") else m["state"], len(m["assignment"]),
                   _assignment(m["assignment"])) for m in members))


def _assignment(partitions: list) -> str | None:
    """``[["t", 0], ["t", 1], ["u", 2]]`` -> ``t(0,1),u(2)`` (Kafka's --verbose form)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return ",".join(f"{t}({','.join(map(str, sorted(ps)))})"
                    for t, ps in sorted(by_topic.items())) or None


def run_delete(args: argparse.Namespace) -> int:
    from mq.errors import NonEmptyGroupError
    with _admin(args) as admin:
        try:
            admin.delete_group(args.group)
        except NonEmptyGroupError as err:
            _refuse_if_live(admin, args.group, err)
            raise
    sys.stdout.write(f"Deleted consumer group {args.group!r}.\n")
    return 0


def run_reset_offsets(args: argparse.Namespace) -> int:
    from mq.client.admin import Admin
    from mq.client.consumer import Consumer
    from mq.errors import NonEmptyGroupError

    group = args.group
    options = client_options(args)
    with Admin(**options) as admin, Consumer(**options) as consumer:
        if args.execute:
            _refuse_if_live(admin, group)
        tps = sorted({tp for topic, wanted in args.topic
                      for tp in topic_partitions(consumer, topic, wanted)})
        committed = admin.list_group_offsets(group)
        new = _new_offsets(args, consumer, tps, committed)
        if args.execute:
            try:
                admin.alter_group_offsets(group, new)
            except NonEmptyGroupError as err:          # a member joined since the check
                _refuse_if_live(admin, group, err)
                raise
    sys.stdout.write(table(("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"),
                            ((group, tp.topic, tp.partition, committed.get(tp), new[tp])
                             for tp in tps)))
    if args.dry_run:
        sys.stderr.write("Dry run: nothing changed (run again with --execute to apply).\n")
    return 0


def _new_offsets(args: argparse.Namespace, consumer, tps: list, committed: dict) -> dict:
    """``{tp: new committed offset}`` for the scenario in ``args``. Raises ``MQError`` for
    --shift-by of a partition without a committed offset (Kafka refuses that too)."""
    from mq.errors import MQError
    start = consumer.beginning_offsets(tps)
    end = consumer.end_offsets(tps)
    if args.to_earliest:
        return start
    if args.to_latest:
        return end
    if args.to_offset is not None:
        return {tp: clamp(args.to_offset, start[tp], end[tp]) for tp in tps}
    if args.shift_by is not None:
        for tp in tps:
            if tp not in committed:
                raise MQError(f"cannot shift the offset of {tp.topic}-{tp.partition}: group "
                              f"{args.group!r} has no committed offset for it")
        return {tp: clamp(committed[tp] + args.shift_by, start[tp], end[tp]) for tp in tps}
    if args.to_datetime is not None:
        when_ms = args.to_datetime
    else:
        when_ms = time.time_ns() // 1_000_000 - args.by_duration
    found = consumer.offsets_for_times({tp: max(0, when_ms) for tp in tps})
    return {tp: end[tp] if found[tp] is None else found[tp][0] for tp in tps}
