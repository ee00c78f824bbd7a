"""``mq.client.producer.Producer`` against a real broker subprocess.

What landed is checked by reading the partition logs directly (``PartitionLog``) after the
broker stopped, or with ListOffsets while it runs. Nothing sleeps to wait for a condition: the
tests wait on futures, events and processes, each with a timeout.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import fake_broker as fakes
import pytest
from brokers import broker_with, create_topic

import mq
import mq.testing
from mq.client.admin import Admin
from mq.client.partitioner import DefaultPartitioner, murmur2, to_positive
from mq.client.producer import REQUEST_ENVELOPE_BYTES, FutureRecordMetadata, Producer
from mq.client.types import RecordMetadata, TopicPartition
from mq.errors import (
    BrokerUnavailableError,
    ClosedError,
    InvalidTimestampError,
    MessageTooLargeError,
    RecordListTooLargeError,
    UnknownTopicOrPartitionError,
)
from mq.log.compression import GZIP, LZ4, NONE, available_codecs
from mq.log.log import PartitionLog

fake_broker = fakes.fake_broker        # the fixture (fake_broker.py)
WAIT = 30        # seconds: generous bound for any single wait on a loaded 2-core box


# --- helpers ----------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _close_leftover_producers():
    """A failing test must not leave a producer whose exit-time flush waits for a dead
    broker."""
    yield
    from mq.client import producer as producer_module
    for producer in list(producer_module._LIVE):
        producer.close(timeout=1)


def end_offsets(b, topic: str) -> list[int]:
    with Admin(socket=b.socket) as admin:
        return [end for _, end in admin.describe_topic(topic)["offsets"]]


def read_batches(b, topic: str, partition: int) -> list:
    """Every batch of a partition as ``(batch header fields, [records])``; stops the broker
    first (a ``PartitionLog`` must not be opened under a running broker)."""
    b.stop()
    plog = PartitionLog.open(os.path.join(b.data_dir, f"{topic}-{partition}"))
    try:
        out = []
        for batch in plog.batches():
            batch.validate()
            records = [(r.offset, r.timestamp, None if r.key is None else bytes(r.key),
                        None if r.value is None else bytes(r.value),
                        [(k, None if v is None else bytes(v)) for k, v in r.headers])
                       for r in batch.records()]
            out.append((batch, records))
        return out
    finally:
        plog.close()


def read_records(b, topic: str, partitions: int = 1) -> dict[int, list[tuple]]:
    out = {}
    for p in range(partitions):
        out[p] = [rec for _, recs in read_batches(b, topic, p) for rec in recs]
    return out


# --- basics -----------------------------------------------------------------------------------

@pytest.mark.parametrize("acks", [1, "all", -1])
def test_sync_send_returns_increasing_offsets(broker, acks):
    create_topic(broker, "orders", 1)
    with Producer(socket=broker.socket, acks=acks) as producer:
        metas = [producer.send("orders", value=b"v%d" % i).get(timeout=WAIT) for i in range(5)]
    assert [m.offset for m in metas] == [0, 1, 2, 3, 4]
    assert all(isinstance(m, RecordMetadata) and m.topic == "orders" and m.partition == 0
               for m in metas)
    assert all(m.timestamp_ms > 0 for m in metas)
    records = read_records(broker, "orders")[0]
    assert [r[3] for r in records] == [b"v%d" % i for i in range(5)]


def test_future_interface_and_callbacks(broker):
    create_topic(broker, "t", 1)
    got: list = []
    done = threading.Event()
    with Producer(socket=broker.socket, acks=1, linger_ms=10) as producer:
        fut = producer.send("t", value=b"x")
        assert isinstance(fut, FutureRecordMetadata)
        fut.add_callback(lambda tag, meta: got.append((tag, meta)), "cb")
        fut.add_errback(lambda exc: got.append(("eb", exc)))
        fut.add_callback(lambda meta: done.set())
        meta = fut.get(timeout=WAIT)
        assert done.wait(WAIT)
        assert fut.is_done and fut.succeeded() and not fut.failed()
        assert fut.exception() is None and fut.attempts == 1
        assert got == [("cb", meta)]
        # A callback added after completion runs at once, in this thread.
        late: list = []
        fut.add_callback(late.append)
        fut.add_errback(late.append)
        assert late == [meta]


def test_callback_and_errback_arguments_as_the_readme_says(broker, caplog):
    """add_callback(fn, *args, **kwargs) calls fn(*args, metadata, **kwargs); add_errback
    the same with the exception; an exception in a callback is logged, not raised."""
    create_topic(broker, "small", 1, {"max.message.bytes": "2000"})
    got: list = []
    both = threading.Semaphore(0)

    def record(*args, **kwargs):
        got.append((args, kwargs))
        both.release()

    def boom(meta):
        raise RuntimeError("callback failed")

    with Producer(socket=broker.socket, acks=1) as producer:
        good = producer.send("small", value=b"ok")
        good.add_callback(boom).add_callback(record, "a", 2, tag="cb")
        bad = producer.send("small", value=b"x" * 3000, partition=0)
        bad.add_errback(record, "b", tag="eb").add_callback(record, "never")
        meta = good.get(timeout=WAIT)
        with pytest.raises(MessageTooLargeError) as failure:
            bad.get(timeout=WAIT)
        assert both.acquire(timeout=WAIT) and both.acquire(timeout=WAIT)
        assert sorted(got, key=repr) == sorted(
            [(("a", 2, meta), {"tag": "cb"}), (("b", failure.value), {"tag": "eb"})], key=repr)
        assert producer.send("small", value=b"after").get(timeout=WAIT).offset == 1
    assert any("callback" in r.message and r.exc_info for r in caplog.records)


def test_errback_gets_the_brokers_error(broker):
    create_topic(broker, "small", 1, {"max.message.bytes": "2000"})
    errors: list = []
    called = threading.Event()
    with Producer(socket=broker.socket, acks=1) as producer:
        fut = producer.send("small", value=b"x" * 3000)
        fut.add_callback(lambda meta: errors.append(("unexpected success", meta)))
        fut.add_errback(lambda exc: (errors.append(exc), called.set()))
        with pytest.raises(MessageTooLargeError, match="max.message.bytes"):
            fut.get(timeout=WAIT)
        assert called.wait(WAIT)
        assert fut.failed() and isinstance(fut.exception(), MessageTooLargeError)
        assert len(errors) == 1 and isinstance(errors[0], MessageTooLargeError)
        # The producer carries on after a non-retriable failure.
        assert producer.send("small", value=b"ok").get(timeout=WAIT).offset == 0


def test_acks_0_fire_and_forget_then_flush(broker):
    create_topic(broker, "fire", 2)
    with Producer(socket=broker.socket, acks=0) as producer:
        futures = [producer.send("fire", value=b"%d" % i, partition=i % 2) for i in range(1000)]
        producer.flush(timeout=WAIT)
        assert all(f.is_done for f in futures)
        assert {f.get(timeout=0).offset for f in futures} == {-1}      # no reply, no offset
    # acks=0 has no reply: wait until the broker has read everything off the socket.
    mq.testing.wait_for(lambda: sum(end_offsets(broker, "fire")) == 1000, timeout=WAIT,
                        message="1000 acks=0 records appended")
    records = read_records(broker, "fire", 2)
    assert sorted(int(r[3]) for p in records for r in records[p]) == list(range(1000))


def test_linger_delivers_a_single_record_without_further_sends(broker):
    create_topic(broker, "t", 1)
    with Producer(socket=broker.socket, acks=1, linger_ms=50) as producer:
        fut = producer.send("t", value=b"lonely")
        meta = fut.get(timeout=WAIT)      # no flush(), no other send: the linger timer fires
        assert meta.offset == 0
        fut2 = producer.send("t", value=b"again")
        assert fut2.get(timeout=WAIT).offset == 1


def test_linger_zero_sends_at_once(broker):
    create_topic(broker, "t", 1)
    with Producer(socket=broker.socket, acks=1, linger_ms=0) as producer:
        for i in range(20):
            assert producer.send("t", value=b"%d" % i).get(timeout=WAIT).offset == i


def _counted_produce_frame(monkeypatch) -> list:
    """Count the records ``send()`` writes whole (``native.produce_send``, one C call)."""
    from mq.log import native
    calls: list = []
    encode = native.produce_send
    if encode is None:
        pytest.skip("the C extension is not built")
    monkeypatch.setattr(native, "produce_send", lambda *a: (calls.append(a), encode(*a))[1])
    return calls


def _counted_send_open(monkeypatch) -> list[bool]:
    """For each ``send()`` with ``linger_ms`` above 0, whether its C add
    (``native.send_open``) took the record (True) or left it to the Python path."""
    from mq.log import native
    taken: list[bool] = []
    fast = native.send_open
    if fast is None:
        pytest.skip("the C extension is not built")
    monkeypatch.setattr(native, "send_open",
                        lambda *a: (fut := fast(*a), taken.append(fut is not None))[0])
    return taken


@pytest.mark.parametrize("idempotent", [False, True])
def test_linger_zero_writes_a_record_whole_as_the_batches_would(broker, monkeypatch,
                                                                idempotent):
    """With ``linger_ms=0`` and nothing queued, ``send()`` writes a record's request whole,
    built in one C call, and the log holds what the general path writes: the same records
    (keys, values, headers, timestamps, offsets) and batch headers, sequences included."""
    from mq.log import native
    create_topic(broker, "whole", 1)
    create_topic(broker, "batched", 1)
    records = [(b"k%d" % i if i % 3 else None, b"v%d" % i * (i + 1),
                [("h", b"%d" % i)] if i % 2 else None, 1_700_000_000_000 + i)
               for i in range(40)]
    calls = _counted_produce_frame(monkeypatch)
    for topic in ("whole", "batched"):
        if topic == "batched":
            monkeypatch.setattr(native, "produce_send", None)
        with Producer(socket=broker.socket, acks="all" if idempotent else 1, linger_ms=0,
                      enable_idempotence=idempotent) as producer:
            for key, value, headers, ts in records:
                meta = producer.send(topic, value=value, key=key, headers=headers,
                                     timestamp_ms=ts).get(timeout=WAIT)
                assert (meta.timestamp_ms, meta.partition) == (ts, 0)
    assert len(calls) == len(records)
    whole, batched = (read_batches(broker, t, 0) for t in ("whole", "batched"))
    assert [recs for _, recs in whole] == [recs for _, recs in batched]
    fields = ("base_offset", "attributes", "base_sequence", "producer_epoch", "records_count",
              "max_timestamp")
    assert [[getattr(b, f) for f in fields] for b, _ in whole] == \
        [[getattr(b, f) for f in fields] for b, _ in batched]
    assert all((b.producer_id >= 0) == idempotent for b, _ in whole)


def test_a_record_written_whole_over_a_lost_connection_is_sent_again(broker, monkeypatch):
    """The connection breaks under ``send()``'s whole write: the record waits in the queue
    as the general path leaves a batch it could not write, and goes out once the producer
    has connected again, once (idempotence)."""
    create_topic(broker, "t", 1)
    calls = _counted_produce_frame(monkeypatch)
    with Producer(socket=broker.socket, acks="all", linger_ms=0) as producer:
        assert producer.send("t", value=b"first").get(timeout=WAIT).offset == 0
        conn = producer._io.conn
        write = conn.send_built

        def broken(*args):
            conn._sock.shutdown(socket.SHUT_RDWR)     # the kernel refuses the write
            conn.send_built = write
            return write(*args)

        conn.send_built = broken
        fut = producer.send("t", value=b"second")
        assert fut.get(timeout=WAIT).offset == 1
        assert fut.attempts == 1 and producer._io.conn is not conn
        assert producer.send("t", value=b"third").get(timeout=WAIT).offset == 2
    assert len(calls) == 3
    assert [r[3] for r in read_records(broker, "t")[0]] == [b"first", b"second", b"third"]


@pytest.mark.parametrize("acks", [0, 1])
def test_linger_zero_sends_without_waking_the_io_thread(broker, acks):
    """With ``linger_ms=0`` the calling thread writes each record's request and the I/O
    thread, already watching the connection, is not woken for it: a wake-up would cost every
    send() a pipe write and a GIL hand-over at low rates (bench/RESULTS.md, finding 3)."""
    create_topic(broker, "t", 1)
    with Producer(socket=broker.socket, acks=acks, linger_ms=0) as producer:
        producer.send("t", value=b"first").get(timeout=WAIT)
        io, wakes = producer._io, []
        wake = io.wake
        io.wake = lambda: (wakes.append(1), wake())[1]
        for i in range(50):
            fut = producer.send("t", value=b"%d" % i)
            if acks:
                fut.get(timeout=WAIT)
        producer.flush(WAIT)
        io.wake = wake
    assert len(wakes) <= 1              # flush() wakes the thread once


def test_a_busy_caller_reads_its_own_replies_with_linger_zero(broker):
    """A caller that never lets go of the GIL (a busy loop) keeps its linger_ms=0 records
    moving: send() reads the replies the I/O thread cannot, which would otherwise wait for
    the switch interval (here 30 s). Callbacks still run on the I/O thread, afterwards."""
    create_topic(broker, "t", 1)
    caller = threading.get_ident()
    callback_threads: list[int] = []
    old = sys.getswitchinterval()
    with Producer(socket=broker.socket, acks=1, linger_ms=0, max_in_flight=1) as producer:
        producer.send("t", value=b"warm").get(timeout=WAIT)
        sys.setswitchinterval(WAIT)
        try:
            futures = []
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:     # busy: the GIL is never waited for
                futures.append(producer.send("t", value=b"%d" % len(futures)))
                if len(futures) == 1:
                    futures[0].add_callback(
                        lambda meta: callback_threads.append(threading.get_ident()))
                spin_until = time.perf_counter() + 100e-6
                while time.perf_counter() < spin_until:
                    pass
                if sum(f.is_done for f in futures) >= 50:
                    break
            acknowledged = sum(f.is_done for f in futures)
        finally:
            sys.setswitchinterval(old)
        assert acknowledged >= 50, f"only {acknowledged} of {len(futures)} acknowledged"
        producer.flush(timeout=WAIT)
        assert [f.get(timeout=WAIT).offset for f in futures] == \
            list(range(1, len(futures) + 1))
    assert callback_threads and callback_threads[0] != caller


def test_a_caller_with_max_in_flight_out_takes_their_replies_and_writes_whole(broker,
                                                                            monkeypatch):
    """With ``linger_ms=0`` and ``max_in_flight`` requests out whose replies have come, send()
    takes those replies itself and writes its record whole at once, instead of queueing it
    for an I/O thread that may wait for the GIL (here: busy in a callback, so it reads
    nothing)."""
    create_topic(broker, "t", 1)
    calls = _counted_produce_frame(monkeypatch)
    entered, release = threading.Event(), threading.Event()

    def hold(_meta):
        if threading.get_ident() != caller:   # (a callback added late runs here: no hold)
            entered.set()
            release.wait(WAIT)

    caller = threading.get_ident()
    with Producer(socket=broker.socket, acks=1, linger_ms=0, max_in_flight=1) as producer:
        while not entered.is_set():           # the I/O thread, held in a callback
            producer.send("t", value=b"held").add_callback(hold).get(timeout=WAIT)
        try:
            sock = producer._io.conn._sock
            futures = [producer.send("t", value=b"0")]
            for i in range(1, 10):
                assert select.select([sock], [], [], WAIT)[0], "no reply"
                futures.append(producer.send("t", value=b"%d" % i))
                assert futures[-2].is_done, f"record {i - 1}'s reply was not taken"
            written = len(calls)
        finally:
            release.set()
        offsets = [f.get(timeout=WAIT).offset for f in futures]
    assert offsets == list(range(offsets[0], offsets[0] + 10))
    assert written == offsets[0] + 10         # every record went out whole, built in C


def _sends(seed: int, n: int) -> list[dict]:
    """``send()`` arguments of every shape: an explicit partition, a key, neither (sticky),
    headers, a timestamp, no value; each value names its record."""
    rng = random.Random(seed)
    sends = []
    for i in range(n):
        kw: dict = {"value": b"v%d" % i + b"x" * rng.randrange(0, 300)}
        shape = rng.choice(["partition"] * 4 + ["key", "key", "sticky", "headers", "ts",
                                                "none"])
        if shape == "partition":
            kw["partition"] = rng.randrange(3)
        elif shape == "key":
            kw["key"] = b"k%d" % rng.randrange(20)
        elif shape == "headers":
            kw["headers"] = [("h", b"%d" % i)]
        elif shape == "ts":
            kw["timestamp_ms"] = 1_700_000_000_000 + i
        elif shape == "none":
            kw.update(value=None, key=b"tomb%d" % i, partition=rng.randrange(3))
        sends.append(kw)
    return sends


def test_a_record_into_an_open_batch_is_added_in_c_as_python_adds_it(broker, monkeypatch):
    """With linger_ms > 0, send() adds a record to its partition's open batch in one C call
    (``native.send_open``) in the common case and leaves the rest to its Python path. The
    two paths put the same records, keys, values and headers on the same partitions in the
    same order, and their futures tell the same partitions and offsets."""
    from mq.log import native
    taken = _counted_send_open(monkeypatch)
    sends = _sends(7, 600)
    metas = {}
    for topic in ("c", "py"):
        create_topic(broker, topic, 3)
        if topic == "py":
            monkeypatch.setattr(native, "send_open", None)
        # One batch per partition until flush (nothing closes one early, so the sticky
        # partition never moves); the same random sticky choice on both.
        with Producer(socket=broker.socket, acks=1, linger_ms=60_000, batch_size=1 << 20,
                      partitioner=DefaultPartitioner(random.Random(3))) as producer:
            futures = [producer.send(topic, **kw) for kw in sends]
            producer.flush(WAIT)
            metas[topic] = [(f.get(WAIT).partition, f.get(WAIT).offset) for f in futures]
    assert metas["c"] == metas["py"]
    c, py = read_records(broker, "c", 3), read_records(broker, "py", 3)
    assert {p: [r[2:] for r in recs] for p, recs in c.items()} == \
        {p: [r[2:] for r in recs] for p, recs in py.items()}
    assert 300 < sum(taken) < len(taken)     # the common case in C, the rest declined


def test_what_the_c_add_declines_raises_as_the_python_path_does(broker, monkeypatch):
    """The C add takes only the common case; a bad argument goes on to ``send()``'s Python
    path, which raises its error, and nothing is queued for it."""
    taken = _counted_send_open(monkeypatch)
    create_topic(broker, "t", 2)
    producer = Producer(socket=broker.socket, acks=1, linger_ms=60_000)
    first = producer.send("t", b"first", partition=0)      # opens the batch (Python)
    assert producer.send("t", b"second", partition=0) is not None and taken[-1]
    for args, kwargs, error in [
            ((), {"value": "text", "partition": 0}, TypeError),
            ((), {"value": b"v", "key": "text", "partition": 0}, TypeError),
            ((), {"value": b"v", "partition": 2}, UnknownTopicOrPartitionError),
            ((), {"value": b"v", "partition": -1}, UnknownTopicOrPartitionError),
            ((), {"value": b"v", "partition": True}, TypeError),
            ((), {"value": b"v", "partition": 0, "timestamp_ms": -2}, ValueError)]:
        with pytest.raises(error):
            producer.send("t", *args, **kwargs)
        assert not taken[-1]
    producer.close(WAIT)
    with pytest.raises(ClosedError):
        producer.send("t", b"late", partition=0)
    assert not taken[-1]
    assert first.get(timeout=WAIT).offset == 0
    assert [r[3] for r in read_records(broker, "t", 2)[0]] == [b"first", b"second"]


def test_the_c_add_follows_its_classes_when_they_change(broker, monkeypatch):
    """The C add reads a topic's and a batch's ``__slots__`` at offsets it learned once per
    class; a class changed meanwhile (here: an attribute added to it) is learned again, and
    every record still lands once, in order, through the C add."""
    from mq.client.producer_batches import Batch, TopicState
    taken = _counted_send_open(monkeypatch)
    create_topic(broker, "t", 1)
    with Producer(socket=broker.socket, acks=1, linger_ms=60_000) as producer:
        futures = [producer.send("t", b"%d" % i, partition=0) for i in range(50)]
        for cls in (TopicState, Batch):
            monkeypatch.setattr(cls, "probe", 1, raising=False)
            futures += [producer.send("t", b"%d" % i, partition=0)
                        for i in range(len(futures), len(futures) + 50)]
        producer.flush(WAIT)
        assert [f.get(WAIT).offset for f in futures] == list(range(150))
    assert [r[3] for r in read_records(broker, "t", 1)[0]] == [b"%d" % i for i in range(150)]
    assert taken.count(True) >= 145


def test_records_filling_their_batches_leave_the_c_add_to_python(broker, monkeypatch):
    """A record that could fill its batch is Python's (it may close the batch and open the
    next): with small batches every record still lands once, in order, and the C add
    declines some records as their batch fills."""
    taken = _counted_send_open(monkeypatch)
    create_topic(broker, "t", 1)
    with Producer(socket=broker.socket, acks=1, linger_ms=60_000, batch_size=2048) as producer:
        futures = [producer.send("t", value=b"%d" % i + b"x" * 100, partition=0)
                   for i in range(500)]
        producer.flush(WAIT)
        assert [f.get(WAIT).offset for f in futures] == list(range(500))
    batches = read_batches(broker, "t", 0)
    assert [r[3][:3].rstrip(b"x") for _, recs in batches for r in recs] == \
        [b"%d" % i for i in range(500)]
    assert len(batches) > 1 and taken.count(False) > 0 and taken.count(True) >= 10


def test_many_small_sends_make_few_batches(broker):
    create_topic(broker, "t", 1)
    with Producer(socket=broker.socket, acks=1, linger_ms=60_000, batch_size=16384) as p:
        futures = [p.send("t", value=b"r%04d" % i + b"." * 95) for i in range(1000)]
        p.flush(timeout=WAIT)
        assert [f.get(timeout=0).offset for f in futures] == list(range(1000))
    batches = read_batches(broker, "t", 0)
    # 1000 records of ~110 bytes in batches of 16 KiB (7 full batches and a tail) or fewer,
    # larger ones: a full batch keeps filling while max_in_flight requests are outstanding.
    assert len(batches) <= 8
    assert all(batch.size <= 1048576 for batch, _ in batches)
    assert [r[3][:5] for _, recs in batches for r in recs] == [b"r%04d" % i for i in range(1000)]


def test_batches_respect_the_topics_max_message_bytes(broker):
    # batch_size above the topic's max.message.bytes, and a pipeline kept full (acks=all,
    # one request in flight) so batches grow: none may exceed what the topic accepts.
    create_topic(broker, "capped", 1, {"max.message.bytes": "4000"})
    with Producer(socket=broker.socket, acks="all", batch_size=65536, max_in_flight=1,
                  linger_ms=1) as producer:
        futures = [producer.send("capped", value=b"%05d" % i + b"-" * 95) for i in range(2000)]
        producer.flush(timeout=WAIT)
        assert [f.get(timeout=0).offset for f in futures] == list(range(2000))
    batches = read_batches(broker, "capped", 0)
    assert all(batch.size <= 4000 for batch, _ in batches)
    assert len(batches) < 200                  # still batched: ~35 records a batch


@pytest.mark.parametrize("codec_name,codec", [(None, NONE), ("gzip", GZIP), ("lz4", LZ4)])
def test_compression(broker, codec_name, codec):
    if codec_name and not available_codecs()[codec_name]:
        pytest.skip(f"{codec_name} is not installed")
    create_topic(broker, "z", 1)
    values = [b"value-%d " % i * 20 for i in range(300)]
    with Producer(socket=broker.socket, acks="all", compression_type=codec_name,
                  linger_ms=1000) as producer:
        futures = [producer.send("z", value=v, key=b"k%d" % (i % 3), partition=0)
                   for i, v in enumerate(values)]
        producer.flush(timeout=WAIT)
        assert [f.get(timeout=0).offset for f in futures] == list(range(300))
    batches = read_batches(broker, "z", 0)
    assert {batch.compression for batch, _ in batches} == {codec}
    if codec != NONE:
        assert sum(batch.size for batch, _ in batches) < sum(map(len, values)) / 3
    assert [r[3] for _, recs in batches for r in recs] == values


def test_keyed_records_land_on_murmur2_partition(broker):
    create_topic(broker, "keyed", 5)
    keys = [b"user-%d" % i for i in range(200)] + [b"", b"\x00 ", b"abc"]
    with Producer(socket=broker.socket, acks=1) as producer:
        futures = {key: producer.send("keyed", value=key, key=key) for key in keys}
        producer.flush(timeout=WAIT)
        for key, fut in futures.items():
            assert fut.get(timeout=0).partition == to_positive(murmur2(key)) % 5
    records = read_records(broker, "keyed", 5)
    for p, recs in records.items():
        for _, _, key, value, _ in recs:
            assert key == value and to_positive(murmur2(key)) % 5 == p
    assert sum(len(r) for r in records.values()) == len(keys)


def test_null_keys_are_sticky(broker):
    create_topic(broker, "sticky", 4)
    with Producer(socket=broker.socket, acks=1, linger_ms=60_000) as producer:
        first = [producer.send("sticky", value=b"a%d" % i) for i in range(50)]
        producer.flush(timeout=WAIT)
        # One open batch: all fifty records went to one partition, as one batch.
        assert len({f.get(timeout=0).partition for f in first}) == 1
    with Producer(socket=broker.socket, acks=1, linger_ms=60_000, batch_size=1000) as producer:
        many = [producer.send("sticky", value=b"b" * 90) for _ in range(400)]
        producer.flush(timeout=WAIT)
        parts = [f.get(timeout=0).partition for f in many]
    # Stickiness: records stay on a partition for a whole batch (~9 records of 100 B in 1000
    # bytes), then move on; over 40-odd batches every partition gets some.
    runs = sum(1 for a, b in zip(parts, parts[1:]) if a != b) + 1
    assert runs <= len(parts) / 5
    assert len(set(parts)) > 1


def test_headers_and_timestamps_round_trip(broker):
    create_topic(broker, "h", 1)
    headers = [("source", b"web"), ("trace", None), ("ünïcode", b"\x00\xff")]
    with Producer(socket=broker.socket, acks="all") as producer:
        meta = producer.send("h", value=b"v", key=b"k", headers=headers,
                             timestamp_ms=1_600_000_000_123).get(timeout=WAIT)
        meta2 = producer.send("h", value=None, key=b"tombstone",
                              headers=[("b", bytearray(b"ytes"))]).get(timeout=WAIT)
    assert meta.timestamp_ms == 1_600_000_000_123
    assert abs(meta2.timestamp_ms - time.time() * 1000) < 600_000
    records = read_records(broker, "h")[0]
    assert records[0] == (0, 1_600_000_000_123, b"k", b"v", headers)
    assert records[1][2:] == (b"tombstone", None, [("b", b"ytes")])


def test_timestamps_far_ahead_or_negative_are_refused(broker):
    """Kafka's KIP-937 window: with the defaults, a record dated ten years ahead fails its
    future with INVALID_TIMESTAMP (it would hold time-based retention of its partition for ten
    years), and the producer carries on; a topic with message.timestamp.after.max.ms raised
    takes it. A negative timestamp other than -1 is refused at send(), as Kafka's client
    does; -1 means none."""
    create_topic(broker, "t", 1)
    create_topic(broker, "future", 1, {"message.timestamp.after.max.ms": str((1 << 63) - 1)})
    ahead = int(time.time() * 1000) + 10 * 365 * 24 * 3600 * 1000
    with Producer(socket=broker.socket, acks="all") as producer:
        fut = producer.send("t", value=b"later", timestamp_ms=ahead)
        with pytest.raises(InvalidTimestampError, match="message.timestamp.after.max.ms is "
                           "3600000"):
            fut.get(timeout=WAIT)
        for bad in (-2, -1_600_000_000_000):
            with pytest.raises(ValueError, match=f"timestamp_ms {bad} is negative"):
                producer.send("t", value=b"v", timestamp_ms=bad)
            with pytest.raises(ValueError, match="negative"):
                producer.send_many("t", [b"v"], timestamp_ms=bad)
        for bad in (1 << 63, 10**23):           # was an OverflowError from the accumulator
            with pytest.raises(ValueError, match=r"past the largest a record can carry"):
                producer.send("t", value=b"v", timestamp_ms=bad)
            with pytest.raises(ValueError, match=r"past the largest"):
                producer.send_many("t", [b"v"], timestamp_ms=bad)
        assert producer.send("t", value=b"none", timestamp_ms=-1).get(timeout=WAIT).offset == 0
        assert producer.send("future", value=b"later",
                             timestamp_ms=ahead).get(timeout=WAIT).timestamp_ms == ahead
    with Admin(socket=broker.socket) as admin:
        config = admin.describe_topic("t")["config"]
    assert (config["message.timestamp.after.max.ms"],
            config["message.timestamp.before.max.ms"]) == ("3600000", str((1 << 63) - 1))
    assert [r[1] for r in read_records(broker, "t")[0]] == [-1]


def test_log_append_time_topic_reports_broker_time(broker):
    create_topic(broker, "lat", 1, {"message.timestamp.type": "LogAppendTime"})
    with Producer(socket=broker.socket, acks=1) as producer:
        meta = producer.send("lat", value=b"v", timestamp_ms=1000).get(timeout=WAIT)
    assert meta.timestamp_ms != 1000 and abs(meta.timestamp_ms - time.time() * 1000) < 600_000


def test_serializers_and_bytes_like_values(broker):
    create_topic(broker, "s", 1)
    with Producer(socket=broker.socket, acks=1, value_serializer=str.encode,
                  key_serializer=lambda k: k.to_bytes(4, "big")) as producer:
        producer.send("s", value="héllo", key=7).get(timeout=WAIT)
        producer.send("s", value=None, key=8).get(timeout=WAIT)     # None is not serialized
    with Producer(socket=broker.socket, acks=1) as producer:
        producer.send("s", value=bytearray(b"ba"), key=memoryview(b"mv")).get(timeout=WAIT)
        with pytest.raises(TypeError, match=r"value must be bytes-like.*str.*encode"):
            producer.send("s", value="text")
        with pytest.raises(TypeError, match="key must be bytes-like"):
            producer.send("s", value=b"v", key=42)
        with pytest.raises(TypeError, match="header"):
            producer.send("s", value=b"v", headers=[(b"not-str", b"v")])
    records = read_records(broker, "s")[0]
    assert [(r[2], r[3]) for r in records] == [(b"\x00\x00\x00\x07", "héllo".encode()),
                                               (b"\x00\x00\x00\x08", None), (b"mv", b"ba")]


# --- send_many ------------------------------------------------------------------------------

@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_send_many_queues_in_order_with_a_future_each(broker, acks):
    create_topic(broker, "many", 1)
    values = [b"m%05d" % i + b"." * 94 for i in range(5000)]
    with Producer(socket=broker.socket, acks=acks, linger_ms=5, batch_size=16384) as p:
        futures = p.send_many("many", values, partition=0, headers=[("h", b"x")],
                              timestamp_ms=1_700_000_000_000)
        single = p.send("many", value=b"after")
        p.flush(timeout=WAIT)
        assert len(futures) == 5000 and all(isinstance(f, FutureRecordMetadata)
                                            for f in futures)
        if acks:
            assert [f.get(timeout=0).offset for f in futures] == list(range(5000))
            assert single.get(timeout=0).offset == 5000
            assert {f.get(timeout=0).timestamp_ms for f in futures} == {1_700_000_000_000}
    if not acks:        # nothing answers acks=0: wait until the broker appended every record
        with Admin(broker.socket) as admin:
            mq.testing.wait_for(lambda: admin.describe_topic("many")["offsets"][0][1] == 5001,
                                timeout=WAIT, message="5001 records appended")
    batches = read_batches(broker, "many", 0)
    assert 5 <= len(batches) <= 40              # ~140 records a 16 KiB batch, or larger
    records = [r for _, recs in batches for r in recs]
    assert [r[3] for r in records] == values + [b"after"]
    assert all(r[4] == [("h", b"x")] for r in records[:5000])


def test_send_many_keys_partitions_and_serializers(broker):
    create_topic(broker, "km", 4)
    keys = [i % 37 for i in range(600)]
    with Producer(socket=broker.socket, acks=1, value_serializer=str.encode,
                  key_serializer=lambda k: b"key-%d" % k) as p:
        futures = p.send_many("km", ["v%d" % i for i in range(600)], keys=keys)
        p.flush(timeout=WAIT)
        metas = [f.get(timeout=0) for f in futures]
    for k, m in zip(keys, metas, strict=True):
        assert m.partition == to_positive(murmur2(b"key-%d" % k)) % 4
    records = read_records(broker, "km", 4)
    for p_, recs in records.items():       # per partition: in the order given
        mine = [i for i, m in enumerate(metas) if m.partition == p_]
        assert [r[3] for r in recs] == [b"v%d" % i for i in mine]
        assert [r[0] for r in recs] == [metas[i].offset for i in mine]


def test_send_many_without_keys_is_sticky_and_moves_on_when_a_batch_fills(broker):
    create_topic(broker, "sm", 4)
    with Producer(socket=broker.socket, acks=1, linger_ms=60_000, batch_size=1000) as p:
        futures = p.send_many("sm", [b"b" * 90] * 400)
        p.flush(timeout=WAIT)
        parts = [f.get(timeout=0).partition for f in futures]
    runs = sum(1 for a, b in zip(parts, parts[1:], strict=False) if a != b) + 1
    assert runs <= len(parts) / 5 and len(set(parts)) > 1


def test_send_many_checks_everything_before_queueing(broker):
    create_topic(broker, "chk", 2)
    with Producer(socket=broker.socket, acks=1, max_request_size=10_000) as p:
        for call, error in [(lambda: p.send_many("chk", [b"ok", "text"]), TypeError),
                            (lambda: p.send_many("chk", [b"ok"], keys=[b"a", b"b"]), ValueError),
                            (lambda: p.send_many("chk", [b"ok", b"x" * 10_000]),
                             MessageTooLargeError),
                            (lambda: p.send_many("chk", [b"ok"], partition=2),
                             UnknownTopicOrPartitionError),
                            (lambda: p.send_many("chk", [b"ok"], headers=[(b"k", b"v")]),
                             TypeError),
                            (lambda: p.send_many("nope", [b"ok"]),
                             UnknownTopicOrPartitionError)]:
            with pytest.raises(error):
                call()
        assert p.send_many("chk", []) == []
        assert [f.get(timeout=WAIT).offset for f in p.send_many("chk", [b"a", None],
                                                                partition=1)] == [0, 1]
        p.close()
        with pytest.raises(ClosedError):
            p.send_many("chk", [b"late"])
    assert [r[3] for r in read_records(broker, "chk", 2)[1]] == [b"a", None]


def test_send_many_in_a_transaction(broker):
    create_topic(broker, "tx", 2)
    with Producer(socket=broker.socket, transactional_id="many-tx") as p:
        p.init_transactions()
        p.begin_transaction()
        aborted = p.send_many("tx", [b"no"] * 10, partition=0)
        p.abort_transaction()
        p.begin_transaction()
        kept = p.send_many("tx", [b"yes-%d" % i for i in range(10)],
                           keys=[b"k%d" % i for i in range(10)])
        p.commit_transaction()
        assert all(f.succeeded() for f in aborted + kept)
    consumer = mq.Consumer(socket=broker.socket, isolation_level="read_committed")
    consumer.assign([TopicPartition("tx", 0), TopicPartition("tx", 1)])
    got = []
    deadline = time.monotonic() + WAIT
    while len(got) < 10 and time.monotonic() < deadline:
        for recs in consumer.poll(200).values():
            got += [bytes(r.value) for r in recs]
    consumer.close()
    assert sorted(got) == sorted(b"yes-%d" % i for i in range(10))


_PURE_SCRIPT = """
import sys
import mq.client.accumulator as A
from mq.client.producer import Producer
assert A.FutureBase is A.RecordFuture, "not the pure-Python accumulator"
with Producer(socket=sys.argv[1], acks=1, batch_size=2000, linger_ms=1) as p:
    one = [p.send("pure", value=b"s%d" % i, key=None if i % 2 else b"k") for i in range(50)]
    many = p.send_many("pure", [b"m%d" % i for i in range(300)], partition=0,
                       headers=[("h", None)])
    keyed = p.send_many("pure", [b"x"] * 20, keys=[b"a", b"b"] * 10)
    p.flush(30)
    offsets = [f.get(0).offset for f in many]
    assert offsets == sorted(offsets) and len(set(offsets)) == 300, offsets
    assert all(f.succeeded() for f in one + keyed)
print("ok")
"""


def test_send_paths_with_the_pure_python_accumulator(broker):
    """``MQ_PURE_PYTHON=1``: the same producer on ``accumulator.RecordAccumulator``."""
    create_topic(broker, "pure", 2)
    out = subprocess.run([sys.executable, "-c", _PURE_SCRIPT, broker.socket],
                         capture_output=True, text=True, timeout=WAIT * 2,
                         env={**os.environ, "MQ_PURE_PYTHON": "1"})
    assert out.stdout.strip() == "ok", out.stderr
    records = read_records(broker, "pure", 2)
    assert sum(len(r) for r in records.values()) == 370
    assert [r[3] for r in records[0] if r[3].startswith(b"m")] == [b"m%d" % i
                                                                   for i in range(300)]


# --- synchronous errors -----------------------------------------------------------------------

def test_record_over_max_request_size_raises_at_once(broker):
    create_topic(broker, "t", 1)
    with Producer(socket=broker.socket, acks=1, max_request_size=10_000) as producer:
        with pytest.raises(MessageTooLargeError, match=r"max_request_size 10000") as info:
            producer.send("t", value=b"x" * 10_000)
        assert "value 10000 B" in str(info.value)
        # Just under the limit is fine, and the oversized record was not queued.
        assert producer.send("t", value=b"x" * 9_900).get(timeout=WAIT).offset == 0


def test_unknown_topic_and_partition_raise_at_once(broker):
    create_topic(broker, "two", 2)
    with Producer(socket=broker.socket, acks=1) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="nope"):
            producer.send("nope", value=b"v")
        with pytest.raises(UnknownTopicOrPartitionError, match="partition 2"):
            producer.send("two", value=b"v", partition=2)
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("two", value=b"v", partition=-1)
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.partitions_for("nope")
        assert producer.partitions_for("two") == {0, 1}
        assert producer.send("two", value=b"v", partition=1).get(timeout=WAIT).partition == 1


def test_partitions_added_later_are_seen(broker):
    create_topic(broker, "grow", 2)
    with Producer(socket=broker.socket, acks=1) as producer:
        assert producer.partitions_for("grow") == {0, 1}
        with Admin(socket=broker.socket) as admin:
            admin.create_partitions("grow", total=4)
        assert producer.send("grow", value=b"v", partition=3).get(timeout=WAIT).partition == 3
        assert producer.partitions_for("grow") == {0, 1, 2, 3}


def test_custom_partitioner_callable_and_object(broker):
    create_topic(broker, "c", 3)
    calls = []

    def last(topic, key, all_partitions, available):
        calls.append((topic, key, list(all_partitions), list(available)))
        return all_partitions[-1]

    with Producer(socket=broker.socket, acks=1, partitioner=last) as producer:
        assert producer.send("c", value=b"v", key=b"k").get(timeout=WAIT).partition == 2
    assert calls == [("c", b"k", [0, 1, 2], [0, 1, 2])]

    class Bad:
        def partition(self, topic, key, all_partitions, available):
            return 7

    with Producer(socket=broker.socket, acks=1, partitioner=Bad()) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="partitioner chose partition 7"):
            producer.send("c", value=b"v")


def test_bad_configuration_and_no_broker(tmp_path, broker):
    with pytest.raises(ValueError, match="acks"):
        Producer(socket=broker.socket, acks=2)
    with pytest.raises(ValueError, match="compression"):
        Producer(socket=broker.socket, compression_type="brotli")
    with pytest.raises(BrokerUnavailableError, match="no broker"):
        Producer(socket=str(tmp_path / "absent.sock"))


def test_close_is_idempotent_and_final(broker):
    create_topic(broker, "t", 1)
    producer = Producer(socket=broker.socket, acks=1, linger_ms=60_000)
    fut = producer.send("t", value=b"buffered")
    producer.close()
    assert fut.get(timeout=0).offset == 0             # close() flushed it
    producer.close()
    assert producer.closed
    with pytest.raises(ClosedError):
        producer.send("t", value=b"late")
    assert producer._io.io_thread is not None and not producer._io.io_thread.is_alive()


def test_flush_timeout_and_close_failing_undelivered(tmp_path):
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, "t", 1)
        producer = Producer(socket=b.socket, acks=1, linger_ms=60_000)
        first = producer.send("t", value=b"first")
        producer.flush(timeout=WAIT)
        assert first.get(timeout=0).offset == 0
        b.stop()
        fut = producer.send("t", value=b"stuck")
        with pytest.raises(TimeoutError, match="flush"):
            producer.flush(timeout=0.3)
        producer.close(timeout=0.3)
        with pytest.raises(ClosedError):
            fut.get(timeout=WAIT)


def test_concurrent_threads(broker):
    create_topic(broker, "mt", 3)
    per_thread = 2000
    results: dict[int, list] = {}

    def worker(n):
        futures = [producer.send("mt", value=b"%d:%d" % (n, i), key=b"%d" % n)
                   for i in range(per_thread)]
        results[n] = [f.get(timeout=WAIT) for f in futures]

    with Producer(socket=broker.socket, acks=1) as producer:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 2)
        assert not any(t.is_alive() for t in threads)
    for n, metas in results.items():
        offsets = [m.offset for m in metas]
        assert offsets == sorted(offsets) and len(set(offsets)) == per_thread
    records = read_records(broker, "mt", 3)
    assert sum(len(r) for r in records.values()) == 4 * per_thread


# --- several processes ------------------------------------------------------------------------

def _produce_in_process(socket_path: str, topic: str, producer_id: int, count: int) -> None:
    with Producer(socket=socket_path, acks="all", linger_ms=2) as producer:
        futures = [producer.send(topic, value=b"%d:%d" % (producer_id, i),
                                 key=b"%d-%d" % (producer_id, i % 5)) for i in range(count)]
        producer.flush(timeout=WAIT)
        for f in futures:
            f.get(timeout=0)


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_several_producer_processes_acks_all(broker, start_method):
    create_topic(broker, "multi", 3)
    ctx = multiprocessing.get_context(start_method)
    count, nprocs = 1500, 3
    procs = [ctx.Process(target=_produce_in_process, args=(broker.socket, "multi", n, count))
             for n in range(nprocs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(WAIT * 4)
    assert [p.exitcode for p in procs] == [0] * nprocs
    records = read_records(broker, "multi", 3)
    seen = Counter()
    for p, recs in records.items():
        last: dict[int, int] = {}
        for _, _, key, value, _ in recs:
            producer_id, seq = map(int, value.split(b":"))
            assert to_positive(murmur2(key)) % 3 == p
            assert seq > last.get(producer_id, -1), "out of order within a partition"
            last[producer_id] = seq
            seen[(producer_id, seq)] += 1
    assert len(seen) == nprocs * count and set(seen.values()) == {1}


# --- broker crash and restart -----------------------------------------------------------------

@pytest.mark.parametrize("linger_ms", [1, 0])
def test_broker_killed_mid_stream_acks_all(tmp_path, linger_ms):
    """kill -9 the broker while records flow: every acknowledged record is in the log after the
    restart; without idempotence (at least once) a record appears twice only if its batch was
    re-sent (``attempts > 1``). With idempotence: test_idempotence.py. With ``linger_ms=0``,
    records go out whole (``send_whole``) and in batches, mixed."""
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, "crash", 2)
        producer = Producer(socket=b.socket, acks="all", linger_ms=linger_ms, retries=10,
                            delivery_timeout_ms=60_000, enable_idempotence=False)
        futures: list = []
        started, reached, stop = threading.Event(), threading.Event(), threading.Event()
        target = [1500]

        def sender():                                  # a steady stream until told to stop
            i = 0
            while not stop.is_set() and i < 200_000:
                futures.append(producer.send("crash", value=b"%06d" % i, key=b"%d" % (i % 7)))
                if i == 1500:
                    started.set()
                if i >= target[0]:
                    reached.set()
                i += 1

        thread = threading.Thread(target=sender, daemon=True)
        thread.start()
        try:
            assert started.wait(WAIT)
            futures[1000].get(timeout=WAIT)           # traffic is flowing and acknowledged
            b.kill()                                  # SIGKILL with requests in flight
            b.start()
            target[0] = len(futures) + 1000
            reached.clear()
            assert reached.wait(WAIT * 2)
            futures[target[0]].get(timeout=WAIT)      # records sent after the restart land
        finally:
            stop.set()
            thread.join(WAIT * 2)
        assert not thread.is_alive()
        producer.flush(timeout=WAIT * 2)
        producer.close()
        succeeded = [(i, f) for i, f in enumerate(futures) if f.succeeded()]
        assert len(succeeded) == len(futures)          # the restart was within the retries
        records = read_records(b, "crash", 2)
    counts = Counter(int(r[3]) for recs in records.values() for r in recs)
    for i, fut in succeeded:
        assert counts[i] >= 1, f"acknowledged record {i} is missing"
        if counts[i] > 1:
            assert fut.attempts > 1, f"record {i} duplicated but never re-sent"
    for p, recs in records.items():
        first_seen: list[int] = []
        seen = set()
        for r in recs:
            i = int(r[3])
            if i not in seen:
                seen.add(i)
                first_seen.append(i)
        assert first_seen == sorted(first_seen), f"partition {p} out of order"


def test_broker_restart_reconnects(tmp_path):
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, "r", 1)
        with Producer(socket=b.socket, acks="all") as producer:
            assert producer.send("r", value=b"before").get(timeout=WAIT).offset == 0
            b.restart()                              # clean stop (SIGTERM), then start
            assert producer.send("r", value=b"after").get(timeout=WAIT).offset == 1


def test_broker_gone_fails_futures_after_delivery_timeout(tmp_path):
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, "gone", 1)
        producer = Producer(socket=b.socket, acks=1, delivery_timeout_ms=500,
                            retry_backoff_ms=20)
        assert producer.send("gone", value=b"a").get(timeout=WAIT).offset == 0
        b.kill()
        failed = threading.Event()
        fut = producer.send("gone", value=b"b")
        fut.add_errback(lambda exc: failed.set())
        with pytest.raises(BrokerUnavailableError):
            fut.get(timeout=WAIT)
        assert failed.is_set()
        producer.close(timeout=1)


# --- fork safety ------------------------------------------------------------------------------

def _use_inherited_producer(producer: Producer, conn) -> None:
    try:
        futures = [producer.send("forked", value=b"child-%d" % i) for i in range(100)]
        producer.flush(timeout=WAIT)
        offsets = [f.get(timeout=0).offset for f in futures]
        producer.close()
        conn.send(("ok", offsets))
    except BaseException as err:                   # report, don't hang the parent
        conn.send(("error", repr(err)))


def test_producer_used_in_forked_child(broker):
    create_topic(broker, "forked", 1)
    ctx = multiprocessing.get_context("fork")
    with Producer(socket=broker.socket, acks=1, linger_ms=60_000) as producer:
        first = producer.send("forked", value=b"parent-0")
        producer.flush(timeout=WAIT)
        assert first.get(timeout=0).offset == 0
        buffered = producer.send("forked", value=b"parent-buffered")   # lingering, unsent
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=_use_inherited_producer, args=(producer, child_end))
        child.start()
        assert parent_end.poll(WAIT * 2)
        status, payload = parent_end.recv()
        child.join(WAIT)
        assert (status, child.exitcode) == ("ok", 0), payload
        assert len(payload) == 100
        # The parent's producer is untouched by the child: its connection, thread and buffer.
        producer.flush(timeout=WAIT)
        assert buffered.get(timeout=0).offset >= 1
        after = producer.send("forked", value=b"parent-after")
        producer.flush(timeout=WAIT)
        assert after.get(timeout=0).offset == 102
    values = [r[3] for r in read_records(broker, "forked")[0]]
    assert values.count(b"parent-buffered") == 1     # the child did not send the parent's
    assert sorted(v for v in values if v.startswith(b"child-")) == \
        sorted(b"child-%d" % i for i in range(100))
    assert len(values) == 103


def test_topic_partition_and_record_metadata_types():
    tp = TopicPartition("a", 1)
    assert tp < TopicPartition("a", 2) < TopicPartition("b", 0)
    assert {tp: 1}[TopicPartition("a", 1)] == 1
    meta = RecordMetadata("a", 1, 5, 1000)
    assert meta.topic_partition == tp and meta.offset == 5
    assert defaultdict(int)[tp] == 0


# --- retries, ordering and timeouts against a scripted broker ---------------------------------
# The real broker never answers Produce with a retriable error, so these tests put a small fake
# broker (same sans-I/O protocol module, fake_broker.py) on a Unix socket; its ``script``
# decides each reply.

@pytest.mark.parametrize("max_in_flight", [1, 5])
def test_retriable_errors_are_retried_in_order(fake_broker, max_in_flight):
    # KafkaStorageError (56, retriable) for a partition-0 batch's first attempt; later batches
    # of partition 0 fail too while it is being retried (as a broker that cannot write would).
    failing = {"first": None}

    def script(partition, values, attempt):
        if partition != 0:
            return 0
        if failing["first"] is None and int(values[0]) >= 100:
            failing["first"] = values[0]
        if failing["first"] is not None and attempt == 1 and int(values[0]) >= \
                int(failing["first"]):
            return 56
        return 0

    b = fake_broker(2, script)
    with Producer(socket=b.path, acks=1, batch_size=200, max_request_size=300, linger_ms=0,
                  max_in_flight=max_in_flight, retry_backoff_ms=5) as producer:
        futures = [producer.send("t", value=b"%04d" % i, partition=i % 2) for i in range(400)]
        producer.flush(timeout=WAIT)
    assert all(f.succeeded() for f in futures)
    assert any(f.attempts == 2 for f in futures[::2])
    assert all(f.attempts == 1 for f in futures[1::2])
    assert b.log[0] == [b"%04d" % i for i in range(0, 400, 2)]        # in order, once each
    assert b.log[1] == [b"%04d" % i for i in range(1, 400, 2)]
    offsets = [f.get(timeout=0).offset for f in futures[::2]]
    assert offsets == list(range(200))


def test_retries_exhausted_and_non_retriable_errors_fail_the_batch(fake_broker):
    def script(partition, values, attempt):
        if values[0] == b"retriable":
            return 56                                  # KafkaStorageError, every time
        if values[0] == b"invalid":
            return 42                                  # InvalidRequest: not retriable
        return 0

    b = fake_broker(1, script)
    from mq.errors import InvalidRequestError, KafkaStorageError
    with Producer(socket=b.path, acks="all", linger_ms=0, retries=2,
                  retry_backoff_ms=1) as producer:
        bad = producer.send("t", value=b"retriable")
        with pytest.raises(KafkaStorageError):
            bad.get(timeout=WAIT)
        assert bad.attempts == 3 and b.attempts[b"retriable"] == 3    # first try + 2 retries
        invalid = producer.send("t", value=b"invalid")
        with pytest.raises(InvalidRequestError):
            invalid.get(timeout=WAIT)
        assert invalid.attempts == 1
        assert producer.send("t", value=b"fine").get(timeout=WAIT).offset == 0


def test_request_timeout_reconnects_and_resends(fake_broker):
    def script(partition, values, attempt):
        return None if attempt == 1 else 0             # the first try is never answered

    b = fake_broker(1, script)
    with Producer(socket=b.path, acks=1, linger_ms=0, request_timeout_ms=300,
                  retry_backoff_ms=5) as producer:
        fut = producer.send("t", value=b"slow")
        assert fut.get(timeout=WAIT).offset == 0
        assert fut.attempts == 2
    assert b.connections >= 2 and b.log[0] == [b"slow"]


@pytest.mark.parametrize("max_in_flight", [1, 5])
def test_partition_waits_for_its_retry_to_be_acknowledged(fake_broker, max_in_flight):
    # One batch fails twice (retriable). Partition 0 refuses everything between the victim's
    # first and second attempt, and accepts everything after: a batch sent alongside the
    # victim's retry would overtake it, so the partition must hold back until it is acked.
    victim = {}

    def script(partition, values, attempt):
        if partition != 0:
            return 0
        if not victim and int(values[0]) >= 60:
            victim["first"] = values[0]
        if victim.get("first") == values[0]:
            return 1001 if attempt <= 2 else 0         # BrokerShuttingDown: retriable
        if victim and b.attempts[victim["first"]] == 1:
            return 56                                  # KafkaStorageError: retriable
        return 0

    b = fake_broker(2, script)
    with Producer(socket=b.path, acks=1, batch_size=150, max_request_size=250, linger_ms=0,
                  max_in_flight=max_in_flight, retry_backoff_ms=20) as producer:
        futures = [producer.send("t", value=b"%04d" % i, partition=i % 2) for i in range(300)]
        producer.flush(timeout=WAIT)
    assert all(f.succeeded() for f in futures)
    assert max(f.attempts for f in futures) == 3
    assert b.log[0] == [b"%04d" % i for i in range(0, 300, 2)], b.requests
    assert b.log[1] == [b"%04d" % i for i in range(1, 300, 2)]
    # Between the victim's retries partition 0 sent nothing else (before its first failure
    # came back, batches behind it may have been in flight already: those failed too).
    order = [(p, values[0]) for p, values in b.requests]
    retry_at = [i for i, (p, v) in enumerate(order) if v == victim["first"]]
    assert len(retry_at) == 3
    between = order[retry_at[1]:retry_at[-1] + 1]
    assert {v for p, v in between if p == 0} == {victim["first"]}, (victim, order)


# --- the broker's request limit ---------------------------------------------------------------

def test_record_over_the_brokers_request_limit_fails_at_once(tmp_path, caplog):
    """The handshake tells the producer the broker's max_request_bytes: a record that cannot
    fit in a request raises at send() (it used to be sent, dropped with the connection, and
    re-sent until delivery_timeout_ms), and batches are never built larger than the broker
    accepts, whatever batch_size and max_request_size say."""
    caplog.set_level("WARNING", logger="mq.producer")
    with broker_with(tmp_path, max_request_bytes=4096) as b:
        create_topic(b, "t", 1)
        with Producer(socket=b.socket, acks=1, linger_ms=50, batch_size=65536,
                      max_request_size=1 << 20, delivery_timeout_ms=10_000) as producer:
            with pytest.raises(RecordListTooLargeError) as info:
                producer.send("t", value=b"x" * 10_000, key=b"k")
            message = str(info.value)
            assert "value 10000 B" in message and "key 1 B" in message
            assert "max_request_bytes 4096 B" in message
            # Just under what a batch may take is fine; the oversized record was not queued.
            cap = 4096 - REQUEST_ENVELOPE_BYTES
            fits = cap - 100
            assert producer.send("t", value=b"y" * fits).get(timeout=WAIT).offset == 0
            # 300 records of 1000 B, lingering into batches: each batch stays under the cap.
            futures = [producer.send("t", value=b"%04d" % i + b"z" * 996) for i in range(300)]
            producer.flush(timeout=WAIT)
            assert [f.get(timeout=WAIT).offset for f in futures] == list(range(1, 301))
        assert not [r for r in caplog.records if "lost the broker connection" in r.message]
        batches = read_batches(b, "t", 0)
    sizes = [len(records) for _, records in batches]
    assert sum(sizes) == 301 and max(sizes[1:]) <= cap // 1000 and len(sizes) > 2
    values = [r[3] for _, records in batches for r in records]
    assert values[0] == b"y" * fits
    assert values[1:] == [b"%04d" % i + b"z" * 996 for i in range(300)]


def test_produce_cli_line_over_the_brokers_request_limit(tmp_path):
    from cli_run import assert_one_error, mq_run
    with broker_with(tmp_path, max_request_bytes=4096) as b:
        create_topic(b, "t", 1)
        stdin = b"a\n" + b"x" * 5000 + b"\nc\n"
        line = assert_one_error(mq_run("produce", "t", "--socket", b.socket, stdin=stdin),
                                "line 2 is too large for the broker", "max_request_bytes 4096",
                                "produced the 1 record before it to t", code=1)
        assert "value 5000 B" in line


def test_batches_built_in_reused_buffers_keep_every_record(broker):
    """Each batch is built in a finished batch's buffer when one is free: records of all
    sizes, batch after batch (pipelined, and one at a time), land as sent."""
    create_topic(broker, "t", 1)
    values = [os.urandom(n) for n in (70_000, 10, 3000, 65536, 1, 200_000) * 8]
    with Producer(socket=broker.socket, acks=1, linger_ms=0, batch_size=128 * 1024) as producer:
        for i, value in enumerate(values[:24]):
            assert producer.send("t", value=value).get(timeout=WAIT).offset == i
        futures = [producer.send("t", value=value) for value in values[24:]]
        producer.flush(timeout=WAIT)
        assert [f.get(timeout=WAIT).offset for f in futures] == list(range(24, len(values)))
        assert producer._acc.buffers                  # finished batches' buffers came back
    assert [r[3] for r in read_records(broker, "t")[0]] == values
