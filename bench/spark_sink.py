"""The ``mq`` Spark sink's write throughput against ``mq.Producer`` alone, in the same run.

::

    python3 -m bench.spark_sink [--rows 1000000] [--runs 5] [--partitions 2] [--quick]
                                [--out bench/out/spark_sink.json] [--dir /tmp] [--wait-idle S]

Every side writes ``--rows`` records of 100 B values (distinct, no key) to a fresh topic of
``--partitions`` partitions on one broker (a subprocess on a temp data dir), ``acks="all"``
(each record acknowledged after an fsync covering it). Sides, rotated each run:

- ``df.write``: ``spark.range(rows)`` in 2 Spark partitions on ``local[2]``, the value built in
  Spark (``concat(lpad(id, 12), 88 x "v")`` as binary), ``df.write.format("mq")``: the batch
  sink, at least once. The time is the ``save()`` call: planning, two write tasks (each an
  ``mq.Producer`` fed from Arrow batches) and the driver's commit.
- ``writeStream``: the same rows from a Parquet directory (written once, untimed), one
  micro-batch with ``Trigger.AvailableNow`` into ``writeStream.format("mq")`` with
  ``mq.transactional=true`` (the default: exactly once; one transaction per Spark partition).
  The time is ``start()`` to ``awaitTermination()``.
- ``noop``: the ``df.write`` DataFrame into Spark's ``noop`` sink: what Spark takes to make the
  rows, without Python or mq.
- ``Producer x1`` / ``Producer x2``: forked processes (``bench.harness.run_workers``), each
  sending its share of the same values from a prebuilt list with ``send()`` then ``flush()``;
  the time is the first start to the last flush. x1 is the figure the sink is compared with;
  x2 uses both cores, as the two Spark tasks do.

The ratio column is sink rows/s over ``Producer x1`` rows/s, per run (median and min-max).
Prints the table on stdout, progress on stderr, every number as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

from bench import harness
from bench.harness import Rows, format_table, machine_facts, mm, rotated, summary, write_json

progress = harness.progress_printer("spark-sink")

VALUE_BYTES = 100
SIDES = ("df.write", "writeStream", "noop", "Producer x1", "Producer x2")


def value(i: int) -> bytes:
    """The value of row ``i``, as Spark builds it in ``values_frame``."""
    return str(i).rjust(12).encode() + b"v" * (VALUE_BYTES - 12)


def values_frame(spark, rows: int):
    return spark.range(0, rows, 1, 2).selectExpr(
        f"CAST(concat(lpad(CAST(id AS STRING), 12, ' '), repeat('v', {VALUE_BYTES - 12})) "
        "AS BINARY) AS value")


def _producer_worker(start, socket_path: str, topic: str, first: int, count: int) -> dict:
    import mq
    values = [value(i) for i in range(first, first + count)]
    with mq.Producer(socket=socket_path) as producer:
        producer.partitions_for(topic)               # metadata before the clock starts
        harness.quiet_gc()
        start()
        t0 = time.perf_counter_ns()
        send = producer.send
        for v in values:
            send(topic, v)
        producer.flush()
        t1 = time.perf_counter_ns()
    return {"t0": t0, "t1": t1}


def producers(socket_path: str, topic: str, rows: int, procs: int) -> float:
    share = rows // procs
    jobs = [(_producer_worker, {"socket_path": socket_path, "topic": topic,
                                "first": i * share, "count": share}) for i in range(procs)]
    results, _, _ = harness.run_workers(jobs, timeout=600)
    return (max(r["t1"] for r in results) - min(r["t0"] for r in results)) / 1e9


def spark_session():
    from pyspark.sql import SparkSession

    import mq.spark
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("bench-spark-sink")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    mq.spark.register(spark)
    return spark


def end_offsets(socket_path: str, topic: str) -> int:
    import mq
    with mq.Admin(socket_path) as admin:
        return sum(end for _, end in admin.describe_topic(topic)["offsets"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.spark_sink", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="records per side and run")
    p.add_argument("--runs", type=int, default=5, help="repetitions (>= 5 for the method)")
    p.add_argument("--partitions", type=int, default=2, help="partitions of each topic")
    p.add_argument("--quick", action="store_true", help="200k rows, 3 runs")
    harness.add_run_arguments(p, "spark_sink", dir_help="parent of the temp dir (broker data, "
                              "Parquet, checkpoints); a real disk, not tmpfs")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.runs = 200_000, 3
    if args.runs < 5:
        progress(f"warning: --runs {args.runs} is below the method's minimum of 5")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import mq
    import mq.testing

    idle = harness.wait_idle(args.wait_idle, progress=progress)
    base = tempfile.mkdtemp(prefix="mq-spark-sink-", dir=args.dir)
    broker = mq.testing.BrokerProcess(os.path.join(base, "data"))
    res: dict = {"meta": machine_facts(base, wait_idle=idle), "params": vars(args), "runs": []}
    try:
        broker.start()
        sock = broker.socket
        spark = spark_session()
        frame = values_frame(spark, args.rows)
        parquet = os.path.join(base, "input.parquet")
        frame.write.parquet(parquet)
        schema = spark.read.parquet(parquet).schema
        frame.write.format("noop").mode("overwrite").save()        # warm-up: workers, JIT
        with mq.Admin(sock) as admin:
            admin.create_topic("warmup", args.partitions)
        values_frame(spark, 1000).write.format("mq").option("socket", sock) \
            .option("topic", "warmup").mode("append").save()

        def run_side(side: str, r: int) -> float:
            topic = f"{side.replace(' ', '').replace('.', '')}-{r}"
            with mq.Admin(sock) as admin:
                admin.create_topic(topic, args.partitions)
            t0 = time.perf_counter()
            if side == "df.write":
                frame.write.format("mq").option("socket", sock).option("topic", topic) \
                    .mode("append").save()
            elif side == "writeStream":
                q = (spark.readStream.schema(schema).parquet(parquet).writeStream
                     .format("mq").option("socket", sock).option("topic", topic)
                     .option("checkpointLocation", os.path.join(base, f"ck-{r}"))
                     .trigger(availableNow=True).start())
                q.awaitTermination()
            elif side == "noop":
                frame.write.format("noop").mode("overwrite").save()
            else:
                return producers(sock, topic, args.rows, int(side[-1]))
            seconds = time.perf_counter() - t0
            if side != "noop":
                written = end_offsets(sock, topic)
                want = args.rows + (2 if side == "writeStream" else 0) * args.partitions
                if written < args.rows or written > want:
                    raise RuntimeError(f"{side}: {written} offsets in {topic}, expected "
                                       f"{args.rows} records (+ commit markers)")
            return seconds

        for r in range(args.runs):
            meter = harness.FamilyMeter()
            run = {}
            for side in rotated(SIDES, r):
                run[side] = args.rows / run_side(side, r)
                progress(f"run {r + 1}/{args.runs} {side}: {run[side] / 1e3:,.0f} k rows/s")
            run["contention"] = c = meter.stop()
            harness.warn_if_busy(c, f"run {r + 1}: ", progress)
            res["runs"].append(run)
        spark.stop()
    finally:
        broker.close()
        shutil.rmtree(base, ignore_errors=True)

    rows = Rows()
    res["summary"] = {}
    for side in SIDES:
        s = summary([run[side] for run in res["runs"]])
        ratios = [run[side] / run["Producer x1"] for run in res["runs"]]
        res["summary"][side] = {"rows_per_s": s, "ratio_vs_producer_x1": summary(ratios)}
        ratio = "-" if side == "Producer x1" else \
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        rows.add(f"{side} {VALUE_BYTES} B", mm(s, lambda x: f"{x / 1e3:,.0f}k"), "rows/s",
                 ratio)
    other = [run["contention"]["other_cpus"] for run in res["runs"]]
    print(f"{args.rows:,} rows a side, {args.runs} runs; other processes used "
          f"{statistics.median(other):.2f} CPUs (median) of {os.cpu_count()}")
    print(format_table(rows))
    write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
