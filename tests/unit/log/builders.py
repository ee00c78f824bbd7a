"""Batch-building helpers shared by the storage unit tests (``tests/unit/log``).

Every helper builds real RecordBatch v2 bytes with ``mq.log.builder.BatchBuilder``; nothing here
touches a file except ``append_to_segment``, which goes through ``LogSegment.append`` exactly
as ``PartitionLog.append`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mq.log.batch import RecordBatch
from mq.log.builder import BatchBuilder
from mq.log.segment import LogSegment


def make_batch(offsets: int = 1, *, base_offset: int = 0, timestamp: int = 1_000,
               ts_step: int = 0, value: bytes | None = b"value", key: bytes | None = None,
               timestamps: Iterable[int] | None = None) -> bytearray:
    """One batch of ``offsets`` records (offset deltas 0..n-1) starting at ``base_offset``.

    Record i carries ``timestamp + i * ts_step`` unless ``timestamps`` gives them explicitly.
    """
    builder = BatchBuilder(base_offset=base_offset)
    stamps = list(timestamps) if timestamps is not None else [
        timestamp + i * ts_step for i in range(offsets)]
    for ts in stamps:
        builder.append(ts, key, value)
    return builder.build()


def empty_batch(*, base_offset: int = 0) -> bytearray:
    """A batch with no records (``recordsCount`` 0) — what a client must never produce."""
    return BatchBuilder(base_offset=base_offset).build()


def append_to_segment(seg: LogSegment, batch: bytes | bytearray) -> int:
    """Append one or more concatenated batches with their own offsets (``LogSegment.append``
    takes the facts ``PartitionLog.append`` would compute); returns the start position."""
    last_offset, max_ts, offset_of_max = -1, -1, -1
    for parsed in _batches(batch):
        last_offset = parsed.last_offset
        if parsed.max_timestamp > max_ts:
            max_ts, offset_of_max = parsed.max_timestamp, parsed.last_offset
    if offset_of_max < 0:
        offset_of_max = last_offset
    return seg.append(bytes(batch), last_offset=last_offset, max_timestamp=max_ts,
                      offset_of_max_timestamp=offset_of_max)


def append_single_records(seg: LogSegment, offsets: Iterable[int], *, ts_of=lambda o: o * 10,
                          value_of=lambda o: b"msg%d" % o) -> list[int]:
    """Kafka's ``LogSegmentTest`` pattern: one single-record batch per offset. Returns the
    start position of each batch."""
    return [append_to_segment(seg, make_batch(base_offset=o, timestamp=ts_of(o),
                                              value=value_of(o)))
            for o in offsets]


def _batches(data: bytes | bytearray) -> Iterator[RecordBatch]:
    """Each batch of a byte string of whole batches (a partial one raises
    ``CorruptRecordError``)."""
    view = memoryview(bytes(data))
    pos = 0
    while pos < len(view):
        batch = RecordBatch(view[pos:])
        yield batch
        pos += batch.size


def offsets_of(data: bytes) -> list[int]:
    """Every record offset in a byte string of whole batches."""
    return [rec.offset for batch in _batches(data) for rec in batch.records()]


def batch_bases(data: bytes) -> list[int]:
    """The base offset of each batch in a byte string of whole batches."""
    return [batch.base_offset for batch in _batches(data)]
