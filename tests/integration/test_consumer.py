"""``mq.Consumer`` against a real broker subprocess: records come back exactly as produced, the
position API, wake-ups through the semaphore (no busy polling), retention and out-of-range
handling, broker crashes, consumer crashes and fork.

Producers here are raw ``Connection``s sending ``BatchBuilder`` batches (in the test process or
in producer processes); consumer processes come from ``multiprocessing`` (fork). Nothing sleeps
to wait: processes report through pipes, and the consumer's blocking wait is observed through
the ``mq.client.consumer_driver._block`` seam (called right after the WAIT request went out).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

import posix_ipc
import psutil
import pytest
from brokers import broker_with, create_topic

import mq.client.consumer_driver as consumer_module
import mq.protocol.state as state_module
import mq.testing
from mq.client.admin import Admin
from mq.client.connection import Connection
from mq.client.consumer import Consumer, NoOffsetForPartitionError, Record
from mq.client.types import TopicPartition
from mq.errors import (
    ClosedError,
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from mq.log import native
from mq.log.builder import BatchBuilder, control_batch
from mq.log.compression import GZIP
from mq.log.layout import CONTROL_COMMIT, LOG_APPEND_TIME
from mq.protocol.messages import Api
from mq.protocol.state import PartitionState, StateReader, semaphore_prefix

# Consumer processes are forked (the fork-safety test needs fork anyway); the xdist worker
# may run threads, which Python >= 3.12 warns about.
pytestmark = pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")
CTX = multiprocessing.get_context("fork")
T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
# Tests of wake-ups stretch the consumer's liveness check (normally 1 s) to a minute, so only
# a semaphore post can wake it within this limit, however loaded the machine is.
WAKE_LIMIT_S = 5.0
LONG_LIVENESS_S = 60.0


# --- helpers ------------------------------------------------------------------------------------

@pytest.fixture
def broker(broker):
    """The conftest broker with topic ``t`` of 2 partitions."""
    create_topic(broker, "t", 2)
    return broker


def produce(conn: Connection, tp: TopicPartition, values, *, key=None, headers=(),
            timestamps=None, compression=0) -> int:
    """One batch; returns its base offset."""
    builder = BatchBuilder(compression=compression)
    for i, value in enumerate(values):
        ts = 1_000 + i if timestamps is None else timestamps[i]
        builder.append(ts, key, value, headers)
    reply = conn.call(Api.PRODUCE, tp.topic, tp.partition, 1, bytes(builder.build()))
    return reply["first_offset"]


def drain(consumer: Consumer, count: int, timeout_s: float = 30.0, **kwargs
          ) -> dict[TopicPartition, list[Record]]:
    """Poll until ``count`` records came back (fails after ``timeout_s``)."""
    out: dict[TopicPartition, list[Record]] = {}
    got = 0
    deadline = time.monotonic() + timeout_s
    while got < count:
        assert time.monotonic() < deadline, f"only {got} of {count} records"
        for tp, records in consumer.poll(timeout_ms=1000, **kwargs).items():
            out.setdefault(tp, []).extend(records)
            got += len(records)
    return out


def as_tuples(records):
    return [(r.offset, None if r.key is None else bytes(r.key), bytes(r.value)) for r in records]


def semaphore_names(b) -> list[str]:
    prefix = "sem." + semaphore_prefix(b.data_dir).lstrip("/")
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


class Child:
    """A forked process running ``target(pipe, *args)``; ``recv`` fails instead of hanging."""

    def __init__(self, target, *args) -> None:
        self.pipe, child_end = CTX.Pipe()
        self.proc = CTX.Process(target=_run_child, args=(target, child_end, *args), daemon=True)
        self.proc.start()
        child_end.close()

    def recv(self, timeout: float = 30.0):
        assert self.pipe.poll(timeout), "the child process did not report in time"
        kind, value = self.pipe.recv()
        if kind == "error":
            raise AssertionError(f"child failed: {value}")
        return value

    def send(self, value) -> None:
        self.pipe.send(value)

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(30)


def _run_child(target, pipe, *args) -> None:
    try:
        target(pipe, *args)
    except BaseException as err:      # report, never hang the parent
        import traceback
        pipe.send(("error", f"{err!r}\n{traceback.format_exc()}"))
    finally:
        pipe.close()
        os._exit(0)


def _announce_waits(pipe, liveness_s: float | None = LONG_LIVENESS_S) -> None:
    """In a child: tell the parent (once) when the consumer blocks, on its semaphore or on
    futex words."""
    if liveness_s is not None:
        consumer_module._LIVENESS_CHECK_S = liveness_s
    told = []

    def announcing(original):
        def block(*args):
            if not told:
                told.append(True)
                pipe.send(("ok", ("waiting", time.monotonic())))
            return original(*args)
        return block
    consumer_module._block = announcing(consumer_module._block)
    consumer_module._sleep_on = announcing(consumer_module._sleep_on)


def _producer_process(pipe, socket_path, tp, values) -> None:
    with Connection(socket_path) as conn:
        sent_at = time.monotonic()
        offset = produce(conn, tp, values)
    pipe.send(("ok", (offset, sent_at)))


def run_producer(socket_path, tp, values):
    child = Child(_producer_process, socket_path, tp, values)
    try:
        return child.recv()
    finally:
        child.close()


# --- reading what was produced ------------------------------------------------------------------

def test_assign_and_poll_returns_exactly_what_was_produced(broker):
    expected = {T0: [], T1: []}
    with Connection(broker.socket) as conn:
        rng = random.Random(7)
        for i in range(60):
            tp = (T0, T1)[i % 2]
            values = [b"%d-%d-" % (i, j) + bytes(rng.randrange(300)) for j in range(i % 7 + 1)]
            key = b"key%d" % i if i % 3 else None
            headers = [("h", b"%d" % i), ("empty", None)] if i % 4 == 0 else []
            base = produce(conn, tp, values, key=key, headers=headers,
                           compression=GZIP if i % 5 == 0 else 0)
            expected[tp] += [(base + j, key, v, 1_000 + j, headers)
                             for j, v in enumerate(values)]
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0, T1])
        assert consumer.assignment() == {T0, T1}
        got = drain(consumer, sum(map(len, expected.values())), max_records=37)
        assert consumer.poll(timeout_ms=0) == {}
    for tp in (T0, T1):
        assert [(r.offset, None if r.key is None else bytes(r.key), bytes(r.value),
                 r.timestamp_ms, [(k, None if v is None else bytes(v)) for k, v in r.headers])
                for r in got[tp]] == expected[tp]
        assert all(r.topic == tp.topic and r.partition == tp.partition and
                   r.timestamp_type == 0 for r in got[tp])
    # Records stay valid after the consumer closed (maps are never closed under a view).
    assert bytes(got[T0][0].value) == expected[T0][0][2]


def test_records_from_concurrent_producer_processes_in_order(broker):
    """Two producer processes write the same partition; a consumer process sees each one's
    records in its order, every offset exactly once."""
    def consume(pipe, socket_path, count):
        with Consumer(socket=socket_path) as consumer:
            consumer.assign([T0])
            records = drain(consumer, count)[T0]
        pipe.send(("ok", [(r.offset, bytes(r.value)) for r in records]))

    reader = Child(consume, broker.socket, 400)
    producers = [Child(_many_batches, broker.socket, name) for name in (b"a", b"b")]
    try:
        for p in producers:
            assert p.recv() == "done"
        got = reader.recv()
    finally:
        for child in [reader, *producers]:
            child.close()
    assert [o for o, _ in got] == list(range(400))
    for name in (b"a", b"b"):
        mine = [int(v.split(b"-")[1]) for _, v in got if v.startswith(name)]
        assert mine == list(range(200))


def _many_batches(pipe, socket_path, name) -> None:
    with Connection(socket_path) as conn:
        for i in range(0, 200, 4):
            produce(conn, T0, [name + b"-%d" % (i + j) for j in range(4)])
    pipe.send(("ok", "done"))


def test_constructor_topics_assign_every_partition_and_new_ones(broker):
    with Connection(broker.socket) as conn, Admin(broker.socket) as admin:
        produce(conn, T0, [b"a"])
        produce(conn, T1, [b"b"])
        with Consumer("t", socket=broker.socket) as consumer:
            assert consumer.assignment() == {T0, T1}
            got = drain(consumer, 2)
            assert {tp: as_tuples(r) for tp, r in got.items()} == {
                T0: [(0, None, b"a")], T1: [(0, None, b"b")]}
            admin.create_partitions("t", 3)
            t2 = TopicPartition("t", 2)
            produce(conn, t2, [b"c"])
            assert as_tuples(drain(consumer, 1)[t2]) == [(0, None, b"c")]
            assert consumer.assignment() == {T0, T1, t2}
            assert consumer.partitions_for_topic("t") == {0, 1, 2}
            assert "t" in consumer.topics()
            consumer.assign([T1])                 # manual assignment replaces it
            assert consumer.assignment() == {T1}


def test_max_records_and_fairness_between_partitions(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"x"] * 300)
        produce(conn, T1, [b"y"] * 300)
    with Consumer(socket=broker.socket, max_poll_records=100) as consumer:
        consumer.assign([T0, T1])
        seen = {T0: 0, T1: 0}
        for _ in range(4):
            batch = consumer.poll(timeout_ms=1000)
            assert sum(map(len, batch.values())) == 100
            for tp, records in batch.items():
                assert records[0].offset == seen[tp]          # continues where it stopped
                seen[tp] += len(records)
        assert seen[T0] > 0 and seen[T1] > 0
        assert sum(map(len, consumer.poll(timeout_ms=0, max_records=1000).values())) == 200


def end_empty_transaction(conn: Connection, topic: str, partition: int) -> None:
    """A transaction with one partition and no record in it, committed: a COMMIT marker."""
    pid, epoch = conn.call(Api.INIT_PRODUCER_ID, "marker-maker", 60_000).fields
    conn.call(Api.ADD_PARTITIONS_TO_TXN, "marker-maker", pid, epoch, [[topic, partition]])
    conn.call(Api.END_TXN, "marker-maker", pid, epoch, 1)


def test_control_batches_are_skipped(broker):
    """Markers only come from the transaction coordinator (a client's control batch is
    refused); a consumer never returns them and moves past them."""
    with Connection(broker.socket) as conn:
        with pytest.raises(InvalidRecordError, match="control"):
            conn.call(Api.PRODUCE, "t", 0, 1, bytes(control_batch(CONTROL_COMMIT,
                                                                  producer_id=1,
                                                                  producer_epoch=0)))
        produce(conn, T0, [b"a", b"b"])
        end_empty_transaction(conn, "t", 0)
        produce(conn, T0, [b"c"])
        end_empty_transaction(conn, "t", 0)
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0])
        assert as_tuples(drain(consumer, 3)[T0]) == [(0, None, b"a"), (1, None, b"b"),
                                                     (3, None, b"c")]
        assert consumer.poll(timeout_ms=0) == {}
        assert consumer.position(T0) == 5


def test_records_pickle_as_bytes(broker):
    import pickle
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"v"], key=b"k", headers=[("h", b"x"), ("n", None)])
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0])
        record = drain(consumer, 1)[T0][0]
    copy = pickle.loads(pickle.dumps(record))
    assert copy == record and type(copy) is Record
    assert (copy.key, copy.value, copy.headers) == (b"k", b"v", [("h", b"x"), ("n", None)])
    with Consumer(socket=broker.socket) as consumer, pytest.raises(ValueError):
        consumer.poll(max_records=0)


def test_value_bytes_and_deserializers(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"1", b"2"], key=b"k", headers=[("h", b"v")])
    with Consumer(socket=broker.socket, value_bytes=True) as consumer:
        consumer.assign([T0])
        records = drain(consumer, 2)[T0]
        assert records[0].value == b"1" and type(records[0].value) is bytes
        assert type(records[0].key) is bytes and records[0].headers == [("h", b"v")]
    with Consumer(socket=broker.socket, value_deserializer=lambda v: int(bytes(v)),
                  key_deserializer=lambda k: str(k, "utf-8")) as consumer:
        consumer.assign([T0])
        records = drain(consumer, 2)[T0]
        assert [(r.key, r.value) for r in records] == [("k", 1), ("k", 2)]
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0])
        record = drain(consumer, 1)[T0][0]
        assert isinstance(record.value, memoryview) and record.value == b"1"
        assert "value=b'1'" in repr(record)


def test_damaged_batch_raises_after_the_records_before_it(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"good"])
        produce(conn, T0, [b"fine"])
    path = os.path.join(broker.data_dir, "t-0", "00000000000000000000.log")
    with open(path, "r+b") as f:                  # flip a byte of the second batch's value
        data = f.read()
        at = data.rindex(b"fine")
        f.seek(at)
        f.write(b"F")
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0])
        assert as_tuples(consumer.poll(timeout_ms=1000)[T0]) == [(0, None, b"good")]
        for _ in range(2):                        # stays at the damaged batch
            with pytest.raises(CorruptRecordError, match="CRC mismatch"):
                consumer.poll(timeout_ms=0)
        assert consumer.position(T0) == 1
    with Consumer(socket=broker.socket, check_crcs=False) as consumer:
        consumer.assign([T0])
        assert [bytes(r.value) for r in drain(consumer, 2)[T0]] == [b"good", b"Fine"]


def test_log_append_time_topic(broker):
    create_topic(broker, "lat", 1, {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    tp = TopicPartition("lat", 0)
    with Connection(broker.socket) as conn:
        produce(conn, tp, [b"a"], timestamps=[5])
    with Consumer("lat", socket=broker.socket) as consumer:
        record = drain(consumer, 1)[tp][0]
    assert record.timestamp_type == LOG_APPEND_TIME and record.timestamp_ms >= before


# --- positions ----------------------------------------------------------------------------------

def test_seek_position_beginning_and_end_offsets(broker):
    with Connection(broker.socket) as conn:
        for i in range(10):
            produce(conn, T0, [b"%d" % (3 * i + j) for j in range(3)])
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0, T1])
        assert consumer.beginning_offsets([T0, T1]) == {T0: 0, T1: 0}
        assert consumer.end_offsets([T0, T1]) == {T0: 30, T1: 0}
        assert consumer.position(T0) == 0                     # earliest, resolved now
        for offset in (17, 0, 29, 4):                         # mid-batch seeks too
            consumer.seek(T0, offset)
            assert consumer.position(T0) == offset
            records = drain(consumer, 30 - offset)[T0]
            assert [r.offset for r in records] == list(range(offset, 30))
            assert [bytes(r.value) for r in records] == [b"%d" % o for o in range(offset, 30)]
            assert consumer.position(T0) == 30
        consumer.seek_to_beginning(T0)
        assert consumer.position(T0) == 0
        consumer.seek_to_end()
        assert consumer.position(T0) == 30 and consumer.position(T1) == 0
        assert consumer.poll(timeout_ms=0) == {}
        consumer.seek_to_beginning()
        assert len(drain(consumer, 30)[T0]) == 30
        with pytest.raises(ValueError):
            consumer.seek(T0, -1)
        with pytest.raises(ValueError):
            consumer.position(TopicPartition("t", 7))
        with pytest.raises(UnknownTopicOrPartitionError):
            consumer.end_offsets([TopicPartition("nope", 0)])


def test_auto_offset_reset_latest_starts_at_the_end(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"old"] * 5)
        with Consumer(socket=broker.socket, auto_offset_reset="latest") as consumer:
            consumer.assign([T0])
            assert consumer.poll(timeout_ms=0) == {}
            assert consumer.position(T0) == 5
            produce(conn, T0, [b"new"])
            assert as_tuples(drain(consumer, 1)[T0]) == [(5, None, b"new")]


def test_offsets_for_times_matches_brute_force(broker):
    rng = random.Random(3)
    timestamps = [rng.randrange(1_000, 2_000) for _ in range(200)]    # not ordered
    with Connection(broker.socket) as conn:
        for i in range(0, 200, 10):
            produce(conn, T0, [b"v"] * 10, timestamps=timestamps[i:i + 10])
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0])
        for target in [0, 999, 1_000, 1_001] + rng.sample(range(1_000, 2_000), 40) + [1_999,
                                                                                        2_000]:
            hits = [(o, ts) for o, ts in enumerate(timestamps) if ts >= target]
            want = hits[0] if hits else None
            assert consumer.offsets_for_times({T0: target, T1: target}) == {T0: want,
                                                                           T1: None}, target
        with pytest.raises(ValueError):
            consumer.offsets_for_times({T0: -5})


def test_iteration_position_and_poll_do_not_lose_or_repeat(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"%d" % i for i in range(50)])
    with Consumer(socket=broker.socket, max_poll_records=20, consumer_timeout_ms=0) as consumer:
        consumer.assign([T0])
        it = iter(consumer)
        first = [next(it).offset for _ in range(5)]
        assert first == [0, 1, 2, 3, 4] and consumer.position(T0) == 5
        assert [r.offset for r in consumer.poll(timeout_ms=0)[T0]] == list(range(5, 25))
        assert [r.offset for r in consumer] == list(range(25, 50))    # ends: timeout 0
        consumer.seek(T0, 48)
        assert [r.offset for r in consumer] == [48, 49]


def test_pause_and_resume(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"a"] * 3)
        produce(conn, T1, [b"b"] * 3)
        with Consumer(socket=broker.socket, max_poll_records=2) as consumer:
            consumer.assign([T0, T1])
            consumer.pause(T1)
            assert consumer.paused() == {T1}
            got = drain(consumer, 3)
            assert set(got) == {T0}
            assert consumer.poll(timeout_ms=50) == {}
            consumer.resume(T1)
            assert consumer.paused() == set()
            assert [r.offset for r in drain(consumer, 3)[T1]] == [0, 1, 2]
            # Pausing mid-iteration gives back what the iterator held for that partition.
            produce(conn, T0, [b"c"] * 4)
            it = iter(consumer)
            assert next(it).offset == 3
            consumer.pause(T0)
            assert consumer.position(T0) == 4
            consumer.resume(T0)
            assert [r.offset for r in drain(consumer, 3)[T0]] == [4, 5, 6]


def test_never_returns_records_past_the_high_watermark(broker, monkeypatch):
    """The consumer reads only below the published readable end, even with more data on
    disk (the durable high watermark mode): here the published state is held back."""
    with Connection(broker.socket) as conn:
        bases = [produce(conn, T0, [b"%d" % i] * 3) for i in range(6)]
    held_back = {}
    real_read = StateReader.read

    def read(self, slot):
        st = real_read(self, slot)
        return held_back.get(slot, st)

    monkeypatch.setattr(StateReader, "read", read)
    # The fast tail poll reads the region in C, past this fake: tests/unit/log/test_tail_take.py
    # holds it to the published bound.
    monkeypatch.setattr(native, "tail_take", None)
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0])
        slot = consumer._driver.slot(T0)
        st = real_read(consumer._driver.session.state, slot)
        positions = [b.position for b in consumer._fetcher.cursors[T0].reader.read(0, None, None)]
        hw = bases[4]
        held_back[slot] = PartitionState(hw, hw, 0, st.active_segment_base, positions[4],
                                         st.segment_generation, st.log_end_offset)
        assert [r.offset for r in drain(consumer, hw)[T0]] == list(range(hw))
        assert consumer.poll(timeout_ms=100) == {}
        assert consumer.end_offsets([T0]) == {T0: hw}
        # An offset bound below the byte bound still wins (records filtered by offset).
        held_back[slot] = PartitionState(hw + 1, hw + 1, 0, st.active_segment_base,
                                         positions[5], st.segment_generation,
                                         st.log_end_offset)
        assert [r.offset for r in drain(consumer, 1)[T0]] == [hw]
        assert consumer.poll(timeout_ms=0) == {}
        del held_back[slot]
        assert [r.offset for r in drain(consumer, 5)[T0]] == list(range(hw + 1, 18))


def test_durable_high_watermark_mode_never_runs_ahead(tmp_path):
    with broker_with(tmp_path, high_watermark="durable") as b:
        create_topic(b, "t", 1)
        producer = Child(_many_batches, b.socket, b"d")
        try:
            with Consumer(socket=b.socket) as consumer:
                consumer.assign([T0])
                got = 0
                while got < 200:
                    for records in consumer.poll(timeout_ms=1000).values():
                        assert records[-1].offset < consumer.end_offsets([T0])[T0]
                        assert [r.offset for r in records] == list(range(got,
                                                                         got + len(records)))
                        got += len(records)
            assert producer.recv() == "done"
        finally:
            producer.close()


# --- waiting without busy polling ---------------------------------------------------------------

def _iterate_one(pipe, socket_path) -> None:
    _announce_waits(pipe)
    with Consumer(socket=socket_path) as consumer:
        consumer.assign([T0])
        for record in consumer:
            pipe.send(("ok", (record.offset, bytes(record.value), time.monotonic())))
            break


def test_blocking_iteration_wakes_on_new_data_from_another_process(broker):
    child = Child(_iterate_one, broker.socket)
    try:
        what, _ = child.recv()
        assert what == "waiting"
        offset, sent_at = run_producer(broker.socket, T0, [b"wake up"])
        got_offset, value, received_at = child.recv()
    finally:
        child.close()
    assert (got_offset, value) == (offset, b"wake up")
    assert received_at - sent_at < WAKE_LIMIT_S, "woken by a timeout, not by the semaphore"


def test_idle_consumer_uses_no_cpu(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"a"])
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0, T1])
        drain(consumer, 1)
        me = psutil.Process()
        cpu_before = sum(me.cpu_times()[:2])
        wall_before = time.monotonic()
        assert consumer.poll(timeout_ms=1200) == {}          # blocked on the semaphore
        wall = time.monotonic() - wall_before
        cpu = sum(me.cpu_times()[:2]) - cpu_before
    assert wall >= 1.15
    assert cpu < 0.05 * wall, f"{cpu:.3f}s of CPU while idle for {wall:.2f}s"


def test_short_polls_rearm_and_a_later_record_still_wakes_at_once(broker, monkeypatch):
    monkeypatch.setattr(consumer_module, "_LIVENESS_CHECK_S", LONG_LIVENESS_S)
    with Consumer(socket=broker.socket) as consumer, Connection(broker.socket) as conn:
        consumer.assign([T0])
        for _ in range(5):
            assert consumer.poll(timeout_ms=20) == {}
        produce(conn, T0, [b"x"])
        started = time.monotonic()
        assert len(consumer.poll(timeout_ms=5000)[T0]) == 1
        assert time.monotonic() - started < WAKE_LIMIT_S


def _count_waits(consumer: Consumer) -> list:
    """Record the positions of every WAIT the consumer's connection sends from now on."""
    conn = consumer._driver.session.conn
    sent, original = [], conn.send

    def send(api, *fields):
        if api == Api.WAIT:
            sent.append(fields[1])
        return original(api, *fields)
    conn.send = send
    return sent


WAKES = ["futex", "semaphore"]          # MQ_CONSUMER_WAKE: how a caught-up consumer sleeps


def _lockstep_reader(pipe, socket_path, rounds, wake, spin_us: int = 0) -> None:
    os.environ["MQ_CONSUMER_WAKE"] = wake
    consumer_module._LIVENESS_CHECK_S = LONG_LIVENESS_S
    with Consumer(socket=socket_path, spin_us=spin_us) as consumer:
        consumer.assign([T0, T1])
        assert consumer._driver.live().futex == (wake == "futex")
        waits = _count_waits(consumer)
        for _ in range(rounds):
            pipe.send(("ok", "ready"))
            got = consumer.poll(timeout_ms=WAKE_LIMIT_S * 1000)
            pipe.send(("ok", {tp.partition: [r.offset for r in rs] for tp, rs in got.items()}))
        pipe.send(("ok", waits))


@pytest.mark.parametrize("wake", WAKES)
def test_a_caught_up_consumer_is_woken_for_every_batch_without_another_wait(broker, wake):
    """A consumer that catches up again and again (each batch sent while it is about to
    block, or blocked) is woken for every one. On futex words it sends no WAIT at all; on
    its semaphore, waiters stay armed after their post, so it sends one WAIT in all. A lost
    wake-up shows as an empty poll (the liveness check is stretched past the poll's
    timeout)."""
    rounds = 150
    child = Child(_lockstep_reader, broker.socket, rounds, wake)
    try:
        with Connection(broker.socket) as conn:
            for i in range(rounds):
                assert child.recv() == "ready"
                tp = (T0, T1)[i % 2]
                offset = produce(conn, tp, [b"%d" % i])
                assert child.recv() == {tp.partition: [offset]}, f"round {i}"
        waits = child.recv()
    finally:
        child.close()
    assert [[p[:2] for p in positions] for positions in waits] == \
        ([] if wake == "futex" else [[["t", 0], ["t", 1]]])


def test_the_spin_wait_strategy_on_broker_and_consumer(tmp_path):
    """A broker with ``spin_us`` and consumers with ``spin_us``: a consumer that catches up
    again and again gets every batch (seen while it spins, or woken from the sleep after it:
    the producer waits a varying while), sends no WAIT, and an idle poll ends at its
    timeout."""
    rounds = 60
    with broker_with(tmp_path, spin_us=200) as b:
        create_topic(b, "t", 2)
        child = Child(_lockstep_reader, b.socket, rounds, "futex", 1000)
        try:
            with Connection(b.socket) as conn:
                for i in range(rounds):
                    assert child.recv() == "ready"
                    if i % 3 == 2:    # outlast the 1 ms spin, so the consumer is asleep:
                        time.sleep(0.003)     # a staged pause, not a wait for a condition
                    tp = (T0, T1)[i % 2]
                    offset = produce(conn, tp, [b"%d" % i])
                    assert child.recv() == {tp.partition: [offset]}, f"round {i}"
            assert child.recv() == []             # no WAIT: futex words only
        finally:
            child.close()
        with Consumer(socket=b.socket, spin_us=20_000) as consumer:
            consumer.assign([T0])
            consumer.seek_to_end(T0)
            started = time.monotonic()
            assert consumer.poll(timeout_ms=100) == {}
            assert time.monotonic() - started >= 0.1


def _poll_each_racing_record(consumer: Consumer, pending: list, rounds: int = 20) -> None:
    """Poll ``rounds`` times, each with one record queued in ``pending`` for the patched
    race to send: each poll returns it, and not by waiting out a timeout."""
    for i in range(rounds):
        pending.append(b"%d" % i)
        started = time.monotonic()
        got = consumer.poll(timeout_ms=2 * WAKE_LIMIT_S * 1000)
        assert time.monotonic() - started < WAKE_LIMIT_S, "woken by the timeout"
        assert [bytes(r.value) for r in got.get(T0, [])] == [b"%d" % i]


@pytest.mark.skipif(not posix_ipc.SEMAPHORE_VALUE_SUPPORTED, reason="needs sem_getvalue")
def test_a_post_between_the_look_and_the_sleep_is_not_lost(broker, monkeypatch):
    """The race the protocol closes: the consumer found nothing, then (before it blocks) a
    record arrives and the broker posts. The post must still wake it — with no new WAIT."""
    monkeypatch.setenv("MQ_CONSUMER_WAKE", "semaphore")
    monkeypatch.setattr(consumer_module, "_LIVENESS_CHECK_S", LONG_LIVENESS_S)
    with Consumer(socket=broker.socket) as consumer, Connection(broker.socket) as conn:
        consumer.assign([T0])
        assert consumer.poll(timeout_ms=1) == {}            # armed
        waits = _count_waits(consumer)
        take, pending = consumer._fetcher.take, []

        def take_then_produce(session, max_records, in_group):
            out = take(session, max_records, in_group)
            if not out and pending:
                produce(conn, T0, [pending.pop()])
                deadline = time.monotonic() + WAKE_LIMIT_S
                while not session.sem.value:                 # until the broker posted
                    assert time.monotonic() < deadline, "the broker did not post"
            return out
        monkeypatch.setattr(consumer._fetcher, "take", take_then_produce)
        _poll_each_racing_record(consumer, pending)
    assert waits == []


@pytest.mark.skipif(state_module.futex is None, reason="mq.protocol._futex is not built")
def test_a_publish_between_the_look_and_the_futex_sleep_is_not_lost(broker, monkeypatch):
    """The same race on futex words: the consumer took the partition's sequence and found
    nothing; a record is published before its sleep begins. The word no longer holds the
    value the sleep expects, so the sleep does not begin (-2), and the record is read."""
    monkeypatch.setattr(consumer_module, "_LIVENESS_CHECK_S", LONG_LIVENESS_S)
    with Consumer(socket=broker.socket) as consumer, Connection(broker.socket) as conn:
        consumer.assign([T0])
        assert consumer.poll(timeout_ms=1) == {}
        session = consumer._driver.live()
        assert session.futex
        sleep_on, pending, outcomes = consumer_module._sleep_on, [], []

        def produce_then_sleep(region, offsets, values, *rest):
            if pending:
                produce(conn, T0, [pending.pop()])
                word = offsets[0]
                deadline = time.monotonic() + WAKE_LIMIT_S
                while int.from_bytes(region[word:word + 4], "little") == values[0]:
                    assert time.monotonic() < deadline, "the broker did not publish"
            outcomes.append(sleep_on(region, offsets, values, *rest))
            return outcomes[-1]
        monkeypatch.setattr(consumer_module, "_sleep_on", produce_then_sleep)
        _poll_each_racing_record(consumer, pending)
    assert outcomes == [-2] * 20


def _fan_reader(pipe, socket_path, rounds, wake) -> None:
    os.environ["MQ_CONSUMER_WAKE"] = wake
    consumer_module._LIVENESS_CHECK_S = LONG_LIVENESS_S
    with Consumer(socket=socket_path) as consumer:
        consumer.assign([T0])
        consumer.poll(timeout_ms=1)
        pipe.send(("ok", "ready"))
        offsets: list[int] = []
        while len(offsets) < rounds:
            got = consumer.poll(timeout_ms=WAKE_LIMIT_S * 1000)
            if not got:
                break                     # lost wake-up: the parent sees the short list
            offsets += [r.offset for r in got[T0]]
            pipe.send(("ok", offsets[-1]))
        pipe.send(("ok", offsets))


def test_every_consumer_of_a_partition_is_woken_for_every_record(broker):
    """Fan-out: 4 consumers of one partition (3 on futex words, which the broker wakes one of
    per publish and the one it woke wakes the others, and 1 on its semaphore) each get every
    record of 100 sent one at a time, each after all 4 had the one before, so all 4 are
    asleep or falling asleep at every publish. No liveness wake-ups to hide a lost one."""
    rounds = 100
    wakes = ["futex", "futex", "futex", "semaphore"] if state_module.futex is not None \
        else ["semaphore"] * 4
    readers = [Child(_fan_reader, broker.socket, rounds, wake) for wake in wakes]
    try:
        for reader in readers:
            assert reader.recv() == "ready"
        with Connection(broker.socket) as conn:
            for i in range(rounds):
                offset = produce(conn, T0, [b"%d" % i])
                for reader in readers:
                    assert reader.recv() == offset, f"round {i}"
        for reader in readers:
            assert reader.recv() == list(range(rounds))
    finally:
        for reader in readers:
            reader.close()


def _racing_reader(pipe, socket_path, count, wake) -> None:
    os.environ["MQ_CONSUMER_WAKE"] = wake
    consumer_module._LIVENESS_CHECK_S = LONG_LIVENESS_S
    with Consumer(socket=socket_path) as consumer:
        consumer.assign([T0])
        waits = _count_waits(consumer)
        offsets = []
        while len(offsets) < count:
            got = consumer.poll(timeout_ms=WAKE_LIMIT_S * 1000, max_records=3)
            if not got:
                break                     # lost wake-up: the parent sees the short list
            offsets += [r.offset for r in got[T0]]
        pipe.send(("ok", (offsets, len(waits))))


@pytest.mark.parametrize("wake", WAKES)
def test_consumers_arming_while_a_producer_appends_get_every_record(broker, wake):
    """Three consumer processes catch up, sleep and wake while a producer process appends
    small batches as fast as it can: each gets every record, none waits out a timeout."""
    count = 2_000
    readers = [Child(_racing_reader, broker.socket, count, wake) for _ in range(3)]
    try:
        values = [b"%d" % i for i in range(count)]
        with Connection(broker.socket) as conn:
            for i in range(0, count, 4):
                produce(conn, T0, values[i:i + 4])
        for reader in readers:
            offsets, waits = reader.recv(60)
            assert offsets == list(range(count))
            assert waits <= (0 if wake == "futex" else 2)   # armed once (again after a
    finally:                                                # move below the arm)
        for reader in readers:
            reader.close()


# --- retention and out of range -----------------------------------------------------------------

def test_retention_under_a_reader_resumes_at_the_new_log_start(tmp_path):
    with broker_with(tmp_path, retention_check_interval_ms=50) as b:
        # Timestamps here are from 1970: only retention.bytes may delete.
        create_topic(b, "t", 1, {"segment.bytes": "1000", "retention.bytes": "2000",
                                 "retention.ms": "-1", "file.delete.delay.ms": "0"})
        with Connection(b.socket) as conn, Consumer(socket=b.socket) as consumer:
            consumer.assign([T0])
            produce(conn, T0, [b"first-%d" % i for i in range(5)])
            kept = drain(consumer, 5)[T0]
            consumer.seek(T0, 0)
            for i in range(40):
                produce(conn, T0, [b"more-%d-%d" % (i, j) for j in range(5)])
            mq.testing.wait_for(lambda: consumer.beginning_offsets([T0])[T0] > 5,
                                message="retention to delete old segments")
            assert not os.path.exists(os.path.join(b.data_dir, "t-0",
                                                   "00000000000000000000.log"))
            start = consumer.beginning_offsets([T0])[T0]
            records = consumer.poll(timeout_ms=1000)[T0]
            assert records[0].offset >= start           # auto_offset_reset=earliest
            assert [bytes(r.value) for r in kept] == [b"first-%d" % i for i in range(5)]
        with Consumer(socket=b.socket, auto_offset_reset="none") as strict:
            strict.assign([T0])
            strict.seek(T0, 0)
            with pytest.raises(OffsetOutOfRangeError):
                strict.poll(timeout_ms=0)


def test_out_of_range_with_reset_none_raises(broker):
    with Connection(broker.socket) as conn, Admin(broker.socket) as admin:
        produce(conn, T0, [b"a"] * 10)
        admin.delete_records("t", 0, 4)
    with Consumer(socket=broker.socket, auto_offset_reset="none") as consumer:
        consumer.assign([T0])
        with pytest.raises(NoOffsetForPartitionError, match="no position"):
            consumer.poll(timeout_ms=0)
        consumer.seek(T0, 2)
        with pytest.raises(OffsetOutOfRangeError) as info:
            consumer.poll(timeout_ms=0)
        assert (info.value.offset, info.value.log_start_offset) == (2, 4)
        consumer.seek(T0, 99)
        with pytest.raises(OffsetOutOfRangeError):
            consumer.poll(timeout_ms=0)
        consumer.seek(T0, 6)
        assert [r.offset for r in drain(consumer, 4)[T0]] == [6, 7, 8, 9]
    with Consumer(socket=broker.socket) as consumer:           # earliest
        consumer.assign([T0])
        consumer.seek(T0, 2)
        assert [r.offset for r in drain(consumer, 6)[T0]] == list(range(4, 10))


def test_deleted_topic_raises_from_poll(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"a"])
    with Consumer(socket=broker.socket) as consumer, Admin(broker.socket) as admin:
        consumer.assign([T0])
        drain(consumer, 1)
        admin.delete_topic("t")
        with pytest.raises(UnknownTopicOrPartitionError):
            consumer.poll(timeout_ms=1000)
        with pytest.raises(UnknownTopicOrPartitionError):
            consumer.assign([T0])
    with pytest.raises(UnknownTopicOrPartitionError):
        Consumer("t", socket=broker.socket)


def _wait_then_report_error(pipe, socket_path) -> None:
    _announce_waits(pipe)
    with Consumer(socket=socket_path) as consumer:
        consumer.assign([T0])
        try:
            consumer.poll(timeout_ms=30_000)
        except UnknownTopicOrPartitionError as err:
            pipe.send(("ok", ("raised", type(err).__name__, time.monotonic())))


def test_topic_deleted_while_a_consumer_waits(broker):
    child = Child(_wait_then_report_error, broker.socket)
    try:
        assert child.recv()[0] == "waiting"
        with Admin(broker.socket) as admin:
            deleted_at = time.monotonic()
            admin.delete_topic("t")
        what, name, at = child.recv()
    finally:
        child.close()
    assert (what, name) == ("raised", "UnknownTopicOrPartitionError")
    assert at - deleted_at < WAKE_LIMIT_S


# --- crashes, restarts, fork --------------------------------------------------------------------

def _iterate_until(pipe, socket_path, want) -> None:
    _announce_waits(pipe, liveness_s=None)        # the liveness check finds the dead broker
    with Consumer(socket=socket_path) as consumer:
        consumer.assign([T0])
        for record in consumer:
            if bytes(record.value) == want:
                pipe.send(("ok", (record.offset, consumer._driver.session.generation)))
                return


def test_broker_kill_and_restart_while_a_consumer_waits(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"before"])
    child = Child(_iterate_until, broker.socket, b"after")
    try:
        assert child.recv()[0] == "waiting"
        old_pid = broker.pid
        broker.kill()
        broker.start()
        assert broker.pid != old_pid
        with Connection(broker.socket) as conn:
            offset = produce(conn, T0, [b"after"])
            generation = conn.broker_info["generation"]
        assert child.recv() == (offset, generation)
    finally:
        child.close()
    assert offset == 1


def test_broker_restart_moves_slots_and_the_consumer_follows(tmp_path):
    """Slots are handed out again at broker start, so a partition's slot can change; the
    consumer re-reads metadata after reconnecting instead of reading someone else's slot."""
    with mq.testing.broker(tmp_path / "data") as b:
        with Admin(b.socket) as admin:
            admin.create_topic("x", 1)
            admin.create_topic("t", 2)
            admin.delete_topic("x")
            admin.create_topic("y", 1)                # takes x's freed slot
        with Connection(b.socket) as conn:
            produce(conn, T0, [b"a"])
        with Consumer(socket=b.socket) as consumer:
            consumer.assign([T0, T1])
            assert as_tuples(drain(consumer, 1)[T0]) == [(0, None, b"a")]
            slots_before = consumer._driver.slot(T0), consumer._driver.slot(T1)
            b.kill()
            b.start()
            with Connection(b.socket) as conn:
                produce(conn, TopicPartition("y", 0), [b"y"] * 7)
                produce(conn, T1, [b"c"])
                produce(conn, T0, [b"b"])
            got = drain(consumer, 2)
            assert {tp: as_tuples(r) for tp, r in got.items()} == {
                T0: [(1, None, b"b")], T1: [(0, None, b"c")]}
            assert (consumer._driver.slot(T0), consumer._driver.slot(T1)) != slots_before


def _read_slowly(pipe, socket_path) -> None:
    _announce_waits(pipe)
    with Consumer(socket=socket_path, max_poll_records=10) as consumer:
        consumer.assign([T0, T1])
        while True:
            if consumer.poll(timeout_ms=10_000):
                pipe.send(("ok", ("read", consumer._driver.session.name)))


def test_consumer_killed_mid_read_leaves_no_trace(broker):
    with Connection(broker.socket) as conn:
        for _ in range(20):
            produce(conn, T0, [b"x" * 100] * 50)
    child = Child(_read_slowly, broker.socket)
    try:
        what, name = child.recv()
        assert what == "read"
        assert semaphore_names(broker) == []         # unlinked once the broker held it
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.join(30)
    finally:
        child.close()
    assert semaphore_names(broker) == []
    with Consumer(socket=broker.socket) as consumer:  # the broker serves on, data intact
        consumer.assign([T0])
        assert len(drain(consumer, 1000)[T0]) == 1000
    assert semaphore_names(broker) == []


def _fork_child_reads(pipe, consumer, socket_path) -> None:
    records = consumer.poll(timeout_ms=5000)[T0]
    pipe.send(("ok", ("first", [r.offset for r in records], os.getpid())))
    assert pipe.recv() == "produce"
    records = consumer.poll(timeout_ms=10_000)[T0]            # waits on its own semaphore
    pipe.send(("ok", ("second", [bytes(r.value) for r in records], consumer._driver.session.pid)))
    consumer.close()


def test_consumer_used_in_a_forked_child(broker):
    with Connection(broker.socket) as conn, Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0])
        produce(conn, T0, [b"a", b"b"])
        assert [r.offset for r in drain(consumer, 1, max_records=1)[T0]] == [0]
        parent_sem = consumer._driver.session.name
        child = Child(_fork_child_reads, consumer, broker.socket)
        try:
            what, offsets, child_pid = child.recv()
            assert (what, offsets) == ("first", [1])          # same position as the parent
            child.pipe.send("produce")
            produce(conn, T0, [b"c"])
            assert child.recv() == ("second", [b"c"], child_pid)
        finally:
            child.close()
        # The parent is untouched: same session, same position, still wakes.
        assert consumer._driver.session.name == parent_sem
        assert [bytes(r.value) for r in drain(consumer, 2)[T0]] == [b"b", b"c"]
        produce(conn, T0, [b"d"])
        assert [bytes(r.value) for r in consumer.poll(timeout_ms=5000)[T0]] == [b"d"]


# --- lifecycle and arguments --------------------------------------------------------------------

def test_close_is_idempotent_and_final(broker):
    with Connection(broker.socket) as conn:
        produce(conn, T0, [b"a", b"b", b"c"])
    consumer = Consumer(socket=broker.socket)
    consumer.assign([T0])
    it = iter(consumer)
    first = next(it)
    consumer.close()
    with pytest.raises(ClosedError):               # a loop running over the consumer ends
        next(it)
    assert bytes(first.value) == b"a"              # what it returned stays readable
    consumer.close()
    consumer.close()
    with pytest.raises(ClosedError):
        consumer.poll()
    with pytest.raises(ClosedError):
        next(iter(consumer))
    assert semaphore_names(broker) == []


def test_bad_arguments_and_group_less_commits(broker):
    with pytest.raises(ValueError):
        Consumer(socket=broker.socket, auto_offset_reset="smallest")
    with pytest.raises(ValueError):
        Consumer(socket=broker.socket, isolation_level="committed")
    with pytest.raises(ValueError, match="group_id"):
        Consumer(socket=broker.socket, pattern="t.*")
    with pytest.raises(ValueError, match="group_id"):
        Consumer("t", socket=broker.socket, group_id="")
    for spin_us in (-1, 1_000_001, "10", True):
        with pytest.raises(ValueError, match="spin_us must be from 0 to 1000000 microseconds"):
            Consumer(socket=broker.socket, spin_us=spin_us)
    with Consumer(socket=broker.socket) as consumer:
        consumer.assign([T0])
        with pytest.raises(ValueError, match="group_id"):
            consumer.commit()
    # A group-less consumer (assign() plus a group id) commits with epoch -1.
    with Consumer(group_id="g", socket=broker.socket) as consumer:
        consumer.assign([T0])
        assert consumer.committed(T0) is None
        consumer.commit({T0: 3})
        assert consumer.committed(T0) == 3
    with Consumer(socket=broker.socket, isolation_level="read_committed") as consumer:
        consumer.assign([T0])
        with Connection(broker.socket) as conn:
            produce(conn, T0, [b"a"])
        assert [r.offset for r in drain(consumer, 1)[T0]] == [0]
