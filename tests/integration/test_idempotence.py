"""The idempotent producer (on by default): producer ids and sequence numbers on the wire, retries
and lost replies without duplicates, sequence errors, and broker kill -9 cycles that leave
every acknowledged record in the log exactly once and in order.

The scripted cases use ``fake_broker.py`` with the partition's sequence rules
(``sequences=True``), because the real broker never fails a produce on purpose; the crash cases
use the real broker.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import threading
from collections import Counter

import fake_broker as fakes
import pytest
from brokers import create_topic

import mq.testing
from mq.client.producer import Producer
from mq.errors import InvalidRequestError, KafkaStorageError, OutOfOrderSequenceError
from mq.log.log import PartitionLog

fake_broker = fakes.fake_broker        # the fixture (fake_broker.py)
WAIT = 30                              # seconds: a generous bound for any single wait
STORAGE_ERROR, OUT_OF_ORDER, DUPLICATE = 56, 45, 46


@pytest.fixture(autouse=True)
def _close_leftover_producers():
    yield
    from mq.client import producer as producer_module
    for producer in list(producer_module._LIVE):
        producer.close(timeout=1)


def batches_of(fake, partition: int) -> list[tuple]:
    return [b for b in fake.batches if b[0] == partition]


# --- configuration ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"enable_idempotence": True, "acks": 1}, "enable_idempotence=True needs acks='all'"),
    ({"enable_idempotence": True, "acks": 0}, "acks=0"),
    ({"enable_idempotence": True, "max_in_flight": 6}, "max_in_flight up to 5"),
    ({"transactional_id": "t", "acks": 1}, "transactional_id needs acks='all'"),
    ({"transactional_id": "t", "enable_idempotence": False}, "needs enable_idempotence"),
    ({"transaction_timeout_ms": 0}, "transaction_timeout_ms"),
])
def test_conflicting_settings_raise_before_connecting(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Producer(socket=str(tmp_path / "none.sock"), **kwargs)


def test_init_producer_id_once_at_construction_then_consecutive_sequences(fake_broker):
    b = fake_broker(2, lambda partition, values, attempt: 0, sequences=True)
    with Producer(socket=b.path, batch_size=100, max_request_size=200, linger_ms=0) as producer:
        assert b.init_requests == [[None, 60000]]       # eagerly, once
        futures = [producer.send("t", value=b"%04d" % i, partition=i % 2) for i in range(300)]
        producer.flush(timeout=WAIT)
        assert repr(producer).count("producer_id=1000 epoch=0")
    assert all(f.succeeded() for f in futures)
    assert len(b.init_requests) == 1
    for p in (0, 1):
        expected = 0
        batches = batches_of(b, p)
        assert len(batches) > 5
        for _, pid, epoch, base, transactional, values in batches:
            assert (pid, epoch, base, transactional) == (1000, 0, expected, False)
            expected += len(values)
        assert b.log[p] == [b"%04d" % i for i in range(p, 300, 2)]


@pytest.mark.parametrize("kwargs", [{"acks": 1}, {"enable_idempotence": False},
                                    {"max_in_flight": 10}])
def test_without_idempotence_no_producer_id(fake_broker, kwargs):
    b = fake_broker(1, lambda partition, values, attempt: 0)
    with Producer(socket=b.path, linger_ms=0, **kwargs) as producer:
        producer.send("t", value=b"x").get(timeout=WAIT)
    assert b.init_requests == []
    assert [(pid, base) for _, pid, _, base, _, _ in b.batches] == [(-1, -1)]


def test_a_broker_without_init_producer_id(fake_broker, caplog):
    b = fake_broker(1, lambda partition, values, attempt: 0, init_error=42)
    with caplog.at_level(logging.WARNING, logger="mq.producer"), \
            Producer(socket=b.path, linger_ms=0) as producer:    # the default: falls back
        producer.send("t", value=b"x").get(timeout=WAIT)
    assert "not idempotent" in caplog.text
    assert b.batches[0][1] == -1
    with pytest.raises(InvalidRequestError):
        Producer(socket=b.path, enable_idempotence=True)        # asked for: refused


def test_init_producer_id_failing_retriably_is_asked_again_by_the_io_thread(fake_broker):
    """A broker that cannot write its producer id block (a full disk) answers a retriable
    KafkaStorageError: the constructor does not fail, batches wait for the id (each failed
    try counts as one of their attempts) and go out once it comes."""
    failures = {"until": 2}
    b = fake_broker(1, lambda partition, values, attempt: 0, sequences=True,
                    init_error=lambda n: STORAGE_ERROR if n <= failures["until"] else 0)
    with Producer(socket=b.path, linger_ms=0, retry_backoff_ms=5) as producer:
        meta = producer.send("t", value=b"waited").get(timeout=WAIT)
        assert meta.offset == 0
        assert len(b.init_requests) == 3
        assert b.batches[0][1:4] == (1000, 0, 0)
    failures["until"] = 10**9                              # never again
    with Producer(socket=b.path, linger_ms=0, retries=1, retry_backoff_ms=5) as producer:
        fut = producer.send("t", value=b"never")
        assert isinstance(_wait_error(fut), KafkaStorageError)
        assert fut.attempts == 2
    assert [values for _, _, _, _, _, values in b.batches] == [[b"waited"]]


# --- retries and lost replies -----------------------------------------------------------------

@pytest.mark.parametrize("max_in_flight", [1, 5])
def test_a_retried_batch_keeps_its_sequence_and_later_ones_wait_for_it(fake_broker,
                                                                       max_in_flight):
    """A batch fails with a retriable error; the batches behind it that were in flight get
    OutOfOrderSequence (the partition misses the first): they are queued behind its retry,
    and everything lands once, in order."""
    failed, gate = {}, threading.Event()

    def script(partition, values, attempt):
        if partition == 0 and not failed and int(values[0]) >= 100:
            failed["first"] = values[0]
        if failed.get("first") == values[0] and attempt == 1:
            gate.wait(WAIT)                   # until the producer has more in flight
            return STORAGE_ERROR
        return 0

    b = fake_broker(2, script, sequences=True)
    with Producer(socket=b.path, batch_size=150, max_request_size=250, linger_ms=0,
                  max_in_flight=max_in_flight, retry_backoff_ms=5) as producer:
        futures: list = []
        sender = threading.Thread(target=lambda: futures.extend(
            producer.send("t", value=b"%04d" % i, partition=i % 2) for i in range(400)))
        sender.start()
        # White box: the pipeline is full behind the blocked batch.
        mq.testing.wait_for(lambda: failed and len(producer._sender.in_flight) == max_in_flight,
                            timeout=WAIT, message="a full pipeline")
        gate.set()
        sender.join(WAIT)
        producer.flush(timeout=WAIT)
    assert all(f.succeeded() for f in futures), [f.exception() for f in futures if f.failed()]
    assert b.log[0] == [b"%04d" % i for i in range(0, 400, 2)]
    assert b.log[1] == [b"%04d" % i for i in range(1, 400, 2)]
    assert [f.get(0).offset for f in futures[::2]] == list(range(200))
    tries = [base for p, _, _, base, _, values in b.batches if values[0] == failed["first"]]
    assert len(tries) == 2 and tries[0] == tries[1]             # same sequence on the retry
    again = Counter(v[0] for p, _, _, _, _, v in b.batches if p == 0)
    refused = sum(1 for n in again.values() if n > 1) - 1
    assert refused >= (1 if max_in_flight > 1 else 0)         # in flight behind: sent again


def test_a_lost_reply_is_answered_as_a_duplicate_not_appended_twice(fake_broker):
    """The broker appends a batch but the reply never comes: the producer times out, reconnects
    and sends it again; the partition knows the sequence and answers with the first offset."""
    def script(partition, values, attempt):
        return "lost" if b"0007" in values and attempt == 1 else 0

    b = fake_broker(1, script, sequences=True)
    with Producer(socket=b.path, linger_ms=0, request_timeout_ms=300, retry_backoff_ms=5,
                  max_in_flight=1) as producer:
        futures = [producer.send("t", value=b"%04d" % i) for i in range(20)]
        producer.flush(timeout=WAIT)
    assert all(f.succeeded() for f in futures)
    assert b.log[0] == [b"%04d" % i for i in range(20)]           # once each
    assert [f.get(0).offset for f in futures] == list(range(20))
    assert futures[7].attempts == 2 and b.connections >= 2


def test_duplicate_sequence_counts_as_success(fake_broker):
    b = fake_broker(1, lambda partition, values, attempt: DUPLICATE)
    with Producer(socket=b.path, linger_ms=0) as producer:
        meta = producer.send("t", value=b"again").get(timeout=WAIT)
    assert meta.offset == -1


def test_out_of_order_sequence_fails_the_partition_then_a_new_producer_id(fake_broker):
    """OutOfOrderSequence for the oldest unacknowledged batch is final: it fails, the later
    batches of its partition sealed with the same id fail too (their sequences follow the gap;
    in flight, the partition refuses them), other partitions go on, and the producer takes a
    new producer id whose sequences start at 0. Nothing is reordered: the failures come
    first, then the records sent with the new id."""
    def script(partition, values, attempt):
        return OUT_OF_ORDER if partition == 0 and values[0] == b"0010" else 0

    b = fake_broker(2, script, sequences=True)
    with Producer(socket=b.path, linger_ms=0, batch_size=60, max_request_size=120) as producer:
        early = [producer.send("t", value=b"%04d" % i, partition=0) for i in range(10)]
        for f in early:
            f.get(timeout=WAIT)
        later = [producer.send("t", value=b"%04d" % i, partition=0) for i in range(10, 40)]
        other = producer.send("t", value=b"p1", partition=1)
        producer.flush(timeout=WAIT)
        with pytest.raises(OutOfOrderSequenceError):
            later[0].get(timeout=0)
        other.get(timeout=0)
        after = producer.send("t", value=b"after", partition=0).get(timeout=WAIT)
    errors = [f.exception() for f in later]
    k = next((i for i, e in enumerate(errors) if e is None), len(errors))
    assert all(isinstance(e, OutOfOrderSequenceError) for e in errors[:k])
    assert all(e is None for e in errors[k:])
    assert b.log[0] == [b"%04d" % i for i in range(10)] + \
        [b"%04d" % i for i in range(10 + k, 40)] + [b"after"]
    assert after.offset == len(b.log[0]) - 1
    assert len(b.init_requests) == 2
    new_id = [batch for batch in batches_of(b, 0) if batch[1] == 1001]
    assert new_id[0][2:4] == (0, 0)                             # new id, sequence 0


def _wait_error(fut):
    try:
        fut.get(timeout=WAIT)
    except Exception as err:   # noqa: BLE001 -- the error is what we look at
        return err
    return None


def test_retries_exhausted_fail_the_queued_rest_of_the_partition(fake_broker):
    def script(partition, values, attempt):
        return STORAGE_ERROR if partition == 0 and int(values[0]) >= 5 else 0

    b = fake_broker(2, script, sequences=True)
    with Producer(socket=b.path, linger_ms=0, retries=2, retry_backoff_ms=1,
                  max_in_flight=1, batch_size=60, max_request_size=120) as producer:
        first = [producer.send("t", value=b"%04d" % i, partition=0) for i in range(5)]
        for f in first:
            f.get(timeout=WAIT)
        rest = [producer.send("t", value=b"%04d" % i, partition=0) for i in range(5, 15)]
        for f in rest:
            assert isinstance(_wait_error(f), KafkaStorageError)
        assert producer.send("t", value=b"x", partition=1).get(timeout=WAIT).offset == 0
    assert len(b.init_requests) >= 2                            # new ids after failures


def test_a_retry_whose_error_came_during_a_new_producer_id_is_not_slept_past(fake_broker):
    """After InitProducerId the I/O thread stamps the batches that waited for the id, sends
    them, and then reads what the call left in the connection's stash; that read also takes
    a reply that has already come for a batch just sent. When it is a retriable error, the
    retry must go out after its 1 ms backoff, not when the wait the thread planned before
    the read ends (the request timeout): on 2 busy cores the broker often answers before the
    thread gets the CPU back, and test_retries_exhausted_fail_the_queued_rest_of_the_partition
    hung 1 run in 75. Here the order is forced: the first new-id request fails (so the
    thread asks again on its timer, with no wake-up pending), the broker holds the second
    until "c" waits for the id, and the I/O thread's reads wait until a reply is on the
    socket."""
    sent = threading.Event()

    def script(partition, values, attempt):
        if values[0] == b"x":
            return OUT_OF_ORDER                  # final: a gap, so a new producer id
        return STORAGE_ERROR if values[0] == b"c" and attempt == 1 else 0

    def init_error(call):
        if call == 2:                             # asked at once: the wake-up it took is
            return STORAGE_ERROR                  # spent when the thread asks again
        if call == 3:                             # the new id: once "c" waits for it
            sent.wait(WAIT)
        return 0

    b = fake_broker(1, script, sequences=True, init_error=init_error)
    with Producer(socket=b.path, linger_ms=0, max_in_flight=1, retry_backoff_ms=1,
                  request_timeout_ms=120_000) as producer:
        read = producer._io.read

        def read_once_answered(conn, caller=False):
            if not caller and producer._sender.in_flight:
                poller = select.poll()
                poller.register(conn.fileno(), select.POLLIN)
                poller.poll(WAIT * 1000)
            read(conn, caller)
        producer._io.read = read_once_answered
        with pytest.raises(OutOfOrderSequenceError):
            producer.send("t", value=b"x", partition=0).get(timeout=WAIT)
        mq.testing.wait_for(lambda: len(b.init_requests) == 3, timeout=WAIT,
                            message="InitProducerId for a new id")
        fut = producer.send("t", value=b"c", partition=0)
        sent.set()
        assert fut.get(timeout=WAIT).offset == 0      # not after the 120 s request timeout
        assert fut.attempts == 2
    assert [batch[1:4] for batch in batches_of(b, 0)][1:] == [(1001, 0, 0)] * 2


# --- the real broker: kill -9 cycles ----------------------------------------------------------

def read_partition(b, topic: str, partition: int) -> list[tuple]:
    """``[(producer id, value bytes), ...]`` of a partition, with the broker stopped."""
    b.stop()
    plog = PartitionLog.open(os.path.join(b.data_dir, f"{topic}-{partition}"))
    try:
        return [(batch.producer_id, bytes(r.value)) for batch in plog.batches()
                for r in batch.records()]
    finally:
        plog.close()


@pytest.mark.parametrize("linger_ms", [1, 0])
def test_no_duplicates_after_broker_kill_9_restarts(tmp_path, linger_ms):
    """Two idempotent producers stream keyed records while the broker is killed (SIGKILL)
    three times with requests in flight: afterwards every acknowledged record is in its
    partition exactly once and each producer's records are in order, though batches were
    re-sent (``attempts > 1``). With ``linger_ms=0`` a record goes out whole when nothing is
    queued before it, else through the batches: both ways, mixed."""
    partitions, restarts = 3, 3
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, "crash", partitions)
        stop = threading.Event()
        sent: list[list] = [[], []]

        def stream(n: int, producer: Producer) -> None:
            i = 0
            while not stop.is_set():
                sent[n].append(producer.send("crash", value=b"%d:%07d" % (n, i),
                                             key=b"%d" % (i % 11)))
                i += 1

        producers = [Producer(socket=b.socket, linger_ms=linger_ms, retries=50,
                              delivery_timeout_ms=120_000) for _ in range(2)]
        threads = [threading.Thread(target=stream, args=(n, p), daemon=True)
                   for n, p in enumerate(producers)]
        for t in threads:
            t.start()
        try:
            for _ in range(restarts):
                target = [len(s) + 2000 for s in sent]
                mq.testing.wait_for(lambda t=target: all(len(s) > n for s, n in zip(sent, t)),
                                    timeout=WAIT * 2, message="records to flow")
                for s, n in zip(sent, target):
                    s[n - 1000].get(timeout=WAIT)              # acknowledged: it flows
                b.kill()                                        # requests in flight
                b.start()
            target = [len(s) + 1000 for s in sent]
            mq.testing.wait_for(lambda: all(len(s) > n for s, n in zip(sent, target)),
                                timeout=WAIT * 2, message="records after the last restart")
        finally:
            stop.set()
            for t in threads:
                t.join(WAIT)
        for p in producers:
            p.flush(timeout=WAIT * 2)
            p.close()
        assert all(f.succeeded() for s in sent for f in s)
        assert any(f.attempts > 1 for s in sent for f in s), "nothing was re-sent"
        logs = {p: read_partition(b, "crash", p) for p in range(partitions)}
    counts = Counter(value for log in logs.values() for _, value in log)
    for n, s in enumerate(sent):
        for i in range(len(s)):
            value = b"%d:%07d" % (n, i)
            assert counts[value] == 1, f"{value!r} is in the log {counts[value]} times"
    assert sum(counts.values()) == sum(len(s) for s in sent)
    for p, log in logs.items():
        for n in (0, 1):
            mine = [int(v.split(b":")[1]) for _, v in log if v.startswith(b"%d:" % n)]
            assert mine == sorted(mine), f"producer {n} out of order in partition {p}"
        assert len({pid for pid, _ in log}) == 2, "each producer has its own id"


def _child_sends(socket_path: str, producer: Producer) -> None:
    producer.send("fork", value=b"child").get(timeout=WAIT)
    producer.close()


def test_a_forked_child_takes_its_own_producer_id(broker):
    create_topic(broker, "fork", 1)
    producer = Producer(socket=broker.socket, linger_ms=0)
    producer.send("fork", value=b"parent-1").get(timeout=WAIT)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child_sends, args=(broker.socket, producer))
    child.start()
    child.join(WAIT)
    assert child.exitcode == 0
    producer.send("fork", value=b"parent-2").get(timeout=WAIT)
    producer.close()
    log = read_partition(broker, "fork", 0)
    by_value = {v: pid for pid, v in log}
    assert sorted(by_value) == [b"child", b"parent-1", b"parent-2"]
    assert by_value[b"parent-1"] == by_value[b"parent-2"] != by_value[b"child"]
