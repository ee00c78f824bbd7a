"""The ``mq`` source in batch (``spark.read.format("mq")``) against a real broker: Kafka's
schema and every field, headers, exact offset ranges (JSON, timestamps, segment rolls, inside
batches, split by ``minPartitions``), subscriptions, reads with the broker stopped, data lost
to retention, read_committed, and bad options failing at planning with one clear error.
Streaming: test_source_stream.py."""

from __future__ import annotations

import io
import json
import os

import pytest
from pyspark.serializers import UTF8Deserializer, read_int
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from pyspark.sql.worker import lookup_data_sources
from pyspark.testing import assertSchemaEqual
from pyspark.worker_util import pickleSer
from source_helpers import (
    T0,
    broker_with,
    create_topic,
    now_ms,
    offsets_of,
    produce,
    produce_values,
    reader,
    wait_gone,
)

import mq
from mq.errors import ConfigError
from mq.protocol.state import StateReader
from mq.spark import MQDataSource
from mq.spark.reader import MQBatchReader, MQStreamReader

pytestmark = pytest.mark.spark

KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()),
    StructField("topic", StringType()), StructField("partition", IntegerType()),
    StructField("offset", LongType()), StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType())])
HEADERS = StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                       StructField("value", BinaryType())])))


def fields(df, headers: bool = False) -> list[tuple]:
    cols = ["topic", "partition", "offset", "key", "value", "unix_millis(timestamp) AS ts",
            "timestampType"] + (["headers"] if headers else [])
    return sorted(tuple(r) for r in df.selectExpr(*cols).collect())


def test_every_record_with_kafkas_schema(spark, broker):
    create_topic(broker, "t", 2)
    every_byte = bytes(range(256))
    sent = produce(broker, "t", [(0, b"k0", b"v0", None, T0), (0, None, b"", None, T0 + 1),
                                 (1, b"", None, None, T0 + 2), (1, every_byte, every_byte * 4,
                                                                None, T0 + 3),
                                 (0, b"k4", b"v" * 100, None, T0 - 10)])
    df = reader(spark, broker, subscribe="t").load()
    assertSchemaEqual(df.schema, KAFKA_SCHEMA)
    assert fields(df) == sorted((t, p, o, k, v, ts, 0) for t, p, o, k, v, _, ts in sent)
    assert df.rdd.getNumPartitions() == 2
    # Options are case-insensitive; startingOffsets defaults to earliest, endingOffsets to latest.
    assert reader(spark, broker, SUBSCRIBE="t", EndingOffsets="latest").load().count() == 5


def test_log_append_time(spark, broker):
    create_topic(broker, "t", message_timestamp_type="LogAppendTime")
    before = now_ms()
    produce_values(broker, "t", range(3))
    after = now_ms()
    rows = reader(spark, broker, subscribe="t").load() \
        .selectExpr("unix_millis(timestamp) AS ts", "timestampType").collect()
    assert {r.timestampType for r in rows} == {1}
    assert all(before <= r.ts <= after for r in rows)


def test_include_headers(spark, broker):
    create_topic(broker, "t")
    headers = [("a", b"1"), ("b", None), ("a", b"2"), ("\u00e9", b"")]
    produce(broker, "t", [(0, b"k", b"v", headers), (0, b"k", b"w", [])])
    df = reader(spark, broker, subscribe="t", includeHeaders="true").load()
    assertSchemaEqual(df.schema, StructType(KAFKA_SCHEMA.fields + [HEADERS]))
    rows = df.orderBy("offset").collect()
    assert [(h.key, h.value) for h in rows[0].headers] == headers   # order and duplicates kept
    assert rows[1].headers is None                                     # none: null, as Kafka


def test_json_offsets_give_exact_ranges_across_rolls_and_inside_batches(spark, broker):
    create_topic(broker, "t", 2, segment_bytes=1024)
    # Batches of many records (one linger), several segments per partition.
    produce_values(broker, "t", range(300), partition=0, linger_ms=50, batch_size=600)
    produce_values(broker, "t", range(40), partition=1, linger_ms=50)
    assert len([f for f in os.listdir(broker.data_dir + "/t-0") if f.endswith(".log")]) > 5
    df = reader(spark, broker, subscribe="t",
                startingOffsets=json.dumps({"t": {"0": 7, "1": -2}}),
                endingOffsets=json.dumps({"t": {"0": 251, "1": -1}})).load()
    assert offsets_of(df) == [("t", 0, o) for o in range(7, 251)] + \
        [("t", 1, o) for o in range(40)]
    values = df.where("partition = 0").orderBy("offset").select("value").collect()
    assert [int(r.value) for r in values] == list(range(7, 251))
    # Empty ranges are fine; latest for both is nothing.
    assert reader(spark, broker, subscribe="t", startingOffsets='{"t": {"0": 5, "1": 40}}',
                  endingOffsets='{"t": {"0": 5, "1": 40}}').load().count() == 0


def test_starting_and_ending_timestamps(spark, broker):
    create_topic(broker, "t", 2)
    produce(broker, "t", [(0, None, b"a", None, T0 + 10), (0, None, b"b", None, T0 + 20),
                          (0, None, b"c", None, T0 + 30), (1, None, b"d", None, T0 + 15)])

    def values(**options):
        return sorted(r.value for r in reader(spark, broker, subscribe="t", **options)
                      .load().select("value").collect())
    assert values(startingTimestamp=T0 + 15) == [b"b", b"c", b"d"]
    assert values(startingTimestamp=T0 + 16, startingOffsetsByTimestampStrategy="latest") \
        == [b"b", b"c"]
    with pytest.raises(Exception, match="no offset of t-1 has a timestamp at or after"):
        values(startingTimestamp=T0 + 16)
    by = json.dumps({"t": {"0": T0 + 25, "1": T0}})
    assert values(startingOffsetsByTimestamp=by) == [b"c", b"d"]
    # startingTimestamp wins over startingOffsetsByTimestamp and startingOffsets.
    assert values(startingTimestamp=T0 + 12, startingOffsetsByTimestamp=by,
                  startingOffsets="earliest") == [b"b", b"c", b"d"]
    assert values(endingTimestamp=T0 + 20) == [b"a", b"d"]
    assert values(endingOffsetsByTimestamp=json.dumps({"t": {"0": T0 + 11, "1": T0 + 99}})) \
        == [b"a", b"d"]


def test_subscriptions(spark, broker):
    for topic in ("orders", "orders-eu", "xorders"):
        create_topic(broker, topic)
        produce_values(broker, topic, range(2))

    def topics(**options):
        return sorted({t for t, _, _ in offsets_of(reader(spark, broker, **options).load())})
    assert topics(subscribe="orders,xorders") == ["orders", "xorders"]
    assert topics(subscribePattern="orders.*") == ["orders", "orders-eu"]     # a full match
    assert topics(subscribePattern=".*") == ["orders", "orders-eu", "xorders"]  # no __ topics
    assert topics(assign='{"orders-eu": [0]}') == ["orders-eu"]
    with pytest.raises(Exception, match="unknown topic.*nope"):
        reader(spark, broker, subscribe="orders,nope").load().collect()
    with pytest.raises(Exception, match=r"unknown partition\(s\) \[orders-1\]"):
        reader(spark, broker, assign='{"orders": [1]}').load().collect()


def test_min_partitions_splits_and_the_union_is_the_unsplit_read(spark, broker):
    create_topic(broker, "t")
    produce_values(broker, "t", range(100_000), linger_ms=20, batch_size=64 * 1024)
    whole = reader(spark, broker, subscribe="t").load()
    assert whole.rdd.getNumPartitions() == 1
    split = reader(spark, broker, subscribe="t", minPartitions=4).load()
    assert split.rdd.getNumPartitions() == 4
    # 25,000-offset pieces: the cuts fall inside batches of ~600 records.
    stats = split.selectExpr("count(*) AS n", "count(DISTINCT offset) AS d", "min(offset) AS lo",
                             "max(offset) AS hi", "sum(CAST(CAST(value AS STRING) AS BIGINT)) AS s"
                             ).first()
    assert tuple(stats) == (100_000, 100_000, 0, 99_999, sum(range(100_000)))
    capped = reader(spark, broker, subscribe="t", maxRecordsPerPartition=30_000).load()
    assert capped.rdd.getNumPartitions() == 4 and capped.count() == 100_000


def test_reads_need_no_broker(spark, broker, tmp_path):
    create_topic(broker, "t", 2)
    produce_values(broker, "t", range(50), partition=0)
    produce_values(broker, "t", range(10), partition=1)
    planned = reader(spark, broker, subscribe="t").load()
    assert planned.count() == 60                        # planned with the broker
    broker.stop()
    assert planned.count() == 60                        # executors read the files alone
    explicit = spark.read.format("mq").option("socket", str(tmp_path / "nobody.sock")) \
        .option("dataDir", broker.data_dir).option("assign", '{"t": [0, 1]}') \
        .option("startingOffsets", '{"t": {"0": 10, "1": 0}}') \
        .option("endingOffsets", '{"t": {"0": 20, "1": 10}}').load()
    assert offsets_of(explicit) == [("t", 0, o) for o in range(10, 20)] + \
        [("t", 1, o) for o in range(10)]
    with pytest.raises(Exception, match="no broker at"):
        spark.read.format("mq").option("socket", str(tmp_path / "nobody.sock")) \
            .option("subscribe", "t").load().collect()


def test_fail_on_data_loss_after_retention(spark, tmp_path):
    with broker_with(tmp_path, retention_check_interval_ms=50) as b:
        create_topic(b, "t", segment_bytes=1024, file_delete_delay_ms=0, retention_ms=-1)
        produce_values(b, "t", range(200), batch_size=200)     # ~40 segments
        df = reader(spark, b, subscribe="t").load()
        assert df.count() == 200                        # planned: [0, 200)
        with mq.Admin(b.socket) as admin:
            start = admin.delete_records("t", 0, 120)
        first_segment = os.path.join(b.data_dir, "t-0", "00000000000000000000.log")
        wait_gone(first_segment)                        # retention removed the segments
        with pytest.raises(Exception, match=r"DataLossError: Cannot read offsets \[0, \d+\) "
                           r"of t-0.*failOnDataLoss"):
            df.count()                                  # the planned range, read again
        assert start == 120
        # Planned now: the data loss is found at planning, and skipped when allowed.
        with pytest.raises(Exception, match=r"Cannot read offsets \[0, 120\) of t-0: its log "
                           r"starts at 120"):
            reader(spark, b, subscribe="t", startingOffsets='{"t": {"0": 0}}').load().count()
        lossy = reader(spark, b, subscribe="t", startingOffsets='{"t": {"0": 0}}',
                       failOnDataLoss="false").load()
        assert offsets_of(lossy) == [("t", 0, o) for o in range(120, 200)]
        skipped = reader(spark, b, subscribe="t", failOnDataLoss="false").load()
        assert skipped.count() == 80


def test_read_committed(spark, broker):
    create_topic(broker, "t")
    produce_values(broker, "t", [0])                                      # 0
    with mq.Producer(socket=broker.socket, transactional_id="tx") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", value=b"aborted", partition=0)                       # 1
        p.abort_transaction()                                            # marker 2
        p.begin_transaction()
        p.send("t", value=b"committed", partition=0)                     # 3
        p.commit_transaction()                                           # marker 4
        p.begin_transaction()
        p.send("t", value=b"open", partition=0)                          # 5, never decided here
        p.flush()

        def values(**options):
            return [r.value for r in reader(spark, broker, subscribe="t", **options).load()
                    .orderBy("offset").collect()]
        assert values() == [b"0", b"aborted", b"committed", b"open"]     # markers never show
        assert values(**{"kafka.isolation.level": "read_committed"}) == [b"0", b"committed"]
        p.abort_transaction()


def test_planning_never_passes_the_published_high_watermark(broker, monkeypatch):
    """Ranges end at the high watermark the broker publishes (with ``high_watermark =
    "durable"``, the fsync'd offset), even with more on disk: here the published state is held
    back, in this process, where ``partitions()`` and ``latestOffset`` run."""
    create_topic(broker, "t")
    produce_values(broker, "t", range(9))
    real_read = StateReader.read

    def read(self, slot):
        st = real_read(self, slot)
        return st._replace(high_watermark=5, last_stable_offset=4)
    monkeypatch.setattr(StateReader, "read", read)
    opts = {"subscribe": "t", "socket": broker.socket}
    assert [(r.start, r.end) for r in MQBatchReader(opts, None).partitions()] == [(0, 5)]
    committed = MQBatchReader({**opts, "kafka.isolation.level": "read_committed"}, None)
    assert [(r.start, r.end) for r in committed.partitions()] == [(0, 4)]
    with pytest.raises(ConfigError, match="endingOffsets of t-0 is 9, past the end of its log "
                       r"\(5, its high watermark\)"):
        MQBatchReader({**opts, "endingOffsets": '{"t": {"0": 9}}'}, None).partitions()
    stream = MQStreamReader({**opts, "startingOffsets": "earliest"}, None)
    try:
        start = stream.initialOffset()
        assert start == {"t": {"0": 0}}
        assert stream.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 5}}
        assert stream.latestOffset(start, ReadMaxRows(2)) == {"t": {"0": 2}}
    finally:
        stream.stop()


@pytest.mark.parametrize("options, match", [
    ({"subscribe": "t", "bogus": "1"}, "unknown option 'bogus' for the mq source"),
    ({"subscribe": "t", "assign": '{"t": [0]}'}, "exactly one of the options"),
    ({}, "exactly one of the options"),
    ({"subscribe": "t", "minPartitions": "-1"}, "'minPartitions' must be a positive integer"),
    ({"subscribe": "t", "startingOffsets": "latest"}, "cannot be 'latest' for batch queries"),
    ({"subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "t-0 cannot be earliest"),
    ({"subscribe": "t", "startingOffsets": '{"t": {"1": 0}}'},
     r"must name exactly the partitions the query reads.*\[t-1\].*\[t-0\]"),
    ({"subscribe": "t", "startingOffsets": '{"t": {"0": 3}}', "endingOffsets": '{"t": {"0": 2}}'},
     r"startingOffsets of t-0 \(3\) is after its endingOffsets \(2\)"),
])
def test_bad_options_fail_at_planning_with_one_clear_error(spark, broker, options, match):
    create_topic(broker, "t")
    produce_values(broker, "t", range(5))
    with pytest.raises(Exception, match=match):
        reader(spark, broker, **options).load().collect()


def test_a_user_schema_is_refused(spark, broker):
    create_topic(broker, "t")
    with pytest.raises(Exception, match="the mq source has a fixed schema"):
        reader(spark, broker, subscribe="t").schema("value binary").load().collect()


def test_pyspark_mq_is_found_by_sparks_data_source_lookup():
    """Spark registers the ``DefaultSource`` of every top-level ``pyspark_*`` module at its
    first data source lookup (SPARK-45917): run that lookup (its worker's main function) here,
    without a JVM, and find ``mq`` among what it hands to Spark."""
    out = io.BytesIO()
    lookup_data_sources._main(io.BytesIO(), out)
    out.seek(0)
    found = {}
    for _ in range(read_int(out)):
        name = UTF8Deserializer().loads(out)
        found[name] = pickleSer._read_with_length(out)
    assert found["mq"] is MQDataSource
