"""Idempotent and transactional producer state of one partition (Kafka's ProducerStateManager).

Per producer id: its epoch, the coordinator epoch of its last transaction marker, the time of
its last batch, the first offset of its open transaction (-1: none) and the last five batches it
appended — enough to answer a retried batch with its original offsets instead of appending it
again (a producer keeps at most five requests in flight).

Rules for a producer's batch (epoch E, first sequence S, last sequence L; Kafka's
``ProducerAppendInfo``), checked before it is appended:

- same epoch and one of the five cached batches has exactly (S, L): a *duplicate*, answered
  with that batch's offsets, nothing appended;
- E below the producer's epoch: ``InvalidProducerEpochError`` (a newer producer took over);
- E above it (a bump): S must be 0, unless the producer had no epoch;
- same epoch: S must follow the last sequence (``0`` after 2^31 - 1), else
  ``OutOfOrderSequenceError``; a producer without state (new, or expired) may start anywhere;
- a non-transactional batch while the producer has a transaction open: ``InvalidTxnStateError``.

A transactional batch opens its producer's transaction at its base offset; a COMMIT or ABORT
marker closes it (a marker from an older coordinator epoch raises
``TransactionCoordinatorFencedError``). Sequences go on across transactions; a marker of a
newer epoch (a fence) starts the window over, and the next batch starts at sequence 0. The *first unstable offset* is the first offset of the earliest open transaction;
the last stable offset is the smaller of it and the high watermark.

Snapshots (``<20-digit offset>.snapshot``, Kafka's ``ProducerSnapshot`` v1, big-endian)::

    int16  version = 1
    uint32 crc32c of every byte from offset 6 to the end
    int32  entry count
    entry (46 bytes): producerId int64 | epoch int16 | lastSequence int32 | lastOffset int64 |
                      offsetDelta int32 | timestamp int64 | coordinatorEpoch int32 |
                      currentTxnFirstOffset int64 (-1: no open transaction)

The file name is the exclusive end of the state it holds. Only each producer's last batch is
kept (the five-batch window is not); a snapshot that fails its version, length or CRC check is
ignored and an older one is used.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import os
import struct
from collections.abc import Iterable
from typing import Final

from crc32c import crc32c

from mq import errors
from mq.log import files
from mq.log.batch import RecordBatch
from mq.log.layout import CONTROL_ABORT
from mq.log.txnindex import AbortedTxn

__all__ = ["BATCHES_TO_RETAIN", "BatchInfo", "CompletedTxn", "ProducerEntry",
           "ProducerStateManager", "read_snapshot", "rebuild", "replay", "replay_batch",
           "snapshot_offsets", "snapshot_path", "write_snapshot"]

BATCHES_TO_RETAIN: Final = 5
NO_PRODUCER_ID: Final = -1
NO_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
_INT32_MAX: Final = (1 << 31) - 1
log = logging.getLogger(__name__)

_SNAPSHOT_VERSION: Final = 1
_SNAPSHOT_HEAD: Final = struct.Struct(">hIi")           # version, crc, count
_SNAPSHOT_ENTRY: Final = struct.Struct(">qhiqiqiq")     # 46 bytes


@dataclasses.dataclass(frozen=True, slots=True)
class BatchInfo:
    """One appended batch of a producer: its sequences and offsets."""

    first_seq: int
    last_seq: int
    last_offset: int
    offset_delta: int           # last offset - first offset
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclasses.dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int = NO_EPOCH
    batches: collections.deque = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=BATCHES_TO_RETAIN))
    coordinator_epoch: int = -1
    last_timestamp: int = -1
    current_txn_first_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchInfo | None:
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker closed: its producer, first offset and the marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == _INT32_MAX)


class ProducerStateManager:
    """The producer table of one partition, and the open transactions' first offsets.

    ``map_end_offset`` is the exclusive end of the log the table reflects. Pure: the caller
    validates with ``check`` before appending and records with ``append``/``complete_txn``
    after the write succeeded."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self._open: list[tuple[int, int]] = []          # heap of (first offset, producer id)
        self.map_end_offset = 0

    # --- validation ---------------------------------------------------------------------------
    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
              transactional: bool, where: str = "") -> BatchInfo | None:
        """Validate a producer's batch (see the module doc); the duplicate it repeats, or None.

        Raises ``InvalidProducerEpochError``, ``OutOfOrderSequenceError`` or
        ``InvalidTxnStateError``."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        if epoch == entry.epoch:
            duplicate = entry.find_duplicate(first_seq, last_seq)
            if duplicate is not None:
                return duplicate
        if epoch < entry.epoch:
            raise errors.InvalidProducerEpochError(
                f"{where}producer {producer_id} epoch {epoch} is older than its current epoch "
                f"{entry.epoch}: a newer producer took over")
        if epoch > entry.epoch:
            if first_seq != 0 and entry.epoch != NO_EPOCH:
                raise errors.OutOfOrderSequenceError(
                    f"{where}producer {producer_id} starts epoch {epoch} at sequence "
                    f"{first_seq}, not 0")
        elif entry.epoch != NO_EPOCH and not _in_sequence(entry.last_seq, first_seq):
            raise errors.OutOfOrderSequenceError(
                f"{where}producer {producer_id} epoch {epoch}: sequence {first_seq} does not "
                f"follow {entry.last_seq}")
        if not transactional and entry.current_txn_first_offset >= 0:
            raise errors.InvalidTxnStateError(
                f"{where}producer {producer_id} sent a non-transactional batch while its "
                f"transaction from offset {entry.current_txn_first_offset} is open")
        return None

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int,
                     where: str = "") -> None:
        """Raises ``TransactionCoordinatorFencedError`` or ``InvalidProducerEpochError`` for a
        marker the partition must refuse."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if coordinator_epoch < entry.coordinator_epoch:
            raise errors.TransactionCoordinatorFencedError(
                f"{where}marker of coordinator epoch {coordinator_epoch} for producer "
                f"{producer_id}, which saw {entry.coordinator_epoch}")
        if epoch < entry.epoch:
            raise errors.InvalidProducerEpochError(
                f"{where}marker for producer {producer_id} at epoch {epoch}, below {entry.epoch}")

    # --- updates ------------------------------------------------------------------------------
    def append(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
               first_offset: int, last_offset: int, timestamp: int,
               transactional: bool) -> None:
        """Record a producer's batch that was just appended (or replayed from the log)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id)
        if epoch != entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
        if first_seq >= 0:
            entry.batches.append(BatchInfo(first_seq, last_seq, last_offset,
                                           last_offset - first_offset, timestamp))
        entry.last_timestamp = max(entry.last_timestamp, timestamp)
        if transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = first_offset
            heapq.heappush(self._open, (first_offset, producer_id))
        self.map_end_offset = max(self.map_end_offset, last_offset + 1)

    def complete_txn(self, producer_id: int, epoch: int, coordinator_epoch: int,
                     marker_offset: int, aborted: bool, timestamp: int) -> CompletedTxn | None:
        """Record a COMMIT/ABORT marker appended at ``marker_offset``; returns the transaction
        it closed, or None when the producer had none open here (Kafka's
        ``appendEndTxnMarker``: only a non-empty transaction completes). Sequences go on
        across transactions; only a new epoch starts the batch window over."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id)
        first = entry.current_txn_first_offset
        done = CompletedTxn(producer_id, first, marker_offset, aborted) if first >= 0 else None
        if epoch != entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
        entry.coordinator_epoch = coordinator_epoch
        entry.current_txn_first_offset = -1
        entry.last_timestamp = max(entry.last_timestamp, timestamp)
        self.map_end_offset = max(self.map_end_offset, marker_offset + 1)
        return done

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest open transaction, or None."""
        heap = self._open
        while heap:
            first, pid = heap[0]
            entry = self.producers.get(pid)
            if entry is not None and entry.current_txn_first_offset == first:
                return first
            heapq.heappop(heap)                  # closed (or expired) since it was pushed
        return None

    def aborted_txn(self, producer_id: int, marker_offset: int) -> AbortedTxn | None:
        """The ``.txnindex`` entry an ABORT marker of ``producer_id`` at ``marker_offset``
        would write, computed before the marker is appended (the entry goes in with it); None
        when the producer has no transaction open here (nothing to skip)."""
        entry = self.producers.get(producer_id)
        first = entry.current_txn_first_offset if entry is not None else -1
        if first < 0:
            return None
        others = [e.current_txn_first_offset for e in self.producers.values()
                  if e.current_txn_first_offset >= 0 and e.producer_id != producer_id]
        return AbortedTxn(producer_id, first, marker_offset,
                          min(others) if others else marker_offset + 1)

    def last_stable_offset(self, high_watermark: int) -> int:
        first = self.first_unstable_offset
        return high_watermark if first is None else min(first, high_watermark)

    def open_transactions(self) -> list[tuple[int, int]]:
        """``[(producer id, first offset)]`` of every open transaction, oldest first."""
        return sorted(((e.producer_id, e.current_txn_first_offset)
                       for e in self.producers.values() if e.current_txn_first_offset >= 0),
                      key=lambda item: item[1])

    def expire(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers without an open transaction whose last batch is older than
        ``expiration_ms`` (Kafka's producer.id.expiration.ms); returns how many."""
        doomed = [pid for pid, e in self.producers.items()
                  if e.current_txn_first_offset < 0 and now_ms - e.last_timestamp >= expiration_ms]
        for pid in doomed:
            del self.producers[pid]
        return len(doomed)

    def truncate_and_reload(self, entries: Iterable[ProducerEntry], map_end_offset: int) -> None:
        """Replace the table (a snapshot's entries), e.g. before a replay."""
        self.producers = {e.producer_id: e for e in entries}
        self._open = [(e.current_txn_first_offset, e.producer_id)
                      for e in self.producers.values() if e.current_txn_first_offset >= 0]
        heapq.heapify(self._open)
        self.map_end_offset = map_end_offset

    def __len__(self) -> int:
        return len(self.producers)


# --- snapshot files ---------------------------------------------------------------------------

def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, files.segment_name(offset, files.SNAPSHOT_SUFFIX))


def snapshot_offsets(directory: str) -> list[int]:
    """The offsets of the snapshot files in a partition directory, ascending."""
    out = []
    for name in os.listdir(directory):
        parsed = files.parse_segment_name(name)
        if parsed is not None and parsed[1] == files.SNAPSHOT_SUFFIX and not parsed[2]:
            out.append(parsed[0])
    return sorted(out)


def encode_snapshot(producers: Iterable[ProducerEntry]) -> bytes:
    body = bytearray(_SNAPSHOT_HEAD.size)
    count = 0
    for e in sorted(producers, key=lambda entry: entry.producer_id):
        last = e.batches[-1] if e.batches else None
        body += _SNAPSHOT_ENTRY.pack(
            e.producer_id, e.epoch, last.last_seq if last else NO_SEQUENCE,
            last.last_offset if last else -1, last.offset_delta if last else 0,
            e.last_timestamp, e.coordinator_epoch, e.current_txn_first_offset)
        count += 1
    struct.pack_into(">i", body, 6, count)
    struct.pack_into(">h", body, 0, _SNAPSHOT_VERSION)
    struct.pack_into(">I", body, 2, crc32c(memoryview(body)[6:]))
    return bytes(body)


def decode_snapshot(data: bytes, path: str = "<snapshot>") -> list[ProducerEntry]:
    """Raises ``CorruptRecordError`` for a wrong version, length or CRC."""
    if len(data) < _SNAPSHOT_HEAD.size:
        raise errors.CorruptRecordError(path, 0, f"snapshot of {len(data)} bytes is too short")
    version, crc, count = _SNAPSHOT_HEAD.unpack_from(data)
    if version != _SNAPSHOT_VERSION:
        raise errors.CorruptRecordError(path, 0, f"snapshot version {version}, not 1")
    if crc32c(memoryview(data)[6:]) != crc:
        raise errors.CorruptRecordError(path, 2, "snapshot CRC mismatch")
    if count < 0 or len(data) != _SNAPSHOT_HEAD.size + count * _SNAPSHOT_ENTRY.size:
        raise errors.CorruptRecordError(path, 6, f"snapshot of {len(data)} bytes does not hold "
                                        f"{count} entries")
    out = []
    for i in range(count):
        (pid, epoch, last_seq, last_offset, delta, ts, coord_epoch,
         txn_first) = _SNAPSHOT_ENTRY.unpack_from(data, _SNAPSHOT_HEAD.size + i * 46)
        entry = ProducerEntry(pid, epoch, coordinator_epoch=coord_epoch, last_timestamp=ts,
                              current_txn_first_offset=txn_first)
        if last_offset >= 0 and last_seq >= 0:
            first_seq = last_seq - delta if last_seq >= delta else \
                _INT32_MAX - (delta - last_seq) + 1
            entry.batches.append(BatchInfo(first_seq, last_seq, last_offset, delta, ts))
        out.append(entry)
    return out


def write_snapshot(directory: str, offset: int, producers: Iterable[ProducerEntry]) -> None:
    """Write ``<offset>.snapshot`` atomically, without an fsync (a reader checks its CRC and
    falls back to an older one and a replay); raises ``OSError`` (the caller decides)."""
    files.atomic_write(snapshot_path(directory, offset), encode_snapshot(producers),
                       durable=False)


def read_snapshot(directory: str, offset: int) -> list[ProducerEntry]:
    """Raises ``OSError`` or ``CorruptRecordError``."""
    path = snapshot_path(directory, offset)
    with open(path, "rb") as f:
        return decode_snapshot(f.read(), path)


def replay_batch(state: ProducerStateManager, batch: RecordBatch) -> CompletedTxn | None:
    """Apply one batch read back from the log to ``state`` (recovery, truncation, snapshot
    catch-up: no checks). Returns the transaction a COMMIT/ABORT marker closed, if any."""
    if batch.producer_id < 0:
        return None
    if batch.is_control:
        marker = batch.end_txn_marker()
        if marker is None:
            return None
        return state.complete_txn(batch.producer_id, batch.producer_epoch, marker[1],
                                  batch.base_offset, marker[0] == CONTROL_ABORT,
                                  batch.max_timestamp)
    state.append(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                 batch.last_sequence, batch.base_offset, batch.last_offset,
                 batch.max_timestamp, batch.is_transactional)
    return None


def rebuild(directory: str, segments: list, log_end_offset: int, *,
            recovered_from: int | None = None, clean_shutdown: bool = False
            ) -> tuple[ProducerStateManager, int]:
    """The producer state of a partition at ``log_end_offset``, as its open needs it, and the
    number of batches replayed: the newest valid snapshot at or below ``recovered_from`` (the
    first offset recovery validated; else the log end), then the batches from there replayed.
    The ``.txnindex`` entries from ``recovered_from`` on are written anew by that replay.
    Snapshots past the log end (cut by recovery) and damaged ones are removed. A data dir from
    before snapshots existed (a clean shutdown and no snapshot at all) holds no producer state:
    nothing is replayed."""
    limit = log_end_offset if recovered_from is None else min(recovered_from, log_end_offset)
    state = ProducerStateManager()
    offsets = snapshot_offsets(directory)
    files.remove_quietly(snapshot_path(directory, o) for o in offsets if o > log_end_offset)
    start = None
    for offset in reversed([o for o in offsets if o <= limit]):
        try:
            state.truncate_and_reload(read_snapshot(directory, offset), offset)
        except (OSError, errors.CorruptRecordError) as err:
            log.warning("ignoring producer snapshot: %s", err)
            files.remove_quietly([snapshot_path(directory, offset)])
            continue
        start = offset
        break
    if start is None:
        if clean_shutdown and not offsets and recovered_from is None:
            state.map_end_offset = log_end_offset
            return state, 0
        start = segments[0].base_offset if segments else log_end_offset
        state.map_end_offset = start
    return state, replay(state, segments, start, recovered_from)


def replay(state: ProducerStateManager, segments: list, start: int,
           rebuild_txn_indexes_from: int | None = None) -> int:
    """Apply every batch from offset ``start`` on; returns how many batches it read. The
    ``.txnindex`` entries of ABORT markers at or past ``rebuild_txn_indexes_from`` are
    written on the way (the segments' entries from there on must be gone already, as
    ``LogSegment.recover`` leaves them)."""
    read = 0
    for seg in segments:
        if seg.next_offset <= start:
            continue
        rebuild_txn = rebuild_txn_indexes_from is not None and \
            seg.next_offset > rebuild_txn_indexes_from
        found = seg.translate_offset(start) if start > seg.base_offset else None
        for batch in seg.batches(found.position if found is not None else 0):
            read += 1
            if batch.last_offset < start or batch.producer_id < 0:
                continue
            aborted = state.aborted_txn(batch.producer_id, batch.base_offset) \
                if rebuild_txn and batch.is_control and \
                batch.base_offset >= rebuild_txn_indexes_from else None
            done = replay_batch(state, batch)
            if done is not None and done.aborted and aborted is not None:
                seg.txn_index.append(aborted)
        state.map_end_offset = max(state.map_end_offset, seg.next_offset)
    return read
