"""``mq.cli.top_model`` on a Kafka cluster (``mq top --bootstrap-server``): rate in from the
high watermarks, partitions' health from leaders and in-sync replicas, groups as on the local
broker but without the lag's age; texts and JSON."""

from __future__ import annotations

import io

from rich.console import Console
from top_snapshots import cluster_partition, cluster_snapshot, group, offset

from mq.cli.top import plain, render
from mq.cli.top_model import (
    CLUSTER_TOPIC_COLUMNS,
    build_cluster_view,
    cluster_lines,
    cluster_topic_cells,
    group_cells,
    summary_lines,
    to_json,
    topics_table,
)


def cluster_offset(topic, p, committed, end=None):
    o = offset(topic, p, committed, end)
    del o["lag_ms"]                       # a cluster does not know the lag's age
    return o


def test_rate_in_is_the_high_watermarks_advance_over_the_interval():
    before = cluster_snapshot(10_000, [cluster_partition("orders", 0, 100),
                                       cluster_partition("orders", 1, 50)])
    after = cluster_snapshot(12_000, [cluster_partition("orders", 0, 300),
                                      cluster_partition("orders", 1, 250),
                                      cluster_partition("orders", 2, 40)])   # new: from 0
    view = build_cluster_view(after, before)
    assert view.interval_seconds == 2.0
    (orders,) = view.topics
    assert orders.partitions == 3
    assert orders.in_records_per_second == (200 + 200 + 40) / 2
    assert orders.end_offset == 590 and orders.records == 590


def test_one_snapshot_or_another_cluster_gives_no_rates():
    one = cluster_snapshot(10_000, [cluster_partition("t", 0, 5)])
    assert build_cluster_view(one).topics[0].in_records_per_second is None
    other = cluster_snapshot(20_000, [cluster_partition("t", 0, 9)], cluster_id="c2")
    view = build_cluster_view(other, one)
    assert view.interval_seconds is None
    assert view.topics[0].in_records_per_second is None


def test_a_high_watermark_that_went_down_gives_no_rate():
    before = cluster_snapshot(0, [cluster_partition("t", 0, 500)])
    after = cluster_snapshot(1_000, [cluster_partition("t", 0, 10)])   # deleted, created again
    assert build_cluster_view(after, before).topics[0].in_records_per_second is None


def test_under_replicated_and_offline_partitions():
    snap = cluster_snapshot(partitions=[
        cluster_partition("t", 0, isr=(1, 2, 3)),
        cluster_partition("t", 1, isr=(1, 2)),                    # under-replicated
        cluster_partition("t", 2, leader=None, isr=()),           # offline, and under
        cluster_partition("u", 0, replicas=(2,))])
    view = build_cluster_view(snap)
    t, u = view.topics
    assert (t.replication_factor, t.under_replicated, t.offline) == (3, 2, 1)
    assert (u.replication_factor, u.under_replicated, u.offline) == (1, 0, 0)
    c = view.cluster
    assert (c.partitions, c.under_replicated, c.offline) == (4, 2, 1)
    assert c.brokers == ("1 k1:9092", "2 k2:9092", "3 k3:9092")
    assert cluster_lines(view) == (
        "cluster c1  controller 1  partitions 4  under-replicated 2  offline 1",
        "brokers 3: 1 k1:9092, 2 k2:9092, 3 k3:9092")
    assert cluster_topic_cells(t) == ("t", "3", "3", "2", "1", "0", "-", "-")


def test_groups_lag_and_rate_out_without_the_lags_age():
    parts = [cluster_partition("orders", 0, 1000)]
    before = cluster_snapshot(0, parts, [group("billing", [cluster_offset("orders", 0, 100,
                                                                          1000)])])
    after = cluster_snapshot(2_000, parts, [group("billing", [cluster_offset("orders", 0, 300,
                                                                             1000)])])
    view = build_cluster_view(after, before)
    (billing,) = view.groups
    assert billing.lag == 700 and billing.lag_seconds is None
    assert billing.out_records_per_second == 100.0
    assert view.topics[0].out_records_per_second == 100.0
    assert group_cells(billing)[3:5] == ("700", "-")


def test_texts_and_json():
    snap = cluster_snapshot(partitions=[cluster_partition("orders", 0, 7)],
                            groups=[group("g", [cluster_offset("orders", 0, 5, 7)])])
    view = build_cluster_view(snap)
    assert summary_lines(view) == cluster_lines(view)
    columns, rows = topics_table(view)
    assert columns == CLUSTER_TOPIC_COLUMNS and rows == [cluster_topic_cells(view.topics[0])]
    text = plain(view)
    assert text.startswith("cluster c1  controller 1")
    assert "TOPIC   PARTS  RF  URP  OFFLINE  RECORDS  IN-REC/S  OUT-REC/S" in text
    out = to_json(view)
    assert out["cluster"] == {"clusterId": "c1", "controller": 1,
                              "brokers": ["1 k1:9092", "2 k2:9092", "3 k3:9092"],
                              "partitions": 1, "underReplicated": 0, "offline": 0}
    assert out["topics"][0]["inRecordsPerSecond"] is None
    assert out["groups"][0]["lag"] == 2 and out["hiddenTopics"] == 0


def test_the_live_frame_draws_a_cluster_and_its_unreachable_line():
    snap = cluster_snapshot(partitions=[cluster_partition("orders", p, 10) for p in range(3)],
                            groups=[group("g", [cluster_offset("orders", 0, 5, 10)])])
    console = Console(width=80, file=io.StringIO(), force_terminal=False, color_system=None)
    console.print(render(build_cluster_view(snap), 1.0, "metadata: transport failure"))
    lines = console.file.getvalue().splitlines()
    assert lines[0] == "cluster unreachable, retrying: metadata: transport failure"
    assert lines[1].startswith("cluster c1  controller 1  partitions 3")
    assert all(len(line) <= 80 for line in lines)
    orders = next(line for line in lines if line.lstrip().startswith("orders"))
    assert orders.split() == ["orders", "3", "3", "0", "0", "30", "-", "-"]
