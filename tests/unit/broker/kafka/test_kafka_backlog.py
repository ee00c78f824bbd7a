"""The Kafka listener's limits on one peer (mq/broker/kafka/listener.py, conn.py): a handler
that raises or a response that cannot be encoded closes that connection only; small records
regions are read into the response and keep no descriptor; frames are taken one at a time;
accepts pause when the broker is out of descriptors."""

from __future__ import annotations

import errno
import logging
import os
import selectors
import struct
import time

import pytest

from mq.broker.kafka import conn as kafka_conn
from mq.broker.kafka.conn import INLINE_BYTES
from mq.broker.kafka.frames import FrameBuffer
from mq.errors import RemoteProtocolError
from mq.protocol.kafka import codec
from mq.protocol.kafka.codec import FileRegion
from tests.unit.broker.kafka.kafka_harness import ListenerPair

METADATA, FETCH = 3, 1


def _metadata(correlation_id: int) -> bytes:
    return codec.encode_request(METADATA, 12, correlation_id, {"topics": None})


def test_a_handler_that_raises_closes_its_connection_only(caplog):
    def broken(conn, version, body):
        raise KeyError("a bug")
    pair = ListenerPair({METADATA: broken})
    try:
        with caplog.at_level(logging.ERROR, logger="mq.broker"):
            pair.send(_metadata(1))                  # raised out of read() before the fix
        assert pair.closed == [pair.conn]
        assert "KeyError: 'a bug'" in caplog.text
    finally:
        pair.close()


def test_a_response_that_cannot_be_encoded_closes_its_connection_only(caplog):
    pair = ListenerPair({METADATA: lambda conn, version, body: {"throttle_time_ms": "x"}})
    try:
        with caplog.at_level(logging.ERROR, logger="mq.broker"):
            pair.send(_metadata(1))
        assert pair.closed == [pair.conn]
        assert "MetadataResponse v12: required argument is not an integer" in caplog.text
        assert "a request failed" in caplog.text
    finally:
        pair.close()


def test_frames_come_one_at_a_time_and_bad_sizes_raise():
    frames = FrameBuffer(100)
    frames.feed(struct.pack(">i", 8) + b"a" * 8 + struct.pack(">i", 9) + b"b" * 4)
    assert frames.next_frame() == b"a" * 8
    assert frames.next_frame() is None            # half of the second
    frames.feed(b"b" * 5 + struct.pack(">i", 101))
    assert frames.next_frame() == b"b" * 9
    with pytest.raises(RemoteProtocolError, match="101"):
        frames.next_frame()


def _fetch_response(region: FileRegion) -> dict:
    return {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "high_watermark": 1, "records": region}]}]}


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_small_region_is_read_into_the_response_and_its_descriptor_closed(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"x" * 10 + b"R" * 100 + b"L" * (INLINE_BYTES + 1))
    pair = ListenerPair()
    try:
        conn = pair.conn
        small = FileRegion(os.open(path, os.O_RDONLY), 10, 100)
        large = FileRegion(os.open(path, os.O_RDONLY), 110, INLINE_BYTES + 1)
        conn.finish(conn.open_slot(1, FETCH, 12), _fetch_response(small))
        conn.finish(conn.open_slot(2, FETCH, 12), _fetch_response(large))
        assert not _fd_open(small.fd) and _fd_open(large.fd)
        assert conn.regions == 1 and len(conn.parts) == 4    # bytes; bytes, region, bytes
        pair.listener.write(conn)
        first = codec.decode_response(FETCH, 12, pair.response())[1]
        second = codec.decode_response(FETCH, 12, pair.response())[1]
        assert bytes(first["responses"][0]["partitions"][0]["records"]) == b"R" * 100
        assert bytes(second["responses"][0]["partitions"][0]["records"]) == \
            b"L" * (INLINE_BYTES + 1)
        assert not _fd_open(large.fd) and conn.regions == 0 and conn.pending_out == 0
    finally:
        pair.close()


def test_a_region_past_the_end_of_its_file_fails_the_response(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"R" * 10)
    pair = ListenerPair()
    try:
        region = FileRegion(os.open(path, os.O_RDONLY), 0, 100)
        with pytest.raises(OSError, match="90 bytes early"):
            pair.conn.finish(pair.conn.open_slot(1, FETCH, 12), _fetch_response(region))
        assert not _fd_open(region.fd)
    finally:
        pair.close()


def test_the_regions_of_a_closed_connection_are_closed(tmp_path):
    path = tmp_path / "segment"
    path.write_bytes(b"L" * (2 * INLINE_BYTES))
    pair = ListenerPair()
    try:
        conn = pair.conn
        parked = conn.open_slot(1, FETCH, 12)          # holds back the one behind it
        behind = FileRegion(os.open(path, os.O_RDONLY), 0, 2 * INLINE_BYTES)
        conn.finish(conn.open_slot(2, FETCH, 12), _fetch_response(behind))
        assert conn.regions == 1 and not conn.parts
        pair._close(conn)
        assert not _fd_open(behind.fd)
        late = FileRegion(os.open(path, os.O_RDONLY), 0, 2 * INLINE_BYTES)
        conn.finish(parked, _fetch_response(late))      # finishing after the close
        assert not _fd_open(late.fd)
    finally:
        pair.close()


def test_a_backlogged_peer_is_not_read_until_it_drains(monkeypatch):
    monkeypatch.setattr(kafka_conn, "MAX_IN_FLIGHT", 3)
    pair = ListenerPair()
    try:
        conn = pair.conn
        pair.send(b"".join(codec.encode_request(18, 3, i, {}) for i in range(5)), write=False)
        # three answered, none sent yet: the other two wait, and so does the socket
        assert conn.backlogged and len(conn.parts) == 3 and conn.frames.pending_bytes > 0
        assert pair.sel.get_key(conn.sock).events == selectors.EVENT_WRITE
        pair.listener.write(conn)          # the three go, the other two are served
        assert conn.frames.pending_bytes == 0 and len(conn.parts) == 2
        pair.listener.write(conn)
        ids = [codec.decode_response(18, 3, pair.response())[0] for _ in range(5)]
        assert ids == [0, 1, 2, 3, 4]
        assert pair.sel.get_key(conn.sock).events == selectors.EVENT_READ
    finally:
        pair.close()


class _Exhausted:
    def accept(self):
        raise OSError(errno.EMFILE, "Too many open files")


def test_accepts_pause_when_the_broker_is_out_of_descriptors(caplog):
    pair = ListenerPair()
    try:
        listener = pair.listener
        (sock,) = listener._sockets
        key = pair.sel.get_key(sock)
        with caplog.at_level(logging.WARNING, logger="mq.broker"):
            listener.accept(key._replace(fileobj=_Exhausted()))
        assert "pausing accepts" in caplog.text
        with pytest.raises(KeyError):
            pair.sel.get_key(sock)                   # not watched: no busy loop on it
        now = time.monotonic()
        assert 0 < listener.deadline_s(now) <= 0.1
        listener.timers(now + 0.2)
        assert pair.sel.get_key(sock).data is listener
    finally:
        pair.close()
