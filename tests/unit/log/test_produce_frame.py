"""``_crecords.produce_frame``: the Produce request of one record that ``send()`` writes with
``linger_ms=0``, in one C call, held to the Python path that builds the same request: the
producer's ``BatchBuilder`` for the batch and ``encode_tail_frame(request(...))`` for the
frame around it, byte for byte, over any record, topic name and header field values msgpack
and Kafka take.
"""

from __future__ import annotations

import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mq.log.builder import BatchBuilder
from mq.log.layout import TRANSACTIONAL_MASK
from mq.protocol.frames import FrameReader, encode_tail_frame
from mq.protocol.messages import Api, request

_crecords = pytest.importorskip("mq.log._crecords")
produce_frame = _crecords.produce_frame

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
# msgpack's encodings change at these bounds; Hypothesis finds them only by luck.
EDGES = st.sampled_from([0, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, -1,
                         -32, -33, -128, -129, -32768, -32769, -(1 << 31), -(1 << 31) - 1])
FIELD = st.one_of(EDGES, INT64)
BLOB = st.one_of(st.none(), st.binary(max_size=300))
HEADERS = st.lists(st.tuples(st.text(max_size=20), BLOB), max_size=4)
TOPIC = st.one_of(st.text(min_size=1, max_size=40),
                  st.integers(30, 70000).map(lambda n: "t" * n))


def reference(api, rid, topic, partition, acks, ts, key, value, headers, pid, epoch, seq,
              attrs) -> tuple[bytes, bytes]:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                           is_transactional=bool(attrs & TRANSACTIONAL_MASK))
    builder.append(ts, key, value, headers)
    batch = builder.build()
    head, tail = encode_tail_frame(request(api, rid, topic, partition, acks, batch))
    return head, bytes(tail)


@settings(max_examples=300, deadline=None)
@given(rid=st.integers(0, (1 << 63) - 1) | EDGES.filter(lambda v: v >= 0), topic=TOPIC,
       partition=FIELD, acks=st.sampled_from([-1, 0, 1]) | FIELD,
       ts=st.integers(-1, (1 << 62)), key=BLOB, value=BLOB, headers=HEADERS,
       pid=st.integers(-1, (1 << 63) - 1), epoch=st.integers(-1, (1 << 15) - 1),
       seq=st.integers(-1, (1 << 31) - 1), transactional=st.booleans())
def test_the_same_bytes_as_the_python_path(rid, topic, partition, acks, ts, key, value,
                                           headers, pid, epoch, seq, transactional):
    attrs = TRANSACTIONAL_MASK if transactional else 0
    args = (int(Api.PRODUCE), rid, topic, partition, acks, ts, key, value, headers, pid,
            epoch, seq, attrs)
    head, batch, stamped = produce_frame(*args)
    assert type(batch) is bytearray and stamped == ts
    assert (head, bytes(batch)) == reference(*args)


def test_a_frame_reader_takes_it_back():
    head, batch, _ = produce_frame(int(Api.PRODUCE), 42, "orders", 2, 1, 1_700_000_000_000,
                                   b"k", b"v" * 100, (), -1, -1, -1, 0)
    reader = FrameReader()
    reader.feed(head + batch)
    messages = reader.messages()
    message = next(messages)                    # its tail is valid until the next step
    assert message[:5] == [int(Api.PRODUCE), 42, "orders", 2, 1]
    assert bytes(message[5]) == bytes(batch)


def test_no_timestamp_is_now():
    before = int(time.time() * 1000)
    _, batch, ts = produce_frame(int(Api.PRODUCE), 1, "t", 0, 1, None, None, b"v", None, -1,
                                 -1, -1, 0)
    assert before <= ts <= int(time.time() * 1000)
    assert (bytes(batch), ts) == (bytes(_batch_of(ts)), ts)


def _batch_of(ts: int) -> bytearray:
    builder = BatchBuilder()
    builder.append(ts, None, b"v", ())
    return builder.build()


@pytest.mark.parametrize("args, error", [
    ((1, 2, "t"), TypeError),
    ((int(Api.PRODUCE), 1, b"t", 0, 1, None, None, b"v", None, -1, -1, -1, 0), TypeError),
    ((int(Api.PRODUCE), 1, "t", 0, 1, None, None, "v", None, -1, -1, -1, 0), TypeError),
    ((int(Api.PRODUCE), 1, "t", 0, 1, None, None, b"v", [("k", 3)], -1, -1, -1, 0), TypeError),
    ((int(Api.PRODUCE), 1 << 64, "t", 0, 1, None, None, b"v", None, -1, -1, -1, 0),
     OverflowError),
    ((int(Api.PRODUCE), 1, "\udc80", 0, 1, None, None, b"v", None, -1, -1, -1, 0),
     UnicodeEncodeError),
])
def test_bad_arguments_raise(args, error):
    with pytest.raises(error):
        produce_frame(*args)


def test_msgpack_reads_the_header_as_packb_wrote_it():
    head, _, _ = produce_frame(int(Api.PRODUCE), 1 << 40, "ü" * 40, -1 << 40, -1, 0, None,
                               None, None, -1, -1, -1, 0)
    assert msgpack.unpackb(head[8:]) == [int(Api.PRODUCE), 1 << 40, "ü" * 40, -1 << 40, -1]


# --- produce_send: the same request, written in the same call ---------------------------------

def _pair(sndbuf: int | None = None):
    import socket
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if sndbuf is not None:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    return a, b


def _received(sock, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        got += sock.recv(n - len(got))
    return bytes(got)


@settings(max_examples=50, deadline=None)
@given(key=BLOB, value=BLOB, headers=HEADERS, topic=st.text(min_size=1, max_size=40))
def test_produce_send_writes_produce_frames_bytes(key, value, headers, topic):
    a, b = _pair()
    with a, b:
        args = (int(Api.PRODUCE), 9, topic, 0, 1, 1_700_000_000_000, key, value, headers, -1,
                -1, -1, 0)
        head, batch, ts, sent = _crecords.produce_send(a.fileno(), 1 << 20, *args)
        assert (head, batch, ts) == produce_frame(*args)
        assert sent == len(head) + len(batch)
        assert _received(b, sent) == head + batch


def test_produce_send_declines_a_batch_over_its_limit_and_writes_nothing():
    a, b = _pair()
    with a, b:
        args = (int(Api.PRODUCE), 1, "t", 0, 1, None, None, b"v" * 100, (), -1, -1, -1, 0)
        size = len(produce_frame(*args)[1])
        assert _crecords.produce_send(a.fileno(), size - 1, *args) is None
        b.setblocking(False)
        with pytest.raises(BlockingIOError):
            b.recv(1)
        assert _crecords.produce_send(a.fileno(), size, *args)[3] > 0


def test_produce_send_reports_a_short_write_and_a_failed_one():
    """It never blocks: a socket that takes part of the frame reports what it took (the
    caller writes the rest, ``Connection.send_built``); a full one 0; a broken one -errno."""
    import errno
    a, b = _pair(sndbuf=4096)
    with a, b:
        args = (int(Api.PRODUCE), 1, "t", 0, 1, None, None, b"v" * (1 << 20), (), -1, -1, -1, 0)
        head, batch, _, sent = _crecords.produce_send(a.fileno(), 1 << 30, *args)
        assert 0 < sent < len(head) + len(batch)
        assert _received(b, sent) == (head + batch)[:sent]
        while _crecords.produce_send(a.fileno(), 1 << 30, *args)[3] > 0:
            pass                                   # fill the socket's buffers
        assert _crecords.produce_send(a.fileno(), 1 << 30, *args)[3] == 0
    a, b = _pair()
    b.close()
    with a:
        assert _crecords.produce_send(a.fileno(), 1 << 30, *args)[3] == -errno.EPIPE
