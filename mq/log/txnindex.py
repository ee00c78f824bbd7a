"""``.txnindex``: the aborted transactions whose ABORT marker is in a segment (Kafka's format).

On disk (big-endian, no header), one 34-byte entry per aborted transaction::

    version int16 (0) | producerId int64 | firstOffset int64 | lastOffset int64 |
    lastStableOffset int64

``lastOffset`` is the ABORT marker's offset and strictly increases within a file;
``lastStableOffset`` is the partition's LSO once the abort completed (the first offset of the
earliest other open transaction, else the marker's offset + 1). The file exists only once a
segment holds an abort (created by the first entry). A ``read_committed`` reader of
``[start, end)`` takes the entries with ``lastOffset >= start and firstOffset < end`` of this
and later segments, and stops at the first entry whose ``lastStableOffset >= end``.

Entries are written with ``pwrite`` through ``diskio`` at the tracked end; a failed write leaves
the count as it was (the bytes past it are overwritten by the next entry, or cut by
``truncate``). Readers read the file with ``pread`` (``read_entries``). No descriptor stays
open between calls: a write opens the file and closes it again (aborts are rare; a broker's
descriptors go to the segments it appends to), and ``flush`` fsyncs what was written since
the last one through a descriptor of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from mq.errors import CorruptIndexError
from mq.log import diskio, files
from mq.log.batch import RecordBatch
from mq.log.layout import CONTROL_ABORT, CONTROL_COMMIT

__all__ = ["ENTRY_SIZE", "AbortedTxn", "AbortedTxnFilter", "TransactionIndex", "collect_aborted",
           "decode_entries", "is_visible", "read_entries"]

_ENTRY: Final = struct.Struct(">hqqqq")
ENTRY_SIZE: Final = _ENTRY.size           # 34


@dataclasses.dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return _ENTRY.pack(0, self.producer_id, self.first_offset, self.last_offset,
                           self.last_stable_offset)


def decode_entries(data: bytes, path: str = "<txnindex>") -> list[AbortedTxn]:
    """Every whole entry of ``data`` (a torn last entry is ignored). Raises
    ``CorruptIndexError`` for an unknown version or last offsets that do not increase."""
    out: list[AbortedTxn] = []
    for pos in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
        if version != 0:
            raise CorruptIndexError(path, f"entry {pos // ENTRY_SIZE} has version {version}")
        if out and last <= out[-1].last_offset:
            raise CorruptIndexError(path, f"entry {pos // ENTRY_SIZE}: last offset {last} does "
                                    f"not follow {out[-1].last_offset}")
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def read_entries(path: str) -> list[AbortedTxn]:
    """The entries of a ``.txnindex`` file; none when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        size = os.fstat(fd).st_size
        return decode_entries(os.pread(fd, size, 0), path)
    finally:
        os.close(fd)


class TransactionIndex:
    """The writable ``.txnindex`` of one segment, created by its first entry."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = read_entries(path) if os.path.exists(path) else []
        self._unsynced = False              # written since the last flush

    @contextlib.contextmanager
    def _file(self) -> Iterator[int]:
        """The file open for one change (created if need be); closed after it."""
        fd = diskio.ops.open(self.path, os.O_RDWR | os.O_CREAT)
        try:
            self._unsynced = True
            yield fd
        finally:
            diskio.ops.close(fd)

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry; raises ``OSError`` (count unchanged) or ``ValueError`` for a last
        offset that does not increase."""
        if self.entries and txn.last_offset <= self.entries[-1].last_offset:
            raise ValueError(f"{self.path}: aborted transaction ending at {txn.last_offset} "
                             f"does not follow {self.entries[-1].last_offset}")
        with self._file() as fd:
            diskio.write_fully(fd, txn.encode(), len(self.entries) * ENTRY_SIZE)
        self.entries.append(txn)

    def collect(self, start: int, end: int) -> tuple[list[AbortedTxn], bool]:
        """Entries overlapping ``[start, end)``, and whether the search may stop here (an
        entry's last stable offset reached ``end``)."""
        found = [t for t in self.entries if t.last_offset >= start and t.first_offset < end]
        return found, any(t.last_stable_offset >= end for t in self.entries
                          if t.last_offset >= start)

    def truncate(self, offset: int) -> None:
        """Drop entries whose marker is at or past ``offset``."""
        keep = [t for t in self.entries if t.last_offset < offset]
        if len(keep) == len(self.entries):
            return
        with self._file() as fd:
            diskio.ops.ftruncate(fd, len(keep) * ENTRY_SIZE)
        self.entries = keep

    def reset(self) -> None:
        """Drop every entry (before recovery rebuilds them)."""
        if self.entries or os.path.exists(self.path):
            with self._file() as fd:
                diskio.ops.ftruncate(fd, 0)
        self.entries = []

    def trim(self) -> None:
        """Cut bytes past the last entry (a failed write's leftovers)."""
        if self._unsynced and os.stat(self.path).st_size != len(self.entries) * ENTRY_SIZE:
            with self._file() as fd:
                diskio.ops.ftruncate(fd, len(self.entries) * ENTRY_SIZE)

    def flush(self) -> None:
        """fdatasync what was written since the last flush (a descriptor opened for it: an
        fsync covers the file's pages whichever descriptor wrote them)."""
        if self._unsynced:
            fd = diskio.ops.open(self.path, os.O_RDONLY)
            try:
                diskio.ops.fdatasync(fd)
            finally:
                diskio.ops.close(fd)
            self._unsynced = False

    def close(self) -> None:
        """Nothing stays open between calls: kept for the segment's lifecycle."""

    def rename(self, new_path: str) -> None:
        if os.path.exists(self.path):
            diskio.ops.rename(self.path, new_path)
        self.path = new_path

    def validate(self, base_offset: int, next_offset: int) -> None:
        """Raise ``CorruptIndexError`` for an entry whose marker lies outside the segment."""
        for i, t in enumerate(self.entries):
            if not base_offset <= t.last_offset < next_offset or t.first_offset > t.last_offset:
                raise CorruptIndexError(self.path, f"entry {i} (producer {t.producer_id}, "
                                        f"offsets {t.first_offset}..{t.last_offset}) is outside "
                                        f"the segment [{base_offset}, {next_offset})")


def collect_aborted(segments: Sequence, start: int, end: int) -> list[AbortedTxn]:
    """Aborted transactions overlapping ``[start, end)``, from every segment's ``.txnindex``
    (a marker may lie in a later segment than its data, even the active one). Files are read,
    not the segments' index objects: the cleaner runs off the thread that appends."""
    out: list[AbortedTxn] = []
    for seg in segments:
        path = os.path.join(seg.dir, files.segment_name(seg.base_offset, files.TXNINDEX_SUFFIX)
                            + seg.suffix)
        out += [t for t in read_entries(path) if t.last_offset >= start and t.first_offset < end]
    return sorted(out, key=lambda t: t.first_offset)


class AbortedTxnFilter:
    """Which batches of a walk in offset order belong to aborted transactions, and whether a
    marker may go: Kafka's read_committed fetcher and its CleanedTransactionMetadata.

    ``is_aborted(batch)``: a transactional data batch of a producer inside an aborted
    transaction (from its first offset to its ABORT marker): a read_committed reader skips
    it, the cleaner drops it and keeps its keys out of the offset map. ``on_marker(batch)``:
    no data batch of the marker's transaction was seen in the walk, so the cleaner may let
    the marker go (after a delete horizon). Only decided transactions are walked (data
    below the last stable offset), so every abort has its ``.txnindex`` entry."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda t: t.first_offset)
        self._next = 0
        self._aborted: dict[int, list] = {}       # producer id -> [AbortedTxn, data seen]
        self._committed: set[int] = set()          # producers with committed data seen
        self.by_marker = {t.last_offset: t for t in self._pending}

    def _advance(self, offset: int) -> None:
        """Take in the aborted transactions begun by ``offset`` (a batch's last offset); one
        whose ABORT marker lies before it ended before this walk reached it, and would
        otherwise hide the producer's later batches (a walk that starts after the marker:
        the cleaner's later group of segments, a consumer that seeked)."""
        pending = self._pending
        while self._next < len(pending) and pending[self._next].first_offset <= offset:
            txn = pending[self._next]
            if txn.last_offset >= offset:
                self._aborted[txn.producer_id] = [txn, False]
            self._next += 1

    def is_aborted(self, batch: RecordBatch) -> bool:
        """A data batch: True if it belongs to an aborted transaction."""
        self._advance(batch.last_offset)
        if not batch.is_transactional or batch.producer_id < 0:
            return False
        entry = self._aborted.get(batch.producer_id)
        if entry is not None:
            entry[1] = True
            return True
        self._committed.add(batch.producer_id)
        return False

    def on_marker(self, batch: RecordBatch) -> bool:
        """A control batch: True if it may go (no data of its transaction seen)."""
        self._advance(batch.last_offset)
        ctype = batch.control_type()
        pid = batch.producer_id
        if ctype == CONTROL_ABORT:
            entry = self._aborted.pop(pid, None)
            return entry is None or not entry[1]
        if ctype == CONTROL_COMMIT:
            seen = pid in self._committed
            self._committed.discard(pid)
            return not seen
        return False


def is_visible(batch: RecordBatch, aborted: AbortedTxnFilter | None) -> bool:
    """Whether a reader walking batches in offset order sees ``batch``'s records: never a
    control batch (a transaction marker), and with ``aborted`` (``read_committed``: the
    aborted transactions overlapping the walk) never a batch of an aborted transaction. Call
    it for every batch of the walk, in order: a marker ends its transaction in ``aborted``.
    The consumer, Spark's reader and the cleaner's offset map all skip by this rule. Raises
    ``CorruptRecordError`` for a marker whose control record is malformed."""
    if batch.is_control:
        if aborted is not None:
            aborted.on_marker(batch)
        return False
    return aborted is None or not aborted.is_aborted(batch)
