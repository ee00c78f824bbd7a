"""``mq migrate`` against the shared three-node Kafka cluster (``kafka_cluster``): a broker's
topics (with aborted transactions among their records), a consume-transform-produce group
committing through transactions and a plain group are moved; on Kafka, a confluent-kafka
consumer of each group reads exactly the records it had not processed on mq, and every topic
holds exactly the source's committed records. A run killed mid-copy and run again leaves the
same content; refusals are one line and write nothing. Security settings pass through to a SASL
listener (mq's own, as a second Kafka)."""

from __future__ import annotations

import json
import socket
import time
import uuid

import pytest
from cli_run import mq_process, mq_run
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

import mq.testing
from mq.client.admin import Admin
from mq.client.consumer import Consumer
from mq.client.producer import Producer
from mq.migrate.offsets import SOURCE_HEADER, source_offset

WAIT = 60
T0 = 1_700_000_000_000          # old CreateTime timestamps: the copy must keep them


@pytest.fixture
def unique() -> str:
    """A suffix for this test's topic and group names on the shared cluster."""
    return uuid.uuid4().hex[:8]


def produce_orders(sock: str, topic: str, unique: str, rounds: int = 5) -> None:
    """Rounds of plain records, each followed by an aborted and a committed transaction."""
    with Producer(socket=sock) as plain, \
            Producer(socket=sock, transactional_id=f"shop-{unique}") as shop:
        shop.init_transactions()
        for r in range(rounds):
            for i in range(300):
                plain.send(topic, key=b"k%d" % (i % 17), value=b"order-%d-%d" % (r, i),
                           headers=[("round", b"%d" % r), ("nil", None)],
                           timestamp_ms=T0 + 1000 * r + i)
            plain.flush()
            for outcome in ("aborted", "committed"):
                shop.begin_transaction()
                for i in range(40):
                    shop.send(topic, key=b"t%d" % i, value=b"%s-%d-%d" % (outcome.encode(), r, i))
                if outcome == "aborted":
                    shop.abort_transaction()
                else:
                    shop.commit_transaction()


def transform(sock: str, source: str, sink: str, group: str, commits: int) -> None:
    """A consume-transform-produce loop: every third transaction aborts (its batch is read
    again), until ``commits`` transactions committed."""
    with Consumer(source, group_id=group, socket=sock, isolation_level="read_committed",
                  enable_auto_commit=False, value_bytes=True) as consumer, \
            Producer(socket=sock, transactional_id=f"{group}-tx") as producer:
        producer.init_transactions()
        done = tries = 0
        deadline = time.monotonic() + WAIT
        while done < commits:
            assert time.monotonic() < deadline, f"{done} transactions committed"
            polled = consumer.poll(timeout_ms=500, max_records=60)
            if not polled:
                continue
            tries += 1
            producer.begin_transaction()
            for records in polled.values():
                for r in records:
                    producer.send(sink, key=r.key, value=b"out-" + r.value)
            if tries % 3 == 0:
                producer.abort_transaction()
                for tp, records in polled.items():
                    consumer.seek(tp, records[0].offset)
                continue
            producer.send_offsets_to_transaction(     # every partition's: each has one
                {tp: consumer.position(tp) for tp in consumer.assignment()}, consumer)
            producer.commit_transaction()
            done += 1


def consume_and_commit(sock: str, topic: str, group: str, count: int) -> None:
    with Consumer(topic, group_id=group, socket=sock, isolation_level="read_committed",
                  enable_auto_commit=False) as consumer:
        got = 0
        deadline = time.monotonic() + WAIT
        while got < count:
            assert time.monotonic() < deadline, f"read {got} of {topic}"
            got += sum(map(len, consumer.poll(timeout_ms=500, max_records=count - got)
                           .values()))
        consumer.commit()


def source_records(sock: str, topic: str) -> dict[int, list[tuple]]:
    """``{partition: [(offset, key, value, headers, timestamp)]}``: every committed record."""
    out: dict[int, list[tuple]] = {}
    with Consumer(topic, socket=sock, isolation_level="read_committed",
                  value_bytes=True) as consumer:
        tps = sorted(consumer.assignment())
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + WAIT
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"reading {topic} on mq"
            for tp, records in consumer.poll(timeout_ms=200).items():
                out.setdefault(tp.partition, []).extend(
                    (r.offset, r.key, r.value, r.headers, r.timestamp_ms) for r in records)
        return {tp.partition: out.get(tp.partition, []) for tp in tps}


def _record(msg) -> tuple:
    """A Kafka message as ``source_records`` shows its source: (its mq.source.offset, key,
    value, the other headers, timestamp)."""
    headers = msg.headers() or []
    return (source_offset(headers), msg.key(), msg.value(),
            [(k, v) for k, v in headers if k != SOURCE_HEADER], msg.timestamp()[1])


def kafka_records(bootstrap: str, topic: str, partitions: int, conf: dict | None = None
                  ) -> dict[int, list[tuple]]:
    """Every record of the Kafka topic, as ``_record``s; also checks that the target offsets
    run from 0 without a gap (one per record written, nothing else written there)."""
    consumer = KafkaConsumer({**(conf or {}), "bootstrap.servers": bootstrap,
                              "group.id": "test-reader",
                              "enable.auto.commit": False, "isolation.level": "read_committed",
                              "enable.partition.eof": True})
    try:
        out: dict[int, list[tuple]] = {}
        for p in range(partitions):
            _, high = consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), WAIT)
            consumer.assign([KafkaTopicPartition(topic, p, 0)])
            rows = out[p] = []
            deadline = time.monotonic() + WAIT
            while len(rows) < high:
                assert time.monotonic() < deadline, f"reading {topic}-{p} on Kafka"
                msg = consumer.poll(1.0)
                if msg is None or msg.error() is not None:
                    continue
                assert msg.offset() == len(rows), "a gap in the target offsets"
                rows.append(_record(msg))
        return out
    finally:
        consumer.close()


def resume_on_kafka(bootstrap: str, group: str, topic: str, count: int,
                    conf: dict | None = None) -> dict[int, list]:
    """What a consumer of ``group`` reads on Kafka from its committed offsets (no reset
    allowed: ``auto.offset.reset=error``), ``count`` records, by partition."""
    consumer = KafkaConsumer({**(conf or {}), "bootstrap.servers": bootstrap,
                              "group.id": group,
                              "enable.auto.commit": False, "auto.offset.reset": "error",
                              "isolation.level": "read_committed"})
    try:
        consumer.subscribe([topic])
        got: dict[int, list] = {}
        deadline = time.monotonic() + WAIT
        while sum(map(len, got.values())) < count:
            assert time.monotonic() < deadline, f"{group} read {got} on Kafka"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.setdefault(msg.partition(), []).append(_record(msg)[:3])
        return got
    finally:
        consumer.close()


def unprocessed(records: dict[int, list[tuple]], committed: dict) -> dict[int, list]:
    """The source records at or after each partition's committed offset."""
    out = {}
    for p, rows in records.items():
        left = [r[:3] for r in rows if r[0] >= committed.get(p, 0)]
        if left:
            out[p] = left
    return out


def test_groups_continue_on_kafka_at_the_next_unprocessed_record(tmp_path, kafka_cluster, unique):
    orders, ledger = f"orders-{unique}", f"ledger-{unique}"
    billing, audit = f"billing-{unique}", f"audit-{unique}"
    with mq.testing.broker(tmp_path / "data") as b:
        with Admin(b.socket) as admin:
            admin.create_topic(orders, 3, {"retention.ms": "-1"})
            admin.create_topic(ledger, 2, {"retention.bytes": "100000000"})
        produce_orders(b.socket, orders, unique)
        transform(b.socket, orders, ledger, billing, commits=12)
        consume_and_commit(b.socket, ledger, audit, 100)
        with Admin(b.socket) as admin:
            committed = {g: {tp.partition: o for tp, o in admin.list_group_offsets(g).items()}
                         for g in (billing, audit)}
        source = {t: source_records(b.socket, t) for t in (orders, ledger)}

        done = mq_run("migrate", "--to", kafka_cluster.bootstrap, "--socket", b.socket, "--json",
                      "--replication-factor", "3", "--topic-config", "min.insync.replicas=2",
                      timeout=WAIT * 3)
        assert done.code == 0, done

    # Every topic holds exactly the committed records, keys, values, headers, timestamps.
    for topic, partitions in ((orders, 3), (ledger, 2)):
        assert kafka_records(kafka_cluster.bootstrap, topic, partitions) == source[topic]
    values = [r[2] for rows in source[orders].values() for r in rows]
    assert not any(v.startswith(b"aborted") for v in values)
    assert sum(v.startswith(b"committed") for v in values) == 5 * 40
    # Each group reads on Kafka exactly the records it had not processed on mq.
    for group, topic in ((billing, orders), (audit, ledger)):
        expected = unprocessed(source[topic], committed[group])
        assert 0 < sum(map(len, expected.values())) < sum(map(len, source[topic].values()))
        got = resume_on_kafka(kafka_cluster.bootstrap, group, topic,
                              sum(map(len, expected.values())))
        assert got == expected, group
    # ... and stops there: a partition with nothing left is committed at its end.
    moves = [line for line in map(json.loads, done.out.splitlines()) if "group" in line]
    ends = {(r["topic"], r["partition"]): r["target_end"]
            for r in map(json.loads, done.out.splitlines()) if "copied" in r}
    for move in moves:
        rows = source[move["topic"]][move["partition"]]
        if not any(r[0] >= move["source_offset"] for r in rows):
            assert move["target_offset"] == ends[move["topic"], move["partition"]]
    # The topic configs that matter came along; timestamps stay CreateTime.
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, orders)
    configs = admin.describe_configs([resource])[resource].result(WAIT)
    assert configs["retention.ms"].value == "-1"
    assert configs["message.timestamp.type"].value == "CreateTime"
    assert configs["min.insync.replicas"].value == "2"
    assert {len(p.replicas) for p in kafka_cluster.partitions(orders, ledger)} == {3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    consumer = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "test-reader"})
    try:
        return consumer.get_watermark_offsets(KafkaTopicPartition(topic, partition), 5)[1]
    except Exception:       # noqa: BLE001 -- not created yet
        return 0
    finally:
        consumer.close()


def refuse_to_move_a_group_active_on_kafka(sock: str, bootstrap: str, topic: str,
                                           group: str) -> None:
    """A group with a live member on Kafka, or one that committed there, is not moved again
    (its offsets on Kafka stay as they are)."""
    member = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                            "enable.auto.commit": False})
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + WAIT
        while not member.assignment():
            assert time.monotonic() < deadline, "no assignment on Kafka"
            member.poll(0.2)
        live = mq_run("migrate", "--to", bootstrap, "--socket", sock, "--topic", topic)
        assert live.code == 1 and "live members on Kafka" in live.err, live
        [tp] = member.committed([KafkaTopicPartition(topic, 0)], WAIT)
        member.commit(offsets=[KafkaTopicPartition(topic, 0, tp.offset + 1)],
                      asynchronous=False)
    finally:
        member.close()
    moved = mq_run("migrate", "--to", bootstrap, "--socket", sock, "--topic", topic)
    assert moved.code == 1 and "it has consumed there; not overwritten" in moved.err, moved
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [KafkaTopicPartition(topic, 0)])]).values()
    assert future.result().topic_partitions[0].offset == tp.offset + 1
    admin.alter_consumer_group_offsets(                     # as mq migrate had set it
        [ConsumerGroupTopicPartitions(group, [tp])])[group].result()


def test_a_killed_run_run_again_leaves_what_one_run_leaves(tmp_path, kafka_cluster, unique):
    topic, group = f"events-{unique}", f"readers-{unique}"
    total = 300_000
    with mq.testing.broker(tmp_path / "data") as b:
        with Admin(b.socket) as admin:
            admin.create_topic(topic, 2)
        with Producer(socket=b.socket) as producer:
            for i in range(0, total, 1000):
                producer.send_many(topic, [b"event-%d" % n for n in range(i, i + 1000)],
                                   keys=[b"%d" % (n % 97) for n in range(i, i + 1000)])
            producer.flush()
        consume_and_commit(b.socket, topic, group, 5000)
        with Admin(b.socket) as admin:
            committed = {tp.partition: o for tp, o in admin.list_group_offsets(group).items()}

        with mq_process("migrate", "--to", kafka_cluster.bootstrap, "--socket", b.socket) as proc:
            deadline = time.monotonic() + WAIT
            while _high_watermark(kafka_cluster.bootstrap, topic, 0) == 0:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "no record copied"
                time.sleep(0.01)
            proc.kill()
            proc.wait()
        partial = sum(_high_watermark(kafka_cluster.bootstrap, topic, p) for p in range(2))
        assert 0 < partial < total, "the run was not killed mid-copy"

        again = mq_run("migrate", "--to", kafka_cluster.bootstrap, "--socket", b.socket,
                       "--json", timeout=WAIT * 3)
        assert again.code == 0, again
        # It continues after what the killed run wrote (its last requests may have landed
        # after the kill: at least what was counted then). Source offsets are record counts
        # here: no transaction, nothing deleted.
        rows = [r for r in map(json.loads, again.out.splitlines()) if "copied" in r]
        kept = sum(r["from_offset"] for r in rows)
        assert partial <= kept < total
        assert sum(r["copied"] for r in rows) == total - kept
        once_more = mq_run("migrate", "--to", kafka_cluster.bootstrap, "--socket", b.socket,
                           "--json")
        assert once_more.code == 0, once_more
        assert {r["copied"] for r in map(json.loads, once_more.out.splitlines())
                if "copied" in r} == {0}
        source = source_records(b.socket, topic)
        refuse_to_move_a_group_active_on_kafka(b.socket, kafka_cluster.bootstrap, topic, group)

    assert kafka_records(kafka_cluster.bootstrap, topic, 2) == source
    expected = unprocessed(source, committed)
    assert resume_on_kafka(kafka_cluster.bootstrap, group, topic,
                           sum(map(len, expected.values()))) == expected


def produce_on_kafka(bootstrap: str, topic: str, value: bytes) -> None:
    """One record without mq.source.offset (the topic is auto-created: one partition)."""
    producer = KafkaProducer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value=value)
    assert producer.flush(WAIT) == 0


def test_refusals_are_one_line_and_write_nothing(tmp_path, kafka_cluster, unique):
    topic, foreign, group = f"plain-{unique}", f"foreign-{unique}", f"live-{unique}"
    emptied = f"emptied-{unique}"
    boot = kafka_cluster.bootstrap
    with mq.testing.broker(tmp_path / "data") as b:
        with Admin(b.socket) as admin:
            for name in (topic, foreign, emptied):
                admin.create_topic(name, 1)
        with Producer(socket=b.socket) as producer:
            for name in (topic, foreign, emptied):
                producer.send(name, value=b"x")
            producer.flush()
        produce_on_kafka(boot, foreign, b"not mq's")
        produce_on_kafka(boot, emptied, b"deleted")
        kafka_admin = AdminClient({"bootstrap.servers": boot})
        [deleted] = kafka_admin.delete_records([KafkaTopicPartition(emptied, 0, 1)]).values()
        deleted.result(WAIT)

        def refused(*args, match: str, code: int = 1) -> None:
            run = mq_run("migrate", "--socket", b.socket, *args)
            assert run.code == code, run
            assert run.err.count("\n") == 1 and run.err.startswith("mq: error: "), run
            assert match in run.err, run

        refused("--to", f"127.0.0.1:{_free_port()}", "--timeout", "2",
                match="cannot reach the cluster")
        refused("--to", boot, "--topic", "nope", match="unknown topic 'nope'")
        refused("--to", boot, "--topic", "__consumer_offsets", match="internal topic")
        refused("--to", boot, "--topic", foreign, "--no-groups",
                match="did not write (its last record has no mq.source.offset header)")
        refused("--to", boot, "--topic", emptied, "--no-groups",
                match="has had 1 records but holds none")
        refused("--to", boot, "--to-config", "no.such.property=1", match="bad --to-config")
        refused("--to", boot, "--to-config", "novalue", match="expected key=value", code=2)
        refused("--to", boot, "--topic", topic, "--group", "nobody",
                match="unknown group 'nobody'")
        with Consumer(topic, group_id=group, socket=b.socket) as member:
            member.poll(timeout_ms=5000)
            member.commit()
            refused("--to", boot, "--topic", topic, match="live members on mq")

        dry = mq_run("migrate", "--to", boot, "--socket", b.socket, "--topic", topic,
                     "--dry-run", "--json")
        assert dry.code == 0, dry
        [plan, offsets] = map(json.loads, dry.out.splitlines())
        assert plan["create"] and plan["to_offset"] == 1 and offsets["group"] == group
    assert topic not in AdminClient({"bootstrap.servers": boot}).list_topics(
        timeout=WAIT).topics


SASL = ('kafka_listeners = ["SASL_PLAINTEXT://127.0.0.1:0"]\n'
        'kafka_sasl_mechanisms = ["SCRAM-SHA-512"]\nkafka_super_users = ["alice"]\n')


def test_security_settings_pass_through_to_mqs_own_kafka_listener(tmp_path, unique):
    """The target is another mq broker's SASL listener (SCRAM): --to-config and
    --to-config-file carry librdkafka's properties, and mq's listener takes the copy and
    the offsets as Kafka does."""
    topic, group = f"notes-{unique}", f"readers-{unique}"
    (tmp_path / "sasl.toml").write_text(SASL)
    creds = tmp_path / "creds.properties"
    creds.write_text("# alice on the target\nsasl.mechanism=SCRAM-SHA-512\n"
                     "sasl.username=alice\nsasl.password=alice-secret\n")
    conf = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice", "sasl.password": "alice-secret"}
    with mq.testing.broker(tmp_path / "source") as source, \
            mq.testing.broker(tmp_path / "target", config_file=str(tmp_path / "sasl.toml")
                              ) as target:
        added = mq_run("users", "add", "alice", "--socket", target.socket,
                       stdin=b"alice-secret\n")
        assert added.code == 0, added
        with Admin(target.socket) as admin:
            [listener] = admin.broker_stats()["broker"]["kafka_listeners"]
        bootstrap = listener.removeprefix("SASL_PLAINTEXT://")
        with Admin(source.socket) as admin:
            admin.create_topic(topic, 2)
        with Producer(socket=source.socket) as producer:
            for i in range(500):
                producer.send(topic, key=b"%d" % (i % 5), value=b"note-%d" % i)
            producer.flush()
        consume_and_commit(source.socket, topic, group, 120)
        with Admin(source.socket) as admin:
            committed = {tp.partition: o for tp, o in admin.list_group_offsets(group).items()}

        wrong = mq_run("migrate", "--to", bootstrap, "--socket", source.socket,
                       "--to-config", "security.protocol=SASL_PLAINTEXT", "--to-config-file",
                       str(creds), "--to-config", "sasl.password=wrong", "--timeout", "3")
        assert wrong.code == 1 and wrong.err.count("\n") == 1, wrong
        assert "mq: error: Kafka at" in wrong.err and "Authentication failed" in wrong.err, wrong
        done = mq_run("migrate", "--to", bootstrap, "--socket", source.socket,
                      "--to-config", "security.protocol=SASL_PLAINTEXT", "--to-config-file",
                      str(creds))
        assert done.code == 0, done
        source_rows = source_records(source.socket, topic)
        assert kafka_records(bootstrap, topic, 2, conf) == source_rows
        expected = unprocessed(source_rows, committed)
        assert resume_on_kafka(bootstrap, group, topic, sum(map(len, expected.values())),
                               conf) == expected
