"""``mq transactions``: Kafka's kafka-transactions over ``mq.Admin`` — list the transactional ids
the broker's transaction coordinator knows, and describe one: its producer id and epoch, state,
timeout, how long its open transaction has run and the partitions it holds.

A transaction that stays Ongoing past its timeout is one whose producer went away: the
coordinator aborts it (fencing that producer) at its next check, and ``read_committed``
consumers, which stop at the partition's last stable offset, move on past it.
"""

from __future__ import annotations

import argparse
import sys
import time

from mq.cli import json_line
from mq.cli.common import add_broker_arguments, add_command_group, client_options, formatter, table

__all__ = ["add_parser", "describe_json", "describe_row", "run_describe", "run_list"]

DESCRIPTION = """\
List and describe the transactional ids of the running broker's transaction coordinator
(Kafka's kafka-transactions). A transactional id exists once a producer called
init_transactions() with it. Not on a Kafka cluster (--bootstrap-server): librdkafka has no
ListTransactions or DescribeTransactions, so there they are one 'mq: error:' line, exit 1."""

EPILOG = """\
examples:
  mq transactions list
  mq transactions describe billing-1
  mq transactions describe billing-1 --json | jq .topicPartitions"""

STATES = """\
TransactionState is Kafka's: Empty (no transaction yet), Ongoing (open), PrepareCommit /
PrepareAbort (ending: markers being written), CompleteCommit / CompleteAbort (the last one
ended so), PrepareEpochFence (a newer producer, or the timeout, is aborting it)."""

LIST_EPILOG = f"""\
output: a table TransactionalId ProducerId TransactionState, one id a line (nothing when the
broker knows none). --json prints one object per id per line: {{"transactionalId",
"producerId", "transactionState"}}.

{STATES}

examples:
  mq transactions list
  mq transactions list --json"""

DESCRIBE_EPILOG = f"""\
output: a table with one row:
  TransactionalId  ProducerId  ProducerEpoch  TransactionState  TransactionTimeoutMs
  CurrentTransactionStartTimeMs  TransactionDurationMs  TopicPartitions
CurrentTransactionStartTimeMs (milliseconds since the epoch) and TransactionDurationMs are '-'
when no transaction is open or ending; TopicPartitions lists the partitions of the open
transaction as topic-partition, comma-separated ('-': none).

--json prints one object: {{"transactionalId", "producerId", "producerEpoch",
"transactionState", "transactionTimeoutMs", "transactionStartTimeMs" (null: none),
"transactionDurationMs" (null: none), "lastUpdateTimeMs", "topicPartitions": [{{"topic",
"partition"}}, ...]}}.

{STATES}

exit status: 0; 1 for an unknown transactional id or no broker.

examples:
  mq transactions describe billing-1
  mq transactions describe billing-1 --json"""

# States in which a transaction is open or ending: its start time and duration mean something.
_OPEN = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def add_parser(subparsers) -> None:
    commands = add_command_group(subparsers, "transactions", "list or describe",
                                 help="list and describe transactional ids (kafka-transactions)",
                                 description=DESCRIPTION, epilog=EPILOG, cluster=True)

    lst = commands.add_parser("list", help="transactional ids with their producer id and state",
                              description="Print every transactional id the broker knows, "
                                          "with its producer id and state.",
                              epilog=LIST_EPILOG, formatter_class=formatter)
    lst.add_argument("--json", action="store_true", help="one JSON object per id per line")
    add_broker_arguments(lst)
    lst.set_defaults(run=run_list)

    describe = commands.add_parser("describe", help="state, timing and partitions of one "
                                                    "transactional id",
                                   description="Print a transactional id's producer id and "
                                               "epoch, state, timeout, the start and duration\n"
                                               "of its open transaction and the partitions "
                                               "it holds.",
                                   epilog=DESCRIBE_EPILOG, formatter_class=formatter)
    describe.add_argument("transactional_id", metavar="TXN_ID", help="transactional id")
    describe.add_argument("--json", action="store_true", help="one JSON object")
    add_broker_arguments(describe)
    describe.set_defaults(run=run_describe)


def _admin(args: argparse.Namespace):
    from mq.client.admin import Admin
    return Admin(**client_options(args))


def run_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        rows = admin.list_transactions()
    if args.json:
        sys.stdout.write("".join(json_line({"transactionalId": r["transactional_id"],
                                            "producerId": r["producer_id"],
                                            "transactionState": r["state"]}) for r in rows))
    elif rows:
        sys.stdout.write(table(("TransactionalId", "ProducerId", "TransactionState"),
                               ((r["transactional_id"], r["producer_id"], r["state"])
                                for r in rows)))
    return 0


def _timing(desc: dict, now_ms: int) -> tuple[int | None, int | None]:
    """(start, duration) of the open or ending transaction, or (None, None)."""
    start = desc["start_ms"]
    if desc["state"] not in _OPEN or start is None or start < 0:
        return None, None
    return start, max(0, now_ms - start)


def describe_json(desc: dict, now_ms: int) -> dict:
    """The ``--json`` object for a described transactional id."""
    start, duration = _timing(desc, now_ms)
    return {"transactionalId": desc["transactional_id"], "producerId": desc["producer_id"],
            "producerEpoch": desc["producer_epoch"], "transactionState": desc["state"],
            "transactionTimeoutMs": desc["timeout_ms"], "transactionStartTimeMs": start,
            "transactionDurationMs": duration, "lastUpdateTimeMs": desc["last_update_ms"],
            "topicPartitions": [{"topic": t, "partition": p} for t, p in desc["partitions"]]}


def describe_row(desc: dict, now_ms: int) -> tuple:
    """The text row for a described transactional id."""
    start, duration = _timing(desc, now_ms)
    partitions = ",".join(f"{t}-{p}" for t, p in sorted(map(tuple, desc["partitions"])))
    return (desc["transactional_id"], desc["producer_id"], desc["producer_epoch"],
            desc["state"], desc["timeout_ms"], start, duration, partitions or None)


def run_describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        desc = admin.describe_transaction(args.transactional_id)
    now_ms = time.time_ns() // 1_000_000
    if args.json:
        sys.stdout.write(json_line(describe_json(desc, now_ms)))
    else:
        sys.stdout.write(table(
            ("TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
             "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
             "TopicPartitions"), [describe_row(desc, now_ms)]))
    return 0
