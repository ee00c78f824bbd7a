"""``bench.spark``'s streaming figure: end-to-end latency of a Structured Streaming query on the
``mq`` source and sink, record produced -> row visible in the sink, at a fixed offered rate.

The record's first 8 bytes are its *intended* send time (``time.perf_counter_ns``, the
system-wide monotonic clock), set by the open-loop producer of ``bench.e2e``
(``mq_lat_producer``: ``t_i = t0 + i / rate``, acks=1, linger 0, partition 0), so a stall of any
part shows up in the figure instead of slowing the sender (no coordinated omission). The query
copies each value unchanged, ``readStream.format("mq")`` -> ``select("value")`` ->
``writeStream.format("mq")``, with a processing-time trigger (100 ms). A consumer process reads
the output topic ``read_committed`` (a row is visible once its transaction committed) and
records receive time - intended time into an HdrHistogram.

Sides, rotated each run, each on fresh topics:

- ``spark, exactly once``: the sink's default (``mq.transactional=true``: one transaction per
  micro-batch and Spark partition);
- ``spark, at least once``: ``mq.transactional=false`` (plain acknowledged sends);
- ``no spark``: the same producer and consumer on the input topic, no query in between: the
  floor the two others are compared with.

Before its workers start, a query has run its first micro-batch (one record that the consumer
never sees: it starts at the end of the output topic), so start-up is outside the figure; the
first ``warm_s`` seconds of records are left out too.
"""

from __future__ import annotations

import os
import statistics
import time

from bench import harness
from bench.mq_workers import MQ_LATENCY, consume_latencies, mq_lat_producer
from bench.harness import hist_stats, merge_hists, run_percentiles, run_workers, summary

SIDES = ("spark, exactly once", "spark, at least once", "no spark")
TRIGGER = "100 milliseconds"
VALUE_SIZE = 100


def lat_consumer(start, socket: str, topic: str, n: int, warm: int, timeout_s: float) -> dict:
    """Every partition of ``topic`` from its end, ``read_committed``, until ``n`` records."""
    import mq
    c = mq.Consumer(socket=socket, isolation_level="read_committed")
    tps = [mq.TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
    c.assign(tps)
    c.seek_to_end()
    for tp in tps:
        c.position(tp)                         # resolved now, before the producer starts
    return consume_latencies(c, start, n, warm, timeout_s)


def _start_query(ctx, side: str, src: str, dst: str, checkpoint: str):
    """The copying query, warmed up: it has run a batch on one record before this returns."""
    import mq
    spark = ctx.spark()
    query = (spark.readStream.format("mq").option("socket", ctx.socket)
             .option("subscribe", src).option("startingOffsets", "earliest").load()
             .select("value").writeStream.format("mq").option("socket", ctx.socket)
             .option("topic", dst).option("checkpointLocation", checkpoint)
             .option("mq.transactional", str(side == "spark, exactly once").lower())
             .trigger(processingTime=TRIGGER).start())
    deadline = time.monotonic() + 120
    with mq.Producer(socket=ctx.socket) as producer:
        producer.send(src, b"\0" * VALUE_SIZE, partition=0).get(timeout=30)
    while not any(p["numInputRows"] for p in query.recentProgress):
        if time.monotonic() > deadline or not query.isActive:
            raise RuntimeError(f"query for {side} did not read: {query.exception()}")
        time.sleep(0.05)
    return query


def one_latency(ctx, side: str, r: int, rate: float, seconds: float, warm_s: float) -> dict:
    warm = int(rate * warm_s)
    n = warm + int(rate * seconds)
    timeout = warm_s + seconds + 60.0
    tag = f"{r}-{side.replace(', ', '-').replace(' ', '-')}"
    src, dst = f"lat-in-{tag}", f"lat-out-{tag}"
    ctx.create_topic(src, 1)
    ctx.create_topic(dst, 2)
    query = None
    if side != "no spark":
        query = _start_query(ctx, side, src, dst, os.path.join(ctx.base, f"ck-lat-{tag}"))
    try:
        jobs = [(mq_lat_producer, dict(socket=ctx.socket, topic=src, size=VALUE_SIZE, rate=rate,
                                       n=n, **MQ_LATENCY)),
                (lat_consumer, {"socket": ctx.socket, "topic": src if query is None else dst,
                                "n": n, "warm": warm, "timeout_s": timeout})]
        (prod, cons), _, _ = run_workers(jobs, timeout + 30)
        batches = [] if query is None else [p for p in query.recentProgress
                                            if "addBatch" in p["durationMs"]]
    finally:
        if query is not None:
            query.stop()
    span = (cons["t_last"] - prod["t_first"]) / 1e9 if cons["t_last"] else float("inf")
    achieved = cons["n"] / span
    saturated = cons["n"] < n or achieved < 0.95 * rate or prod["send_rate"] < 0.95 * rate
    durations = [p["batchDuration"] for p in batches]
    return {"side": side, "offered": rate, "n": n, "warm": warm, "received": cons["n"],
            "achieved_rate": achieved, "send_rate": prod["send_rate"],
            "saturated": saturated, "hist": cons["hist"],
            "stats": hist_stats(merge_hists([cons["hist"]])),
            "trend_mean_us": cons["trend_mean_us"],
            "batches": len(batches),
            "batch_ms_median": statistics.median(durations) if durations else None,
            "batch_ms_durations": {k: statistics.median(p["durationMs"].get(k, 0)
                                                        for p in batches)
                                   for k in ("addBatch", "walCommit", "commitOffsets",
                                             "queryPlanning", "latestOffset")}
            if batches else None}


def run_latency(ctx) -> dict:
    seconds, warm_s = (8.0, 2.0) if ctx.quick else (20.0, 3.0)
    rate = ctx.args.rate
    res: dict = {"rate": rate, "trigger": TRIGGER, "seconds_per_run": seconds,
                 "warmup_seconds": warm_s, "value_size": VALUE_SIZE, "producer": MQ_LATENCY,
                 "runs": {s: [] for s in SIDES}}
    for r in range(ctx.runs):
        order = harness.rotated(SIDES, r)
        ctx.progress(f"latency {rate:,.0f}/s: run {r + 1}/{ctx.runs} ({seconds:g} s + "
                     f"{warm_s:g} s warm-up each; order {order})")
        for side in order:
            out = one_latency(ctx, side, r, rate, seconds, warm_s)
            res["runs"][side].append(out)
            ctx.progress(f"  {side}: p50 {out['stats']['p50_us'] / 1e3:,.1f} ms, p99 "
                         f"{out['stats']['p99_us'] / 1e3:,.1f} ms, achieved "
                         f"{out['achieved_rate']:,.0f}/s"
                         f"{' SATURATED' if out['saturated'] else ''}")
    for side, runs in res["runs"].items():
        res[side] = {"merged": hist_stats(merge_hists([x["hist"] for x in runs])),
                     **run_percentiles([x["stats"] for x in runs]),
                     "achieved_rate": summary([x["achieved_rate"] for x in runs]),
                     "saturated_runs": sum(x["saturated"] for x in runs)}
    return res
