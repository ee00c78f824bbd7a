"""The pure parts of the metrics: the fsync histogram's buckets and the ``HOST:PORT`` rule."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.broker.flushing import FsyncLatency
from mq.metrics import parse_address


def test_a_value_on_a_bound_counts_in_that_bucket():       # Prometheus' "le": less or equal
    h = FsyncLatency()
    for seconds in (0.0001, 0.00010001, 0.002, 30.0):
        h.observe(seconds)
    snap = h.snapshot()
    cumulative = dict((bound, n) for bound, n in snap["buckets"])
    assert cumulative[0.0001] == 1
    assert cumulative[0.00025] == 2
    assert cumulative[0.0025] == 3
    assert cumulative[10.0] == 3 and cumulative[math.inf] == 4 == snap["count"]
    assert snap["sum_seconds"] == pytest.approx(30.00220001)


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=50))
def test_buckets_are_cumulative_and_end_at_the_count(values):
    h = FsyncLatency()
    for v in values:
        h.observe(v)
    snap = h.snapshot()
    counts = [n for _, n in snap["buckets"]]
    assert counts == sorted(counts)
    assert counts[-1] == snap["count"] == len(values)
    for bound, n in snap["buckets"]:
        assert n == sum(1 for v in values if v <= bound)


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:9400", ("127.0.0.1", 9400)),
    (":0", ("0.0.0.0", 0)),
    ("[::1]:9400", ("::1", 9400)),
    ("localhost:80", ("localhost", 80)),
])
def test_addresses(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["localhost", "127.0.0.1:", "host:port", "h:70000", ""])
def test_bad_addresses_say_what_is_wanted(text):
    with pytest.raises(ValueError, match="HOST:PORT|0..65535"):
        parse_address(text)
