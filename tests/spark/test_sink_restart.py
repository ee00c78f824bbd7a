"""A streaming query killed with SIGKILL mid-batch, driver and all, then restarted from its
checkpoint: no row lost, none twice, for ``read_committed`` readers (issue 10).

The driver is this file run as a script, in its own process group with its own SparkSession;
the restarted driver is the test's own session.
Its query reads three JSON files, one a micro-batch, hash-partitions them by ``k`` into two
Spark partitions and writes them to one topic. In the first run an Arrow map holds the task of
the partition that reaches the row ``f1-BLOCK`` (the last row of batch 1) until the kill, after
passing on its earlier rows in 5-row batches: the other partition's transaction for batch 1 is
committed, this one's is open with some of its rows appended. The checkpoint has
``offsets/1`` but no ``commits/1``, so the restarted driver replays batch 1: the committed
partition finds its marker and writes nothing; the other fences the dead attempt (aborting its
transaction) and writes its rows once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

import mq
import mq.testing

pytestmark = pytest.mark.spark

ROWS = 20                    # per file; k = 0..19, the last row of file 1 is "f1-BLOCK"
FILES = 3
# A local-mode JVM starts in about 10 s and the first run reaches the kill in about 25 s on an
# idle box; 3 to 4 times that on a box shared with other test runs. Waits end when done.
TIMEOUT = 300.0
PAD = b"p" * 16384


def query(spark, socket_path: str, inputs: str, checkpoint: str, hold: str):
    """Start the query. With ``hold`` (a path), the task reaching ``f1-BLOCK`` writes its pid
    there and waits until it is killed."""
    def hold_at_block(batches):
        import pyarrow as pa
        for batch in batches:
            if hold and any(v.endswith("BLOCK") for v in batch.column(0).to_pylist()):
                with open(hold + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(hold + ".tmp", hold)
                threading.Event().wait()           # until the kill
            # 16 KiB a row, which the sink ignores: Python workers write to a 64 KiB buffer,
            # so a batch of 5 rows goes on at once, before this task holds.
            pad = pa.array([PAD] * batch.num_rows, pa.binary())
            yield pa.RecordBatch.from_arrays([batch.column(0), pad], ["value", "pad"])

    df = (spark.readStream.schema("k int, v string").option("maxFilesPerTrigger", 1)
          .json(inputs).repartition(2, "k").selectExpr("v AS value")
          .mapInArrow(hold_at_block, "value string, pad binary"))
    return (df.writeStream.format("mq").option("socket", socket_path).option("topic", "out")
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def _driver(socket_path: str, inputs: str, checkpoint: str, started: str, hold: str) -> None:
    """The driver process to kill: runs the query, holding at ``f1-BLOCK``; ``started`` gets
    the query id."""
    from pyspark.sql import SparkSession

    import mq.spark

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("mq-sink-restart")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "5")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    mq.spark.register(spark)
    q = query(spark, socket_path, inputs, checkpoint, hold)
    with open(started + ".tmp", "w") as f:       # renamed whole: never seen empty
        f.write(q.id)
    os.rename(started + ".tmp", started)
    q.awaitTermination()


def start_driver(b, tmp_path) -> subprocess.Popen:
    args = [sys.executable, __file__, b.socket, str(tmp_path / "in"), str(tmp_path / "ck"),
            str(tmp_path / "started"), str(tmp_path / "held")]
    with open(tmp_path / "driver.log", "wb") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env=dict(os.environ, PYSPARK_PYTHON=sys.executable))


def wait(condition, driver: subprocess.Popen, tmp_path, message: str) -> None:
    """``wait_for``, failing at once (with the driver's output) if the driver died."""
    def ready():
        if driver.poll() is not None and not condition():
            out = (tmp_path / "driver.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"the driver exited ({driver.returncode}) before {message}:"
                                 f"\n{out}")
        return condition()
    mq.testing.wait_for(ready, timeout=TIMEOUT, interval=0.05, message=message)


def read_values(b, isolation_level: str) -> list[str]:
    out = []
    with mq.Consumer("out", socket=b.socket, value_bytes=True,
                     isolation_level=isolation_level) as consumer:
        consumer.seek_to_beginning()
        tp = mq.TopicPartition("out", 0)
        end = consumer.end_offsets([tp])[tp]
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=1000).values():
                out += [r.value.decode() for r in records]
    return sorted(out)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_driver_killed_mid_batch_restarts_with_no_loss_and_no_duplicates(spark, tmp_path):
    """The killed driver is a subprocess; the restart is this process's SparkSession, a new
    driver on the same checkpoint."""
    # Which Spark partition each k hashes to (repartition(2, "k") is pmod(hash(k), 2)).
    part = {r.k: r.p for r in spark.range(ROWS).selectExpr("CAST(id AS INT) AS k")
            .selectExpr("k", "pmod(hash(k), 2) AS p").collect()}
    other = sum(1 for k in range(ROWS) if part[k] != part[ROWS - 1])
    (tmp_path / "in").mkdir()
    values = []
    for f in range(FILES):
        rows = [(k, f"f{f}-{k}") for k in range(ROWS)]
        if f == 1:
            rows[-1] = (ROWS - 1, "f1-BLOCK")
        path = tmp_path / "in" / f"part-{f}.json"
        path.write_text("".join(json.dumps({"k": k, "v": v}) + "\n" for k, v in rows))
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
        values += [v for _, v in rows]

    with mq.testing.broker(tmp_path / "data") as b:
        with mq.Admin(b.socket) as admin:
            admin.create_topic("out", 1)
        driver = start_driver(b, tmp_path)
        try:
            wait(lambda: (tmp_path / "started").exists(), driver, tmp_path,
                 "the query to start")
            query_id = (tmp_path / "started").read_text()
            committed = f"mq-spark-sink-{query_id}-{1 - part[ROWS - 1]}"
            # Batch 0 (20 rows, 2 markers), batch 1's other partition (rows and a marker),
            # then some rows of the held partition's open transaction.
            settled = ROWS + 2 + other + 1

            def mid_batch():
                if not (tmp_path / "held").exists():
                    return False
                with mq.Admin(b.socket) as admin:
                    if admin.list_group_offsets(committed) != {mq.TopicPartition("out", 0): 2}:
                        return False
                    return admin.describe_topic("out")["offsets"][0][1] > settled
            wait(mid_batch, driver, tmp_path, "batch 1 half committed, half open")
            held_pid = int((tmp_path / "held").read_text())
        finally:
            os.killpg(driver.pid, signal.SIGKILL)     # the driver and its JVM, at once
            driver.wait()
        assert (tmp_path / "ck" / "offsets" / "1").exists()
        assert not (tmp_path / "ck" / "commits" / "1").exists()
        # The held Python worker goes with its JVM (pyspark's daemon hangs up on its workers).
        mq.testing.wait_for(lambda: not alive(held_pid), timeout=TIMEOUT,
                            message=f"the held worker {held_pid} to exit")

        restarted = query(spark, b.socket, str(tmp_path / "in"), str(tmp_path / "ck"), "")
        restarted.awaitTermination()
        assert restarted.id == query_id
        batches = [(p["batchId"], p["numInputRows"]) for p in restarted.recentProgress]
        assert batches == [(1, ROWS), (2, ROWS)]      # batch 1 replayed, same input

        assert read_values(b, "read_committed") == sorted(values)
        # The dead attempt's rows are still in the log, aborted: read_uncommitted sees them.
        uncommitted = read_values(b, "read_uncommitted")
        assert len(uncommitted) > len(values) and set(uncommitted) == set(values)


if __name__ == "__main__":
    _driver(*sys.argv[1:])
