"""The ``mq`` sink in Structured Streaming against a real broker: one transaction per micro-batch
and Spark partition, a batch Spark replays (its ``commits/N`` gone) or a failed task's batch
rerun after a restart adds nothing (``mq.transactional``, the default), and duplicates without
it (Kafka's at least once). The input is a directory of JSON files read one file a batch, with
``Trigger.AvailableNow``, so every run is the same batches."""

from __future__ import annotations

import json
import os
import threading

import pytest
from source_helpers import read_all

import mq
import mq.testing
from mq.spark.sink_plan import SinkColumns, StreamTask, WriteOptions
from mq.spark.writer import Sink

pytestmark = pytest.mark.spark


def write_inputs(directory, files: int, rows: int) -> list[str]:
    """``files`` JSON-lines files of ``rows`` rows ``{"k": i, "v": "f<file>-<i>"}``, their
    modification times one second apart so the file source takes them in this order."""
    directory.mkdir()
    values = []
    for f in range(files):
        path = directory / f"part-{f}.json"
        path.write_text("".join(json.dumps({"k": i, "v": f"f{f}-{i}"}) + "\n"
                                for i in range(rows)))
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
        values += [f"f{f}-{i}" for i in range(rows)]
    return values


def start(spark, b, inputs, checkpoint, topic: str, transform=None, **options):
    """The test query: one input file a batch, two Spark partitions, to the mq sink."""
    df = spark.readStream.schema("k int, v string").option("maxFilesPerTrigger", 1) \
        .json(str(inputs)).repartition(2).selectExpr("v AS value")
    if transform is not None:
        df = df.mapInArrow(transform, "value string")
    writer = df.writeStream.format("mq").option("socket", b.socket).option("topic", topic) \
        .option("checkpointLocation", str(checkpoint))
    for name, value in options.items():
        writer = writer.option(name, value)
    return writer.trigger(availableNow=True).start()


def run(spark, *args, **options):
    query = start(spark, *args, **options)
    query.awaitTermination()
    return query


def end_offset(b, topic: str) -> int:
    with mq.Admin(b.socket) as admin:
        return admin.describe_topic(topic)["offsets"][0][1]


def test_each_batch_commits_once_per_spark_partition(spark, broker, tmp_path):
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("out", 1)
    values = write_inputs(tmp_path / "in", files=3, rows=10)
    query = run(spark, broker, tmp_path / "in", tmp_path / "ck", "out")
    assert [p["numInputRows"] for p in query.recentProgress] == [10, 10, 10]
    records = read_all(broker, "out")
    assert sorted(r.value.decode() for r in records) == sorted(values)
    # 30 records and one COMMIT marker per transaction: 3 batches x 2 Spark partitions.
    assert end_offset(broker, "out") == 30 + 3 * 2
    with mq.Admin(broker.socket) as admin:
        ids = [f"mq-spark-sink-{query.id}-{p}" for p in (0, 1)]
        for tid in ids:           # the marker: the next batch id, in the group of the same name
            assert admin.list_group_offsets(tid) == {mq.TopicPartition("out", 0): 3}
        states = {t["transactional_id"]: t["state"] for t in admin.list_transactions()}
        assert {tid: states[tid] for tid in ids} == dict.fromkeys(ids, "CompleteCommit")


@pytest.mark.parametrize("transactional", ["true", "false"])
def test_a_batch_spark_replays_is_written_once_unless_not_transactional(
        spark, broker, tmp_path, transactional):
    """Spark replays batch 2 after its ``commits/2`` is deleted (as when the driver dies
    between the sink's commit and the checkpoint's): transactional, its partitions find their
    markers and write nothing; with mq.transactional=false its rows are written twice."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("out", 1)
    values = write_inputs(tmp_path / "in", files=3, rows=10)
    args = (broker, tmp_path / "in", tmp_path / "ck", "out")
    run(spark, *args, **{"mq.transactional": transactional})
    end = end_offset(broker, "out")
    for name in ("2", ".2.crc"):
        (tmp_path / "ck" / "commits" / name).unlink(missing_ok=True)
    replay = run(spark, *args, **{"mq.transactional": transactional})
    assert [(p["batchId"], p["numInputRows"]) for p in replay.recentProgress] == [(2, 10)]
    got = sorted(r.value.decode() for r in read_all(broker, "out"))
    if transactional == "true":
        assert got == sorted(values)
        assert end_offset(broker, "out") == end          # not even an empty transaction
    else:
        assert got == sorted(values + [v for v in values if v.startswith("f2-")])


def test_a_failed_task_is_aborted_and_the_restarted_query_writes_only_the_rest(
        spark, broker, tmp_path):
    """Partition 1 fails once partition 0 has committed: the query stops with batch 0 half
    written (read_committed readers see partition 0's rows); restarted from the checkpoint,
    Spark replays batch 0, partition 0 finds its marker and only partition 1 writes."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("out", 1)
    values = write_inputs(tmp_path / "in", files=1, rows=20)
    flag = tmp_path / "fail"
    flag.touch()
    sock, fail = broker.socket, str(flag)

    def fail_partition_1_once(batches):
        from pyspark import TaskContext
        if os.path.exists(fail) and TaskContext.get().partitionId() == 1:
            tp = mq.TopicPartition("out", 0)
            with mq.Consumer("out", socket=sock, isolation_level="read_committed") as c:
                mq.testing.wait_for(lambda: c.end_offsets([tp])[tp] >= 11, timeout=60,
                                    message="partition 0's 10 rows and its commit marker")
            raise RuntimeError("injected failure in partition 1")
        yield from batches

    args = (broker, tmp_path / "in", tmp_path / "ck", "out", fail_partition_1_once)
    with pytest.raises(Exception, match="injected failure in partition 1"):
        run(spark, *args)
    first = [r.value.decode() for r in read_all(broker, "out")]
    assert len(first) == 10 and set(first) < set(values)
    assert not (tmp_path / "ck" / "commits" / "0").exists()
    flag.unlink()
    run(spark, *args)
    assert sorted(r.value.decode() for r in read_all(broker, "out")) == sorted(values)


def test_complete_mode_appends_the_whole_result_each_batch(spark, broker, tmp_path):
    """Complete output mode (Spark passes ``overwrite``) is taken, as Kafka's sink takes it: a
    topic cannot be truncated, so each batch appends every row of the result."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("counts", 1)
    write_inputs(tmp_path / "in", files=2, rows=4)
    counts = spark.readStream.schema("k int, v string").option("maxFilesPerTrigger", 1) \
        .json(str(tmp_path / "in")).groupBy("k").count() \
        .selectExpr("CAST(k AS STRING) AS key", "CAST(count AS STRING) AS value")
    query = counts.writeStream.format("mq").outputMode("complete") \
        .option("socket", broker.socket).option("topic", "counts") \
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    query.awaitTermination()
    got = [(r.key, r.value) for r in read_all(broker, "counts")]
    assert sorted(got) == sorted([(str(k).encode(), b"1") for k in range(4)]
                                 + [(str(k).encode(), b"2") for k in range(4)])


def test_a_task_fences_the_attempt_before_it_and_closes_its_producer(broker):
    """The write task's protocol without Spark: an earlier attempt of the same task (its
    transaction open, rows sent) is fenced; a replay finds the marker and writes nothing; an
    empty task opens no transaction; every producer is closed when the task returns."""
    import pyarrow as pa

    with mq.Admin(broker.socket) as admin:
        admin.create_topic("out", 2)
    task = StreamTask("query", 4, 1)
    rows = pa.record_batch([pa.array([b"a", b"b", b"c"], pa.binary())], names=["value"])
    sink = Sink(WriteOptions("out", broker.socket, transactional=True),
                SinkColumns(0, topic_option="out"))
    zombie = mq.Producer(socket=broker.socket, transactional_id=task.transactional_id)
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("out", b"zombie", partition=0).get(timeout=30)

    result = sink.write_exactly_once(iter([rows]), task)
    assert (result.rows, result.skipped, result.transactional_id) == \
        (3, False, "mq-spark-sink-query-1")
    with pytest.raises(mq.ProducerFencedError):
        zombie.commit_transaction()
    zombie.close()
    replay = sink.write_exactly_once(iter([rows]), task)
    assert (replay.rows, replay.skipped) == (0, True)
    empty = sink.write_exactly_once(iter([rows.slice(0, 0)]), StreamTask("query", 5, 1))
    assert (empty.rows, empty.skipped) == (0, False)

    assert sorted(r.value for r in read_all(broker, "out")) == [b"a", b"b", b"c"]
    assert b"zombie" in {r.value for r in read_all(broker, "out", "read_uncommitted")}
    with mq.Admin(broker.socket) as admin:
        assert admin.list_group_offsets("mq-spark-sink-query-1") == \
            {mq.TopicPartition("out", 0): 5}
    assert not [t for t in threading.enumerate() if t.name == "mq-producer-mq-spark-sink"]
