"""FrameReader and the two frame kinds: whatever the read sizes, the same messages come out;
tails are views of the receive buffer that go stale loudly and never change under a kept one;
bad bytes raise only RemoteProtocolError."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mq.errors import LocalProtocolError, RemoteProtocolError
from mq.protocol.frames import TAIL_FLAG, FrameReader, encode_frame, encode_tail_frame

fields = st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.text(max_size=10),
                            st.binary(max_size=40)), max_size=4)
# Sizes around the reader's thresholds: 16 KiB (view vs copy decode, the least read) and
# 32 KiB (the first buffer); a few large ones make it grow.
tails = st.one_of(st.binary(max_size=100),
                  st.integers(0, 200_000).map(lambda n: bytes(range(256)) * (n // 256)))
messages = st.lists(st.tuples(st.integers(0, 2000), fields, st.none() | tails), max_size=12)
# Reads of a stream, at most: a megabyte stream read a byte at a time is a million reads and
# tells no more than reads of a few hundred bytes at arbitrary places.
_MAX_READS = 4000


def build(specs) -> tuple[bytes, list[list]]:
    """The stream for ``specs`` (api, fields, tail or None) and the messages it decodes to."""
    stream, expected = b"", []
    for i, (api, body, tail) in enumerate(specs):
        message = [api, i, *body]
        if tail is None:
            stream += encode_frame(message)
        else:
            message.append(tail)
            head, view = encode_tail_frame(message)
            stream += head + bytes(view)
        expected.append(message)
    return stream, expected


def plain(message: list) -> list:
    return [bytes(v) if isinstance(v, memoryview) else v for v in message]


def read_all(reader: FrameReader, stream: bytes, cuts: list[int], trim: bool = False
             ) -> list[list]:
    """Receive ``stream`` through get_buffer/buffer_updated, at most ``cuts[i]`` bytes a read
    (and ``trim`` after each, as the broker does now and then)."""
    out, pos, i = [], 0, 0
    least = len(stream) // _MAX_READS + 1
    while pos < len(stream):
        with reader.get_buffer() as view:
            assert len(view) > 0
            n = min(len(view), max(cuts[i % len(cuts)], least), len(stream) - pos)
            view[:n] = stream[pos:pos + n]
        reader.buffer_updated(n)
        pos, i = pos + n, i + 1
        out += [plain(m) for m in reader.messages()]
        if trim:
            reader.trim()
    return out


@settings(max_examples=60, deadline=None)
@given(specs=messages, cuts=st.lists(st.integers(1, 300_000), min_size=1, max_size=20))
def test_recvmsg_from_a_socket_yields_the_same_messages(specs, cuts):
    """The broker's read (``recvmsg``, with its short cut for a reader that parsed all it
    had) over a real socket, the stream sent in pieces."""
    stream, expected = build(specs)
    reader, out = FrameReader(), []
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(30)
        pos, i = 0, 0
        while pos < len(stream):
            # At most what the socket holds: this one thread both sends and receives.
            piece = stream[pos:pos + min(max(cuts[i % len(cuts)], 1 << 10), 1 << 16)]
            a.sendall(piece)
            got = 0
            while got < len(piece):
                n, ancillary, _ = reader.recvmsg(b, 0)
                assert n > 0 and ancillary == []
                got += n
                out += [plain(m) for m in reader.messages()]
            pos, i = pos + len(piece), i + 1
    assert out == expected


def test_recvmsg_never_writes_over_a_view_a_handler_kept():
    """A view of the buffer kept past its message (a handler's) makes the next read go to a
    fresh buffer, short cut or not."""
    reader = FrameReader()
    a, b = socket.socketpair()
    with a, b:
        for i in range(3):
            head, tail = encode_tail_frame([0, i, bytes([65 + i]) * 100])
            a.sendall(head + bytes(tail))
        reader.recvmsg(b, 0)
        kept = [memoryview(message[-1]) for message in reader.messages()]   # outlive them
        head, tail = encode_tail_frame([0, 9, b"z" * 100])
        a.sendall(head + bytes(tail))
        reader.recvmsg(b, 0)
        assert [bytes(v) for v in kept] == [b"A" * 100, b"B" * 100, b"C" * 100]
        assert [plain(m) for m in reader.messages()] == [[0, 9, b"z" * 100]]


@settings(max_examples=150, deadline=None)
@given(specs=messages, cuts=st.lists(st.integers(1, 300_000), min_size=1, max_size=20))
def test_split_stream_yields_the_same_messages(specs, cuts):
    stream, expected = build(specs)
    assert read_all(FrameReader(), stream, cuts) == expected
    assert read_all(FrameReader(), stream * 2, cuts) == expected * 2
    assert read_all(FrameReader(), stream, cuts, trim=True) == expected
    fed, reader = [], FrameReader()
    step = max(cuts[0], len(stream) // _MAX_READS + 1)
    for cut in range(0, len(stream), step):
        reader.feed(stream[cut:cut + step])
        fed += [plain(m) for m in reader]
    assert fed == expected
    assert reader.buffered == 0


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(max_size=400), tail_flag=st.booleans())
def test_garbage_raises_only_remote_protocol_error(garbage, tail_flag):
    if tail_flag and len(garbage) >= 4:
        garbage = bytes([garbage[0] | 0x80]) + garbage[1:]
    reader = FrameReader(max_frame_bytes=1 << 20)
    try:
        reader.feed(garbage)
        for message in reader.messages():
            assert isinstance(message, list)
    except RemoteProtocolError:
        with pytest.raises(RemoteProtocolError):
            list(reader.messages())


@pytest.mark.parametrize("frame", [
    struct.pack(">II", TAIL_FLAG | 4, 0),                  # no room for any header
    struct.pack(">II", TAIL_FLAG | 10, 7) + b"\x92\x00\x01" + b"xxx",   # header past the end
    struct.pack(">I", TAIL_FLAG | 3) + b"abc",            # shorter than its header length
    struct.pack(">I", TAIL_FLAG) + b"",                   # zero length
    struct.pack(">I", TAIL_FLAG | (1 << 21)),             # over the limit
])
def test_bad_tail_frames_break_the_reader(frame):
    reader = FrameReader(max_frame_bytes=1 << 20)
    reader.feed(frame)
    with pytest.raises(RemoteProtocolError):
        list(reader.messages())
    with pytest.raises(RemoteProtocolError):
        list(reader.messages())


def test_a_tail_is_a_writable_view_released_at_the_next_step():
    head, tail = encode_tail_frame([0, 1, "t", b"batch bytes"])
    reader = FrameReader()
    reader.feed(head + bytes(tail) + encode_frame([3, 2, None]))
    it = reader.messages()
    first = next(it)
    assert first[:3] == [0, 1, "t"] and first[3] == b"batch bytes"
    first[3][0:5] = b"BATCH"                             # stamped in place, as the broker does
    assert bytes(first[3]) == b"BATCH bytes"
    assert next(it) == [3, 2, None]
    with pytest.raises(ValueError):
        bytes(first[3])                                  # released: a kept tail fails loudly


def test_a_kept_slice_of_a_tail_never_changes():
    reader = FrameReader()
    head, tail = encode_tail_frame([0, 1, b"A" * 20_000])
    reader.feed(head + bytes(tail))
    it = reader.messages()
    kept = next(it)[2][:]                                # a slice outlives the release
    assert list(it) == []
    for i in range(40):                                  # enough to wrap and grow the buffer
        head, tail = encode_tail_frame([0, i, bytes([i]) * (1000 * i)])
        reader.feed(head + bytes(tail) + head[:5])       # leave a partial frame to move
        assert [plain(m) for m in reader] == [[0, i, bytes([i]) * (1000 * i)]]
        reader.feed(head[5:] + bytes(tail))
        assert [plain(m) for m in reader] == [[0, i, bytes([i]) * (1000 * i)]]
    assert bytes(kept) == b"A" * 20_000


def test_a_large_frame_lands_in_place_in_one_read():
    head, tail = encode_tail_frame([0, 1, b"x" * (3 << 20)])
    frame = head + bytes(tail)
    reader = FrameReader()
    with reader.get_buffer() as view:
        view[:8] = frame[:8]
    reader.buffer_updated(8)
    assert list(reader.messages()) == []
    with reader.get_buffer() as view:
        assert len(view) == len(frame) - 8               # exactly the rest of the frame
        view[:] = frame[8:]
    reader.buffer_updated(len(frame) - 8)
    it = reader.messages()
    assert len(next(it)[2]) == 3 << 20


def test_a_tail_must_be_bytes_like():
    with pytest.raises(LocalProtocolError):
        encode_tail_frame([0, 1, "not bytes"])


def test_tail_frames_count_against_the_limit():
    with pytest.raises(LocalProtocolError):
        encode_tail_frame([0, 1, b"x" * 1000], max_frame_bytes=1000)
    head, tail = encode_tail_frame([0, 1, b"x" * 1000], max_frame_bytes=1100)
    reader = FrameReader(max_frame_bytes=1000)
    reader.feed(head)
    with pytest.raises(RemoteProtocolError):
        list(reader.messages())


@pytest.mark.parametrize("message, wide", [
    ([19, 1, "t", 10 ** 23, {}], 10 ** 23),
    ([8, 1, "g", "", -1, [["t", 0, 1 << 64, -1, ""]]], 1 << 64),
    ([8, 1, {"k": -(1 << 63) - 1}], -(1 << 63) - 1),
])
def test_an_integer_msgpack_cannot_encode_is_named(message, wide):
    with pytest.raises(LocalProtocolError, match=rf"^cannot encode message: integer {wide} is "
                                                 r"outside msgpack's -2\*\*63..2\*\*64-1$"):
        encode_frame(message)
    encode_frame([19, 1, "t", (1 << 64) - 1, -(1 << 63)])          # the edges encode


@settings(max_examples=100, deadline=None)
@given(specs=messages, cuts=st.lists(st.integers(1, 300_000), min_size=1, max_size=20))
def test_has_message_says_whether_messages_yields_again(specs, cuts):
    """``has_message()`` before each step of ``messages()`` (the broker asks it after each
    request it handles) is true exactly when that step yields a message."""
    stream, expected = build(specs)
    reader = FrameReader()
    pos, i, got = 0, 0, 0
    least = len(stream) // _MAX_READS + 1
    while pos < len(stream):
        with reader.get_buffer() as view:
            n = min(len(view), max(cuts[i % len(cuts)], least), len(stream) - pos)
            view[:n] = stream[pos:pos + n]
        reader.buffer_updated(n)
        pos, i = pos + n, i + 1
        steps = reader.messages()
        while True:
            said = reader.has_message()
            message = next(steps, None)
            assert said == (message is not None)
            if message is None:
                break
            assert plain(message) == plain(expected[got])
            got += 1
    assert got == len(expected)


# --- the broker's C parse of a producer's Produce frame (take_produce, FrameReader.take_with) -

_crecords = pytest.importorskip("mq.log._crecords")
take_produce = _crecords.take_produce
ints = st.sampled_from([0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1,
                        -1, -32, -33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63])
produce_fields = st.one_of(
    # The shape take_produce reads: [0, request_id, topic, partition, acks, tail].
    st.tuples(st.just(0), ints, st.text(max_size=300), ints, ints),
    # Near it: another api, a non-int, a bytes topic, a field too many or too few.
    st.tuples(st.sampled_from([1, 0]), ints | st.none() | st.booleans(),
              st.text(max_size=5) | st.binary(max_size=5), ints | st.text(max_size=2), ints)
    .map(list) | st.lists(ints, max_size=6))


def produce_stream(draw_specs) -> tuple[bytes, list[list]]:
    stream, expected = b"", []
    for spec, tail in draw_specs:
        message = [*spec, tail]
        head, view = encode_tail_frame(message)
        stream += head + bytes(view)
        expected.append(message)
    return stream, expected


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(st.tuples(produce_fields, st.binary(max_size=200)), min_size=1,
                      max_size=6),
       cut=st.integers(0, 50), flip=st.none() | st.tuples(st.integers(0, 10_000),
                                                          st.integers(1, 255)))
def test_take_produce_reads_what_messages_reads_or_leaves_it(specs, cut, flip):
    """Over Produce frames and frames near their shape (then maybe a byte flipped or the
    stream cut short): ``take_produce`` (through ``take_with``) returns exactly the message
    ``messages()`` reads of the same bytes, when it has the Produce shape with int fields
    and a str topic, or None and consumes nothing, leaving ``messages()`` to read (or
    refuse) it."""
    stream, _ = produce_stream(specs)
    stream = bytearray(stream[:len(stream) - cut] if cut < len(stream) else stream)
    if flip is not None and stream:
        stream[flip[0] % len(stream)] ^= flip[1]
    fast, general = FrameReader(), FrameReader()
    fast.feed(stream)
    general.feed(stream)
    while True:
        start = fast._start
        got = fast.take_with(take_produce)
        try:
            message = next_message(general)
        except RemoteProtocolError:
            assert got is None
            return
        if got is not None:
            rid, topic, partition, acks, batch = got
            with batch:
                assert [0, rid, topic, partition, acks, bytes(batch)] == message
            assert all(type(v) is int for v in (rid, partition, acks)) and type(topic) is str
            continue
        assert fast._start == start                 # nothing consumed
        if message is None:
            return
        shaped = (len(message) == 6 and message[0] == 0 and type(message[2]) is str and
                  all(type(message[i]) is int for i in (1, 3, 4)))
        assert not shaped, message
        assert next_message(fast) == message        # left to messages(): both move past it


def next_message(reader: FrameReader) -> list | None:
    """The next message of ``messages()`` (its tail as bytes, taken while still valid)."""
    for message in reader.messages():
        return plain(message)
    return None


def test_a_producers_frame_is_taken_whole_and_any_other_left_to_messages():
    """A producer's request, as ``produce_frame`` writes it, is parsed in C; a parse that
    declines (another frame, or no extension) leaves the same frame to ``messages()``."""
    head, batch = _crecords.produce_frame(0, 7, "tópico", 3, -1, 1000, b"k", b"v", [], -1, -1,
                                          -1, 0)[:2]
    reader = FrameReader()
    reader.feed(head + batch)
    rid, topic, partition, acks, view = reader.take_with(take_produce)
    with view:
        assert (rid, topic, partition, acks, bytes(view)) == (7, "tópico", 3, -1, bytes(batch))
    assert reader.take_with(take_produce) is None and reader.buffered == 0
    reader.feed(head + batch)
    assert reader.take_with(lambda *args: None) is None
    assert next_message(reader) == [0, 7, "tópico", 3, -1, bytes(batch)]
