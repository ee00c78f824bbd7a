"""Apache Kafka's own CLI tools (kafka-tools 4.3.1, run as ``java -cp … <main class>``, what
Kafka's ``bin/*.sh`` scripts do) against mq's Kafka listener, checked against mq's native view,
each over PLAINTEXT and over SASL_SSL (SCRAM-SHA-256 inside TLS: the tools get
``security.protocol``, ``sasl.*`` and a PEM trust store through ``--command-config``)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time

import pytest

from javakafka import (
    ACL_COMMAND,
    CONSOLE_CONSUMER,
    CONSOLE_PRODUCER,
    CONSUMER_GROUPS,
    GET_OFFSETS,
    SECURITY,
    TOPIC_COMMAND,
    TRANSACTIONS,
    table,
)
from kclients import WAIT, collect

from mq.client.admin import Admin
from mq.client.consumer import Consumer as MqConsumer
from mq.client.producer import Producer as MqProducer


pytestmark = pytest.mark.parametrize("security", SECURITY)


@pytest.fixture
def kafka_super_users() -> list[str]:
    """alice is a super user here: ACLs are not what these tests are about."""
    return ["alice"]


def _offsets(admin: Admin, group: str) -> dict[tuple[str, int], int]:
    return {(tp.topic, tp.partition): o for tp, o in admin.list_group_offsets(group).items()}


def test_topic_command(kafka_java, mixed):
    kafka_java.tool(TOPIC_COMMAND, "--create", "--topic", "made", "--partitions", "2",
                    "--replication-factor", "1", "--config", "retention.ms=9000")
    with Admin(mixed.socket) as admin:
        assert admin.describe_topic("made")["overrides"] == {"retention.ms": "9000"}
        assert admin.describe_topic("made")["partitions"] == 2
    out = kafka_java.tool(TOPIC_COMMAND, "--describe", "--topic", "made").stdout
    assert "PartitionCount: 2" in out and "retention.ms=9000" in out
    assert [line.split("\t")[2:4] for line in out.splitlines() if line.startswith("\tTopic")] \
        == [["Partition: 0", "Leader: 0"], ["Partition: 1", "Leader: 0"]], out
    assert kafka_java.tool(TOPIC_COMMAND, "--list").stdout.split() == ["made"]
    kafka_java.tool(TOPIC_COMMAND, "--delete", "--topic", "made")
    with Admin(mixed.socket) as admin:
        assert "made" not in admin.list_topics()
    assert kafka_java.tool(TOPIC_COMMAND, "--list").stdout.split() == []


def test_console_producer_and_consumer(kafka_java, mixed):
    with Admin(mixed.socket) as admin:
        admin.create_topic("console", 1)
    with MqProducer(socket=mixed.socket) as p:
        for i in range(2):
            p.send("console", value=f"mq-{i}".encode(), key=f"k{i}".encode()).get(timeout=WAIT)
    kafka_java.tool(CONSOLE_PRODUCER, "--topic", "console", "--reader-property",
                    "parse.key=true", "--reader-property", "key.separator=:",
                    input="k2:console-2\nk3:console-3\n")
    out = kafka_java.tool(CONSOLE_CONSUMER, "--topic", "console", "--from-beginning",
                          "--max-messages", "4", "--group", "console-g", "--timeout-ms",
                          str(int(WAIT * 1000)), "--formatter-property", "print.key=true",
                          "--formatter-property", "print.offset=true").stdout
    assert out.splitlines() == [f"Offset:{i}\tk{i}\t{v}" for i, v in
                                enumerate(["mq-0", "mq-1", "console-2", "console-3"])]
    with MqConsumer("console", socket=mixed.socket, value_bytes=True) as c:
        got = collect(lambda: [(r.offset, bytes(r.key), r.value) for rs in
                               c.poll(timeout_ms=100).values() for r in rs], 4)
    assert got[2:] == [(2, b"k2", b"console-2"), (3, b"k3", b"console-3")]
    with Admin(mixed.socket) as admin:
        assert _offsets(admin, "console-g") == {("console", 0): 4}


def test_consumer_group_command_describe_and_reset_to_datetime(kafka_java, mixed):
    now = int(time.time() * 1000)
    old, new = now - 3_600_000, now - 60_000         # an hour ago, a minute ago
    with Admin(mixed.socket) as admin:
        admin.create_topic("clicks", 2)
    with MqProducer(socket=mixed.socket) as p:
        for partition in (0, 1):
            for ts in (old, old, new):
                p.send("clicks", value=b"c", partition=partition, timestamp_ms=ts).get(WAIT)
    kafka_java.checks("consume:clicks,clicks-g,classic,read_uncommitted,6")

    out = kafka_java.tool(CONSUMER_GROUPS, "--describe", "--group", "clicks-g").stdout
    rows = table(out.split("\n\n")[-1])
    assert [(r["TOPIC"], r["PARTITION"], r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["LAG"])
            for r in rows] == [("clicks", "0", "3", "3", "0"), ("clicks", "1", "3", "3", "0")]

    between = datetime.datetime.fromtimestamp((old + new) / 2000, datetime.UTC)
    out = kafka_java.tool(CONSUMER_GROUPS, "--reset-offsets", "--group", "clicks-g",
                          "--topic", "clicks", "--to-datetime",
                          between.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "--execute").stdout
    assert sorted((r["PARTITION"], r["NEW-OFFSET"]) for r in table(out)) == [("0", "2"), ("1", "2")]
    with Admin(mixed.socket) as admin:
        assert _offsets(admin, "clicks-g") == {("clicks", 0): 2, ("clicks", 1): 2}


def test_get_offset_shell(kafka_java, mixed):
    with Admin(mixed.socket) as admin:
        admin.create_topic("offsets", 2)
    now = int(time.time() * 1000)
    with MqProducer(socket=mixed.socket) as p:
        for ts in (now - 3000, now - 1000, now - 2000):
            p.send("offsets", value=b"v", partition=0, timestamp_ms=ts).get(WAIT)
    latest = kafka_java.tool(GET_OFFSETS, "--topic", "offsets").stdout.split()
    assert latest == ["offsets:0:3", "offsets:1:0"]
    earliest = kafka_java.tool(GET_OFFSETS, "--topic", "offsets", "--time", "-2").stdout.split()
    assert earliest == ["offsets:0:0", "offsets:1:0"]
    max_ts = kafka_java.tool(GET_OFFSETS, "--topic-partitions", "offsets:0",
                             "--time", "-3").stdout.split()
    assert max_ts == ["offsets:0:1"]                   # the record of the largest timestamp
    at = kafka_java.tool(GET_OFFSETS, "--topic-partitions", "offsets:0",
                         "--time", str(now - 1500)).stdout.split()
    assert at == ["offsets:0:1"]                       # the first timestamp >= now - 1500


def test_transactions_command(kafka_java, mixed):
    with Admin(mixed.socket) as admin:
        admin.create_topic("orders", 1)
    with kafka_java.popen_checks("hold:orders,order-txn") as holder:
        try:
            assert holder.stdout.readline() == "open\n", holder.stderr.read()
            listed = _while_open(kafka_java)
            holder.stdin.close()                        # the holder aborts and exits
            assert holder.wait(WAIT) == 0, holder.stderr.read()
        finally:
            if holder.poll() is None:
                holder.kill()
    [after] = table(kafka_java.tool(TRANSACTIONS, "describe", "--transactional-id",
                                    "order-txn").stdout)
    assert after["TransactionState"] == "CompleteAbort"
    assert after["ProducerId"] == listed["ProducerId"]


def _while_open(kafka_java) -> dict[str, str]:
    """TransactionsCommand list, describe and describe-producers on the holder's open
    transaction: ``list``'s row."""
    [listed] = table(kafka_java.tool(TRANSACTIONS, "list").stdout)
    assert (listed["TransactionalId"], listed["TransactionState"]) == ("order-txn", "Ongoing")
    [described] = table(kafka_java.tool(TRANSACTIONS, "describe", "--transactional-id",
                                        "order-txn").stdout)
    assert described["TransactionState"] == "Ongoing"
    assert described["TopicPartitions"] == "orders-0"
    assert described["ProducerId"] == listed["ProducerId"]
    [producer] = table(kafka_java.tool(TRANSACTIONS, "describe-producers", "--topic",
                                       "orders", "--partition", "0").stdout)
    assert producer["ProducerId"] == listed["ProducerId"]
    assert (producer["LastSequence"], producer["CurrentTransactionStartOffset"]) == ("0", "0")
    return listed


def _mq_acls(socket: str, *args: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "mq", "acls", "list", "--json", "--socket",
                           socket, *args], capture_output=True, text=True, timeout=60,
                          check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_acl_command(kafka_java, mixed):
    """kafka-acls (AclCommand) adds, lists and removes ACLs that mq acls sees the same."""
    kafka_java.tool(ACL_COMMAND, "--add", "--allow-principal", "User:bob", "--operation",
                    "Read", "--topic", "orders", "--group", "billing")
    listed = kafka_java.tool(ACL_COMMAND, "--list", "--topic", "orders").stdout
    assert "User:bob" in listed and "READ" in listed.upper()
    seen = _mq_acls(mixed.socket, "--principal", "User:bob")
    assert len(seen) == 2, seen
    kafka_java.tool(ACL_COMMAND, "--remove", "--force", "--allow-principal", "User:bob",
                    "--operation", "Read", "--topic", "orders", "--group", "billing")
    assert _mq_acls(mixed.socket, "--principal", "User:bob") == []
