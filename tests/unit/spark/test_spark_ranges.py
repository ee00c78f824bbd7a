"""``mq.spark.ranges``: Kafka's rateLimit, delayBatch, KafkaOffsetRangeCalculator and the
data-loss checks of planning, as pure functions (the Kafka cases are those of Spark's
KafkaOffsetRangeCalculatorSuite and KafkaMicroBatchSourceSuite)."""

from __future__ import annotations

import logging
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from mq.spark.ranges import (  # noqa: E402  (after the skip)
    DataLossError,
    OffsetRange,
    clamp_to_log_start,
    delay_batch,
    plan_ranges,
    rate_limit,
    split_ranges,
)

T1, T2, T3 = ("t", 1), ("t", 2), ("t", 3)


# --- rate_limit ---------------------------------------------------------------------------------

def test_rate_limit_shares_in_proportion_to_the_backlog():
    start = {T1: 0, T2: 0}
    assert rate_limit(10, start, {T1: 30, T2: 10}, {}) == {T1: 7, T2: 2}   # floors of 7.5, 2.5
    assert rate_limit(100, start, {T1: 30, T2: 10}, {}) == {T1: 30, T2: 10}  # capped at latest
    assert rate_limit(10, start, {T1: 0, T2: 0}, {}) == {T1: 0, T2: 0}       # nothing new


def test_rate_limit_never_starves_a_small_partition():
    # T2's share is 10 * 1/1001 < 1: rounded up to 1 offset, so the cap is passed by one.
    assert rate_limit(10, {T1: 0, T2: 0}, {T1: 1000, T2: 1}, {}) == {T1: 9, T2: 1}
    many = {("t", p): 0 for p in range(20)}
    ends = rate_limit(5, many, {tp: 3 for tp in many}, {})
    assert ends == {tp: 1 for tp in many}                 # 20 offsets for a cap of 5


def test_rate_limit_new_partitions_start_at_earliest():
    # T3 is new since start: its backlog counts from its earliest offset, 4.
    assert rate_limit(10, {T1: 0}, {T1: 10, T3: 14}, {T3: 4}) == {T1: 5, T3: 9}


@given(st.dictionaries(st.integers(0, 30), st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
                       min_size=1, max_size=12),
       st.integers(1, 5000))
def test_rate_limit_bounds(parts, limit):
    start = {("t", p): min(a, b) for p, (a, b) in parts.items()}
    latest = {("t", p): max(a, b) for p, (a, b) in parts.items()}
    ends = rate_limit(limit, start, latest, {})
    assert all(start[tp] <= ends[tp] <= latest[tp] for tp in latest)
    backlog = sum(latest[tp] - start[tp] for tp in latest)
    taken = sum(ends[tp] - start[tp] for tp in latest)
    # At most the cap, plus one offset for each partition the starvation rule rounded up.
    assert taken <= min(backlog, limit + len(parts))
    if backlog and limit >= len(parts):
        assert taken >= min(backlog, limit) - len(parts)


def test_delay_batch():
    # Fewer than min_rows new: skip, unless max_trigger_delay passed since the last trigger.
    assert delay_batch(10, {T1: 5}, {T1: 0}, now_ms=1000, last_trigger_ms=900,
                       max_trigger_delay_ms=500) == (True, 900)
    assert delay_batch(10, {T1: 5}, {T1: 0}, now_ms=1400, last_trigger_ms=900,
                       max_trigger_delay_ms=500) == (False, 1400)
    assert delay_batch(10, {T1: 15}, {T1: 5}, now_ms=1000, last_trigger_ms=900,
                       max_trigger_delay_ms=500) == (False, 1000)
    # A partition new since start counts from 0.
    assert delay_batch(10, {T1: 5, T2: 5}, {T1: 0}, now_ms=1000, last_trigger_ms=900,
                       max_trigger_delay_ms=500) == (False, 1000)


# --- split_ranges -------------------------------------------------------------------------------

@pytest.mark.parametrize("min_partitions, ranges, expected", [
    (None, [(T1, 1, 2)], [(T1, 1, 2)]),
    (None, [(T1, 1, 1)], []),                                     # empty: dropped
    (None, [(T1, 5, 1)], []),                                     # inverted: dropped
    (3, [(T1, 1, 2), (T2, 1, 2), (T3, 1, 2)], [(T1, 1, 2), (T2, 1, 2), (T3, 1, 2)]),
    (4, [(T1, 1, 17)], [(T1, 1, 5), (T1, 5, 9), (T1, 9, 13), (T1, 13, 17)]),
    (3, [(T1, 1, 5), (T2, 1, 21)], [(T1, 1, 5), (T2, 1, 11), (T2, 11, 21)]),    # skewed
    (3, [(T1, 1, 11)], [(T1, 1, 4), (T1, 4, 7), (T1, 7, 11)]),   # inexact multiple
    (3, [(T1, 1, 5), (T2, 1, 21), (T3, 1, 1)],                    # empty ranges ignored
     [(T1, 1, 5), (T2, 1, 11), (T2, 11, 21)]),
    (4, [(T1, 0, 10), (T2, 0, 10), (T3, 0, 1)],                   # SPARK-28489: none dropped
     [(T1, 0, 5), (T1, 5, 10), (T2, 0, 5), (T2, 5, 10), (T3, 0, 1)]),
])
def test_split_ranges_as_kafka(min_partitions, ranges, expected):
    assert split_ranges(ranges, min_partitions, None) == expected


def test_max_records_per_partition_then_min_partitions():
    assert split_ranges([(T1, 0, 10), (T2, 0, 3)], None, 4) == \
        [(T1, 0, 3), (T1, 3, 6), (T1, 6, 10), (T2, 0, 3)]
    # Pieces of at most 50, then minPartitions=6 splits the larger ones further.
    assert split_ranges([(T1, 0, 100)], 6, 50) == \
        [(T1, 0, 16), (T1, 16, 33), (T1, 33, 50), (T1, 50, 66), (T1, 66, 83), (T1, 83, 100)]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10_000), st.integers(0, 10_000)),
                max_size=8, unique_by=lambda r: r[0]),
       st.one_of(st.none(), st.integers(1, 64)), st.one_of(st.none(), st.integers(1, 5000)))
def test_split_ranges_cover_each_range_exactly(raw, min_partitions, max_records):
    ranges = [(("t", p), a, b) for p, a, b in raw]
    pieces = split_ranges(ranges, min_partitions, max_records)
    for tp, begin, until in ranges:
        mine = [(f, u) for t, f, u in pieces if t == tp]
        if until <= begin:
            assert mine == []
            continue
        # Consecutive, non-empty, no gap, no overlap: their union is the range.
        assert mine[0][0] == begin and mine[-1][1] == until
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:], strict=False))
        assert all(f < u for f, u in mine)
        if max_records is not None:
            assert all(u - f <= max_records for f, u in mine)
    nonempty = sum(1 for _, a, b in ranges if b > a)
    assert len(pieces) >= nonempty


# --- plan_ranges --------------------------------------------------------------------------------

def test_plan_ranges_new_partitions_start_at_earliest():
    planned = plan_ranges({T1: 5}, {T1: 9, T2: 4}, lambda tps: {tp: 0 for tp in tps}, True)
    assert planned == [(T1, 5, 9), (T2, 0, 4)]


@pytest.mark.parametrize("start, end, earliest, message", [
    ({T1: 5, T2: 3}, {T1: 9}, {}, r"\[t-2\] are gone"),
    ({T1: 5}, {T1: 9, T2: 4}, {T2: 2}, "Added partition t-2 starts from 2 instead of 0"),
    ({T1: 5}, {T1: 9, T2: 4}, {}, r"Cannot find earliest offsets of \[t-2\]"),
    ({T1: 5}, {T1: 3}, {}, "t-1's offset was changed from 5 to 3"),
])
def test_plan_ranges_reports_data_loss(start, end, earliest, message, caplog):
    with pytest.raises(DataLossError, match=message + ".*failOnDataLoss"):
        plan_ranges(start, end, lambda tps: dict(earliest), True)
    with caplog.at_level(logging.WARNING, logger="mq.spark"):
        planned = plan_ranges(start, end, lambda tps: dict(earliest), False)
    assert any("may have been" in r.getMessage() or "gone" in r.getMessage()
               for r in caplog.records)
    assert {tp for tp, _, _ in planned} <= set(end)


def test_clamp_to_log_start(caplog):
    planned = [(T1, 5, 20), (T2, 0, 3), (T3, 7, 9)]
    earliest = {T1: 10, T2: 8, T3: 0}
    with pytest.raises(DataLossError, match=r"Cannot read offsets \[5, 10\) of t-1: its log "
                       "starts at 10"):
        clamp_to_log_start(planned, earliest, True)
    with caplog.at_level(logging.WARNING, logger="mq.spark"):
        assert clamp_to_log_start(planned, earliest, False) == \
            [(T1, 10, 20), (T2, 3, 3), (T3, 7, 9)]
    assert "[0, 3) of t-2" in caplog.text
    assert clamp_to_log_start([(T1, 10, 12)], {}, True) == [(T1, 10, 12)]   # unknown: as is


def test_offset_range_is_a_picklable_input_partition():
    r = OffsetRange("t", 3, 10, 20, "/data", True, True, False)
    back = pickle.loads(pickle.dumps(r))
    assert back == r and back.size == 10 and back.tp == ("t", 3)
    assert repr(r) == "OffsetRange(t-3 [10, 20))"
