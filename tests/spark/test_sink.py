"""The ``mq`` sink in batch (``df.write``) against a real broker: Kafka's sink columns and
options, the client partitioner for null partitions, errors at planning, and what a failed
write leaves (at least once, as Kafka). Streaming writes: test_sink_stream.py; a driver killed
mid-batch: test_sink_restart.py."""

from __future__ import annotations

import pytest
from source_helpers import create_topic, read_all

import mq
import mq.testing
from mq.client.partitioner import keyed_partition

pytestmark = pytest.mark.spark


def save(df, b, mode: str = "append", **options):
    writer = df.write.format("mq").option("socket", b.socket).mode(mode)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def test_value_only_with_the_topic_option(spark, broker):
    create_topic(broker, "out", 3)
    df = spark.range(0, 200, 1, 2).selectExpr("CAST(id AS STRING) AS value")
    save(df, broker, topic="out")
    records = read_all(broker, "out")
    assert sorted(int(r.value) for r in records) == list(range(200))
    assert all(r.key is None and list(r.headers) == [] for r in records)
    # Idempotent producers with acks=all: plain (non-transactional) batches.
    assert {r.topic for r in records} == {"out"}


def test_key_topic_partition_and_headers_columns(spark, broker):
    create_topic(broker, "a", 2)
    create_topic(broker, "b", 3)
    rows = [("a", 1, "k1", "v1", [("h", b"x"), ("h", b"y")]),
            ("b", 2, "k2", "v2", []),
            ("b", 0, None, "v3", None),
            ("a", 0, "k4", "v4", [("n", None)])]
    schema = ("topic string, partition int, key string, value string, "
              "headers array<struct<key: string, value: binary>>")
    df = spark.createDataFrame(rows, schema).repartition(2)
    save(df, broker)
    got = {r.value: r for r in read_all(broker, "a") + read_all(broker, "b")}
    assert sorted(got) == [b"v1", b"v2", b"v3", b"v4"]
    for topic, partition, key, value, headers in rows:
        r = got[value.encode()]
        assert (r.topic, r.partition) == (topic, partition)
        assert r.key == (key.encode() if key is not None else None)
        assert [(k, None if v is None else bytes(v)) for k, v in r.headers] == \
            [(k, v) for k, v in headers or []]


def test_the_topic_option_overrides_the_topic_column(spark, broker):
    create_topic(broker, "chosen")
    df = spark.createDataFrame([("elsewhere", "v")], "topic string, value string")
    save(df, broker, topic="chosen")
    assert [r.value for r in read_all(broker, "chosen")] == [b"v"]


def test_string_and_binary_values_and_keys_and_nulls(spark, broker):
    create_topic(broker, "s")
    create_topic(broker, "bin")
    text = spark.createDataFrame([("k", "é"), (None, ""), ("n", None)], "key string, value string")
    save(text, broker, topic="s")
    raw = spark.createDataFrame([(b"\x00\xff", b"\x01\x02"), (None, None)],
                                "key binary, value binary")
    save(raw, broker, topic="bin")
    assert {(r.key, r.value) for r in read_all(broker, "s")} == \
        {(b"k", "é".encode()), (None, b""), (b"n", None)}
    assert {(r.key, r.value) for r in read_all(broker, "bin")} == \
        {(b"\x00\xff", b"\x01\x02"), (None, None)}


def test_a_null_partition_is_chosen_by_the_producers_partitioner(spark, broker):
    create_topic(broker, "spark", 5)
    create_topic(broker, "client", 5)
    keys = [f"user-{i}" for i in range(60)]
    df = spark.createDataFrame([(k, k, None) for k in keys],
                               "key string, value string, partition int").repartition(2)
    save(df, broker, topic="spark")
    with mq.Producer(socket=broker.socket) as producer:
        futures = {k: producer.send("client", value=k.encode(), key=k.encode()) for k in keys}
        expected = {k: f.get(timeout=30).partition for k, f in futures.items()}
    got = {r.key.decode(): r.partition for r in read_all(broker, "spark")}
    assert got == expected
    assert got == {k: keyed_partition(k.encode(), 5) for k in keys}
    assert len(set(got.values())) == 5


@pytest.mark.parametrize(("columns", "options", "mode", "message"), [
    ("CAST(id AS STRING) AS key", {"topic": "t"}, "append",
     "the input needs a 'value' column"),
    ("id AS value", {"topic": "t"}, "append", "column 'value' must be string or binary, got "
                                              "bigint"),
    ("CAST(id AS STRING) AS value", {}, "append", "no topic: set the topic option"),
    ("CAST(id AS STRING) AS value, 1 AS topic", {}, "append",
     "column 'topic' must be string, got int"),
    ("CAST(id AS STRING) AS value, id AS partition", {"topic": "t"}, "append",
     "column 'partition' must be int"),
    ("CAST(id AS STRING) AS value, array('x') AS headers", {"topic": "t"}, "append",
     "column 'headers' must be array<struct<key: string, value: binary>>"),
    ("CAST(id AS STRING) AS value", {"topic": "t", "subscribe": "t"}, "append",
     "unknown option 'subscribe'"),
    ("CAST(id AS STRING) AS value", {"topic": "t", "kafka.bootstrap.servers": "h:9092"},
     "append", "not bootstrap servers"),
    ("CAST(id AS STRING) AS value", {"topic": "t", "mq.transactional": "true"}, "append",
     "mq.transactional=true applies to streaming writes"),
    ("CAST(id AS STRING) AS value", {"topic": "t", "kafka.linger.ms": "soon"}, "append",
     "kafka.linger.ms='soon' is not a number"),
    ("CAST(id AS STRING) AS value", {"topic": "t"}, "overwrite",
     "save mode overwrite is not supported"),
    ("CAST(id AS STRING) AS value", {"topic": "t"}, "errorifexists",
     "UNSUPPORTED_DATA_SOURCE_SAVE_MODE"),
])
def test_bad_columns_options_and_modes_fail_at_planning(spark, broker, columns, options, mode,
                                                       message):
    create_topic(broker, "t")
    df = spark.range(3).selectExpr(*columns.split(", "))
    with pytest.raises(Exception) as info:
        save(df, broker, mode=mode, **options)
    assert message in str(info.value)
    assert read_all(broker, "t") == []


def test_options_are_case_insensitive(spark, broker):
    create_topic(broker, "Mixed")
    df = spark.range(5).selectExpr("CAST(id AS STRING) AS value")
    df.write.format("mq").option("SOCKET", broker.socket).option("Topic", "Mixed") \
        .option("KAFKA.LINGER.MS", 0).mode("append").save()
    assert len(read_all(broker, "Mixed")) == 5


def test_a_failed_task_fails_the_write_and_what_succeeded_stays(spark, broker):
    """Kafka's at-least-once: partition 1 fails only once partition 0's 50 rows are in the
    topic; the job fails (``abort``), and those rows stay (a rerun would write them again)."""
    from pyspark import TaskContext

    create_topic(broker, "half")
    sock = broker.socket

    def fail_second_partition(batches):
        if TaskContext.get().partitionId() == 1:
            with mq.Consumer("half", socket=sock) as consumer:
                tp = mq.TopicPartition("half", 0)
                mq.testing.wait_for(lambda: consumer.end_offsets([tp])[tp] >= 50, timeout=60,
                                    message="partition 0's rows")
            raise RuntimeError("injected failure in partition 1")
        yield from batches

    df = spark.range(0, 100, 1, 2).selectExpr("CAST(id AS STRING) AS value") \
        .mapInArrow(fail_second_partition, "value string")
    with pytest.raises(Exception, match="injected failure in partition 1"):
        save(df, broker, topic="half")
    assert sorted(int(r.value) for r in read_all(broker, "half")) == list(range(50))
