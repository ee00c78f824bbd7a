"""Consumer groups against a real broker subprocess: assignment shapes, incremental rebalances,
commits and fencing, pattern subscriptions, static membership, session and poll timeouts,
offset expiry, broker restarts and listener errors.

Most members live in the test process: each ``Consumer`` of a group has its own heartbeat thread
and connection, so several of them are separate members to the broker. A member that must hang
(SIGSTOP) is a child process (``group_workers.py``). Nothing sleeps to wait: ``pump`` polls the
members (a poll blocks on the consumer's semaphore) until a condition holds or a timeout passes.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import threading
import time
import warnings

import pytest
from brokers import broker_with, create_topic
from group_workers import read_events, reap, spawn_worker, stop_worker, wait_ready

import mq.testing
from mq.broker.offsets import OFFSETS_TOPIC, CommittedOffset, OffsetStore
from mq.client.admin import Admin
from mq.client.connection import Connection
from mq.client.consumer import Consumer
from mq.client.membership import ConsumerRebalanceListener
from mq.client.producer import Producer
from mq.client.types import TopicPartition
from mq.errors import (BrokerUnavailableError, FencedMemberEpochError, GroupIdNotFoundError,
                       NonEmptyGroupError, StaleMemberEpochError, UnknownMemberIdError,
                       UnknownTopicOrPartitionError)
from mq.log.manager import LogManager
from mq.protocol.messages import Api

TIMEOUT = 20.0          # generous: CI runs this on 2 loaded cores; a pass takes milliseconds

def tps(topic: str, *partitions: int) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, p) for p in partitions)


T4 = tps("t", 0, 1, 2, 3)


# --- brokers, members, records ------------------------------------------------------------------

@pytest.fixture
def broker(broker):
    """The conftest broker with topic ``t`` of 4 partitions."""
    create_topic(broker, "t", 4)
    return broker


# A broker whose members heartbeat every 100 ms and may use short session timeouts.
FAST = {"group_heartbeat_interval_ms": 100, "group_min_session_timeout_ms": 100}


@pytest.fixture
def fast_broker(tmp_path):
    with broker_with(tmp_path, **FAST) as b:
        create_topic(b, "t", 4)
        yield b


class Recorder(ConsumerRebalanceListener):
    """Records every callback: ``events`` is [(kind, frozenset of partitions)]."""

    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[TopicPartition]]] = []

    def on_partitions_assigned(self, assigned):
        self.events.append(("assigned", frozenset(assigned)))

    def on_partitions_revoked(self, revoked):
        self.events.append(("revoked", frozenset(revoked)))

    def on_partitions_lost(self, lost):
        self.events.append(("lost", frozenset(lost)))

    def all(self, kind: str) -> frozenset[TopicPartition]:
        return frozenset().union(*(s for k, s in self.events if k == kind))

    def clear(self) -> None:
        self.events.clear()


class Members(contextlib.ExitStack):
    """Consumers of one test, closed (leaving their groups) before the broker stops."""

    def __init__(self, socket: str) -> None:
        super().__init__()
        self.socket = socket
        self.records: dict[Consumer, list[tuple[int, int, str]]] = {}

    def new(self, *topics: str, group_id: str = "g", **kwargs) -> Consumer:
        c = Consumer(*topics, group_id=group_id, socket=self.socket, **kwargs)
        self.callback(c.close)
        self.records[c] = []
        return c

    def pump(self, *consumers: Consumer, until, timeout: float = TIMEOUT,
             message: str = "the group to settle") -> None:
        """Poll ``consumers`` in turn (keeping what they return) until ``until()`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            for c in consumers:
                for tp, records in c.poll(timeout_ms=10).items():
                    self.records[c] += [(tp.partition, r.offset, bytes(r.value).decode())
                                        for r in records]
            if until():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {message}; "
                                   f"assignments: {[sorted(c.assignment()) for c in consumers]}")


def produce(socket: str, counts: dict[TopicPartition, int], tag: str = "") -> list[str]:
    """``counts[tp]`` records to each partition, acknowledged; returns their values."""
    values = []
    with Producer(socket=socket, acks="all", linger_ms=0) as p:
        for tp, n in counts.items():
            for i in range(n):
                value = f"{tp.topic}-{tp.partition}-{tag}{i}"
                p.send(tp.topic, value=value.encode(), partition=tp.partition)
                values.append(value)
        p.flush(TIMEOUT)
    return values


def describe(socket: str, group: str = "g") -> dict:
    with Admin(socket) as admin:
        return admin.describe_group(group)


def offsets(socket: str, group: str = "g") -> dict[TopicPartition, int]:
    with Admin(socket) as admin:
        return admin.list_group_offsets(group)


def settled(socket: str, consumers, partitions, group: str = "g", others: int = 0) -> bool:
    """The broker says Stable, every partition is assigned to exactly one member, each consumer
    owns exactly what the broker assigned it, and ``others`` more members (processes) exist."""
    try:
        d = describe(socket, group)
    except GroupIdNotFoundError:           # no member's first heartbeat arrived yet
        return False
    assigned = [frozenset(TopicPartition(t, p) for t, p in m["assignment"])
                for m in d["members"]]
    return (d["state"] == "Stable" and len(d["members"]) == len(consumers) + others
            and sum(map(len, assigned)) == len(partitions)
            and frozenset().union(*assigned) == frozenset(partitions)
            and all(frozenset(c.assignment()) in assigned and c.assignment()
                    for c in consumers))


def member_of(socket: str, consumer: Consumer, group: str = "g") -> dict:
    """The broker's description of the member whose assignment is ``consumer``'s."""
    mine = sorted([tp.topic, tp.partition] for tp in consumer.assignment())
    found = [m for m in describe(socket, group)["members"] if m["assignment"] == mine]
    assert len(found) == 1, f"no single member owns {mine}"
    return found[0]


# --- assignment ---------------------------------------------------------------------------------

def test_one_member_gets_every_partition_and_every_record(broker):
    values = produce(broker.socket, {tp: 10 for tp in T4})
    with Members(broker.socket) as m:
        c = m.new("t")
        m.pump(c, until=lambda: len(m.records[c]) >= 40)
        assert c.assignment() == T4
        assert sorted(v for _, _, v in m.records[c]) == sorted(values)
        assert settled(broker.socket, [c], T4)


@pytest.mark.parametrize("assignor,topics,first,second", [
    ("range", {"t": 4}, tps("t", 0, 1), tps("t", 2, 3)),
    ("roundrobin", {"t": 4}, tps("t", 0, 2), tps("t", 1, 3)),
    # Two topics of 3: range splits each topic on its own, round-robin deals them all.
    ("range", {"a": 3, "b": 3}, tps("a", 0, 1) | tps("b", 0, 1), tps("a", 2) | tps("b", 2)),
    ("roundrobin", {"a": 3, "b": 3}, tps("a", 0, 2) | tps("b", 1), tps("a", 1) | tps("b", 0, 2)),
])
def test_two_members_split_by_assignor(broker, assignor, topics, first, second):
    with Admin(broker.socket) as admin:
        for name, count in topics.items():
            if name != "t":
                admin.create_topic(name, count)
    with Members(broker.socket) as m:
        c1 = m.new(*topics, assignor=assignor)
        c2 = m.new(*topics, assignor=assignor)
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], first | second))
        d = describe(broker.socket)
        assert d["assignor"] == assignor
        # Members are ordered by member id (both are dynamic): the first gets the first share.
        shares = [frozenset(TopicPartition(t, p) for t, p in mem["assignment"])
                  for mem in sorted(d["members"], key=lambda mem: mem["member_id"])]
        assert shares == [first, second]
        assert {frozenset(c1.assignment()), frozenset(c2.assignment())} == {first, second}


def test_sticky_second_member_takes_half_and_the_first_keeps_the_rest(broker):
    with Members(broker.socket) as m:
        r1, r2 = Recorder(), Recorder()
        c1 = m.new("t", listener=r1)
        m.pump(c1, until=lambda: settled(broker.socket, [c1], T4))
        c2 = m.new("t", listener=r2)
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], T4))
        assert describe(broker.socket)["assignor"] == "sticky"
        assert len(c1.assignment()) == len(c2.assignment()) == 2
        assert r1.events == [("assigned", T4), ("revoked", frozenset(c2.assignment()))]
        assert r2.events == [("assigned", frozenset(c2.assignment()))]


def test_groups_read_the_same_topic_independently(broker):
    with Members(broker.socket) as m:
        groups = {"g0": [m.new("t", group_id="g0"), m.new("t", group_id="g0")],
                  "g1": [m.new("t", group_id="g1")],
                  "g2": [m.new("t", group_id="g2")]}
        everyone = [c for cs in groups.values() for c in cs]
        m.pump(*everyone, until=lambda: all(settled(broker.socket, cs, T4, group=g)
                                            for g, cs in groups.items()))
        values = produce(broker.socket, {tp: 25 for tp in T4})

        def seen(g):
            return sorted(v for c in groups[g] for _, _, v in m.records[c])
        m.pump(*everyone, until=lambda: all(len(seen(g)) >= len(values) for g in groups),
               message="every group to see every record")
        for g in groups:
            assert seen(g) == sorted(values), f"group {g} did not see each record once"
        with Admin(broker.socket) as admin:
            assert {row["group"] for row in admin.list_groups()} >= set(groups)


def test_incremental_rebalance_never_revokes_kept_partitions(broker):
    """While one member is slow to revoke, members that keep their partitions consume on, and
    the new member consumes what it was granted; each record is consumed exactly once."""
    with Admin(broker.socket) as admin:
        admin.create_topic("six", 6)
    six = tps("six", *range(6))
    with Members(broker.socket) as m:
        r1, r2, r3 = Recorder(), Recorder(), Recorder()
        c1 = m.new("six", listener=r1)
        values = produce(broker.socket, {tp: 10 for tp in six}, "a")
        m.pump(c1, until=lambda: settled(broker.socket, [c1], six))
        c2 = m.new("six", listener=r2)
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], six))
        kept1, kept2 = frozenset(c1.assignment()), frozenset(c2.assignment())
        assert len(kept1) == len(kept2) == 3
        r1.clear()
        r2.clear()

        c3 = m.new("six", listener=r3)
        # c1 does not poll, so it cannot revoke; c2 revokes one partition, which c3 gets.
        m.pump(c2, c3, until=lambda: len(c2.assignment()) == 2 and len(c3.assignment()) == 1,
               message="c2 to hand one partition to c3")
        assert describe(broker.socket)["state"] == "Reconciling"
        assert c3.assignment() <= kept2 and len(c1.assignment()) == 3
        # The rebalance is still going on; c2 and c3 consume what they hold.
        values += produce(broker.socket, {tp: 5 for tp in six}, "b")
        new_tags = {f"six-{tp.partition}-b4" for tp in c2.assignment() | c3.assignment()}
        m.pump(c2, c3, until=lambda: new_tags <= {v for c in (c2, c3)
                                                  for _, _, v in m.records[c]},
               message="c2 and c3 to consume during the rebalance")
        assert len(c3.assignment()) == 1, "a partition was granted before c1 revoked it"

        m.pump(c1, c2, c3, until=lambda: settled(broker.socket, [c1, c2, c3], six))
        assert [len(c.assignment()) for c in (c1, c2, c3)] == [2, 2, 2]
        values += produce(broker.socket, {tp: 5 for tp in six}, "c")
        m.pump(c1, c2, c3, until=lambda: sum(len(r) for r in m.records.values()) >= len(values),
               message="every record to be consumed")

        assert r1.all("revoked") == kept1 - c1.assignment()
        assert r2.all("revoked") == kept2 - c2.assignment()
        assert not (r1.all("lost") | r2.all("lost") | r3.all("lost") | r3.all("revoked"))
        assert r3.all("assigned") == c3.assignment()
        consumed = sorted(v for r in m.records.values() for _, _, v in r)
        assert consumed == sorted(values), "a record was lost or consumed twice in the handoff"


# --- commits ------------------------------------------------------------------------------------

def test_commit_and_committed(broker):
    produce(broker.socket, {tp: 10 for tp in T4})
    t0, t1, t2, t3 = sorted(T4)
    with Members(broker.socket) as m:
        c = m.new("t", enable_auto_commit=False)
        m.pump(c, until=lambda: c.assignment() == T4)
        assert c.committed(t0) is None
        c.commit({t0: 5})
        c.commit({t1: (7, "seven")})
        assert (c.committed(t0), c.committed(t1), c.committed(t2)) == (5, 7, None)
        rows = {(r["topic"], r["partition"]): r for r in describe(broker.socket)["offsets"]}
        assert rows[("t", 1)]["metadata"] == "seven" and rows[("t", 1)]["committed_offset"] == 7
        assert offsets(broker.socket) == {t0: 5, t1: 7}

        m.pump(c, until=lambda: len(m.records[c]) >= 40)
        c.commit()                                   # the position of every partition
        assert offsets(broker.socket) == {tp: 10 for tp in T4}
        assert all(c.position(tp) == 10 for tp in T4)
        with pytest.raises(ValueError):
            c.commit({t3: -1})


def test_a_new_member_starts_exactly_at_the_committed_offsets(broker):
    produce(broker.socket, {tp: 10 for tp in T4})
    t0, t1, t2, t3 = sorted(T4)
    committed = {t0: 3, t1: 7, t2: 10, t3: 0}
    with Members(broker.socket) as m:
        c1 = m.new("t", enable_auto_commit=False)
        m.pump(c1, until=lambda: len(m.records[c1]) >= 40)
        c1.commit(committed)
        c1.close()
        c2 = m.new("t", enable_auto_commit=False)
        want = sum(10 - o for o in committed.values())
        m.pump(c2, until=lambda: len(m.records[c2]) >= want)
        got = sorted((p, o) for p, o, _ in m.records[c2])
        assert got == sorted((tp.partition, o) for tp, start in committed.items()
                             for o in range(start, 10))


def test_close_commits_the_positions(broker):
    produce(broker.socket, {tp: 10 for tp in T4})
    with Members(broker.socket) as m:
        c = m.new("t", auto_commit_interval_ms=600_000)
        m.pump(c, until=lambda: len(m.records[c]) >= 40)
        assert offsets(broker.socket) == {}, "auto-committed before the interval"
        c.close()
        assert offsets(broker.socket) == {tp: 10 for tp in T4}


def test_auto_commit_runs_inside_poll(broker):
    produce(broker.socket, {tp: 10 for tp in T4})
    with Members(broker.socket) as m:
        c = m.new("t", auto_commit_interval_ms=50)
        m.pump(c, until=lambda: offsets(broker.socket) == {tp: 10 for tp in T4},
               message="the auto-commit")


def test_commit_async_calls_back_from_poll(broker):
    produce(broker.socket, {tp: 10 for tp in T4})
    t0 = min(T4)
    with Members(broker.socket) as m:
        c = m.new("t", enable_auto_commit=False)
        m.pump(c, until=lambda: len(m.records[c]) >= 40)
        calls = []
        c.commit_async(callback=lambda offs, err: calls.append((offs, err)))
        c.commit_async({TopicPartition("t", 99): 1},
                       callback=lambda offs, err: calls.append((offs, err)))
        c.commit_async({t0: (4, "four")}, callback=lambda offs, err: calls.append((offs, err)))
        m.pump(c, until=lambda: len(calls) == 3, message="three commit callbacks")
        ok = [offs for offs, err in calls if err is None]
        failed = [(offs, err) for offs, err in calls if err is not None]
        assert sorted(ok, key=len) == [{t0: 4}, {tp: 10 for tp in T4}]
        assert [offs for offs, _ in failed] == [{TopicPartition("t", 99): 1}]
        assert isinstance(failed[0][1], UnknownTopicOrPartitionError)
        # Sent in this order, so the broker applied them in this order.
        assert c.committed(t0) == 4


def test_commit_async_callbacks_run_in_commit_order(broker):
    with Members(broker.socket) as m:
        c = m.new("t", enable_auto_commit=False)
        m.pump(c, until=lambda: c.assignment() == T4)
        order: list[int] = []
        # Rounds of a good commit followed by a failing one (an unknown partition).
        for i in range(0, 40, 2):
            c.commit_async({min(T4): i}, callback=lambda offs, err, i=i: order.append(i))
            c.commit_async({TopicPartition("t", 99): 1},
                           callback=lambda offs, err, i=i: order.append(i + 1))
        m.pump(c, until=lambda: len(order) == 40, message="the commit callbacks")
        assert order == list(range(40))


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_committed_offsets_survive_a_broker_restart(broker, how):
    produce(broker.socket, {tp: 10 for tp in T4})
    t0, t1, t2, t3 = sorted(T4)
    with Members(broker.socket) as m:
        c = m.new("t", enable_auto_commit=False)
        m.pump(c, until=lambda: len(m.records[c]) >= 40)
        c.commit({t0: 1, t1: (2, "two"), t2: 3, t3: 10})
        # Acknowledged means on disk: kill -9 right after the commit returned.
        broker.kill() if how == "kill" else broker.stop()
        broker.start()
        assert offsets(broker.socket) == {t0: 1, t1: 2, t2: 3, t3: 10}
        rows = {(r["topic"], r["partition"]): r for r in describe(broker.socket)["offsets"]}
        assert rows[("t", 1)]["metadata"] == "two"
        c.close()
        c2 = m.new("t", enable_auto_commit=False)
        m.pump(c2, until=lambda: len(m.records[c2]) >= 9 + 8 + 7)
        assert sorted((p, o) for p, o, _ in m.records[c2]) == \
            [(0, o) for o in range(1, 10)] + [(1, o) for o in range(2, 10)] + \
            [(2, o) for o in range(3, 10)]


# --- fencing ------------------------------------------------------------------------------------

def _raw_commit(conn: Connection, member_id: str, epoch: int, offset: int = 5) -> int:
    reply = conn.wait_raw(conn.send(Api.OFFSET_COMMIT, "g", member_id, epoch,
                                    [["t", 0, offset, -1, ""]]))
    return reply.error_code


def test_commits_with_a_stale_epoch_or_unknown_member_are_rejected(broker):
    with Members(broker.socket) as m, Connection(broker.socket) as conn:
        c = m.new("t", enable_auto_commit=False)
        m.pump(c, until=lambda: settled(broker.socket, [c], T4))
        me = member_of(broker.socket, c)
        member_id, epoch = me["member_id"], me["member_epoch"]
        assert epoch > 0
        assert _raw_commit(conn, member_id, epoch + 1) == StaleMemberEpochError.code
        assert _raw_commit(conn, member_id, epoch - 1) == StaleMemberEpochError.code
        assert _raw_commit(conn, "not-a-member", epoch) == UnknownMemberIdError.code
        hb = conn.wait_raw(conn.send(Api.CONSUMER_GROUP_HEARTBEAT, "g", member_id, epoch + 5,
                                     None, -1, -1, None, None, None, None))
        assert hb.error_code == FencedMemberEpochError.code
        assert offsets(broker.socket) == {}
        assert _raw_commit(conn, member_id, epoch, offset=6) == 0    # the right epoch passes
        assert offsets(broker.socket) == {min(T4): 6}
        # The member was not disturbed by any of this.
        assert member_of(broker.socket, c)["member_epoch"] == epoch
        c.commit({min(T4): 7})
        assert c.committed(min(T4)) == 7


def test_group_less_commits_are_rejected_while_members_live(broker):
    t0 = min(T4)
    with Members(broker.socket) as m, Connection(broker.socket) as conn, \
            Admin(broker.socket) as admin:
        c = m.new("t", enable_auto_commit=False)
        m.pump(c, until=lambda: settled(broker.socket, [c], T4))
        assert _raw_commit(conn, "", -1) == NonEmptyGroupError.code
        with pytest.raises(NonEmptyGroupError):
            admin.alter_group_offsets("g", {t0: 3})
        with pytest.raises(NonEmptyGroupError):
            admin.delete_group("g")
        manual = Consumer(group_id="g", socket=broker.socket, enable_auto_commit=False)
        m.callback(manual.close)
        manual.assign([t0])
        with pytest.raises(NonEmptyGroupError):
            manual.commit({t0: 3})
        c.close()
        manual.commit({t0: 3})                       # no members now: accepted
        admin.alter_group_offsets("g", {TopicPartition("t", 1): 4})
        assert offsets(broker.socket) == {t0: 3, TopicPartition("t", 1): 4}


# --- subscriptions ------------------------------------------------------------------------------

def test_pattern_subscription_picks_up_topics_created_later(broker):
    with Admin(broker.socket) as admin, Members(broker.socket) as m:
        admin.create_topic("pat-a", 2)
        r = Recorder()
        c = m.new(pattern=r"pat-.*", listener=r)
        m.pump(c, until=lambda: c.assignment() == tps("pat-a", 0, 1))
        admin.create_topic("other", 2)
        admin.create_topic("pat-b", 3)
        want = tps("pat-a", 0, 1) | tps("pat-b", 0, 1, 2)
        m.pump(c, until=lambda: c.assignment() == want, message="pat-b to be assigned")
        values = produce(broker.socket, {tp: 3 for tp in tps("pat-b", 0, 1, 2)})
        m.pump(c, until=lambda: len(m.records[c]) >= len(values))
        assert sorted(v for _, _, v in m.records[c]) == sorted(values)
        assert not r.all("revoked") and not r.all("lost")
        assert describe(broker.socket)["members"][0]["pattern"] == "pat-.*"


def test_a_deleted_topic_leaves_the_assignment_without_an_error(broker):
    with Admin(broker.socket) as admin, Members(broker.socket) as m:
        admin.create_topic("pat-keep", 2)
        admin.create_topic("pat-gone", 2)
        r = Recorder()
        c = m.new(pattern=r"pat-.*", listener=r)
        both = tps("pat-keep", 0, 1) | tps("pat-gone", 0, 1)
        m.pump(c, until=lambda: c.assignment() == both)
        produce(broker.socket, {tp: 2 for tp in both})
        m.pump(c, until=lambda: len(m.records[c]) == 8)
        admin.delete_topic("pat-gone")             # pump() fails if poll raises
        m.pump(c, until=lambda: c.assignment() == tps("pat-keep", 0, 1))
        assert r.all("revoked") == tps("pat-gone", 0, 1) and not r.all("lost")
        c.commit()
        assert offsets(broker.socket) == {tp: 2 for tp in tps("pat-keep", 0, 1)}


def test_partitions_added_to_a_subscribed_topic_are_assigned(broker):
    with Admin(broker.socket) as admin, Members(broker.socket) as m:
        admin.create_topic("grow", 2)
        r1, r2 = Recorder(), Recorder()
        c1, c2 = m.new("grow", listener=r1), m.new("grow", listener=r2)
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], tps("grow", 0, 1)))
        before = [frozenset(c1.assignment()), frozenset(c2.assignment())]
        r1.clear()
        r2.clear()
        admin.create_partitions("grow", 6)
        grown = tps("grow", *range(6))
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], grown))
        assert len(c1.assignment()) == len(c2.assignment()) == 3
        assert before[0] <= c1.assignment() and before[1] <= c2.assignment()
        assert not (r1.all("revoked") | r2.all("revoked") | r1.all("lost") | r2.all("lost"))
        values = produce(broker.socket, {tp: 4 for tp in grown - tps("grow", 0, 1)})
        m.pump(c1, c2, until=lambda: len(m.records[c1]) + len(m.records[c2]) >= len(values))
        assert sorted(v for c in (c1, c2) for _, _, v in m.records[c]) == sorted(values)


def test_unsubscribe_leaves_and_hands_partitions_over(broker):
    with Members(broker.socket) as m:
        r1 = Recorder()
        c1, c2 = m.new("t", listener=r1), m.new("t")
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], T4))
        mine = frozenset(c1.assignment())
        c1.unsubscribe()
        assert c1.assignment() == set() and r1.events[-1] == ("revoked", mine)
        m.pump(c2, until=lambda: settled(broker.socket, [c2], T4))


# --- static membership --------------------------------------------------------------------------

def test_static_member_restart_gets_its_partitions_back_without_a_rebalance(broker):
    with Members(broker.socket) as m:
        ra, rb = Recorder(), Recorder()
        ca = m.new("t", group_instance_id="a", listener=ra)
        cb = m.new("t", group_instance_id="b", listener=rb)
        m.pump(ca, cb, until=lambda: settled(broker.socket, [ca, cb], T4))
        mine, theirs = frozenset(ca.assignment()), frozenset(cb.assignment())
        epoch = describe(broker.socket)["group_epoch"]
        produce(broker.socket, {tp: 5 for tp in T4}, "a")
        m.pump(ca, cb, until=lambda: len(m.records[ca]) + len(m.records[cb]) >= 20)
        rb.clear()
        ca.close()                                   # commits, then leaves temporarily
        d = describe(broker.socket)
        assert [mem["away"] for mem in d["members"] if mem["instance_id"] == "a"] == [True]
        # While "a" is away its partitions stay reserved: "b" consumes only its own.
        values = produce(broker.socket, {tp: 5 for tp in T4}, "b")
        m.pump(cb, until=lambda: sum(1 for p, _, v in m.records[cb] if "-b" in v) >= 10,
               message="b to consume its own new records")
        assert {TopicPartition("t", p) for p, _, _ in m.records[cb]} <= theirs
        assert cb.assignment() == theirs

        ra2 = Recorder()
        ca2 = m.new("t", group_instance_id="a", listener=ra2)
        m.pump(ca2, cb, until=lambda: settled(broker.socket, [ca2, cb], T4))
        assert ca2.assignment() == mine and cb.assignment() == theirs
        assert ra2.events == [("assigned", mine)]
        assert rb.events == [], "the other member was disturbed"
        assert describe(broker.socket)["group_epoch"] == epoch, "the group rebalanced"
        # It resumes where the first incarnation committed on close: just the new records.
        m.pump(ca2, until=lambda: len(m.records[ca2]) >= 10)
        assert sorted(v for _, _, v in m.records[ca2]) == \
            sorted(v for v in values if TopicPartition("t", int(v.split("-")[1])) in mine)


# --- liveness -----------------------------------------------------------------------------------

def test_session_timeout_moves_the_partitions_of_a_stopped_member(tmp_path):
    session_ms = 1000
    with broker_with(tmp_path, **FAST) as b, Admin(b.socket) as admin, \
            Members(b.socket) as m:
        admin.create_topic("t", 4)
        events = tmp_path / "child.jsonl"
        child = spawn_worker("consume", socket=b.socket, topics=["t"], group="g",
                             events=str(events), session_timeout_ms=session_ms)
        m.callback(reap, child)
        wait_ready(child)
        r = Recorder()
        c = m.new("t", listener=r)

        def child_assignment():
            mems = [mem for mem in describe(b.socket)["members"] if mem["pid"] == child.pid]
            return {TopicPartition(t, p) for t, p in mems[0]["assignment"]} if mems else set()

        m.pump(c, until=lambda: settled(b.socket, [c], T4, others=1)
               and len(c.assignment()) == 2)
        theirs = frozenset(child_assignment())
        values = produce(b.socket, {tp: 5 for tp in T4})
        mq.testing.wait_for(lambda: sum(len(e["offsets"]) for e in read_events(events)
                                        if e["kind"] == "batch") >= 10,
                            timeout=TIMEOUT, message="the child to consume its records")
        os.kill(child.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            m.pump(c, until=lambda: c.assignment() == T4, message="the session to time out")
            moved_after = time.monotonic() - stopped_at
            assert r.all("assigned") >= theirs
            d = describe(b.socket)
            assert [mem["pid"] for mem in d["members"]] == [os.getpid()]
        finally:
            os.kill(child.pid, signal.SIGCONT)
        # The stopped member had heartbeated at most 100 ms before it stopped.
        assert moved_after > session_ms / 1000 - 0.2, "moved before the session timed out"
        # Continued, it finds it was fenced: its partitions are lost (not revoked); it rejoins.
        m.pump(c, until=lambda: settled(b.socket, [c], T4, others=1)
               and len(c.assignment()) == 2, message="the child to rejoin")

        def callbacks():
            return [e for e in read_events(events) if e["t"] > stopped_at
                    and e["kind"] in ("assigned", "revoked", "lost")]
        mq.testing.wait_for(lambda: len(callbacks()) >= 2, timeout=TIMEOUT,
                            message="the child's listener to see the loss and the rejoin")
        after = callbacks()
        assert [e["kind"] for e in after] == ["lost", "assigned"], after
        assert {TopicPartition(t, p) for t, p in after[0]["tps"]} == theirs
        assert not r.all("lost")
        assert stop_worker(child) == 0
        m.pump(c, until=lambda: c.assignment() == T4)
        # Nothing was lost on the way (duplicates are allowed: the child's last records may
        # not have been committed).
        seen = {v for _, _, v in m.records[c]} | {
            v for e in read_events(events) if e["kind"] == "batch" for v in e["values"]}
        assert seen == set(values)


def test_max_poll_interval_leaves_the_group_and_polling_rejoins(fast_broker):
    b = fast_broker
    with Members(b.socket) as m:
        r1, r2 = Recorder(), Recorder()
        c1 = m.new("t", listener=r1, max_poll_interval_ms=500)
        c2 = m.new("t", listener=r2)
        m.pump(c1, c2, until=lambda: settled(b.socket, [c1, c2], T4))
        mine = frozenset(c1.assignment())
        r1.clear()
        r2.clear()
        # c1 stops polling: after 500 ms it leaves and c2 gets everything.
        m.pump(c2, until=lambda: c2.assignment() == T4 and len(describe(b.socket)["members"])
               == 1, message="c1 to leave after max_poll_interval_ms")
        assert r2.events == [("assigned", mine)]
        assert r1.events == []              # no callback runs outside poll
        # Polling again: first the loss (never a revocation: c2 may already be reading them),
        # then a rejoin.
        m.pump(c1, c2, until=lambda: settled(b.socket, [c1, c2], T4))
        assert r1.events[0] == ("lost", mine)
        assert not r1.all("revoked") and r1.all("assigned") == frozenset(c1.assignment())


def test_max_poll_interval_is_enforced_with_the_default_heartbeat_interval(broker):
    with Members(broker.socket) as m:
        c1 = m.new("t", max_poll_interval_ms=300)
        c2 = m.new("t")
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], T4))
        # Kafka checks the poll timer at least every retry.backoff.ms (100 ms): c1 should be
        # gone well within 2 s (here it leaves after up to 5 s).
        m.pump(c2, until=lambda: c2.assignment() == T4, timeout=2.0, message="c1 to leave")


# --- offset expiry ------------------------------------------------------------------------------

def test_offsets_of_an_empty_group_expire_after_the_retention(tmp_path):
    t0 = TopicPartition("t", 0)
    with broker_with(tmp_path, offsets_retention_minutes=0.005,          # 300 ms
                     offsets_retention_check_interval_ms=100) as b, \
            Admin(b.socket) as admin, Members(b.socket) as m:
        admin.create_topic("t", 1)
        produce(b.socket, {t0: 3})
        c = m.new("t", enable_auto_commit=False)
        m.pump(c, until=lambda: len(m.records[c]) == 3)
        c.commit()
        assert admin.list_group_offsets("g") == {t0: 3}          # kept while a member lives
        c.close()
        mq.testing.wait_for(lambda: admin.list_group_offsets("g") == {}, timeout=TIMEOUT,
                            message="the offsets to expire")
        assert admin.list_groups() == []
        # A new member of the group starts over (auto_offset_reset="earliest").
        c2 = m.new("t")
        m.pump(c2, until=lambda: len(m.records[c2]) == 3)


def test_offsets_expire_only_once_the_group_is_empty(tmp_path):
    """Commits made long ago (written into ``__consumer_offsets`` while the broker is down, with
    the broker's own encoder) expire after ``offsets_retention_minutes`` — except those of a
    group with a live member, which expire once it left. The member must join before the
    broker's first expiry check: on a host too loaded for that, the run is repeated with a
    longer check interval (never skipped)."""
    for check_ms in (1000, 4000, 16000):
        if _offsets_expire_scenario(tmp_path / f"check-{check_ms}", check_ms):
            return
    pytest.fail("the member never joined before the first expiry check, even at 16 s")


def _offsets_expire_scenario(tmp_path, check_ms: int) -> bool:
    """One run of the test above; False when the member joined too late to tell."""
    t0 = TopicPartition("t", 0)
    settings = {"offsets_retention_minutes": 1, "offsets_retention_check_interval_ms": check_ms}
    tmp_path.mkdir()
    with broker_with(tmp_path, **settings) as b:
        with Admin(b.socket) as admin:
            admin.create_topic("t", 1)
            admin.alter_group_offsets("recent", {t0: 2})
        produce(b.socket, {t0: 10})
        b.stop()
        old_ms = int(time.time() * 1000) - 120_000
        with LogManager.open(b.data_dir) as logs:
            store = OffsetStore([logs.get(OFFSETS_TOPIC, 0)])
            for group in ("old", "old-live"):
                store.commit(group, [("t", 0, CommittedOffset(5, -1, "", old_ms))], old_ms)
            logs.flush_all()
        started = time.monotonic()
        b.start()
        with Members(b.socket) as m:
            c = m.new("t", group_id="old-live", enable_auto_commit=False)
            # A member counts from its first heartbeat (its partitions come only after the
            # broker's 2 s restart grace: the group had committed offsets).
            mq.testing.wait_for(lambda: describe(b.socket, "old-live")["members"],
                                timeout=TIMEOUT, message="the member to join")
            if time.monotonic() - started >= check_ms / 1000:
                return False
            mq.testing.wait_for(lambda: offsets(b.socket, "old") == {}, timeout=TIMEOUT,
                                message="the old offsets to expire")
            assert offsets(b.socket, "old-live") == {t0: 5}, "expired with a live member"
            m.pump(c, until=lambda: len(m.records[c]) >= 5)
            assert [o for _, o, _ in m.records[c]] == [5, 6, 7, 8, 9]
            assert offsets(b.socket, "recent") == {t0: 2}
            c.close()
            mq.testing.wait_for(lambda: offsets(b.socket, "old-live") == {}, timeout=TIMEOUT,
                                message="the offsets of the emptied group to expire")
        with Admin(b.socket) as admin:
            assert {g["group"] for g in admin.list_groups()} == {"recent"}
    return True


# --- broker restarts ----------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["kill", "stop"])
def test_members_keep_their_partitions_through_a_broker_restart(broker, how):
    with Members(broker.socket) as m:
        r1, r2 = Recorder(), Recorder()
        c1, c2 = m.new("t", listener=r1), m.new("t", listener=r2)
        produce(broker.socket, {tp: 5 for tp in T4}, "a")
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], T4)
               and len(m.records[c1]) + len(m.records[c2]) >= 20)
        mine1, mine2 = frozenset(c1.assignment()), frozenset(c2.assignment())
        ids = {m_["member_id"] for m_ in describe(broker.socket)["members"]}
        c1.commit()
        c2.commit()
        r1.clear()
        r2.clear()
        broker.kill() if how == "kill" else broker.stop()
        broker.start()
        values = produce(broker.socket, {tp: 5 for tp in T4}, "b")
        m.pump(c1, c2, until=lambda: sum(1 for c in (c1, c2) for _, _, v in m.records[c]
                                         if "-b" in v) >= len(values),
               message="the members to consume after the restart")
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], T4))
        assert (c1.assignment(), c2.assignment()) == (mine1, mine2)
        assert r1.events == r2.events == []
        assert {m_["member_id"] for m_ in describe(broker.socket)["members"]} == ids
        for c, mine in ((c1, mine1), (c2, mine2)):
            new = sorted(v for _, _, v in m.records[c] if "-b" in v)
            assert new == sorted(v for v in values
                                 if TopicPartition("t", int(v.split("-")[1])) in mine)


@pytest.mark.parametrize("when", ["just restarted", "down"])
def test_a_commit_rides_out_a_broker_restart(broker, when):
    """The restarted broker knows no members: a commit sent before the member rejoined, or
    while the broker is down, goes through with the member's new epoch once it rejoined."""
    produce(broker.socket, {tp: 5 for tp in T4})
    with Members(broker.socket) as m:
        c = m.new("t", enable_auto_commit=False)
        m.pump(c, until=lambda: len(m.records[c]) >= 20)
        broker.kill()
        outcome: list = []

        def commit() -> None:
            try:
                c.commit({tp: 5 for tp in T4})
            except Exception as err:            # reported by the assertion below
                outcome.append(err)
            else:
                outcome.append("committed")
        if when == "down":
            committing = threading.Thread(target=commit)
            committing.start()
            broker.start()
            committing.join(TIMEOUT)
        else:
            broker.start()
            c.poll(timeout_ms=100)              # the poll thread reconnects: commit at once
            commit()
        assert outcome == ["committed"]
        assert offsets(broker.socket) == {tp: 5 for tp in T4}


@pytest.mark.parametrize("committed", [True, False])
def test_a_member_slow_to_rejoin_after_a_broker_restart_keeps_its_partitions(tmp_path,
                                                                             committed):
    """A member that is still consuming but rejoins late (here: stopped across the restart)
    keeps its partitions: nobody else is granted them meanwhile (the broker's restart grace)."""
    with mq.testing.broker(tmp_path / "data") as b, Admin(b.socket) as admin, \
            Members(b.socket) as m:
        admin.create_topic("t", 4)
        events = tmp_path / "child.jsonl"
        child = spawn_worker("consume", socket=b.socket, topics=["t"], group="g",
                             events=str(events), commit="none")
        m.callback(reap, child)
        wait_ready(child)
        r1 = Recorder()
        c1 = m.new("t", listener=r1, enable_auto_commit=False)

        def child_owns():
            owned: set = set()
            for e in read_events(events):
                tps_ = {TopicPartition(t, p) for t, p in e.get("tps", ())}
                owned = owned | tps_ if e["kind"] == "assigned" else owned - tps_
            return owned
        m.pump(c1, until=lambda: settled(b.socket, [c1], T4, others=1)
               and child_owns() == T4 - c1.assignment())
        mine, theirs = frozenset(c1.assignment()), frozenset(child_owns())
        if committed:
            c1.commit({tp: 0 for tp in mine})
        r1.clear()
        os.kill(child.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            b.kill()
            b.start()

            def rejoined():
                try:
                    return [mem["pid"] for mem in describe(b.socket)["members"]] == [os.getpid()]
                except GroupIdNotFoundError:
                    return False
            m.pump(c1, until=rejoined, message="c1 to rejoin")
            until = time.monotonic() + 0.3          # watch c1 for a while: nothing may move
            m.pump(c1, until=lambda: time.monotonic() > until)
            assert c1.assignment() == mine, "the stopped member's partitions were handed out"
        finally:
            os.kill(child.pid, signal.SIGCONT)
        m.pump(c1, until=lambda: settled(b.socket, [c1], T4, others=1))
        assert c1.assignment() == mine and r1.events == []
        assert [e["kind"] for e in read_events(events) if e["t"] > stopped_at
                and e["kind"] in ("assigned", "revoked", "lost")] == []
        assert child_owns() == theirs
        assert stop_worker(child) == 0


def test_a_failed_handshake_does_not_leak_the_socket(tmp_path):
    path = str(tmp_path / "dying.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen()
        done = threading.Event()

        def accept_and_hang_up():
            peer, _ = listener.accept()
            peer.close()                 # like a broker killed before it read the handshake
            done.set()
        threading.Thread(target=accept_and_hang_up, daemon=True).start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(BrokerUnavailableError):
                Connection(path, timeout=TIMEOUT)
            assert done.wait(TIMEOUT)
            gc.collect()
        assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


# --- listener errors ----------------------------------------------------------------------------

class Boom(Exception):
    pass


class Exploding(Recorder):
    def __init__(self, on: str) -> None:
        super().__init__()
        self.on = on

    def _maybe(self, kind: str) -> None:
        if kind == self.on:
            self.on = None                   # once
            raise Boom(kind)

    def on_partitions_assigned(self, assigned):
        super().on_partitions_assigned(assigned)
        self._maybe("assigned")

    def on_partitions_revoked(self, revoked):
        super().on_partitions_revoked(revoked)
        self._maybe("revoked")


def test_listener_exceptions_surface_from_poll(broker):
    produce(broker.socket, {tp: 5 for tp in T4})
    with Members(broker.socket) as m:
        r1 = Exploding("assigned")
        c1 = m.new("t", listener=r1)
        with pytest.raises(Boom, match="assigned"):
            m.pump(c1, until=lambda: False)
        # The assignment went through; the next polls consume.
        assert c1.assignment() == T4
        m.pump(c1, until=lambda: len(m.records[c1]) >= 20)

        r1.on = "revoked"
        c2 = m.new("t")
        with pytest.raises(Boom, match="revoked"):
            m.pump(c1, c2, until=lambda: False)
        # The revocation still happened: the partitions move on.
        m.pump(c1, c2, until=lambda: settled(broker.socket, [c1, c2], T4))
        assert r1.all("revoked") == frozenset(c2.assignment())
