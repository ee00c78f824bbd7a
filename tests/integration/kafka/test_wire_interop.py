"""One broker, two protocols, one set of data: a batch produced over Kafka's protocol is in the
segment byte for byte (bar the 12 stamped bytes) and comes back byte for byte from Fetch and
from mq's own read-only map; records cross between mq's clients and Kafka clients."""

from __future__ import annotations

import os
import struct
import time

import confluent_kafka

import mq
from mq.log.builder import build_batch
from mq.log.compression import LZ4
from mq.log.reader import PartitionReader
from wire_calls import call


def test_a_batch_is_stored_and_fetched_byte_for_byte(mixed):
    with mq.Admin(socket=mixed.socket) as admin:
        admin.create_topic("bytes", partitions=1)
    batch = bytes(build_batch([(1_700_000_000_000 + i, b"k%d" % i, b"v" * i, [("h", b"x")])
                               for i in range(10)], compression=LZ4))
    for _ in range(2):                           # two batches: the second at offset 10
        reply = call(mixed.bootstrap, 0, 9, {"acks": -1, "timeout_ms": 5000, "topic_data": [
            {"name": "bytes", "partition_data": [{"index": 0, "records": batch}]}]})
    row = reply["responses"][0]["partition_responses"][0]
    assert (row["error_code"], row["base_offset"]) == (0, 10)
    log_path = os.path.join(mixed.data_dir, "bytes-0", "00000000000000000000.log")
    with open(log_path, "rb") as f:
        stored = f.read()
    assert len(stored) == 2 * len(batch)
    for i, base in enumerate((0, 10)):
        got = stored[i * len(batch):(i + 1) * len(batch)]
        assert struct.unpack(">q", got[:8])[0] == base            # stamped: base offset
        assert got[8:12] == batch[8:12]
        assert got[16:] == batch[16:]                             # the CRC'd part untouched
    # Fetch from the middle of the second batch returns that batch whole, as stored.
    fetched = call(mixed.bootstrap, 1, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "topics": [{"topic": "bytes", "partitions": [
            {"partition": 0, "fetch_offset": 15, "partition_max_bytes": 1 << 20}]}]})
    part = fetched["responses"][0]["partitions"][0]
    assert part["error_code"] == 0 and part["high_watermark"] == 20
    assert bytes(part["records"]) == stored[len(batch):]
    with PartitionReader(os.path.join(mixed.data_dir, "bytes-0")) as reader:
        mapped = b"".join(bytes(b.buffer) for b in reader.read(0))
    assert mapped == stored


def test_records_cross_between_mq_clients_and_kafka_clients(mixed):
    with mq.Admin(socket=mixed.socket) as admin:
        admin.create_topic("cross", partitions=2)
    producer = confluent_kafka.Producer({"bootstrap.servers": mixed.bootstrap,
                                         "enable.idempotence": True, "linger.ms": 2})
    for i in range(50):
        producer.produce("cross", key=b"kafka-%d" % i, value=b"%d" % i, partition=i % 2,
                         headers=[("src", b"kafka")], timestamp=1_700_000_000_000 + i)
    assert producer.flush(10) == 0
    with mq.Producer(socket=mixed.socket) as native:
        for i in range(50):
            native.send("cross", value=b"%d" % i, key=b"mq-%d" % i, partition=i % 2,
                        headers=[("src", b"mq")])
        native.flush()
    # mq's own consumer reads the Kafka client's records through its map...
    with mq.Consumer(socket=mixed.socket) as consumer:
        consumer.assign([mq.TopicPartition("cross", p) for p in (0, 1)])
        consumer.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 100 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got += records
    kafka_made = sorted((bytes(r.key), bytes(r.value), r.timestamp_ms) for r in got
                        if bytes(r.key).startswith(b"kafka-"))
    assert kafka_made == sorted((b"kafka-%d" % i, b"%d" % i, 1_700_000_000_000 + i)
                                for i in range(50))
    # ...and a Kafka consumer fetches mq's producer's records.
    kc = confluent_kafka.Consumer({"bootstrap.servers": mixed.bootstrap, "group.id": "x",
                                   "enable.auto.commit": False})
    kc.assign([confluent_kafka.TopicPartition("cross", p, 0) for p in (0, 1)])
    fetched = []
    deadline = time.monotonic() + 10
    while len(fetched) < 100 and time.monotonic() < deadline:
        m = kc.poll(0.2)
        if m is not None and m.error() is None:
            fetched.append(m)
    kc.close()
    assert len(fetched) == 100
    mq_made = sorted((m.key(), m.value(), m.headers()[0]) for m in fetched
                     if m.key().startswith(b"mq-"))
    assert mq_made == sorted((b"mq-%d" % i, b"%d" % i, ("src", b"mq")) for i in range(50))
    assert [m.offset() for m in fetched if m.partition() == 0] == list(range(50))
