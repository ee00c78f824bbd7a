"""The producer's driver (``mq.client.producer_io``) without a broker: what it does with replies
taken off the connection by ``send()`` — the I/O thread's wake-ups, seen through its wake-up
pipe — and how it writes the sender's requests (a connection breaking mid-way, large batches
through the arena), over stand-in connections."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mq.client.arena import Arena
from mq.client.batch_accumulator import BatchAccumulator
from mq.client.idempotence import ProducerIdentity
from mq.client.producer_io import ARENA_MIN_BYTES, ProducerIO
from mq.client.producer_metadata import ProducerMetadata
from mq.client.sender import Sender
from mq.errors import BrokerUnavailableError, KafkaStorageError
from mq.protocol.messages import Api, Response

BACKOFF = 0.02


class SentOnly:
    """The connection a batch was written on: no arena, never written to again here."""

    arena = None

    def send(self, *args, **kwargs):
        raise AssertionError("nothing is due to be written")


@pytest.fixture
def io():
    ids = ProducerIdentity()
    ids.set(1, 0)
    sender = Sender(-1, 1, 5, BACKOFF, 60.0, 120.0, ids)
    acc = BatchAccumulator(0, 0.0, -1, threading.Lock())
    meta = ProducerMetadata(16384, 1 << 20, 300.0)
    driver = ProducerIO("unused.sock", "test", 60.0, BACKOFF, False, 1 << 20, 60000, False,
                        acc, sender, meta)
    driver.wake_r, driver.wake_w = os.pipe()
    os.set_blocking(driver.wake_r, False)
    driver.conn = SentOnly()
    yield driver
    os.close(driver.wake_r)
    os.close(driver.wake_w)


def woken(io: ProducerIO) -> bool:
    try:
        return bool(os.read(io.wake_r, 4096))
    except BlockingIOError:
        return False


def test_a_retriable_error_the_caller_read_wakes_the_sleeping_io_thread(io):
    """``send()`` may read replies itself (``linger_ms=0``, no room in flight): when one is a
    retriable error, the I/O thread — asleep until the request timeout — must be woken to
    send the retry after its backoff, not 60 s later."""
    info = io.metadata.store("t", 1, 1 << 20, time.monotonic())
    with io.lock:
        batch = io.accumulator.open_batch(info, 0, time.monotonic())
        batch.add(None, None, b"v", ())
        io.queue(io.accumulator.close(batch))
        (sent,) = io.sender.requests(time.monotonic(), [])
        io.sender.sent(sent, 7, time.monotonic(), [])
    io.wake_at = time.monotonic() + 60                       # asleep until the timeout
    assert not woken(io)
    before = time.monotonic()
    io.take_replies(io.conn, [Response(Api.PRODUCE, 7, KafkaStorageError.code, "disk", [])],
                    caller=True)
    assert woken(io)
    assert before + BACKOFF <= io.wake_at <= time.monotonic() + BACKOFF
    assert list(io.sender.ready) == [batch] and not batch.done


def test_replies_taken_off_a_replaced_connection_settle_nothing(io):
    """Replies from a connection the driver has dropped: what was in flight on it is
    re-sent by the sender, so these must not count."""
    io.take_replies(SentOnly(), [Response(Api.PRODUCE, 1, 0, None, [0, -1])], caller=True)
    assert not woken(io) and not io.sender.in_flight


def test_a_reply_to_another_request_goes_to_its_waiter(io):
    io.requests[9] = None
    reply = Response(Api.METADATA, 9, 0, None, [{}])
    io.take_replies(io.conn, [reply], caller=False)
    assert io.requests[9] is reply


class Recording:
    """A connection that takes ``room`` requests, then breaks."""

    def __init__(self, room: int, arena=None) -> None:
        self.room = room
        self.arena = arena
        self.requests: list[tuple] = []
        self.closed = False

    def send(self, api, *fields):
        if len(self.requests) >= self.room:
            raise BrokerUnavailableError("broker connection lost: EPIPE")
        self.requests.append((api, *fields))
        return len(self.requests)

    def close(self) -> None:
        self.closed = True


def queue_batches(io: ProducerIO, sizes: list[int]) -> list:
    info = io.metadata.store("t", 1, 1 << 20, time.monotonic())
    batches = []
    for size in sizes:
        batch = io.accumulator.open_batch(info, 0, time.monotonic())
        batch.add(None, None, b"x" * size, ())
        io.queue(io.accumulator.close(batch))
        batches.append(batch)
    return batches


def test_a_write_that_breaks_the_connection_requeues_the_rest_in_order(io):
    io.sender.max_in_flight = 5
    io.conn = conn = Recording(room=1)
    batches = queue_batches(io, [10, 10, 10])
    finished: list = []
    with io.lock:
        io.pump(finished)
    assert [r[0] for r in conn.requests] == [Api.PRODUCE]
    assert conn.closed and io.conn is None and woken(io)
    assert list(io.sender.ready) == batches                  # the written one too: in order
    assert [b.attempts for b in batches] == [1, 0, 0] and not finished


def test_large_batches_go_through_the_arena_and_their_reply_frees_the_slot(io):
    arena = Arena(1 << 20, 2)                                 # a memfd: no broker needed
    io.sender.max_in_flight = 2
    io.conn = conn = Recording(room=10, arena=arena)
    small, large = queue_batches(io, [100, ARENA_MIN_BYTES])
    with io.lock:
        io.pump([])
    (api1, *fields1), (api2, *fields2) = conn.requests
    assert api1 is Api.PRODUCE and bytes(fields1[3]) == bytes(small.data)
    assert api2 is Api.PRODUCE_SHARED and fields2[4] == len(large.data)
    assert arena.free_slots == 1
    io.take_replies(conn, [Response(Api.PRODUCE_SHARED, 2, 0, None, [5, -1])], caller=False)
    assert arena.free_slots == 2 and large.done and large.base_offset == 5
    arena.close()
