"""Length-prefixed msgpack frames: bytes in, messages out (and back).

::

    frame      = length uint32 big-endian | msgpack array (length bytes)
    tail frame = (TAIL_FLAG | length) uint32 big-endian
                 | header_length uint32 big-endian | msgpack array (header_length bytes)
                 | tail (length - 4 - header_length bytes)

A tail frame carries its request's last field, a record batch, as raw bytes after the msgpack
array instead of as a msgpack ``bin`` inside it: the sender hands both pieces to one
``sendmsg`` (no copy to build the frame) and the receiver gets the batch as a writable view of
its receive buffer (no copy to take it out of msgpack, none to make it writable for offset
stamping). The decoded message is the array with the tail appended, so ``check_request`` sees
the same shape either way. Only ``length`` counts against ``max_frame_bytes`` (at most 2**31 -
1 bytes, so the flag bit is free).

``FrameReader`` parses frames in place in one buffer per connection. The owner of the socket
asks ``get_buffer()`` for the free space, ``recv_into``s it and reports ``buffer_updated(n)``
(asyncio's ``BufferedProtocol`` pattern); ``feed(data)`` copies bytes in for callers without a
socket. Once a frame's length is known the buffer holds room for all of it and a read asks for
no more than the rest of that frame, so a large frame lands in place in whole and is never
moved. A tail is a view of that buffer, valid until the next message is asked for: it is
released then (using it afterwards raises ``ValueError``). Consumed bytes are reclaimed only by
moving the unparsed rest to the front of the buffer, and only if nothing still exports the
buffer (a view a handler kept: then the rest moves to a fresh buffer and the old one is left to
that view, unchanged).

``FrameReader`` raises ``RemoteProtocolError`` for a frame longer than ``max_frame_bytes``, a
zero-length frame, undecodable msgpack, a payload that is not an array or a header that does
not fit its frame. After an error the reader is broken: the connection must be closed, because
the stream can no longer be re-synchronised.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import msgpack

from mq.errors import LocalProtocolError, RemoteProtocolError

if TYPE_CHECKING:
    import socket

__all__ = ["FrameReader", "encode_frame", "encode_tail_frame", "DEFAULT_MAX_FRAME_BYTES",
           "TAIL_FLAG"]

_LENGTH: Final = struct.Struct(">I")
_TAIL_PREFIX: Final = struct.Struct(">II")
TAIL_FLAG: Final = 1 << 31
_LENGTH_MASK: Final = TAIL_FLAG - 1
# Kafka's socket.request.max.bytes is 100 MiB; a frame holds one batch plus a few fields.
DEFAULT_MAX_FRAME_BYTES: Final = 100 * 1024 * 1024
# msgpack decodes from any buffer (``bin`` fields become bytes of their own): a frame is
# decoded from one slice copy, or from a view of the buffer when large — a view costs ~0.15 us
# more to set up, a copy ~70 us per MiB (a 1 MiB Produce: 95 -> 25 us).
_VIEW_FROM: Final = 1 << 14
# A connection's buffer starts at 32 KiB and grows to hold two of its largest frames (so the
# next frame's head usually fits behind the last one without a move); one larger than
# _KEEP_BYTES is given back once empty (4 MiB holds two 1 MiB batches), any other by trim().
# A read while no frame length is known asks for _MIN_READ.._HEAD_READ bytes: enough for many
# small frames, little to move when it holds the head of a large one.
_INITIAL_BYTES: Final = 1 << 15
_KEEP_BYTES: Final = 1 << 22
_MIN_READ: Final = 1 << 14
_HEAD_READ: Final = 1 << 16
_unpackb = msgpack.unpackb


def _pack(message: list | tuple, max_frame_bytes: int, extra: int = 0) -> bytes:
    try:
        payload = msgpack.packb(message, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as err:
        wide = _wide_integer(message)
        why = f"integer {wide} is outside msgpack's -2**63..2**64-1" if wide is not None \
            else str(err)
        raise LocalProtocolError(f"cannot encode message: {why}") from err
    if len(payload) + extra > max_frame_bytes:
        raise LocalProtocolError(f"frame of {len(payload) + extra} bytes exceeds the "
                                 f"{max_frame_bytes}-byte limit")
    return payload


def _wide_integer(value: object) -> int | None:
    """The first integer in ``value`` (or in the lists, tuples and dicts in it) that msgpack
    cannot encode, or None: what to name when ``packb`` says only "Integer value out of
    range"."""
    if isinstance(value, int):
        return value if not -(1 << 63) <= value < 1 << 64 else None
    items = value.items() if isinstance(value, dict) else \
        value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _wide_integer(item)
        if found is not None:
            return found
    return None


def encode_frame(message: list | tuple, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """One frame for ``message``. Raises ``LocalProtocolError`` if it cannot be sent."""
    payload = _pack(message, max_frame_bytes)
    return _LENGTH.pack(len(payload)) + payload


def encode_tail_frame(message: list | tuple, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
                      ) -> tuple[bytes, memoryview]:
    """A tail frame for ``message``, whose last field (a bytes-like object) travels raw: the
    frame's head (prefix and msgpack header) and a view of that field, to be sent in this
    order (``socket.sendmsg``). Raises ``LocalProtocolError`` if it cannot be sent."""
    try:
        tail = memoryview(message[-1]).cast("B")
    except TypeError as err:
        raise LocalProtocolError(f"cannot send {type(message[-1]).__name__} as a frame "
                                 "tail") from err
    header = _pack(message[:-1], max_frame_bytes, 4 + len(tail))
    length = 4 + len(header) + len(tail)
    return _TAIL_PREFIX.pack(TAIL_FLAG | length, len(header)) + header, tail


class FrameReader:
    """Parses complete frames in place in one receive buffer."""

    __slots__ = ("_buf", "_start", "_end", "_max", "_broken", "_tail")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()            # allocated by the first get_buffer
        self._start = 0                    # the first unparsed byte
        self._end = 0                      # one past the last received byte
        self._max = max_frame_bytes
        self._broken = False
        self._tail: memoryview | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return self._end - self._start

    def _frame_bytes(self) -> int:
        """The whole size of the frame at ``_start`` if its prefix is in (else 0); raises for
        a length out of bounds."""
        if self._end - self._start < 4:
            return 0
        (length,) = _LENGTH.unpack_from(self._buf, self._start)
        length &= _LENGTH_MASK
        if length == 0 or length > self._max:
            self._broken = True
            raise RemoteProtocolError(f"frame length {length} is outside 1..{self._max} bytes")
        return 4 + length

    def get_buffer(self) -> memoryview:
        """A writable view of the free space to receive into (release it before calling
        ``buffer_updated``): exactly the rest of a frame longer than ``_HEAD_READ`` being
        received, else up to ``_HEAD_READ`` bytes (with room for the rest of a short frame).
        Raises ``RemoteProtocolError`` for a frame length out of bounds."""
        self._release_tail()
        pending = self._end - self._start
        frame = self._frame_bytes()
        want = frame - pending if frame > pending else _MIN_READ
        if self._end + want > len(self._buf) or (not pending and self._end):
            self._make_room(pending, pending + want)
        end = self._end
        stop = end + want if frame > max(pending, _HEAD_READ) \
            else min(len(self._buf), end + max(want, _HEAD_READ))
        return memoryview(self._buf)[end:stop]

    def recvmsg(self, sock: socket.socket, ancbufsize: int) -> tuple[int, list, int]:
        """``sock.recvmsg_into`` into the buffer (``get_buffer``, then ``buffer_updated``):
        ``(bytes received, ancillary data, flags)``. Raises as ``recvmsg_into`` does, or
        ``RemoteProtocolError`` as ``get_buffer``.

        The steady state of a connection that sends a frame at a time, everything received
        parsed and no view kept, takes a short cut: the buffer is reused from its start, as
        ``get_buffer`` would, without its steps (a broker's read is on every record's way)."""
        buf = self._buf
        if self._start == self._end and self._tail is None and \
                _HEAD_READ <= len(buf) <= _KEEP_BYTES and self._exclusive():
            self._start = self._end = 0
            view = memoryview(buf)[:_HEAD_READ]
        else:
            view = self.get_buffer()
        try:
            n, ancillary, flags, _ = sock.recvmsg_into((view,), ancbufsize)
        finally:
            view.release()
        self._end += n
        return n, ancillary, flags

    def _make_room(self, pending: int, needed: int) -> None:
        """Move the unparsed bytes to the front, into a larger or fresh buffer if need be
        (never over bytes a kept view may still show)."""
        buf, start = self._buf, self._start
        size = len(buf)
        if needed > size:
            size = max(2 * needed + _HEAD_READ, _INITIAL_BYTES)
        elif size > _KEEP_BYTES and needed <= _KEEP_BYTES // 2:
            size = 2 * needed + _HEAD_READ                   # give a huge buffer back
        if size == len(buf) and self._exclusive():
            buf[:pending] = buf[start:start + pending]       # memmove of the unparsed rest
        else:
            fresh = bytearray(size)
            fresh[:pending] = buf[start:start + pending]
            self._buf = fresh
        self._start, self._end = 0, pending

    def _exclusive(self) -> bool:
        """Whether nothing but this reader holds the buffer (no view a handler kept)."""
        try:
            self._buf.append(0)        # a resize: refused while any view exports the buffer
        except BufferError:
            return False
        self._buf.pop()
        return True

    def has_message(self) -> bool:
        """Whether a whole frame waits after the message last yielded: ``messages()`` will
        yield again without another read. Raises as ``messages()`` for a frame length out of
        bounds."""
        frame = self._frame_bytes()
        return bool(frame) and self._end - self._start >= frame

    def take_with(self, parse: Callable[..., tuple | None]) -> tuple | None:
        """The next message if ``parse`` reads it: a C parser of one shape of tail frame
        (``mq.log.native.take_produce``, a producer's Produce), called as ``parse(buffer,
        start, end, max_frame_bytes)`` and returning the message's fields, the tail's start
        and the frame's end, or None. Returns the fields and the tail as a writable view of
        the buffer, which the caller releases before it asks for anything else; None, with
        nothing consumed, for any other frame (``messages()`` reads it, and raises for a bad
        one), a partial one or a broken stream."""
        if self._broken:
            return None
        got = parse(self._buf, self._start, self._end, self._max)
        if got is None:
            return None
        *fields, tail_start, frame_end = got
        self._start = frame_end
        return (*fields, memoryview(self._buf)[tail_start:frame_end])

    def buffer_updated(self, n: int) -> None:
        """``n`` bytes were received into the view ``get_buffer`` returned."""
        self._end += n

    def trim(self) -> None:
        """Give the buffer back if it holds nothing unparsed (the owner calls this now and
        then, so a connection that went quiet keeps no buffer; the next read takes a new
        one). Never call it while iterating ``messages()``."""
        if self._start == self._end:
            self._buf = bytearray()
            self._start = self._end = 0

    def feed(self, data) -> None:
        """Copy received ``data`` in (for callers that do not ``recv_into`` the buffer)."""
        data = memoryview(data).cast("B")
        while data:
            with self.get_buffer() as view:
                n = min(len(view), len(data))
                view[:n] = data[:n]
            self.buffer_updated(n)
            data = data[n:]

    def __iter__(self) -> Iterator[list]:
        return self.messages()

    def _release_tail(self) -> None:
        if self._tail is not None:
            self._tail.release()
            self._tail = None

    def messages(self) -> Iterator[list]:
        """Yield each complete message; keep a partial frame for the next read. A tail
        frame's message ends with a writable view of its tail, released at the next step."""
        if self._broken:
            raise RemoteProtocolError("connection stream is broken by an earlier bad frame")
        try:
            while True:
                frame = self._frame_bytes()
                if not frame or self._end - self._start < frame:
                    return
                buf, start = self._buf, self._start + 4
                pos = self._start + frame
                try:
                    if buf[self._start] & 0x80:            # TAIL_FLAG
                        (head,) = _LENGTH.unpack_from(buf, start)
                        if head > frame - 8:
                            raise ValueError(f"header of {head} bytes in a {frame - 4}-byte "
                                             "frame")
                        start += 4
                        tail_start = start + head
                    else:
                        tail_start = -1
                    stop = pos if tail_start < 0 else tail_start
                    if stop - start < _VIEW_FROM:
                        message = _unpackb(buf[start:stop], raw=False, strict_map_key=False)
                    else:                  # released before the buffer is resized
                        with memoryview(buf)[start:stop] as payload:
                            message = _unpackb(payload, raw=False, strict_map_key=False)
                except Exception as err:   # msgpack raises several unrelated types
                    self._broken = True
                    raise RemoteProtocolError(f"undecodable msgpack frame: {err}") from err
                if not isinstance(message, list) or len(message) < 2:
                    self._broken = True
                    raise RemoteProtocolError("a frame must hold an array [api, request_id, ...]")
                self._start = pos
                if tail_start >= 0:
                    self._tail = memoryview(buf)[tail_start:pos]
                    message.append(self._tail)
                yield message
                self._release_tail()
        finally:
            self._release_tail()
            if self._start == self._end and len(self._buf) > _KEEP_BYTES:
                self._buf = bytearray()            # a kept view holds the old one alive
                self._start = self._end = 0
