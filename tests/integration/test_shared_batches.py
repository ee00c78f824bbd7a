"""Produce batches through the producer's shared-memory arena (``mq/client/arena.py``) against
a real broker: what travels there reads back as sent, whatever a client puts in its arena or
passes as one never reaches the log unchecked, and the broker never stops over it."""

from __future__ import annotations

import os
import select
import signal
import tempfile
import threading
import types

import pytest
from brokers import create_topic

from mq.client.arena import Arena
from mq.client.connection import Connection
from mq.client.consumer import Consumer
from mq.client.producer import Producer
from mq.client.types import TopicPartition
from mq.errors import CorruptMessageError, InvalidRequestError
from mq.log.builder import BatchBuilder
from mq.log.log import PartitionLog
from mq.protocol.messages import Api

WAIT = 30        # seconds: generous bound for any single wait on a loaded 2-core box


@pytest.fixture
def broker(broker):
    create_topic(broker, "t", 1)
    return broker


def batch(*values) -> bytearray:
    builder = BatchBuilder()
    for v in values:
        builder.append(1000, None, v)
    return builder.build()


def consume(b, topic: str, n: int) -> list[bytes]:
    with Consumer(socket=b.socket) as c:
        c.assign([TopicPartition(topic, 0)])
        c.seek(TopicPartition(topic, 0), 0)
        got: list[bytes] = []
        while len(got) < n:
            records = c.poll(timeout_ms=WAIT * 1000)
            assert records, f"only {len(got)} of {n} records came"
            got.extend(bytes(r.value) for part in records.values() for r in part)
    return got


def log_batches(b, topic: str = "t") -> list:
    """Every batch in the partition's files, each validated (CRC included)."""
    with PartitionLog.open(os.path.join(b.data_dir, f"{topic}-0")) as plog:
        out = list(plog.batches())
        for written in out:
            written.validate()
        return [[bytes(r.value) for r in written.records()] for written in out]


def assert_alive(b):
    assert b.proc.poll() is None, b.stderr()
    with Connection(b.socket) as c:
        c.call(Api.METADATA, None)


# --- the producer ------------------------------------------------------------------------------

@pytest.mark.parametrize("settings", [{"acks": 1}, {"acks": "all"},
                                      {"acks": 1, "compression_type": "lz4"}],
                         ids=["acks=1", "acks=all", "lz4"])
def test_large_batches_go_through_the_arena_and_read_back_in_order(broker, settings):
    values = [os.urandom(size) for size in (65536, 100, 200_000, 65536) * 25]
    with Producer(socket=broker.socket, batch_size=1 << 20, linger_ms=5, **settings) as p:
        assert p._io.conn.arena is not None
        futures = [p.send("t", v) for v in values]
        p.flush(timeout=WAIT)
        assert [f.get(timeout=0).offset for f in futures] == list(range(len(values)))
        assert p._io.conn.arena.free_slots == p._max_in_flight      # every slot given back
    assert consume(broker, "t", len(values)) == values


def test_without_acks_or_when_turned_off_batches_go_through_the_socket(broker):
    for settings in ({"acks": 0}, {"acks": 1, "shared_batches": False}):
        with Producer(socket=broker.socket, **settings) as p:
            assert p._io.conn.arena is None
            p.send("t", b"x" * 100_000)
            p.flush(timeout=WAIT)
    assert len(consume(broker, "t", 2)) == 2


def test_a_restarted_broker_gets_a_new_arena_and_nothing_is_lost(tmp_path):
    import mq.testing
    data = tmp_path / "data"
    values = [os.urandom(70_000) for _ in range(40)]
    with mq.testing.broker(data) as b:
        create_topic(b, "t", 1)
        p = Producer(socket=b.socket, acks="all", batch_size=1 << 20, retries=50,
                     retry_backoff_ms=20)
        first = p._io.conn.arena
        for v in values[:20]:
            p.send("t", v)
        p.flush(timeout=WAIT)
        b.stop()
        b.start()
        futures = [p.send("t", v) for v in values[20:]]
        p.flush(timeout=WAIT)
        assert all(f.get(timeout=0) for f in futures)
        assert p._io.conn.arena is not None and p._io.conn.arena is not first
        p.close()
        assert consume(b, "t", 40) == values


# --- the protocol, from a client that does what it likes ---------------------------------------

def test_share_then_produce_shared(broker):
    with Connection(broker.socket) as c:
        arena = Arena(1 << 16, 2)
        c.share_arena(arena)
        for expected in (0, 2):
            slot, offset = arena.put(batch(b"a", b"b"))
            reply = c.call(Api.PRODUCE_SHARED, "t", 0, 1, offset, len(batch(b"a", b"b")))
            arena.release(slot)
            assert reply["first_offset"] == expected
    assert log_batches(broker) == [[b"a", b"b"], [b"a", b"b"]]


def _share_raw(c: Connection, fd: int, size: int) -> None:
    c.share_arena(types.SimpleNamespace(fd=fd, size=size, close=lambda: None))


def test_share_memory_refuses_what_is_not_a_sealed_memfd_of_the_size_said(broker, tmp_path):
    unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC)
    os.ftruncate(unsealed, 4096)
    with open(tmp_path / "file", "wb+") as f:
        f.truncate(4096)
        sealed = Arena(4096, 1)
        cases = [(unsealed, 4096, "sealed"), (f.fileno(), 4096, "memfd|sealed"),
                 (sealed.fd, 8192, "announced")]
        for fd, size, match in cases:
            with Connection(broker.socket) as c:
                with pytest.raises(InvalidRequestError, match=match):
                    _share_raw(c, fd, size)
                assert c.arena is None
        sealed.close()
    os.close(unsealed)
    with Connection(broker.socket) as c:
        with pytest.raises(InvalidRequestError, match="needs a memfd"):
            c.call(Api.SHARE_MEMORY, 4096)
    assert_alive(broker)


def test_produce_shared_refuses_bad_descriptors(broker):
    good = batch(b"x")
    with Connection(broker.socket) as c:
        with pytest.raises(InvalidRequestError, match="before ShareMemory"):
            c.call(Api.PRODUCE_SHARED, "t", 0, 1, 0, len(good))
        arena = Arena(4096, 1)
        c.share_arena(arena)
        arena.put(good)
        for offset, length in ((-1, 10), (0, 0), (4000, 200), (0, 1 << 40)):
            with pytest.raises(InvalidRequestError, match="outside the arena"):
                c.call(Api.PRODUCE_SHARED, "t", 0, 1, offset, length)
        with pytest.raises(InvalidRequestError, match="needs acks"):
            c.call(Api.PRODUCE_SHARED, "t", 0, 0, 0, len(good))
        with pytest.raises(CorruptMessageError):
            c.call(Api.PRODUCE_SHARED, "t", 0, 1, 0, len(good) - 1)
        bad = bytearray(good)
        bad[-1] ^= 0xFF
        arena.release(0)
        arena.put(bad)
        with pytest.raises(CorruptMessageError):
            c.call(Api.PRODUCE_SHARED, "t", 0, 1, 0, len(bad))
        assert c.call(Api.LIST_OFFSETS, "t", 0, -1)["offset"] == 0
    assert_alive(broker)


def test_a_client_rewriting_its_arena_in_flight_only_loses_its_own_batches(broker):
    """A thread flips bytes all over the slot while the batch in it is produced again and
    again: each request is stored whole or refused, every stored batch is valid, and the
    count of stored batches is the count of acknowledged ones."""
    good = batch(*[os.urandom(4000) for _ in range(64)])
    stop = threading.Event()
    with Connection(broker.socket) as c:
        arena = Arena(len(good), 1)
        c.share_arena(arena)
        arena.put(good)
        view = memoryview(arena._map)

        def scribble():
            i = 0
            while not stop.is_set():
                at = 61 + (i * 7919) % (len(good) - 61)
                view[at] ^= 0xFF          # flipped, then flipped back: mostly intact
                view[at] ^= 0xFF
                i += 1

        t = threading.Thread(target=scribble)
        t.start()
        acked = refused = 0
        try:
            for _ in range(200):
                try:
                    c.call(Api.PRODUCE_SHARED, "t", 0, 1, 0, len(good))
                    acked += 1
                except CorruptMessageError:
                    refused += 1
        finally:
            stop.set()
            t.join()
            view.release()
        assert acked + refused == 200
        end = c.call(Api.LIST_OFFSETS, "t", 0, -1)["offset"]
    assert end == 64 * acked
    broker.stop()
    stored = log_batches(broker)
    assert len(stored) == acked and all(len(values) == 64 for values in stored)


def test_a_forked_child_never_uses_its_parent_arena(broker):
    with Producer(socket=broker.socket, acks=1, batch_size=1 << 20) as p:
        parent_arena = p._io.conn.arena
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                         # the child
            try:
                with Producer(socket=broker.socket, acks=1, batch_size=1 << 20) as child:
                    arena = child._io.conn.arena
                    ok = arena is not None and arena is not parent_arena
                    child.send("t", b"c" * 100_000).get(timeout=WAIT)
                os.write(w, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(w)
        ready: list = []
        try:
            ready, _, _ = select.select([r], [], [], WAIT)
            answer = os.read(r, 1) if ready else b""
        finally:
            if not ready:
                os.kill(pid, signal.SIGKILL)             # never hang the suite on a child
            os.waitpid(pid, 0)
            os.close(r)
        assert answer == b"1"
        p.send("t", b"p" * 100_000).get(timeout=WAIT)
    assert sorted(v[:1] for v in consume(broker, "t", 2)) == [b"c", b"p"]


def test_a_temporary_directory_is_not_needed(broker):
    """The arena is a memfd: nothing of it appears in /dev/shm or the temp dir."""
    before = set(os.listdir("/dev/shm")), set(os.listdir(tempfile.gettempdir()))
    with Producer(socket=broker.socket, acks=1) as p:
        assert p._io.conn.arena is not None
        p.send("t", b"x" * 50_000).get(timeout=WAIT)
        during = set(os.listdir("/dev/shm")), set(os.listdir(tempfile.gettempdir()))
    assert not any("arena" in name for name in during[0] - before[0])
    assert not any("arena" in name for name in during[1] - before[1])


def test_kill_9_of_the_broker_mid_stream_loses_no_acknowledged_batch(tmp_path):
    """acks="all" through the arena while the broker is killed -9 and restarted: every record
    acknowledged before or after is in the log at its offset, once, and the log validates."""
    import mq.testing
    values = [i.to_bytes(4, "big") + os.urandom(65532) for i in range(240)]
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, "t", 1)
        acked: dict[int, int] = {}                  # value index -> offset
        with Producer(socket=b.socket, acks="all", batch_size=1 << 20, linger_ms=2,
                      retries=1000, retry_backoff_ms=20) as p:
            def sent(i, meta):
                acked[i] = meta.offset
            futures = []
            for i, v in enumerate(values):
                f = p.send("t", v)
                f.add_callback(sent, i)
                futures.append(f)
                if i == 120:
                    mq.testing.wait_for(lambda: len(acked) >= 40, timeout=WAIT)
                    b.kill()
                    b.start()
            p.flush(timeout=WAIT)
            assert all(f.get(timeout=0) for f in futures)
        b.stop()
        stored = [v for batch_values in log_batches(b) for v in batch_values]
    assert len(acked) == len(values)
    assert len(stored) == len(values)                    # idempotent: no batch twice
    for i, offset in acked.items():
        assert stored[offset] == values[i]
