"""Checking one log segment's batches and indexes against its ``.log``: ``recover`` after a
crash (cut and rebuild) and ``verify`` for ``mq log check`` (report, change nothing).

Recovery starts from the recovery point: what lies below it was fsynced and is taken from the
indexes (their last entries checked against the ``.log``); the batches from the point on are
validated, their index entries rebuilt, and the file cut at the first torn or invalid batch.
On disk only the segment's own ``.log``, ``.index``, ``.timeindex`` and ``.txnindex`` change,
and only from the first batch validated on (everything when the checks fail). ``verify``
writes nothing.

Threading: each runs inside one ``LogSegment`` call (``recover`` at load, before the log takes
writes), with the segment's files open for it. Both work through ``LogSegment``'s public
interface only (``scan_batch_headers``, ``pread``, ``batches``, ``translate_offset``,
``index_batch``, ``resize_indexes``, ``on_become_inactive``, ``set_end``, the indexes and the
facts it keeps), never its private names.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from mq.errors import CorruptIndexError, CorruptRecordError
from mq.log import files
from mq.log.batch import RecordBatch

__all__ = ["recover", "SegmentRecovery"]

_INT32_MAX: Final = (1 << 31) - 1


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentRecovery:
    """What ``LogSegment.recover`` did: it validated ``bytes_validated`` bytes from byte
    ``position`` (offset ``offset``) on and cut ``bytes_truncated`` of them; ``index_error``
    says why it validated everything although a recovery point allowed less."""

    offset: int
    position: int
    bytes_validated: int
    bytes_truncated: int
    index_error: str | None = None


def recover(seg, recovery_point: int | None = None) -> SegmentRecovery:
    """``seg``: a ``LogSegment`` with its files open (``LogSegment.recover``). Validate the
    batches from the one holding ``recovery_point`` to the end, rebuilding the index entries
    after it; truncate the file at the first torn or invalid batch; drop the ``.txnindex``
    entries from there (the log's producer-state replay writes them anew). What lies before
    ``recovery_point`` was fsynced and is not read again: only its index entries are checked
    (``_resume_at``). Every batch is validated, and both indexes rebuilt, when
    ``recovery_point`` is None or at the base, or when those checks fail."""
    index_error = None
    if recovery_point is not None and recovery_point > seg.base_offset and seg.size:
        try:
            start, next_offset = _resume_at(seg, recovery_point)
        except CorruptIndexError as err:
            index_error = str(err)
            start = 0
    else:
        start = 0
    if start == 0:
        seg.offset_index.reset()
        seg.time_index.reset()
        seg.txn_index.reset()
        seg.bytes_since_last_index_entry = 0
        seg.max_timestamp_so_far = -1
        seg.offset_of_max_timestamp_so_far = seg.base_offset
        seg.first_batch_timestamp = -1
        next_offset = seg.base_offset
    else:
        seg.resize_indexes(seg.config.segment_index_bytes)   # room for the rebuilt
        seg.txn_index.truncate(next_offset)
    size = seg.size
    valid, end_offset = _rebuild(seg, start, next_offset)
    truncated = size - valid
    seg.set_end(valid, end_offset)
    # As a roll (and Kafka's recover) does: the final entry for the largest timestamp, so a
    # recovered segment's time index equals a cleanly closed one, and trimmed indexes (the
    # log grows the active segment's back afterwards) — an inactive segment left
    # preallocated would, after another crash, open with all-zero "entries".
    seg.on_become_inactive()
    return SegmentRecovery(next_offset, start, size - start, truncated, index_error)


def _resume_at(seg, recovery_point: int) -> tuple[int, int]:
    """Take the state of the batches below ``recovery_point`` from the indexes of a crashed
    segment; returns the position and offset of the first batch to validate (the one
    holding ``recovery_point``, or the end). Kept: the offset-index entries below it
    (``OffsetIndex.keep_below``: the preallocated file's zero tail cut off, no zero-filled
    hole, the last ones in order), its last one checked against the log (the batch there ends
    at its offset, CRC included), and the time-index entries below it, its last one checked the
    same way.
    The largest timestamp is that entry's or a later one met on the header walk from the
    last offset-index entry (at most ``index.interval.bytes`` and a batch). Raises
    ``CorruptIndexError`` when something does not hold: the caller validates all.

    After kill -9 the index pages hold exactly what was written. After a power loss a page
    the flusher did not fsync (it fsyncs the ``.log``) may read as an older version:
    zeros where entries were: a hole (found: validate all) or a shorter run of entries (a
    longer header walk, from the earlier of the two indexes' last entries), as for the
    segments below this one."""
    if not (seg.index_file_exists(files.INDEX_SUFFIX) and
            seg.index_file_exists(files.TIMEINDEX_SUFFIX)):
        raise CorruptIndexError(seg.log_path, "an index is missing")
    offsets, times = seg.offset_index, seg.time_index
    offsets.keep_below(recovery_point, seg.size)
    position = 0
    if offsets.entries:
        last_offset, position = offsets.entry(offsets.entries - 1)
        _check_batch_at(seg, last_offset, position, None)
    indexed_position = position
    max_ts, max_ts_offset = -1, seg.base_offset
    walked = []
    next_offset = seg.base_offset if position == 0 else None
    for base, size, last_delta, batch_max_ts in seg.scan_batch_headers(position):
        if base + last_delta >= recovery_point:
            break
        walked.append((base + last_delta, batch_max_ts))
        position += size
        next_offset = base + last_delta + 1
    if next_offset is None:      # the walk did not get past the checked batch
        raise CorruptIndexError(seg.log_path, f"no batch at byte {position}")
    if position == 0:
        return 0, seg.base_offset   # nothing below the recovery point: validate all
    times.keep_below(next_offset)
    if times.entries:
        max_ts, max_ts_offset = times.last_entry
        found = seg.translate_offset(max_ts_offset)
        _check_batch_at(seg, max_ts_offset, found.position if found else -1, max_ts)
        # After a power loss the time index may end before the offset index does (a page
        # of it not written back reads as zeros): the batches between its last entry and
        # where the walk above began count too, so the largest timestamp is never
        # understated (retention would take the segment early). Normally both indexes
        # took their last entry at the same batch, and this reads no header.
        for base, _, last_delta, batch_max_ts in seg.scan_batch_headers(found.position,
                                                                        indexed_position):
            if batch_max_ts > max_ts:
                max_ts, max_ts_offset = batch_max_ts, base + last_delta
    elif offsets.entries and next(seg.scan_batch_headers(0))[3] >= 0:
        # The first offset-index entry was written with a time-index entry then.
        raise CorruptIndexError(times.path, "no entries below the recovery point")
    for last_offset, batch_max_ts in walked:
        if batch_max_ts > max_ts:
            max_ts, max_ts_offset = batch_max_ts, last_offset
    seg.max_timestamp_so_far = max_ts
    seg.offset_of_max_timestamp_so_far = max_ts_offset
    seg.first_batch_timestamp = next(seg.scan_batch_headers(0))[3]
    seg.bytes_since_last_index_entry = position - indexed_position
    return position, next_offset


def _check_batch_at(seg, last_offset: int, position: int, max_ts: int | None) -> None:
    """Raise ``CorruptIndexError`` unless a valid batch ending at ``last_offset`` (with
    largest timestamp ``max_ts``, unless None) starts at byte ``position``."""
    head = next(seg.scan_batch_headers(position), None) if position >= 0 else None
    if head is not None and head[0] + head[2] == last_offset and \
            (max_ts is None or head[3] == max_ts) and \
            RecordBatch(seg.pread(position, head[1]), position, seg.log_path).is_valid:
        return
    raise CorruptIndexError(seg.log_path, f"no valid batch ending at offset {last_offset} "
                            f"at byte {position}, as an index entry says")


def _rebuild(seg, position: int, next_offset: int) -> tuple[int, int]:
    valid = position
    try:
        for batch in seg.batches(position):
            batch.validate()
            rel = batch.last_offset - seg.base_offset
            if batch.base_offset < next_offset or not 0 <= rel <= _INT32_MAX:
                raise CorruptRecordError(seg.log_path, valid, f"batch offsets "
                                         f"{batch.base_offset}..{batch.last_offset} do not "
                                         f"follow {next_offset - 1} in this segment")
            if valid == 0:
                seg.first_batch_timestamp = batch.max_timestamp
            if batch.max_timestamp > seg.max_timestamp_so_far:
                seg.max_timestamp_so_far = batch.max_timestamp
                seg.offset_of_max_timestamp_so_far = batch.last_offset
            seg.index_batch(batch.last_offset, valid, batch.size)
            valid += batch.size
            next_offset = batch.next_offset
    except CorruptRecordError:
        pass   # everything from `valid` on is dropped
    return valid, next_offset


def verify(seg) -> list[str]:
    """``seg``: a ``LogSegment`` with its files open (``LogSegment.verify``). Problems found
    without changing anything (``mq log check``): invalid batches, index entries inconsistent
    with the log."""
    problems: list[str] = []
    valid = 0
    try:
        for batch in seg.batches():
            batch.validate()
            batch.records()
            valid += batch.size
    except CorruptRecordError as err:
        problems.append(str(err))
    else:
        if valid != seg.size:
            problems.append(f"{seg.log_path} at byte {valid}: torn batch, "
                            f"{seg.size - valid} bytes past the last whole batch")
    for kind, arg in ((files.INDEX_SUFFIX, seg.size), (files.TIMEINDEX_SUFFIX, None)):
        if seg.read_only and not seg.index_file_exists(kind):
            continue   # indexes are created lazily (a one-batch segment may have none)
        index = seg.offset_index if kind == files.INDEX_SUFFIX else seg.time_index
        try:
            if arg is None:
                # From the batch headers, not seg.next_offset: that reads the offset
                # index, which may be missing (read-only) or the very thing that is wrong.
                next_offset = seg.base_offset
                for base, _, last_delta, _ in seg.scan_batch_headers(0):
                    next_offset = base + last_delta + 1
                index.validate_entries(next_offset)
            else:
                index.validate_entries(arg)
        except CorruptIndexError as err:
            problems.append(str(err))
    return problems
