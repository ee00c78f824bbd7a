"""``mq log export-kafka`` and ``mq log import-kafka`` against a real Kafka 4.3.1 node (issue
23): a topic copied either way is served by the other broker, record for record, and every
refusal happens with one line, exit status 1, and nothing changed.

- Export: mq's broker writes a topic of two partitions (keys, null keys, tombstones, headers,
  timestamps going back, an idempotent lz4 producer, transactions over both partitions
  committed and aborted), restarting between rounds so that its batches carry leader epochs
  above the new Kafka topic's, and a compacted topic cleaned by mq's cleaner. The command
  refuses while Kafka runs, while mq's broker runs, after mq's broker was killed (no
  clean-shutdown marker), on a topic-id mismatch among Kafka's partition directories and,
  once it has copied, on the now non-empty destination. Kafka then serves what mq's consumer
  read (librdkafka, both isolation levels; bounds), logs no fault with the partitions, and
  Kafka's Java consumer resumes a group from its committed offsets (which carry the batches'
  leader epochs) instead of taking the log for truncated.
- Import: librdkafka writes a topic of two partitions into Kafka (every codec, headers, null
  keys and values, an idempotent producer, transactions committed and aborted); Kafka is
  killed with SIGKILL and the import refuses (no clean-shutdown marker) until Kafka has been
  started and stopped cleanly; it refuses while either broker runs and on a non-empty
  destination. Then ``mq log check`` finds the copies clean and ``mq.Consumer`` reads through
  mq's broker what librdkafka read from Kafka.
"""

from __future__ import annotations

import os

from cli_run import mq_run
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from javakafka import KafkaTarget, write_properties
from kclients import WAIT, consumer, create_topic, deliver, producer, read, read_to_end
from mqread import mq_rows
from test_kafka_serves_mq import ALARMS, log_since

import mq
import mq.testing
from mq.client.admin import Admin
from mq.log import files, partition_metadata

EXPORTED, COMPACTED, IMPORTED = "mq-exported", "mq-exported-compacted", "k-imported"
ISOLATIONS = ("read_uncommitted", "read_committed")
DAY_MS = "86400000"
T0 = 1_750_000_000_000


def transfer(command: str, topic: str, kafka_dir: str, mq_dir: str, *more: str):
    return mq_run("log", command, topic, "--kafka-log-dir", kafka_dir, "--data-dir", mq_dir,
                  *more)


def assert_refused(result, *words: str) -> None:
    """Exit status 1 and one ``mq: error:`` line naming ``words``, no traceback."""
    assert result.code == 1, result
    assert result.out == "" and result.err.count("\n") == 1, result
    assert result.err.startswith("mq: error: "), result
    for word in words:
        assert word in result.err, result


def listing(*dirs: str) -> dict[str, tuple[int, int]]:
    """name -> (size, mtime) of every file under ``dirs``: what a refusal must leave as it
    was."""
    return {os.path.join(root, name): (st.st_size, st.st_mtime_ns)
            for d in dirs for root, _, names in os.walk(d) for name in names
            for st in [os.stat(os.path.join(root, name))]}


def mq_read(b, topic: str, partition: int, isolation: str) -> list[tuple]:
    """Every record of a partition as mq's consumer reads it: (offset, timestamp, key, value,
    headers)."""
    return mq_rows(b.socket, topic, partition, isolation)


def mq_bounds(b, topic: str, partition: int) -> tuple[int, int]:
    with mq.Consumer(socket=b.socket) as c:
        tp = mq.TopicPartition(topic, partition)
        return c.beginning_offsets([tp])[tp], c.end_offsets([tp])[tp]



def kafka_read(bootstrap: str, topic: str, partition: int, isolation: str, count: int
               ) -> list[tuple]:
    c = consumer(bootstrap, conf={"isolation.level": isolation})
    try:
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        return [(m.offset(), m.timestamp()[1], m.key(), m.value(), list(m.headers() or []))
                for m in read(c, count)]
    finally:
        c.close()


def kafka_bounds(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    c = consumer(bootstrap)
    try:
        return tuple(c.get_watermark_offsets(TopicPartition(topic, partition), timeout=WAIT))
    finally:
        c.close()


# --- export: mq -> Kafka ----------------------------------------------------------------------

ROUNDS = 5       # mq's broker starts one leader epoch each: 0 .. 4, above Kafka's 2 at restart


def mq_writes(b) -> None:
    """``ROUNDS`` rounds over both partitions of ``EXPORTED``, the broker restarted after each
    (a new leader epoch each start), then the compacted topic until mq's cleaner has
    cleaned."""
    with Admin(b.socket) as admin:
        admin.create_topic(EXPORTED, 2, {"segment.bytes": "4096", "index.interval.bytes": "256"})
        admin.create_topic(COMPACTED, 1, {"cleanup.policy": "compact", "segment.bytes": "1024",
                                          "min.cleanable.dirty.ratio": "0.01"})
    for r in range(ROUNDS):
        with mq.Producer(socket=b.socket, acks=1, enable_idempotence=False, linger_ms=0,
                         batch_size=300) as p:
            for i in range(80):
                p.send(EXPORTED, partition=i % 2, key=None if i % 5 == 0 else b"k-%d" % (i % 7),
                       value=None if i % 17 == 0 else b"plain-%d-%04d" % (r, i),
                       headers=[("h%d" % j, b"%d" % i) for j in range(i % 3)],
                       timestamp_ms=T0 + r * 10_000 + i * 10 - (3000 if i % 29 == 0 else 0))
        with mq.Producer(socket=b.socket, compression_type="lz4", linger_ms=1) as p:
            for i in range(40):
                p.send(EXPORTED, partition=i % 2, value=b"idempotent-%d-%03d" % (r, i))
        with mq.Producer(socket=b.socket, transactional_id=f"exported-{r}") as p:
            p.init_transactions()
            for n, commit in enumerate((True, False, True)):
                p.begin_transaction()
                for i in range(10):
                    p.send(EXPORTED, partition=i % 2, value=b"txn-%d-%d-%02d" % (r, n, i))
                p.commit_transaction() if commit else p.abort_transaction()
        b.restart()
    with mq.Producer(socket=b.socket, linger_ms=1, max_request_size=1024) as p:
        for i in range(160):
            p.send(COMPACTED, key=b"key-%d" % (i % 8), partition=0,
                   value=None if i % 37 == 36 else b"update-%03d" % i,
                   headers=[("n", b"%d" % i)])
        p.flush()
        for i in range(60):
            p.send(COMPACTED, key=b"filler-%d" % i, value=b"." * 40, partition=0)
    mq.testing.wait_for(lambda: f"{COMPACTED}-0: cleaned" in b.stderr(), WAIT, 0.05,
                        "a pass of mq's cleaner")


def test_export_mq_topic_into_kafka(java_kafka, kafka_node, tmp_path):
    create_topic(kafka_node.bootstrap, EXPORTED, 2, {"index.interval.bytes": "256"})
    # Kafka's cleaner leaves the compacted topic as mq's cleaner left it for a day.
    create_topic(kafka_node.bootstrap, COMPACTED, 1, {"cleanup.policy": "compact",
                                                      "min.compaction.lag.ms": DAY_MS})
    kafka_dir = kafka_node.data_dir
    parts = [(EXPORTED, 0), (EXPORTED, 1), (COMPACTED, 0)]
    conf = tmp_path / "mq.toml"
    conf.write_text("cleaner_backoff_ms = 50\n")          # a cleaner that looks often
    with mq.testing.broker(tmp_path / "mq", config_file=str(conf), log_level="INFO") as b:
        mq_writes(b)
        expected = {(t, p, i): mq_read(b, t, p, i) for t, p in parts for i in ISOLATIONS}
        bounds = {(t, p): mq_bounds(b, t, p) for t, p in parts}
        epochs = mq_epochs(b.data_dir, EXPORTED)
        assert_refused(transfer("export-kafka", EXPORTED, kafka_dir, b.data_dir),
                       "in use", os.path.join(b.data_dir, ".lock"))
        b.kill()                                        # kill -9: no clean-shutdown marker
    assert len(expected[(EXPORTED, 0, "read_committed")]) < \
        len(expected[(EXPORTED, 0, "read_uncommitted")])
    assert epochs == list(range(ROUNDS)), epochs
    assert_refused(transfer("export-kafka", EXPORTED, kafka_dir, b.data_dir),
                   "Kafka's log dir", "in use")
    kafka_node.stop()
    assert_refused(transfer("export-kafka", EXPORTED, kafka_dir, b.data_dir),
                   "not shut down cleanly", "mq log check")
    with mq.testing.broker(b.data_dir, config_file=str(conf)):
        pass                                            # recovers, then stops cleanly

    # A partition directory naming another topic's id.
    other = os.path.join(kafka_dir, files.partition_dir_name(COMPACTED, 0))
    moved = os.path.join(kafka_dir, files.partition_dir_name(EXPORTED, 1))
    mine = partition_metadata.read_topic_id(moved)
    partition_metadata.write_topic_id(moved, partition_metadata.read_topic_id(other))
    before = listing(kafka_dir, b.data_dir)
    assert_refused(transfer("export-kafka", EXPORTED, kafka_dir, b.data_dir),
                   "topic id mismatch", f"{EXPORTED}-1")
    partition_metadata.write_topic_id(moved, mine)
    dry = transfer("export-kafka", EXPORTED, kafka_dir, b.data_dir, "--dry-run")
    assert dry.code == 0 and "would copy" in dry.out, dry
    assert {k: v for k, v in listing(kafka_dir, b.data_dir).items()
            if not k.endswith(partition_metadata.PARTITION_METADATA)} == \
        {k: v for k, v in before.items()
         if not k.endswith(partition_metadata.PARTITION_METADATA)}

    for topic in (EXPORTED, COMPACTED):
        done = transfer("export-kafka", topic, kafka_dir, b.data_dir)
        assert done.code == 0 and not done.err, done
    assert_refused(transfer("export-kafka", EXPORTED, kafka_dir, b.data_dir),
                   "not empty", f"{EXPORTED}-0")
    assert not [n for n in os.listdir(kafka_dir) if n.endswith("-delete")]

    log_start = os.path.getsize(kafka_node.log_path)
    kafka_node.start()
    for (t, p, isolation), rows in expected.items():
        assert kafka_read(kafka_node.bootstrap, t, p, isolation, len(rows)) == rows, \
            (t, p, isolation)
    for (t, p), want in bounds.items():
        assert kafka_bounds(kafka_node.bootstrap, t, p) == want, (t, p)
    assert_group_resumes(java_kafka, kafka_node, tmp_path,
                         {p: expected[(EXPORTED, p, "read_uncommitted")] for p in (0, 1)})
    loaded = log_since(kafka_node, log_start)
    alarms = [line for line in loaded.splitlines()
              if any(f"{t}-{p}" in line for t, p in parts) and ALARMS.search(line)]
    assert not alarms, "\n".join(alarms)


def mq_epochs(data_dir: str, topic: str) -> list[int]:
    """The leader epochs mq's checkpoints name for ``topic``'s first partition."""
    path = os.path.join(data_dir, files.partition_dir_name(topic, 0), "leader-epoch-checkpoint")
    with open(path) as f:
        return [int(line.split()[0]) for line in f.read().splitlines()[2:]]


def assert_group_resumes(java_kafka, kafka_node, tmp_path, rows: dict[int, list]) -> None:
    """Kafka's Java consumer reads all but the last round of ``EXPORTED`` in a group and
    commits (each offset with the leader epoch of the batch it came from: mq's last one); a
    second consumer of the group goes on from there. Kafka's OffsetsForLeaderEpoch must know
    the committed epoch, or the consumer takes the log for truncated and starts again from
    the earliest offset."""
    target = KafkaTarget(java_kafka, kafka_node.bootstrap,       # 10 a poll: stops near N
                         write_properties(tmp_path / "client.properties",
                                          {"max.poll.records": "10"}))
    total = sum(len(r) for r in rows.values())
    first = target.checks(f"consume:{EXPORTED},resumer,classic,read_uncommitted,{total - 40}")
    committed = {int(row[2]): int(row[3]) for row in first if row[0] == "committed"}
    left = {p: [r[0] for r in rows[p] if r[0] >= committed[p]] for p in rows}
    assert all(left.values()), committed
    second = target.checks(f"consume:{EXPORTED},resumer,classic,read_uncommitted,"
                           f"{sum(len(offsets) for offsets in left.values())}")
    got: dict[int, list[int]] = {}
    for row in second:
        if row[0] == "record":
            got.setdefault(int(row[2]), []).append(int(row[3]))
    assert got == left


# --- import: Kafka -> mq ----------------------------------------------------------------------

def kafka_writes(bootstrap: str) -> None:
    """Every codec, headers (a repeated key, a null value), null keys and values, explicit
    timestamps; an idempotent producer; transactions committed and aborted."""
    def records(tag: bytes, n: int) -> list[dict]:
        return [{"partition": i % 2, "key": None if i % 4 == 0 else tag + b"-key-%d" % (i % 5),
                 "value": None if i % 7 == 0 else tag + b"-value-%04d" % i,
                 "headers": [[], [("h", b"%d" % i)], [("h", b"a"), ("h", b"b"), ("nil", None)]
                             ][i % 3],
                 "timestamp": T0 + i * 10 - (5000 if i % 11 == 0 else 0)} for i in range(n)]
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        with producer(bootstrap, {"compression.type": codec, "batch.num.messages": 20}) as p:
            deliver(p, IMPORTED, records(codec.encode(), 60))
    with producer(bootstrap, {"enable.idempotence": True, "compression.type": "zstd"}) as p:
        deliver(p, IMPORTED, records(b"idempotent", 80))
    with producer(bootstrap, {"transactional.id": "imported-txn"}) as p:
        p.init_transactions(WAIT)
        for n, commit in enumerate((True, False, True, False)):
            p.begin_transaction()
            deliver(p, IMPORTED, records(b"txn%d" % n, 16))
            p.commit_transaction(WAIT) if commit else p.abort_transaction(WAIT)


def test_import_kafka_topic_into_mq(kafka_node, tmp_path):
    create_topic(kafka_node.bootstrap, IMPORTED, 2, {"index.interval.bytes": "256"})
    kafka_writes(kafka_node.bootstrap)
    counts = {(p, i): len(kafka_read_all(kafka_node.bootstrap, p, i))
              for p in (0, 1) for i in ISOLATIONS}
    expected = {(p, i): kafka_read(kafka_node.bootstrap, IMPORTED, p, i, n)
                for (p, i), n in counts.items()}
    bounds = {p: kafka_bounds(kafka_node.bootstrap, IMPORTED, p) for p in (0, 1)}
    assert counts[(0, "read_committed")] < counts[(0, "read_uncommitted")]
    kafka_dir = kafka_node.data_dir
    with mq.testing.broker(tmp_path / "mq") as b:
        mq_dir = b.data_dir
        with Admin(b.socket) as admin:
            admin.create_topic(IMPORTED, 2)
        assert_refused(transfer("import-kafka", IMPORTED, kafka_dir, b.data_dir),
                       "Kafka's log dir", "in use")
        kafka_node.kill()                                # kill -9: no clean-shutdown marker
        assert_refused(transfer("import-kafka", IMPORTED, kafka_dir, b.data_dir),
                       "mq's data dir", "in use")
    before = listing(kafka_dir, mq_dir)
    assert_refused(transfer("import-kafka", IMPORTED, kafka_dir, mq_dir),
                   "not shut down cleanly", "start Kafka")
    assert listing(kafka_dir, mq_dir) == before
    kafka_node.start()                                   # recovers, then stops cleanly
    kafka_node.stop()
    done = transfer("import-kafka", IMPORTED, kafka_dir, mq_dir)
    assert done.code == 0 and not done.err, done
    assert done.out.count("copied to") == 2, done
    assert_refused(transfer("import-kafka", IMPORTED, kafka_dir, mq_dir),
                   "not empty", f"{IMPORTED}-0")
    dirs = [os.path.join(mq_dir, files.partition_dir_name(IMPORTED, p)) for p in (0, 1)]
    checked = mq_run("log", "check", *dirs)
    assert checked.code == 0, checked
    with mq.testing.broker(mq_dir) as b:
        for (p, isolation), rows in expected.items():
            assert mq_read(b, IMPORTED, p, isolation) == rows, (p, isolation)
        assert {p: mq_bounds(b, IMPORTED, p) for p in (0, 1)} == bounds


def kafka_read_all(bootstrap: str, partition: int, isolation: str) -> list:
    """Every record of a partition of ``IMPORTED``, read to its end."""
    return read_to_end(bootstrap, IMPORTED, partition, {"isolation.level": isolation})
