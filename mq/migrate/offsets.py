"""The pure core of ``mq migrate``: the source-offset header every copied record carries, where
a target partition resumes, and the exact translation of a committed source offset into a
target offset.

The contract it relies on (``mq.migrate`` says why it holds): a target partition written by
``mq migrate`` holds a subsequence of its source partition, in source order, each record with
the header ``mq.source.offset`` (its source offset, ASCII digits). Target offsets are given
one per written record, so between two copied records the target offsets advance by at most
as much as the source offsets do::

    source  0 1 2 3 4 5 6 7 8        (3, 4 aborted; 5 a commit marker: not copied)
    target  0 1 2       3 4 5 6      s(t) = 0 1 2 6 7 8 ...
            t(b) - t(a) <= s(b) - s(a)

A probe reads the target: ``probe(t)`` is ``(t', s')`` for the first record at target offset
``t' >= t`` and its source offset ``s'``, or None when no record is at or after ``t``.
Nothing here does I/O; ``mq.migrate.target`` probes a real cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from mq.log.config import DEFAULTS

__all__ = ["COPIED_CONFIGS", "SOURCE_HEADER", "Probe", "source_offset", "stamp",
           "target_config", "translate"]

SOURCE_HEADER = "mq.source.offset"

Probe = Callable[[int], "tuple[int, int] | None"]

# The topic configs that shape what a topic keeps and accepts, copied when they differ from
# Kafka's defaults (mq's defaults are Kafka's: mq.log.config). Not copied: flush.* (mq fsyncs
# per batch; on Kafka, replication is the durability), file and index tuning, and the
# timestamp bounds, which would refuse old records (the copy keeps their CreateTime).
COPIED_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes", "segment.bytes",
                  "segment.ms", "max.message.bytes", "delete.retention.ms",
                  "min.compaction.lag.ms", "max.compaction.lag.ms", "min.cleanable.dirty.ratio",
                  "min.insync.replicas")

_KAFKA_DEFAULTS = DEFAULTS.to_properties()


def stamp(headers: Iterable[tuple[str, bytes | None]], offset: int
          ) -> list[tuple[str, bytes | None]]:
    """A copied record's headers: the source's, then ``mq.source.offset``."""
    return [*headers, (SOURCE_HEADER, b"%d" % offset)]


def source_offset(headers: Iterable[tuple[str, bytes | None]] | None) -> int | None:
    """The source offset in a target record's headers (the last ``mq.source.offset``), or
    None if it has none, or a value that is not a decimal offset."""
    found = None
    for key, value in headers or ():
        if key == SOURCE_HEADER:
            found = value
    if found is None or not bytes(found).isdigit():
        return None
    return int(bytes(found))


def target_config(effective: Mapping[str, str]) -> dict[str, str]:
    """The configs to create a target topic with, from a source topic's effective configs:
    those of ``COPIED_CONFIGS`` that differ from Kafka's defaults, and always
    ``message.timestamp.type=CreateTime`` (a copy keeps each record's timestamp; a target
    broker defaulting to LogAppendTime would overwrite it)."""
    out = {key: str(effective[key]) for key in COPIED_CONFIGS
           if key in effective and str(effective[key]) != _KAFKA_DEFAULTS.get(key)}
    out["message.timestamp.type"] = "CreateTime"
    return out


def translate(offset: int, probe: Probe, start: int, end: int) -> int:
    """The target offset a group that committed source offset ``offset`` (the next record to
    read) commits on the target: that of the first copied record whose source offset is
    >= ``offset``, or ``end`` when there is none. The target partition's records lie in
    [``start``, ``end``).

    Interpolation (from a record below, the answer is at most ``offset - s`` further on:
    exact at the first try when no record was skipped) alternates with bisection, so a
    partition with holes (aborted transactions, compaction) takes O(log(end - start)) probes
    at worst. Raises ``ValueError`` for a negative offset or ``start > end``.
    """
    if offset < 0 or start > end:
        raise ValueError(f"bad translation request: offset {offset}, target [{start}, {end})")
    # Invariants: every record below lo has a source offset < offset; no record lies in
    # [hi, best); best is a record whose source offset is >= offset, or end.
    lo, hi, best = start, end, end
    below: tuple[int, int] | None = None
    guess = True
    while lo < hi:
        if below is None:
            m = lo                              # the first record anchors the interpolation
        elif guess:
            m = min(max(below[0] + offset - below[1], lo), hi - 1)
        else:
            m = (lo + hi) // 2
        guess = below is None or not guess
        found = probe(m)
        if found is None:
            hi = m
            continue
        t, s = found
        if t < m:
            raise ValueError(f"probe({m}) returned a record at {t}, before it")
        if s >= offset:
            hi, best = m, t
            # From (t, s): no more than s - offset records lie between the answer and t.
            lo = max(lo, min(hi, t - (s - offset)))
        else:
            lo, below = t + 1, (t, s)
    return best
