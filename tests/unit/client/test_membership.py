"""The group member's state machine (``mq.client.group_member``) against the real, pure group
coordinator: each heartbeat is the member's request handed to ``GroupCoordinator.heartbeat``
and the reply handed back, made by the test at the moment it chooses, so the interleavings of
the heartbeat and poll threads are exact. No thread, no socket.

Partitions are written "t0 t1" for topic "t" partitions 0 and 1.
"""

from __future__ import annotations

import itertools

import pytest

from mq import errors
from mq.broker.group_coordinator import GroupCoordinator
from mq.client.group_member import JOIN_EPOCH, LEAVE_EPOCH, GroupMember
from mq.client.types import TopicPartition


def tps(spec: str) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition("t", int(word[1:])) for word in spec.split())


class Member(GroupMember):
    """A member whose heartbeat goes to ``coordinator`` and comes back at once."""

    def __init__(self, coordinator: GroupCoordinator, **options) -> None:
        super().__init__("g", topics=["t"], **options)
        self.coordinator = coordinator
        self.changes = 0

    def _heartbeat(self) -> None:
        (group, member_id, epoch, instance_id, rebalance_timeout_ms, session_timeout_ms,
         topics, pattern, assignor, owned) = self.heartbeat_request()
        r = self.coordinator.heartbeat(
            group, member_id, member_epoch=epoch, instance_id=instance_id, subscription=topics,
            subscribed_pattern=pattern, assignor=assignor, owned_partitions=owned, now_ms=0,
            rebalance_timeout_ms=rebalance_timeout_ms, session_timeout_ms=session_timeout_ms)
        assert r.error is None, r
        self.changes += self.on_heartbeat_reply(r.member_id, r.member_epoch,
                                                r.heartbeat_interval_ms, r.assignment, now=0.0)


@pytest.fixture
def coordinator() -> GroupCoordinator:
    ids = (f"m{i}" for i in itertools.count(1))
    return GroupCoordinator({"t": 4}, member_id_factory=lambda: next(ids))


@pytest.fixture
def group(coordinator):
    """``join()`` makes a member of group "g" (topic "t", 4 partitions), joined once."""
    def join() -> Member:
        m = Member(coordinator)
        m.connected(1)
        m._heartbeat()
        return m
    return join


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
    assert m1.hb_due, "the heartbeat thread must report at once that it let t2, t3 go"
    m1._heartbeat()
    m2._heartbeat()
    assert m2.target == tps("t2 t3")


def test_a_revocation_is_reported_once_the_poll_thread_is_done(group):
    m1 = group()
    m1.reconciling(frozenset())
    m1.reconciled(m1.target)
    m2 = group()
    m1._heartbeat()
    m1.hb_due = False
    _, target, _, _ = m1.reconciling(tps("t0 t1 t2 t3"))
    assert target == tps("t0 t1")
    m2._heartbeat()
    assert m2.target == frozenset()      # on_partitions_revoked has not run yet
    m1.set_owned(target)
    assert m1.hb_due
    m1.reconciled(target)
    m1._heartbeat()
    m2._heartbeat()
    assert m2.target == tps("t2 t3")


def test_the_subscription_is_sent_when_joining_and_when_it_changes(group):
    m = group()
    assert m.heartbeat_request()[6] is None                 # joined: not again
    m.subscribe(["t", "u"])
    assert m.hb_due and m.heartbeat_request()[6:9] == (["t", "u"], None, None)
    m.subscribe(pattern="t.*")
    assert m.heartbeat_request()[6:8] == (None, "t.*")


def test_fencing_drops_everything_then_rejoins_after_the_poll_thread_let_go(group):
    m = group()
    m.reconciling(frozenset())
    m.reconciled(m.target)
    version = m.version
    m.on_heartbeat_error(errors.FencedMemberEpochError.code, "fenced")
    assert (m.lost, m.target, m.epoch, m.hb_due) == (True, frozenset(), JOIN_EPOCH, True)
    assert m.version > version and m.member_id == "m1"
    _, target, lost, error = m.reconciling(m.owned)
    assert (target, lost, error) == (frozenset(), True, None)
    m.set_owned(frozenset(), lost_handled=True)
    assert not m.lost
    m.on_heartbeat_error(errors.UnknownMemberIdError.code, "unknown")
    assert m.member_id is None and not m.lost           # nothing owned: nothing to drop


def test_a_fatal_error_is_kept_for_poll(group):
    m = group()
    version = m.version
    m.on_heartbeat_error(errors.GroupAuthorizationFailedError.code, "no")
    assert isinstance(m.error, errors.GroupAuthorizationFailedError)
    assert m.version > version and m.reconciling(frozenset())[3] is m.error


def test_a_lost_connection_loses_the_partitions_unless_the_broker_restarted(group):
    m = group()
    m.reconciling(frozenset())
    m.reconciled(m.target)
    assert not m.connected(2) and not m.lost            # a new broker generation: rejoin
    assert m.epoch == JOIN_EPOCH and m.owned == tps("t0 t1 t2 t3")
    assert m.connected(2) and m.lost                    # the same broker dropped us


def test_max_poll_interval_counts_only_outside_poll():
    m = GroupMember("g", topics=["t"], max_poll_interval_ms=1_000, now=0.0)
    m.on_heartbeat_reply("m1", 1, 5_000, [], now=0.0)   # next heartbeat at 5 s
    assert not m.poll_interval_exceeded(0.5) and m.next_check(0.5) == pytest.approx(0.501)
    m.poll_started(0.5)
    assert not m.poll_interval_exceeded(5.0)            # waiting inside poll is polling
    m.poll_ended(5.0)
    assert not m.poll_interval_exceeded(5.9) and m.poll_interval_exceeded(6.1)
    m.left_for_poll_interval()
    assert m.epoch == JOIN_EPOCH and m.version == 1


def test_leaving_and_the_commit_identity(group):
    fresh = GroupMember("g", topics=["t"])
    assert fresh.leave_request(static=False) is None and fresh.commit_identity() == ("", -1)
    m = group()
    assert m.commit_identity() == ("m1", m.epoch) and m.epoch > 0
    assert m.leave_request(static=False)[1:3] == ("m1", LEAVE_EPOCH)


# --- commits refused for the member's id or epoch -----------------------------------------------

def owning(m: Member) -> Member:
    """``m`` once its poll thread started its whole target."""
    m.reconciling(frozenset())
    m.reconciled(m.target)
    return m


def test_a_commit_refused_after_a_broker_restart_goes_again_once_the_member_rejoined(group):
    m = owning(group())
    member_id, epoch, first = m.commit_stamp()
    # The broker is killed and restarts with no members (it does not persist them); the poll
    # thread reconnects and commits before the heartbeat thread has rejoined.
    restarted = GroupCoordinator({"t": 4}, restart_grace_ms=2_000)
    assert restarted.validate_commit("g", member_id, epoch) is errors.UnknownMemberIdError
    assert m.retry_commit(tps("t0 t1"), first, first) is None      # no reply yet: wait
    assert not m.connected(2)                           # a new broker generation: rejoin
    member_id, epoch, last = m.commit_stamp()
    assert (member_id, epoch) == ("m1", JOIN_EPOCH)     # refused too, never taken as group-less
    assert restarted.validate_commit("g", member_id, epoch) is errors.UnknownMemberIdError
    assert m.retry_commit(tps("t0 t1"), first, last) is None
    m.coordinator = restarted
    m._heartbeat()                                      # rejoined, granted what it reported
    member_id, epoch, _ = m.retry_commit(tps("t0 t1"), first, last)
    assert (member_id, epoch) == ("m1", m.epoch) and epoch > 0
    assert restarted.validate_commit("g", member_id, epoch) is None


def test_a_commit_of_partitions_given_to_another_member_meanwhile_fails(group):
    m = owning(group())
    _, _, first = m.commit_stamp()
    # The broker restarted without a grace period and another member rejoined first: it was
    # given everything, so m's rejoin gets nothing back.
    restarted = GroupCoordinator({"t": 4}, member_id_factory=lambda: "m9")
    other = Member(restarted)
    other.connected(1)
    other._heartbeat()
    owning(other)
    m.coordinator = restarted
    m.connected(2)
    m._heartbeat()
    assert m.target == frozenset()
    with pytest.raises(errors.CommitFailedError, match="t-0, t-1: no longer assigned"):
        m.retry_commit(tps("t0 t1"), first, first)
    # The other member hands two partitions over: back in m's target, but the commit's
    # offsets are older than what the other member may have committed meanwhile.
    other._heartbeat()
    _, target, _, _ = other.reconciling(other.owned)
    other.set_owned(target)
    other.reconciled(target)
    other._heartbeat()
    m._heartbeat()
    back = m.target
    assert len(back) == 2
    with pytest.raises(errors.CommitFailedError):
        m.retry_commit(back, first, first)
    _, _, now = m.commit_stamp()                        # a commit made since they came back
    m._heartbeat()
    assert m.retry_commit(back, now, now) == m.commit_stamp()


def test_a_commit_that_crossed_an_epoch_change_goes_again_only_for_partitions_kept(
        group, coordinator):
    m1 = owning(group())
    member_id, epoch, first = m1.commit_stamp()
    group()                                             # m2 joins: t2, t3 move to it
    m1._heartbeat()
    _, target, _, _ = m1.reconciling(m1.owned)
    m1.set_owned(target)
    m1.reconciled(target)
    m1._heartbeat()                                     # released: the new epoch
    assert m1.epoch != epoch
    assert coordinator.validate_commit("g", member_id, epoch) is errors.StaleMemberEpochError
    assert m1.retry_commit(tps("t0 t1"), first, first) == ("m1", m1.epoch, m1.replies)
    with pytest.raises(errors.CommitFailedError, match="t-2, t-3"):
        m1.retry_commit(tps("t0 t2 t3"), first, first)


@pytest.mark.parametrize("how", ["fenced", "dropped by the same broker", "failed"])
def test_a_member_that_lost_its_partitions_commits_nothing_and_does_not_wait(group, how):
    m = owning(group())
    _, _, first = m.commit_stamp()
    if how == "fenced":
        m.on_heartbeat_error(errors.FencedMemberEpochError.code, "fenced")
    elif how == "failed":
        m.fail(errors.GroupAuthorizationFailedError("no"))
    else:
        assert m.connected(1)
    expected = errors.GroupAuthorizationFailedError if how == "failed" \
        else errors.CommitFailedError
    with pytest.raises(expected):
        m.retry_commit(tps("t0"), first, first)
