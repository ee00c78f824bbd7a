"""Kafka's Java producer and consumer (kafka-clients 4.3.1) against mq, in one JVM: an idempotent
producer, a transactional one that commits and aborts, a read_committed consumer, consumers of the
classic and the KIP-848 (``group.protocol=consumer``) group protocols, each compression codec;
records cross both ways with ``mq.Producer`` and ``mq.Consumer``. Over PLAINTEXT and over SASL_SSL,
where alice has the ACLs a Java application needs and no more, and bob, without an ACL on the
topic, is refused it."""

from __future__ import annotations

import pytest
from javakafka import SECURITY
from kclients import WAIT, collect

from mq.broker.acls import AclOperation, ResourceType
from mq.client.admin import Admin
from mq.client.consumer import Consumer as MqConsumer
from mq.client.producer import Producer as MqProducer

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
TOPIC, GROUP, TXN_ID = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
READ, WRITE = AclOperation.READ, AclOperation.WRITE
# Write on a topic lets the producers be idempotent too (KIP-679: no IdempotentWrite needed).
ALICE = [(TOPIC, "from-mq", READ), (TOPIC, "from-java", WRITE), (TOPIC, "codecs", WRITE),
         (TOPIC, "txn", WRITE), (TOPIC, "txn", READ), (TXN_ID, "java-txn", WRITE),
         (GROUP, "classic-g", READ), (GROUP, "kip848-g", READ), (GROUP, "committed-g", READ)]


@pytest.mark.parametrize("security", SECURITY)
def test_java_clients_and_mq_clients_share_records(kafka_java, grant, mixed):
    grant("alice", *ALICE)
    with Admin(mixed.socket) as admin:
        for topic, partitions in (("from-mq", 2), ("from-java", 1), ("txn", 1), ("codecs", 1)):
            admin.create_topic(topic, partitions)
    with MqProducer(socket=mixed.socket) as p:
        for i in range(4):
            p.send("from-mq", value=f"mq-{i}".encode(), key=f"mq-{i}".encode(),
                   partition=i % 2).get(timeout=WAIT)

    codecs = [f"produce:codecs,2,{codec},{codec}" for codec in CODECS]
    lines = kafka_java.checks("produce:from-java,3,java", *codecs, "txn:txn,java-txn",
                              "consume:from-mq,classic-g,classic,read_uncommitted,4",
                              "consume:from-mq,kip848-g,consumer,read_uncommitted,4",
                              "consume:txn,committed-g,consumer,read_committed,3")
    assert [line[1:] for line in lines if line[0] == "sent"] == [
        ["from-java", "0", str(i)] for i in range(3)] + [
        ["codecs", "0", str(i)] for i in range(2 * len(CODECS))]
    assert [line[1:] for line in lines if line[0] == "txn"] == [
        ["committed", "2"], ["aborted", "2"], ["committed", "1"]]
    records = [line[1:] for line in lines if line[0] == "record"]
    from_mq = sorted([t, p, o, k, v] for t, p, o, k, v in records if t == "from-mq")
    assert from_mq == sorted(2 * [["from-mq", str(i % 2), str(i // 2), f"mq-{i}", f"mq-{i}"]
                                  for i in range(4)])
    # Offsets 0 1 | marker 2 | aborted 3 4 | marker 5 | 6 | marker 7: read_committed skips 3 4.
    assert [r for r in records if r[0] == "txn"] == [
        ["txn", "0", "0", "c0", "c0"], ["txn", "0", "1", "c1", "c1"],
        ["txn", "0", "6", "c2", "c2"]]
    committed = sorted(line[1:] for line in lines if line[0] == "committed")
    assert committed == [["classic-g", "0", "2"], ["classic-g", "1", "2"],
                         ["committed-g", "0", "8"], ["kip848-g", "0", "2"], ["kip848-g", "1", "2"]]

    with MqConsumer("from-java", "txn", socket=mixed.socket, value_bytes=True,
                    isolation_level="read_committed") as c:
        got = collect(lambda: [(r.topic, r.offset, r.value) for rs in
                               c.poll(timeout_ms=100).values() for r in rs], 6)
    assert sorted(got) == [("from-java", i, f"java-{i}".encode()) for i in range(3)] + [
        ("txn", 0, b"c0"), ("txn", 1, b"c1"), ("txn", 6, b"c2")]
    with MqConsumer("codecs", socket=mixed.socket, value_bytes=True) as c:
        got = collect(lambda: [r.value for rs in c.poll(timeout_ms=100).values() for r in rs],
                      2 * len(CODECS))
    assert got == [f"{codec}-{i}".encode() for codec in CODECS for i in range(2)]
    with Admin(mixed.socket) as admin:                      # the Java groups' commits, natively
        for group in ("classic-g", "kip848-g"):
            offsets = admin.list_group_offsets(group)
            assert {(tp.topic, tp.partition): o for tp, o in offsets.items()} == {
                ("from-mq", 0): 2, ("from-mq", 1): 2}, group


@pytest.mark.parametrize("security", ["SASL_SSL"])
def test_a_user_without_an_acl_on_the_topic_is_refused_it(java_client, grant, mixed):
    """bob may Read his group but has no ACL on the topic: the broker answers
    TOPIC_AUTHORIZATION_FAILED, which Java's consumer throws as TopicAuthorizationException."""
    with Admin(mixed.socket) as admin:
        admin.create_topic("payroll", 1)
    grant("bob", (GROUP, "bob-g", READ))
    done = java_client("bob").run_checks("consume:payroll,bob-g,classic,read_uncommitted,1",
                                         check=False)
    assert done.returncode == 1, done.stdout
    assert "org.apache.kafka.common.errors.TopicAuthorizationException" in done.stderr, \
        done.stderr
