"""Kafka's log cleaner for one partition log: keep the latest record of every key.

A compacted log has three sections (as Kafka's LogCleaner divides it)::

    log start       first dirty               first uncleanable          log end
        | clean (cleaned before) | cleanable (dirty) | uncleanable           |
                                                      ^ min(last stable offset, active segment
                                                        base, first segment younger than
                                                        min.compaction.lag.ms), rounded down
                                                        to the base of the segment holding it

A pass (``clean``):

1. builds an offset map, key -> latest offset, over the cleanable section (control batches
   add no key). The map is bounded (``dedupe_buffer_bytes``); when it fills, the pass stops
   at the last whole batch that fit (``map_end``) and cleans up to there — a partial clean.
   The first batch is always taken whole, so every pass makes progress;
2. groups the inactive segments from the log start up to ``map_end`` (total size <=
   ``segment.bytes``, offsets within int32 of the group's base, the index fits
   ``segment.index.bytes``) and rewrites each group into one ``.cleaned`` segment at the
   group's first base offset, keeping a record iff its offset > ``map_end``, or it has a key,
   its offset >= ``map[key]`` and it is not a tombstone whose delete horizon has passed;
3. installs each group with ``PartitionLog.replace_segments`` (the swap below), lowest group
   first, then reports ``next_dirty_offset = map_end + 1`` for ``cleaner-offset-checkpoint``.

Batch layout after cleaning: a batch whose records all stay (and needs no new delete horizon)
is copied byte for byte. Otherwise the kept records are re-encoded into one batch with the
same base offset, offset deltas, codec, timestamp type, producer id/epoch, base sequence and
leader epoch — offsets and sequences are preserved, gaps appear, and every reader here skips
them (``LogSegment.translate_offset`` and ``PartitionReader`` look for the first batch whose
last offset reaches the wanted one). A batch left without records is dropped, except the
last batch of each group, which stays as a 61-byte header (``recordsCount`` 0, its original
``lastOffsetDelta`` and ``maxTimestamp``, Kafka's ``writeEmptyHeader``): it keeps the
group's offset range, which the startup repair needs (a ``.swap`` replaces the segments
with bases in ``[swap base, swap next offset)``), and the segment's largest timestamp.

Tombstones: the first pass that keeps a batch holding a tombstone re-encodes it with the
delete-horizon bit and ``baseTimestamp = now + delete.retention.ms``; a later pass drops the
tombstones of a batch whose horizon has passed (never in the pass that sets it, so they stay
at least ``delete.retention.ms``).

Transactions (``txnindex.AbortedTxnFilter``): nothing at or past the last stable offset is cleaned.
Records of aborted transactions are dropped whatever their keys and never enter the offset map;
a COMMIT/ABORT marker stays while data of its transaction may remain, then gets a delete
horizon and goes after it; a kept ABORT marker carries its ``.txnindex`` entry into the
cleaned segment. A producer's last batch stays (as a header if it lost every record) while the
producer is in the partition's producer table, so its sequence survives a replay.

Crash safety (``PartitionLog.replace_segments``, and ``_finish_leftovers`` in ``loader.py``):
``.cleaned`` is written through a ``LogSegment`` (log and both indexes) and fsynced; then
``.cleaned`` -> ``.swap``, replaced segments -> ``.deleted``, ``.swap`` -> final names, each
phase followed by a directory fsync. A crash anywhere leaves every group either as it was or
as cleaned: open removes ``.cleaned``/``.deleted`` files and installs complete swaps. Groups
are swapped one at a time, lowest first (disk use stays one group above the log, as in
Kafka), so after a crash a prefix of the groups is cleaned; the checkpoint is written only
after a complete pass, so the next pass redoes the rest. Per key the log always holds the
latest record (or nothing, for an expired tombstone): older records of a key sit at lower
offsets, in the same or an earlier group.

Readers: the broker reads through ``LogSegment`` file descriptors, and ``PartitionReader``
through read-only maps; on Linux both stay valid after the rename and the unlink, so a reader
in the middle of a swapped segment keeps reading the pre-clean bytes, which are consistent
(every latest record is in them too). To see the cleaned segment a reader must re-list when
the segment-set generation changes: the broker must bump it on every swap
(``PartitionLog.swap_count`` changes even when the segment list keeps its shape);
``PartitionReader`` re-lists on a generation change and drops maps whose inode was replaced.
A listing can fall between the renames, when no ``.log`` covers the group: the reader lists
the ``.swap`` for its base then, so it never reads past the group's offsets.

Pure parts: section boundaries, dirty ratio, eligibility and grouping take ``SegmentMeta``
values and ``now_ms``; only the map build and the recopy read files.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from hashlib import md5
from typing import Final

from mq.log import files
from mq.log.batch import RecordBatch
from mq.log.builder import BatchBuilder
from mq.log.cleaner_policy import (
    CleanableRange,
    cleanable_range,
    dirty_ratio,
    filthiest,
    group_segments,
    max_compaction_delay_ms,
    resolve_first_dirty_offset,
    should_clean,
)
from mq.log.layout import (
    ATTRIBUTES_OFFSET,
    CONTROL_MASK,
    CRC_OFFSET,
    HEADER,
    MAGIC,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    crc32c,
    field,
)
from mq.log.log import PartitionLog
from mq.log.policy import SegmentMeta
from mq.log.segment import LogSegment
from mq.log.txnindex import AbortedTxn, AbortedTxnFilter, collect_aborted, is_visible

__all__ = [
    "CLEANER_OFFSET_CHECKPOINT",
    "CleanableRange",
    "CleanerConfig",
    "CleanerStats",
    "clean",
    "cleanable_range",
    "dirty_ratio",
    "filthiest",
    "group_segments",
    "max_compaction_delay_ms",
    "read_cleaner_checkpoint",
    "resolve_first_dirty_offset",
    "should_clean",
    "update_cleaner_checkpoint",
    "write_cleaner_checkpoint",
]

log = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT: Final = "cleaner-offset-checkpoint"
# What one map entry costs in CPython, measured: ~52 bytes of dict slot, <= 49 bytes of key
# (a key under 16 bytes, or its 16-byte MD5), 32 bytes of int. Kafka's SkimpyOffsetMap
# charges 24 (16-byte MD5 + 8-byte offset); ours is the honest figure for this process.
BYTES_PER_MAP_ENTRY: Final = 136
_CRC: Final = field("crc")
_RAW_KEY_MAX: Final = 16       # shorter keys are stored as they are: they never equal an MD5

Swap = Callable[[LogSegment, list[LogSegment], int], None]


@dataclasses.dataclass(frozen=True, slots=True)
class CleanerConfig:
    """Broker-wide cleaner settings (``log.cleaner.*``)."""

    dedupe_buffer_bytes: int = 128 * 1024 * 1024     # log.cleaner.dedupe.buffer.size
    dedupe_buffer_load_factor: float = 0.9           # log.cleaner.io.buffer.load.factor

    @property
    def map_capacity(self) -> int:
        """Keys one pass may map (at least 1: a pass always takes one batch)."""
        usable = self.dedupe_buffer_bytes * self.dedupe_buffer_load_factor
        return max(1, int(usable // BYTES_PER_MAP_ENTRY))


@dataclasses.dataclass(slots=True)
class CleanerStats:
    """What a pass did. ``next_dirty_offset`` goes to ``cleaner-offset-checkpoint`` when
    ``completed``; an interrupted pass leaves it at ``first_dirty_offset``."""

    bytes_read: int = 0             # sizes of the segments recopied (LogCleanerTest)
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    segments: int = 0               # segments recopied
    elapsed: float = 0.0            # seconds, wall clock of the whole pass
    map_bytes_read: int = 0
    map_records_read: int = 0
    map_entries: int = 0
    groups_swapped: int = 0
    first_dirty_offset: int = 0
    first_uncleanable_offset: int = 0
    map_end_offset: int = -1        # last offset the map covers (-1 before the first pass)
    next_dirty_offset: int = 0
    next_delete_horizon_ms: int = NO_TIMESTAMP   # earliest horizon of a kept tombstone batch
    completed: bool = False
    stopped_reason: str | None = None

    @property
    def throughput_mb_s(self) -> float:
        """Recopy throughput in MB/s, Kafka's MB (2^20 bytes): bytes read / elapsed."""
        return self.bytes_read / (1 << 20) / self.elapsed if self.elapsed > 0 else 0.0


# --- offset map -------------------------------------------------------------------------------

def _slot(key) -> bytes:
    """The map's key for a record key: the bytes themselves when short, else their MD5
    (inlined in the two loops below, which run once per record)."""
    return bytes(key) if len(key) < _RAW_KEY_MAX else md5(key).digest()


def _build_offset_map(segments: Sequence[LogSegment], first_dirty: int, first_uncleanable: int,
                      capacity: int, stats: CleanerStats, should_stop: Callable[[], bool],
                      txns: AbortedTxnFilter | None = None
                      ) -> tuple[dict[bytes, int], int] | None:
    """Map key -> latest offset over ``[first_dirty, first_uncleanable)``; returns the map and
    the last offset of the last batch it covers wholly (``first_dirty - 1`` if none), or None
    when ``should_stop`` said so. Only visible batches add keys (``txnindex.is_visible``: not
    markers, not aborted transactions' data). Raises ``CorruptRecordError``."""
    offsets: dict[bytes, int] = {}
    map_end = first_dirty - 1
    for seg in segments:
        if seg.base_offset >= first_uncleanable:
            break
        if seg.next_offset <= first_dirty:
            continue
        found = seg.translate_offset(first_dirty) if first_dirty > seg.base_offset else None
        if first_dirty > seg.base_offset and found is None:
            continue
        for batch in seg.batches(found.position if found is not None else 0):
            if batch.last_offset < first_dirty:
                continue
            if should_stop():
                return None
            batch.validate()
            stats.map_bytes_read += batch.size
            if not is_visible(batch, txns):
                map_end = batch.last_offset       # markers and aborted data add no key
                continue
            records = batch.records()
            stats.map_records_read += len(records)
            if len(offsets) + len(records) <= capacity or map_end < first_dirty:
                # The common case, as one comprehension (~2x a plain loop per record).
                offsets.update({
                    (bytes(key) if len(key) < _RAW_KEY_MAX else md5(key).digest()): rec.offset
                    for rec in records
                    if (key := rec.key) is not None and rec.offset >= first_dirty})
                map_end = batch.last_offset
                continue
            for rec in records:
                key = rec.key
                if key is None or rec.offset < first_dirty:
                    continue
                slot = _slot(key)
                if len(offsets) >= capacity and slot not in offsets:
                    # Full: this batch stays beyond map_end. Entries already taken from it
                    # point past map_end, which only removes older records of their keys.
                    stats.map_entries = len(offsets)
                    return offsets, map_end
                offsets[slot] = rec.offset
            map_end = batch.last_offset
    stats.map_entries = len(offsets)
    return offsets, map_end


# --- recopy -----------------------------------------------------------------------------------

def _empty_header(batch: RecordBatch) -> bytearray:
    """Kafka's ``writeEmptyHeader``: the batch's offsets, producer fields and max timestamp,
    no records, no codec."""
    attrs = batch.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK)
    out = bytearray(RECORD_BATCH_OVERHEAD)
    HEADER.pack_into(out, 0, batch.base_offset, MIN_BATCH_LENGTH,
                     batch.partition_leader_epoch, MAGIC, 0, attrs, batch.last_offset_delta,
                     NO_TIMESTAMP, batch.max_timestamp, batch.producer_id, batch.producer_epoch,
                     batch.base_sequence, 0)
    _CRC.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return out


class _Recopy:
    """The keep rule of one pass, applied batch by batch."""

    __slots__ = ("aborted", "delete_retention_ms", "keep_last", "map_end", "now_ms", "offsets",
                 "stats", "txns")

    def __init__(self, offsets: dict[bytes, int], map_end: int, now_ms: int,
                 delete_retention_ms: int, stats: CleanerStats,
                 aborted: Sequence[AbortedTxn] = (), keep_last: Mapping[int, int] | None = None
                 ) -> None:
        self.offsets = offsets
        self.map_end = map_end
        self.now_ms = now_ms
        self.delete_retention_ms = delete_retention_ms
        self.stats = stats
        self.aborted = aborted
        # producer id -> last offset of its last batch: kept (as a header at least) while the
        # producer is known, so its sequence survives a restart's replay (Kafka does too).
        self.keep_last = keep_last or {}
        self.txns = AbortedTxnFilter(aborted)

    def start_group(self) -> None:
        """Each group of segments is walked with a tracker of its own (as in Kafka)."""
        self.txns = AbortedTxnFilter(self.aborted)

    def marker_txn(self, batch: RecordBatch) -> AbortedTxn | None:
        """The ``.txnindex`` entry a kept ABORT marker carries into the cleaned segment."""
        return self.txns.by_marker.get(batch.base_offset) if batch.is_control else None

    def must_keep(self, batch: RecordBatch) -> bool:
        """Its header must stay even without records: the producer's last batch."""
        return self.keep_last.get(batch.producer_id) == batch.last_offset

    def filter(self, batch: RecordBatch) -> tuple[memoryview | bytearray | None, bool]:
        """``(bytes to write or None, unchanged)`` for one batch."""
        stats = self.stats
        if batch.base_offset > self.map_end:
            # Past the map: not examined yet.
            stats.records_read += batch.records_count
            stats.records_kept += batch.records_count
            return batch.buffer, True
        if batch.is_control:
            return self._filter_marker(batch)
        if self.txns.is_aborted(batch):
            stats.records_read += batch.records_count
            return None, False
        records = batch.records()
        stats.records_read += len(records)
        horizon = batch.delete_horizon_ms
        get = self.offsets.get
        # Kept: keyed, and no later record of the key in the map (a comprehension, ~2x a loop).
        kept = [rec for rec in records if (key := rec.key) is not None and rec.offset >= get(
            bytes(key) if len(key) < _RAW_KEY_MAX else md5(key).digest(), -1)]   # _slot
        tombstones = any(rec.value is None for rec in kept)
        if tombstones and 0 <= horizon <= self.now_ms:
            kept = [rec for rec in kept if rec.value is not None]      # horizon passed
            tombstones = False
        stats.records_kept += len(kept)
        needs_horizon = tombstones and horizon < 0
        if needs_horizon:
            horizon = self.now_ms + self.delete_retention_ms      # first pass keeping them
        if tombstones and (stats.next_delete_horizon_ms < 0
                           or horizon < stats.next_delete_horizon_ms):
            stats.next_delete_horizon_ms = horizon
        if not kept:
            return None, False          # also a header left empty by an earlier pass
        if len(kept) == len(records) and not needs_horizon:
            return batch.buffer, True
        builder = BatchBuilder(compression=batch.compression,
                               timestamp_type=batch.timestamp_type,
                               producer_id=batch.producer_id,
                               producer_epoch=batch.producer_epoch,
                               base_sequence=batch.base_sequence,
                               is_transactional=batch.is_transactional,
                               partition_leader_epoch=batch.partition_leader_epoch,
                               base_offset=batch.base_offset, delete_horizon_ms=horizon)
        base = batch.base_offset
        for rec in kept:
            builder.append(rec.timestamp, rec.key, rec.value, rec.headers,
                           offset_delta=rec.offset - base)
        return builder.build(), False

    def _filter_marker(self, batch: RecordBatch) -> tuple[memoryview | bytearray | None, bool]:
        """A transaction marker stays while data of its transaction may remain; then it gets
        a delete horizon, and goes in a pass after it (``txnindex.AbortedTxnFilter``)."""
        self.stats.records_read += batch.records_count
        if not self.txns.on_marker(batch):
            self.stats.records_kept += batch.records_count
            return batch.buffer, True
        horizon = batch.delete_horizon_ms
        if 0 <= horizon <= self.now_ms:
            return None, False
        self.stats.records_kept += batch.records_count
        if horizon >= 0:
            return batch.buffer, True
        record = batch.records()[0]
        builder = BatchBuilder(timestamp_type=batch.timestamp_type,
                               producer_id=batch.producer_id,
                               producer_epoch=batch.producer_epoch,
                               is_transactional=True, is_control=True,
                               partition_leader_epoch=batch.partition_leader_epoch,
                               base_offset=batch.base_offset,
                               delete_horizon_ms=self.now_ms + self.delete_retention_ms)
        builder.append(record.timestamp, record.key, record.value, record.headers)
        return builder.build(), False


def _cleaned_paths(directory: str, base: int) -> list[str]:
    return [os.path.join(directory, files.segment_name(base, kind) + files.CLEANED_SUFFIX)
            for kind in files.SEGMENT_FILE_SUFFIXES]


def _write_cleaned(plog: PartitionLog, old: Sequence[LogSegment], recopy: _Recopy,
                   should_stop: Callable[[], bool]) -> tuple[LogSegment, bool] | None:
    """Recopy ``old`` into one fsynced ``.cleaned`` segment; returns it and whether it differs
    from ``old`` (None when stopped). Removes its files if anything goes wrong."""
    base = old[0].base_offset
    files.remove_quietly(_cleaned_paths(plog.dir, base))
    new = LogSegment(plog.dir, base, plog.config, suffix=files.CLEANED_SUFFIX,
                     now_ms=old[0].created_ms)
    stats = recopy.stats
    changed = len(old) > 1
    recopy.start_group()
    try:
        for seg in old:
            stats.bytes_read += seg.size
            stats.segments += 1
            dropped: RecordBatch | None = None
            for batch in seg.batches():
                if should_stop():
                    new.delete()
                    return None
                batch.validate()
                out, unchanged = recopy.filter(batch)
                changed = changed or not unchanged
                if out is None and recopy.must_keep(batch):
                    out = _empty_header(batch)     # the producer's last sequence stays
                if out is None:
                    dropped = batch
                    continue
                dropped = None
                _append(new, out, recopy.marker_txn(batch))
            if dropped is not None and seg is old[-1]:
                _append(new, _empty_header(dropped))     # keeps the group's offset range
        new.on_become_inactive()
        mtime = max(os.stat(seg.log_path).st_mtime_ns for seg in old)
        os.utime(new.log_path, ns=(mtime, mtime))   # Kafka: the cleaned file keeps the mtime
        new.flush()
    except Exception:
        new.delete()
        raise
    except BaseException:
        new.close_without_index_changes()   # a crash: leave the files as they are
        raise
    stats.bytes_written += new.size
    return new, changed


def _append(seg: LogSegment, data, aborted_txn: AbortedTxn | None = None) -> None:
    batch = RecordBatch(data)
    seg.append(data, last_offset=batch.last_offset, max_timestamp=batch.max_timestamp,
               offset_of_max_timestamp=batch.last_offset, aborted_txn=aborted_txn)


def _active_meta(seg: LogSegment) -> SegmentMeta:
    """What a pass needs of the active segment — its base and size — read from attributes.
    A background cleaner runs ``clean`` off the appending thread, where ``seg.meta()`` could
    create the segment's lazy index maps while an append creates them too, or ``fstat`` the
    descriptor of an empty active segment that a roll has just closed."""
    return SegmentMeta(base_offset=seg.base_offset, size_bytes=seg.size,
                       next_offset=seg.base_offset, largest_timestamp=NO_TIMESTAMP)


def clean(plog: PartitionLog, now_ms: int, config: CleanerConfig | None = None, *,
          first_dirty_offset: int | None = None, last_stable_offset: int | None = None,
          swap: Swap | None = None,
          should_stop: Callable[[], bool] | None = None) -> CleanerStats:
    """One cleaning pass over ``plog`` (see the module doc); returns its stats.

    ``first_dirty_offset`` is the checkpointed value (None: the log start; out of range: reset
    to it). ``last_stable_offset`` defaults to the high watermark. ``swap(new, old, now_ms)``
    installs one group; the default, ``plog.replace_segments``, must run on the thread that
    appends to the log — a background cleaner passes a function that runs it there.
    ``should_stop`` is polled between batches; a stop (or a swap refused because retention
    removed the segments meanwhile) ends the pass with ``completed`` False, its ``.cleaned``
    files removed and every finished group in place.

    Raises ``ValueError`` for a topic without ``compact`` in ``cleanup.policy``,
    ``CorruptRecordError`` for an invalid batch (nothing is swapped for its group) and
    ``OSError`` from the file system.
    """
    if not plog.config.compact_enabled:
        raise ValueError(f"{plog.dir}: cleanup.policy {plog.config.cleanup_policy!r} does "
                         "not include compact")
    started = time.perf_counter()
    config = config or CleanerConfig()
    stop = should_stop or (lambda: False)
    install: Swap = swap or plog.replace_segments
    segments = list(plog.segments)
    metas = [seg.meta() for seg in segments[:-1]] + [_active_meta(segments[-1])]
    first_dirty, _ = resolve_first_dirty_offset(first_dirty_offset, plog.log_start_offset,
                                                plog.log_end_offset)
    lso = plog.last_stable_offset if last_stable_offset is None else last_stable_offset
    rng = cleanable_range(metas, first_dirty, segments[-1].base_offset, lso, now_ms,
                          plog.config.min_compaction_lag_ms)
    stats = CleanerStats(first_dirty_offset=first_dirty,
                         first_uncleanable_offset=rng.first_uncleanable_offset,
                         next_dirty_offset=first_dirty)
    aborted = collect_aborted(segments, segments[0].base_offset, rng.first_uncleanable_offset)
    # A copy taken in one C call: the appending thread may change the table meanwhile.
    producers = dict(plog.producers.producers)
    keep_last = {pid: e.batches[-1].last_offset for pid, e in producers.items() if e.batches}
    try:
        built = _build_offset_map(segments, first_dirty, rng.first_uncleanable_offset,
                                  config.map_capacity, stats, stop, AbortedTxnFilter(aborted))
        if built is None:
            stats.stopped_reason = "stopped"
            return stats
        offsets, map_end = built
        stats.map_end_offset = map_end
        recopy = _Recopy(offsets, map_end, now_ms, plog.config.delete_retention_ms, stats,
                         aborted, keep_last)
        groups = group_segments(metas[:-1], end_offset=map_end + 1,
                                max_bytes=plog.config.segment_bytes,
                                max_index_bytes=plog.config.segment_index_bytes,
                                index_interval_bytes=plog.config.index_interval_bytes)
        for start, stop_at in groups:
            old = segments[start:stop_at]
            written = _write_cleaned(plog, old, recopy, stop)
            if written is None:
                stats.stopped_reason = "stopped"
                return stats
            new, changed = written
            if not changed:
                new.delete()           # byte-identical: keep the original, readers undisturbed
                continue
            try:
                install(new, old, now_ms)
            except ValueError as err:
                if new.suffix != files.CLEANED_SUFFIX:
                    raise                # refused half-way: reopening the log finishes it
                new.delete()
                stats.stopped_reason = str(err)
                log.info("%s: cleaning stopped: %s", plog.dir, err)
                return stats
            except BaseException:
                if new not in plog.segments:
                    new.close_without_index_changes()
                raise
            stats.groups_swapped += 1
        stats.next_dirty_offset = map_end + 1
        stats.completed = True
    finally:
        stats.elapsed = time.perf_counter() - started
    log.info("%s: cleaned %d segment(s) up to offset %d: %d -> %d bytes, %d of %d records "
             "kept, %.1f MB/s", plog.dir, stats.segments, stats.map_end_offset,
             stats.bytes_read, stats.bytes_written, stats.records_kept, stats.records_read,
             stats.throughput_mb_s)
    return stats


# --- cleaner-offset-checkpoint ---------------------------------------------------------------

def read_cleaner_checkpoint(data_dir: str) -> dict[tuple[str, int], int]:
    """First dirty offset per partition from ``<data_dir>/cleaner-offset-checkpoint``. A
    missing or damaged file is empty (logged): the cleaner then starts from the log start,
    which costs work, never data."""
    path = os.path.join(data_dir, CLEANER_OFFSET_CHECKPOINT)
    try:
        return files.read_checkpoint(path)
    except files.CheckpointError as err:
        log.warning("ignoring damaged checkpoint: %s", err)
        return {}


def write_cleaner_checkpoint(data_dir: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """Replace the checkpoint atomically (Kafka's text format, ``files.write_checkpoint``)."""
    files.write_checkpoint(os.path.join(data_dir, CLEANER_OFFSET_CHECKPOINT), offsets)


def update_cleaner_checkpoint(data_dir: str, updates: Mapping[tuple[str, int], int] | None = None,
                              remove: Iterable[tuple[str, int]] = ()) -> dict[tuple[str, int], int]:
    """Set and drop entries (Kafka's ``updateCheckpoints``); returns the new content."""
    offsets = read_cleaner_checkpoint(data_dir)
    offsets.update(updates or {})
    for key in remove:
        offsets.pop(key, None)
    write_cleaner_checkpoint(data_dir, offsets)
    return offsets
