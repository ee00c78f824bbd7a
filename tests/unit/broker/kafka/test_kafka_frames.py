"""Kafka request frames (mq/broker/kafka/frames.py): small ones gathered, a large one received
in place in a buffer of its own within the listener's budget, sizes refused before bodies."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.broker.kafka.frames import LARGE_FRAME, FrameBudget, FrameBuffer
from mq.errors import RemoteProtocolError


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def drain(buf: FrameBuffer) -> list[bytes]:
    out = []
    while (f := buf.next_frame()) is not None:
        out.append(bytes(f))
    return out


def receive(buf: FrameBuffer, data: bytes, chunk: int) -> list[bytes]:
    """``data`` as a socket would deliver it in reads of at most ``chunk`` bytes: into the
    large frame's own buffer when there is one, else fed; frames taken after each read."""
    got, pos = [], 0
    while pos < len(data):
        tail = buf.tail()
        if tail is not None:
            n = min(chunk, len(tail), len(data) - pos)
            tail[:n] = data[pos:pos + n]
            tail.release()
            buf.filled(n)
        else:
            n = min(chunk, len(data) - pos)
            buf.feed(data[pos:pos + n])
        pos += n
        got += drain(buf)
    return got


def test_a_large_frame_lands_in_a_buffer_of_its_own_and_is_returned_without_a_copy():
    budget = FrameBudget(10 * LARGE_FRAME)
    buf = FrameBuffer(1 << 24, budget)
    body = bytes(range(256)) * (LARGE_FRAME // 64)
    buf.feed(frame(body)[:1000])
    assert buf.next_frame() is None
    assert budget.held == len(body)                   # promised while it arrives
    tail = buf.tail()
    assert tail is not None and len(tail) == len(body) - 996
    tail[:] = body[996:]
    tail.release()
    buf.filled(len(body) - 996)
    assert buf.tail() is None
    got = buf.next_frame()
    assert got == body and isinstance(got, bytearray)
    assert budget.held == 0 and buf.pending_bytes == 0


@given(st.lists(st.integers(8, 3 * LARGE_FRAME), min_size=1, max_size=6),
       st.sampled_from([1000, 4096, 65536, 300_000]),
       st.sampled_from([0, LARGE_FRAME, 10 * LARGE_FRAME]))
def test_frames_come_out_whole_and_in_order_whatever_the_reads_and_the_budget(sizes, chunk,
                                                                              limit):
    budget = FrameBudget(limit)
    buf = FrameBuffer(1 << 24, budget)
    bodies = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    assert receive(buf, b"".join(frame(b) for b in bodies), chunk) == bodies
    assert budget.held == 0 and buf.pending_bytes == 0


def test_past_the_budget_a_large_frame_is_gathered_as_its_bytes_arrive():
    budget = FrameBudget(LARGE_FRAME)
    first, second = FrameBuffer(1 << 24, budget), FrameBuffer(1 << 24, budget)
    first.feed(struct.pack(">i", LARGE_FRAME))        # claims the whole budget
    assert first.next_frame() is None and first.tail() is not None
    second.feed(struct.pack(">i", 2 * LARGE_FRAME))   # nothing left: no buffer promised
    assert second.next_frame() is None and second.tail() is None
    assert budget.held == LARGE_FRAME
    first.release()                                   # its connection closed
    assert budget.held == 0


@pytest.mark.parametrize("size", [-1, 0, 7, LARGE_FRAME + 1])
def test_a_size_out_of_bounds_raises_before_the_body_and_promises_nothing(size):
    budget = FrameBudget()
    buf = FrameBuffer(LARGE_FRAME, budget)
    buf.feed(struct.pack(">i", size))
    with pytest.raises(RemoteProtocolError, match="socket.request.max.bytes"):
        buf.next_frame()
    assert budget.held == 0


def test_bytes_fed_past_a_large_frame_start_the_next_one():
    buf = FrameBuffer(1 << 24, FrameBudget())
    big, small = b"x" * LARGE_FRAME, b"y" * 10
    data = frame(big) + frame(small)
    buf.feed(data[:100])
    assert buf.next_frame() is None and buf.tail() is not None
    buf.feed(data[100:])              # a TLS read: more than the large frame's rest
    assert drain(buf) == [big, small]


def test_a_large_frame_buffer_is_used_again_only_once_nothing_refers_to_it():
    buf = FrameBuffer(1 << 24, FrameBudget())
    first, second, third = (bytes([i]) * (2 * LARGE_FRAME + i) for i in (1, 2, 3))

    def arrive(body: bytes) -> bytearray:
        buf.feed(frame(body)[:100])
        assert buf.next_frame() is None
        tail = buf.tail()
        n = len(tail)
        tail[:] = body[-n:]
        tail.release()
        buf.filled(n)
        return buf.next_frame()

    held = arrive(first)
    view = memoryview(held)[10:20]             # a request still reading it
    got = arrive(second)
    assert got is not held and held == first and bytes(view) == first[10:20]
    view.release()
    del held
    kept_id = id(got)
    del got                                    # its request is done
    again = arrive(third)
    assert id(again) == kept_id and again == third


def test_a_buffer_larger_than_spare_max_is_not_kept():
    from mq.broker.kafka.frames import SPARE_MAX
    buf = FrameBuffer(1 << 24, FrameBudget(1 << 24))
    big = b"z" * (SPARE_MAX + 1)
    got = receive(buf, frame(big), 1 << 20)
    assert got == [big] and buf._spare is None
