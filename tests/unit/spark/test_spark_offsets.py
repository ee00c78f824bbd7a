"""``mq.spark.offsets``: Kafka's offsets JSON, subscriptions, and resolving earliest, latest,
-2/-1 and timestamps against a fake broker view."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.errors import ConfigError, UnknownTopicOrPartitionError
from mq.spark.offsets import assigned_partitions, from_json, resolve, to_json
from mq.spark.options import (
    Earliest,
    GlobalTimestamp,
    Latest,
    SpecificOffsets,
    SpecificTimestamps,
    Subscription,
)


class FakeView:
    """Partitions with a log start, an end and records at known timestamps."""

    def __init__(self, logs: dict[tuple[str, int], tuple[int, int, list[int]]]) -> None:
        self.logs = logs                       # tp -> (start, end, timestamp of each offset)

    def partition_counts(self):
        counts: dict[str, int] = {}
        for t, p in self.logs:
            counts[t] = max(counts.get(t, 0), p + 1)
        return counts

    def earliest(self, tps):
        return {tp: self.logs[tp][0] for tp in tps if tp in self.logs}

    def latest(self, tps):
        return {tp: self.logs[tp][1] for tp in tps if tp in self.logs}

    def offsets_for_times(self, timestamps):
        out = {}
        for tp, ts in timestamps.items():
            start, _, stamps = self.logs[tp]
            out[tp] = next((start + i for i, t in enumerate(stamps) if t >= ts), None)
        return out


VIEW = FakeView({("a", 0): (0, 3, [10, 20, 30]), ("a", 1): (5, 9, [15, 25, 35, 45]),
                 ("b", 0): (0, 0, [])})
A = [("a", 0), ("a", 1)]


@given(st.dictionaries(st.tuples(st.text(min_size=1, max_size=5), st.integers(0, 200)),
                       st.integers(0, 1 << 62), max_size=20))
def test_json_round_trip_is_canonical(offsets):
    obj = to_json(offsets)
    text = json.dumps(obj)
    assert from_json(json.loads(text)) == offsets
    # One JSON text per offset map, whatever order it was built in: Spark compares the text.
    assert json.dumps(to_json(dict(reversed(list(offsets.items()))))) == text
    for per in obj.values():
        assert [int(p) for p in per] == sorted(int(p) for p in per)


def test_json_shape():
    assert to_json({("t", 10): 5, ("t", 2): 1, ("s", 0): 0}) == \
        {"s": {"0": 0}, "t": {"2": 1, "10": 5}}
    assert list(to_json({("t", 10): 5, ("t", 2): 1})["t"]) == ["2", "10"]


@pytest.mark.parametrize("bad", [[], {"t": [1]}, {"t": {0: 1}}, {"t": {"x": 1}},
                                 {"t": {"0": "1"}}, {"t": {"0": True}}, {1: {"0": 1}}])
def test_from_json_rejects_other_shapes(bad):
    with pytest.raises(ValueError):
        from_json(bad)


def test_assigned_partitions():
    counts = {"orders": 2, "orders-eu": 1, "__consumer_offsets": 1, "xorders": 1}
    sub = Subscription("subscribePattern", pattern="orders.*")
    assert assigned_partitions(sub, counts, strict=True) == \
        [("orders", 0), ("orders", 1), ("orders-eu", 0)]
    everything = Subscription("subscribePattern", pattern=".*")
    assert ("__consumer_offsets", 0) not in assigned_partitions(everything, counts, strict=True)
    sub = Subscription("subscribe", topics=("xorders", "orders"))
    assert assigned_partitions(sub, counts, strict=True) == \
        [("orders", 0), ("orders", 1), ("xorders", 0)]
    sub = Subscription("subscribe", topics=("orders", "missing"))
    with pytest.raises(UnknownTopicOrPartitionError, match="unknown topic.*missing"):
        assigned_partitions(sub, counts, strict=True)
    assert assigned_partitions(sub, counts, strict=False) == [("orders", 0), ("orders", 1)]
    sub = Subscription("assign", partitions=(("orders", 1), ("orders", 2), ("nope", 0)))
    with pytest.raises(UnknownTopicOrPartitionError, match=r"\[nope-0, orders-2\]"):
        assigned_partitions(sub, counts, strict=True)
    assert assigned_partitions(sub, counts, strict=False) == [("orders", 1)]


def test_resolve_earliest_latest_and_json():
    assert resolve(Earliest(), A, VIEW, starting=True) == {("a", 0): 0, ("a", 1): 5}
    assert resolve(Latest(), A, VIEW, starting=True) == {("a", 0): 3, ("a", 1): 9}
    spec = SpecificOffsets(((("a", 0), -1), (("a", 1), -2)))
    assert resolve(spec, A, VIEW, starting=True) == {("a", 0): 3, ("a", 1): 5}
    spec = SpecificOffsets(((("a", 0), 2), (("a", 1), 7)))
    assert resolve(spec, A, VIEW, starting=False) == {("a", 0): 2, ("a", 1): 7}
    with pytest.raises(ConfigError, match=r"names \[a-0\], the query reads \[a-0, a-1\]"):
        resolve(SpecificOffsets(((("a", 0), 1),)), A, VIEW, starting=True)


def test_resolve_timestamps():
    # The first offset whose timestamp is >= T.
    assert resolve(GlobalTimestamp(20), A, VIEW, starting=True) == {("a", 0): 1, ("a", 1): 6}
    assert resolve(GlobalTimestamp(0), A, VIEW, starting=True) == {("a", 0): 0, ("a", 1): 5}
    # No match: a starting timestamp fails (strategy error) or goes to latest ...
    with pytest.raises(ConfigError, match="no offset of a-0 has a timestamp at or after 40"):
        resolve(GlobalTimestamp(40), A, VIEW, starting=True)
    assert resolve(GlobalTimestamp(40), A, VIEW, starting=True, no_match_latest=True) == \
        {("a", 0): 3, ("a", 1): 8}
    # ... an ending one always goes to latest.
    assert resolve(GlobalTimestamp(40), A, VIEW, starting=False) == {("a", 0): 3, ("a", 1): 8}
    spec = SpecificTimestamps(((("a", 0), 25), (("a", 1), 100)))
    assert resolve(spec, A, VIEW, starting=False) == {("a", 0): 2, ("a", 1): 9}
    with pytest.raises(ConfigError, match="startingOffsetsByTimestamp"):
        resolve(SpecificTimestamps(((("a", 0), 25),)), A, VIEW, starting=True)
