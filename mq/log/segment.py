"""One log segment: a ``.log`` of RecordBatch v2 with its sparse ``.index`` and ``.timeindex``.

::

    <dir>/<base offset, 20 digits>.log        batches, appended only, never rewritten
    <dir>/<base offset, 20 digits>.index      (relOffset, position) every index.interval.bytes
    <dir>/<base offset, 20 digits>.timeindex  (maxTimestampSoFar, relOffset), same rhythm
    <dir>/<base offset, 20 digits>.txnindex   aborted transactions whose ABORT marker is here

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
recovery cuts) and its log must take no more writes. Nothing past ``size`` is ever read. A
batch another process may still write (a producer's arena) is written with its header from a
private copy, then checked against it and its CRC through a map of what reached the file; a
mismatch is cut off again (``CorruptRecordError``).

Reads use ``pread`` (the broker side), or ``locate`` for a caller that sends the bytes with
``sendfile`` (the Kafka listener's Fetch); client processes read through ``mq.log.reader``'s
maps.

Open files: only the active segment (pinned by its log) keeps its descriptors open between
calls; any other opens them for a call (``mq.log.segment_files``). Recovery from a recovery
point (``recover``) and the check of ``mq log check`` (``verify``, which writes nothing) are
``mq.log.segment_recovery``'s, run with the files open. A segment closed for good raises
``EBADF``.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import os
import random
import time
from collections.abc import Iterator
from typing import Final

from mq.errors import CorruptIndexError, CorruptRecordError, InvalidOffsetError
from mq.log import diskio, files, segment_recovery
from mq.log.batch import RecordBatch, iter_batches
from mq.log.batch_headers import (SCAN_BYTES, header_max_timestamp, read_frame_length,
                                  scan_headers)
from mq.log.config import LogConfig
from mq.log.index import OffsetIndex, TimeIndex
from mq.log.layout import HEADER_SIZE_UP_TO_MAGIC
from mq.log.policy import SegmentMeta
from mq.log.segment_files import SegmentFiles
from mq.log.segment_recovery import SegmentRecovery
from mq.log.txnindex import AbortedTxn, TransactionIndex

__all__ = ["LogSegment", "OffsetPosition", "FetchSlice"]

_INT32_MAX: Final = (1 << 31) - 1
_READ_CHUNK: Final = 1 << 20


def _using_files(method):
    """A method that reads or writes the segment's files: open for its length
    (``segment_files``)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._files.in_use():
            return method(self, *args, **kwargs)
    return call


def _using_files_while_iterating(method):
    """``_using_files`` for a generator: open until it finishes or is dropped."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._files.in_use():
            yield from method(self, *args, **kwargs)
    return call


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetPosition:
    """Where a batch starts: its last offset, byte position and size."""

    last_offset: int
    position: int
    size: int


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
        self._files = SegmentFiles(self._path, base_offset, config.segment_index_bytes,
                                   read_only=read_only)
        self.size = self._files.size_at_open
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
        self.torn = False           # a failed append could not be truncated back

    # --- open files (segment_files) -------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Closed for good: a call raises ``EBADF``."""
        return self._files.closed

    def pin(self) -> None:
        """Keep the files open between calls from now on (the active segment)."""
        self._files.pin()

    def unpin(self) -> None:
        """Close the files once no call uses them and the indexes are trimmed (a roll)."""
        self._files.unpin()

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

    @property
    def offset_index(self) -> OffsetIndex:
        return self._files.index(files.INDEX_SUFFIX)

    @property
    def time_index(self) -> TimeIndex:
        return self._files.index(files.TIMEINDEX_SUFFIX)

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
        if ts < 0 and any(max_ts >= 0 for *_, max_ts in self.scan_batch_headers(0)):
            # Roll, close and recovery all leave the final (largest timestamp) entry, so an
            # empty time index over batches with timestamps was lost (emptied by a crash):
            # trusting it would take the largest timestamp from the tail scan alone, and
            # close() would find no slot for the final entry.
            raise CorruptIndexError(self.time_index.path, "no entries, but the segment's "
                                    "batches carry timestamps")

    @_using_files
    def _compute_next_offset(self) -> int:
        """Scan batch headers from the last offset-index entry to the end of the file."""
        idx = self._files.existing_index(files.INDEX_SUFFIX)
        start = idx.entry(idx.entries - 1)[1] if idx is not None and idx.entries else 0
        next_offset = self.base_offset
        first = True
        for base, size, last_delta, max_ts in self.scan_batch_headers(start):
            next_offset = base + last_delta + 1
            if first and start == 0:
                self.first_batch_timestamp = max_ts
            first = False
            if max_ts > self.max_timestamp_so_far:
                self.max_timestamp_so_far = max_ts
                self.offset_of_max_timestamp_so_far = base + last_delta
        if start and self.first_batch_timestamp < 0:
            head = self.pread(0, SCAN_BYTES)
            if len(head) == SCAN_BYTES:
                self.first_batch_timestamp = header_max_timestamp(head)
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
        return int(os.fstat(self._files.fd).st_mtime * 1000)

    # SegmentMeta's fields, read live by the roll rule on every append.
    @property
    def size_bytes(self) -> int:
        return self.size

    @property
    def offset_index_full(self) -> bool:
        return self._index_full(files.INDEX_SUFFIX)

    @property
    def time_index_full(self) -> bool:
        return self._index_full(files.TIMEINDEX_SUFFIX)

    def _index_full(self, kind: str) -> bool:
        index = self._files.loaded(kind)
        # A closed index is trimmed (segment_files), and a trimmed index has no free slot: the
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
        self._files.open_log()
        if max_timestamp > self.max_timestamp_so_far:
            max_ts, max_ts_offset = max_timestamp, offset_of_max_timestamp
        else:
            max_ts, max_ts_offset = self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far
        counts = self._index_counts()
        try:
            if head is None:
                diskio.write_fully(self._files.fd, batch, position)
            else:
                diskio.write_fully(self._files.fd, head, position)
                with memoryview(batch)[len(head):] as body:
                    diskio.write_fully(self._files.fd, body, position + len(head))
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
        with mmap.mmap(self._files.fd, position + size - start, offset=start,
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
            diskio.ops.ftruncate(self._files.fd, position)
        except OSError:
            self.torn = True

    def _index_counts(self) -> tuple[int, int]:
        return tuple(0 if index is None else index.entries
                     for index in self._files.loaded_indexes())

    def _restore_index_counts(self, counts: tuple[int, int]) -> None:
        """Forget entries written by a failed append (their bytes are past the count:
        overwritten by the next entries, trimmed at close)."""
        for index, count in zip(self._files.loaded_indexes(), counts):
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

    def index_batch(self, last_offset: int, position: int, size: int) -> None:
        """Recovery's side of ``_index_entry``, over the rebuilt maximum timestamp."""
        if self._index_entry(last_offset, position, self.max_timestamp_so_far,
                             self.offset_of_max_timestamp_so_far):
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += size

    # --- read ---------------------------------------------------------------------------------
    def pread(self, position: int, size: int) -> bytes:
        """Up to ``size`` bytes of the ``.log`` at ``position``; inside a call (files open)."""
        return os.pread(self._files.fd, size, position)

    def scan_batch_headers(self, start: int, end: int | None = None
                           ) -> Iterator[tuple[int, int, int, int]]:
        """``scan_headers`` over this ``.log`` up to ``end`` (default ``size``); inside a
        call (files open)."""
        return scan_headers(self._files.fd, start, self.size if end is None else end)

    @_using_files
    def translate_offset(self, offset: int, starting_position: int = 0) -> OffsetPosition | None:
        """The first batch whose last offset is >= ``offset`` (index floor, then a scan of
        batch headers), or None when every batch ends before it."""
        index = self._files.existing_index(files.INDEX_SUFFIX)
        index_pos = index.lookup(offset)[1] if index is not None else 0
        pos = max(index_pos, starting_position)
        for base, size, last_delta, _ in self.scan_batch_headers(pos):
            if base + last_delta >= offset:
                return OffsetPosition(base + last_delta, pos, size)
            pos += size
        return None

    @_using_files
    def read(self, start_offset: int, max_bytes: int, max_position: int | None = None,
             min_one_batch: bool = True) -> FetchSlice | None:
        """Whole batches from the one holding ``start_offset``, up to ``max_bytes`` (at least
        one batch when ``min_one_batch``); None when ``start_offset`` is past the segment."""
        found = self.locate(start_offset, max_bytes, max_position, min_one_batch)
        if found is None:
            return None
        start, length = found
        return FetchSlice(start_offset, self.base_offset, start, self.read_range(start, length))

    @_using_files
    def read_range(self, position: int, length: int) -> bytes:
        """``length`` bytes of the ``.log`` from ``position`` (what ``locate`` found)."""
        return self.pread(position, length) if length else b""

    @_using_files
    def locate(self, start_offset: int, max_bytes: int, max_position: int | None = None,
               min_one_batch: bool = True) -> tuple[int, int] | None:
        """``read`` without the bytes: (position, length) of the whole batches it would
        return, for a caller that sends them with ``sendfile``."""
        if max_bytes < 0:
            raise ValueError(f"invalid max_bytes {max_bytes}")
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        limit = self.size if max_position is None else min(max_position, self.size)
        start = found.position
        if start >= limit:
            return start, 0
        if min_one_batch and found.size > max_bytes:
            return start, min(found.size, limit - start)
        # Extend over whole batches only, so a reader never sees a partial batch.
        length = 0
        for _, size, _, _ in self.scan_batch_headers(start, limit):
            if length + size > max_bytes:
                break
            length += size
        return start, length

    @_using_files_while_iterating
    def batches(self, start_position: int = 0, end: int | None = None
                ) -> Iterator[RecordBatch]:
        """Every whole batch from ``start_position`` (no CRC check), read in chunks with
        ``pread``. Stops quietly at a torn tail; raises ``CorruptRecordError`` for framing
        that cannot be a batch."""
        end = self.size if end is None else end
        pos = start_position
        while end - pos >= HEADER_SIZE_UP_TO_MAGIC:
            chunk = self.pread(pos, min(_READ_CHUNK, end - pos))
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
                yield RecordBatch(self.pread(pos, size), pos, self.log_path)
                consumed = size
            pos += consumed

    @_using_files
    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int = 0
                                 ) -> tuple[int, int] | None:
        """Earliest (offset, timestamp) at or after ``starting_offset`` whose timestamp is
        >= ``timestamp``, or None. Looking up ``timestamp - 1`` in the time index makes the
        answer exact: every batch before that entry's batch has max timestamp < ``timestamp``.
        """
        index = self._files.existing_index(files.TIMEINDEX_SUFFIX)
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
        """``segment_recovery.recover`` with the files open for it."""
        return segment_recovery.recover(self, recovery_point)

    def set_end(self, position: int, next_offset: int) -> None:
        """Recovery's end: cut the ``.log`` at ``position`` if it is longer and take
        ``next_offset`` as the offset after the last batch."""
        if position != self.size:
            diskio.ops.ftruncate(self._files.fd, position)
            self.size = position
        self._next_offset = next_offset

    @_using_files
    def verify(self) -> list[str]:
        """``segment_recovery.verify`` with the files open for it."""
        return segment_recovery.verify(self)

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
        diskio.ops.ftruncate(self._files.fd, found.position)
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
        """A descriptor of the ``.log`` of its own (``SegmentFiles.dup_fd``)."""
        return self._files.dup_fd()

    @_using_files
    def flush(self) -> None:
        diskio.ops.fdatasync(self._files.fd)
        for kind, index in zip((files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX),
                               self._files.loaded_indexes()):
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
        self._files.closed = True
        try:
            if self.max_timestamp_so_far >= 0 and self.size:
                self.time_index.maybe_append(self.max_timestamp_so_far,
                                             self.offset_of_max_timestamp_so_far,
                                             skip_full_check=True)
        finally:
            try:
                for index in self._files.loaded_indexes():
                    if index is not None:
                        index.close()
                if self._txn_index is not None:
                    self._txn_index.trim()
            finally:
                if self._txn_index is not None:
                    self._txn_index.close()
                self._files.close()

    def close_without_index_changes(self) -> None:
        """Close leaving files exactly as they are (``mq log check`` without ``--repair``)."""
        if self.closed:
            return
        self._files.closed = True
        for index in self._files.loaded_indexes():
            if index is not None:
                index.close_without_trim()
        if self._txn_index is not None:
            self._txn_index.close()
        self._files.close()

    def rename_suffix(self, new_suffix: str) -> None:
        """Rename every existing file of the segment from the current suffix to ``new_suffix``
        (e.g. ``""`` -> ``".deleted"``). Index files not yet created stay uncreated."""
        for kind in files.SEGMENT_FILE_SUFFIXES:
            old = self._path(kind)
            new = os.path.join(self.dir, files.segment_name(self.base_offset, kind) + new_suffix)
            index = self._files.loaded(kind)
            if index is not None:
                index.rename(new)
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
