"""The sink's pure parts (mq/spark/sink_plan.py), without Spark or a broker: options, the
column contract, Arrow batches to ``Producer.send`` arguments, and the exactly-once rule."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from mq.errors import ConfigError  # noqa: E402
from mq.spark.sink_plan import (  # noqa: E402
    SinkColumns,
    StreamTask,
    WriteOptions,
    already_committed,
    batch_marker,
    committed_batch,
    parse_write_options,
    plan_columns,
    transactional_id,
)

HEADERS = ArrayType(StructType([StructField("key", StringType()),
                                StructField("value", BinaryType())]))


def schema(**columns) -> StructType:
    return StructType([StructField(name, t) for name, t in columns.items()])


# --- options ------------------------------------------------------------------------------------

def test_defaults_batch_at_least_once_stream_transactional():
    assert parse_write_options({"topic": "t"}, streaming=False) == WriteOptions("t")
    assert parse_write_options({"topic": "t"}, streaming=True) == \
        WriteOptions("t", transactional=True)
    assert parse_write_options({"mq.transactional": "False"}, streaming=True).transactional \
        is False


def test_producer_settings_under_kafkas_names():
    opts = parse_write_options({"socket": "/run/mq.sock", "kafka.linger.ms": "0",
                                "kafka.batch.size": "65536", "kafka.compression.type": "NONE",
                                "kafka.max.request.size": "2097152",
                                "kafka.delivery.timeout.ms": "30000",
                                "kafka.transaction.timeout.ms": "120000"}, streaming=True)
    assert opts.socket == "/run/mq.sock"
    assert opts.producer_config == {"linger_ms": 0.0, "batch_size": 65536,
                                    "compression_type": None, "max_request_size": 2097152,
                                    "delivery_timeout_ms": 30000,
                                    "transaction_timeout_ms": 120000}


def test_the_socket_from_the_data_dir_as_the_source_finds_it(monkeypatch):
    monkeypatch.delenv("MQ_SOCKET", raising=False)
    assert parse_write_options({"datadir": "/srv/mq"}, False).socket == "/srv/mq/mq.sock"
    assert parse_write_options({"datadir": "/srv/mq", "socket": "/s"}, False).socket == "/s"
    monkeypatch.setenv("MQ_SOCKET", "/env.sock")
    assert parse_write_options({"datadir": "/srv/mq"}, False).socket == "/env.sock"
    assert parse_write_options({}, False).socket is None      # the Producer's own rules


def test_spark_s_own_streaming_options_are_accepted():
    opts = parse_write_options({"checkpointlocation": "/ck", "queryname": "q", "topic": "t"},
                               streaming=True)
    assert opts.topic == "t"


@pytest.mark.parametrize(("options", "streaming", "message"), [
    ({"subscribe": "t"}, False, "unknown option 'subscribe'; known: dataDir, kafka.batch.size"),
    ({"kafka.bootstrap.servers": "h:9092"}, True, "by the socket option"),
    ({"path": "/x"}, False, "takes no path"),
    ({"topic": ""}, False, "option topic is empty"),
    ({"mq.transactional": "yes"}, True, "must be true or false"),
    ({"mq.transactional": "true"}, False, "applies to streaming writes"),
    ({"kafka.linger.ms": "-1"}, False, "must be >= 0"),
    ({"kafka.batch.size": "1.5"}, False, "is not a number"),
    ({"kafka.compression.type": "brotli"}, False, "one of none, gzip"),
    ({"kafka.transaction.timeout.ms": "1000"}, False, "needs mq.transactional=true"),
])
def test_bad_options_name_the_option(options, streaming, message):
    with pytest.raises(ConfigError, match="^mq sink: ") as info:
        parse_write_options(options, streaming)
    assert message in str(info.value)


# --- columns ------------------------------------------------------------------------------------

def test_columns_found_by_position_and_the_topic_option_wins():
    s = schema(offset=LongType(), value=BinaryType(), key=StringType(), topic=StringType(),
               partition=IntegerType(), headers=HEADERS)
    assert plan_columns(s, None) == SinkColumns(1, 2, 3, 4, 5)
    assert plan_columns(s, "t") == SinkColumns(1, 2, None, 4, 5, "t")
    assert plan_columns(schema(value=StringType()), "t") == SinkColumns(0, topic_option="t")


@pytest.mark.parametrize(("columns", "message"), [
    (dict(key=StringType()), "needs a 'value' column (string or binary); its columns: key"),
    (dict(value=LongType()), "column 'value' must be string or binary, got bigint"),
    (dict(value=StringType(), key=IntegerType()), "column 'key' must be string or binary"),
    (dict(value=StringType(), partition=LongType()), "column 'partition' must be int"),
    (dict(value=StringType(), headers=ArrayType(StringType())),
     "column 'headers' must be array<struct<key: string, value: binary>>, got array<string>"),
])
def test_bad_columns_name_the_column(columns, message):
    with pytest.raises(ConfigError) as info:
        plan_columns(schema(**columns), "t")
    assert message in str(info.value)


def test_no_topic_anywhere_and_a_topic_column_of_another_type():
    with pytest.raises(ConfigError, match="no topic: set the topic option"):
        plan_columns(schema(value=StringType()), None)
    with pytest.raises(ConfigError, match="column 'topic' must be string, got int"):
        plan_columns(schema(value=StringType(), topic=IntegerType()), None)


def test_a_sink_column_named_twice_is_an_error():
    s = StructType([StructField("value", StringType()), StructField("value", BinaryType())])
    with pytest.raises(ConfigError, match="2 columns named 'value'"):
        plan_columns(s, "t")


# --- rows ---------------------------------------------------------------------------------------

def test_records_are_send_arguments_with_bytes_and_nulls():
    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.record_batch([
        pa.array(["é", None, ""], pa.string()),
        pa.array([b"k", None, b"\x00"], pa.binary()),
        pa.array(["a", "b", "a"], pa.string()),
        pa.array([None, 2, 0], pa.int32()),
        pa.array([[{"key": "h", "value": b"1"}, {"key": "h", "value": None}], None, []],
                 headers_type),
    ], names=["value", "key", "topic", "partition", "headers"])
    cols = SinkColumns(0, 1, 2, 3, 4)
    assert list(cols.records(batch)) == [
        ("a", "é".encode(), b"k", None, [("h", b"1"), ("h", None)]),
        ("b", None, None, 2, None),
        ("a", b"", b"\x00", 0, []),
    ]
    assert cols.first_topic(batch) == "a"


def test_records_with_only_a_value_and_the_topic_option():
    batch = pa.record_batch([pa.array(["x", "y"], pa.large_string())], names=["value"])
    cols = SinkColumns(0, topic_option="t")
    assert list(cols.records(batch)) == [("t", b"x", None, None, None),
                                         ("t", b"y", None, None, None)]
    assert cols.first_topic(batch) == "t"


def test_a_null_topic_without_the_option_is_an_error():
    batch = pa.record_batch([pa.array(["v"]), pa.array([None], pa.string())],
                            names=["value", "topic"])
    with pytest.raises(ValueError, match="null topic present in the data"):
        list(SinkColumns(0, topic=1).records(batch))
    with pytest.raises(ValueError, match="null topic"):
        SinkColumns(0, topic=1).first_topic(batch)


# --- exactly once -------------------------------------------------------------------------------

def test_ids_are_per_query_and_spark_partition():
    task = StreamTask.from_properties("q-1", "7", 3)
    assert task == StreamTask("q-1", 7, 3)
    assert task.transactional_id == transactional_id("q-1", 3) == "mq-spark-sink-q-1-3"


@pytest.mark.parametrize(("query_id", "batch_id"), [(None, "1"), ("q", None), ("", "1")])
def test_a_task_without_micro_batch_properties_is_refused(query_id, batch_id):
    with pytest.raises(RuntimeError, match="continuous processing is not supported"):
        StreamTask.from_properties(query_id, batch_id, 0)


def test_the_marker_is_the_next_batch_and_a_replay_is_skipped():
    assert batch_marker(4, 120) == (5, "spark batch 4: 120 rows")
    assert committed_batch({}) is None
    assert committed_batch({("a", 0): 3, ("b", 0): 5}) == 5
    assert not already_committed(None, 0)
    assert already_committed(5, 4)                 # batch 4 committed: its replay writes nothing
    assert not already_committed(5, 5)             # the next batch
    assert not already_committed(5, 6)             # a batch this partition had no rows in
