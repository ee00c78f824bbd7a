"""``mq demo --spark``'s counting and checks, pure: progress reports in the shape
``StreamingQuery.recentProgress`` gives them, totals as the JSON dicts of the topic."""

from __future__ import annotations

import json
from decimal import Decimal

from mq.cli.demo_spark_report import (
    QueryStats,
    compare_totals,
    distinct_totals,
    parse_time,
    report,
    seconds_behind,
)


def progress(batch: int, rows_in: int, removed: int, ends: dict, state: int,
             start: str = "2026-11-25T00:00:00.000Z", dropped: int = 0, idle: bool = False):
    durations = {"triggerExecution": 5, "latestOffset": 1} if idle else \
        {"addBatch": 900, "triggerExecution": 1000}
    return {"batchId": batch, "timestamp": start, "batchDuration": 1000, "durationMs": durations,
            "numInputRows": rows_in,
            "stateOperators": [{"numRowsTotal": state, "numRowsRemoved": removed,
                                "numRowsDroppedByWatermark": dropped}],
            "sources": [{"endOffset": json.dumps({"orders": ends})}]}


def test_each_batch_counts_once_and_idle_reports_not_at_all():
    stats = QueryStats("q")
    reports = [progress(0, 1, 0, {"0": 1, "1": 0}, 0),
               progress(1, 500, 0, {"0": 300, "1": 201}, 40, "2026-11-25T00:00:01.000Z")]
    for _ in range(3):                       # recentProgress is read again and again
        for p in reports:
            stats.add(p)
    stats.add(progress(2, 0, 0, {"0": 300, "1": 201}, 40, idle=True))
    assert (len(stats.batches), stats.rows_in, stats.rows_out) == (2, 501, 0)
    assert stats.processed == 501 and stats.state_rows == 40
    stats.add(progress(3, 1, 39, {"0": 301, "1": 201}, 2, "2026-11-25T00:00:03.000Z", 3))
    assert (stats.rows_in, stats.rows_out, stats.dropped) == (502, 39, 3)
    ends = {("orders", "0"): 301, ("orders", "1"): 201}
    assert stats.has_read(ends) and not stats.caught_up(ends)      # a window still open
    stats.add(progress(4, 0, 1, {"0": 301, "1": 201}, 1, "2026-11-25T00:00:04.500Z"))
    assert stats.caught_up(ends)
    assert not stats.caught_up({**ends, ("orders", "2"): 1})         # a partition added
    assert stats.span(parse_time("2026-11-25T00:00:00.500Z")) == 5.0
    assert stats.median_batch_s() == 1.0


def test_seconds_behind_is_the_age_of_the_oldest_record_not_read():
    history = [(10.0, 0), (11.0, 100), (12.0, 250), (13.0, 250)]
    assert seconds_behind(history, 250, 14.0) == 0.0
    assert seconds_behind(history, 100, 14.0) == 2.0       # record 101 arrived by 12.0
    assert seconds_behind(history, 0, 14.0) == 3.0


def total(start: str, customer: str, orders: int, amount: str) -> dict:
    return {"window_start": f"2026-11-25T00:00:{start}.000Z",
            "window_end": f"2026-11-25T00:00:{int(start) + 5:02d}.000Z", "customer": customer,
            "orders": orders, "amount": Decimal(amount),
            "last_order_at": f"2026-11-25T00:00:{int(start) + 4:02d}.900Z"}


def test_totals_must_be_once_and_the_same_in_both_sinks():
    a, b = total("00", "customer-1", 3, "30.00"), total("05", "customer-1", 1, "1.50")
    assert compare_totals([a, b], [b, a]) == []
    assert compare_totals([a, b, b], [a, b]) == ["1 totals are in the topic twice"]
    assert compare_totals([a, {**b, "orders": 2}], [a, b]) == [
        "the topic's 2 totals differ from Parquet's 2"]
    assert compare_totals([a], [a, b]) == ["the topic's 1 totals differ from Parquet's 2"]


def test_an_at_least_once_topic_may_hold_a_total_again_but_the_same():
    """Spark's Kafka sink: a micro-batch written again writes the same totals again; the
    first of each (window, customer) must match Parquet, and a later one the first."""
    a, b = total("00", "customer-1", 3, "30.00"), total("05", "customer-1", 1, "1.50")
    assert distinct_totals([a, b, dict(a), dict(b), dict(a)]) == ([a, b], 3, 0)
    assert compare_totals([a, b, dict(a)], [b, a], at_least_once=True) == []
    assert compare_totals([a, b, {**a, "orders": 4}], [a, b], at_least_once=True) == [
        "1 totals are in the topic again with other values"]
    assert compare_totals([a, a], [a, b], at_least_once=True) == [
        "the topic's 1 totals differ from Parquet's 2"]


def test_the_summary_checks_the_totals_against_what_was_produced():
    stats = QueryStats("totals-to-mq")
    stats.add(progress(0, 5, 2, {"0": 5}, 1, "2026-11-25T00:00:10.000Z"))
    totals = [total("00", "customer-1", 3, "30.00"), total("00", "customer-2", 1, "1.50")]
    topic = [(parse_time("2026-11-25T00:00:11.000Z") * 1000, t) for t in totals]
    producers = [{"orders": 2, "cents": 3000, "seconds": 1.0},
                 {"orders": 2, "cents": 150, "seconds": 2.0}]
    text, problems = report(4, 2, producers, [stats], parse_time("2026-11-25T00:00:09.000Z"),
                            topic, totals, 5)
    assert problems == []
    assert "2 totals in the topic, 2 in Parquet; 4 orders, amount 31.50: OK" in text
    assert "p50 6.1 s, max 6.1 s" in text
    assert "totals-to-mq                        5 rows in, 2 rows out in 2.0 s: 2 rows/s in, " \
        "1.0 rows/s out; 1 micro-batches (median 1.0 s)" in text
    assert "guarantees: 'order-totals' (mq's sink) exactly once per micro-batch" in text
    text, problems = report(5, 2, producers, [stats], 0.0, topic, totals, 5)
    assert problems == ["the totals count 4 orders, 0 were dropped as late, but 5 were produced"]
    assert "MISMATCH" in text


def test_on_kafka_totals_written_again_count_once_and_parquet_is_the_truth():
    stats = QueryStats("totals-to-kafka")
    stats.add(progress(0, 5, 2, {"0": 5}, 1, "2026-11-25T00:00:10.000Z"))
    totals = [total("00", "customer-1", 3, "30.00"), total("00", "customer-2", 1, "1.50")]
    written = parse_time("2026-11-25T00:00:11.000Z") * 1000
    topic = [(written, t) for t in totals] + [(written + 3000, dict(totals[0]))]
    producers = [{"orders": 2, "cents": 3000, "seconds": 1.0},
                 {"orders": 2, "cents": 150, "seconds": 2.0}]
    kw = {"cluster": "k1:9092", "orders_topic": "mq-demo-orders",
          "totals_topic": "mq-demo-order-totals"}
    text, problems = report(4, 2, producers, [stats], 0.0, topic, totals, 5, **kw)
    assert problems == []
    assert "from the topic 'mq-demo-orders' to the topic 'mq-demo-order-totals' and to " \
        "Parquet on the Kafka cluster at k1:9092\n" in text
    assert "2 totals in the topic (and 1 written again, the same), 2 in Parquet; 4 orders, " \
        "amount 31.50: OK" in text
    assert "p50 6.1 s, max 6.1 s" in text           # a total's first write
    assert "guarantees: Parquet (Spark's file sink) exactly once, the source of truth; " \
        "'mq-demo-order-totals' (Spark's Kafka sink, no transactions) at least once" in text
    topic[-1] = (written, {**totals[0], "amount": Decimal("31.00")})
    text, problems = report(4, 2, producers, [stats], 0.0, topic, totals, 5, **kw)
    assert problems == ["1 totals are in the topic again with other values"]
