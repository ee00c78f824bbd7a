"""Hypothesis over the Kafka codec: every api key the broker serves, every served version,
request and response.

- A body drawn from the schema (``kafka_bodies``) encodes and decodes to itself.
- Random bytes after a valid header, and valid frames cut, grown or with bytes changed, either
  decode or raise ``KafkaDecodeError``: never another exception (the listener turns that one
  into a closed connection; any other would reach the broker's loop).
- A count or length larger than the bytes left is refused before anything is allocated for it.
"""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mq.broker.kafka.versions import SERVED
from mq.protocol.kafka import codec
from mq.protocol.kafka.codec import KafkaDecodeError
from mq.protocol.kafka.schemas import APIS
from tests.property.kafka_bodies import body, expected, flexible, present

CASES = [(key, version) for key, (lo, hi) in sorted(SERVED.items())
         for version in range(lo, hi + 1)]
IDS = [f"{APIS[k][0][0].removesuffix('Request')}-v{v}" for k, v in CASES]


def _response_frame(key: int, version: int, correlation_id: int, drawn: dict) -> bytes:
    return b"".join(bytes(p) for p in codec.encode_response(key, version, correlation_id,
                                                            drawn))


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@settings(max_examples=25)
@given(data=st.data(), correlation_id=st.integers(-(1 << 31), (1 << 31) - 1),
       client_id=st.none() | st.text(max_size=10))
def test_request_round_trip(key, version, data, correlation_id, client_id):
    message = APIS[key][0]
    drawn = data.draw(body(message, version))
    frame = codec.encode_request(key, version, correlation_id, drawn, client_id=client_id)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    header, decoded = codec.decode_request(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == \
        (key, version, correlation_id, client_id)
    flex = flexible(message, version)
    assert present(decoded, message[3], version, flex) == \
        expected(drawn, message[3], version, flex)


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@settings(max_examples=25)
@given(data=st.data(), correlation_id=st.integers(-(1 << 31), (1 << 31) - 1))
def test_response_round_trip(key, version, data, correlation_id):
    message = APIS[key][1]
    drawn = data.draw(body(message, version))
    frame = _response_frame(key, version, correlation_id, drawn)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    got_id, decoded = codec.decode_response(key, version, frame[4:])
    assert got_id == correlation_id
    flex = flexible(message, version)
    assert present(decoded, message[3], version, flex) == \
        expected(drawn, message[3], version, flex)


def _header(key: int, version: int) -> bytes:
    """A request header alone: an empty-bodied request's frame less its body."""
    frame = codec.encode_request(key, version, 1, {}, client_id="fuzz")[4:]
    return frame[:codec.decode_request(frame)[0].header_size]


def _decode_total(frame: bytes) -> None:
    """Decode a request frame: it decodes, or raises KafkaDecodeError — nothing else."""
    try:
        codec.decode_request(frame)
    except KafkaDecodeError:
        pass


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@settings(max_examples=40)
@given(tail=st.binary(max_size=200))
def test_random_request_bodies_only_raise_decode_errors(key, version, tail):
    _decode_total(_header(key, version) + tail)


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@settings(max_examples=40)
@given(tail=st.binary(max_size=200))
def test_random_response_bodies_only_raise_decode_errors(key, version, tail):
    head = struct.pack(">i", 7) + (b"\x00" if codec.header_versions(key, version)[1] else b"")
    try:
        codec.decode_response(key, version, head + tail)
    except KafkaDecodeError:
        pass


@settings(max_examples=300)
@given(frame=st.binary(max_size=300))
def test_random_frames_only_raise_decode_errors(frame):
    _decode_total(frame)


def _mutate(data: st.DataObject, frame: bytes) -> bytes:
    """One of: cut, bytes changed, bytes inserted, a length/count byte made huge."""
    buf = bytearray(frame)
    kind = data.draw(st.sampled_from(["cut", "flip", "insert", "delete", "ff"]))
    at = data.draw(st.integers(0, max(0, len(buf) - 1)))
    if kind == "cut":
        del buf[at:]
    elif kind == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, max(0, len(buf) - 1)))
            if buf:
                buf[i] ^= data.draw(st.integers(1, 255))
    elif kind == "insert":
        buf[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    elif kind == "delete":
        del buf[at:at + data.draw(st.integers(1, 8))]
    else:
        buf[at:at] = b"\xff\xff\xff\x7f"
    return bytes(buf)


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@settings(max_examples=30)
@given(data=st.data())
def test_mutated_requests_only_raise_decode_errors(key, version, data):
    drawn = data.draw(body(APIS[key][0], version))
    frame = codec.encode_request(key, version, 3, drawn)[4:]
    mutated = _mutate(data, frame)
    if mutated[:4] != frame[:4]:              # keep the api: the fuzz is about its body
        mutated = frame[:4] + mutated[4:]
    _decode_total(mutated)


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@settings(max_examples=30)
@given(data=st.data())
def test_mutated_responses_only_raise_decode_errors(key, version, data):
    drawn = data.draw(body(APIS[key][1], version))
    frame = _response_frame(key, version, 3, drawn)[4:]
    try:
        codec.decode_response(key, version, _mutate(data, frame))
    except KafkaDecodeError:
        pass


# --- the count and length guards --------------------------------------------------------------
def _peak_decode(frame: bytes) -> int:
    tracemalloc.start()
    try:
        _decode_total(frame)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("version", "count"), [(1, b"\x7f\xff\xff\xff"),
                                              (9, b"\xff\xff\xff\xff\x07")])
def test_a_huge_count_allocates_nothing_for_it(version, count):
    """Metadata's topics array claiming 2**31 - 1 items in a few bytes (v1: int32 count; v9:
    uvarint count + 1): refused before a list of that size exists."""
    frame = _header(3, version) + count + b"\x00" * 16
    with pytest.raises(KafkaDecodeError, match="items in"):
        codec.decode_request(frame)
    assert _peak_decode(frame) < 64 * 1024


def test_one_message_holds_at_most_max_items_array_items():
    """Metadata v1 topics with empty names, 2 bytes each: 2**20 decode; one more (spread
    over two arrays of a nested message would count the same) is refused."""
    head = _header(3, 1)
    ok = head + struct.pack(">i", codec.MAX_ITEMS) + b"\x00\x00" * codec.MAX_ITEMS
    assert len(codec.decode_request(ok)[1]["topics"]) == codec.MAX_ITEMS
    over = head + struct.pack(">i", codec.MAX_ITEMS + 1) + b"\x00\x00" * (codec.MAX_ITEMS + 1)
    with pytest.raises(KafkaDecodeError, match="array items in one message"):
        codec.decode_request(over)


def test_items_are_counted_across_arrays():
    """ListOffsets v1: topics, each with a partitions array; the items of both count."""
    per_topic = 1000
    topic = b"\x00\x01t" + struct.pack(">i", per_topic) + b"\x00" * 12 * per_topic
    topics = codec.MAX_ITEMS // (per_topic + 1) + 1
    frame = _header(2, 1) + struct.pack(">i", -1) + struct.pack(">i", topics) + topic * topics
    with pytest.raises(KafkaDecodeError, match="array items in one message"):
        codec.decode_request(frame)


@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@settings(max_examples=10)
@given(data=st.data())
def test_decoding_allocates_in_proportion_to_the_frame(key, version, data):
    """Whatever a mutated frame claims, decoding it takes memory in proportion to its own
    size (a dict per struct item of at least 2 bytes), never to a count or length in it."""
    drawn = data.draw(body(APIS[key][0], version))
    frame = codec.encode_request(key, version, 3, drawn)[4:]
    mutated = frame[:4] + _mutate(data, frame)[4:]
    codec.decode_request(frame)            # warm the codec's reader cache first
    assert _peak_decode(mutated) < 64 * 1024 + 1000 * len(mutated)
