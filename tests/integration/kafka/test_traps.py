"""The known traps of Kafka-compatible brokers, one test each (Tansu's compat findings, which
hung or misled librdkafka's own test suite): a fetch offset in the middle of a batch,
ListOffsets by timestamp inside a compressed batch, DescribeConfigs listing every config with
its default, ``max.message.bytes`` enforced, and aborted records never reaching read_committed
(also through kafka-python, whose reader is its own). The last trap, EndTxn aborting after a
failed send, is test_transactions_wire.py's test_abort_after_failed_send."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, ConfigSource
from kafka import KafkaConsumer
from kafka import TopicPartition
from kclients import (WAIT, admin, collect, consumer, create_topic, deliver, offset_for_time,
                      produce, producer, read_partitions, segment_batches, values)

from mq.log.config import DEFAULTS

# One produce request carrying one batch: librdkafka waits linger.ms for more records, and
# flush() sends what it holds as one batch per partition.
ONE_BATCH = {"linger.ms": 5000, "batch.num.messages": 10_000}

# Kafka's own defaults for the topic configs every client and UI reads.
KAFKA_DEFAULTS = {"cleanup.policy": "delete", "retention.ms": "604800000",
                  "retention.bytes": "-1", "segment.bytes": "1073741824",
                  "max.message.bytes": "1048588", "message.timestamp.type": "CreateTime",
                  "segment.ms": "604800000", "min.cleanable.dirty.ratio": "0.5",
                  "delete.retention.ms": "86400000", "file.delete.delay.ms": "60000"}


def test_fetch_from_the_middle_of_a_batch(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "mid", 1)
    produce(b, "mid", [{"value": b"v%d" % i, "key": b"k%d" % i} for i in range(10)], ONE_BATCH)
    if kafka_mq.data_dir is not None:
        assert segment_batches(kafka_mq.data_dir, "mid") == [(0, 10, 0)]
    # The broker returns the whole batch from offset 0; the client drops records 0..4.
    got = read_partitions(b, "mid", 5, offset=5)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [
        (i, b"k%d" % i, b"v%d" % i) for i in range(5, 10)]


def test_list_offsets_by_timestamp_inside_a_compressed_batch(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "tsbatch", 1)
    ts0 = int(time.time() * 1000) - 60_000
    # Compressible values: librdkafka sends a batch uncompressed when lz4 would not shrink it.
    produce(b, "tsbatch", [{"value": b"record %d " % i * 40, "timestamp": ts0 + 10 * i}
                           for i in range(5)], {**ONE_BATCH, "compression.type": "lz4"})
    if kafka_mq.data_dir is not None:
        assert segment_batches(kafka_mq.data_dir, "tsbatch") == [(0, 5, 3)]     # 3: lz4
    c = consumer(b)
    try:
        def lookup(ts: int) -> int:
            return offset_for_time(c, "tsbatch", ts)
        # The batch's maxTimestamp is ts0 + 40: the offset is that of the first record in it
        # with a timestamp >= T, not the batch's base offset.
        assert lookup(ts0 + 20) == 2
        assert lookup(ts0 + 15) == 2
        assert lookup(ts0 + 40) == 4
        assert lookup(ts0 + 41) == -1
    finally:
        c.close()


def test_describe_configs_lists_every_config_with_its_default(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "described", 1, {"retention.ms": "3600000"})
    client = admin(b)
    [f] = client.describe_configs([ConfigResource("topic", "described")]).values()
    entries = f.result(WAIT)
    expected = {**DEFAULTS.to_properties(), **KAFKA_DEFAULTS}    # mq's configs, Kafka's values
    missing = sorted(set(expected) - set(entries))
    assert not missing, f"DescribeConfigs left out {missing}"
    for name, value in expected.items():
        entry = entries[name]
        if name == "retention.ms":
            assert (entry.value, entry.is_default) == ("3600000", False)
            assert entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
            continue
        assert (entry.value, entry.is_default) == (value, True), name
        assert entry.source == ConfigSource.DEFAULT_CONFIG.value, name
        assert not entry.is_read_only and not entry.is_sensitive, name


def test_max_message_bytes_is_enforced(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "small", 1, {"max.message.bytes": "2048"})
    with pytest.raises(KafkaException) as err:
        produce(b, "small", [{"value": bytes(range(256)) * 16}])          # a 4 KiB batch
    assert err.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    sent = produce(b, "small", [{"value": b"x" * 1000}])
    assert sent[0].offset() == 0                                  # nothing of the big one
    assert values(read_partitions(b, "small", 1)) == [b"x" * 1000]


def test_aborted_records_never_reach_read_committed(kafka_mq):
    """Two transactional producers interleave on one partition: one commits while the other's
    open transaction (aborted later) surrounds it in the log. The reader stops at a committed
    last record, so nothing it skipped can be still on its way."""
    b = kafka_mq.bootstrap
    create_topic(b, "interleaved", 1)
    with producer(b, {"transactional.id": "aborting"}) as aborting, \
            producer(b, {"transactional.id": "committing"}) as committing:
        aborting.init_transactions(WAIT)
        committing.init_transactions(WAIT)
        aborting.begin_transaction()
        committing.begin_transaction()
        deliver(aborting, "interleaved", [{"value": b"a1"}, {"value": b"a2"}])
        deliver(committing, "interleaved", [{"value": b"c1"}])
        deliver(aborting, "interleaved", [{"value": b"a3"}])
        deliver(committing, "interleaved", [{"value": b"c2"}])
        committing.commit_transaction(WAIT)
        deliver(aborting, "interleaved", [{"value": b"a4"}])
        aborting.abort_transaction(WAIT)
        committing.begin_transaction()
        deliver(committing, "interleaved", [{"value": b"end"}])
        committing.commit_transaction(WAIT)

    got = read_partitions(b, "interleaved", 3, conf={"isolation.level": "read_committed"})
    assert values(got) == [b"c1", b"c2", b"end"]

    kp = KafkaConsumer(bootstrap_servers=b, isolation_level="read_committed",
                       enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        tp = TopicPartition("interleaved", 0)
        kp.assign([tp])
        kp.seek_to_beginning(tp)
        got = collect(lambda: [r for rs in kp.poll(timeout_ms=200).values() for r in rs], 3)
        assert [r.value for r in got] == [b"c1", b"c2", b"end"]
    finally:
        kp.close()

