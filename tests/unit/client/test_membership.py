"""The heartbeat thread's reports (``mq.client.membership``) against the real, pure group
coordinator: each heartbeat is one ``GroupCoordinator.heartbeat`` call, made by the test at the
moment it chooses, so the interleavings of the heartbeat and poll threads are exact.

Partitions are written "t0 t1" for topic "t" partitions 0 and 1.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from mq.broker.group_coordinator import GroupCoordinator
from mq.client.membership import Membership
from mq.client.types import TopicPartition
from mq.protocol.messages import Api, Response, response


def tps(spec: str) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition("t", int(word[1:])) for word in spec.split())


class CoordinatorConnection:
    """A heartbeat connection whose broker is ``coordinator``: a reply per request at once."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator
        self.reply = None

    def send(self, api, group, member_id, epoch, instance_id, rebalance_timeout_ms,
             session_timeout_ms, topics, pattern, assignor, owned) -> int:
        r = self.coordinator.heartbeat(
            group, member_id, member_epoch=epoch, instance_id=instance_id, subscription=topics,
            subscribed_pattern=pattern, assignor=assignor, owned_partitions=owned, now_ms=0,
            rebalance_timeout_ms=rebalance_timeout_ms, session_timeout_ms=session_timeout_ms)
        assert r.error is None, r
        self.reply = Response.from_message(response(
            Api.CONSUMER_GROUP_HEARTBEAT, 1, 0, None, r.member_id, r.member_epoch,
            r.heartbeat_interval_ms, sorted(map(list, r.assignment))))
        return 1

    def wait_raw(self, request_id: int):
        return self.reply


@pytest.fixture
def group() -> Iterator:
    """``join()`` makes a member of group "g" (topic "t", 4 partitions), joined once."""
    ids = (f"m{i}" for i in itertools.count(1))
    coordinator = GroupCoordinator({"t": 4}, member_id_factory=lambda: next(ids))
    members: list[Membership] = []

    def join() -> Membership:
        m = Membership(None, "g", topics=["t"], wake=lambda: None)
        m._conn = CoordinatorConnection(coordinator)
        members.append(m)
        m._heartbeat()
        return m
    yield join
    for m in members:
        m.leave()


def test_an_assignment_being_started_is_not_given_to_another_member(group):
    m1 = group()
    assert m1.target == tps("t0 t1 t2 t3")
    # The poll thread takes the assignment and starts it: committed offsets, then the
    # listener's on_partitions_assigned, then records.
    _, target, _, _ = m1.reconciling(frozenset())
    assert target == tps("t0 t1 t2 t3")
    m2 = group()                         # a second member: t2, t3 move once m1 revoked them
    m1._heartbeat()                      # woken meanwhile: the poll thread has not finished
    assert m1.target == tps("t0 t1")
    m2._heartbeat()
    assert m2.target == frozenset(), "t2, t3 granted while m1 may be starting them"
    m1._heartbeat()                      # the newer reply does not stop the start under way
    m2._heartbeat()
    assert m2.target == frozenset()
    m1.reconciled(tps("t0 t1 t2 t3"))
    _, target, _, _ = m1.reconciling(tps("t0 t1 t2 t3"))    # the next poll revokes t2, t3
    m1.set_owned(target)                 # after on_partitions_revoked
    m1.reconciled(target)
    m1._heartbeat()
    m2._heartbeat()
    assert m2.target == tps("t2 t3")


def test_an_assignment_taken_back_before_it_was_started_is_released_at_once(group):
    m1 = group()                         # the poll thread has not looked at the assignment yet
    m2 = group()
    m1._heartbeat()
    assert m1.target == tps("t0 t1")
    m2._heartbeat()
    assert m2.target == frozenset()      # m1 reported t2, t3: it could have started them
    assert m1._hb_due, "the heartbeat thread must report at once that it let t2, t3 go"
    m1._heartbeat()
    m2._heartbeat()
    assert m2.target == tps("t2 t3")


def test_a_revocation_is_reported_once_the_poll_thread_is_done(group):
    m1 = group()
    m1.reconciling(frozenset())
    m1.reconciled(m1.target)
    m2 = group()
    m1._heartbeat()
    m1._hb_due = False
    _, target, _, _ = m1.reconciling(tps("t0 t1 t2 t3"))
    assert target == tps("t0 t1")
    m2._heartbeat()
    assert m2.target == frozenset()      # on_partitions_revoked has not run yet
    m1.set_owned(target)
    assert m1._hb_due
    m1.reconciled(target)
    m1._heartbeat()
    m2._heartbeat()
    assert m2.target == tps("t2 t3")
