"""Batch framing read from a ``.log``'s headers alone, without decoding a batch: the scan that
lets a segment find offsets and timestamps with one 43-byte ``pread`` a batch.

::

    offset  0  baseOffset       int64
            8  batchLength      int32   (bytes after this field: a batch is 12 + batchLength)
           16  magic            int8    (2)
           23  lastOffsetDelta  int32
           35  maxTimestamp     int64   (43 bytes in all; only these fields are read)

(the whole header, and these offsets as constants: ``mq.log.layout``)

Pure over a descriptor or bytes: nothing is written, nothing past ``end`` is read, and a torn or
malformed tail ends a scan quietly (recovery deals with those).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import Final

from mq.log.layout import (
    FRAME,
    HEADER,
    HEADER_SIZE_UP_TO_MAGIC,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    MIN_BATCH_LENGTH,
    PRODUCER_ID_OFFSET,
    field,
)

__all__ = ["SCAN_BYTES", "header_max_timestamp", "read_frame_length", "scan_headers"]

# Batch header fields a scan needs: baseOffset, batchLength, lastOffsetDelta, maxTimestamp —
# the header up to the end of maxTimestamp (where producerId starts), 43 bytes.
SCAN_BYTES: Final = PRODUCER_ID_OFFSET
_SCAN: Final = struct.Struct(HEADER.format[:3])     # baseOffset, batchLength
_LAST_DELTA: Final = field("lastOffsetDelta")
_MAX_TS: Final = field("maxTimestamp")


def header_max_timestamp(head: bytes) -> int:
    """The maxTimestamp of the batch whose first ``SCAN_BYTES`` bytes are ``head``."""
    return _MAX_TS.unpack_from(head, MAX_TIMESTAMP_OFFSET)[0]


def scan_headers(fd: int, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(baseOffset, size, lastOffsetDelta, maxTimestamp) of each whole batch of the ``.log``
    open as ``fd`` in ``[start, end)``, one 43-byte ``pread`` a batch (a 1 GiB file is never
    read whole); stops at a torn or malformed tail (recovery deals with those)."""
    pos = start
    while end - pos >= SCAN_BYTES:
        head = os.pread(fd, SCAN_BYTES, pos)
        if len(head) < SCAN_BYTES:
            return
        base, length = _SCAN.unpack_from(head)
        if length < MIN_BATCH_LENGTH or head[MAGIC_OFFSET] != MAGIC or \
                pos + LOG_OVERHEAD + length > end:
            return
        size = LOG_OVERHEAD + length
        yield (base, size, _LAST_DELTA.unpack_from(head, LAST_OFFSET_DELTA_OFFSET)[0],
               _MAX_TS.unpack_from(head, MAX_TIMESTAMP_OFFSET)[0])
        pos += size


def read_frame_length(head: bytes) -> int | None:
    """Batch size from its first 17 bytes, or None if they cannot start a v2 batch."""
    if len(head) < HEADER_SIZE_UP_TO_MAGIC:
        return None
    _, length, _, magic = FRAME.unpack_from(head)
    if length < MIN_BATCH_LENGTH or magic != MAGIC:
        return None
    return LOG_OVERHEAD + length
