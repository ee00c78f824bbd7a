"""The log cleaner's choices, pure: a log's sections, its dirty ratio, whether and which log to
clean, and how segments group into one cleaned segment (Kafka's LogCleanerManager and
``LogCleaner.groupSegmentsBySize``). Everything takes ``SegmentMeta`` values and ``now_ms``.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Final, TypeVar

from mq.log.config import LogConfig
from mq.log.layout import RECORD_BATCH_OVERHEAD
from mq.log.policy import SegmentMeta

__all__ = ["CleanableRange", "cleanable_range", "dirty_ratio", "filthiest", "group_segments",
           "max_compaction_delay_ms", "resolve_first_dirty_offset", "should_clean"]

_INT32_MAX: Final = (1 << 31) - 1
_OFFSET_ENTRY_BYTES: Final = 8
_TIME_ENTRY_BYTES: Final = 12
K = TypeVar("K")


@dataclasses.dataclass(frozen=True, slots=True)
class CleanableRange:
    """The log's sections, in offsets and bytes (Kafka's ``LogToClean``)."""

    first_dirty_offset: int
    first_uncleanable_offset: int    # a segment base offset
    clean_bytes: int
    cleanable_bytes: int

    @property
    def dirty_ratio(self) -> float:
        return dirty_ratio(self.clean_bytes, self.cleanable_bytes)


def resolve_first_dirty_offset(checkpointed: int | None, log_start_offset: int,
                               log_end_offset: int) -> tuple[int, bool]:
    """The first dirty offset to use and whether the checkpoint was out of range (Kafka resets
    it to the log start then, and rewrites the checkpoint)."""
    if checkpointed is None:
        return log_start_offset, False
    if checkpointed < log_start_offset or checkpointed > log_end_offset:
        return log_start_offset, True
    return checkpointed, False


def _floor_index(segments: Sequence[SegmentMeta], offset: int) -> int:
    """Index of the segment holding ``offset`` (the last base <= it), or 0."""
    return max(bisect.bisect_right([s.base_offset for s in segments], offset) - 1, 0)


def cleanable_range(segments: Sequence[SegmentMeta], first_dirty_offset: int,
                    active_base_offset: int, last_stable_offset: int, now_ms: int,
                    min_compaction_lag_ms: int) -> CleanableRange:
    """Kafka's ``cleanableOffsets`` + ``calculateCleanableBytes``.

    The first uncleanable offset is the least of the last stable offset, the active segment's
    base and (with ``min_compaction_lag_ms`` > 0) the base of the first inactive segment from
    the first dirty one whose largest timestamp is newer than ``now - lag``; it is then
    rounded down to the base of the segment holding it. Clean bytes are the segments below
    the first dirty offset, cleanable bytes those from it to the first uncleanable offset
    (the segment holding the first dirty offset counts in both, as in Kafka).
    """
    bound = min(last_stable_offset, active_base_offset)
    if min_compaction_lag_ms > 0:
        for seg in segments[_floor_index(segments, first_dirty_offset):]:
            if seg.base_offset >= active_base_offset:
                break
            if seg.largest_timestamp > now_ms - min_compaction_lag_ms:
                bound = min(bound, seg.base_offset)
                break
    if segments:
        bound = min(bound, segments[_floor_index(segments, bound)].base_offset)
    uncleanable = max(bound, first_dirty_offset)
    clean = sum(s.size_bytes for s in segments if s.base_offset < first_dirty_offset)
    cleanable = 0
    if first_dirty_offset < uncleanable:
        start = min(segments[_floor_index(segments, first_dirty_offset)].base_offset,
                    first_dirty_offset)
        cleanable = sum(s.size_bytes for s in segments
                        if start <= s.base_offset < uncleanable)
    return CleanableRange(first_dirty_offset, uncleanable, clean, cleanable)


def dirty_ratio(clean_bytes: int, cleanable_bytes: int) -> float:
    """cleanable / (clean + cleanable); 0 for an empty log."""
    total = clean_bytes + cleanable_bytes
    return cleanable_bytes / total if total > 0 else 0.0


def max_compaction_delay_ms(segments: Sequence[SegmentMeta], first_dirty_offset: int,
                            active_base_offset: int, now_ms: int,
                            max_compaction_lag_ms: int) -> int:
    """How long past ``max.compaction.lag.ms`` the oldest dirty record is (Kafka's
    ``maxCompactionDelay``): from the earliest first-batch timestamp (> 0) of the inactive
    segments from the first dirty one. 0 when nothing is overdue."""
    stamps = [s.first_batch_timestamp for s in segments[_floor_index(segments,
                                                                        first_dirty_offset):]
              if s.base_offset < active_base_offset and s.first_batch_timestamp > 0]
    if not stamps:
        return 0
    clean_until = now_ms - max(max_compaction_lag_ms, 0)
    earliest = min(stamps)
    return clean_until - earliest if earliest < clean_until else 0


def should_clean(cleanable: CleanableRange, config: LogConfig,
                 compaction_delay_ms: int = 0) -> bool:
    """Kafka's eligibility: dirty ratio above ``min.cleanable.dirty.ratio``, or a record overdue
    by ``max.compaction.lag.ms`` with cleanable bytes left. Never for a non-compacted topic."""
    if not config.compact_enabled:
        return False
    if compaction_delay_ms > 0 and cleanable.cleanable_bytes > 0:
        return True
    return cleanable.dirty_ratio > config.min_cleanable_dirty_ratio


def filthiest(candidates: Iterable[tuple[K, CleanableRange, int]]) -> K | None:
    """Which log to clean next among ``(key, range, compaction delay)``: overdue logs first
    (largest delay), then the highest dirty ratio; None when none has cleanable bytes."""
    best: tuple[tuple[int, float], K] | None = None
    for key, rng, delay in candidates:
        if rng.cleanable_bytes <= 0:
            continue
        rank = (delay, rng.dirty_ratio)
        if best is None or rank > best[0]:
            best = (rank, key)
    return None if best is None else best[1]


def group_segments(segments: Sequence[SegmentMeta], *, end_offset: int, max_bytes: int,
                   max_index_bytes: int, index_interval_bytes: int) -> list[tuple[int, int]]:
    """Kafka's ``groupSegmentsBySize`` over the inactive segments with base < ``end_offset``:
    ``[start, stop)`` index ranges of consecutive segments whose total size is <=
    ``max_bytes``, whose offsets stay within int32 of the first base, and whose index fits
    ``max_index_bytes``. A group is never only, nor ends with, an empty segment (the swap's
    offset range ends at its last batch; an empty trailing segment would be left behind).

    The index bound is computed from bytes, not from the inputs' indexes: an entry needs more
    than ``index.interval.bytes`` (and a batch is >= 61 bytes) since the previous one.
    """
    n = 0
    while n < len(segments) and segments[n].base_offset < end_offset:
        n += 1

    def index_bytes(size: int) -> int:
        entries = size // max(index_interval_bytes + 1, RECORD_BATCH_OVERHEAD) + 2
        return entries * max(_OFFSET_ENTRY_BYTES, _TIME_ENTRY_BYTES)

    groups: list[tuple[int, int]] = []
    i = 0
    while i < n:
        size = segments[i].size_bytes
        j = i + 1
        while j < n:
            nxt = segments[j]
            if size + nxt.size_bytes > max_bytes or \
                    nxt.next_offset - 1 - segments[i].base_offset > _INT32_MAX or \
                    index_bytes(size + nxt.size_bytes) > max_index_bytes:
                break
            size += nxt.size_bytes
            j += 1
        while j - 1 > i and segments[j - 1].size_bytes == 0:
            j -= 1
        if segments[j - 1].size_bytes > 0:
            groups.append((i, j))
        i = j
    return groups
