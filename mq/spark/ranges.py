"""Planning the ``mq`` source's reads: offset ranges, admission control and splitting.

``OffsetRange`` is the ``InputPartition`` a Spark task receives: ``[start, end)`` of one
partition plus everything ``read()`` needs (data dir, flags), since the executor's reader is a
separately pickled object that never sees the driver's state.

The arithmetic is Spark's Kafka source, ported so that the same options plan the same tasks:

- ``rate_limit`` is ``KafkaMicroBatchStream.rateLimit`` (``maxOffsetsPerTrigger``): the cap is
  shared in proportion to each partition's backlog, floored, but a share below one offset is
  rounded *up* ("don't completely starve small topicpartitions"), so many small backlogs can
  take a little more than the cap.
- ``delay_batch`` is ``delayBatch`` (``minOffsetsPerTrigger`` with ``maxTriggerDelay``).
- ``split_ranges`` is ``KafkaOffsetRangeCalculator.getRanges``: ``maxRecordsPerPartition``
  first cuts every range into pieces of at most that many offsets, then ``minPartitions``
  (when it exceeds the number of ranges) splits the large ranges in proportion to their size.
  Pieces are whole offsets; a cut may fall inside a log batch, which then both neighbouring
  tasks decode and filter by offset.
- ``plan_ranges`` is ``getOffsetRangesFromResolvedOffsets``: partitions new since ``start``
  begin at their earliest offset, and lost data (a partition gone, a new partition that does
  not start at 0, an end before its start) is reported through ``failOnDataLoss``.

Pure apart from ``InputPartition`` (a plain picklable base class).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping

from pyspark.sql.datasource import InputPartition

from mq.errors import DataLossError
from mq.spark.offsets import format_tps
from mq.spark.options import TP

__all__ = ["OffsetRange", "DataLossError", "rate_limit", "delay_batch", "split_ranges",
           "plan_ranges", "clamp_to_log_start", "report_data_loss"]

log = logging.getLogger("mq.spark")

_FAIL_TRUE_HINT = ("Some data may have been lost because they are no longer available in the "
                   "log: deleted by retention, or the topic was deleted. If you want the query "
                   "to go on, set the source option 'failOnDataLoss' to 'false'.")
_FAIL_FALSE_HINT = ("Some data may have been lost because they are no longer available in the "
                    "log; the query goes on (failOnDataLoss=false).")


def report_data_loss(message: str, fail_on_data_loss: bool) -> None:
    """Kafka's ``reportDataLoss``: raise ``DataLossError``, or log a warning and go on."""
    if fail_on_data_loss:
        raise DataLossError(f"{message}. {_FAIL_TRUE_HINT}")
    log.warning("%s. %s", message, _FAIL_FALSE_HINT)


@dataclasses.dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Offsets ``[start, end)`` of ``topic``-``partition``, read from ``data_dir``."""

    topic: str
    partition: int
    start: int
    end: int
    data_dir: str = ""
    include_headers: bool = False
    read_committed: bool = False
    fail_on_data_loss: bool = True

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    def __repr__(self) -> str:
        return f"OffsetRange({self.topic}-{self.partition} [{self.start}, {self.end}))"


# --- admission control ------------------------------------------------------------------------

def rate_limit(limit: int, start: Mapping[TP, int], latest: Mapping[TP, int],
               earliest_of_new: Mapping[TP, int]) -> dict[TP, int]:
    """End offsets admitting about ``limit`` offsets beyond ``start`` (Kafka's ``rateLimit``).
    Partitions in ``latest`` but not ``start`` begin at ``earliest_of_new``."""
    sizes: dict[TP, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, earliest_of_new.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    out: dict[TP, int] = {}
    for tp, end in latest.items():
        size = sizes.get(tp)
        if size is None:
            out[tp] = end
            continue
        begin = start[tp] if tp in start else earliest_of_new[tp]
        prorate = limit * (size / total)
        # Don't completely starve small partitions: a share below one offset becomes one.
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begin + share)
    return out


def delay_batch(min_rows: int, latest: Mapping[TP, int], start: Mapping[TP, int],
                now_ms: int, last_trigger_ms: int, max_trigger_delay_ms: int
                ) -> tuple[bool, int]:
    """Kafka's ``delayBatch``: ``(skip this trigger?, new last-trigger time)``. A trigger runs
    once ``min_rows`` new offsets are there, or ``max_trigger_delay_ms`` after the last one."""
    if now_ms - last_trigger_ms >= max_trigger_delay_ms:
        return False, now_ms
    new = sum(end - start.get(tp, 0) for tp, end in latest.items())
    if new < min_rows:
        return True, last_trigger_ms
    return False, now_ms


# --- planning ---------------------------------------------------------------------------------

def plan_ranges(start: Mapping[TP, int], end: Mapping[TP, int],
                earliest_of: Callable[[list[TP]], dict[TP, int]],
                fail_on_data_loss: bool) -> list[tuple[TP, int, int]]:
    """``(tp, from, until)`` for every partition of ``end`` (Kafka's
    ``getOffsetRangesFromResolvedOffsets``), reporting lost data on the way. ``earliest_of``
    looks up the log start of partitions new since ``start`` (those that no longer exist are
    left out of its answer). Ranges with ``until <= from`` are kept (``split_ranges`` drops
    them)."""
    new = sorted(set(end) - set(start))
    first = earliest_of(new) if new else {}
    gone_new = [tp for tp in new if tp not in first]
    if gone_new:
        report_data_loss(f"Cannot find earliest offsets of {format_tps(gone_new)}. Some data "
                         "may have been missed", fail_on_data_loss)
    for tp, offset in sorted(first.items()):
        if offset != 0:
            report_data_loss(f"Added partition {tp[0]}-{tp[1]} starts from {offset} instead "
                             "of 0. Some data may have been missed", fail_on_data_loss)
    gone = sorted(set(start) - set(end))
    if gone:
        report_data_loss(f"{format_tps(gone)} are gone. Some data may have been missed",
                         fail_on_data_loss)
    out: list[tuple[TP, int, int]] = []
    for tp in sorted(end):
        if tp not in start and tp not in first:
            continue
        begin = start[tp] if tp in start else first[tp]
        until = end[tp]
        if until < begin:
            report_data_loss(f"Partition {tp[0]}-{tp[1]}'s offset was changed from {begin} to "
                             f"{until}, some data may have been missed", fail_on_data_loss)
        out.append((tp, begin, until))
    return out


def clamp_to_log_start(planned: list[tuple[TP, int, int]], earliest: Mapping[TP, int],
                       fail_on_data_loss: bool) -> list[tuple[TP, int, int]]:
    """Ranges that start below their partition's log start offset (retention or
    DeleteRecords removed them since they were planned) are data loss: reported, and then
    started at the log start. Kafka's source finds this on the executor; finding it here too
    gives the same outcome, and an exact one when the log start lies inside a segment (whose
    bytes below it are still on disk)."""
    out = []
    for tp, begin, until in planned:
        first = earliest.get(tp)
        if first is not None and begin < min(first, until):
            report_data_loss(f"Cannot read offsets [{begin}, {min(first, until)}) of "
                             f"{tp[0]}-{tp[1]}: its log starts at {first}", fail_on_data_loss)
            begin = min(first, until)
        out.append((tp, begin, until))
    return out


def split_ranges(ranges: list[tuple[TP, int, int]], min_partitions: int | None,
                 max_records: int | None) -> list[tuple[TP, int, int]]:
    """Kafka's ``KafkaOffsetRangeCalculator.getRanges`` (module doc); empty and inverted ranges
    are dropped. The union of the pieces of a range is the range."""
    pieces = [r for r in ranges if r[2] - r[1] > 0]
    if max_records is not None:
        pieces = [p for r in pieces
                  for p in _divide(r, -(-(r[2] - r[1]) // max_records))]
    if min_partitions is None or min_partitions <= len(pieces):
        return pieces
    total = sum(u - f for _, f, u in pieces)
    unsplit = [_part_count(u - f, total, min_partitions) == 1 for _, f, u in pieces]
    split_total = total - sum(u - f for (_, f, u), one in zip(pieces, unsplit, strict=True) if one)
    split_min = max(min_partitions - sum(unsplit), 1)
    out: list[tuple[TP, int, int]] = []
    for r, one in zip(pieces, unsplit, strict=True):
        parts = 1 if one else _part_count(r[2] - r[1], split_total, split_min)
        out += _divide(r, parts)
    return [p for p in out if p[2] - p[1] > 0]


def _part_count(size: int, total: int, min_parts: int) -> int:
    # Scala's math.round: half up.
    return max(math.floor(size / total * min_parts + 0.5), 1)


def _divide(r: tuple[TP, int, int], parts: int) -> list[tuple[TP, int, int]]:
    """``parts`` consecutive pieces; integer division, the last takes the remainder."""
    tp, begin, until = r
    remaining = until - begin
    out = []
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        stop = min(begin + this, until)
        out.append((tp, begin, stop))
        begin = stop
    return out
