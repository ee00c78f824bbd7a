"""One partition's log: an ordered set of segments in ``<topic>-<partition>/``.

Invariants:
- segments are sorted by base offset; each segment's offsets are >= its base and below the
  next segment's base; only the last (active) segment is appended to;
- ``log_start_offset`` <= ``high_watermark`` <= ``log_end_offset``; nothing below the log start
  offset is readable;
- retention deletes whole segments only, never the active one, never data at or above the high
  watermark; files pass through ``.deleted`` so a crash mid-delete is finished at open;
- open recovers (``mq.log.loader``): leftovers are finished or removed, every batch after the
  recovery point is validated (after an unclean shutdown), the log is truncated at the first
  torn or invalid batch and every later segment is dropped; broken or missing indexes are
  rebuilt; the producer state is loaded from a snapshot and the batches after it replayed.

Producers (``mq.log.producer_state``): a batch that carries a producer id is checked against
the partition's producer table before it is written. A retry of one of the producer's last
five batches is answered with that batch's offsets and not appended again; a sequence gap or a
stale epoch is refused. A COMMIT or ABORT marker closes the producer's transaction, and an
ABORT goes into the segment's ``.txnindex`` in the same append. The *last stable offset* is
the first offset of the earliest open transaction, or the high watermark. The table is
snapshotted at every roll and at close (``<offset>.snapshot``), and at a checkpoint once
enough went in since the last snapshot, so that a recovery replays from near its recovery
point.

Write failures (``docs/architecture.md``, "Write failures"): every write goes through
``diskio``, and a call that fails leaves the files and this object as before it, then raises
``LogWriteError``. A space error (``ENOSPC``, ``EDQUOT``) is contained that way and the log
stays writable: the same append succeeds once space returns. Anything else takes the log
*offline* (``offline`` holds why): an fsync that failed (its data may be gone from the page
cache while the kernel reports later fsyncs as clean: PostgreSQL's "fsyncgate"), any other
errno, or a failure that could not be put back (a torn tail). An offline log still serves reads
but refuses every write without touching the disk, and its close writes nothing, so the next
open recovers it from disk, from its last good fsync (Kafka's offline log dir).
"""

from __future__ import annotations

import bisect
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from mq.errors import (
    ClosedError,
    CorruptRecordError,
    InvalidRecordError,
    InvalidRequestError,
    LogWriteError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
)
from mq.log import diskio, files, loader, native, producer_state
from mq.log.batch import RecordBatch
from mq.log.builder import control_batch
from mq.log.columns import decode_columns
from mq.log.config import LogConfig
from mq.log.epochs import LeaderEpochCache
from mq.log.layout import CONTROL_ABORT, CONTROL_COMMIT, set_log_append_time, stamp_batch
from mq.log.loader import RecoveryReport
from mq.log.policy import retention_deletable, roll_reason
from mq.log.producer_state import ProducerStateManager
from mq.log.segment import FetchSlice, LogSegment
from mq.log.timestamps import UNLIMITED, check_timestamps
from mq.log.txnindex import AbortedTxn

__all__ = ["PartitionLog", "AppendInfo", "RecoveryReport", "EARLIEST_TIMESTAMP",
           "LATEST_TIMESTAMP", "MAX_TIMESTAMP"]

log = logging.getLogger(__name__)

# Special timestamps of Kafka's ListOffsets request.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


def _now_ms() -> int:
    return int(time.time() * 1000)


class AppendInfo(NamedTuple):
    """What an append did (a NamedTuple: built once per produce request, so kept cheap)."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time: int          # -1 unless the topic uses LogAppendTime
    records_count: int
    size: int
    duplicate: bool = False       # a producer's retry: nothing appended, the first offsets


class _CheckedHeader(RecordBatch):
    """The header facts of a batch ``native.check_batch`` checked and stamped: what
    ``PartitionLog.append`` reads of a ``RecordBatch`` (and its derived properties), with no
    buffer behind it."""

    __slots__ = ()

    def __init__(self, facts: tuple) -> None:     # not RecordBatch.__init__: no buffer to parse
        (self.batch_length, self.records_count, self.last_offset_delta, self.max_timestamp,
         self.producer_id, self.producer_epoch, self.base_sequence, self.attributes) = facts


class PartitionLog:
    """Append, read and manage one partition directory. Use ``PartitionLog.open``."""

    def __init__(self, directory: str, config: LogConfig, segments: list[LogSegment],
                 log_start_offset: int, recovery_point: int, report: RecoveryReport,
                 producers: ProducerStateManager | None = None) -> None:
        self.dir = directory
        self.config = config
        self.segments = segments
        self._bases = [s.base_offset for s in segments]
        segments[-1].pin()     # only the active segment keeps its files open (segment.py)
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self.high_watermark = self.log_end_offset
        self.recovery_report = report
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self.closed = False
        self.offline: str | None = None       # why the log refuses writes, once it does
        self.write_failures = 0               # failed writes, contained or not
        self.producers = producers if producers is not None else ProducerStateManager()
        # The producer snapshots on disk, ascending (``take_recovery_snapshot`` adds to them
        # and ``prune_recovery_snapshots`` removes those no recovery will start from).
        self._snapshots = [o for o in producer_state.snapshot_offsets(directory)
                           if o <= self.log_end_offset]
        self._pruned_below = -1
        self.leader_epochs = LeaderEpochCache(directory)
        self.leader_epochs.truncate_from_end(self.log_end_offset)
        name = os.path.basename(os.path.normpath(directory))
        parsed = files.parse_partition_dir(name)
        self.topic, self.partition = parsed if parsed else (name, 0)

    # --- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, directory: str, config: LogConfig | None = None, *, recovery_point: int = 0,
             log_start_offset: int = 0, clean_shutdown: bool = False,
             now_ms: int | None = None,
             on_segment: Callable[[], None] | None = None) -> PartitionLog:
        """Open (creating if needed) and recover a partition directory (``mq.log.loader``).

        ``recovery_point`` and ``log_start_offset`` come from the data dir's checkpoints;
        ``clean_shutdown`` from its marker. Without a clean shutdown every batch from the one
        holding the recovery point to the end is validated. ``on_segment()`` is called after
        each segment is loaded or recovered (progress of a long recovery).
        """
        config = config or LogConfig()
        loaded = loader.load(directory, config, recovery_point=recovery_point,
                             log_start_offset=log_start_offset,
                             clean_shutdown=clean_shutdown, now_ms=now_ms,
                             on_segment=on_segment)
        return cls(directory, config, loaded.segments, loaded.log_start_offset,
                   loaded.recovery_point, loaded.report, loaded.producers)

    # --- facts --------------------------------------------------------------------------------
    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"{self.dir}: log is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.offline is not None:
            raise LogWriteError(f"{self.topic}-{self.partition} is offline ({self.offline}); "
                                "it takes writes again after a broker restart recovers it",
                                offline=True)

    def _write_failed(self, what: str, err: OSError, *, contained: bool = True
                      ) -> LogWriteError:
        """Count a failed write and decide whether the log stays writable; returns the error
        to raise. ``contained``: the failed call put everything back as it was."""
        self.write_failures += 1
        reason = f"{what} failed: {err.strerror or err}"
        if not contained or not diskio.is_space_error(err) or self.active_segment.torn:
            self.take_offline(reason)
            return LogWriteError(f"{self.topic}-{self.partition}: {reason}; the partition is "
                                 "offline until a broker restart recovers it", offline=True)
        log.warning("%s: %s; nothing was written", self.dir, reason)
        return LogWriteError(f"{self.topic}-{self.partition}: {reason}; nothing was written")

    def take_offline(self, reason: str) -> None:
        """Refuse every write from now on (see the module doc); idempotent."""
        if self.offline is None:
            self.offline = reason
            log.error("%s: offline: %s. It serves reads but takes no writes until a restart "
                      "recovers it from disk", self.dir, reason)

    def update_config(self, config: LogConfig) -> None:
        """Apply a changed topic config (alter-config, broker start): rolls, retention and
        index sizes follow it from now on."""
        self.config = config
        for seg in self.segments:
            seg.config = config
        if self.offline is None:
            try:
                self.active_segment.resize_indexes(config.segment_index_bytes)
            except OSError as err:     # the index keeps its old size: only sparser or smaller
                log.warning("%s: index not resized: %s", self.dir, err)

    def segment_for(self, offset: int) -> int:
        """Index of the segment whose base is the floor of ``offset`` (or 0)."""
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    # --- append -------------------------------------------------------------------------------
    def append(self, batch, *, leader_epoch: int = 0, assign_offsets: bool = True,
               now_ms: int | None = None, from_client: bool = True,
               shared_head: bytes | None = None) -> AppendInfo:
        """Validate and append one RecordBatch v2; the broker's leader append.

        With ``assign_offsets`` the batch's baseOffset becomes the log end offset (stamped in
        place — neither it nor the leader epoch is covered by the CRC — in ``batch`` itself
        when it is a bytearray or a writable memoryview, else in a copy). Without it (recovery
        tools, tests of replicated appends) the batch keeps its offsets, which must be >= the
        log end offset. Raises ``CorruptRecordError`` for an invalid batch,
        ``InvalidRequestError`` for bytes that are more than one batch,
        ``MessageTooLargeError`` for a batch over ``max.message.bytes``, ``ValueError`` for
        offsets below the log end (without ``assign_offsets``: a bug of the caller),
        ``InvalidTimestampError`` for a client's batch whose timestamps the topic refuses at
        the wall clock (``mq.log.timestamps``) and ``LogWriteError`` when it could not be
        stored (then nothing of it was). A client's batch with a producer id is checked
        against the producer table (``InvalidProducerEpochError``,
        ``OutOfOrderSequenceError``, ``InvalidTxnStateError``); the broker's own
        (``from_client=False``: transactional offset commits, with no sequence) only updates
        it, as Kafka's coordinator appends.

        ``shared_head``: ``batch`` is memory another process may still write (a producer's
        arena, ``mq/client/arena.py``) and this is a copy of its header taken once. The
        checks, the offsets and the stamps use the copy; the CRC is checked on the bytes that
        reached the file (``LogSegment.append``), and a batch changed meanwhile is cut off
        again and refused with ``CorruptRecordError``: the log only ever holds what was
        checked, with no copy of the batch made here.

        The common case, a plain batch that needs no roll, index entry or new leader epoch,
        is done in one C call (``native.append_plain``) when the disk seam is the real one;
        everything else, and whatever that call declines, takes the Python path below.
        """
        if shared_head is None and assign_offsets and from_client and now_ms is None:
            plain = native.append_plain
            if plain is not None and type(diskio.ops) is diskio.DiskIO:
                try:
                    done = plain(self, batch, leader_epoch, _now_ms())
                except OSError as err:
                    raise self._write_failed("append", err) from err
                if done is not None:
                    return AppendInfo(*done)
        self._check_writable()
        if shared_head is not None and (not assign_offsets or
                                        self.config.message_timestamp_type == "LogAppendTime"):
            batch, shared_head = bytearray(batch), None   # rewritten whole: a private copy
        head = None
        parsed = None
        if shared_head is None and assign_offsets and from_client:
            base_offset = self.log_end_offset
            parsed = self._checked_in_c(batch, base_offset, leader_epoch)
        if parsed is not None:                  # checked and stamped (the reference: below)
            buf = batch
        else:
            buf, parsed, head, base_offset = self._check(batch, leader_epoch, assign_offsets,
                                                          from_client, shared_head)
        last_offset = base_offset + parsed.last_offset_delta
        pid = parsed.producer_id
        aborted = None
        marker = parsed.end_txn_marker() if pid >= 0 and parsed.is_control else None
        if marker is not None:
            ctype, coordinator_epoch = marker
            self.producers.check_marker(pid, parsed.producer_epoch, coordinator_epoch,
                                        self._where)
            if ctype == CONTROL_ABORT:
                aborted = self.producers.aborted_txn(pid, base_offset)
        elif pid >= 0 and assign_offsets and from_client and not parsed.is_control:
            if parsed.base_sequence < 0 or parsed.producer_epoch < 0:
                raise InvalidRecordError(f"{self._where}a batch of producer {pid} needs a "
                                         "base sequence and an epoch >= 0")
            duplicate = self.producers.check(pid, parsed.producer_epoch, parsed.base_sequence,
                                             parsed.last_sequence, parsed.is_transactional,
                                             self._where)
            if duplicate is not None:
                return AppendInfo(duplicate.first_offset, duplicate.last_offset,
                                  duplicate.timestamp, -1, parsed.records_count, 0, True)
        max_ts = parsed.max_timestamp
        log_append_time = -1
        if self.config.message_timestamp_type == "LogAppendTime" and assign_offsets:
            now_ms = _now_ms() if now_ms is None else now_ms
            set_log_append_time(buf, now_ms)
            max_ts = log_append_time = now_ms
        try:
            self._maybe_roll(len(buf), max_ts, base_offset, last_offset, now_ms)
            self.active_segment.append(buf, last_offset=last_offset, max_timestamp=max_ts,
                                       offset_of_max_timestamp=last_offset,
                                       aborted_txn=aborted, head=head)
        except OSError as err:
            raise self._write_failed("append", err) from err
        if marker is not None:
            self.producers.complete_txn(pid, parsed.producer_epoch, coordinator_epoch,
                                        base_offset, marker[0] == CONTROL_ABORT, max_ts)
        elif pid >= 0 and not parsed.is_control:
            self.producers.append(pid, parsed.producer_epoch, parsed.base_sequence,
                                  parsed.last_sequence, base_offset, last_offset, max_ts,
                                  parsed.is_transactional)
        if leader_epoch >= 0:
            self.leader_epochs.assign(leader_epoch, base_offset)
        if self.high_watermark_follows_log_end:
            self.high_watermark = last_offset + 1
        return AppendInfo(base_offset, last_offset, max_ts, log_append_time,
                          parsed.records_count, len(buf))

    def _check(self, batch, leader_epoch: int, assign_offsets: bool, from_client: bool,
               shared_head: bytes | None) -> tuple:
        """``append``'s checks of a batch and its stamps, in Python: the reference of
        ``_checked_in_c``, and the path of every batch it does not take. Returns the buffer
        to write, the parsed batch, the private header copy (shared batches) and the base
        offset."""
        head = None
        if shared_head is not None:
            buf = batch
            head = bytearray(shared_head)
            parsed = RecordBatch(buf, header=head)
            parsed.validate_header()
        else:
            writable = isinstance(batch, bytearray) or (isinstance(batch, memoryview)
                                                        and not batch.readonly)
            buf = batch if writable else bytearray(batch)
            parsed = RecordBatch(buf)
            parsed.validate()
        if len(buf) != parsed.size:
            raise InvalidRequestError(f"append takes exactly one batch: {len(buf)} bytes "
                                      f"given, the batch is {parsed.size} bytes")
        if parsed.size > self.config.max_message_bytes:
            raise MessageTooLargeError(f"batch of {parsed.size} bytes exceeds "
                                       f"max.message.bytes {self.config.max_message_bytes}")
        if assign_offsets:
            if parsed.records_count <= 0 or parsed.last_offset_delta + 1 != parsed.records_count:
                raise CorruptRecordError(None, 0, f"record count {parsed.records_count} does "
                                         f"not match last offset delta "
                                         f"{parsed.last_offset_delta}")
            if from_client:     # against the wall clock, as Kafka's LogValidator: now_ms
                check_timestamps(parsed, _now_ms(), self.config, self._where)   # drives rolls
            base_offset = self.log_end_offset
            stamp_batch(buf if head is None else head, base_offset, leader_epoch)
        else:
            base_offset = parsed.base_offset
            if base_offset < self.log_end_offset:
                raise ValueError(f"batch base offset {base_offset} is below the log end "
                                 f"offset {self.log_end_offset}")
        return buf, parsed, head, base_offset

    def _checked_in_c(self, batch, base_offset: int, leader_epoch: int
                      ) -> RecordBatch | None:
        """A client's batch checked and stamped in one C call (``native.check_batch``), on a
        CreateTime topic without a ``message.timestamp.before.max.ms`` (whose check decodes
        the records) and for a writable buffer; its header's facts, or None when the call
        does not apply or refuses the batch: ``_check`` then says why."""
        check, config = native.check_batch, self.config
        if check is None or config.message_timestamp_type != "CreateTime" or \
                config.message_timestamp_before_max_ms != UNLIMITED or \
                not (type(batch) is bytearray or (type(batch) is memoryview and
                                                  not batch.readonly and batch.format == "B")):
            return None
        facts = check(batch, base_offset, leader_epoch, _now_ms(),
                      config.max_message_bytes, config.message_timestamp_after_max_ms)
        return None if facts is None else _CheckedHeader(facts)

    def append_marker(self, producer_id: int, producer_epoch: int, *, commit: bool,
                      coordinator_epoch: int = 0, leader_epoch: int = 0,
                      now_ms: int | None = None) -> AppendInfo:
        """Append a transaction marker (COMMIT or ABORT control batch) for ``producer_id``,
        closing its open transaction on this partition; an ABORT is recorded in the
        ``.txnindex`` with it. Raises ``TransactionCoordinatorFencedError`` or
        ``InvalidProducerEpochError`` for a marker the partition refuses."""
        marker = control_batch(CONTROL_COMMIT if commit else CONTROL_ABORT,
                               producer_id=producer_id, producer_epoch=producer_epoch,
                               coordinator_epoch=coordinator_epoch,
                               timestamp_ms=_now_ms() if now_ms is None else now_ms)
        return self.append(marker, leader_epoch=leader_epoch, now_ms=now_ms)

    @property
    def last_stable_offset(self) -> int:
        """Below it, every transaction is decided (committed or aborted): what a
        ``read_committed`` reader may read (Kafka's LSO)."""
        return self.producers.last_stable_offset(self.high_watermark)

    @property
    def _where(self) -> str:
        return f"{self.topic}-{self.partition}: "

    # The broker decides what the high watermark follows (written or durable offset); the
    # storage layer alone has no replicas, so by default the high watermark is the log end.
    high_watermark_follows_log_end = True

    def _maybe_roll(self, size: int, max_ts: int, first_offset: int, last_offset: int,
                    now_ms: int | None) -> None:
        seg = self.active_segment
        if now_ms is None and seg.size and seg.first_batch_timestamp < 0:
            now_ms = _now_ms()    # the wall clock matters only to a segment without timestamps
        # The live segment satisfies SegmentMeta's fields, so the hot path builds no snapshot.
        reason = roll_reason(seg, batch_size=size, batch_max_timestamp=max_ts,
                             batch_last_offset=last_offset, now_ms=now_ms or 0,
                             config=self.config)
        if reason is not None and (seg.size > 0 or reason == "offset overflow"):
            self.roll(max(first_offset, self.log_end_offset), reason=reason, now_ms=now_ms)

    def roll(self, new_base_offset: int | None = None, *, reason: str = "requested",
             now_ms: int | None = None) -> LogSegment:
        """Close the active segment for appends and start a new one (never a second empty
        segment: rolling an empty active segment at the same base returns it).

        Raises ``LogWriteError``: with the log as before when the new segment cannot be
        created or the old one's final index entry written (contained if it was for want of
        space); offline when the directory fsync after that failed (the roll stands in
        memory, maybe not on disk)."""
        self._check_writable()
        try:
            return self._roll(new_base_offset, reason, now_ms)
        except OSError as err:
            raise self._write_failed("roll", err) from err

    def _roll(self, new_base_offset: int | None, reason: str, now_ms: int | None
              ) -> LogSegment:
        # Never below the log end offset (Kafka's LocalLog.roll): the new segment must not
        # overlap the offsets already stored in the active one.
        base = self.log_end_offset if new_base_offset is None else max(new_base_offset,
                                                                       self.log_end_offset)
        active = self.active_segment
        if active.size == 0 and active.base_offset == base:
            return active
        # The new segment first, then the old one's final index entries: either failing
        # leaves the old segment active and as it was.
        seg = LogSegment(self.dir, base, self.config, now_ms=now_ms)
        try:
            seg.create_indexes()
            active.on_become_inactive()
        except BaseException:
            seg.delete()
            try:
                active.resize_indexes(self.config.segment_index_bytes)
            except OSError:
                pass       # it stays trimmed: rolls early at its next index entry
            raise
        seg.pin()
        if active.size == 0:
            # An empty segment at a lower base would only shadow the new one.
            active.delete()
            self.segments.pop()
            self._bases.pop()
        else:
            active.unpin()       # trimmed: its files close (segment.py)
        self.segments.append(seg)
        self._bases.append(base)
        self._fsync_dir("roll")
        self.take_producer_snapshot()
        log.debug("%s: rolled to segment %d (%s)", self.dir, base, reason)
        return seg

    def take_producer_snapshot(self) -> None:
        """Write the producer state at the log end (``<log end>.snapshot``), as Kafka does at
        every roll and clean shutdown, so an open replays from there instead of from the
        log start. Best effort: a snapshot that cannot be written only lengthens the next
        replay."""
        offset = self.log_end_offset
        try:
            producer_state.write_snapshot(self.dir, offset, self.producers.producers.values())
        except OSError as err:
            log.warning("%s: producer snapshot not written: %s", self.dir, err)
            return
        while self._snapshots and self._snapshots[-1] >= offset:     # truncated since
            self._snapshots.pop()
            self._pruned_below = -1
        self._snapshots.append(offset)

    # A recovery replays the producer state from the newest snapshot at or below the recovery
    # point. Rolls alone would leave that at the active segment's base: a 1 GiB segment of
    # 170 B batches is 6 M batches, ~12 s of replay at ~2 us each (the profile). So a
    # checkpoint also writes one at the log end once this many offsets (at least as many as
    # batches) went in since the last; the flush before the checkpoint covers that offset,
    # so the next checkpoint's recovery point passes it. Cost: at most one file per partition
    # per flush interval (1 s), 0.46 ms with 4 producers and 1.0 ms with 1,000 on this
    # loaded ext4 box, against 12.7 ms for the fsynced recovery-point checkpoint the loop
    # writes every second anyway; the produce path itself is untouched. Bound: a replay
    # of at most this many batches (~20 ms) before the recovery point.
    RECOVERY_SNAPSHOT_OFFSETS = 10_000

    def take_recovery_snapshot(self) -> None:
        """At a checkpoint (``LogManager.checkpoint``): snapshot the producer state at the
        log end when ``RECOVERY_SNAPSHOT_OFFSETS`` went in since the last snapshot. The
        flush that the checkpoint follows covers this offset, so a later checkpoint's
        recovery point passes it and the next recovery replays from here."""
        last = self._snapshots[-1] if self._snapshots else self.segments[0].base_offset
        if not self.closed and self.offline is None and \
                self.log_end_offset - last >= self.RECOVERY_SNAPSHOT_OFFSETS:
            self.take_producer_snapshot()

    def prune_recovery_snapshots(self, recovery_point: int) -> None:
        """After a checkpoint of ``recovery_point`` was written: remove the snapshots below
        the newest one at or below it, which no recovery starts from, except those at segment
        bases (the rolls', kept as Kafka keeps them; retention removes them). Only those
        since the last call are looked at: a few per checkpoint, however many segments."""
        anchor = bisect.bisect_right(self._snapshots, recovery_point) - 1
        if anchor <= 0 or self._snapshots[anchor] <= self._pruned_below:
            return
        start = bisect.bisect_left(self._snapshots, self._pruned_below)
        doomed = [o for o in self._snapshots[start:anchor] if not self._is_base(o)]
        files.remove_quietly(producer_state.snapshot_path(self.dir, o) for o in doomed)
        for o in doomed:
            self._snapshots.remove(o)
        self._pruned_below = self._snapshots[anchor - len(doomed)]

    def _is_base(self, offset: int) -> bool:
        i = bisect.bisect_left(self._bases, offset)
        return i < len(self._bases) and self._bases[i] == offset

    def _fsync_dir(self, what: str) -> None:
        """fsync this directory; a failure takes the log offline (never retried)."""
        try:
            files.fsync_dir(self.dir)
        except OSError as err:
            raise self._write_failed(f"{what}: directory fsync", err,
                                     contained=False) from err

    # --- read ---------------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int = 1 << 20, *, max_offset: int | None = None,
             min_one_batch: bool = True) -> FetchSlice:
        """Whole batches starting with the batch holding ``offset`` (records below ``offset``
        in that batch included; the reader skips them), not past ``max_offset`` (default: the
        high watermark). Raises ``OffsetOutOfRangeError`` outside
        ``[log_start_offset, log_end_offset]``; at the upper bound the slice is empty."""
        found = self.locate(offset, max_bytes, max_offset=max_offset,
                            min_one_batch=min_one_batch)
        if found is None:
            return FetchSlice(offset, self.active_segment.base_offset,
                              self.active_segment.size, b"")
        seg, position, length = found
        return FetchSlice(offset, seg.base_offset, position, seg.read_range(position, length))

    def locate(self, offset: int, max_bytes: int, *, max_offset: int | None = None,
               min_one_batch: bool = True) -> tuple[LogSegment, int, int] | None:
        """``read`` without the bytes: the segment and the (position, length) of the whole
        batches ``read`` would return, or None when there are none. The caller reads them
        (``sendfile`` from ``segment.dup_fd()``) before the loop changes the log."""
        self._check_open()
        upper = self.high_watermark if max_offset is None else max_offset
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset,
                                        f"{self.topic}-{self.partition}")
        if offset >= upper:
            return None
        for i in range(self.segment_for(offset), len(self.segments)):
            seg = self.segments[i]
            max_position = None
            if upper < seg.next_offset:
                bound = seg.translate_offset(upper)
                max_position = bound.position if bound is not None else None
            found = seg.locate(offset, max_bytes, max_position, min_one_batch)
            if found is not None:
                return (seg, *found) if found[1] else None
        return None

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping offsets ``[start, end)``, oldest first: what a
        ``read_committed`` Fetch of that range returns for the client to skip. Searches the
        ``.txnindex`` of the segment holding ``start`` and later ones (a marker may land in
        a later segment than its data) until an entry's last stable offset reaches ``end``."""
        self._check_open()
        out: list[AbortedTxn] = []
        for seg in self.segments[self.segment_for(start):]:
            found, done = seg.txn_index.collect(start, end)
            out += found
            if done:
                break
        return sorted(out, key=lambda t: t.first_offset)

    def batches(self, start_offset: int | None = None) -> Iterator[RecordBatch]:
        """Every batch from the one holding ``start_offset`` (default: the log start)."""
        start = self.log_start_offset if start_offset is None else start_offset
        for i in range(self.segment_for(start), len(self.segments)):
            seg = self.segments[i]
            found = seg.translate_offset(start)
            if found is None:
                continue
            yield from seg.batches(found.position)

    def first_timestamp_from(self, offset: int) -> int | None:
        """The timestamp of the first data record at or after ``offset`` below the high
        watermark — the oldest record a reader at ``offset`` has not seen — or None when there
        is none. Reads only the batches it looks at (markers and batches compaction emptied
        are stepped over) and builds no record objects: ``mq top`` and the metrics date every
        lagging group partition with it."""
        self._check_open()
        offset = max(offset, self.log_start_offset)
        columns = [bytearray() for _ in range(8)]
        while offset < self.high_watermark:
            i = self.segment_for(offset)
            seg = self.segments[i]
            found = seg.translate_offset(offset)
            if found is None:                           # past this segment's last batch
                if i + 1 == len(self.segments):
                    return None
                offset = max(offset, self.segments[i + 1].base_offset)
                continue
            batch = next(seg.batches(found.position, found.position + found.size), None)
            if batch is None:
                return None
            if not batch.is_control and decode_columns(batch, columns, offset,
                                                       batch.last_offset + 1):
                return int.from_bytes(columns[1][:8], sys.byteorder, signed=True)
            offset = batch.last_offset + 1
        return None

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """Kafka's ListOffsets: the earliest ``(offset, timestamp)`` whose timestamp is >=
        ``timestamp``; special values -1 (latest), -2 (earliest), -3 (max timestamp). None when
        no record qualifies or the hit is at/after the high watermark. Raises
        ``InvalidRequestError`` for another negative timestamp."""
        self._check_open()
        if timestamp == EARLIEST_TIMESTAMP:
            return self.log_start_offset, -1
        if timestamp == LATEST_TIMESTAMP:
            return self.high_watermark, -1
        if timestamp == MAX_TIMESTAMP:
            # Like every timestamp lookup, a hit at/after the high watermark is not returned.
            found = self._max_timestamp_offset()
            return found if found is not None and found[0] < self.high_watermark else None
        if timestamp < 0:
            raise InvalidRequestError(f"invalid timestamp {timestamp}")
        for seg in self.segments:
            if seg.next_offset <= self.log_start_offset or seg.size == 0:
                continue
            if 0 <= seg.max_timestamp_so_far < timestamp:    # its largest timestamp is below
                continue
            found = seg.find_offset_by_timestamp(timestamp, self.log_start_offset)
            if found is not None:
                return found if found[0] < self.high_watermark else None
        return None

    def _max_timestamp_offset(self) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None
        for seg in self.segments:
            if seg.max_timestamp_so_far < 0 or (best and seg.max_timestamp_so_far <= best[1]):
                continue
            for batch in seg.batches():
                if batch.last_offset < self.log_start_offset:
                    continue
                if best is None or batch.max_timestamp > best[1]:
                    # The batch's max may sit below the log start offset (DeleteRecords moved
                    # it mid-batch): take the first largest timestamp among what is left.
                    for rec in batch.records():
                        if rec.offset >= self.log_start_offset and \
                                (best is None or rec.timestamp > best[1]):
                            best = (rec.offset, rec.timestamp)
        return best

    # --- truncation and log start -------------------------------------------------------------
    def truncate_to(self, offset: int) -> None:
        """Remove ``offset`` and everything after it (whole batches). A failure half-way
        takes the log offline (a restart's recovery finishes from disk)."""
        self._check_writable()
        if offset >= self.log_end_offset:
            return
        if offset < self.active_segment.base_offset and offset <= self.segments[0].base_offset:
            self.truncate_fully_and_start_at(offset)
            return
        try:
            while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
                self.segments.pop().delete()
                self._bases.pop()
            self.active_segment.pin()
            self.active_segment.truncate_to(offset)
            self.active_segment.resize_indexes(self.config.segment_index_bytes)
        except OSError as err:
            raise self._write_failed("truncate", err, contained=False) from err
        finally:
            self.high_watermark = min(self.high_watermark, self.log_end_offset)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
            self.leader_epochs.truncate_from_end(self.log_end_offset)
            self.producers, _ = producer_state.rebuild(self.dir, self.segments,
                                                       self.log_end_offset)
        self._fsync_dir("truncate")

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start empty at ``offset``."""
        self._check_writable()
        for seg in self.segments:
            seg.delete()
        files.remove_quietly(producer_state.snapshot_path(self.dir, o)
                             for o in producer_state.snapshot_offsets(self.dir))
        self._snapshots = []
        self._pruned_below = -1
        self.producers = ProducerStateManager()
        self.producers.map_end_offset = offset
        self.leader_epochs.clear()
        try:
            seg = LogSegment(self.dir, offset, self.config)
            seg.pin()
            seg.create_indexes()
        except OSError as err:
            raise self._write_failed("truncate", err, contained=False) from err
        finally:
            self.log_start_offset = self.recovery_point = self.high_watermark = offset
        self.segments = [seg]
        self._bases = [offset]
        self._fsync_dir("truncate")

    def delete_records_before(self, offset: int) -> int:
        """Kafka's DeleteRecords: move the log start offset up to ``offset`` (<= the high
        watermark). Whole segments below it go at the next retention pass. Returns the new
        log start offset."""
        self._check_open()
        if offset > self.high_watermark:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.high_watermark,
                                        f"{self.topic}-{self.partition}")
        if offset > self.log_start_offset:
            self.log_start_offset = offset
        return self.log_start_offset

    # --- retention ----------------------------------------------------------------------------
    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete the segments Kafka's rules allow (see ``policy.retention_deletable``);
        returns how many. Files are renamed ``.deleted`` now and removed after
        ``file.delete.delay.ms`` (``delete_expired_files``). An offline log is left alone.
        Raises ``LogWriteError`` when the active segment must roll first and cannot."""
        self._check_open()
        if self.offline is not None:
            return 0
        now_ms = _now_ms() if now_ms is None else now_ms
        metas = [s.meta() for s in self.segments]
        count, reason = retention_deletable(metas, log_start_offset=self.log_start_offset,
                                            high_watermark=self.high_watermark, now_ms=now_ms,
                                            config=self.config)
        if count == 0:
            return 0
        if count == len(self.segments):
            self.roll(now_ms=now_ms)   # never delete the active segment: roll past it first
        doomed, self.segments = self.segments[:count], self.segments[count:]
        self._bases = self._bases[count:]
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
        for seg in doomed:
            try:
                seg.rename_suffix(files.DELETED_SUFFIX)
            except OSError as err:
                # It goes anyway (delete() removes it under whatever name it has now); a
                # crash before that leaves a segment below the log start offset, which the
                # checkpointed log start hides and the next retention pass deletes.
                self.write_failures += 1
                log.warning("%s: segment %d not renamed for deletion: %s", self.dir,
                            seg.base_offset, err)
            self._pending_deletes.append((now_ms + self.config.file_delete_delay_ms, seg))
        first = self.segments[0].base_offset
        files.remove_quietly(producer_state.snapshot_path(self.dir, o)
                             for o in producer_state.snapshot_offsets(self.dir) if o < first)
        self._fsync_dir("retention")
        log.info("%s: retention (%s) deleted %d segment(s); log start offset %d",
                 self.dir, reason, count, self.log_start_offset)
        self.delete_expired_files(now_ms)
        return count

    def delete_expired_files(self, now_ms: int | None = None) -> None:
        now_ms = _now_ms() if now_ms is None else now_ms
        keep = []
        for deadline, seg in self._pending_deletes:
            if deadline <= now_ms:
                seg.delete()
            else:
                keep.append((deadline, seg))
        self._pending_deletes = keep

    # --- compaction swap (used by mq.log.cleaner) ---------------------------------------------
    # Bumped by every replace_segments. A swap can leave the segment-set shape (first base,
    # active base, count) unchanged, so a published segment-set generation must include it.
    swap_count = 0

    def replace_segments(self, new: LogSegment, old: list[LogSegment],
                         now_ms: int | None = None) -> None:
        """Install ``new`` (a finished, fsynced ``.cleaned`` segment at ``old[0]``'s base) in
        place of ``old``, a run of inactive segments of this log — Kafka's
        ``LocalLog.replaceSegments``.

        Renames, each phase made durable by a directory fsync: ``new`` ``.cleaned`` ->
        ``.swap``; each of ``old`` -> ``.deleted``; ``new`` ``.swap`` -> final names. A crash
        between any two renames is undone or finished by ``_finish_leftovers`` at the next
        open: while any ``.cleaned`` file remains the swap is dropped; once all are ``.swap``
        the swap replaces every segment whose base lies in ``[new base, new next offset)``,
        which is why ``new`` must end past the base of ``old[-1]``. Client readers list the
        directory at any moment: from the first rename of ``old`` until ``new``'s ``.log``
        gets its final name no ``.log`` covers the group's offsets, and ``new``'s
        ``.log.swap`` does (``PartitionReader`` lists it in the segment's place), so this
        order of renames is a contract with them too. The in-memory list changes last, in one
        splice, so an exception half-way leaves this object serving the old segments (still
        readable through their open files); reopen to finish the swap. The replaced segments
        are deleted after ``file.delete.delay.ms``, like retention's.

        Must run on the thread that appends to and reads this log. Raises ``ValueError``,
        before touching any file, when ``old`` is no longer a run of inactive segments here
        (retention or truncation got there first) or ``new`` does not fit it.
        """
        self._check_open()
        now_ms = _now_ms() if now_ms is None else now_ms
        i = next((k for k, seg in enumerate(self.segments) if seg is old[0]), -1) if old else -1
        if i < 0 or i + len(old) >= len(self.segments) or \
                any(a is not b for a, b in zip(self.segments[i:i + len(old)], old, strict=True)):
            raise ValueError(f"{self.dir}: segments {[s.base_offset for s in old]} are no "
                             "longer a run of inactive segments of this log")
        if new.suffix != files.CLEANED_SUFFIX or new.base_offset != old[0].base_offset or \
                new.next_offset <= old[-1].base_offset:
            raise ValueError(f"{self.dir}: {new!r} cannot replace segments "
                             f"{[s.base_offset for s in old]}")
        self._check_writable()
        try:
            new.rename_suffix(files.SWAP_SUFFIX)
            files.fsync_dir(self.dir)
            bases = {seg.base_offset for seg in old}
            for deadline, seg in [p for p in self._pending_deletes
                                  if p[1].base_offset in bases]:
                seg.delete()             # its .deleted names are about to be reused
                self._pending_deletes.remove((deadline, seg))
            for seg in old:
                seg.rename_suffix(files.DELETED_SUFFIX)
            files.fsync_dir(self.dir)
            new.rename_suffix("")
            files.fsync_dir(self.dir)
        except OSError as err:
            # Half-way through the renames: the files say how far it got, and the next open
            # finishes or undoes it (see above); until then no more writes.
            raise self._write_failed("compaction swap", err, contained=False) from err
        self.segments[i:i + len(old)] = [new]
        self._bases[i:i + len(old)] = [new.base_offset]
        self.swap_count += 1
        deadline = now_ms + self.config.file_delete_delay_ms
        self._pending_deletes += [(deadline, seg) for seg in old]
        self.delete_expired_files(now_ms)

    # --- durability and lifecycle -------------------------------------------------------------
    def flush(self, up_to_offset: int | None = None) -> None:
        """fdatasync every segment holding data below ``up_to_offset`` (default: all) and
        advance the recovery point. A failed fsync takes the log offline and raises
        ``LogWriteError``: it is never retried, and the recovery point stays."""
        self._check_writable()
        target = self.log_end_offset if up_to_offset is None else up_to_offset
        if target <= self.recovery_point:
            return
        try:
            for seg in self.segments:
                if seg.next_offset > self.recovery_point and seg.base_offset < target:
                    seg.flush()
        except OSError as err:
            raise self.fsync_failed(err) from err
        self.recovery_point = target

    def fsync_failed(self, err: OSError) -> LogWriteError:
        """An fsync of this log's files failed (here or in the broker's flusher thread):
        offline, never retried. Returns the error to raise or report."""
        return self._write_failed("fsync", err, contained=False)

    def verify(self) -> list[str]:
        """Problems found without changing anything (``mq log check``)."""
        problems: list[str] = []
        for seg in self.segments:
            problems += seg.verify()
        return problems

    def close(self) -> None:
        """Flush, write final index entries, trim indexes, close files. Idempotent.

        Never raises for a write failure: an offline log (or one whose last flush fails now)
        is closed leaving its files exactly as they are, for the next open's recovery, and
        every failure shows in ``write_failures``."""
        if self.closed:
            return
        if self.offline is None:
            try:
                self.flush()
            except LogWriteError:
                pass                   # offline now: logged, counted
        if self.offline is None:
            self.take_producer_snapshot()
        self.closed = True
        for seg in self.segments:
            if self.offline is not None:
                seg.close_without_index_changes()
                continue
            try:
                seg.close()
            except OSError as err:     # its final index entry or trim: recovery rebuilds
                self.write_failures += 1
                log.warning("%s: segment %d closed without its final index entries: %s",
                            self.dir, seg.base_offset, err)
        for _, seg in self._pending_deletes:
            seg.delete()
        self._pending_deletes = []

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PartitionLog({self.dir!r}, start={self.log_start_offset}, "
                f"end={self.log_end_offset}, segments={len(self.segments)})")
