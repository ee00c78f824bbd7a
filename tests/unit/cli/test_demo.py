"""``mq demo``'s consumed count: each (partition, offset) once, re-deliveries apart."""

from __future__ import annotations

from mq import Record
from mq.cli.demo import DistinctCount


def records(partition: int, offsets) -> list[Record]:
    return [Record("demo", partition, o, 1000 + o, 0, b"k", b"v", []) for o in offsets]


def test_each_offset_counts_once_and_redeliveries_apart():
    shared = [0, 0]                        # the parent's per-partition next offsets
    first, second = DistinctCount(shared), DistinctCount(shared)
    assert [r.offset for r in first.add(0, records(0, range(10)))] == list(range(10))
    assert [r.offset for r in first.add(1, records(1, range(4)))] == [0, 1, 2, 3]
    # A rebalance: partition 0 moves to the second consumer, which starts at the last
    # committed offset (6): 6..9 come again.
    assert [r.offset for r in second.add(0, records(0, range(6, 13)))] == [10, 11, 12]
    assert (first.count, first.redelivered) == (14, 0)
    assert (second.count, second.redelivered) == (3, 4)
    assert shared == [13, 4]
    assert sum(shared) == first.count + second.count      # what the progress line shows
    assert second.add(0, records(0, range(8, 13))) == []      # all seen
    assert second.redelivered == 9 and shared == [13, 4]
