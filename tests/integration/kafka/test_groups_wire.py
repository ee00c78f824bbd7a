"""Consumer groups over the Kafka protocol, with the real clients: librdkafka (confluent-kafka,
classic and ``group.protocol=consumer``), kafka-python 3, aiokafka, kcat ``-G``, and groups
that mix them with mq's native ``mq.Consumer``.

Every test has its own broker on ``tmp_path`` (a Kafka listener on a free loopback port) and
short session timeouts; it waits on conditions with a timeout, never on a bare sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from wire_calls import call

import mq
import mq.errors
import mq.testing
from mq.client.admin import Admin
from mq.protocol.kafka.codec import decode_data, encode_data

# kafka-python 3 loads its schemas with importlib.resources' legacy functions (Python 3.11).
pytestmark = pytest.mark.filterwarnings(
    r"ignore:(open|read)_text is deprecated:DeprecationWarning")

GROUP_HEARTBEAT_MS = 200      # the broker's KIP-848 heartbeat interval here (5 s by default)
SESSION_MS = 6_000
WAIT_S = 30


@pytest.fixture
def kbroker(tmp_path):
    """(bootstrap "127.0.0.1:PORT", the broker process) with a 4-partition topic "t4"."""
    conf = tmp_path / "mq.toml"
    conf.write_text(f'kafka_listeners = ["127.0.0.1:0"]\n'
                    f"group_heartbeat_interval_ms = {GROUP_HEARTBEAT_MS}\n")
    with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as b:
        with Admin(b.socket) as admin:
            (bootstrap,) = admin.broker_stats()["broker"]["kafka_listeners"]
            admin.create_topic("t4", 4)
        yield bootstrap, b


def _produce(bootstrap: str, n: int, topic: str = "t4") -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        p.produce(topic, f"v{i}".encode(), partition=i % 4)
    assert p.flush(10) == 0


def _classic(bootstrap: str, group: str, **extra) -> Consumer:
    conf = {"bootstrap.servers": bootstrap, "group.id": group,
            "auto.offset.reset": "earliest", "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 100, "enable.auto.commit": False}
    conf.update(extra)
    return Consumer(conf)


def _parts(consumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def _poll_until(consumers, condition, what: str, timeout: float = WAIT_S) -> None:
    """Poll every consumer (each needs its poll for its group's callbacks) until
    ``condition()``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        for c in consumers:
            msg = c.poll(0.05)
            if msg is not None and msg.error():
                raise AssertionError(msg.error())


def _split(a: set[int], b: set[int]) -> bool:
    return bool(a) and bool(b) and not a & b and a | b == {0, 1, 2, 3}


@pytest.mark.parametrize("strategy", ["range,roundrobin", "cooperative-sticky"])
def test_two_classic_consumers_split_and_the_survivor_takes_all(kbroker, strategy):
    bootstrap, _ = kbroker
    c1 = _classic(bootstrap, "g", **{"partition.assignment.strategy": strategy})
    c2 = _classic(bootstrap, "g", **{"partition.assignment.strategy": strategy})
    c1.subscribe(["t4"])
    c2.subscribe(["t4"])
    _poll_until([c1, c2], lambda: _split(_parts(c1), _parts(c2)), "a split of 4 partitions")
    c2.close()
    _poll_until([c1], lambda: _parts(c1) == {0, 1, 2, 3}, "the survivor to take all")
    c1.close()


def test_commit_and_committed_round_trip_with_metadata(kbroker):
    bootstrap, b = kbroker
    _produce(bootstrap, 8)
    c = _classic(bootstrap, "gc")
    c.subscribe(["t4"])
    _poll_until([c], lambda: _parts(c) == {0, 1, 2, 3}, "the assignment")
    offsets = [TopicPartition("t4", p, 2, f"meta-{p}") for p in range(4)]
    for tp in c.commit(offsets=offsets, asynchronous=False):
        assert tp.error is None, tp.error
    got = c.committed([TopicPartition("t4", p) for p in range(4)], timeout=10)
    assert [(tp.partition, tp.offset, tp.metadata) for tp in got] == \
        [(p, 2, f"meta-{p}") for p in range(4)]
    c.close()
    # The same offsets through mq's own view of the group. confluent-kafka sends a metadata
    # string with its C terminator (strlen + 1 bytes), and a Kafka broker stores that too.
    with Admin(b.socket) as admin:
        desc = admin.describe_group("gc")
    assert sorted((r["partition"], r["committed_offset"], r["metadata"])
                  for r in desc["offsets"]) == [(p, 2, f"meta-{p}\0") for p in range(4)]


def test_a_static_member_restarts_into_its_partitions_without_a_rebalance(kbroker):
    bootstrap, _ = kbroker
    a = _classic(bootstrap, "gs", **{"group.instance.id": "a"})
    b = _classic(bootstrap, "gs", **{"group.instance.id": "b"})
    revoked: list[set[int]] = []
    a.subscribe(["t4"], on_revoke=lambda c, tps: revoked.append({tp.partition for tp in tps}))
    b.subscribe(["t4"])
    _poll_until([a, b], lambda: _split(_parts(a), _parts(b)), "a split")
    before_a, before_b = _parts(a), _parts(b)
    revoked.clear()
    b.close()                           # a static member leaves no LeaveGroup: it stays
    b2 = _classic(bootstrap, "gs", **{"group.instance.id": "b"})
    b2.subscribe(["t4"])
    _poll_until([a, b2], lambda: _parts(b2) == before_b, "the new incarnation's partitions")
    # A was never asked to rebalance: an eager client revokes everything when it is
    for _ in range(10):
        a.poll(0.05)
    assert _parts(a) == before_a and revoked == []
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups(["gs"])["gs"].result(timeout=10)
    assert sorted(m.group_instance_id for m in desc.members) == ["a", "b"]
    a.close()
    b2.close()


def test_kafka_python_and_aiokafka_consumers_share_a_group(kbroker):
    from aiokafka import AIOKafkaConsumer
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.structs import OffsetAndMetadata

    bootstrap, _ = kbroker
    _produce(bootstrap, 40)
    kp = KafkaConsumer("t4", bootstrap_servers=bootstrap, group_id="gk",
                       auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                       heartbeat_interval_ms=100, enable_auto_commit=False)
    seen_kp: set[tuple[int, int]] = set()
    seen_aio: set[tuple[int, int]] = set()
    aio_parts: set[int] = set()
    stop = threading.Event()

    async def run_aio() -> None:
        c = AIOKafkaConsumer("t4", bootstrap_servers=bootstrap, group_id="gk",
                             auto_offset_reset="earliest", session_timeout_ms=SESSION_MS,
                             heartbeat_interval_ms=100, enable_auto_commit=False)
        await c.start()
        try:
            while not stop.is_set():
                batches = await c.getmany(timeout_ms=50)
                for records in batches.values():
                    seen_aio.update((r.partition, r.offset) for r in records)
                aio_parts.clear()
                aio_parts.update(tp.partition for tp in c.assignment())
        finally:
            await c.stop()

    thread = threading.Thread(target=asyncio.run, args=(run_aio(),))
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            for records in kp.poll(timeout_ms=50).values():
                seen_kp.update((r.partition, r.offset) for r in records)
            kp_parts = {tp.partition for tp in kp.assignment()}
            if _split(kp_parts, set(aio_parts)) and len(seen_kp | seen_aio) == 40:
                break
            assert time.monotonic() < deadline, (kp_parts, aio_parts, len(seen_kp | seen_aio))
        mine = KafkaTopicPartition("t4", min(kp_parts))
        kp.commit({mine: OffsetAndMetadata(3, "kafka-python", -1)})
        assert (kp.committed(mine, metadata=True).offset,
                kp.committed(mine, metadata=True).metadata) == (3, "kafka-python")
    finally:
        stop.set()
        thread.join(WAIT_S)
        kp.close()


def test_a_native_and_a_kafka_consumer_split_one_group(kbroker):
    bootstrap, b = kbroker
    native = mq.Consumer(group_id="gm", socket=b.socket, session_timeout_ms=SESSION_MS)
    native.subscribe(["t4"])
    kafka = _classic(bootstrap, "gm")
    kafka.subscribe(["t4"])

    def native_parts() -> set[int]:
        native.poll(timeout_ms=20)
        return {tp.partition for tp in native.assignment()}
    _poll_until([kafka], lambda: _split(native_parts(), _parts(kafka)),
                "a native and a Kafka member to split the partitions")
    kafka.close()
    _poll_until([], lambda: native_parts() == {0, 1, 2, 3}, "the native member to take all")
    native.close()


def test_kip848_consumers_over_the_kafka_protocol(kbroker):
    bootstrap, _ = kbroker
    _produce(bootstrap, 20)

    def kip848() -> Consumer:
        return Consumer({"bootstrap.servers": bootstrap, "group.id": "g848",
                         "group.protocol": "consumer", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    c1 = kip848()
    c1.subscribe(["t4"])
    _poll_until([c1], lambda: _parts(c1) == {0, 1, 2, 3}, "the first member to get all")
    c1.commit(offsets=[TopicPartition("t4", 0, 3, "m")], asynchronous=False)
    c2 = kip848()
    c2.subscribe(["t4"])
    _poll_until([c1, c2], lambda: _split(_parts(c1), _parts(c2)), "a split")
    (got,) = c2.committed([TopicPartition("t4", 0)], timeout=10)
    assert (got.offset, got.metadata) == (3, "m")
    c1.close()
    _poll_until([c2], lambda: _parts(c2) == {0, 1, 2, 3}, "the survivor to take all")
    c2.close()


def test_eager_cooperative_and_kip848_members_in_one_group(kbroker):
    bootstrap, _ = kbroker
    eager = _classic(bootstrap, "g3", **{"partition.assignment.strategy": "range"})
    cooperative = _classic(bootstrap, "g3",
                           **{"partition.assignment.strategy": "cooperative-sticky"})
    kip848 = Consumer({"bootstrap.servers": bootstrap, "group.id": "g3",
                       "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    members = [eager, cooperative, kip848]
    for c in members:
        c.subscribe(["t4"])

    def covered(cs) -> bool:
        owned = [_parts(c) for c in cs]
        return all(owned) and sorted(p for ps in owned for p in ps) == [0, 1, 2, 3]
    _poll_until(members, lambda: covered(members), "three members to share 4 partitions")
    eager.close()
    _poll_until(members[1:], lambda: covered(members[1:]), "two to share them")
    kip848.close()
    _poll_until([cooperative], lambda: covered([cooperative]), "the last to take all")
    cooperative.close()


def test_group_admin_lists_describes_and_deletes(kbroker):
    bootstrap, _ = kbroker
    c = _classic(bootstrap, "ga", **{"client.id": "admin-test"})
    c.subscribe(["t4"])
    _poll_until([c], lambda: _parts(c) == {0, 1, 2, 3}, "the assignment")
    c.commit(offsets=[TopicPartition("t4", 1, 5)], asynchronous=False)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_consumer_groups().result(timeout=10)
    assert "ga" in {g.group_id for g in listed.valid}
    desc = admin.describe_consumer_groups(["ga"])["ga"].result(timeout=10)
    (member,) = desc.members
    assert member.client_id == "admin-test"
    assert sorted(tp.partition for tp in member.assignment.topic_partitions) == [0, 1, 2, 3]
    # DescribeGroups, the classic api (kafka-python's admin and older tools use it)
    (group,) = call(bootstrap, 15, 5, {"groups": ["ga"],
                                       "include_authorized_operations": False})["groups"]
    (member,) = group["members"]
    _, assignment = decode_data("ConsumerProtocolAssignment", member["member_assignment"])
    assert (group["error_code"], group["group_state"], group["protocol_type"],
            group["protocol_data"], member["client_id"]) == \
        (0, "Stable", "consumer", "range", "admin-test")
    assert assignment["assigned_partitions"] == [{"topic": "t4", "partitions": [0, 1, 2, 3]}]
    # OffsetDelete: refused for a topic a member subscribes to, done once it left
    delete = {"group_id": "ga", "topics": [{"name": "t4", "partitions": [
        {"partition_index": 1}]}]}
    (row,) = call(bootstrap, 47, 0, delete)["topics"][0]["partitions"]
    assert row["error_code"] == 86                          # GROUP_SUBSCRIBED_TO_TOPIC
    c.close()
    (row,) = call(bootstrap, 47, 0, delete)["topics"][0]["partitions"]
    assert row["error_code"] == 0
    (got,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
        "ga", [TopicPartition("t4", 1)])])["ga"].result(timeout=10).topic_partitions
    assert got.offset == -1001                               # none committed
    assert call(bootstrap, 47, 0, {**delete, "group_id": "nope"})["error_code"] == 69
    deleted = admin.delete_consumer_groups(["ga", "nope"])
    deleted["ga"].result(timeout=10)
    with pytest.raises(Exception, match="GROUP_ID_NOT_FOUND"):
        deleted["nope"].result(timeout=10)


def _kcat_member(bootstrap: str, group: str) -> subprocess.Popen:
    return subprocess.Popen(
        ["kcat", "-b", bootstrap, "-G", group, "-f", "%p %o\\n", "-q", "-u",
         "-X", f"session.timeout.ms={SESSION_MS}", "-X", "heartbeat.interval.ms=100",
         "-X", "auto.offset.reset=earliest", "t4"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _reader(proc: subprocess.Popen, into: list) -> threading.Thread:
    def read() -> None:
        for line in proc.stdout:
            into.append(tuple(map(int, line.split())))
    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def test_kcat_group_members_split_and_rebalance_when_one_exits(kbroker):
    bootstrap, b = kbroker
    one, two = _kcat_member(bootstrap, "gk"), _kcat_member(bootstrap, "gk")
    out1: list[tuple[int, int]] = []
    out2: list[tuple[int, int]] = []
    with contextlib.ExitStack() as stack:
        for proc in (one, two):
            stack.callback(proc.stdout.close)
            stack.callback(proc.wait, 10)
            stack.callback(lambda p=proc: p.poll() is None and p.kill())
        _reader(one, out1)
        _reader(two, out2)

        def split() -> bool:
            with Admin(b.socket) as admin:
                try:
                    members = admin.describe_group("gk")["members"]
                except mq.errors.GroupIdNotFoundError:      # nobody joined yet
                    return False
            owned = [{p for _, p in m["assignment"]} for m in members]
            return len(owned) == 2 and _split(*owned)
        mq.testing.wait_for(split, WAIT_S, 0.05, "two kcat members to split the partitions")
        _produce(bootstrap, 40)             # offsets 0-9 of each partition
        first = {(p, o) for p in range(4) for o in range(10)}
        mq.testing.wait_for(lambda: first <= set(out1) | set(out2), WAIT_S, 0.05,
                            "the 40 records between the two")
        parts1, parts2 = {p for p, _ in out1}, {p for p, _ in out2}
        assert parts1 and parts2 and not parts1 & parts2, (parts1, parts2)
        two.send_signal(signal.SIGTERM)          # kcat leaves the group on SIGTERM
        two.wait(WAIT_S)
        _produce(bootstrap, 40)             # offsets 10-19: all for the remaining member
        second = {(p, o) for p in range(4) for o in range(10, 20)}
        mq.testing.wait_for(lambda: second <= set(out1), WAIT_S, 0.05,
                            "the remaining member to read all 40 new records")
        one.send_signal(signal.SIGTERM)


def test_describe_group_over_the_kafka_protocol_shows_native_members(kbroker):
    bootstrap, b = kbroker
    native = mq.Consumer(group_id="gd", socket=b.socket, session_timeout_ms=SESSION_MS)
    native.subscribe(["t4"])
    mq.testing.wait_for(lambda: native.poll(timeout_ms=20) is not None and
                        len(native.assignment()) == 4, WAIT_S, 0, "the native assignment")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups(["gd"])["gd"].result(timeout=10)
    (member,) = desc.members
    assert sorted(tp.partition for tp in member.assignment.topic_partitions) == [0, 1, 2, 3]
    native.close()


def _members(b, group: str) -> list[str]:
    with Admin(b.socket) as admin:
        return [m["member_id"] for m in admin.describe_group(group)["members"]]


def test_a_classic_member_outlives_its_connection_until_its_session_times_out(kbroker):
    bootstrap, b = kbroker
    metadata = encode_data("ConsumerProtocolSubscription", 0, {"topics": ["t4"],
                                                               "user_data": None})
    joined = call(bootstrap, 11, 3, {
        "group_id": "gl", "session_timeout_ms": 1_000, "rebalance_timeout_ms": 5_000,
        "member_id": "", "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": metadata}]})
    assert joined["error_code"] == 0
    member, generation = joined["member_id"], joined["generation_id"]
    # its connection closed, yet it heartbeats from a new one: still a member
    beat = call(bootstrap, 12, 3, {"group_id": "gl", "generation_id": generation,
                                    "member_id": member, "group_instance_id": None})
    assert beat["error_code"] == 0 and _members(b, "gl") == [member]
    mq.testing.wait_for(lambda: _members(b, "gl") == [], WAIT_S, 0.05,
                        "the silent member's session to time out")


def test_a_kip848_member_outlives_its_connection(kbroker):
    bootstrap, b = kbroker
    joined = call(bootstrap, 68, 0, {
        "group_id": "gl8", "member_id": "", "member_epoch": 0, "instance_id": None,
        "rack_id": None, "rebalance_timeout_ms": 5_000, "subscribed_topic_names": ["t4"],
        "server_assignor": None, "topic_partitions": []})
    assert joined["error_code"] == 0 and len(joined["assignment"]["topic_partitions"]) == 1
    member, epoch = joined["member_id"], joined["member_epoch"]
    again = call(bootstrap, 68, 0, {
        "group_id": "gl8", "member_id": member, "member_epoch": epoch, "instance_id": None,
        "rack_id": None, "rebalance_timeout_ms": -1, "subscribed_topic_names": None,
        "server_assignor": None, "topic_partitions": None})
    assert again["error_code"] == 0 and again["member_epoch"] == epoch
    assert again["assignment"] is None                  # unchanged: not sent again
    assert _members(b, "gl8") == [member]
