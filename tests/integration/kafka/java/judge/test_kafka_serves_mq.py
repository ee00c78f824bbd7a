"""A real Kafka 4.3.1 broker serves mq's segment files (issue 23), by the procedure below.

Kafka adopts no foreign partition directory (one whose topic id its metadata lacks is renamed
"-stray"), so the topic is created in Kafka, written by mq's broker under the same name, and
with Kafka stopped mq's ``.log``, ``.index``, ``.timeindex``, ``.txnindex``, ``.snapshot`` and
``leader-epoch-checkpoint`` replace Kafka's in its partition directory, Kafka's
``partition.metadata`` kept. Kafka then starts twice:

1. with its clean-shutdown marker, so mq's indexes and producer snapshot are served as they
   are;
2. without the marker and with the partition's recovery point at 0, so Kafka recovers every
   batch (CRC, offsets) and rebuilds the indexes and producer state from mq's ``.log`` files.

Each time librdkafka reads the whole partition, read_uncommitted and read_committed, and must
get what mq's own consumer got from mq (offset, timestamp, key, value, headers); the earliest
and latest offsets and offsets for sampled timestamps must be mq's; Kafka's TransactionsCommand
describe-producers must show the producers of mq's snapshot (id, epoch, coordinator epoch,
last sequence and timestamp, open transaction); and Kafka's log must not mention an invalid or
corrupt batch or index, a truncation or a stray log.

Then the same for mq's ``__consumer_offsets`` and ``__transaction_state`` (one partition each,
as the node is configured): Kafka's group and transaction coordinators must load them without
an error, and ConsumerGroupCommand and TransactionsCommand show mq's offsets and transactional
ids. (A test starts Kafka again for each swap: the node is the session's, see ``conftest``.)
"""

from __future__ import annotations

import os
import re
import shutil


from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition
from javakafka import CONSUMER_GROUPS, TRANSACTIONS, KafkaTarget, table, write_properties
from kclients import WAIT, consumer, create_topic, deliver, offset_for_time, read
from kclients import admin as kafka_admin
from mqread import mq_rows
from producers import kafka_producers, mq_producers

import mq
import mq.testing
from mq.client.admin import Admin
from mq.log import files
from mq.testing import wait_for

TOPIC = "served"
T0 = 1_750_000_000_000
SWAPPED = (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX, files.TXNINDEX_SUFFIX,
           files.SNAPSHOT_SUFFIX)
EPOCHS = "leader-epoch-checkpoint"
RECOVERY_POINTS = "recovery-point-offset-checkpoint"
CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
# What Kafka logs when it finds fault with a log it loads (LogLoader, LogSegment, LogManager:
# "Found invalid messages in log segment", "Corruption found in segment", "Found a corrupted
# index file", "Truncated … invalid bytes", "marked stray"), each naming the partition or its
# directory.
ALARMS = re.compile(r"invalid|corrupt|truncat|stray|error|exception", re.IGNORECASE)


def write_with_mq(tmp_path) -> tuple[str, dict]:
    """mq's broker writes ``TOPIC``: plain records with keys, null keys, tombstones, headers
    and timestamps going back now and then; an idempotent lz4 producer; transactions committed
    and aborted (both stamped now: Kafka drops a producer whose last timestamp is older than
    ``producer.id.expiration.ms``, a day, when it loads one). Returns the partition directory
    and what mq's consumer reads of it."""
    with mq.testing.broker(tmp_path / "mq") as b:
        with Admin(b.socket) as admin:
            admin.create_topic(TOPIC, 1, {"segment.bytes": "4096",
                                          "index.interval.bytes": "256"})
        with mq.Producer(socket=b.socket, acks=1, enable_idempotence=False, linger_ms=0,
                         batch_size=300) as p:
            for i in range(200):
                p.send(TOPIC, partition=0, key=None if i % 5 == 0 else b"key-%d" % (i % 7),
                       value=None if i % 17 == 0 else b"plain-%04d" % i,
                       headers=[("h%d" % j, b"%d" % i) for j in range(i % 3)],
                       timestamp_ms=T0 + i * 10 - (3000 if i % 29 == 0 else 0))
        with mq.Producer(socket=b.socket, compression_type="lz4", linger_ms=1) as p:
            for i in range(200):
                p.send(TOPIC, partition=0, value=b"idempotent-%04d" % i)
        with mq.Producer(socket=b.socket, transactional_id="served") as p:
            p.init_transactions()
            for n, commit in enumerate((True, False, True, False, True)):
                p.begin_transaction()
                for i in range(20):
                    p.send(TOPIC, partition=0, value=b"txn-%d-%02d" % (n, i))
                p.commit_transaction() if commit else p.abort_transaction()
        expected = {isolation: mq_read(b, isolation)
                    for isolation in ("read_uncommitted", "read_committed")}
        with mq.Consumer(socket=b.socket) as c:
            tp = mq.TopicPartition(TOPIC, 0)
            c.assign([tp])
            expected["bounds"] = (c.beginning_offsets([tp])[tp], c.end_offsets([tp])[tp])
            rows = expected["read_uncommitted"]
            sampled = [T0, T0 + 995, *(rows[i][1] for i in range(150, len(rows), 70)),
                       rows[-1][1] + 1]
            expected["times"] = {ts: (c.offsets_for_times({tp: ts})[tp] or (-1,))[0]
                                 for ts in sampled}
    directory = os.path.join(b.data_dir, files.partition_dir_name(TOPIC, 0))
    expected["producers"] = mq_producers(directory, expected["bounds"][1])
    return directory, expected


def mq_read(b, isolation: str) -> list[tuple]:
    return mq_rows(b.socket, TOPIC, 0, isolation)



def kafka_read(bootstrap: str, isolation: str, count: int) -> list[tuple]:
    c = consumer(bootstrap, conf={"isolation.level": isolation})
    try:
        c.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        return [(m.offset(), m.timestamp()[1], m.key(), m.value(), list(m.headers() or []))
                for m in read(c, count)]
    finally:
        c.close()


def kafka_offsets(bootstrap: str, timestamps) -> tuple[tuple[int, int], dict]:
    c = consumer(bootstrap)
    try:
        bounds = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
        # one ListOffsets per timestamp: librdkafka asks once per partition in a call
        return tuple(bounds), {ts: offset_for_time(c, TOPIC, ts) for ts in timestamps}
    finally:
        c.close()


def swap_in(mq_dir: str, kafka_dir: str) -> None:
    """Kafka's segment files and epoch checkpoint out, mq's in; ``partition.metadata`` stays."""
    for name in os.listdir(kafka_dir):
        if name.endswith(SWAPPED) or name == EPOCHS:
            os.unlink(os.path.join(kafka_dir, name))
    for name in os.listdir(mq_dir):
        if name.endswith(SWAPPED) or name == EPOCHS:
            shutil.copy2(os.path.join(mq_dir, name), kafka_dir)


def reset_recovery_point(data_dir: str) -> None:
    """Kafka's checkpoint file (version, count, "topic partition offset" lines) with this
    partition's recovery point at 0, so that a start without the marker recovers it all."""
    path = os.path.join(data_dir, RECOVERY_POINTS)
    with open(path) as f:
        lines = f.read().splitlines()
    lines = lines[:2] + [f"{TOPIC} 0 0" if line.startswith(f"{TOPIC} 0 ") else line
                         for line in lines[2:]]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def log_since(node, start: int) -> str:
    with open(node.log_path, errors="replace") as f:
        f.seek(start)
        return f.read()


def assert_kafka_serves(node, expected: dict, log_start: int, producers: list) -> None:
    for isolation in ("read_uncommitted", "read_committed"):
        got = kafka_read(node.bootstrap, isolation, len(expected[isolation]))
        assert got == expected[isolation], isolation
    bounds, times = kafka_offsets(node.bootstrap, list(expected["times"]))
    assert bounds == expected["bounds"]
    assert times == expected["times"]
    assert producers == expected["producers"]
    loaded = log_since(node, log_start)
    assert f"{TOPIC}-0" in loaded, "Kafka's log does not mention loading the partition"
    alarms = [line for line in loaded.splitlines()
              if f"{TOPIC}-0" in line and ALARMS.search(line)]
    assert not alarms, "\n".join(alarms)


def test_kafka_serves_mq_segments_as_they_are_and_recovered(java_kafka, kafka_node, tmp_path):
    create_topic(kafka_node.bootstrap, TOPIC, 1)
    mq_dir, expected = write_with_mq(tmp_path)
    kafka_dir = os.path.join(kafka_node.data_dir, files.partition_dir_name(TOPIC, 0))
    target = KafkaTarget(java_kafka, kafka_node.bootstrap,
                         write_properties(tmp_path / "client.properties", {}))
    # 1. mq's indexes and producer snapshot, served as they are.
    kafka_node.stop()
    assert os.path.exists(os.path.join(kafka_node.data_dir, CLEAN_SHUTDOWN))
    swap_in(mq_dir, kafka_dir)
    log_start = os.path.getsize(kafka_node.log_path)
    kafka_node.start()
    assert_kafka_serves(kafka_node, expected, log_start,
                        kafka_producers(target, TOPIC))
    # 2. Kafka recovers every batch of mq's .log files and rebuilds what goes with them.
    kafka_node.stop()
    swap_in(mq_dir, kafka_dir)
    os.unlink(os.path.join(kafka_node.data_dir, CLEAN_SHUTDOWN))
    reset_recovery_point(kafka_node.data_dir)
    log_start = os.path.getsize(kafka_node.log_path)
    kafka_node.start()
    assert "Attempting recovery" in log_since(kafka_node, log_start) or \
        "Recovering unflushed segment" in log_since(kafka_node, log_start)
    assert_kafka_serves(kafka_node, expected, log_start,
                        kafka_producers(target, TOPIC))


# --- __consumer_offsets and __transaction_state ------------------------------------------------

COORDINATOR_TOPICS = ("__consumer_offsets", "__transaction_state")


def kafka_coordinators_in_use(bootstrap: str) -> None:
    """Kafka creates its coordinator topics on first use: a group commit, a transaction."""
    c = consumer(bootstrap, "kafka-own-group")
    try:
        c.commit(offsets=[TopicPartition("grouped", 0, 1)], asynchronous=False)
    finally:
        c.close()
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "kafka-own-txn"})
    p.init_transactions(30)
    p.begin_transaction()
    deliver(p, "grouped", [{"value": b"kafka", "partition": 0}])
    p.commit_transaction(30)


def mq_groups(b) -> None:
    """Offsets set by Admin, and committed inside a committed and an aborted transaction."""
    tp = mq.TopicPartition("grouped", 1)
    for tid, commit in (("mq-committer", True), ("mq-aborter", False)):
        with mq.Producer(socket=b.socket, transactional_id=tid) as p:
            p.init_transactions()
            p.begin_transaction()
            p.send("grouped", value=tid.encode(), partition=0)
            p.send_offsets_to_transaction({tp: 11 if commit else 13}, "etl")
            p.commit_transaction() if commit else p.abort_transaction()
    with Admin(b.socket) as admin:
        admin.alter_group_offsets("admin-set", {mq.TopicPartition("grouped", 0): 7})


def mq_consumer_group(b) -> None:
    """A group of mq's consumer commits, and its member leaves."""
    with mq.Consumer("grouped", group_id="native", socket=b.socket,
                     enable_auto_commit=False) as c:
        def caught_up() -> bool:
            c.poll(timeout_ms=100)
            return sum(c.position(tp) for tp in c.assignment()) >= 40
        wait_for(caught_up, WAIT, 0, "group native reading grouped")
        c.commit()


def loaded_coordinators(log: str) -> bool:
    """Kafka's log says both coordinators finished loading (or failed to)."""
    return ("Completed loading transaction metadata from __transaction_state-0" in log and
            re.search(r"(Finished loading of|Failed to load) metadata from __consumer_offsets-0",
                      log) is not None)


def swap_coordinators(java_kafka, kafka_node, tmp_path, scenario
                      ) -> tuple[KafkaTarget, dict, dict, str]:
    """mq's broker runs ``scenario``; its ``__consumer_offsets`` and ``__transaction_state``
    replace Kafka's (one partition each, as the node is configured), and Kafka restarts.
    Returns a target for Kafka's tools, the groups' offsets and the transactional ids' states
    as mq's Admin reported them, and Kafka's log of the restart."""
    if "grouped" not in kafka_admin(kafka_node.bootstrap).list_topics(timeout=WAIT).topics:
        create_topic(kafka_node.bootstrap, "grouped", 2)
    kafka_coordinators_in_use(kafka_node.bootstrap)
    with mq.testing.broker(tmp_path / "mq-coordinators") as b:
        with Admin(b.socket) as admin:
            admin.create_topic("grouped", 2)
        with mq.Producer(socket=b.socket) as p:
            for i in range(40):
                p.send("grouped", value=b"g-%d" % i, partition=i % 2)
        scenario(b)
        with Admin(b.socket) as admin:
            offsets = {g["group"]: {(tp.topic, tp.partition): o for tp, o in
                                    admin.list_group_offsets(g["group"]).items()}
                       for g in admin.list_groups()}
            txns = {t["transactional_id"]: t for t in admin.list_transactions()}
    kafka_node.stop()
    for topic in COORDINATOR_TOPICS:
        name = files.partition_dir_name(topic, 0)
        swap_in(os.path.join(b.data_dir, name), os.path.join(kafka_node.data_dir, name))
    log_start = os.path.getsize(kafka_node.log_path)
    kafka_node.start()
    wait_for(lambda: loaded_coordinators(log_since(kafka_node, log_start)), WAIT, 0.1,
             "Kafka's coordinators loading mq's records")
    target = KafkaTarget(java_kafka, kafka_node.bootstrap,
                         write_properties(tmp_path / "client.properties", {}))
    return target, offsets, txns, log_since(kafka_node, log_start)


def kafka_group_offsets(target: KafkaTarget) -> dict:
    """Every group's committed offsets, as ConsumerGroupCommand describes them."""
    described = target.tool(CONSUMER_GROUPS, "--describe", "--offsets", "--all-groups").stdout
    seen: dict = {}
    for block in described.strip().split("\n\n"):
        for row in table(block) if block.strip() else []:
            if row["CURRENT-OFFSET"] != "-":
                seen.setdefault(row["GROUP"], {})[(row["TOPIC"], int(row["PARTITION"]))] = \
                    int(row["CURRENT-OFFSET"])
    return seen


def test_kafka_coordinators_load_mq_offsets_and_transactions(java_kafka, kafka_node, tmp_path):
    """Kafka's group and transaction coordinators load mq's records without a complaint, and
    ConsumerGroupCommand and TransactionsCommand show mq's offsets (set by Admin, committed
    in a transaction, committed by a group of mq's consumer whose member then left) and
    transactional ids."""
    def scenario(b) -> None:
        mq_groups(b)
        mq_consumer_group(b)
    target, offsets, txns, loaded = swap_coordinators(java_kafka, kafka_node, tmp_path,
                                                      scenario)
    assert set(offsets) == {"etl", "admin-set", "native"}
    alarms = [line for line in loaded.splitlines()
              if any(t in line for t in COORDINATOR_TOPICS) and ALARMS.search(line)]
    assert not alarms, "\n".join(alarms)
    listed = {row["TransactionalId"]: row
              for row in table(target.tool(TRANSACTIONS, "list").stdout)}
    assert {tid: (int(row["ProducerId"]), row["TransactionState"])
            for tid, row in listed.items()} == \
        {tid: (txn["producer_id"], txn["state"]) for tid, txn in txns.items()}
    assert kafka_group_offsets(target) == offsets
