"""The producer's driver (``mq.client.producer_io``) without a broker: what it does with replies
taken off the connection by ``send()`` — the I/O thread's wake-ups — seen through its
wake-up pipe, with a stand-in connection that is never written to."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mq.client.batch_accumulator import BatchAccumulator
from mq.client.idempotence import ProducerIdentity
from mq.client.producer_io import ProducerIO
from mq.client.producer_metadata import ProducerMetadata
from mq.client.sender import Sender
from mq.errors import KafkaStorageError
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
