"""mq reads what a real Kafka 4.3.1 broker writes (issue 23; the reverse of
``test_kafka_serves_mq``).

Kafka's broker writes three topics at test time, with Kafka's Java producer (``KafkaChecks``:
idempotent, every codec, and a transactional producer that aborts) and librdkafka (every codec,
headers, null keys and values, explicit timestamps, an idempotent producer, transactions
committed and aborted):

- ``k-mixed``: all of that, in several segments with sparse indexes;
- ``k-compacted``: ``cleanup.policy=compact``, rolled on every append (``segment.ms`` 100 and
  timestamps an hour old) and compacted by Kafka's own cleaner (the test waits for its
  ``cleaner-offset-checkpoint``), tombstones kept;
- ``k-appendtime``: ``message.timestamp.type=LogAppendTime``, compressed batches whose records
  keep their producer's timestamps while the batch header holds the broker's.

librdkafka reads each topic from Kafka (read_uncommitted and read_committed) and asks for its
log start offset, high watermark and offsets for sampled timestamps; then Kafka stops cleanly
and its partition directories are copied. On the copies:

1. ``mq log check`` is clean; ``mq dump-log --deep-iteration --print-data`` prints librdkafka's
   records (offset, key, value, headers) and reads every index, ``.txnindex`` and snapshot;
2. mq's broker serves them: its broker cannot adopt a directory its metadata log does not name
   (see "What mq may touch" in the README), so the topics are created in mq, the broker
   stopped, Kafka's segment files, snapshots and ``leader-epoch-checkpoint`` swapped in (mq's
   ``partition.metadata`` kept, as the other direction keeps Kafka's) and the broker started
   again, with its clean-shutdown marker (Kafka's indexes served as they are) and without it
   (mq recovers every batch). ``mq.Consumer`` must read what librdkafka read from Kafka:
   offset, timestamp and its type, key, value and headers, both isolation levels; find the
   same bounds and offsets for the sampled timestamps; and the producer snapshot mq writes
   when it stops must hold the producers Kafka's ``TransactionsCommand describe-producers``
   showed (id, epochs, last sequence and timestamp, open transaction);
3. Spark's ``format("mq")`` reads the copied directories with no broker at all (the source's
   offline mode: ``dataDir`` and explicit offsets up to Kafka's high watermark),
   read_committed: the same records, timestamps included.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from cli_run import mq_run
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from javakafka import KafkaTarget, spark_session, write_properties
from kclients import (WAIT, consumer, create_topic, deliver, offset_for_time, producer,
                      read_to_end)
from kclients import admin as kafka_admin
from mqread import mq_rows
from producers import kafka_producers, mq_producers

import mq
import mq.testing
from mq.client.admin import Admin
from mq.log import files
from mq.testing import wait_for

MIXED, COMPACTED, APPEND_TIME = "k-mixed", "k-compacted", "k-appendtime"
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
HOUR_MS = 3_600_000
TOPIC_CONFIGS = {
    MIXED: {"segment.ms": "500", "index.interval.bytes": "256"},
    COMPACTED: {"cleanup.policy": "compact", "segment.ms": "100",
                "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"},
    APPEND_TIME: {"message.timestamp.type": "LogAppendTime", "index.interval.bytes": "256"},
}
# What mq's broker needs to hear of those configs (mq's names are Kafka's).
MQ_CONFIGS = {MIXED: {"index.interval.bytes": "256"},
              COMPACTED: {"cleanup.policy": "compact"},
              APPEND_TIME: {"message.timestamp.type": "LogAppendTime"}}
SWAPPED = (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX, files.TXNINDEX_SUFFIX,
           files.SNAPSHOT_SUFFIX)
EPOCHS = "leader-epoch-checkpoint"
CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
# The cleaner looks for work every log.cleaner.backoff.ms (15 s by default): a dynamic broker
# config, shortened for this session's node so that the compaction is waited for briefly.
CLEANER_BACKOFF_MS = "200"


# --- Kafka writes -----------------------------------------------------------------------------

def headers_of(i: int) -> list[tuple[str, bytes | None]]:
    """None, one, or three headers (a repeated key, a null value)."""
    return [[], [("h", b"%d" % i)], [("h", b"a"), ("h", b"b"), ("nil", None)]][i % 3]


def librdkafka_records(tag: str, n: int, t0: int) -> list[dict]:
    """Null keys every 4th, null values every 7th, explicit timestamps going back now and
    then, and headers."""
    return [{"partition": 0, "key": None if i % 4 == 0 else b"%s-key-%d" % (tag.encode(), i % 5),
             "value": None if i % 7 == 0 else b"%s-value-%04d" % (tag.encode(), i),
             "headers": headers_of(i), "timestamp": t0 + i * 10 - (5000 if i % 11 == 0 else 0)}
            for i in range(n)]


def librdkafka_writes(bootstrap: str, t0: int) -> None:
    """Every codec, an idempotent producer, and transactions committed and aborted."""
    for codec in CODECS:
        with producer(bootstrap, {"compression.type": codec, "batch.num.messages": 20}) as p:
            deliver(p, MIXED, librdkafka_records(codec, 60, t0))
    with producer(bootstrap, {"enable.idempotence": True, "compression.type": "zstd"}) as p:
        deliver(p, MIXED, librdkafka_records("idempotent", 100, t0))
    with producer(bootstrap, {"transactional.id": "rd-txn", "compression.type": "lz4"}) as p:
        p.init_transactions(WAIT)
        for n, commit in enumerate((True, False, True, False)):
            p.begin_transaction()
            deliver(p, MIXED, librdkafka_records(f"txn{n}", 15, t0))
            p.commit_transaction(WAIT) if commit else p.abort_transaction(WAIT)
    with producer(bootstrap, {"compression.type": "lz4"}) as p:
        deliver(p, APPEND_TIME, librdkafka_records("appendtime", 50, t0))


def compacted_writes(bootstrap: str) -> int:
    """Four rounds over twelve keys and a fifth over the even ones (half of them tombstones,
    which the cleaner keeps for delete.retention.ms), each one batch in its own segment
    (timestamps an hour old make Kafka roll on the next append), so that the fourth round's
    batch keeps only its odd keys (a batch with holes); then one record that rolls the last
    round out of the active segment. Returns that record's offset: what the cleaner cleans up
    to."""
    old = int(time.time() * 1000) - HOUR_MS
    for r in range(5):
        batch = [{"partition": 0, "key": b"key-%02d" % k,
                  "value": None if r == 4 and k % 4 == 0 else b"round-%d-key-%02d" % (r, k),
                  "headers": headers_of(k), "timestamp": old + r * 100 + k}
                 for k in range(0, 12, 2 if r == 4 else 1)]
        with producer(bootstrap, {"compression.type": CODECS[r]}) as p:
            deliver(p, COMPACTED, batch)
    with producer(bootstrap) as p:
        [last] = deliver(p, COMPACTED, [{"partition": 0, "key": b"last", "value": b"rolls"}])
    return last.offset()


def cleaner_checkpoint(data_dir: str, topic: str) -> int:
    """The offset Kafka's cleaner has cleaned ``topic``-0 up to (0 before its first clean)."""
    try:
        with open(os.path.join(data_dir, CLEANER_CHECKPOINT)) as f:
            lines = f.read().splitlines()[2:]
    except FileNotFoundError:
        return 0
    return max([int(o) for t, p, o in (line.split() for line in lines)
                if t == topic and p == "0"] or [0])


def kafka_writes(node, target: KafkaTarget) -> None:
    client = kafka_admin(node.bootstrap)
    backoff = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
        ConfigEntry("log.cleaner.backoff.ms", CLEANER_BACKOFF_MS,
                    incremental_operation=AlterConfigOpType.SET)])
    for future in client.incremental_alter_configs([backoff]).values():
        future.result(WAIT)
    for topic, config in TOPIC_CONFIGS.items():
        create_topic(node.bootstrap, topic, 1, config)
    t0 = int(time.time() * 1000) - 60_000
    target.checks(*(f"produce:{MIXED},40,java-{codec},{codec}" for codec in CODECS),
                  f"txn:{MIXED},java-txn", f"produce:{APPEND_TIME},30,java-lat,gzip",
                  timeout=180)
    librdkafka_writes(node.bootstrap, t0)
    last = compacted_writes(node.bootstrap)
    wait_for(lambda: cleaner_checkpoint(node.data_dir, COMPACTED) >= last, 90, 0.2,
             "Kafka's cleaner compacting k-compacted")


def kafka_read(bootstrap: str, topic: str, isolation: str) -> list[tuple]:
    """Every record of ``topic``-0 as librdkafka reads it from Kafka, to the partition's end:
    (offset, timestamp type as mq numbers it, timestamp, key, value, headers)."""
    rows = []
    for msg in read_to_end(bootstrap, topic, 0, {"isolation.level": isolation}):
        kind, timestamp = msg.timestamp()
        rows.append((msg.offset(), kind - 1, timestamp, msg.key(), msg.value(),
                     list(msg.headers() or [])))
    return rows


def sampled_times(rows: list[tuple]) -> list[int]:
    """Timestamps to look offsets up by: every 37th record's, one past the largest, and 0."""
    stamps = [row[2] for row in rows]
    return sorted({0, *stamps[::37], max(stamps) + 1})


def kafka_offsets(bootstrap: str, topic: str, timestamps: list[int]) -> tuple:
    """(log start offset, high watermark) of ``topic``-0, and ``{timestamp: offset}`` (-1 for
    none) by ListOffsets, as Kafka answers librdkafka."""
    c = consumer(bootstrap)
    try:
        bounds = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=WAIT)
        return tuple(bounds), {ts: offset_for_time(c, topic, ts) for ts in timestamps}
    finally:
        c.close()


# --- mq reads -------------------------------------------------------------------------------

def dumped_records(directory: str) -> list[tuple]:
    """The data records of every ``.log`` of ``directory`` as ``mq dump-log --json
    --deep-iteration --print-data`` prints them, every batch valid: (offset, key, value,
    headers), bytes as in librdkafka's records (the test's bytes are all text)."""
    logs = sorted(os.path.join(directory, f) for f in os.listdir(directory)
                  if f.endswith(files.LOG_SUFFIX))
    dumped = mq_run("dump-log", "--json", "--deep-iteration", "--print-data", *logs)
    assert dumped.code == 0 and not dumped.err, dumped
    batches = [json.loads(line) for line in dumped.out.splitlines()]
    assert all(b["isValid"] for b in batches)
    return [(r["offset"], _encoded(r["key"]), _encoded(r["value"]),
             [(h["key"], _encoded(h["value"])) for h in r["headers"]])
            for b in batches if not b["isControl"] for r in b["records"]]


def _encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def copy_partitions(kafka_data_dir: str, dest) -> str:
    """Kafka's partition directories of the three topics, copied into ``dest``."""
    os.makedirs(dest)
    for topic in TOPIC_CONFIGS:
        name = files.partition_dir_name(topic, 0)
        shutil.copytree(os.path.join(kafka_data_dir, name), os.path.join(dest, name))
    return str(dest)


def swap_in(kafka_dir: str, mq_dir: str) -> None:
    """mq's segment files and epoch checkpoint out, Kafka's in; mq's ``partition.metadata``
    stays."""
    for name in os.listdir(mq_dir):
        if name.endswith(SWAPPED) or name == EPOCHS:
            os.unlink(os.path.join(mq_dir, name))
    for name in os.listdir(kafka_dir):
        if name.endswith(SWAPPED) or name == EPOCHS:
            shutil.copy2(os.path.join(kafka_dir, name), mq_dir)


def mq_read(b, topic: str, isolation: str) -> list[tuple]:
    return mq_rows(b.socket, topic, 0, isolation, timestamp_type=True)



def mq_offsets(b, topic: str, timestamps: list[int]) -> tuple:
    """``kafka_offsets`` as mq's consumer finds them."""
    with mq.Consumer(socket=b.socket) as c:
        tp = mq.TopicPartition(topic, 0)
        c.assign([tp])
        bounds = (c.beginning_offsets([tp])[tp], c.end_offsets([tp])[tp])
        return bounds, {ts: (c.offsets_for_times({tp: ts})[tp] or (-1,))[0]
                        for ts in timestamps}


def assert_mq_serves(b, expected: dict, offsets: dict) -> None:
    for (topic, isolation), rows in expected.items():
        got = mq_read(b, topic, isolation)
        assert len(got) == len(rows), (topic, isolation)
        for mine, kafkas in zip(got, rows):
            assert mine == kafkas, (topic, isolation)
    for topic, (bounds, times) in offsets.items():
        assert mq_offsets(b, topic, list(times)) == (bounds, times), topic


def spark_read(copied: str, ends: dict[str, int]) -> list[tuple]:
    """One batch read of the copied directories by ``format("mq")``, with no broker: every
    partition from 0 to its end, read_committed. It runs in the worker's Spark session when
    one is active (``tests/spark``'s, say: a JVM start costs about 10 s), else in its own."""
    from pyspark import SparkContext

    import mq.spark

    shared = SparkContext._active_spark_context is not None
    session = spark_session("mq-reads-kafka")
    try:
        mq.spark.register(session)
        rows = (session.read.format("mq").option("dataDir", copied)
                .option("socket", os.path.join(copied, "nobody.sock"))
                .option("assign", json.dumps({t: [0] for t in ends}))
                .option("startingOffsets", json.dumps({t: {"0": 0} for t in ends}))
                .option("endingOffsets", json.dumps({t: {"0": e} for t, e in ends.items()}))
                .option("includeHeaders", "true")
                .option("kafka.isolation.level", "read_committed").load()
                .selectExpr("*", "unix_millis(timestamp) AS timestamp_ms").collect())
    finally:
        if not shared:
            session.stop()
    return sorted((r.topic, r.offset, r.timestampType, r.timestamp_ms, r.key, r.value,
                   [(h.key, h.value) for h in r.headers or []]) for r in rows)


@pytest.mark.spark
def test_mq_reads_what_kafka_writes(java_kafka, kafka_node, tmp_path):
    target = KafkaTarget(java_kafka, kafka_node.bootstrap,
                         write_properties(tmp_path / "client.properties", {}))
    kafka_writes(kafka_node, target)
    expected = {(topic, isolation): kafka_read(kafka_node.bootstrap, topic, isolation)
                for topic in TOPIC_CONFIGS for isolation in ("read_uncommitted", "read_committed")}
    assert len(expected[(MIXED, "read_committed")]) < len(expected[(MIXED, "read_uncommitted")])
    assert [row[0] for row in expected[(COMPACTED, "read_uncommitted")]] == \
        [*range(37, 48, 2), *range(48, 55)], "Kafka's cleaner did not compact as planned"
    assert {row[1] for row in expected[(APPEND_TIME, "read_uncommitted")]} == {1}
    offsets = {topic: kafka_offsets(kafka_node.bootstrap, topic,
                                    sampled_times(expected[(topic, "read_uncommitted")]))
               for topic in TOPIC_CONFIGS}
    producers = {topic: kafka_producers(target, topic) for topic in (MIXED, APPEND_TIME)}
    kafka_node.stop()
    copied = copy_partitions(kafka_node.data_dir, tmp_path / "kafka-copy")
    dirs = [os.path.join(copied, files.partition_dir_name(t, 0)) for t in TOPIC_CONFIGS]

    # 1. mq's offline tools.
    checked = mq_run("log", "check", *dirs)
    assert checked.code == 0, checked
    for topic, d in zip(TOPIC_CONFIGS, dirs):
        assert dumped_records(d) == [row[:1] + row[3:] for row in
                                     expected[(topic, "read_uncommitted")]], topic
    others = sorted(os.path.join(d, f) for d in dirs for f in os.listdir(d)
                    if f.endswith(SWAPPED) and not f.endswith(files.LOG_SUFFIX))
    dumped = mq_run("dump-log", *others)
    assert dumped.code == 0 and not dumped.err, dumped

    # 2. mq's broker serves Kafka's files: as they are, then recovered.
    with mq.testing.broker(tmp_path / "mq") as b:
        with Admin(b.socket) as admin:
            for topic, config in MQ_CONFIGS.items():
                admin.create_topic(topic, 1, config)
        for unclean in (False, True):
            b.stop()
            for d in dirs:
                swap_in(d, os.path.join(b.data_dir, os.path.basename(d)))
            if unclean:
                os.unlink(os.path.join(b.data_dir, CLEAN_SHUTDOWN))
            b.start()
            assert_mq_serves(b, expected, offsets)
            b.stop()                    # mq's snapshot of the producers it loaded or rebuilt
            for topic, rows in producers.items():
                end = offsets[topic][0][1]
                assert mq_producers(os.path.join(b.data_dir, files.partition_dir_name(topic, 0)),
                                    end) == rows, (topic, "unclean" if unclean else "clean")

    # 3. Spark reads the copies with no broker.
    got = spark_read(copied, {topic: bounds[1] for topic, (bounds, _) in offsets.items()})
    want = sorted((t, *row) for (t, isolation), rows in expected.items()
                  if isolation == "read_committed" for row in rows)
    assert got == want
