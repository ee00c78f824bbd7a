"""Offsets of the ``mq`` source: Kafka's JSON shape, and resolving option specs to numbers.

A streaming offset is what Spark writes to ``checkpoint/offsets/<batch>``: for every partition
the *next* offset to read (Kafka's ``KafkaSourceOffset``), as ``{"topic": {"0": 23}}``. Spark
moves offsets between processes as JSON and compares them *as JSON strings* (a batch with
``start == end`` has no data), and integer dict keys come back as strings. So the JSON is
always built here, in one canonical order: topics by name, partitions by number.

Inside the source an offset map is ``{(topic, partition): offset}``. Resolving ``earliest``,
``latest``, -2/-1 and timestamps needs the broker; it is done against ``MetadataView`` (the
driver's ``BrokerMetadata`` in ``metadata.py``, a dict-backed fake in the unit tests), as
Kafka's ``KafkaOffsetReaderAdmin`` does:

- "latest" is the high watermark readers may see (the last stable offset under
  ``read_committed``): never anything a consumer could not read.
- a timestamp resolves to the earliest offset whose record timestamp is >= it; with no such
  record a *starting* timestamp fails (strategy ``error``) or resolves to latest (strategy
  ``latest``), an *ending* one resolves to latest.
- JSON offsets and timestamps must name exactly the partitions the subscription has.

Pure: no Spark, no sockets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Protocol

from mq.errors import ConfigError, UnknownTopicOrPartitionError
from mq.protocol.limits import is_internal
from mq.spark.options import (
    EARLIEST,
    LATEST,
    TP,
    Earliest,
    GlobalTimestamp,
    Latest,
    OffsetSpec,
    SpecificOffsets,
    SpecificTimestamps,
    Subscription,
)

__all__ = ["MetadataView", "to_json", "from_json", "assigned_partitions", "resolve",
           "format_tps"]


class MetadataView(Protocol):
    """What resolving offsets needs from the broker (one consistent look per call)."""

    def partition_counts(self) -> dict[str, int]:
        """Every user topic and its number of partitions."""
        ...

    def earliest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Log start offsets (partitions that do not exist are left out)."""
        ...

    def latest(self, tps: Iterable[TP]) -> dict[TP, int]:
        """High watermarks, or last stable offsets under read_committed (partitions that do
        not exist are left out)."""
        ...

    def offsets_for_times(self, timestamps: Mapping[TP, int]) -> dict[TP, int | None]:
        """The earliest offset whose timestamp is >= the given one, or None."""
        ...


# --- JSON -------------------------------------------------------------------------------------

def to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """``{("t", 0): 5}`` -> ``{"t": {"0": 5}}``, topics sorted by name, partitions by number."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json(obj: object) -> dict[TP, int]:
    """The inverse of ``to_json`` for what Spark hands back (a checkpoint's offsets). Raises
    ``ValueError`` for anything else."""
    if not isinstance(obj, dict):
        raise ValueError(f"not an mq source offset: {obj!r}")
    out: dict[TP, int] = {}
    for topic, per in obj.items():
        if not isinstance(topic, str) or not isinstance(per, dict):
            raise ValueError(f"not an mq source offset: {obj!r}")
        for p, offset in per.items():
            if not (isinstance(p, str) and p.isdigit()) or not isinstance(offset, int) \
                    or isinstance(offset, bool):
                raise ValueError(f"not an mq source offset: {obj!r}")
            out[(topic, int(p))] = offset
    return out


def format_tps(tps: Iterable[TP]) -> str:
    """``[t-0, t-1]``: partitions as Kafka prints them."""
    return "[" + ", ".join(f"{t}-{p}" for t, p in sorted(tps)) + "]"


# --- subscriptions ----------------------------------------------------------------------------

def assigned_partitions(sub: Subscription, counts: Mapping[str, int], *,
                        strict: bool) -> list[TP]:
    """The partitions ``sub`` reads now, sorted. ``strict`` (planning a batch read, or a new
    query's first offsets): a subscribed topic or assigned partition that does not exist is an
    ``UnknownTopicOrPartitionError``; otherwise it is left out (a topic deleted under a running
    query is the data-loss check's business, and one created later is picked up)."""
    if sub.kind == "subscribePattern":
        pattern = re.compile(sub.pattern or "")
        # The broker's own topics (``__`` prefix): a pattern never matches them.
        topics = [t for t in counts if not is_internal(t) and pattern.fullmatch(t)]
        return sorted((t, p) for t in topics for p in range(counts[t]))
    if sub.kind == "subscribe":
        missing = [t for t in sub.topics if t not in counts]
        if missing and strict:
            raise UnknownTopicOrPartitionError(
                f"the mq source subscribes to unknown topic(s) {', '.join(missing)} "
                f"(option 'subscribe'); create them first")
        return sorted((t, p) for t in sub.topics if t in counts for p in range(counts[t]))
    missing = [(t, p) for t, p in sub.partitions if p >= counts.get(t, 0)]
    if missing and strict:
        raise UnknownTopicOrPartitionError(
            f"the mq source is assigned unknown partition(s) {format_tps(missing)} "
            "(option 'assign')")
    return sorted(tp for tp in sub.partitions if tp not in missing)


# --- resolution -------------------------------------------------------------------------------

def resolve(spec: OffsetSpec, tps: list[TP], view: MetadataView, *, starting: bool,
            no_match_latest: bool = False) -> dict[TP, int]:
    """Offsets for ``tps`` from a spec (module doc). Raises ``ConfigError`` when JSON names
    other partitions than ``tps``, or a starting timestamp matches nothing under strategy
    ``error``."""
    name = "startingOffsets" if starting else "endingOffsets"
    if isinstance(spec, Earliest):
        return _complete(view.earliest(tps), tps)
    if isinstance(spec, Latest):
        return _complete(view.latest(tps), tps)
    if isinstance(spec, SpecificOffsets):
        wanted = spec.as_dict()
        _same_partitions(wanted, tps, name)
        earliest = [tp for tp, off in wanted.items() if off == EARLIEST]
        latest = [tp for tp, off in wanted.items() if off == LATEST]
        found = {**(_complete(view.earliest(earliest), earliest) if earliest else {}),
                 **(_complete(view.latest(latest), latest) if latest else {})}
        return {tp: found.get(tp, off) for tp, off in sorted(wanted.items())}
    if isinstance(spec, GlobalTimestamp):
        timestamps = {tp: spec.timestamp_ms for tp in tps}
    elif isinstance(spec, SpecificTimestamps):
        timestamps = spec.as_dict()
        _same_partitions(timestamps, tps, name.replace("Offsets", "OffsetsByTimestamp"))
    else:
        raise TypeError(f"not an offset spec: {spec!r}")
    found_at = view.offsets_for_times(timestamps)
    unmatched = sorted(tp for tp in timestamps if found_at.get(tp) is None)
    if unmatched and starting and not no_match_latest:
        tp = unmatched[0]
        raise ConfigError(f"no offset of {tp[0]}-{tp[1]} has a timestamp at or after "
                          f"{timestamps[tp]} (startingOffsetsByTimestampStrategy=error; "
                          "'latest' starts such partitions at their latest offset)")
    latest = _complete(view.latest(unmatched), unmatched) if unmatched else {}
    return {tp: latest[tp] if tp in latest else found_at[tp]  # type: ignore[misc]
            for tp in sorted(timestamps)}


def _same_partitions(given: Mapping[TP, int], tps: list[TP], name: str) -> None:
    if set(given) != set(tps):
        raise ConfigError(f"option {name!r} must name exactly the partitions the query reads "
                          f"(use -2 for earliest, -1 for latest); it names {format_tps(given)},"
                          f" the query reads {format_tps(tps)}")


def _complete(found: dict[TP, int], tps: list[TP]) -> dict[TP, int]:
    missing = [tp for tp in tps if tp not in found]
    if missing:
        raise UnknownTopicOrPartitionError(f"partition(s) {format_tps(missing)} disappeared "
                                           "while the mq source resolved offsets")
    return found
