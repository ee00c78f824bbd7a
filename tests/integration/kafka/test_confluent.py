"""confluent-kafka (librdkafka 2.16) against the Kafka listener: every codec, the idempotent
and transactional producers, classic and KIP-848 consumer groups, offsets_for_times and the
AdminClient's topic, config, group, record and cluster calls. Each test has its own broker."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import (OFFSET_BEGINNING, OFFSET_END, TIMESTAMP_CREATE_TIME, Consumer,
                             ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaError,
                             KafkaException, TopicPartition)
from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ConfigSource, NewPartitions, NewTopic)
from kclients import (LOGGER, WAIT, admin, consumer, create_topic, deliver, offset_for_time,
                      produce, producer, read, read_partitions, segment_batches, values)

from mq.testing import wait_for

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}     # attributes bits 0-2


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_fetch_with_every_codec(kafka_mq, codec):
    create_topic(kafka_mq.bootstrap, "codec", 2)
    ts0 = now_ms() - 60_000
    records = [{"value": f"value {i} ".encode() * 20, "key": f"k{i}".encode(),
                "partition": i % 2, "timestamp": ts0 + i,
                "headers": [("n", str(i).encode()), ("dup", b"a"), ("dup", b"b"),
                            ("null", None)]} for i in range(20)]
    sent = produce(kafka_mq.bootstrap, "codec", records, {"compression.type": codec})
    assert sorted((m.partition(), m.offset(), m.value()) for m in sent) == sorted(
        (i % 2, i // 2, r["value"]) for i, r in enumerate(records))

    got = read_partitions(kafka_mq.bootstrap, "codec", 20, (0, 1))
    got.sort(key=lambda m: (m.partition(), m.offset()))
    expected = sorted(records, key=lambda r: (r["partition"], r["timestamp"]))
    for msg, rec in zip(got, expected, strict=True):
        assert msg.value() == rec["value"] and msg.key() == rec["key"]
        assert msg.headers() == rec["headers"]
        assert msg.timestamp() == (TIMESTAMP_CREATE_TIME, rec["timestamp"])
    assert [(m.partition(), m.offset()) for m in got] == [(p, o) for p in (0, 1)
                                                         for o in range(10)]
    if kafka_mq.data_dir is not None:      # stored as sent: the client's codec, not re-encoded
        assert {c for _, _, c in segment_batches(kafka_mq.data_dir, "codec")} == {CODECS[codec]}


def test_idempotent_producer_writes_each_record_once_in_order(kafka_mq):
    create_topic(kafka_mq.bootstrap, "idem", 3)
    records = [{"value": b"v%d" % i, "key": b"key-%d" % (i % 7)} for i in range(300)]
    sent = produce(kafka_mq.bootstrap, "idem", records,
                   {"enable.idempotence": True, "max.in.flight.requests.per.connection": 5,
                    "batch.num.messages": 16})
    by_partition: dict[int, list] = {}
    for msg in sent:
        by_partition.setdefault(msg.partition(), []).append(msg)
    for part, msgs in by_partition.items():
        assert [m.offset() for m in msgs] == list(range(len(msgs))), part
    got = read_partitions(kafka_mq.bootstrap, "idem", 300, (0, 1, 2))
    for part, msgs in by_partition.items():
        assert [m.value() for m in got if m.partition() == part] == values(msgs)


def test_transactional_producer_commit_and_abort(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "txn", 2)
    with producer(b, {"transactional.id": "txn-1"}) as p:
        p.init_transactions(WAIT)
        for vals, commit in (([b"c1", b"c2"], True), ([b"a1", b"a2", b"a3"], False),
                             ([b"c3", b"c4"], True)):
            p.begin_transaction()
            deliver(p, "txn", [{"value": v, "partition": i % 2} for i, v in enumerate(vals)])
            (p.commit_transaction if commit else p.abort_transaction)(WAIT)

    committed = read_partitions(b, "txn", 4, (0, 1), conf={"isolation.level": "read_committed"})
    assert sorted(values(committed)) == [b"c1", b"c2", b"c3", b"c4"]
    everything = read_partitions(b, "txn", 7, (0, 1),
                                 conf={"isolation.level": "read_uncommitted"})
    assert sorted(values(everything)) == [b"a1", b"a2", b"a3", b"c1", b"c2", b"c3", b"c4"]
    # Each transaction ends with a control batch (its marker) in each partition it wrote:
    # partition 0 holds c1, marker, a1, a3, marker, c3; partition 1 c2, marker, a2, marker, c4.
    assert sorted((m.partition(), m.offset(), m.value()) for m in committed) == [
        (0, 0, b"c1"), (0, 5, b"c3"), (1, 0, b"c2"), (1, 4, b"c4")]

def _assignments(*consumers: Consumer) -> list[set[int]]:
    return [{tp.partition for tp in c.assignment()} for c in consumers]


def _poll_until(consumers: list[Consumer], condition, message: str, got: dict) -> None:
    """Poll every consumer in turn (a classic member rebalances only inside poll) until
    ``condition()``; records read go to ``got[consumer index]``."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {message}: " \
            f"{_assignments(*consumers)}"
        for i, c in enumerate(consumers):
            msg = c.poll(0.05)
            if msg is not None:
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                got.setdefault(i, []).append(msg)


def test_classic_group_splits_partitions_and_takes_over_with_commits(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "grp", 4)
    conf = {"auto.offset.reset": "earliest"}
    first, second = consumer(b, "g", conf), consumer(b, "g", conf)
    try:
        first.subscribe(["grp"])
        second.subscribe(["grp"])
        got: dict[int, list] = {}

        def split() -> bool:
            a, s = _assignments(first, second)
            return bool(a) and bool(s) and not a & s and a | s == {0, 1, 2, 3}
        _poll_until([first, second], split, "two members splitting 4 partitions", got)
        assert got == {}
        produce(b, "grp", [{"value": b"%d-%d" % (p, i), "partition": p}
                           for i in range(5) for p in range(4)])
        _poll_until([first, second], lambda: sum(map(len, got.values())) >= 20,
                    "20 records", got)
        mine = _assignments(first, second)
        for i in (0, 1):
            assert {m.partition() for m in got.get(i, [])} <= mine[i]
        assert sorted(m.value() for msgs in got.values() for m in msgs) == sorted(
            b"%d-%d" % (p, i) for i in range(5) for p in range(4))
        for c in (first, second):
            c.commit(asynchronous=False)
        committed = first.committed([TopicPartition("grp", p) for p in range(4)], WAIT)
        assert [tp.offset for tp in committed] == [5, 5, 5, 5]

        second.close()                              # LeaveGroup: the first takes over at once
        after: dict[int, list] = {}
        _poll_until([first], lambda: _assignments(first)[0] == {0, 1, 2, 3},
                    "the first member taking over", after)
        produce(b, "grp", [{"value": b"new-%d" % p, "partition": p} for p in range(4)])
        _poll_until([first], lambda: len(after.get(0, [])) >= 4, "4 new records", after)
        # From the committed offsets: none of the second's records is read again.
        assert sorted(values(after[0])) == [b"new-0", b"new-1", b"new-2", b"new-3"]
    finally:
        first.close()
        second.close()


def test_kip848_consumer_group(kafka_mq):
    """``group.protocol=consumer``: ConsumerGroupHeartbeat, the broker assigns."""
    b = kafka_mq.bootstrap
    create_topic(b, "848", 2)
    produce(b, "848", [{"value": b"v%d" % i, "partition": i % 2} for i in range(10)])
    conf = {**LOGGER, "bootstrap.servers": b, "group.id": "g848", "group.protocol": "consumer",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "fetch.wait.max.ms": 100}
    c = Consumer(conf)
    try:
        c.subscribe(["848"])
        got = read(c, 10)
        assert sorted(values(got)) == sorted(b"v%d" % i for i in range(10))
        assert _assignments(c)[0] == {0, 1}
        c.commit(asynchronous=False)
        assert [tp.offset for tp in c.committed([TopicPartition("848", p) for p in (0, 1)],
                                                WAIT)] == [5, 5]
    finally:
        c.close()
    produce(b, "848", [{"value": b"late", "partition": 1}])
    c = Consumer(conf)
    try:
        c.subscribe(["848"])
        assert values(read(c, 1)) == [b"late"]          # resumes at the committed offsets
    finally:
        c.close()


def test_offsets_for_times(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "times", 1)
    ts0 = now_ms() - 60_000
    produce(b, "times", [{"value": b"v%d" % i, "timestamp": ts0 + 1000 * i} for i in range(10)])
    c = consumer(b)
    try:
        def lookup(ts: int) -> int:
            return offset_for_time(c, "times", ts)
        assert lookup(ts0 - 5000) == 0
        assert lookup(ts0 + 4000) == 4
        assert lookup(ts0 + 4001) == 5
        assert lookup(ts0 + 9000) == 9
        assert lookup(ts0 + 9001) == OFFSET_END         # -1: no record at or after it
        c.assign([TopicPartition("times", 0, lookup(ts0 + 6500))])
        assert [(m.offset(), m.value()) for m in read(c, 3)] == [
            (7, b"v7"), (8, b"v8"), (9, b"v9")]
    finally:
        c.close()


def test_admin_create_and_delete_topics(kafka_mq):
    client = admin(kafka_mq.bootstrap)
    futures = client.create_topics([NewTopic("alpha", 3, 1),
                                    NewTopic("beta", 1, 1, config={"retention.ms": "3600000"})],
                                   operation_timeout=WAIT)
    for f in futures.values():
        f.result(WAIT)
    topics = client.list_topics(timeout=WAIT).topics
    assert len(topics["alpha"].partitions) == 3 and len(topics["beta"].partitions) == 1

    again = client.create_topics([NewTopic("alpha", 1, 1)])["alpha"]
    with pytest.raises(KafkaException) as err:
        again.result(WAIT)
    assert err.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    for f in client.delete_topics(["alpha", "beta"], operation_timeout=WAIT).values():
        f.result(WAIT)
    wait_for(lambda: not {"alpha", "beta"} & set(client.list_topics(timeout=WAIT).topics),
             WAIT, 0.05, "deleted topics to leave Metadata")
    with pytest.raises(KafkaException) as err:
        client.delete_topics(["alpha"])["alpha"].result(WAIT)
    assert err.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def _describe(client, topic: str) -> dict[str, ConfigEntry]:
    [f] = client.describe_configs([ConfigResource("topic", topic)]).values()
    return f.result(WAIT)


def test_admin_incremental_alter_configs(kafka_mq):
    client = admin(kafka_mq.bootstrap)
    create_topic(kafka_mq.bootstrap, "conf", 1)
    resource = ConfigResource("topic", "conf", incremental_configs=[
        ConfigEntry("retention.ms", "3600000",
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact",
                    incremental_operation=AlterConfigOpType.SET)])
    [f] = client.incremental_alter_configs([resource]).values()
    f.result(WAIT)
    entries = _describe(client, "conf")
    assert entries["retention.ms"].value == "3600000"
    assert not entries["retention.ms"].is_default
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["cleanup.policy"].value == "compact"

    resource = ConfigResource("topic", "conf", incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    [f] = client.incremental_alter_configs([resource]).values()
    f.result(WAIT)
    entries = _describe(client, "conf")
    assert entries["retention.ms"].value == "604800000" and entries["retention.ms"].is_default
    assert entries["cleanup.policy"].value == "compact"         # untouched by the DELETE

    bad = ConfigResource("topic", "conf", incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    [f] = client.incremental_alter_configs([bad]).values()
    with pytest.raises(KafkaException) as err:
        f.result(WAIT)
    assert err.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_admin_create_partitions(kafka_mq):
    b = kafka_mq.bootstrap
    client = admin(b)
    create_topic(b, "grow", 1)
    [f] = client.create_partitions([NewPartitions("grow", 3)], operation_timeout=WAIT).values()
    f.result(WAIT)
    wait_for(lambda: len(client.list_topics("grow", timeout=WAIT).topics["grow"].partitions)
             == 3, WAIT, 0.05, "3 partitions in Metadata")
    sent = produce(b, "grow", [{"value": b"p2", "partition": 2}])
    assert (sent[0].partition(), sent[0].offset()) == (2, 0)
    assert values(read_partitions(b, "grow", 1, (2,))) == [b"p2"]


def test_admin_groups_list_describe_delete(kafka_mq):
    b = kafka_mq.bootstrap
    client = admin(b)
    create_topic(b, "gt", 2)
    produce(b, "gt", [{"value": b"v%d" % i, "partition": i % 2} for i in range(4)])
    c = consumer(b, "admin-g", {"auto.offset.reset": "earliest"})
    try:
        c.subscribe(["gt"])
        read(c, 4)
        c.commit(asynchronous=False)
        [desc] = [f.result(WAIT) for f in client.describe_consumer_groups(["admin-g"]).values()]
        assert desc.group_id == "admin-g" and desc.state == ConsumerGroupState.STABLE
        [member] = desc.members
        assert {tp.partition for tp in member.assignment.topic_partitions} == {0, 1}
    finally:
        c.close()

    listed = client.list_consumer_groups(request_timeout=WAIT).result(WAIT).valid
    assert [(g.group_id, g.state) for g in listed if g.group_id == "admin-g"] == [
        ("admin-g", ConsumerGroupState.EMPTY)]
    [desc] = [f.result(WAIT) for f in client.describe_consumer_groups(["admin-g"]).values()]
    assert desc.state == ConsumerGroupState.EMPTY and desc.members == []
    [offsets] = [f.result(WAIT) for f in client.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("admin-g")]).values()]
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(0, 2), (1, 2)]

    [f] = client.delete_consumer_groups(["admin-g"], request_timeout=WAIT).values()
    f.result(WAIT)
    listed = client.list_consumer_groups(request_timeout=WAIT).result(WAIT).valid
    assert "admin-g" not in [g.group_id for g in listed]


def test_admin_delete_records(kafka_mq):
    b = kafka_mq.bootstrap
    client = admin(b)
    create_topic(b, "dr", 1)
    produce(b, "dr", [{"value": b"v%d" % i} for i in range(10)])
    [f] = client.delete_records([TopicPartition("dr", 0, 6)], operation_timeout=WAIT).values()
    assert f.result(WAIT).low_watermark == 6
    c = consumer(b)
    try:
        assert c.get_watermark_offsets(TopicPartition("dr", 0), WAIT) == (6, 10)
        c.assign([TopicPartition("dr", 0, OFFSET_BEGINNING)])
        assert [(m.offset(), m.value()) for m in read(c, 4)] == [
            (i, b"v%d" % i) for i in range(6, 10)]
    finally:
        c.close()


def test_admin_describe_cluster(kafka_mq):
    client = admin(kafka_mq.bootstrap)
    cluster = client.describe_cluster(request_timeout=WAIT).result(WAIT)
    [node] = cluster.nodes
    host, port = kafka_mq.bootstrap.split(":")
    assert (node.host, node.port) == (host, int(port))
    assert cluster.controller is not None and cluster.controller.id == node.id
    assert isinstance(cluster.cluster_id, str) and cluster.cluster_id
    assert list(client.list_topics(timeout=WAIT).brokers) == [node.id]
    if kafka_mq.peer == "mq":
        assert node.id == 0                          # the default node_id
