"""One log segment: a ``.log`` of RecordBatch v2 with its sparse ``.index`` and ``.timeindex``.

::

    <dir>/<base offset, 20 digits>.log        batches, appended only, never rewritten
    <dir>/<base offset, 20 digits>.index      (relOffset, position) every index.interval.bytes
    <dir>/<base offset, 20 digits>.timeindex  (maxTimestampSoFar, relOffset), same rhythm

Invariants: batches are contiguous from byte 0 and their offsets increase; every index entry
points at a batch start inside the file; the byte count since the last index entry decides the
next entry (Kafka's rule: the first append of a segment never gets one). Index files are
created by the first write that needs them, or with the segment (``create_indexes``: a log's
rolls do that, as Kafka does); a read never creates one — a lookup in a segment without an
index scans its batch headers from byte 0.

Writes go through ``diskio`` with ``pwrite`` at the tracked end (``size``), never ``O_APPEND``.
An append either stores the whole batch with its index entries or, on any ``OSError`` (a full
disk, an I/O error, a short write), truncates the ``.log`` back and leaves every count as it
was; if even the truncation fails the segment is ``torn`` (bytes past ``size`` are garbage that
recovery cuts) and its log must take no more writes. Nothing past ``size`` is ever read.

Reads use ``pread`` (the broker side); client processes read through ``mq.log.reader``'s maps.

Open files (Kafka opens a segment's files lazily too): a segment keeps its ``.log`` and index
descriptors open between calls only while ``pinned`` — its log pins the active segment, 3
descriptors (``.log``, ``.index``, ``.timeindex``; the ``.txnindex`` is opened per write). Any
other segment opens what a call needs when the call starts and closes it when the call (the
outermost, on whichever thread: the cleaner reads beside the broker's loop) ends, so a
partition's older segments cost no descriptor. Files stay open past a call only while an index
is not trimmed (preallocated, or with failed entries past its count): opened again, its zero
tail would count as entries; the next call that leaves it trimmed closes it. An append opens
the ``.log`` if it is closed and leaves it so. A segment closed for good raises ``EBADF``.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import mmap
import os
import random
import struct
import threading
import time
from collections.abc import Iterator
from typing import Final

from mq.errors import CorruptIndexError, CorruptRecordError, InvalidOffsetError
from mq.log import diskio, files
from mq.log.config import LogConfig
from mq.log.index import OffsetIndex, TimeIndex
from mq.log.policy import SegmentMeta
from mq.log.txnindex import AbortedTxn, TransactionIndex
from mq.log.records import (HEADER_SIZE_UP_TO_MAGIC, LOG_OVERHEAD, MAGIC, MIN_BATCH_LENGTH,
                            RecordBatch, iter_batches)

__all__ = ["LogSegment", "OffsetPosition", "FetchSlice", "SegmentRecovery"]

_FRAME: Final = struct.Struct(">qiib")
# Batch header fields a scan needs: baseOffset, batchLength, lastOffsetDelta, maxTimestamp.
_SCAN_BYTES: Final = 43
_SCAN: Final = struct.Struct(">qi")
_LAST_DELTA: Final = struct.Struct(">i")
_MAX_TS: Final = struct.Struct(">q")
_INT32_MAX: Final = (1 << 31) - 1
_READ_CHUNK: Final = 1 << 20


def _using_files(method):
    """A method that reads or writes the segment's files: open for its length (module doc)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        self._enter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._leave()
    return call


def _using_files_while_iterating(method):
    """``_using_files`` for a generator: open until it finishes or is dropped."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        self._enter()
        try:
            yield from method(self, *args, **kwargs)
        finally:
            self._leave()
    return call


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetPosition:
    """Where a batch starts: its last offset, byte position and size."""

    last_offset: int
    position: int
    size: int


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


@dataclasses.dataclass(frozen=True, slots=True)
class FetchSlice:
    """Whole batches read from one segment, starting with the batch holding ``offset``."""

    offset: int
    segment_base_offset: int
    position: int
    data: bytes


class LogSegment:
    """A segment's files and what is known about them. ``close()`` is idempotent."""

    def __init__(self, directory: str, base_offset: int, config: LogConfig, *,
                 suffix: str = "", now_ms: int | None = None, read_only: bool = False) -> None:
        self.dir = directory
        self.read_only = read_only
        self.base_offset = base_offset
        self.config = config
        self.suffix = suffix
        self.log_path = os.path.join(directory, files.segment_name(base_offset, ".log") + suffix)
        self._lock = threading.Lock()      # guards the open files and the count of their users
        self._users = 0
        # The mq log tools read a segment or two: they keep its files open.
        self.pinned = read_only
        if read_only:
            self._fd = os.open(self.log_path, os.O_RDONLY)
        else:
            self._fd = diskio.ops.open(self.log_path, os.O_RDWR | os.O_CREAT)
        self.size = os.fstat(self._fd).st_size
        if not read_only:
            diskio.ops.close(self._fd)
            self._fd = -1
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self._txn_index: TransactionIndex | None = None
        self.bytes_since_last_index_entry = 0
        self.created_ms = int(time.time() * 1000) if now_ms is None else now_ms
        self.first_batch_timestamp = -1
        self.max_timestamp_so_far = -1
        self.offset_of_max_timestamp_so_far = base_offset
        self._next_offset: int | None = None if self.size else base_offset
        # Kafka draws the jitter once per segment, uniformly in [0, min(jitter, segment.ms)).
        jitter = min(config.segment_jitter_ms, config.segment_ms)
        self.rolling_jitter_ms = random.randrange(jitter) if jitter > 0 else 0
        self.closed = False
        self.torn = False           # a failed append could not be truncated back

    # --- open files (module doc) ---------------------------------------------------------------
    def pin(self) -> None:
        """Keep the files open between calls from now on (the active segment)."""
        with self._lock:
            self.pinned = True
            self._open_log()

    def unpin(self) -> None:
        """Close the files once no call uses them and the indexes are trimmed (a roll)."""
        with self._lock:
            self.pinned = False
            if not self._users:
                self._close_if_trimmed()

    def _enter(self) -> None:
        with self._lock:
            self._open_log()
            self._users += 1

    def _leave(self) -> None:
        with self._lock:
            self._users -= 1
            if not self._users and not self.pinned:
                self._close_if_trimmed()

    def _open_log(self) -> None:
        """Open the ``.log`` unless it is open; the caller holds the lock."""
        if self.closed:
            raise OSError(errno.EBADF, f"{self.log_path}: the segment is closed")
        if self._fd < 0:
            self._fd = diskio.ops.open(self.log_path, os.O_RDWR)   # read-only ones stay open

    def _close_if_trimmed(self) -> None:
        """Close every file unless an index is not trimmed; the caller holds the lock."""
        indexes = (self._offset_index, self._time_index)
        if any(index is not None and not index.trimmed for index in indexes):
            return
        self._offset_index = self._time_index = None
        for index in indexes:
            if index is not None:
                index.close_without_trim()
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            diskio.ops.close(fd)

    # --- paths and lazy indexes ---------------------------------------------------------------
    def _path(self, kind: str) -> str:
        return os.path.join(self.dir, files.segment_name(self.base_offset, kind) + self.suffix)

    def index_file_exists(self, kind: str = files.INDEX_SUFFIX) -> bool:
        return os.path.exists(self._path(kind))

    @_using_files
    def create_indexes(self) -> None:
        """Create (preallocated) both index files now, not at the first entry: a segment
        of a live log always has them (a roll makes them with the segment, as Kafka does)."""
        self.offset_index.sanity_check()
        self.time_index.sanity_check()

    def _existing_index(self, kind: str) -> OffsetIndex | TimeIndex | None:
        """The index if its file exists, else None: a read never creates a file (on a full
        disk it could not, and a lookup must not fail for it)."""
        index = self._offset_index if kind == files.INDEX_SUFFIX else self._time_index
        if index is None and self.index_file_exists(kind):
            index = self.offset_index if kind == files.INDEX_SUFFIX else self.time_index
        return index

    @property
    def offset_index(self) -> OffsetIndex:
        return self._offset_index or self._open_index(files.INDEX_SUFFIX)

    @property
    def time_index(self) -> TimeIndex:
        return self._time_index or self._open_index(files.TIMEINDEX_SUFFIX)

    def _open_index(self, kind: str):
        """Open (creating, when writable) one index; under the lock, as the cleaner's thread
        may ask at the same time."""
        with self._lock:
            offsets = kind == files.INDEX_SUFFIX
            index = self._offset_index if offsets else self._time_index
            if index is None:
                index = (OffsetIndex if offsets else TimeIndex)(
                    self._path(kind), self.base_offset, self.config.segment_index_bytes,
                    writable=not self.read_only)
                if offsets:
                    self._offset_index = index
                else:
                    self._time_index = index
            return index

    @property
    def txn_index(self) -> TransactionIndex:
        """The aborted transactions whose marker is here (``.txnindex``, created by the first
        entry)."""
        if self._txn_index is None:
            self._txn_index = TransactionIndex(self._path(files.TXNINDEX_SUFFIX))
        return self._txn_index

    @_using_files
    def load_index_state(self) -> None:
        """After opening an existing segment without recovery: restore the max timestamp from
        the time index and the next offset by scanning past the last offset-index entry."""
        self.offset_index.sanity_check()
        self.time_index.sanity_check()
        ts, off = self.time_index.last_entry
        self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far = ts, off
        self._next_offset = None
        self._compute_next_offset()
        if ts < 0 and any(max_ts >= 0 for *_, max_ts in self._scan_headers(0)):
            # Roll, close and recovery all leave the final (largest timestamp) entry, so an
            # empty time index over batches with timestamps was lost (emptied by a crash):
            # trusting it would take the largest timestamp from the tail scan alone, and
            # close() would find no slot for the final entry.
            raise CorruptIndexError(self.time_index.path, "no entries, but the segment's "
                                    "batches carry timestamps")

    @_using_files
    def _compute_next_offset(self) -> int:
        """Scan batch headers from the last offset-index entry to the end of the file."""
        idx = self._existing_index(files.INDEX_SUFFIX)
        start = idx.entry(idx.entries - 1)[1] if idx is not None and idx.entries else 0
        next_offset = self.base_offset
        first = True
        for base, size, last_delta, max_ts in self._scan_headers(start):
            next_offset = base + last_delta + 1
            if first and start == 0:
                self.first_batch_timestamp = max_ts
            first = False
            if max_ts > self.max_timestamp_so_far:
                self.max_timestamp_so_far = max_ts
                self.offset_of_max_timestamp_so_far = base + last_delta
        if start and self.first_batch_timestamp < 0:
            head = self._pread(0, _SCAN_BYTES)
            if len(head) == _SCAN_BYTES:
                self.first_batch_timestamp = _MAX_TS.unpack_from(head, 35)[0]
        self._next_offset = next_offset
        return next_offset

    # --- facts --------------------------------------------------------------------------------
    @property
    def next_offset(self) -> int:
        """One past the last offset in the segment; the base offset when empty."""
        if self._next_offset is None:
            return self._compute_next_offset()
        return self._next_offset

    @property
    def largest_timestamp(self) -> int:
        """Max record timestamp, or the file's mtime if no batch carries one (Kafka)."""
        if self.max_timestamp_so_far >= 0:
            return self.max_timestamp_so_far
        return self._mtime_ms()

    @_using_files
    def _mtime_ms(self) -> int:
        return int(os.fstat(self._fd).st_mtime * 1000)

    # SegmentMeta's fields, read live by the roll rule on every append.
    @property
    def size_bytes(self) -> int:
        return self.size

    @property
    def offset_index_full(self) -> bool:
        return self._index_full(self._offset_index, files.INDEX_SUFFIX)

    @property
    def time_index_full(self) -> bool:
        return self._index_full(self._time_index, files.TIMEINDEX_SUFFIX)

    def _index_full(self, index: OffsetIndex | TimeIndex | None, kind: str) -> bool:
        # A closed index is trimmed (module doc), and a trimmed index has no free slot: the
        # answer needs no descriptor (retention asks it of every segment).
        return index.is_full if index is not None else self.index_file_exists(kind)

    def meta(self) -> SegmentMeta:
        return SegmentMeta(
            base_offset=self.base_offset, size_bytes=self.size, next_offset=self.next_offset,
            largest_timestamp=self.largest_timestamp,
            first_batch_timestamp=self.first_batch_timestamp, created_ms=self.created_ms,
            offset_index_full=self.offset_index_full, time_index_full=self.time_index_full,
            rolling_jitter_ms=self.rolling_jitter_ms)

    # --- append -------------------------------------------------------------------------------
    def append(self, batch, *, last_offset: int, max_timestamp: int,
               offset_of_max_timestamp: int, aborted_txn: AbortedTxn | None = None,
               head: bytearray | None = None) -> int:
        """Append one or more whole batches with one write; returns their start position.
        ``aborted_txn``: the batch is an ABORT marker; its ``.txnindex`` entry goes in with it.
        ``head``: one batch in memory another process may write, whose header (stamped) is
        this private copy: written in its place, and the bytes that reached the file are
        checked against it and its CRC before anything moves (``CorruptRecordError`` after
        cutting them off again).

        Raises ``InvalidOffsetError`` when ``last_offset`` cannot be stored relative to the
        base offset (the caller must roll first).
        """
        rel = last_offset - self.base_offset
        if not 0 <= rel <= _INT32_MAX:
            raise InvalidOffsetError(f"{self.log_path}: offset {last_offset} does not fit "
                                     f"relative to base {self.base_offset}")
        position = self.size
        if self._fd < 0:
            with self._lock:
                self._open_log()
        if max_timestamp > self.max_timestamp_so_far:
            max_ts, max_ts_offset = max_timestamp, offset_of_max_timestamp
        else:
            max_ts, max_ts_offset = self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far
        counts = self._index_counts()
        try:
            if head is None:
                diskio.write_fully(self._fd, batch, position)
            else:
                diskio.write_fully(self._fd, head, position)
                with memoryview(batch)[len(head):] as body:
                    diskio.write_fully(self._fd, body, position + len(head))
                self._check_written(position, len(batch), head)
            indexed = self._index_entry(last_offset, position, max_ts, max_ts_offset)
            if aborted_txn is not None:
                self.txn_index.append(aborted_txn)
        except BaseException:
            self._restore_index_counts(counts)
            self._truncate_back(position)
            raise
        # Stored: only now does anything in memory move.
        if position == 0:
            # Only the first batch's timestamp is recorded; created_ms stays the creation time
            # (Kafka's LogSegment.append does not touch it, and it must stay on the caller's
            # now_ms clock for the wall-clock roll rule).
            self.first_batch_timestamp = max_timestamp
        self.size = position + len(batch)
        self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far = max_ts, max_ts_offset
        self.bytes_since_last_index_entry = len(batch) + (
            0 if indexed else self.bytes_since_last_index_entry)
        self._next_offset = last_offset + 1
        return position

    def _check_written(self, position: int, size: int, head: bytearray) -> None:
        """The ``size`` bytes at ``position`` start with ``head`` and are a valid batch (its
        CRC included): read through a map of just them (page-cache pages, no copy)."""
        start = position - position % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(self._fd, position + size - start, offset=start,
                       access=mmap.ACCESS_READ) as m, memoryview(m) as whole, \
                whole[position - start:] as written:
            if written[:len(head)] == head and \
                    RecordBatch(written, position, self.log_path).is_valid:
                return
        raise CorruptRecordError(self.log_path, position, "the batch changed in the "
                                 "producer's shared memory while it was written (CRC "
                                 "mismatch); refused and cut off")

    def _truncate_back(self, position: int) -> None:
        """After a failed append: cut whatever part of it reached the file (Redis's rule for
        a short AOF write). If that fails too the segment is ``torn``."""
        try:
            diskio.ops.ftruncate(self._fd, position)
        except OSError:
            self.torn = True

    def _index_counts(self) -> tuple[int, int]:
        return tuple(0 if index is None else index.entries
                     for index in (self._offset_index, self._time_index))

    def _restore_index_counts(self, counts: tuple[int, int]) -> None:
        """Forget entries written by a failed append (their bytes are past the count:
        overwritten by the next entries, trimmed at close)."""
        for index, count in zip((self._offset_index, self._time_index), counts):
            if index is not None:
                index.entries = min(index.entries, count)

    def _index_entry(self, last_offset: int, position: int, max_ts: int,
                     max_ts_offset: int) -> bool:
        """Kafka's rule, for append and recovery alike: an entry for the batch at ``position``
        once more than ``index.interval.bytes`` went in since the last one; returns whether
        it wrote one (on ``OSError`` the caller restores the counts). A full index
        (``segment.index.bytes`` lowered since the segment was written; the roll rule keeps
        the active segment's from filling) just stays sparser: lookups scan further."""
        if self.bytes_since_last_index_entry <= self.config.index_interval_bytes or \
                self.offset_index.is_full or self.time_index.is_full:
            return False
        self.offset_index.append(last_offset, position)
        self.time_index.maybe_append(max_ts, max_ts_offset)
        return True

    def _index_batch(self, last_offset: int, position: int, size: int) -> None:
        """Recovery's side of ``_index_entry``, over the rebuilt maximum timestamp."""
        if self._index_entry(last_offset, position, self.max_timestamp_so_far,
                             self.offset_of_max_timestamp_so_far):
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += size

    # --- read ---------------------------------------------------------------------------------
    def _pread(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def _scan_headers(self, start: int, end: int | None = None
                      ) -> Iterator[tuple[int, int, int, int]]:
        return scan_headers(self._fd, start, self.size if end is None else end)

    @_using_files
    def translate_offset(self, offset: int, starting_position: int = 0) -> OffsetPosition | None:
        """The first batch whose last offset is >= ``offset`` (index floor, then a scan of
        batch headers), or None when every batch ends before it."""
        index = self._existing_index(files.INDEX_SUFFIX)
        index_pos = index.lookup(offset)[1] if index is not None else 0
        pos = max(index_pos, starting_position)
        for base, size, last_delta, _ in self._scan_headers(pos):
            if base + last_delta >= offset:
                return OffsetPosition(base + last_delta, pos, size)
            pos += size
        return None

    @_using_files
    def read(self, start_offset: int, max_bytes: int, max_position: int | None = None,
             min_one_batch: bool = True) -> FetchSlice | None:
        """Whole batches from the one holding ``start_offset``, up to ``max_bytes`` (at least
        one batch when ``min_one_batch``); None when ``start_offset`` is past the segment."""
        if max_bytes < 0:
            raise ValueError(f"invalid max_bytes {max_bytes}")
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        limit = self.size if max_position is None else min(max_position, self.size)
        start = found.position
        if start >= limit:
            return FetchSlice(start_offset, self.base_offset, start, b"")
        if min_one_batch and found.size > max_bytes:
            length = min(found.size, limit - start)
        else:
            # Extend over whole batches only, so a reader never sees a partial batch.
            length = 0
            for _, size, _, _ in self._scan_headers(start, limit):
                if length + size > max_bytes:
                    break
                length += size
        return FetchSlice(start_offset, self.base_offset, start, self._pread(start, length))

    @_using_files_while_iterating
    def batches(self, start_position: int = 0, end: int | None = None
                ) -> Iterator[RecordBatch]:
        """Every whole batch from ``start_position`` (no CRC check), read in chunks with
        ``pread``. Stops quietly at a torn tail; raises ``CorruptRecordError`` for framing
        that cannot be a batch."""
        end = self.size if end is None else end
        pos = start_position
        while end - pos >= HEADER_SIZE_UP_TO_MAGIC:
            chunk = self._pread(pos, min(_READ_CHUNK, end - pos))
            consumed = 0
            try:
                for batch in iter_batches(chunk, 0, len(chunk), self.log_path):
                    batch.position += pos
                    consumed += batch.size
                    yield batch
            except CorruptRecordError as err:
                raise CorruptRecordError(self.log_path, pos + err.position, err.reason) from err
            if consumed == 0:
                # The next batch is larger than a chunk (or torn): read it whole.
                size = read_frame_length(chunk)
                if size is None or pos + size > end:
                    return
                yield RecordBatch(self._pread(pos, size), pos, self.log_path)
                consumed = size
            pos += consumed

    @_using_files
    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int = 0
                                 ) -> tuple[int, int] | None:
        """Earliest (offset, timestamp) at or after ``starting_offset`` whose timestamp is
        >= ``timestamp``, or None. Looking up ``timestamp - 1`` in the time index makes the
        answer exact: every batch before that entry's batch has max timestamp < ``timestamp``.
        """
        index = self._existing_index(files.TIMEINDEX_SUFFIX)
        index_offset = index.lookup(timestamp - 1)[1] if index is not None else self.base_offset
        found = self.translate_offset(max(index_offset, starting_offset))
        if found is None:
            return None
        for batch in self.batches(found.position):
            if batch.max_timestamp < timestamp or batch.last_offset < starting_offset:
                continue
            for rec in batch.records():
                if rec.timestamp >= timestamp and rec.offset >= starting_offset:
                    return rec.offset, rec.timestamp
        return None

    # --- recovery and truncation --------------------------------------------------------------
    @_using_files
    def recover(self, recovery_point: int | None = None) -> SegmentRecovery:
        """Validate the batches from the one holding ``recovery_point`` to the end, rebuilding
        the index entries after it; truncate the file at the first torn or invalid batch; drop
        the ``.txnindex`` entries from there (the log's producer-state replay writes them
        anew). What lies before ``recovery_point`` was fsynced and is not read again: only its
        index entries are checked (``_resume_at``). Every batch is validated, and both indexes
        rebuilt, when ``recovery_point`` is None or at the base, or when those checks fail."""
        index_error = None
        if recovery_point is not None and recovery_point > self.base_offset and self.size:
            try:
                start, next_offset = self._resume_at(recovery_point)
            except CorruptIndexError as err:
                index_error = str(err)
                start = 0
        else:
            start = 0
        if start == 0:
            self.offset_index.reset()
            self.time_index.reset()
            self.txn_index.reset()
            self.bytes_since_last_index_entry = 0
            self.max_timestamp_so_far = -1
            self.offset_of_max_timestamp_so_far = self.base_offset
            self.first_batch_timestamp = -1
            next_offset = self.base_offset
        else:
            self.resize_indexes(self.config.segment_index_bytes)   # room for the rebuilt
            self.txn_index.truncate(next_offset)
        size = self.size
        valid, end_offset = self._rebuild(start, next_offset)
        truncated = size - valid
        if truncated:
            diskio.ops.ftruncate(self._fd, valid)
            self.size = valid
        self._next_offset = end_offset
        # As a roll (and Kafka's recover) does: the final entry for the largest timestamp, so a
        # recovered segment's time index equals a cleanly closed one, and trimmed indexes (the
        # log grows the active segment's back afterwards) — an inactive segment left
        # preallocated would, after another crash, open with all-zero "entries".
        self.on_become_inactive()
        return SegmentRecovery(next_offset, start, size - start, truncated, index_error)

    def _resume_at(self, recovery_point: int) -> tuple[int, int]:
        """Take the state of the batches below ``recovery_point`` from the indexes of a crashed
        segment; returns the position and offset of the first batch to validate (the one
        holding ``recovery_point``, or the end). Kept: the offset-index entries below it
        (``OffsetIndex.keep_below``: the preallocated file's zero tail cut off, no zero-filled
        hole, the last ones in order), its last one checked against the log (the batch there ends at its offset,
        CRC included), and the time-index entries below it, its last one checked the same way.
        The largest timestamp is that entry's or a later one met on the header walk from the
        last offset-index entry (at most ``index.interval.bytes`` and a batch). Raises
        ``CorruptIndexError`` when something does not hold: the caller validates all.

        After kill -9 the index pages hold exactly what was written. After a power loss a page
        the flusher did not fsync (it fsyncs the ``.log``) may read as an older version:
        zeros where entries were: a hole (found: validate all) or a shorter run of entries (a
        longer header walk, from the earlier of the two indexes' last entries), as for the
        segments below this one."""
        if not (self.index_file_exists(files.INDEX_SUFFIX) and
                self.index_file_exists(files.TIMEINDEX_SUFFIX)):
            raise CorruptIndexError(self.log_path, "an index is missing")
        offsets, times = self.offset_index, self.time_index
        offsets.keep_below(recovery_point, self.size)
        position = 0
        if offsets.entries:
            last_offset, position = offsets.entry(offsets.entries - 1)
            self._check_batch_at(last_offset, position, None)
        indexed_position = position
        max_ts, max_ts_offset = -1, self.base_offset
        walked = []
        next_offset = self.base_offset if position == 0 else None
        for base, size, last_delta, batch_max_ts in self._scan_headers(position):
            if base + last_delta >= recovery_point:
                break
            walked.append((base + last_delta, batch_max_ts))
            position += size
            next_offset = base + last_delta + 1
        if next_offset is None:      # the walk did not get past the checked batch
            raise CorruptIndexError(self.log_path, f"no batch at byte {position}")
        if position == 0:
            return 0, self.base_offset   # nothing below the recovery point: validate all
        times.keep_below(next_offset)
        if times.entries:
            max_ts, max_ts_offset = times.last_entry
            found = self.translate_offset(max_ts_offset)
            self._check_batch_at(max_ts_offset, found.position if found else -1, max_ts)
            # After a power loss the time index may end before the offset index does (a page
            # of it not written back reads as zeros): the batches between its last entry and
            # where the walk above began count too, so the largest timestamp is never
            # understated (retention would take the segment early). Normally both indexes
            # took their last entry at the same batch, and this reads no header.
            for base, _, last_delta, batch_max_ts in self._scan_headers(found.position,
                                                                        indexed_position):
                if batch_max_ts > max_ts:
                    max_ts, max_ts_offset = batch_max_ts, base + last_delta
        elif offsets.entries and next(self._scan_headers(0))[3] >= 0:
            # The first offset-index entry was written with a time-index entry then.
            raise CorruptIndexError(times.path, "no entries below the recovery point")
        for last_offset, batch_max_ts in walked:
            if batch_max_ts > max_ts:
                max_ts, max_ts_offset = batch_max_ts, last_offset
        self.max_timestamp_so_far = max_ts
        self.offset_of_max_timestamp_so_far = max_ts_offset
        self.first_batch_timestamp = next(self._scan_headers(0))[3]
        self.bytes_since_last_index_entry = position - indexed_position
        return position, next_offset

    def _check_batch_at(self, last_offset: int, position: int, max_ts: int | None) -> None:
        """Raise ``CorruptIndexError`` unless a valid batch ending at ``last_offset`` (with
        largest timestamp ``max_ts``, unless None) starts at byte ``position``."""
        head = next(self._scan_headers(position), None) if position >= 0 else None
        if head is not None and head[0] + head[2] == last_offset and \
                (max_ts is None or head[3] == max_ts) and \
                RecordBatch(self._pread(position, head[1]), position, self.log_path).is_valid:
            return
        raise CorruptIndexError(self.log_path, f"no valid batch ending at offset {last_offset} "
                                f"at byte {position}, as an index entry says")

    def _rebuild(self, position: int, next_offset: int) -> tuple[int, int]:
        valid = position
        try:
            for batch in self.batches(position):
                batch.validate()
                rel = batch.last_offset - self.base_offset
                if batch.base_offset < next_offset or not 0 <= rel <= _INT32_MAX:
                    raise CorruptRecordError(self.log_path, valid, f"batch offsets "
                                             f"{batch.base_offset}..{batch.last_offset} do not "
                                             f"follow {next_offset - 1} in this segment")
                if valid == 0:
                    self.first_batch_timestamp = batch.max_timestamp
                if batch.max_timestamp > self.max_timestamp_so_far:
                    self.max_timestamp_so_far = batch.max_timestamp
                    self.offset_of_max_timestamp_so_far = batch.last_offset
                self._index_batch(batch.last_offset, valid, batch.size)
                valid += batch.size
                next_offset = batch.next_offset
        except CorruptRecordError:
            pass   # everything from `valid` on is dropped
        return valid, next_offset

    @_using_files
    def verify(self) -> list[str]:
        """Problems found without changing anything (``mq log check``): invalid batches,
        index entries inconsistent with the log."""
        problems: list[str] = []
        valid = 0
        try:
            for batch in self.batches():
                batch.validate()
                batch.records()
                valid += batch.size
        except CorruptRecordError as err:
            problems.append(str(err))
        else:
            if valid != self.size:
                problems.append(f"{self.log_path} at byte {valid}: torn batch, "
                                f"{self.size - valid} bytes past the last whole batch")
        for kind, arg in ((files.INDEX_SUFFIX, self.size), (files.TIMEINDEX_SUFFIX, None)):
            if self.read_only and not self.index_file_exists(kind):
                continue   # indexes are created lazily (a one-batch segment may have none)
            index = self.offset_index if kind == files.INDEX_SUFFIX else self.time_index
            try:
                if arg is None:
                    # From the batch headers, not self.next_offset: that reads the offset
                    # index, which may be missing (read-only) or the very thing that is wrong.
                    next_offset = self.base_offset
                    for base, _, last_delta, _ in self._scan_headers(0):
                        next_offset = base + last_delta + 1
                    index.validate_entries(next_offset)
                else:
                    index.validate_entries(arg)
            except CorruptIndexError as err:
                problems.append(str(err))
        return problems

    @_using_files
    def truncate_to(self, offset: int) -> int:
        """Remove ``offset`` and everything after it (the whole batch holding it); returns the
        bytes removed."""
        found = self.translate_offset(offset)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        if self.index_file_exists(files.TXNINDEX_SUFFIX):
            self.txn_index.truncate(offset)
        # Cut the dropped entries' bytes before growing back: zeros, not stale entries, must
        # follow the entries if a crash comes (recovery takes the written slots as entries).
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self.resize_indexes(self.config.segment_index_bytes)
        if found is None:
            return 0
        removed = self.size - found.position
        diskio.ops.ftruncate(self._fd, found.position)
        self.size = found.position
        self.bytes_since_last_index_entry = 0
        self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far = \
            self.time_index.last_entry
        if self.size == 0:
            self.created_ms = int(time.time() * 1000)
            self.first_batch_timestamp = -1
        self._next_offset = None
        self._compute_next_offset()
        return removed

    # --- lifecycle ----------------------------------------------------------------------------
    @_using_files
    def on_become_inactive(self) -> None:
        """At roll: write the final time-index entry and trim both indexes."""
        if self.max_timestamp_so_far >= 0:
            self.time_index.maybe_append(self.max_timestamp_so_far,
                                         self.offset_of_max_timestamp_so_far,
                                         skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()

    @_using_files
    def resize_indexes(self, size: int) -> None:
        # Never below the entries already written (segment.index.bytes may have been lowered):
        # shrinking would drop entries and the time index's reserved last slot, and the roll
        # that a full index triggers could then not write its final time-index entry.
        self.offset_index.resize(max(size, self.offset_index.size_in_bytes))
        self.time_index.resize(max(size, self.time_index.size_in_bytes + 12))

    def dup_fd(self) -> int:
        """A descriptor of the ``.log`` of its own (a duplicate, or opened when the files are
        closed), for an fsync in another thread that must not race with this segment being
        closed. An fsync covers the file's pages whichever descriptor wrote them, and a
        writeback error no descriptor has seen yet is reported to one opened after it (Linux
        4.16 and later)."""
        with self._lock:
            if self._fd >= 0:
                return diskio.ops.dup(self._fd)
            return diskio.ops.open(self.log_path, os.O_RDONLY)

    @_using_files
    def flush(self) -> None:
        diskio.ops.fdatasync(self._fd)
        for kind, index in ((files.INDEX_SUFFIX, self._offset_index),
                            (files.TIMEINDEX_SUFFIX, self._time_index)):
            if index is not None:
                index.flush()
            elif self.index_file_exists(kind):     # closed after its last change, maybe
                fd = diskio.ops.open(self._path(kind), os.O_RDONLY)
                try:
                    diskio.ops.fdatasync(fd)
                finally:
                    diskio.ops.close(fd)
        if self._txn_index is not None:
            self._txn_index.flush()

    def close(self) -> None:
        if self.read_only:
            self.close_without_index_changes()
            return
        if self.closed:
            return
        self.closed = True
        try:
            if self.max_timestamp_so_far >= 0 and self.size:
                self.time_index.maybe_append(self.max_timestamp_so_far,
                                             self.offset_of_max_timestamp_so_far,
                                             skip_full_check=True)
        finally:
            try:
                for index in (self._offset_index, self._time_index):
                    if index is not None:
                        index.close()
                if self._txn_index is not None:
                    self._txn_index.trim()
            finally:
                if self._txn_index is not None:
                    self._txn_index.close()
                self._close_log()

    def close_without_index_changes(self) -> None:
        """Close leaving files exactly as they are (``mq log check`` without ``--repair``)."""
        if self.closed:
            return
        self.closed = True
        for index in (self._offset_index, self._time_index):
            if index is not None:
                index.close_without_trim()
        if self._txn_index is not None:
            self._txn_index.close()
        self._close_log()

    def _close_log(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            diskio.ops.close(fd)

    def rename_suffix(self, new_suffix: str) -> None:
        """Rename every existing file of the segment from the current suffix to ``new_suffix``
        (e.g. ``""`` -> ``".deleted"``). Index files not yet created stay uncreated."""
        for kind in files.SEGMENT_FILE_SUFFIXES:
            old = self._path(kind)
            new = os.path.join(self.dir, files.segment_name(self.base_offset, kind) + new_suffix)
            if kind == files.INDEX_SUFFIX and self._offset_index is not None:
                self._offset_index.rename(new)
            elif kind == files.TIMEINDEX_SUFFIX and self._time_index is not None:
                self._time_index.rename(new)
            elif kind == files.TXNINDEX_SUFFIX and self._txn_index is not None:
                self._txn_index.rename(new)
            elif os.path.exists(old):
                diskio.ops.rename(old, new)
        self.suffix = new_suffix
        self.log_path = self._path(files.LOG_SUFFIX)

    def delete(self) -> None:
        """Close and remove the segment's files (whatever suffix they carry now)."""
        self.close_without_index_changes()
        files.remove_quietly(self._path(k) for k in files.SEGMENT_FILE_SUFFIXES)

    def __repr__(self) -> str:
        return (f"LogSegment(base_offset={self.base_offset}, size={self.size}, "
                f"next_offset={self._next_offset}, suffix={self.suffix!r})")


def scan_headers(fd: int, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(baseOffset, size, lastOffsetDelta, maxTimestamp) of each whole batch of the ``.log``
    open as ``fd`` in ``[start, end)``, one 43-byte ``pread`` a batch (a 1 GiB file is never
    read whole); stops at a torn or malformed tail (recovery deals with those)."""
    pos = start
    while end - pos >= _SCAN_BYTES:
        head = os.pread(fd, _SCAN_BYTES, pos)
        if len(head) < _SCAN_BYTES:
            return
        base, length = _SCAN.unpack_from(head)
        if length < MIN_BATCH_LENGTH or head[16] != MAGIC or pos + LOG_OVERHEAD + length > end:
            return
        size = LOG_OVERHEAD + length
        yield base, size, _LAST_DELTA.unpack_from(head, 23)[0], _MAX_TS.unpack_from(head, 35)[0]
        pos += size


def read_frame_length(head: bytes) -> int | None:
    """Batch size from its first 17 bytes, or None if they cannot start a v2 batch."""
    if len(head) < HEADER_SIZE_UP_TO_MAGIC:
        return None
    _, length, _, magic = _FRAME.unpack_from(head)
    if length < MIN_BATCH_LENGTH or magic != MAGIC:
        return None
    return LOG_OVERHEAD + length
