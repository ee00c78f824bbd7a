"""``mq.cli.top_model``: the figures ``mq top`` shows, from fixed broker snapshots (the dicts
``Admin.broker_stats()`` returns): rates from two snapshots, restarts and resets that give no
rate, lag, fsync mean and p99 from the histogram's buckets, texts and JSON."""

from __future__ import annotations

import copy

import pytest
from top_snapshots import INF, fsync, group, offset, partition, snapshot

from mq.cli.top_model import (
    build_view,
    format_bytes,
    format_count,
    format_duration,
    format_seconds,
    group_cells,
    histogram_quantile,
    to_json,
    topic_cells,
)

# --- rates ------------------------------------------------------------------------------------

def test_rate_in_sums_partitions_over_the_broker_clock():
    before = snapshot(10_000, [partition("orders", 0, 100, 10_000),
                               partition("orders", 1, 50, 5_000)])
    after = snapshot(12_000, [partition("orders", 0, 300, 30_000),
                              partition("orders", 1, 250, 25_000)])
    view = build_view(after, before)
    assert view.interval_seconds == 2.0
    (orders,) = view.topics
    assert orders.partitions == 2
    assert orders.in_records_per_second == 200.0              # (200 + 200) / 2 s
    assert orders.in_bytes_per_second == 20_000.0
    assert orders.end_offset == 550 and orders.records == 550


def test_one_snapshot_has_no_rates():
    view = build_view(snapshot(partitions=[partition("orders", 0, 100)],
                               groups=[group("g", [offset("orders", 0, 40, 100)])]))
    assert view.interval_seconds is None
    assert view.topics[0].in_records_per_second is None
    assert view.topics[0].out_records_per_second is None
    assert view.groups[0].out_records_per_second is None
    assert topic_cells(view.topics[0])[4:] == ("-", "-", "-")


def test_rate_out_is_committed_offsets_summed_over_groups():
    parts = [partition("orders", 0, 1000), partition("orders", 1, 1000)]
    before = snapshot(0, parts, [group("a", [offset("orders", 0, 100, 1000),
                                             offset("orders", 1, 100, 1000)]),
                                 group("b", [offset("orders", 0, 500, 1000)])])
    after = snapshot(1_000, parts, [group("a", [offset("orders", 0, 150, 1000),
                                                offset("orders", 1, 130, 1000)]),
                                    group("b", [offset("orders", 0, 600, 1000)])])
    view = build_view(after, before)
    assert view.topics[0].out_records_per_second == 50 + 30 + 100
    a, b = view.groups
    assert (a.group, a.out_records_per_second, a.lag) == ("a", 80.0, 850 + 870)
    assert (b.group, b.out_records_per_second, b.lag) == ("b", 100.0, 400)


def test_a_first_commit_is_no_rate_and_a_topic_without_groups_has_out_zero():
    parts = [partition("orders", 0, 1000), partition("idle", 0, 5)]
    before = snapshot(0, parts, [group("a", [offset("orders", 0, None, 1000)])])
    after = snapshot(1_000, parts, [group("a", [offset("orders", 0, 900, 1000)])])
    view = build_view(after, before)
    assert [t.out_records_per_second for t in view.topics] == [0.0, 0.0]   # idle, orders
    assert view.groups[0].out_records_per_second == 0.0


def test_an_offset_reset_backwards_gives_no_rate_for_that_interval():
    parts = [partition("orders", 0, 1000)]
    before = snapshot(0, parts, [group("a", [offset("orders", 0, 900, 1000)])])
    after = snapshot(1_000, parts, [group("a", [offset("orders", 0, 0, 1000)])])
    view = build_view(after, before)
    assert view.topics[0].out_records_per_second is None
    assert view.groups[0].out_records_per_second is None


def test_a_broker_restart_starts_the_counters_again():
    before = snapshot(0, [partition("orders", 0, 1000)], pid=1)
    after = snapshot(1_000, [partition("orders", 0, 10)], pid=2, started_ms=900)
    view = build_view(after, before)
    assert view.interval_seconds is None
    assert view.topics[0].in_records_per_second is None


def test_a_recreated_topic_gives_no_rate_and_a_new_partition_counts_from_zero():
    before = snapshot(0, [partition("orders", 0, 1000), partition("new", 0, 0)])
    after = snapshot(1_000, [partition("orders", 0, 10), partition("new", 0, 7),
                             partition("new", 1, 3)])
    new, orders = build_view(after, before).topics
    assert orders.in_records_per_second is None
    assert new.in_records_per_second == 10.0


def test_a_clock_that_did_not_advance_gives_no_rates():
    snap = snapshot(5_000, [partition("orders", 0, 1)])
    assert build_view(snap, copy.deepcopy(snap)).interval_seconds is None


# --- topics, groups, broker -------------------------------------------------------------------

def test_internal_topics_are_hidden_unless_asked_for():
    snap = snapshot(partitions=[partition("__consumer_offsets", p, internal=True)
                                for p in range(3)] + [partition("orders", 0)])
    view = build_view(snap)
    assert [t.topic for t in view.topics] == ["orders"]
    assert view.hidden_topics == 1
    shown = build_view(snap, show_internal=True)
    assert [t.topic for t in shown.topics] == ["__consumer_offsets", "orders"]
    assert shown.topics[0].internal and shown.topics[0].partitions == 3
    assert shown.hidden_topics == 0


def test_group_lag_is_summed_and_its_age_is_the_oldest_partition():
    g = group("billing", [offset("orders", 0, 10, 30, lag_ms=1500),
                          offset("orders", 1, 5, 5, lag_ms=None),
                          offset("audit", 0, None, 9, lag_ms=None),
                          offset("audit", 1, 7, 12, lag_ms=62_000)], members=2)
    row = build_view(snapshot(groups=[g])).groups[0]
    assert row.lag == 20 + 0 + 5
    assert row.lag_seconds == 62.0
    assert row.topics == ("audit", "orders")
    assert group_cells(row) == ("billing", "Stable", "2", "25", "1m02s", "-", "audit,orders")


def test_a_group_without_offsets_shows_dashes():
    row = build_view(snapshot(groups=[group("new", [], members=0, state="Empty")])).groups[0]
    assert (row.lag, row.lag_seconds, row.topics) == (None, None, ())
    assert group_cells(row) == ("new", "Empty", "0", "-", "-", "-", "-")


def test_groups_and_topics_are_sorted_by_name():
    snap = snapshot(partitions=[partition("b", 0), partition("a", 0)],
                    groups=[group("z", []), group("m", [])])
    view = build_view(snap)
    assert [t.topic for t in view.topics] == ["a", "b"]
    assert [g.group for g in view.groups] == ["m", "z"]


def test_broker_figures():
    view = build_view(snapshot(now_ms=3_725_000, started_ms=0, connections=7))
    b = view.broker
    assert (b.pid, b.connections, b.uptime_seconds) == (42, 7, 3725.0)
    assert format_duration(b.uptime_seconds) == "1h02m"


# --- fsync ------------------------------------------------------------------------------------

def test_fsync_mean_and_p99_over_the_interval():
    # 100 fsyncs before (all slow), then 200 in the interval: 150 under 1 ms, 50 in 1-10 ms.
    before = snapshot(0, fsync=fsync([0, 0, 0, 100, 0], 50.0))
    after = snapshot(2_000, fsync=fsync([150, 50, 0, 100, 0], 50.2))
    b = build_view(after, before).broker
    assert b.fsync_count == 200
    assert b.fsync_per_second == 100.0
    assert b.fsync_mean_seconds == pytest.approx(0.2 / 200)
    # rank 198 of 200: in the 1-10 ms bucket, 48 of its 50 in.
    assert b.fsync_p99_seconds == pytest.approx(0.001 + 0.009 * 48 / 50)


def test_fsync_since_start_with_one_snapshot_and_none_without_fsyncs():
    b = build_view(snapshot(fsync=fsync([10, 0, 0, 0, 0], 0.005))).broker
    assert (b.fsync_count, b.fsync_per_second) == (10, None)
    assert b.fsync_mean_seconds == pytest.approx(0.0005)
    quiet = build_view(snapshot(1_000, fsync=fsync([10, 0, 0, 0, 0], 0.005)),
                       snapshot(0, fsync=fsync([10, 0, 0, 0, 0], 0.005))).broker
    assert (quiet.fsync_count, quiet.fsync_per_second) == (0, 0.0)
    assert quiet.fsync_mean_seconds is None and quiet.fsync_p99_seconds is None


@pytest.mark.parametrize("q, buckets, expected", [
    (0.5, [[1.0, 10], [2.0, 20], [INF, 20]], 1.0),        # rank 10: the top of the first
    (0.99, [[1.0, 0], [2.0, 100], [INF, 100]], 1.99),     # linear inside (1, 2]
    (0.5, [[0.1, 4], [INF, 4]], 0.05),                    # the first bucket starts at 0
    (0.99, [[0.1, 1], [0.2, 1], [INF, 100]], 0.2),        # in +Inf: the last finite bound
    (0.99, [[0.1, 0], [INF, 0]], None),                   # empty
    (0.99, [], None),
])
def test_histogram_quantile(q, buckets, expected):
    got = histogram_quantile(q, buckets)
    assert got == (None if expected is None else pytest.approx(expected))


# --- texts and JSON ---------------------------------------------------------------------------

@pytest.mark.parametrize("n, text", [(None, "-"), (0, "0"), (12, "12"), (12.5, "12.5"),
                                     (999, "999"), (1234, "1.2k"), (3_400_000, "3.4M"),
                                     (5.6e9, "5.6G"), (7e12, "7000.0G")])
def test_format_count(n, text):
    assert format_count(n) == text


@pytest.mark.parametrize("n, text", [(None, "-"), (0, "0B"), (1023, "1023B"),
                                     (1536, "1.5KiB"), (3 << 20, "3.0MiB"), (5 << 40, "5.0TiB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("s, text", [(None, "-"), (0.00085, "850us"), (0.0012, "1.2ms"),
                                     (3.4, "3.40s")])
def test_format_seconds(s, text):
    assert format_seconds(s) == text


@pytest.mark.parametrize("s, text", [(None, "-"), (0.4, "0.4s"), (45, "45s"), (187, "3m07s"),
                                     (7500, "2h05m"), (3 * 86_400 + 4 * 3600, "3d04h")])
def test_format_duration(s, text):
    assert format_duration(s) == text


def test_cells_hold_no_spaces():
    before = snapshot(0, [partition("orders", 0, 0)], [group("g", [offset("orders", 0, 0, 0)])])
    after = snapshot(1_000, [partition("orders", 0, 1234, 5_000_000, size=3 << 20)],
                     [group("g", [offset("orders", 0, 1000, 1234, lag_ms=2500)])])
    view = build_view(after, before)
    assert topic_cells(view.topics[0]) == ("orders", "1", "3.0MiB", "1.2k", "1.2k", "5.00",
                                           "1.0k")
    for cell in topic_cells(view.topics[0]) + group_cells(view.groups[0]):
        assert " " not in cell


def test_json_is_camel_case_with_nulls_for_unknown():
    out = to_json(build_view(snapshot(partitions=[partition("orders", 0, 5)],
                                      groups=[group("g", [offset("orders", 0, 2, 5)])])))
    assert out["intervalSeconds"] is None and out["hiddenTopics"] == 0
    assert out["topics"] == [{"topic": "orders", "internal": False, "partitions": 1,
                              "sizeBytes": 0, "records": 5, "endOffset": 5,
                              "inRecordsPerSecond": None, "inBytesPerSecond": None,
                              "outRecordsPerSecond": None}]
    assert out["groups"][0] == {"group": "g", "state": "Stable", "members": 1,
                                "topics": ["orders"], "lag": 3, "lagSeconds": None,
                                "outRecordsPerSecond": None}
    assert out["broker"]["pid"] == 42 and out["broker"]["fsyncP99Seconds"] is None
