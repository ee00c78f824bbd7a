"""The Kafka listener's pure parts: frames, response order, exchanges, leader epochs."""

from __future__ import annotations

import socket

import pytest

from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.frames import FrameBuffer
from mq.broker.kafka.data import epoch_end_offset
from mq.broker.kafka.exchange import Call, Calls, CloseConnection, Exchange, Park
from mq.errors import RemoteProtocolError
from mq.protocol.kafka.codec import decode_response
from mq.protocol.messages import Api, response


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def whole_frames(buf: FrameBuffer) -> list[bytearray]:
    frames = []
    while (f := buf.next_frame()) is not None:
        frames.append(f)
    return frames


def test_frames_split_across_reads_come_out_whole():
    buf = FrameBuffer(1024)
    data = frame(b"A" * 10) + frame(b"B" * 20)
    got = []
    for i in range(len(data)):
        buf.feed(data[i:i + 1])
        got += [bytes(f) for f in whole_frames(buf)]
    assert got == [b"A" * 10, b"B" * 20]
    assert buf.pending_bytes == 0


@pytest.mark.parametrize("size", [-1, 0, 7, 1025])
def test_a_size_out_of_bounds_is_refused_before_the_body(size):
    buf = FrameBuffer(1024)
    buf.feed(size.to_bytes(4, "big", signed=True))
    with pytest.raises(RemoteProtocolError, match="socket.request.max.bytes"):
        whole_frames(buf)


@pytest.fixture
def conn():
    a, b = socket.socketpair()
    c = KafkaConn(a, 7, 1 << 20, "test")
    c.local_address = ("127.0.0.1", 9092)
    yield c
    a.close()
    b.close()


def _output(conn) -> list[int]:
    """Correlation ids of the encoded responses, in order."""
    out = b"".join(bytes(p) for p in conn.parts)
    ids = []
    while out:
        size = int.from_bytes(out[:4], "big")
        ids.append(int.from_bytes(out[4:8], "big"))
        out = out[4 + size:]
    return ids


def test_responses_leave_in_request_order(conn):
    first = conn.open_slot(1, 3, 0)
    second = conn.open_slot(2, 3, 0)
    third = conn.open_slot(3, 0, 3)
    conn.finish(second, {"brokers": [], "topics": []})
    assert _output(conn) == []                  # held behind the first
    conn.finish(third, None)                    # acks=0: no response at all
    conn.finish(first, {"brokers": [], "topics": []})
    assert _output(conn) == [1, 2]
    assert not conn.slots


class FakeRunner:
    def __init__(self, replies):
        self.replies = replies        # api -> reply fields, or None (deferred)
        self.requests = []
        self.parked = []
        self.closed = None

    def dispatch(self, conn, req):
        self.requests.append(req)
        fields = self.replies.get(req.api)
        return None if fields is None else response(req.api, req.request_id, 0, None, *fields)

    def park(self, exchange, park):
        self.parked.append((exchange, park))

    def failed(self, conn, what):
        self.closed = what


def _metadata_body():
    return {"brokers": [], "topics": []}


def test_an_exchange_waits_for_deferred_replies_then_answers(conn):
    runner = FakeRunner({Api.METADATA: [{}]})        # Produce deferred, Metadata at once
    seen = []

    def handler():
        replies = yield Calls([Call(Api.PRODUCE, {"topic": "t"}), Call(Api.METADATA, {})])
        seen.append(replies)
        return _metadata_body()
    slot = conn.open_slot(5, 3, 0)
    Exchange(runner, conn, slot, handler()).start()
    assert not slot.done and len(conn.awaiting) == 1
    rid = next(iter(conn.awaiting))
    conn.enqueue(response(Api.PRODUCE, rid, 0, None, 42, -1, 0))
    assert slot.done and _output(conn) == [5]
    assert seen[0][0]["first_offset"] == 42 and seen[0][1].error_code == 0


def test_a_one_way_call_is_not_waited_for(conn):
    runner = FakeRunner({})

    def handler():
        replies = yield Calls([Call(Api.PRODUCE, {}, one_way=True)])
        assert replies == [None]
        return None
    slot = conn.open_slot(1, 0, 3)
    Exchange(runner, conn, slot, handler()).start()
    assert slot.done and slot.parts is None and not conn.awaiting


def test_a_parked_exchange_resumes_on_wake(conn):
    runner = FakeRunner({})
    rounds = []

    def handler():
        rounds.append(1)
        if len(rounds) == 1:
            yield Park(0.0, [("t", 0)])
        return _metadata_body()
    slot = conn.open_slot(9, 3, 0)
    ex = Exchange(runner, conn, slot, handler())
    ex.start()
    assert ex.parked and not slot.done
    ex.wake()
    assert slot.done and _output(conn) == [9]


def test_close_connection_closes_without_a_response(conn):
    runner = FakeRunner({})

    def handler():
        yield from ()
        return CloseConnection("acks=0 failed")
    slot = conn.open_slot(1, 0, 3)
    Exchange(runner, conn, slot, handler()).start()
    assert runner.closed == "acks=0 failed" and not conn.parts


def test_metadata_response_encodes_and_decodes(conn):
    slot = conn.open_slot(11, 3, 12)
    conn.finish(slot, {"brokers": [{"node_id": 0, "host": "127.0.0.1", "port": 9092}],
                       "cluster_id": "c", "controller_id": 0, "topics": []})
    data = b"".join(bytes(p) for p in conn.parts)
    cid, body = decode_response(3, 12, data[4:])
    assert cid == 11 and body["brokers"][0]["port"] == 9092


@pytest.mark.parametrize("epoch,expected", [
    (-1, (-1, -1)), (0, (-1, -1)), (1, (1, 10)), (2, (1, 10)), (3, (3, 25)), (4, (3, 25)),
    (5, (5, 40)), (9, (5, 40))])
def test_offset_for_leader_epoch_end_offsets(epoch, expected):
    entries = [(1, 0), (3, 10), (5, 25)]
    assert epoch_end_offset(entries, epoch, 40) == expected


def test_a_reply_sent_from_inside_the_call_is_not_lost(conn):
    """A component may answer through Connections.send before its handler returns None
    (an offset commit with nothing left to flush)."""
    class Eager(FakeRunner):
        def dispatch(self, conn, req):
            conn.enqueue(response(req.api, req.request_id, 5, "early"))
            return None
    seen = []

    def handler():
        seen.append((yield Calls([Call(Api.OFFSET_COMMIT, {}), Call(Api.OFFSET_COMMIT, {})])))
        return _metadata_body()
    slot = conn.open_slot(3, 3, 0)
    Exchange(Eager({}), conn, slot, handler()).start()
    assert slot.done and [r.error_message for r in seen[0]] == ["early", "early"]
    assert not conn.awaiting


def test_a_failing_handler_closes_only_its_connection(conn):
    runner = FakeRunner({Api.METADATA: [{}]})

    def handler():
        yield Calls([Call(Api.METADATA, {})])
        return {"brokers": [{"node_id": "zero"}]}     # a bug: the schema cannot encode it
    slot = conn.open_slot(1, 3, 0)
    Exchange(runner, conn, slot, handler()).start()
    assert runner.closed == "a request failed"
