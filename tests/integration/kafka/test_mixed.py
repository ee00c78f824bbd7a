"""One broker, two protocols, one set of data: a record produced by a Kafka client is read by
``mq.Consumer`` through its map, a record produced by ``mq.Producer`` is fetched by
confluent-kafka and kcat, and one consumer group holds a native member and a Kafka-protocol
member at once. These tests need mq's Unix socket, so they skip on a peer broker."""

from __future__ import annotations

import time

from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaException
from kclients import WAIT, collect, consumer, create_topic, produce, read_partitions

from mq.client.admin import Admin
from mq.client.consumer import Consumer as MqConsumer
from mq.client.producer import Producer as MqProducer
from mq.client.types import TopicPartition as MqTopicPartition


def native_poll(c: MqConsumer, count: int) -> list:
    return collect(lambda: [r for rs in c.poll(timeout_ms=100).values() for r in rs], count)


def test_kafka_record_is_read_by_mq_consumer(mixed):
    create_topic(mixed.bootstrap, "k2n", 2)
    ts = int(time.time() * 1000) - 5_000
    [sent] = produce(mixed.bootstrap, "k2n", [{"value": b"from librdkafka", "key": b"key",
                                               "partition": 1, "timestamp": ts,
                                               "headers": [("h", b"1"), ("h", b"2")]}],
                     {"compression.type": "zstd", "enable.idempotence": True})
    with MqConsumer("k2n", socket=mixed.socket, value_bytes=True) as c:
        [record] = native_poll(c, 1)
    assert (record.partition, record.offset, record.timestamp_ms, record.timestamp_type) == (
        1, sent.offset(), ts, 0)
    assert bytes(record.key) == b"key" and record.value == b"from librdkafka"
    assert [(k, bytes(v)) for k, v in record.headers] == [("h", b"1"), ("h", b"2")]


def test_mq_record_is_fetched_by_confluent_and_kcat(mixed, kcat):
    with Admin(mixed.socket) as admin:
        admin.create_topic("n2k", 1)
    ts = int(time.time() * 1000) - 5_000
    with MqProducer(socket=mixed.socket, compression_type="lz4") as p:
        meta = p.send("n2k", value=b"from mq", key=b"key", headers=[("h", b"v")],
                      timestamp_ms=ts).get(timeout=WAIT)
    [msg] = read_partitions(mixed.bootstrap, "n2k", 1)
    assert (msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()) == (
        meta.offset, b"key", b"from mq", [("h", b"v")], (TIMESTAMP_CREATE_TIME, ts))
    out = kcat.run("-C", "-t", "n2k", "-o", "beginning", "-e", "-f", "%o|%k|%s|%T|%h\n").stdout
    assert out.decode() == f"{meta.offset}|key|from mq|{ts}|h=v\n"


def test_one_group_with_a_native_and_a_kafka_member(mixed):
    b = mixed.bootstrap
    create_topic(b, "both", 4)
    kafka = consumer(b, "mixed-g", {"auto.offset.reset": "earliest"})
    native = MqConsumer(group_id="mixed-g", socket=mixed.socket, value_bytes=True,
                        session_timeout_ms=6000, enable_auto_commit=False)
    try:
        kafka.subscribe(["both"])
        native.subscribe(["both"])
        got: dict[str, list] = {"kafka": [], "native": []}

        def step() -> None:
            msg = kafka.poll(0.05)
            if msg is not None:
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                got["kafka"].append((msg.partition(), msg.value()))
            for records in native.poll(timeout_ms=50).values():
                got["native"] += [(r.partition, r.value) for r in records]

        def assigned() -> tuple[set[int], set[int]]:
            return ({tp.partition for tp in kafka.assignment()},
                    {tp.partition for tp in native.assignment()})

        def until(condition, message: str) -> None:
            deadline = time.monotonic() + WAIT
            while not condition():
                assert time.monotonic() < deadline, f"{message}: {assigned()} {got}"
                step()

        def split() -> bool:
            k, n = assigned()
            return bool(k) and bool(n) and not k & n and k | n == {0, 1, 2, 3}
        until(split, "the two members splitting 4 partitions")
        produce(b, "both", [{"value": b"%d-%d" % (p, i), "partition": p}
                            for p in range(4) for i in range(3)])
        until(lambda: len(got["kafka"]) + len(got["native"]) >= 12, "12 records")
        k, n = assigned()
        assert {p for p, _ in got["kafka"]} <= k and {p for p, _ in got["native"]} <= n
        assert sorted(v for _, v in got["kafka"] + got["native"]) == sorted(
            b"%d-%d" % (p, i) for p in range(4) for i in range(3))
        native.commit()
        kafka.commit(asynchronous=False)
    finally:
        kafka.close()
        native.close()
    with Admin(mixed.socket) as admin:
        committed = admin.list_group_offsets("mixed-g")
    assert committed == {MqTopicPartition("both", p): 3 for p in range(4)}
