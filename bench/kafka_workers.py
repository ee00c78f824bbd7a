"""The worker processes of ``bench.kafka_wire``: librdkafka (confluent-kafka) producers and
consumers speaking to mq's Kafka listener, and the ``mq.Producer`` they are compared with.

Each is ``fn(start, **kwargs)`` for ``harness.run_workers``: it connects and learns the
topic's metadata, calls ``start()`` (the barrier), runs its timed loop and returns a dict.
confluent-kafka is imported in the worker, after the fork: librdkafka starts its threads
when a client is made, and the harness process never makes one.
"""

from __future__ import annotations

import os
import struct
import time

from bench import harness, peers
from bench.harness import WorkerError, quiet_gc

# The same batching on both sides: librdkafka's defaults (linger.ms 5, batch.size 1,000,000,
# batch.num.messages 10,000, no compression, idempotence off).
RDK_PRODUCER = {"linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none",
                "enable.idempotence": False, "log.connection.close": False}
MQ_PRODUCER = {"linger_ms": 5, "batch_size": 1_000_000, "enable_idempotence": False}
# librdkafka's fetch defaults (fetch.max.bytes 50 MiB, max.partition.fetch.bytes 1 MiB,
# fetch.wait.max.ms 500, fetch.min.bytes 1) but one: once queued.min.messages (100,000) wait
# in its local queue, librdkafka postpones the partition's next Fetch by
# fetch.queue.backoff.ms, 1000 ms by default. A consumer reading a backlog then stalls for up
# to 1 s every 100,000 records whatever the broker (measured here: 0.22-0.31 M records/s of
# 100 B with the default, 1.76 M with 10 ms). No group traffic: the partition is assigned.
RDK_CONSUMER = {"enable.auto.commit": False, "enable.partition.eof": False,
                "fetch.queue.backoff.ms": 10, "log.connection.close": False}
RDK_BATCH = 10_000                 # consume(num_messages=); mq.Consumer polls 10,000 too
RDK_LATENCY = {"acks": 1, "log.connection.close": False}


# --- producers --------------------------------------------------------------------------------

def _rdk_producer(bootstrap: str, topic: str, extra: dict):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, **extra})
    p.list_topics(topic, timeout=10)           # connected, metadata known, before the clock
    return p


def rdk_producer(start, bootstrap: str, topic: str, values: list[bytes], n: int,
                 acks) -> dict:
    p = _rdk_producer(bootstrap, topic, {**RDK_PRODUCER, "acks": str(acks)})
    produce, poll, k = p.produce, p.poll, len(values)
    quiet_gc()
    start()
    cpu0 = time.process_time()
    t0 = time.perf_counter_ns()
    for i in range(n):
        while True:
            try:
                produce(topic, values[i % k], partition=0)
                break
            except BufferError:                # its queue is full: serve it, then retry
                poll(0.001)
    left = p.flush(120)
    t1 = time.perf_counter_ns()
    if left:
        raise WorkerError(f"librdkafka: {left} records not delivered after flush()")
    return {"t_first": t0, "t_end": t1, "n": n, "cpu_s_loop": time.process_time() - cpu0}


def mq_producer(start, socket: str, topic: str, values: list[bytes], n: int, acks) -> dict:
    import mq
    p = mq.Producer(socket=socket, acks=acks, **MQ_PRODUCER)
    p.partitions_for(topic)
    send, k = p.send, len(values)
    quiet_gc()
    start()
    cpu0 = time.process_time()
    t0 = time.perf_counter_ns()
    for i in range(n):
        send(topic, values[i % k], partition=0)
    p.flush()
    t1 = time.perf_counter_ns()
    cpu = time.process_time() - cpu0
    p.close()
    return {"t_first": t0, "t_end": t1, "n": n, "cpu_s_loop": cpu}


# --- consumers --------------------------------------------------------------------------------

def rdk_consumer(start, bootstrap: str, topic: str, n: int, timeout_s: float = 120.0) -> dict:
    """Reads partition 0 of ``topic`` from the beginning until ``n`` records came, taking the
    length of every value (as ``mq_workers.mq_consumer`` does)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{os.getpid()}",
                  **RDK_CONSUMER})
    c.list_topics(topic, timeout=10)
    consume = c.consume
    got = nbytes = 0
    quiet_gc()
    start()
    cpu0 = time.process_time()
    t_start = time.perf_counter_ns()
    # Assigned only now: librdkafka starts fetching at once, in its own threads, and would
    # otherwise have the records queued before the clock started.
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    deadline = time.monotonic() + timeout_s
    while got < n and time.monotonic() < deadline:
        # consume(k, timeout) waits until it has k messages or the timeout passed: never ask
        # for more than are left, or the last call waits out its timeout.
        for m in consume(min(RDK_BATCH, n - got), 1.0):
            if m.error() is not None:
                raise WorkerError(f"librdkafka consumer: {m.error()}")
            got += 1
            nbytes += len(m.value())
    t_last = time.perf_counter_ns()
    cpu = time.process_time() - cpu0
    c.close()
    return {"t_start": t_start, "t_last": t_last, "n": got, "bytes": nbytes,
            "cpu_s_loop": cpu}


# --- latency: open loop (peers.paced_loop), the intended send time in the value -------------

def rdk_lat_producer(start, bootstrap: str, topic: str, size: int, rate: float, n: int,
                     linger_ms: int) -> dict:
    p = _rdk_producer(bootstrap, topic, {**RDK_LATENCY, "linger.ms": linger_ms})
    produce, poll = p.produce, p.poll
    buf = bytearray(b"x" * size)
    pack = struct.Struct("<q").pack_into

    def one(t_i: int) -> None:
        pack(buf, 0, t_i)
        produce(topic, bytes(buf), partition=0)
        poll(0)                                # serve delivery reports as they come
    quiet_gc()
    start()
    res = peers.paced_loop(one, rate, n)
    p.flush(30)
    res["cpu_s"] = harness.cpu_seconds()
    return res


def rdk_lat_consumer(start, bootstrap: str, topic: str, n: int, warm: int,
                     timeout_s: float) -> dict:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{os.getpid()}",
                  **RDK_CONSUMER})
    c.list_topics(topic, timeout=10)
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    rec = peers.LatencyRecorder(n, warm)
    add, consume, poll, clock = rec.add, c.consume, c.poll, time.perf_counter_ns
    quiet_gc()
    start()
    cpu0 = harness.cpu_seconds()
    deadline = time.monotonic() + timeout_s
    while rec.got < n and time.monotonic() < deadline:
        # What is queued, without waiting (consume(k, t) would wait for k messages); when
        # nothing is, wait for the next one.
        msgs = consume(1000, 0)
        if not msgs:
            m = poll(0.1)
            msgs = [m] if m is not None else []
        now = clock()
        for m in msgs:
            if m.error() is None:
                add(now, m.value())
    res = rec.result()
    res["cpu_s"] = harness.cpu_seconds() - cpu0
    c.close()
    return res
