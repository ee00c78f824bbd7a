"""Pure decisions of the log: when to roll a segment and which segments retention deletes.

Nothing here touches a file or reads a clock; time comes in as ``now_ms`` and segments as
frozen ``SegmentMeta`` values, so every rule is tested without processes or sleeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

from mq.log.config import LogConfig

__all__ = ["SegmentMeta", "should_roll", "roll_reason", "retention_deletable"]

_INT32_MAX: Final = (1 << 31) - 1


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentMeta:
    """What the rules need to know about one segment."""

    base_offset: int
    size_bytes: int
    next_offset: int                 # one past the last offset in the segment (base if empty)
    largest_timestamp: int           # max record timestamp, or the file's mtime if none
    first_batch_timestamp: int = -1  # max timestamp of the first batch (-1: none yet)
    created_ms: int = 0              # wall-clock creation time, for segments without timestamps
    offset_index_full: bool = False
    time_index_full: bool = False
    rolling_jitter_ms: int = 0


def roll_reason(seg: SegmentMeta, *, batch_size: int, batch_max_timestamp: int,
                batch_last_offset: int, now_ms: int, config: LogConfig) -> str | None:
    """Which of Kafka's four roll conditions holds before appending a batch, or None.

    1. size: the append would take the segment past ``segment.bytes``;
    2. time: the segment is non-empty and older than ``segment.ms - jitter``, measured from the
       first batch's timestamp (wall clock from creation if it had none);
    3. either index is full;
    4. the batch's last offset is not expressible relative to the base offset (int32).

    ``seg`` is a ``SegmentMeta`` or anything with its fields (the live ``LogSegment``).
    """
    if seg.size_bytes > config.segment_bytes - batch_size:
        return "size"
    if seg.size_bytes > 0:
        if seg.first_batch_timestamp >= 0:
            elapsed = batch_max_timestamp - seg.first_batch_timestamp
        else:
            elapsed = now_ms - seg.created_ms
        if elapsed > config.segment_ms - seg.rolling_jitter_ms:
            return "time"
    if seg.offset_index_full or seg.time_index_full:
        return "index full"
    rel = batch_last_offset - seg.base_offset
    if not 0 <= rel <= _INT32_MAX:
        return "offset overflow"
    return None


def should_roll(seg: SegmentMeta, *, batch_size: int, batch_max_timestamp: int,
                batch_last_offset: int, now_ms: int, config: LogConfig) -> bool:
    return roll_reason(seg, batch_size=batch_size, batch_max_timestamp=batch_max_timestamp,
                       batch_last_offset=batch_last_offset, now_ms=now_ms,
                       config=config) is not None


def retention_deletable(segments: Sequence[SegmentMeta], *, log_start_offset: int,
                        high_watermark: int, now_ms: int, config: LogConfig
                        ) -> tuple[int, str]:
    """How many leading segments retention may delete, and why (Kafka's rules).

    Oldest first, stopping at the first segment that does not qualify. A segment qualifies
    when its upper bound (the next segment's base, or its own next offset for the last one)
    is <= the high watermark and (a) that upper bound is <= ``log_start_offset`` (always
    checked, also for compact-only topics), or, when ``cleanup.policy`` has ``delete``,
    (b) the total size minus ``retention.bytes`` still covers this segment, or
    (c) ``now - largest_timestamp > retention.ms``. An empty last segment is never deleted;
    the caller rolls a new active segment first when every segment qualifies.
    """
    if not segments:
        return 0, ""
    total = sum(s.size_bytes for s in segments)
    excess = total - config.retention_bytes if config.retention_bytes >= 0 else -1
    count, reason = 0, ""
    for i, seg in enumerate(segments):
        is_last = i == len(segments) - 1
        upper = seg.next_offset if is_last else segments[i + 1].base_offset
        if is_last and seg.size_bytes == 0:
            break
        if upper > high_watermark:
            break
        if upper <= log_start_offset:
            why = "log start offset"
        elif config.delete_enabled and excess >= 0 and excess >= seg.size_bytes:
            why = "retention.bytes"
        elif (config.delete_enabled and config.retention_ms >= 0
              and now_ms - seg.largest_timestamp > config.retention_ms):
            why = "retention.ms"
        else:
            break
        if excess >= 0:
            excess -= seg.size_bytes
        count, reason = count + 1, why
    return count, reason
