"""The real Kafka node of the test suite (``kafkanode``) serves Kafka's clients, and its own
files pass the judge that mq's files must pass (``dumplog``): Kafka's DumpLogSegments and mq's
``mq dump-log`` print the same lines for every file Kafka wrote, indexes and producer snapshots
included. That both checks the judge on a known-good writer and is a first look at mq reading
what Kafka writes."""

from __future__ import annotations

from confluent_kafka import Producer
from dumplog import judge_data_dir, partition_files
from kclients import consumer, create_topic, deliver, produce, read, values

from mq.log import files

# Kafka 4 refuses segment.bytes below 1 MiB; internal.segment.bytes is its own tests' way round.
SMALL = {"internal.segment.bytes": "4096", "index.interval.bytes": "256"}


def test_kafka_node_files_pass_the_judge(java_kafka, kafka_node):
    bootstrap = kafka_node.bootstrap
    create_topic(bootstrap, "judged", 1, SMALL)
    sent = [{"key": b"k%d" % (i % 5), "value": b"kafka-%04d" % i, "partition": 0,
             "headers": [("h", b"%d" % i)]} for i in range(400)]
    produce(bootstrap, "judged", sent, {"enable.idempotence": True,
                                         "compression.type": "lz4", "batch.size": 300})
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "judged-txn"})
    txn.init_transactions(30)
    for commit in (True, False, True):
        txn.begin_transaction()
        deliver(txn, "judged", [{"value": b"txn", "partition": 0}] * 5)
        txn.commit_transaction(30) if commit else txn.abort_transaction(30)
    c = consumer(bootstrap, "judged-group", {"auto.offset.reset": "earliest",
                                             "isolation.level": "read_committed"})
    c.subscribe(["judged"])
    got = read(c, 410)
    c.commit(asynchronous=False)
    c.close()
    assert values(got) == [r["value"] for r in sent] + [b"txn"] * 10

    kafka_node.stop()                   # clean: Kafka trims the indexes at shutdown
    result = judge_data_dir(java_kafka, kafka_node.data_dir)
    judged = partition_files(kafka_node.data_dir)
    assert not result.findings, "\n".join(result.findings)
    assert sum(p.endswith(files.LOG_SUFFIX) for p in judged["judged-0"]) >= 3
    assert sum(p.endswith(files.TXNINDEX_SUFFIX) for p in judged["judged-0"]) >= 1
    assert {"judged-0", "__consumer_offsets-0", "__transaction_state-0"} <= set(judged)
