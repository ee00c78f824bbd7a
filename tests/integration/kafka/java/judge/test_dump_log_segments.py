"""Apache Kafka's own DumpLogSegments (kafka-tools 4.3.1) reads every ``.log``, ``.index``,
``.timeindex``, ``.txnindex`` and ``.snapshot`` that mq's broker writes, and agrees with mq on
every field of every batch, record, index entry and producer (``dumplog`` says how).

Each test runs a real broker (mq's native clients, and librdkafka through its Kafka listener)
on its own data dir, stops it cleanly (SIGTERM: indexes trimmed, as Kafka leaves them), then
runs the tool's five passes over the files, one JVM each:

- ``test_topics``: several segments per partition with a sparse offset index (small
  ``segment.bytes`` and ``index.interval.bytes``); keys, null keys, tombstones, headers,
  timestamps out of order; every codec; an idempotent producer (a producer snapshot at each
  roll); a LogAppendTime topic; a compacted topic after a cleaner pass (gaps in offsets,
  tombstones kept with a delete horizon); librdkafka's idempotent zstd batches;
- ``test_groups_and_transactions``: two transactional producers committing and aborting with
  overlapping transactions (``.txnindex`` entries whose last stable offset is the other's open
  transaction), offsets committed inside transactions, group commits by mq's consumer and by
  librdkafka's, a deleted group: ``__consumer_offsets`` and ``__transaction_state`` read with
  Kafka's coordinator decoders, whose view must equal what mq's Admin reports.
"""

from __future__ import annotations

import hashlib
import os

import pytest
from confluent_kafka import TopicPartition as KafkaTopicPartition
from dumplog import OFFSETS_TOPIC, TXN_TOPIC, Judge, judge_data_dir, partition_files
from kclients import consumer, create_topic, produce, read

import mq
import mq.testing
from mq.client.admin import Admin
from mq.client.types import TopicPartition
from mq.log import files
from mq.log.batch import iter_batches
from mq.log.txnindex import read_entries
from mq.testing import wait_for

WAIT = 30.0
# Several segments, each with several offset-index entries.
SMALL = {"segment.bytes": "4096", "index.interval.bytes": "256"}
T0 = 1_750_000_000_000                  # record timestamps: fixed, so some can go backwards


@pytest.fixture
def broker(tmp_path):
    """A broker with a Kafka listener and a cleaner that looks 20 times a second; INFO, so
    that its log says when the cleaner cleaned."""
    conf = tmp_path / "mq.toml"
    conf.write_text('kafka_listeners = ["127.0.0.1:0"]\ncleaner_backoff_ms = 50\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(conf), log_level="INFO") as b:
        with Admin(b.socket) as admin:
            [b.bootstrap] = admin.broker_stats()["broker"]["kafka_listeners"]
        yield b


def judge(java_kafka, b) -> Judge:
    """Stop the broker (cleanly: its indexes trimmed), then judge its data dir."""
    b.stop()
    return judge_data_dir(java_kafka, b.data_dir)


def batches(b, topic: str, partition: int = 0) -> list:
    """mq's reading of a stopped broker's partition: every batch of every segment."""
    directory = os.path.join(b.data_dir, files.partition_dir_name(topic, partition))
    out = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(files.LOG_SUFFIX):
            with open(os.path.join(directory, name), "rb") as f:
                out += list(iter_batches(f.read()))
    return out


def create(b, name: str, partitions: int = 1, **config: str) -> None:
    with Admin(b.socket) as admin:
        admin.create_topic(name, partitions, {**SMALL, **config})


# --- user topics ------------------------------------------------------------------------------

def plain(b) -> None:
    """Keys and null keys, values and tombstones, 0-2 headers (one with a null value),
    timestamps that now and then go back (the time index keeps the largest so far)."""
    create(b, "plain")
    with mq.Producer(socket=b.socket, acks=1, enable_idempotence=False, linger_ms=0,
                     batch_size=300) as p:
        for i in range(400):
            p.send("plain", partition=0,
                   key=None if i % 5 == 0 else b"key-%d" % (i % 13),
                   value=None if i % 17 == 0 else b"value-%04d" % i,
                   headers=[("h%d" % j, None if (i + j) % 7 == 0 else b"x%d" % j)
                            for j in range(i % 3)],
                   timestamp_ms=T0 + i * 10 - (3000 if i % 29 == 0 else 0))
            if i % 4 == 3:
                p.flush()


def codecs(b) -> None:
    """One partition written by a producer of each codec in turn."""
    create(b, "codecs")
    for round_ in range(3):
        for codec in (None, "gzip", "snappy", "lz4", "zstd"):
            with mq.Producer(socket=b.socket, compression_type=codec, linger_ms=50) as p:
                for i in range(40):
                    p.send("codecs", key=b"k%d" % (i % 4), partition=0,
                           value=b"%s-%d-%03d " % (codec.encode() if codec else b"none",
                                                    round_, i) * 4)


def idempotent(b) -> None:
    """An idempotent producer (mq's default) over two partitions, several rolls each."""
    create(b, "idempotent", 2)
    with mq.Producer(socket=b.socket, linger_ms=1, batch_size=500) as p:
        for i in range(1200):
            p.send("idempotent", value=b"idem-%04d" % i, partition=i % 2,
                   headers=[("n", b"%d" % i)])
            if i % 50 == 49:
                p.flush()


def log_append_time(b) -> None:
    create(b, "appended", **{"message.timestamp.type": "LogAppendTime"})
    with mq.Producer(socket=b.socket, compression_type="lz4", linger_ms=1) as p:
        for i in range(200):
            p.send("appended", value=b"appended-%03d" % i, partition=0, timestamp_ms=T0 + i)
            if i % 20 == 19:
                p.flush()


def compacted(b) -> None:
    """Updates of 8 keys and tombstones (key-0's last), then distinct keys that roll them out
    of the active segment, until the cleaner has cleaned."""
    create(b, "compacted", **{"cleanup.policy": "compact", "segment.bytes": "1024",
                              "min.cleanable.dirty.ratio": "0.01"})
    with mq.Producer(socket=b.socket, linger_ms=1, max_request_size=1024) as p:
        for i in range(160):
            p.send("compacted", key=b"key-%d" % (i % 8), partition=0,
                   value=None if i % 37 == 36 else b"update-%03d" % i)
        p.send("compacted", key=b"key-0", value=None, partition=0)
        p.flush()
        for i in range(60):
            p.send("compacted", key=b"filler-%d" % i, value=b"." * 40, partition=0)
        p.flush()
    wait_for(lambda: "compacted-0: cleaned" in b.stderr(), WAIT, 0.05, "a cleaner pass")


def librdkafka(b) -> None:
    """librdkafka's own batches through the Kafka listener: idempotent, zstd, headers."""
    create_topic(b.bootstrap, "wire", 1, SMALL)
    produce(b.bootstrap, "wire",
            [{"key": b"w%d" % (i % 3), "partition": 0,
              "value": hashlib.sha256(b"%d" % i).hexdigest().encode(),
              "headers": [("src", b"librdkafka")]} for i in range(300)],
            {"enable.idempotence": True, "compression.type": "zstd", "linger.ms": 1,
             "batch.size": 400})


def test_topics(java_kafka, broker):
    for scenario in (plain, codecs, idempotent, log_append_time, compacted, librdkafka):
        scenario(broker)
    result = judge(java_kafka, broker)
    assert not result.findings, "\n".join(result.findings)
    # The scenarios made what they meant to: several segments, sparse indexes, compaction's
    # gaps and delete horizons, each codec.
    segments = {name: sum(p.endswith(files.LOG_SUFFIX) for p in ps)
                for name, ps in partition_files(broker.data_dir).items()}
    assert all(segments[f"{t}-0"] >= 3 for t in ("plain", "codecs", "idempotent", "wire"))
    compacted_batches = batches(broker, "compacted")
    assert sum(batch.records_count for batch in compacted_batches) < 221
    assert any(batch.has_delete_horizon for batch in compacted_batches)
    assert {batch.compression_name for batch in batches(broker, "codecs")} == \
        {"none", "gzip", "snappy", "lz4", "zstd"}


# --- __consumer_offsets and __transaction_state -----------------------------------------------

def transactions(b) -> None:
    """Two transactional producers whose transactions overlap: t1 stays open across t2's
    abort, so that abort's ``.txnindex`` entry has t1's first offset as last stable offset;
    offsets committed inside transactions (one aborted, one committed)."""
    create(b, "txn", 2)
    create(b, "in")
    tp = TopicPartition("in", 0)
    with mq.Producer(socket=b.socket, transactional_id="t1") as t1, \
            mq.Producer(socket=b.socket, transactional_id="t2") as t2:
        t1.init_transactions()
        t2.init_transactions()
        for n, (commit1, commit2) in enumerate([(True, False), (False, True), (True, True),
                                                (False, False)] * 3):
            t1.begin_transaction()
            for i in range(8):
                t1.send("txn", value=b"t1-%d-%d" % (n, i), partition=i % 2)
            t1.flush()
            t2.begin_transaction()
            for i in range(5):
                t2.send("txn", value=b"t2-%d-%d" % (n, i), key=b"k", partition=i % 2)
            t2.send_offsets_to_transaction({tp: n}, "etl")
            t2.commit_transaction() if commit2 else t2.abort_transaction()
            t1.commit_transaction() if commit1 else t1.abort_transaction()


def groups(b) -> None:
    """A group of mq's consumer, one of librdkafka's (classic protocol, through the Kafka
    listener), offsets set by Admin, and a group deleted."""
    with mq.Producer(socket=b.socket) as p:
        for i in range(50):
            p.send("in", value=b"in-%d" % i, partition=0)
    for group in ("native", "doomed"):
        with mq.Consumer("in", group_id=group, socket=b.socket, enable_auto_commit=False) as c:
            got: list = []
            wait_for(lambda: len(got.extend(c.poll(timeout_ms=100).values()) or got) >= 1
                     and sum(map(len, got)) >= 50, WAIT, 0, f"group {group} reading in")
            c.commit()
    c = consumer(b.bootstrap, "librdkafka", {"auto.offset.reset": "earliest"})
    try:
        c.subscribe(["in"])
        read(c, 50)
        c.commit(offsets=[KafkaTopicPartition("in", 0, 42)], asynchronous=False)
    finally:
        c.close()
    with Admin(b.socket) as admin:
        admin.alter_group_offsets("admin-set", {TopicPartition("in", 0): 7})
        admin.delete_group("doomed")


# Kafka's TransactionState ids, as its transaction-log decoder prints them.
COMPLETE_COMMIT, COMPLETE_ABORT = 4, 5


def test_groups_and_transactions(java_kafka, broker):
    transactions(broker)
    groups(broker)
    with Admin(broker.socket) as admin:
        committed = {g: admin.list_group_offsets(g)
                     for g in ("etl", "native", "librdkafka", "admin-set", "doomed")}
        txns = {t: admin.describe_transaction(t) for t in ("t1", "t2")}
    result = judge(java_kafka, broker)
    assert not result.findings, "\n".join(result.findings)

    # Kafka's decoders read mq's coordinator records as mq's Admin reports them: the last
    # offset commit of each group's partition (transactional ones once their batch is
    # committed), and each transactional id's last state.
    offsets_last: dict = {}
    txn_last: dict = {}
    for d in result.decoded:
        kind = (os.path.basename(os.path.dirname(d.path)).rsplit("-", 1)[0], d.key["type"])
        if kind == (OFFSETS_TOPIC, "1"):
            k = d.key["data"]
            offsets_last[(k["group"], TopicPartition(k["topic"], k["partition"]))] = \
                None if d.value is None else d.value["data"]["offset"]
        elif kind == (TXN_TOPIC, "0"):
            txn_last[d.key["data"]["transactionalId"]] = d.value["data"]
    assert committed["doomed"] == {}
    for group, offsets in committed.items():
        if group not in ("etl", "doomed"):     # etl's last records: an aborted transaction's
            assert {tp: o for (g, tp), o in offsets_last.items() if g == group
                    and o is not None} == offsets, group
    assert committed["etl"] == {TopicPartition("in", 0): 10}
    assert {g for g, _ in offsets_last} >= {"etl", "native", "librdkafka", "admin-set",
                                            "doomed"}
    for tid, desc in txns.items():
        assert txn_last[tid]["producerId"] == desc["producer_id"]
        assert txn_last[tid]["producerEpoch"] == desc["producer_epoch"]
        assert txn_last[tid]["transactionStatus"] == \
            {"CompleteCommit": COMPLETE_COMMIT, "CompleteAbort": COMPLETE_ABORT}[desc["state"]]
    # ... and the transaction indexes hold aborts whose last stable offset another open
    # transaction held back (the overlap above).
    aborted = [e for ps in partition_files(broker.data_dir).values() for p in ps
               if p.endswith(files.TXNINDEX_SUFFIX) for e in read_entries(p)]
    assert any(e.last_stable_offset < e.first_offset for e in aborted), aborted


# --- the judge itself -------------------------------------------------------------------------

def _rewrite(path: str, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def test_the_judge_reports_what_kafka_finds_in_damaged_files(java_kafka, broker):
    """Damage three files of one partition as a bad writer would: a record byte (the CRC
    fails), an offset-index position (the entry names another batch), a time-index timestamp
    (out of order). Each is a finding naming its file."""
    plain(broker)
    broker.stop()
    segments = sorted(p for p in partition_files(broker.data_dir)["plain-0"]
                      if p.endswith(files.LOG_SUFFIX))
    log, index, timeindex = (segments[0], os.path.splitext(segments[1])[0] + ".index",
                             os.path.splitext(segments[2])[0] + ".timeindex")
    _rewrite(log, os.path.getsize(log) - 1, b"!")            # the last record's last byte
    _rewrite(index, 4, b"\x00\x00\x00\x00")                  # entry 0 -> position 0
    _rewrite(timeindex, 12, b"\x00" * 8)                      # entry 1 -> timestamp 0
    findings = judge_data_dir(java_kafka, broker.data_dir).findings
    for damaged in (log, index, timeindex):
        name = os.path.relpath(damaged, broker.data_dir)
        assert any(name in f for f in findings), (name, findings)
