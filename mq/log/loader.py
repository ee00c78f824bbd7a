"""Opening a partition directory: finish interrupted changes, load or recover its segments,
rebuild its producer state (Kafka's LogLoader; ``docs/architecture.md``, "Crash safety").

- Leftovers first (``_finish_leftovers``): ``.deleted``, ``.cleaned`` and ``.tmp`` files of
  the names mq gives (``datadir.is_partition_file``) go, and nothing else;
  ``.swap`` files at or above the smallest ``.cleaned`` base are an unfinished split and go
  too; the other swaps replace the segments they cover.
- Segments: after a clean shutdown each is loaded from its indexes; otherwise every batch
  from the one holding the recovery point to the end is validated, its index entries
  rebuilt, the log truncated at the first torn or invalid batch and every later segment
  dropped. Below the recovery point nothing was lost (it was fsynced), so the segment
  holding it keeps the index entries below it after checking them
  (``LogSegment.recover``): recovery reads what the last flush did not cover, not whole
  segments. A segment with a missing or broken index is validated whole either way.
- Producer state: the newest valid snapshot at or below the first validated offset (or the
  log end), then the batches after it replayed (``producer_state.rebuild``), which also
  writes the ``.txnindex`` entries from the first validated offset on anew. Checkpoints
  write snapshots near the recovery point (``PartitionLog.take_recovery_snapshot``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

from mq.errors import CorruptIndexError
from mq.log import datadir, diskio, files, producer_state
from mq.log.config import LogConfig
from mq.log.producer_state import ProducerStateManager
from mq.log.batch_headers import scan_headers
from mq.log.segment import LogSegment
from mq.log.segment_recovery import SegmentRecovery

__all__ = ["Loaded", "RecoveryReport", "load"]

log = logging.getLogger("mq.log.log")


@dataclasses.dataclass(slots=True)
class RecoveryReport:
    """What open (or ``mq log check --repair``) changed."""

    segments_recovered: int = 0
    bytes_validated: int = 0        # .log bytes read and checked batch by batch
    batches_replayed: int = 0       # batches read for the producer state
    bytes_truncated: int = 0
    segments_dropped: int = 0
    indexes_rebuilt: int = 0
    leftovers_removed: list[str] = dataclasses.field(default_factory=list)
    swaps_completed: list[str] = dataclasses.field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.bytes_truncated or self.segments_dropped or self.indexes_rebuilt
                    or self.leftovers_removed or self.swaps_completed)


@dataclasses.dataclass(slots=True)
class Loaded:
    """What ``load`` found: the segments, in order, and the state around them."""

    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    report: RecoveryReport
    producers: ProducerStateManager


def load(directory: str, config: LogConfig, *, recovery_point: int = 0,
     log_start_offset: int = 0, clean_shutdown: bool = False,
     now_ms: int | None = None, on_segment: Callable[[], None] | None = None) -> Loaded:
    """Open (creating if needed) and recover a partition directory.

    ``recovery_point`` and ``log_start_offset`` come from the data dir's checkpoints;
    ``clean_shutdown`` from its marker. Without a clean shutdown every batch from the one
    holding the recovery point to the end is validated. ``on_segment()`` is called after
    each segment is loaded or recovered.
    """
    diskio.ops.makedirs(directory)
    report = RecoveryReport()
    _finish_leftovers(directory, report)
    segments: list[LogSegment] = []
    # The listing answers "does this file exist" below: nothing here creates or removes
    # a segment's files before its own turn (one stat fewer per file at startup).
    names = sorted(os.listdir(directory))
    listed = set(names)
    for name in names:
        parsed = files.parse_segment_name(name)
        if parsed is None or parsed[2]:
            continue
        base, kind, _ = parsed
        if kind == files.LOG_SUFFIX:
            segments.append(LogSegment(directory, base, config, now_ms=now_ms))
        elif kind in (files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX, files.TXNINDEX_SUFFIX):
            if files.segment_name(base, files.LOG_SUFFIX) not in listed:
                os.unlink(os.path.join(directory, name))
                report.leftovers_removed.append(name)
    recover_from = 0 if clean_shutdown else recovery_point
    recovered_from: int | None = None       # the first offset recovery validated
    for i, seg in enumerate(segments):
        if on_segment is not None and i:
            on_segment()                # the previous segment is done
        needs_recovery = not clean_shutdown and (
            i == len(segments) - 1 or segments[i + 1].base_offset > recover_from)
        if not needs_recovery:
            try:
                # A missing time index is rebuilt like a missing offset index: an empty
                # one would lose the segment's largest timestamp (retention, lookups).
                if files.segment_name(seg.base_offset, files.INDEX_SUFFIX) in listed and \
                        files.segment_name(seg.base_offset, files.TIMEINDEX_SUFFIX) in listed:
                    seg.load_index_state()
                    continue
            except CorruptIndexError as err:
                log.warning("rebuilding index: %s", err)
            report.indexes_rebuilt += 1
        # Only the segment holding the recovery point starts past its base (one below it
        # with a broken index is rebuilt whole; the later ones start at or past it).
        done = _recover_segment(seg, report, recovery_point if needs_recovery else None)
        if recovered_from is None:
            recovered_from = done.offset
        if done.bytes_truncated:
            # Everything after a truncated segment is unreachable: drop it.
            for later in segments[i + 1:]:
                later.delete()
                report.segments_dropped += 1
            del segments[i + 1:]
            break
    if segments and segments[-1].next_offset < log_start_offset:
        for seg in segments:
            seg.delete()
            report.segments_dropped += 1
        segments = []
    if not segments:
        segments = [LogSegment(directory, log_start_offset, config, now_ms=now_ms)]
    log_start_offset = max(log_start_offset, segments[0].base_offset)
    segments[-1].resize_indexes(config.segment_index_bytes)
    leo = segments[-1].next_offset
    recovery_point = leo if clean_shutdown else min(recovery_point, leo)
    producers, report.batches_replayed = producer_state.rebuild(
        directory, segments, leo, recovered_from=recovered_from, clean_shutdown=clean_shutdown)
    files.fsync_dir(directory)
    return Loaded(segments, log_start_offset, recovery_point, report, producers)

def _recover_segment(seg: LogSegment, report: RecoveryReport,
                     recovery_point: int | None) -> SegmentRecovery:
    done = seg.recover(recovery_point)
    report.segments_recovered += 1
    report.bytes_validated += done.bytes_validated
    if done.index_error is not None:
        log.warning("validating all of %s: %s", seg.log_path, done.index_error)
        report.indexes_rebuilt += 1
    if done.bytes_truncated:
        log.warning("%s: truncated %d bytes of torn or invalid data at byte %d",
                    seg.log_path, done.bytes_truncated, seg.size)
        report.bytes_truncated += done.bytes_truncated
    return done


def _finish_leftovers(directory: str, report: RecoveryReport) -> None:
    """Finish or undo interrupted multi-file changes (Kafka's rules, LocalLog's):
    delete ``.deleted``, ``.cleaned`` and ``.tmp`` files; drop ``.swap`` files at or above the
    smallest ``.cleaned`` base (an unfinished split); install the remaining swaps in place of
    the segments they replace."""
    names = os.listdir(directory)
    cleaned_bases = []
    swaps: list[tuple[int, str, str]] = []
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith((files.TMP_SUFFIX, files.DELETED_SUFFIX)) and \
                datadir.is_partition_file(name):    # never a file mq did not name
            os.unlink(path)
            report.leftovers_removed.append(name)
            continue
        parsed = files.parse_segment_name(name)
        if parsed is None:
            continue
        base, kind, suffix = parsed
        if suffix == files.CLEANED_SUFFIX:
            cleaned_bases.append(base)
            os.unlink(path)
            report.leftovers_removed.append(name)
        elif suffix == files.SWAP_SUFFIX:
            swaps.append((base, kind, name))
    if not swaps:
        return
    min_cleaned = min(cleaned_bases, default=None)
    live: list[tuple[int, str, str]] = []
    for base, kind, name in swaps:
        if min_cleaned is not None and base >= min_cleaned:
            os.unlink(os.path.join(directory, name))
            report.leftovers_removed.append(name)
        else:
            live.append((base, kind, name))
    log_swaps = sorted(b for b, kind, _ in live if kind == files.LOG_SUFFIX)
    if log_swaps:
        # The swapped segments cover [min swap base, max swap next offset): delete the ordinary
        # segments with base offsets in that range, then rename the swaps into place.
        upper = max(_next_offset_of(os.path.join(directory, files.segment_name(
            b, files.LOG_SUFFIX) + files.SWAP_SUFFIX), b) for b in log_swaps)
        for name in names:
            parsed = files.parse_segment_name(name)
            if parsed and not parsed[2] and log_swaps[0] <= parsed[0] < upper:
                files.remove_quietly([os.path.join(directory, name)])
    for base, kind, name in live:
        final = files.segment_name(base, kind)
        os.rename(os.path.join(directory, name), os.path.join(directory, final))
        report.swaps_completed.append(final)
    files.fsync_dir(directory)


def _next_offset_of(path: str, base: int) -> int:
    """Next offset after the last whole batch of a ``.log`` file (base if none), walking the
    batch headers (``segment.scan_headers``) up to garbage or a torn tail."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return base
    try:
        next_offset = base
        for batch_base, _, last_delta, _ in scan_headers(fd, 0, os.fstat(fd).st_size):
            next_offset = batch_base + last_delta + 1
        return next_offset
    finally:
        os.close(fd)
