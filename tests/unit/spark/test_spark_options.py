"""``mq.spark.options``: Kafka's source options parsed into frozen values, each bad option one
``ConfigError`` naming it (no Spark, no broker)."""

from __future__ import annotations

import dataclasses

import pytest

from mq.errors import ConfigError
from mq.spark.options import (
    Earliest,
    GlobalTimestamp,
    Latest,
    SpecificOffsets,
    SpecificTimestamps,
    parse_duration_ms,
    parse_read_options,
)


def parse(streaming=None, **opts):
    return parse_read_options({k: str(v) for k, v in opts.items()}, streaming)


def test_defaults_follow_kafka():
    batch = parse(False, subscribe="t")
    assert batch.starting == Earliest() and batch.ending == Latest()
    stream = parse(True, subscribe="t")
    assert stream.starting == Latest()
    for o in (batch, stream):
        assert (o.include_headers, o.fail_on_data_loss, o.read_committed) == (False, True, False)
        assert o.max_offsets_per_trigger is None and o.min_partitions is None
        assert o.max_trigger_delay_ms == 15 * 60 * 1000
        assert o.socket is None and o.data_dir is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.include_headers = True                        # type: ignore[misc]


def test_names_are_case_insensitive_and_values_strings():
    o = parse_read_options({"SUBSCRIBE": " a, b ,a,", "maxoffsetspertrigger": "7",
                            "IncludeHeaders": "TRUE", "failOnDataLoss": "False",
                            "Kafka.Isolation.Level": "READ_COMMITTED", "minPartitions": "3",
                            "maxRecordsPerPartition": "100", "socket": "/s", "dataDir": "/d",
                            "maxTriggerDelay": "30s", "minOffsetsPerTrigger": "5"}, True)
    assert o.subscription.kind == "subscribe" and o.subscription.topics == ("a", "b")
    assert o.max_offsets_per_trigger == 7 and o.min_offsets_per_trigger == 5
    assert o.include_headers and not o.fail_on_data_loss and o.read_committed
    assert (o.min_partitions, o.max_records_per_partition) == (3, 100)
    assert (o.socket, o.data_dir, o.max_trigger_delay_ms) == ("/s", "/d", 30_000)


def test_subscriptions():
    o = parse(subscribePattern="orders-.*")
    assert o.subscription.kind == "subscribePattern" and o.subscription.pattern == "orders-.*"
    o = parse(assign='{"b": [1, 0], "a": [2]}')
    assert o.subscription.kind == "assign"
    assert sorted(o.subscription.partitions) == [("a", 2), ("b", 0), ("b", 1)]


@pytest.mark.parametrize("opts, match", [
    ({}, "exactly one of .*got none"),
    ({"subscribe": "t", "assign": '{"t": [0]}'}, "'subscribe' and 'assign'"),
    ({"subscribe": "t", "subscribePattern": "t.*"}, "'subscribe' and 'subscribePattern'"),
    ({"subscribe": " , "}, "at least one topic"),
    ({"subscribePattern": "("}, "not a valid regular expression"),
    ({"assign": "t"}, "JSON such as"),
    ({"assign": '{"t": 0}'}, r"expects e.g."),
    ({"assign": '{"t": [-1]}'}, r"expects e.g."),
    ({"assign": '{"t": [true]}'}, r"expects e.g."),
    ({"assign": '{}'}, "at least one partition"),
    ({"subscribe": "t", "maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be a positive"),
    ({"subscribe": "t", "maxOffsetsPerTrigger": "x"}, "'maxOffsetsPerTrigger' must be a positive"),
    ({"subscribe": "t", "minPartitions": "-1"}, "'minPartitions' must be a positive"),
    ({"subscribe": "t", "minPartitions": str(1 << 31)}, "'minPartitions' must be a positive"),
    ({"subscribe": "t", "maxRecordsPerPartition": "0"}, "'maxRecordsPerPartition'"),
    ({"subscribe": "t", "includeHeaders": "yes"}, "'includeHeaders' must be 'true' or 'false'"),
    ({"subscribe": "t", "failOnDataLoss": "1"}, "'failOnDataLoss' must be"),
    ({"subscribe": "t", "kafka.isolation.level": "committed"}, "'kafka.isolation.level'"),
    ({"subscribe": "t", "startingOffsetsByTimestampStrategy": "x"}, "'error' or 'latest'"),
    ({"subscribe": "t", "maxTriggerDelay": "soon"}, "'maxTriggerDelay' must be a duration"),
    ({"subscribe": "t", "socket": " "}, "'socket' must not be empty"),
    ({"subscribe": "t", "startingOffsets": "first"}, "'startingOffsets' expects 'earliest'"),
    ({"subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, "offset -3 for t-0"),
    ({"subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "expects e.g."),
    ({"subscribe": "t", "startingOffsets": '{"t": {"01": 1}}'}, "expects e.g."),
    ({"subscribe": "t", "startingOffsets": '{"t": {"0": 1.5}}'}, "expects e.g."),
    ({"subscribe": "t", "startingOffsets": '{"t": {}}'}, "expects e.g."),
    ({"subscribe": "t", "startingOffsets": '[1]'}, "expects e.g."),
    ({"subscribe": "t", "startingTimestamp": "-5"}, "'startingTimestamp' must be a timestamp"),
    ({"subscribe": "t", "startingOffsetsByTimestamp": '{"t": {"0": -1}}'}, "negative"),
    ({"subscribe": "t", "endingOffsets": "earliest"}, "'endingOffsets' cannot be 'earliest'"),
    ({"subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "t-0 cannot be earliest"),
    ({"subscribe": "t", "kafka.bootstrap.servers": "h:9092"},
     "unknown option 'kafka.bootstrap.servers' for the mq source"),
    ({"subscribe": "t", "path": "/x"}, "takes no path"),
])
def test_bad_options_fail_with_one_clear_error(opts, match):
    with pytest.raises(ConfigError, match=match):
        parse(None, **opts)


def test_batch_and_streaming_rules():
    with pytest.raises(ConfigError, match="cannot be 'latest' for batch"):
        parse(False, subscribe="t", startingOffsets="LATEST")
    with pytest.raises(ConfigError, match="t-1 cannot be latest"):
        parse(False, subscribe="t", startingOffsets='{"t": {"0": -2, "1": -1}}')
    for key in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        value = '{"t": {"0": 5}}' if "Offsets" in key else "5"
        with pytest.raises(ConfigError, match=f"'{key}' is for batch queries only"):
            parse(True, subscribe="t", **{key: value})
        parse(False, subscribe="t", **{key: value})
    # Trigger options are accepted (and ignored) by batch queries, as Kafka's source does.
    parse(False, subscribe="t", maxOffsetsPerTrigger=5, minOffsetsPerTrigger=1)
    # A streaming query may start at latest.
    assert parse(True, subscribe="t", startingOffsets="latest").starting == Latest()


def test_offsets_json_and_timestamp_precedence():
    o = parse(False, subscribe="t", startingOffsets='{"t": {"1": 5, "0": -2}}',
              endingOffsets='{"t": {"0": -1, "1": 9}}')
    assert o.starting == SpecificOffsets(((("t", 0), -2), (("t", 1), 5)))
    assert o.ending.as_dict() == {("t", 0): -1, ("t", 1): 9}
    # startingTimestamp > startingOffsetsByTimestamp > startingOffsets
    o = parse(False, subscribe="t", startingTimestamp="1000",
              startingOffsetsByTimestamp='{"t": {"0": 5}}', startingOffsets="earliest")
    assert o.starting == GlobalTimestamp(1000)
    o = parse(False, subscribe="t", startingOffsetsByTimestamp='{"t": {"0": 5}}',
              startingOffsets="earliest", startingOffsetsByTimestampStrategy="LATEST")
    assert o.starting == SpecificTimestamps(((("t", 0), 5),)) and o.no_match_latest
    o = parse(False, subscribe="t", endingTimestamp="7",
              endingOffsetsByTimestamp='{"t": {"0": 5}}', endingOffsets="latest")
    assert o.ending == GlobalTimestamp(7)
    o = parse(False, subscribe="t", endingOffsetsByTimestamp='{"t": {"0": 5}}')
    assert o.ending == SpecificTimestamps(((("t", 0), 5),))


@pytest.mark.parametrize("raw, ms", [("15m", 900_000), ("10s", 10_000), ("500ms", 500),
                                     ("250", 250), ("2h", 7_200_000), ("1d", 86_400_000),
                                     ("3min", 180_000), ("1500us", 1), (" 5 S ", 5_000)])
def test_durations(raw, ms):
    assert parse_duration_ms(raw) == ms


def test_bad_duration():
    with pytest.raises(ValueError):
        parse_duration_ms("1.5s")
