"""kafka-python 3 against the Kafka listener: its default producer (idempotent since 3.0, so it
needs InitProducerId), a consumer group with commits, and transactions read back by a
read_committed consumer. kafka-python infers the broker's version from ApiVersions and turns
features off on an old-looking broker, so each test checks the feature stayed on."""

from __future__ import annotations

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kclients import WAIT, collect, create_topic


def poll(consumer: KafkaConsumer, count: int) -> list:
    return collect(lambda: [r for rs in consumer.poll(timeout_ms=200).values() for r in rs],
                   count)


def test_default_producer_is_idempotent(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "kp", 2)
    producer = KafkaProducer(bootstrap_servers=b, linger_ms=5)
    try:
        futures = [producer.send("kp", value=b"v%d" % i, key=b"k%d" % i, partition=i % 2,
                                 headers=[("n", b"%d" % i)], timestamp_ms=1_000 + i)
                   for i in range(20)]
        sent = [f.get(timeout=WAIT) for f in futures]
        assert producer.config["enable_idempotence"]            # not turned off for the broker
        assert producer._transaction_manager.producer_id_and_epoch.producer_id >= 0
    finally:
        producer.close(timeout=WAIT)
    assert [(m.partition, m.offset) for m in sent] == [(i % 2, i // 2) for i in range(20)]

    consumer = KafkaConsumer(bootstrap_servers=b, enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        consumer.assign([TopicPartition("kp", 0), TopicPartition("kp", 1)])
        consumer.seek_to_beginning()
        got = sorted(poll(consumer, 20), key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()
    assert [(r.partition, r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == [
        (p, i // 2, b"k%d" % i, b"v%d" % i, [("n", b"%d" % i)], 1_000 + i)
        for p in (0, 1) for i in range(p, 20, 2)]


def test_consumer_group_commits_and_resumes(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "kg", 2)
    producer = KafkaProducer(bootstrap_servers=b)
    try:
        for i in range(10):
            producer.send("kg", value=b"v%d" % i, partition=i % 2)
        producer.flush(WAIT)

        def member() -> KafkaConsumer:
            return KafkaConsumer("kg", bootstrap_servers=b, group_id="kpg",
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 fetch_max_wait_ms=100, session_timeout_ms=6000,
                                 heartbeat_interval_ms=500)
        consumer = member()
        try:
            assert sorted(r.value for r in poll(consumer, 10)) == sorted(
                b"v%d" % i for i in range(10))
            assert consumer.assignment() == {TopicPartition("kg", 0), TopicPartition("kg", 1)}
            consumer.commit()
            assert consumer.committed(TopicPartition("kg", 0)) == 5
            assert consumer.committed(TopicPartition("kg", 1)) == 5
        finally:
            consumer.close(autocommit=False)
        producer.send("kg", value=b"late", partition=1).get(timeout=WAIT)
        consumer = member()
        try:
            [record] = poll(consumer, 1)                # resumes at the committed offsets
            assert (record.partition, record.offset, record.value) == (1, 5, b"late")
        finally:
            consumer.close(autocommit=False)
    finally:
        producer.close(timeout=WAIT)


def test_transactions_commit_and_abort(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "kt", 1)
    producer = KafkaProducer(bootstrap_servers=b, transactional_id="kp-txn")
    try:
        producer.init_transactions()
        for vals, commit in (([b"c1", b"c2"], True), ([b"a1"], False), ([b"c3"], True)):
            producer.begin_transaction()
            for v in vals:
                producer.send("kt", value=v)
            if commit:
                producer.commit_transaction()
            else:
                producer.flush(WAIT)            # the aborted records reach the log first
                producer.abort_transaction()
    finally:
        producer.close(timeout=WAIT)

    def read(isolation: str, count: int) -> list:
        consumer = KafkaConsumer(bootstrap_servers=b, isolation_level=isolation,
                                 enable_auto_commit=False, fetch_max_wait_ms=100)
        try:
            consumer.assign([TopicPartition("kt", 0)])
            consumer.seek_to_beginning()
            return [(r.offset, r.value) for r in poll(consumer, count)]
        finally:
            consumer.close()
    # c1 c2 COMMIT a1 ABORT c3 COMMIT: markers take offsets 2, 4 and 6.
    assert read("read_committed", 3) == [(0, b"c1"), (1, b"c2"), (5, b"c3")]
    assert read("read_uncommitted", 4) == [(0, b"c1"), (1, b"c2"), (3, b"a1"), (5, b"c3")]
