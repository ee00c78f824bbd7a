"""mq.Producer, mq.Consumer and mq.Admin with ``bootstrap_servers=``: the same API and
behaviour on mq's Kafka listener and on a real Kafka cluster (``conftest.backend``)."""

from __future__ import annotations

import threading
import time

import pytest

import mq
from mq import TopicPartition
from mq.client.partitioner import murmur2
from mq.errors import (
    BrokerUnavailableError,
    ClosedError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedOperationError,
)

WAIT_S = 30.0


def topic(backend, partitions: int = 1, config: dict | None = None) -> str:
    name = backend.name("t")
    with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
        admin.create_topic(name, partitions, config)
    return name


def read(consumer, count: int, timeout: float = WAIT_S) -> list:
    """``count`` records from ``consumer`` (fewer only if ``timeout`` ran out)."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        for records in consumer.poll(200, max_records=count - len(out)).values():
            out.extend(records)
    return out


def test_records_round_trip_with_keys_headers_and_timestamps(backend):
    name = topic(backend, 3)
    with mq.Producer(bootstrap_servers=backend.bootstrap, linger_ms=1) as p:
        futures = [p.send(name, b"v%d" % i, key=b"k%d" % (i % 7), headers=[("h", b"%d" % i)],
                          timestamp_ms=1_700_000_000_000 + i) for i in range(60)]
        p.flush()
        metadata = [f.get(WAIT_S) for f in futures]
    # keys go where murmur2 puts them, as on the local broker and in Kafka's Java client
    for i, md in enumerate(metadata):
        key = b"k%d" % (i % 7)
        assert md.partition == (murmur2(key) & 0x7FFFFFFF) % 3
        assert md.timestamp_ms == 1_700_000_000_000 + i and md.offset >= 0
    with mq.Consumer(name, bootstrap_servers=backend.bootstrap) as c:
        records = read(c, 60)
    assert sorted(r.value for r in records) == sorted(b"v%d" % i for i in range(60))
    by_value = {r.value: r for r in records}
    r = by_value[b"v5"]
    assert (r.key, r.headers, r.timestamp_ms, r.timestamp_type) == \
        (b"k5", [("h", b"5")], 1_700_000_000_005, 0)
    md = metadata[5]
    assert (r.topic, r.partition, r.offset) == (md.topic, md.partition, md.offset)


def test_futures_callbacks_and_serializers(backend):
    name = topic(backend)
    done = threading.Event()
    seen: list = []
    with mq.Producer(bootstrap_servers=backend.bootstrap,
                     value_serializer=lambda v: v.encode(),
                     key_serializer=lambda k: k.encode()) as p:
        fut = p.send(name, "hello", key="k").add_callback(seen.append)
        fut.add_callback(lambda md: done.set())
        assert done.wait(WAIT_S)
        assert fut.is_done and fut.succeeded() and not fut.failed() and fut.exception() is None
        assert seen == [fut.get()] and seen[0].topic == name
        many = p.send_many(name, ["a", "b", "c"])
        p.flush()
        assert [f.get().offset for f in many] == [1, 2, 3]
    with mq.Consumer(name, bootstrap_servers=backend.bootstrap,
                     value_deserializer=bytes.decode) as c:
        assert [r.value for r in read(c, 4)] == ["hello", "a", "b", "c"]


def test_mistakes_raise_at_once(backend):
    name = topic(backend, 2)
    with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
        with pytest.raises(UnknownTopicOrPartitionError):
            p.send(name, b"x", partition=2)
        with pytest.raises(TypeError):
            p.send(name, "not bytes")
        assert p.partitions_for(name) == {0, 1}
    with pytest.raises(ClosedError):
        p.send(name, b"x")
    with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topic(name, 1)
        with pytest.raises(UnsupportedOperationError if backend.kind == "kafka" else KeyError):
            if backend.kind == "kafka":
                admin.broker_stats()
            else:
                raise KeyError("mq's listener answers broker_stats only on its socket")
    with pytest.raises(UnknownTopicOrPartitionError):
        mq.Consumer(backend.name("missing"), bootstrap_servers=backend.bootstrap)


def test_an_unreachable_cluster_is_broker_unavailable():
    with mq.Producer(bootstrap_servers="127.0.0.1:1", max_block_ms=1000) as p:
        with pytest.raises(BrokerUnavailableError):
            p.send("t", b"x")
    with pytest.raises(ValueError):
        mq.Producer(socket="/tmp/x.sock", bootstrap_servers="127.0.0.1:1")


def test_the_environment_picks_the_cluster_and_an_explicit_socket_wins(backend, monkeypatch,
                                                                       tmp_path):
    name = topic(backend)
    monkeypatch.setenv("MQ_BOOTSTRAP_SERVERS", backend.bootstrap)
    with mq.Producer() as p:
        assert type(p).__name__ == "KafkaProducer"
        p.send(name, b"via env").get(WAIT_S)
    with pytest.raises(BrokerUnavailableError):
        mq.Producer(socket=str(tmp_path / "none.sock"))


def test_positions_seeks_and_offsets(backend):
    name = topic(backend)
    tp = TopicPartition(name, 0)
    with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
        for i in range(10):
            p.send(name, b"%d" % i, timestamp_ms=1_000_000 + i * 10)
        p.flush()
    with mq.Consumer(name, bootstrap_servers=backend.bootstrap, max_poll_records=3) as c:
        assert c.position(tp) == 0
        assert c.beginning_offsets([tp]) == {tp: 0} and c.end_offsets([tp]) == {tp: 10}
        assert c.offsets_for_times({tp: 1_000_045}) == {tp: (5, 1_000_050)}
        assert c.offsets_for_times({tp: 9_999_999}) == {tp: None}
        first = read(c, 3)
        assert [r.offset for r in first] == [0, 1, 2] and c.position(tp) == 3
        c.seek(tp, 7)
        assert [r.offset for r in read(c, 3)] == [7, 8, 9]
        c.seek_to_beginning()
        assert read(c, 1)[0].offset == 0
        c.pause(tp)
        assert c.paused() == {tp} and c.poll(300) == {}
        c.resume(tp)
        assert read(c, 1)[0].offset == 1
        c.seek_to_end(tp)
        assert c.position(tp) == 10


def test_a_group_shares_partitions_and_commits(backend):
    name = topic(backend, 4)
    group = backend.name("g")
    events: list = []

    class Listener(mq.ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned):
            events.append(assigned)

    a = mq.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap,
                    listener=Listener(), enable_auto_commit=False)
    b = mq.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap,
                    enable_auto_commit=False)
    try:
        def shared() -> bool:
            a.poll(50)
            b.poll(50)
            return len(a.assignment()) == len(b.assignment()) == 2
        mq.testing.wait_for(shared, timeout=WAIT_S, message="the partitions to be shared")
        assert not a.assignment() & b.assignment() and events
        with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
            for i in range(200):
                p.send(name, b"%d" % i, key=b"%d" % i)
            p.flush()
        got: list = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < 200 and time.monotonic() < deadline:
            for c in (a, b):
                for records in c.poll(100).values():
                    got.extend(records)
        assert sorted(int(r.value) for r in got) == list(range(200))
        a.commit()
        b.commit()
        for tp in a.assignment():
            assert a.committed(tp) == a.position(tp)
    finally:
        a.close()
        b.close()
    with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
        offsets = admin.list_group_offsets(group)
        assert sum(offsets.values()) == 200
        admin.alter_group_offsets(group, {TopicPartition(name, 0): 0})
        assert admin.list_group_offsets(group)[TopicPartition(name, 0)] == 0


def test_a_paused_partition_taken_away_comes_back_unpaused(backend):
    """A partition paused, revoked by a rebalance and given back to the same consumer is
    read again, as with the local consumer and Kafka's Java client. librdkafka kept it
    paused, and a pool child that drops a revoked partition's records (and so never resumes
    it) stalled on it for good."""
    name = topic(backend, 2)
    group = backend.name("g")
    with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
        for i in range(20):
            p.send(name, b"%d" % i, partition=i % 2)
        p.flush()
    revoked: list = []

    class Listener(mq.ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions):
            revoked.append(partitions)

    options = dict(group_id=group, bootstrap_servers=backend.bootstrap, enable_auto_commit=False)
    a = mq.Consumer(name, listener=Listener(), **options)

    def a_has(count: int) -> bool:
        a.poll(50)
        return len(a.assignment()) == count
    try:
        mq.testing.wait_for(lambda: a_has(2), timeout=WAIT_S, message="both partitions")
        a.pause(*a.assignment())
        b = mq.Consumer(name, **options)        # joins: every partition is revoked
        try:
            def shared() -> bool:
                a.poll(50)
                b.poll(50)
                return len(a.assignment()) == len(b.assignment()) == 1
            mq.testing.wait_for(shared, timeout=WAIT_S, message="the partitions to be shared")
        finally:
            b.close()                           # leaves: both partitions come back to a
        mq.testing.wait_for(lambda: a_has(2), timeout=WAIT_S, message="both partitions back")
        assert len(revoked) >= 2 and a.paused() == set()
        assert sorted(int(r.value) for r in read(a, 20)) == list(range(20))
    finally:
        a.close()


def test_auto_commit_commits_only_what_was_handed_out(backend):
    name = topic(backend)
    group = backend.name("g")
    with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
        for i in range(10):
            p.send(name, b"%d" % i)
        p.flush()
    with mq.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap,
                     max_poll_records=4, auto_commit_interval_ms=100) as c:
        assert len(read(c, 4)) == 4           # handed out: committed when c closes
    with mq.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap) as c:
        assert [r.offset for r in read(c, 6)] == [4, 5, 6, 7, 8, 9]


def test_transactions_and_read_committed(backend):
    name = topic(backend)
    source = topic(backend)
    group = backend.name("g")
    with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
        p.send(source, b"in").get(WAIT_S)
    with mq.Consumer(source, group_id=group, bootstrap_servers=backend.bootstrap,
                     enable_auto_commit=False) as c, \
            mq.Producer(bootstrap_servers=backend.bootstrap,
                        transactional_id=backend.name("tx")) as p:
        [record] = read(c, 1)
        p.init_transactions()
        p.begin_transaction()
        p.send(name, b"aborted")
        p.flush()                    # in the log, then aborted (not purged before it left)
        p.abort_transaction()
        p.begin_transaction()
        p.send(name, b"committed")
        p.send_offsets_to_transaction({TopicPartition(source, 0): record.offset + 1},
                                      c.group_metadata())
        p.commit_transaction()
        # Kafka makes the offsets the group's as the commit markers land, just after
        mq.testing.wait_for(lambda: c.committed(TopicPartition(source, 0)) == 1,
                            timeout=WAIT_S, message="the transaction's offsets")
    with mq.Consumer(name, bootstrap_servers=backend.bootstrap,
                     isolation_level="read_committed") as c:
        assert [r.value for r in read(c, 1)] == [b"committed"]
        assert c.poll(500) == {}
    with mq.Consumer(name, bootstrap_servers=backend.bootstrap) as c:
        assert [r.value for r in read(c, 2)] == [b"aborted", b"committed"]


def test_admin_topics_and_groups(backend):
    name = backend.name("t")
    with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
        admin.create_topic(name, 2, {"retention.ms": "3600000"})
        assert name in admin.list_topics()
        described = admin.describe_topic(name)
        assert described["partitions"] == 2
        assert described["overrides"]["retention.ms"] == "3600000"
        admin.create_partitions(name, 3)
        assert admin.describe_topic(name)["partitions"] == 3
        assert admin.alter_config(name, {"retention.ms": "7200000"})["retention.ms"] == \
            "7200000"
        with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
            for _ in range(5):
                p.send(name, b"x", partition=0)
            p.flush()
        assert admin.delete_records(name, 0, 3) == 3
        assert admin.describe_topic(name)["offsets"][0] == (3, 5)
        admin.delete_topic(name)
        mq.testing.wait_for(lambda: name not in admin.list_topics(), timeout=WAIT_S,
                            message="the topic to go")


def test_no_position_with_auto_offset_reset_none_raises(backend):
    name = topic(backend)
    with mq.Consumer(name, group_id=backend.name("g"), bootstrap_servers=backend.bootstrap,
                     auto_offset_reset="none") as c:
        with pytest.raises(mq.NoOffsetForPartitionError):
            mq.testing.wait_for(lambda: c.poll(100) and False, timeout=WAIT_S,
                                message="the reset error")


def test_a_producer_used_in_a_forked_child_gets_its_own_connection(backend):
    import os
    name = topic(backend)
    with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
        p.send(name, b"parent").get(WAIT_S)
        pid = os.fork()
        if pid == 0:                                     # the child: exit 0 only if delivered
            ok = False
            try:
                ok = p.send(name, b"child").get(WAIT_S).offset == 1
                p.close()
            finally:
                os._exit(0 if ok else 1)
        assert os.waitpid(pid, 0)[1] == 0
        assert p.send(name, b"parent again").get(WAIT_S).offset == 2


def test_a_forked_child_may_drop_the_parents_clients(backend):
    """A child forked while the parent holds a producer, an admin and a consumer may let
    them go: their librdkafka threads are the parent's, never joined in the child, and the
    parent's clients go on."""
    import gc
    import os
    name = topic(backend)
    clients = [mq.Producer(bootstrap_servers=backend.bootstrap),
               mq.Admin(bootstrap_servers=backend.bootstrap),
               mq.Consumer(name, group_id=backend.name("g"), bootstrap_servers=backend.bootstrap,
                           auto_offset_reset="earliest")]
    try:
        p, admin, c = clients
        p.send(name, b"before").get(WAIT_S)
        assert c.end_offsets([TopicPartition(name, 0)]) == {TopicPartition(name, 0): 1}
        del p, admin, c
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                clients.clear()                          # the last references: destroyed
                gc.collect()
                code = 0
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 0
        p, admin, c = clients
        assert name in admin.list_topics()
        assert p.send(name, b"after").get(WAIT_S).offset == 1
        assert [r.value for r in read(c, 2)] == [b"before", b"after"]
    finally:
        for client in clients:
            client.close()


def test_commit_async_calls_back_inside_a_later_poll(backend):
    name = topic(backend)
    with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
        p.send(name, b"x").get(WAIT_S)
    reports: list = []
    with mq.Consumer(name, group_id=backend.name("g"), bootstrap_servers=backend.bootstrap,
                     enable_auto_commit=False) as c:
        assert len(read(c, 1)) == 1
        c.commit_async(callback=lambda offsets, error: reports.append((offsets, error)))
        mq.testing.wait_for(lambda: c.poll(50) == {} and reports, timeout=WAIT_S,
                            message="the commit's callback")
        assert reports == [({TopicPartition(name, 0): 1}, None)]
        assert c.committed(TopicPartition(name, 0)) == 1


def test_an_explicit_commit_survives_close_with_auto_commit(backend):
    name = topic(backend)
    group = backend.name("g")
    with mq.Producer(bootstrap_servers=backend.bootstrap) as p:
        for i in range(5):
            p.send(name, b"%d" % i)
        p.flush()
    with mq.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap) as c:
        read(c, 1)
        read(c, 1)
        c.commit()
        tp = TopicPartition(name, 0)
        assert c.committed(tp) == 2
    with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
        assert admin.list_group_offsets(group) == {tp: 2}


def test_a_read_committed_position_passes_the_transactions_marker(backend):
    name = topic(backend)
    tp = TopicPartition(name, 0)
    with mq.Producer(bootstrap_servers=backend.bootstrap,
                     transactional_id=backend.name("tx")) as p:
        p.init_transactions()
        p.begin_transaction()
        for i in range(3):
            p.send(name, b"%d" % i)
        p.commit_transaction()
    with mq.Consumer(name, group_id=backend.name("g"), bootstrap_servers=backend.bootstrap,
                     isolation_level="read_committed") as c:
        assert len(read(c, 3)) == 3
        end = c.end_offsets([tp])[tp]
        assert end == 4                          # three records and the commit marker
        mq.testing.wait_for(lambda: c.poll(50) == {} and c.position(tp) == end,
                            timeout=WAIT_S, message="the position past the marker")
        meta = c.group_metadata()
        assert meta.member_id and meta.member_epoch >= 0


def test_users_and_topic_ids(backend):
    with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
        if backend.kind == "kafka":          # mq's listener takes users from a SASL login only
            user = backend.name("user")
            admin.add_user(user, "secret")

            def mechanisms() -> list:        # each node learns them in its own time
                return sorted(m for m, _ in
                              admin.describe_user_scram_credentials([user]).get(user, []))
            mq.testing.wait_for(lambda: mechanisms() == ["SCRAM-SHA-256", "SCRAM-SHA-512"],
                                timeout=WAIT_S, message="both credentials")
            admin.delete_user(user)
        name = topic(backend)
        topic_id = admin.describe_topic(name)["id"]
        assert len(topic_id) == 32 and int(topic_id, 16) >= 0
