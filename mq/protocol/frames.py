"""Length-prefixed msgpack frames: bytes in, messages out (and back).

::

    frame = length uint32 big-endian | msgpack payload (length bytes)

``FrameReader`` buffers whatever bytes arrive and yields each complete message; it raises
``RemoteProtocolError`` for a frame longer than ``max_frame_bytes``, a zero-length frame,
undecodable msgpack or a payload that is not an array. After an error the reader is broken:
the connection must be closed, because the stream can no longer be re-synchronised.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

import msgpack

from mq.errors import LocalProtocolError, RemoteProtocolError

__all__ = ["FrameReader", "encode_frame", "DEFAULT_MAX_FRAME_BYTES"]

_LENGTH: Final = struct.Struct(">I")
# Kafka's socket.request.max.bytes is 100 MiB; a frame holds one batch plus a few fields.
DEFAULT_MAX_FRAME_BYTES: Final = 100 * 1024 * 1024
# msgpack decodes from any buffer (``bin`` fields become bytes of their own): a frame is
# decoded from one slice copy, or from a view of the buffer when large — a view costs ~0.15 us
# more to set up, a copy ~70 us per MiB (a 1 MiB Produce: 95 -> 25 us).
_VIEW_FROM: Final = 1 << 14
_unpackb = msgpack.unpackb


def encode_frame(message: list | tuple, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """One frame for ``message``. Raises ``LocalProtocolError`` if it cannot be sent."""
    try:
        payload = msgpack.packb(message, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as err:
        raise LocalProtocolError(f"cannot encode message: {err}") from err
    if len(payload) > max_frame_bytes:
        raise LocalProtocolError(f"frame of {len(payload)} bytes exceeds the "
                                 f"{max_frame_bytes}-byte limit")
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Accumulates received bytes and decodes complete frames."""

    __slots__ = ("_buf", "_max", "_broken")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes
        self._broken = False

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)

    def feed(self, data) -> None:
        self._buf += data

    def __iter__(self) -> Iterator[list]:
        return self.messages()

    def messages(self) -> Iterator[list]:
        """Yield each complete message; keep a partial frame for the next ``feed``."""
        if self._broken:
            raise RemoteProtocolError("connection stream is broken by an earlier bad frame")
        buf = self._buf
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (length,) = _LENGTH.unpack_from(buf, pos)
                if length == 0 or length > self._max:
                    self._broken = True
                    raise RemoteProtocolError(f"frame length {length} is outside 1.."
                                              f"{self._max} bytes")
                if len(buf) - pos - 4 < length:
                    break
                start = pos + 4
                pos = start + length
                try:
                    if length < _VIEW_FROM:
                        message = _unpackb(buf[start:pos], raw=False, strict_map_key=False)
                    else:                  # released before the buffer is resized
                        with memoryview(buf)[start:pos] as payload:
                            message = _unpackb(payload, raw=False, strict_map_key=False)
                except Exception as err:   # msgpack raises several unrelated types
                    self._broken = True
                    raise RemoteProtocolError(f"undecodable msgpack frame: {err}") from err
                if not isinstance(message, list) or len(message) < 2:
                    self._broken = True
                    raise RemoteProtocolError("a frame must hold an array [api, request_id, ...]")
                yield message
        finally:
            if pos:
                del buf[:pos]
