"""A batch's records decoded into column buffers instead of record objects: what ``mq.spark``
builds Arrow columns of, and what ``PartitionLog.first_timestamp_from`` reads a timestamp from.

Pure. ``decode_columns`` appends to eight ``bytearray`` columns, native byte order: offsets
(int64), timestamps (int64 ms), key ends (int32: the key data's length after each key), key
data, key validity (a byte: 1, or 0 for null), then the same three for values. It accepts and
rejects exactly what ``RecordBatch.records()`` does, and leaves the columns as they were when
it raises. In C when the extension is built (``mq.log.native``: no object per record);
``_append_columns`` over decoded records is the reference. It lives in the log layer, not
next to Spark, because the log reads it too and may import nothing above it.
"""

from __future__ import annotations

import array
from typing import Final

from mq.errors import CorruptRecordError
from mq.log import native
from mq.log.batch import BatchRecord, RecordBatch
from mq.log.layout import TIMESTAMP_TYPE_MASK

__all__ = ["decode_columns"]

_INT32_MAX: Final = (1 << 31) - 1


def decode_columns(batch: RecordBatch, columns: list[bytearray], lo: int, hi: int) -> int:
    """Append the records of ``batch`` whose offsets are in ``[lo, hi)`` to ``columns`` (the
    eight of the module docstring). Header values are validated but not kept. Returns how
    many records were appended. Raises ``CorruptRecordError`` as ``batch.records()`` does."""
    decode = native.decode_columns
    if decode is None:
        return _append_columns(columns, [r for r in batch.records() if lo <= r.offset < hi])
    count, buf = batch.counted_payload()
    try:
        return decode(buf, batch.base_offset, batch.base_timestamp,
                      batch.attributes & TIMESTAMP_TYPE_MASK, batch.max_timestamp, count, lo,
                      hi, columns)
    except (ValueError, OverflowError) as err:
        raise CorruptRecordError(batch.path, batch.position, str(err)) from err


def _append_columns(columns: list[bytearray], records: list[BatchRecord]) -> int:
    """The pure-Python ``decode_columns``: what the C codec appends, from decoded records."""
    try:
        out = [array.array("q", [r.offset for r in records]).tobytes(),
               array.array("q", [r.timestamp for r in records]).tobytes()]
    except OverflowError as err:
        raise CorruptRecordError(None, 0, "record offset or timestamp does not fit int64") \
            from err
    for field, column in (("key", 3), ("value", 6)):
        values = [getattr(r, field) for r in records]
        ends = array.array("q")
        size = len(columns[column])
        for v in values:
            size += 0 if v is None else len(v)
            ends.append(size)
        if size > _INT32_MAX:
            raise CorruptRecordError(None, 0, "a data column would pass 2**31 - 1 bytes")
        out += [array.array("i", ends).tobytes(), b"".join(v for v in values if v is not None),
                bytes(v is not None for v in values)]
    for column, data in zip(columns, out, strict=True):
        column += data
    return len(records)
