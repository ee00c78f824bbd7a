"""librdkafka (confluent-kafka) helpers shared by the Kafka-protocol tests: short timeouts so
that the directory stays fast, topic creation through CreateTopics, and producing or reading a
known number of records with every failure raised, never swallowed.

Timeouts: ``session.timeout.ms`` 6000 (Kafka's minimum group.min.session.timeout.ms) and
``heartbeat.interval.ms`` 500, so a rebalance is seen within half a second; ``fetch.wait.max.ms``
100 (librdkafka's default 500) so a caught-up consumer notices new records quickly.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Iterable

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

from mq.testing import wait_for

WAIT = 30.0                   # seconds: a generous bound for one step on a loaded 2-core box

# librdkafka's log lines (a refused connection after the broker stopped, say) go to Python's
# logging, which pytest shows with a failure, not to stderr.
LOGGER = {"logger": logging.getLogger("librdkafka")}
CONSUMER = {**LOGGER, "fetch.wait.max.ms": 100, "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500, "enable.partition.eof": False,
            "topic.metadata.refresh.interval.ms": 1000}
PRODUCER = {**LOGGER, "linger.ms": 5}


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **LOGGER})


def create_topic(bootstrap: str, name: str, partitions: int = 1,
                 config: dict[str, str] | None = None, replication_factor: int = 1) -> None:
    """CreateTopics, waiting until the topic is in Metadata with all its partitions (one
    replica each unless ``replication_factor`` says otherwise: a cluster's tests give 3)."""
    client = admin(bootstrap)
    futures = client.create_topics([NewTopic(name, partitions, replication_factor,
                                              config=config or {})], operation_timeout=WAIT)
    futures[name].result(WAIT)
    wait_for(lambda: _partitions(client, name) == partitions, WAIT, 0.05,
             f"topic {name} with {partitions} partitions in Metadata")


def _partitions(client: AdminClient, name: str) -> int:
    meta = client.list_topics(name, timeout=WAIT).topics[name]
    return -1 if meta.error is not None else len(meta.partitions)


def producer(bootstrap: str, conf: dict | None = None) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, **PRODUCER, **(conf or {})})


def produce(bootstrap: str, topic: str, records: Iterable[dict], conf: dict | None = None
            ) -> list:
    """Produce ``records`` (keyword arguments of ``Producer.produce``: value, key, partition,
    headers, timestamp) with one producer, flush, and return the delivered messages in the
    order of their delivery reports (each partition's in the order given); raises
    ``KafkaException`` with the first delivery error.

    The producer learns the topic's metadata before the first record: a record produced while
    the partition is unknown waits in librdkafka's unassigned queue, and when the metadata
    arrives during ``flush()`` the records move one by one to a partition whose linger is
    already over, so each may leave as a batch of its own (seen in CI on a loaded box)."""
    with producer(bootstrap, conf) as p:
        p.list_topics(topic, timeout=WAIT)
        return deliver(p, topic, records)


def deliver(p: Producer, topic: str, records: Iterable[dict]) -> list:
    """``produce`` on an existing producer (in a transaction, say)."""
    reports: list = []
    for record in records:
        p.produce(topic, on_delivery=lambda err, msg: reports.append((err, msg)), **record)
        p.poll(0)
    left = p.flush(WAIT)
    assert left == 0, f"{left} records not delivered within {WAIT}s"
    for err, _ in reports:
        if err is not None:
            raise KafkaException(err)
    return [msg for _, msg in reports]


def consumer(bootstrap: str, group: str | None = None, conf: dict | None = None) -> Consumer:
    settings = {"bootstrap.servers": bootstrap, **CONSUMER, **(conf or {})}
    if group is not None:
        settings["group.id"] = group
    settings.setdefault("group.id", "kclients-assign-only")     # unused without subscribe()
    settings.setdefault("enable.auto.commit", False)
    return Consumer(settings)


def collect(poll_once, count: int, timeout: float = WAIT) -> list:
    """Call ``poll_once()`` (one poll of any client, returning a list of records) until
    ``count`` records came; fails if fewer came within ``timeout`` seconds."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        assert time.monotonic() < deadline, f"got {len(out)} of {count} records: {out}"
        out += poll_once()
    return out


def read(c: Consumer, count: int, timeout: float = WAIT) -> list:
    """``count`` records from ``c``; raises on a consumer error (``collect``)."""
    def poll_once() -> list:
        msg = c.poll(0.2)
        if msg is not None and msg.error() is not None:
            raise KafkaException(msg.error())
        return [] if msg is None else [msg]
    return collect(poll_once, count, timeout)


def offset_for_time(c: Consumer, topic: str, timestamp_ms: int, partition: int = 0) -> int:
    """ListOffsets by timestamp through ``offsets_for_times``: -1 when no record qualifies."""
    [tp] = c.offsets_for_times([TopicPartition(topic, partition, timestamp_ms)], WAIT)
    assert tp.error is None, tp.error
    return tp.offset


def read_partitions(bootstrap: str, topic: str, count: int, partitions: Iterable[int] = (0,),
                    offset: int = OFFSET_BEGINNING, conf: dict | None = None) -> list:
    """``count`` records of ``topic``'s ``partitions``, assigned (no group) at ``offset``."""
    c = consumer(bootstrap, conf=conf)
    try:
        c.assign([TopicPartition(topic, p, offset) for p in partitions])
        return read(c, count)
    finally:
        c.close()


def read_to_end(bootstrap: str, topic: str, partition: int = 0, conf: dict | None = None
                ) -> list:
    """Every record of ``topic``-``partition`` from its start to its end (librdkafka's
    partition EOF), assigned without a group; ``conf`` adds consumer settings
    (``isolation.level``, say)."""
    c = consumer(bootstrap, conf={**(conf or {}), "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        rows: list = []
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return rows
                raise KafkaException(msg.error())
            rows.append(msg)
        raise AssertionError(f"no end of {topic}-{partition} within {WAIT}s "
                             f"({len(rows)} records)")
    finally:
        c.close()


def values(msgs: Iterable) -> list:
    return [m.value() for m in msgs]



def segment_batches(data_dir: str, topic: str, partition: int = 0) -> list[tuple[int, int, int]]:
    """(base offset, record count, codec) of every batch in mq's first segment of a partition,
    read from the file as Kafka lays it out: baseOffset int64 at byte 0, batchLength int32 at
    8, attributes int16 at 21 (codec in bits 0-2), lastOffsetDelta int32 at 23, records count
    int32 at 57; a batch is 12 + batchLength bytes."""
    path = os.path.join(data_dir, f"{topic}-{partition}", "0" * 20 + ".log")
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        attributes, = struct.unpack_from(">h", data, pos + 21)
        count, = struct.unpack_from(">i", data, pos + 57)
        out.append((base, count, attributes & 7))
        pos += 12 + length
    return out
