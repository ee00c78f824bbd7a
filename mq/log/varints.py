"""Protobuf zig-zag varints, the integers of a RecordBatch v2 record (``mq.log.layout``).

Pure. A varint (int32) takes at most 5 bytes, a varlong (int64) at most 10; encoding works on
64-bit zig-zag, so one encoder serves both. Values in ``[-CACHED, CACHED)`` are encoded once, at
import, into ``VARINTS`` (``VARINTS[value + CACHED]``): encoding a 100-byte record then costs
list lookups instead of bit twiddling (the per-record hot spot of a pure-Python producer).
"""

from __future__ import annotations

from typing import Final

__all__ = ["encode_varint", "encode_varint_uncached", "decode_varint", "CACHED", "VARINTS",
           "NULL_VARINT", "ZERO_VARINT"]


def encode_varint_uncached(value: int) -> bytes:
    """``encode_varint`` without the table: for values outside ``[-CACHED, CACHED)``."""
    v = (value << 1) ^ (value >> 63)        # zig-zag, 64-bit
    v &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


CACHED: Final = 1 << 13


def _table() -> list[bytes]:
    """``encode_varint_uncached(v)`` for ``v`` in ``[-CACHED, CACHED)``, in closed form (every
    process that imports mq builds it; 16,384 calls of the encoder took 14 ms): the zig-zag
    values ``z`` are ``[0, 2 * CACHED)``, one byte below 128 and two above; ``v >= 0`` is
    ``z = 2v`` and ``v < 0`` is ``z = -2v - 1``."""
    by_z = [bytes((z,)) for z in range(128)] + \
        [bytes(((z & 0x7F) | 0x80, z >> 7)) for z in range(128, 2 * CACHED)]
    return by_z[2 * CACHED - 1::-2] + by_z[0::2]


VARINTS: Final = _table()
NULL_VARINT: Final = VARINTS[-1 + CACHED]          # b"\x01": a null key, value or header value
ZERO_VARINT: Final = VARINTS[CACHED]               # b"\x00"


def encode_varint(value: int) -> bytes:
    """Zig-zag varint (varlong for values beyond int32) of ``value``."""
    if -CACHED <= value < CACHED:
        return VARINTS[value + CACHED]
    return encode_varint_uncached(value)


def decode_varint(buf, pos: int, limit: int = 10) -> tuple[int, int]:
    """Decode a zig-zag varint at ``buf[pos]``; returns ``(value, next_pos)``.

    Raises ``IndexError`` at the end of the buffer and ``ValueError`` when the varint runs past
    ``limit`` bytes (5 for varint, 10 for varlong); callers turn both into CorruptRecordError.
    """
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    result = b & 0x7F
    shift = 7
    for _ in range(limit - 1):
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise ValueError(f"varint longer than {limit} bytes")
