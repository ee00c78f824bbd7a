"""The ``mq`` source in Structured Streaming against a real broker: Trigger.AvailableNow with
``maxOffsetsPerTrigger`` (Kafka's rateLimit, exactly) and a second run that reads only what is
new, the checkpoint's offsets in Kafka's JSON shape, a replayed batch after a restart, a
partition added mid-stream and topics added to a pattern (both read from earliest), data lost
to retention under a query (``failOnDataLoss`` both ways), and a query with a processing-time
trigger. Micro-batches are collected by ``foreachBatch``, which runs in this process."""

from __future__ import annotations

import pytest
from source_helpers import (
    broker_with,
    checkpoint_offsets,
    create_topic,
    produce_values,
    run,
    stream,
    wait_gone,
)

import mq
import mq.testing
from mq.spark.ranges import rate_limit

pytestmark = pytest.mark.spark


def rows_of(batches) -> list[tuple]:
    return sorted(row for _, rows in batches for row in rows)


def expected(topic: str, partition: int, offsets, values=None) -> list[tuple]:
    values = offsets if values is None else values
    return [(topic, partition, o, b"%d" % v) for o, v in zip(offsets, values, strict=True)]


def test_available_now_with_max_offsets_per_trigger_then_only_new_data(spark, broker,
                                                                       tmp_path):
    create_topic(broker, "t", 3)
    produce_values(broker, "t", range(10), partition=0)
    produce_values(broker, "t", range(4), partition=1)
    produce_values(broker, "t", range(1), partition=2)
    checkpoint = tmp_path / "checkpoint"

    def produce_more(batch_id):
        if batch_id == 0:                 # after the run's end offsets were fixed: not in it
            produce_values(broker, "t", range(10, 13), partition=0)
    batches = run(spark, broker, checkpoint, subscribe="t", startingOffsets="earliest",
                  maxOffsetsPerTrigger=5, on_batch=produce_more)
    assert rows_of(batches) == expected("t", 0, range(10)) + expected("t", 1, range(4)) + \
        expected("t", 2, range(1))
    # Batch by batch, exactly Kafka's rateLimit (a share below one rounded up: batch 0 reads
    # 3 + 1 + 1, and p2's single record is not starved).
    start, latest = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}, {("t", 0): 10, ("t", 1): 4,
                                                               ("t", 2): 1}
    for batch_id, rows in batches:
        end = rate_limit(5, start, latest, {})
        assert len(rows) == sum(end[tp] - start[tp] for tp in end) <= 5
        # The checkpoint holds Kafka's offsets JSON: the next offset of each partition.
        assert checkpoint_offsets(checkpoint, batch_id) == \
            {"t": {str(p): end[("t", p)] for p in range(3)}}
        start = end
    assert start == latest and len(batches) == 4
    # The second run reads only what came since, from the checkpoint.
    again = run(spark, broker, checkpoint, subscribe="t", startingOffsets="earliest")
    assert rows_of(again) == expected("t", 0, range(10, 13))
    assert run(spark, broker, checkpoint, subscribe="t") == []


def test_restart_replays_an_uncommitted_batch_with_the_same_range(spark, broker, tmp_path):
    create_topic(broker, "t")
    produce_values(broker, "t", range(12))
    checkpoint = tmp_path / "checkpoint"
    first = run(spark, broker, checkpoint, subscribe="t", startingOffsets="earliest",
                maxOffsetsPerTrigger=4)
    assert [i for i, _ in first] == [0, 1, 2]
    for name in ("2", ".2.crc"):                   # as if the driver died before committing
        (checkpoint / "commits" / name).unlink()
    produce_values(broker, "t", range(12, 17))
    # startingOffsets applies to a new query only: a restarted one resumes from its checkpoint.
    second = run(spark, broker, checkpoint, subscribe="t", startingOffsets="latest",
                 maxOffsetsPerTrigger=4)
    assert second[0] == first[2]                   # batch 2 again: the same rows
    assert [i for i, _ in second] == [2, 3, 4]
    assert rows_of(first[:2] + second) == expected("t", 0, range(17))


def test_a_partition_added_mid_stream_is_read_from_earliest(spark, broker, tmp_path):
    create_topic(broker, "t")
    produce_values(broker, "t", range(3))
    checkpoint = tmp_path / "checkpoint"
    assert rows_of(run(spark, broker, checkpoint, subscribe="t",
                       startingOffsets="earliest")) == expected("t", 0, range(3))
    with mq.Admin(broker.socket) as admin:
        admin.create_partitions("t", 2)
    produce_values(broker, "t", range(3, 5), partition=0)
    produce_values(broker, "t", range(100, 103), partition=1)
    batches = run(spark, broker, checkpoint, subscribe="t", startingOffsets="latest")
    assert rows_of(batches) == expected("t", 0, range(3, 5)) + \
        expected("t", 1, range(3), range(100, 103))
    assert checkpoint_offsets(checkpoint, batches[-1][0]) == {"t": {"0": 5, "1": 3}}


def test_topics_created_later_join_a_pattern(spark, broker, tmp_path):
    create_topic(broker, "ev-a")
    produce_values(broker, "ev-a", range(2))
    checkpoint = tmp_path / "checkpoint"
    assert rows_of(run(spark, broker, checkpoint, subscribePattern="ev-.*",
                       startingOffsets="earliest")) == expected("ev-a", 0, range(2))
    create_topic(broker, "ev-b", 2)
    create_topic(broker, "other")
    produce_values(broker, "ev-b", range(3), partition=1)
    produce_values(broker, "other", range(3))
    produce_values(broker, "ev-a", range(2, 4))
    batches = run(spark, broker, checkpoint, subscribePattern="ev-.*")
    assert rows_of(batches) == expected("ev-a", 0, range(2, 4)) + expected("ev-b", 1, range(3))
    assert checkpoint_offsets(checkpoint, batches[-1][0]) == \
        {"ev-a": {"0": 4}, "ev-b": {"0": 0, "1": 3}}


def test_data_lost_to_retention_under_a_query(spark, tmp_path):
    with broker_with(tmp_path, retention_check_interval_ms=50) as b:
        create_topic(b, "t", segment_bytes=1024, file_delete_delay_ms=0, retention_ms=-1)
        produce_values(b, "t", range(20), batch_size=200)
        checkpoint = tmp_path / "checkpoint"
        assert rows_of(run(spark, b, checkpoint, subscribe="t", startingOffsets="earliest")) \
            == expected("t", 0, range(20))
        produce_values(b, "t", range(20, 200), batch_size=200)
        with mq.Admin(b.socket) as admin:
            assert admin.delete_records("t", 0, 150) == 150
        wait_gone(f"{b.data_dir}/t-0/00000000000000000000.log")
        # The query stands at 20; [20, 150) is gone.
        with pytest.raises(Exception, match=r"DataLossError: Cannot read offsets \[20, 150\) "
                           r"of t-0: its log starts at 150.*failOnDataLoss"):
            run(spark, b, checkpoint, subscribe="t")
        batches = run(spark, b, checkpoint, subscribe="t", failOnDataLoss="false")
        assert rows_of(batches) == expected("t", 0, range(150, 200))


def test_a_running_query_reads_new_records_as_they_come(spark, broker, tmp_path):
    create_topic(broker, "t", 2)
    produce_values(broker, "t", range(5))                 # before the start: not read
    query, batches = stream(spark, broker, tmp_path / "checkpoint", available_now=False,
                            subscribe="t", maxOffsetsPerTrigger=100)
    try:
        mq.testing.wait_for(lambda: query.lastProgress is not None, 60, message="a trigger")
        produce_values(broker, "t", range(5, 8), partition=1)
        mq.testing.wait_for(lambda: len(rows_of(batches)) >= 3, 60, message="3 records")
        produce_values(broker, "t", range(8, 9), partition=0)
        mq.testing.wait_for(lambda: len(rows_of(batches)) >= 4, 60, message="4 records")
    finally:
        query.stop()
    assert query.exception() is None
    assert rows_of(batches) == expected("t", 0, [5], [8]) + expected("t", 1, range(3),
                                                                     range(5, 8))
