"""``mq.migrate.offsets``: the translation of committed offsets against a model of a target
partition (Hypothesis: any copy with aborted or compacted-away records, any target retention),
its probe count, the ``mq.source.offset`` header and the configs a target topic gets."""

from __future__ import annotations

import math
from itertools import accumulate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.migrate.offsets import SOURCE_HEADER, source_offset, stamp, target_config, translate


class Partition:
    """A target partition as ``mq migrate`` leaves it: ``records`` maps target offsets (one
    per record written, from ``base``) to source offsets, increasing; ``start``/``end`` its
    log start offset and high watermark. Counts the probes."""

    def __init__(self, sources: list[int], base: int = 0, removed: set[int] = frozenset(),
                 start: int | None = None) -> None:
        self.end = base + len(sources)
        self.start = base if start is None else start
        self.records = {base + i: s for i, s in enumerate(sources)
                        if base + i >= self.start and base + i not in removed}
        self.probes = 0

    def probe(self, t: int):
        self.probes += 1
        after = [x for x in sorted(self.records) if x >= t]
        return (after[0], self.records[after[0]]) if after else None

    def expected(self, offset: int) -> int:
        return min((t for t, s in self.records.items() if s >= offset), default=self.end)


@st.composite
def partitions(draw) -> Partition:
    steps = draw(st.lists(st.integers(1, 6), max_size=60))     # > 1: records not copied
    sources = list(accumulate(steps, initial=draw(st.integers(0, 50))))[1:]
    base = draw(st.integers(0, 30))
    # compaction removes any record but the last; retention moves the log start
    removed = draw(st.sets(st.integers(base, base + max(len(sources) - 2, 0))))
    start = base + draw(st.integers(0, len(sources)))
    return Partition(sources, base, removed, start)


@given(partitions(), st.integers(0, 400))
def test_translate_finds_the_first_record_at_or_after_the_offset(part, offset):
    assert translate(offset, part.probe, part.start, part.end) == part.expected(offset)


@given(partitions(), st.integers(0, 400))
def test_translate_probes_a_logarithmic_number_of_times(part, offset):
    translate(offset, part.probe, part.start, part.end)
    assert part.probes <= 2 * math.ceil(math.log2(part.end - part.start + 1)) + 2


@given(st.integers(0, 1000), st.integers(0, 5000), st.integers(0, 3000))
def test_a_copy_without_holes_translates_in_two_probes(first, count, offset):
    part = Partition(list(range(first, first + count)))
    assert translate(offset, part.probe, part.start, part.end) == part.expected(offset)
    assert part.probes <= 2


def test_offsets_past_the_copy_translate_to_the_end():
    part = Partition([3, 4, 9], base=10)
    assert translate(10, part.probe, part.start, part.end) == 13
    assert translate(9, part.probe, part.start, part.end) == 12
    assert translate(5, part.probe, part.start, part.end) == 12   # 5..8 were not copied


def test_an_empty_partition_translates_to_its_end_without_a_probe():
    part = Partition([], base=7)
    assert translate(0, part.probe, 7, 7) == 7
    assert part.probes == 0


def test_bad_requests_raise():
    with pytest.raises(ValueError):
        translate(-1, lambda t: None, 0, 0)
    with pytest.raises(ValueError):
        translate(0, lambda t: None, 5, 4)
    with pytest.raises(ValueError, match="before it"):
        translate(3, lambda t: (0, 0), 2, 9)


def test_stamp_appends_the_source_offset_and_source_offset_reads_the_last():
    headers = stamp([("a", b"1"), ("b", None)], 1234)
    assert headers == [("a", b"1"), ("b", None), (SOURCE_HEADER, b"1234")]
    assert source_offset(headers) == 1234
    assert source_offset(stamp(headers, 99)) == 99           # a copy of a copy
    assert source_offset([("a", b"1")]) is None
    assert source_offset(None) is None
    assert source_offset([(SOURCE_HEADER, b"-1")]) is None
    assert source_offset([(SOURCE_HEADER, None)]) is None


def test_target_config_copies_what_differs_from_kafkas_defaults():
    effective = {"cleanup.policy": "compact", "retention.ms": "604800000",
                 "segment.bytes": "1048576", "flush.messages": "1",
                 "message.timestamp.type": "LogAppendTime", "retention.bytes": "-1"}
    assert target_config(effective) == {"cleanup.policy": "compact",
                                         "segment.bytes": "1048576",
                                         "message.timestamp.type": "CreateTime"}
