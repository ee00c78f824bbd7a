"""The pure group coordinator: exact scenarios for every rule, then a Hypothesis state machine.

Partitions are written "t0 t1" for topic "t" partitions 0 and 1; members get predictable ids
(m1, m2, ...) from an injected factory.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mq import errors
from mq.broker.group_coordinator import GroupCoordinator
from mq.broker.group_model import GroupState, MemberState


def tps(spec: str, topic: str = "t") -> frozenset[tuple[str, int]]:
    out = set()
    for word in spec.split():
        name, number = (word.rstrip("0123456789"), word[len(word.rstrip("0123456789")):])
        out.add((name or topic, int(number)))
    return frozenset(out)


def coordinator(topics=None, **kw) -> GroupCoordinator:
    ids = (f"m{i}" for i in itertools.count(1))
    return GroupCoordinator({"t": 4} if topics is None else topics,
                            member_id_factory=lambda: next(ids), **kw)


def join(c, group="g", topics=("t",), now=0, pid=None, conn=None, **kw):
    kw.setdefault("subscription", list(topics))
    r = c.heartbeat(group, None, member_epoch=0, now_ms=now, pid=pid, conn_id=conn, **kw)
    assert r.error is None, r
    return r


def hb(c, member, epoch, owned, group="g", now=0, **kw):
    return c.heartbeat(group, member, member_epoch=epoch, owned_partitions=owned, now_ms=now,
                       **kw)


def woken(effects) -> set[str]:
    return {w.member_id for w in effects.wakeups}


def member(c, member_id, group="g"):
    return next(m for m in c.describe(group).members if m.member_id == member_id)


# --- joining and incremental reconciliation ------------------------------------------------------

def test_first_member_gets_every_partition():
    c = coordinator()
    r = join(c, pid=10, conn="c10")
    assert (r.member_id, r.member_epoch, r.assignment) == ("m1", 1, tps("t0 t1 t2 t3"))
    assert r.heartbeat_interval_ms == 5000
    d = c.describe("g")
    assert (d.state, d.group_epoch, d.assignor) == (GroupState.STABLE, 1, "sticky")
    assert d.members[0].pid == 10 and d.members[0].conn_id == "c10"


def test_second_member_gets_partitions_only_after_the_first_revokes_them():
    c = coordinator()
    a = join(c, conn="a")
    b = join(c, conn="b")
    # B joins at epoch 2; its target (t2, t3) is still held by A, so it gets nothing yet and A
    # is woken to learn about the revocation.
    assert (b.member_id, b.member_epoch, b.assignment) == ("m2", 2, frozenset())
    assert woken(b.effects) == {"m1"}
    assert member(c, "m2").state is MemberState.UNRELEASED_PARTITIONS
    assert c.describe("g").state is GroupState.RECONCILING

    # A heartbeats: keep t0, t1 (never interrupted), revoke t2, t3. Its epoch stays 1.
    r = hb(c, "m1", 1, a.assignment)
    assert (r.member_epoch, r.assignment) == (1, tps("t0 t1"))
    assert member(c, "m1").pending_revocation == tps("t2 t3")
    # B asks again meanwhile: still nothing, t2/t3 are not revoked yet.
    assert hb(c, "m2", 2, []).assignment == frozenset()

    # A reports the revocation: it moves to epoch 2 and B is woken...
    r = hb(c, "m1", 1, tps("t0 t1"))
    assert (r.member_epoch, r.assignment) == (2, tps("t0 t1"))
    assert woken(r.effects) == {"m2"}
    # ...and gets t2, t3 on its next heartbeat.
    r = hb(c, "m2", 2, [])
    assert (r.member_epoch, r.assignment) == (2, tps("t2 t3"))
    assert c.describe("g").state is GroupState.STABLE


def test_partially_reported_revocation_releases_what_was_revoked():
    c = coordinator()
    a = join(c)
    join(c)
    hb(c, "m1", 1, a.assignment)                      # told to revoke t2, t3
    r = hb(c, "m1", 1, tps("t0 t1 t3"))               # t2 done, t3 not yet
    assert r.member_epoch == 1 and member(c, "m1").pending_revocation == tps("t3")
    assert hb(c, "m2", 2, []).assignment == tps("t2")
    hb(c, "m1", 1, tps("t0 t1"))
    assert hb(c, "m2", 2, tps("t2")).assignment == tps("t2 t3")


def test_unreported_owned_partitions_are_assumed_started():
    c = coordinator()
    join(c)                                     # granted t0..t3, never reports them
    join(c)
    r = hb(c, "m1", 1, None)                    # "unchanged": the coordinator assumes it owns
    assert r.assignment == tps("t0 t1")         # them all, so t2, t3 wait for a revocation
    assert member(c, "m1").pending_revocation == tps("t2 t3")
    assert hb(c, "m2", 2, []).assignment == frozenset()


def test_granted_but_unreported_partitions_are_released_without_waiting():
    # The response granting t0..t3 was lost: the member reports owning nothing, so when the
    # target moves t2, t3 away there is nothing to wait for.
    c = coordinator()
    join(c)
    join(c)
    r = hb(c, "m1", 1, [])
    assert (r.member_epoch, r.assignment) == (2, tps("t0 t1"))
    assert woken(r.effects) == {"m2"}


def test_commits_for_revoked_partitions_use_the_old_epoch_until_revocation_is_reported():
    c = coordinator()
    a = join(c)
    join(c)
    hb(c, "m1", 1, a.assignment)
    assert c.validate_commit("g", "m1", 1) is None           # on_partitions_revoked commits
    hb(c, "m1", 1, tps("t0 t1"))
    assert c.validate_commit("g", "m1", 1) is errors.StaleMemberEpochError
    assert c.validate_commit("g", "m1", 2) is None


# --- death, leaving, timeouts --------------------------------------------------------------------

def test_dead_member_partitions_go_to_survivors_at_once():
    c = coordinator()
    a = join(c, pid=1, conn="a")
    join(c, pid=2, conn="b")
    hb(c, "m1", 1, a.assignment)
    hb(c, "m1", 1, tps("t0 t1"))
    hb(c, "m2", 2, [])
    effects = c.member_died(2, now_ms=5)
    assert [(r.member_id, r.reason) for r in effects.removed] == [("m2", "process died")]
    assert [(w.member_id, w.conn_id, w.pid) for w in effects.wakeups] == [("m1", "a", 1)]
    r = hb(c, "m1", 2, tps("t0 t1"))
    assert (r.member_epoch, r.assignment) == (3, tps("t0 t1 t2 t3"))


def test_dead_member_mid_revocation_frees_its_partitions_without_waiting():
    c = coordinator()
    a = join(c, pid=1)
    join(c, pid=2)
    hb(c, "m1", 1, a.assignment)                   # A must revoke t2, t3 and then dies
    effects = c.member_died(1, now_ms=1)
    assert woken(effects) == {"m2"}
    r = hb(c, "m2", 2, [])
    assert (r.member_epoch, r.assignment) == (3, tps("t0 t1 t2 t3"))


def test_connection_closed_removes_every_dynamic_member_of_that_connection():
    c = coordinator()
    join(c, group="g", conn="x")
    join(c, group="h", conn="x")
    join(c, group="g", conn="y")
    effects = c.connection_closed("x", now_ms=1)
    assert sorted((r.group_id, r.member_id) for r in effects.removed) == [("g", "m1"),
                                                                          ("h", "m2")]
    assert c.describe("h").state is GroupState.EMPTY
    assert [m.member_id for m in c.describe("g").members] == ["m3"]
    assert c.connection_closed("x", now_ms=2) == type(effects)()


def test_leave_by_heartbeat_and_by_call():
    c = coordinator()
    join(c)
    join(c)
    r = c.heartbeat("g", "m1", member_epoch=-1, now_ms=1)
    assert (r.error, r.member_epoch) == (None, -1) and woken(r.effects) == {"m2"}
    assert c.leave("g", "m1").error is errors.UnknownMemberIdError
    assert c.leave("g", "m2").error is None
    assert c.describe("g").state is GroupState.EMPTY
    assert c.leave("nope", "m2").error is errors.UnknownMemberIdError


def test_session_timeout_expires_a_silent_member():
    c = coordinator()
    assert c.next_deadline_ms() is None
    join(c, now=0, session_timeout_ms=1000)
    r = join(c, now=0, session_timeout_ms=1000)
    assert r.heartbeat_interval_ms == 333                 # at most a third of the session
    assert c.next_deadline_ms() == 1001
    hb(c, "m2", 2, [], now=800)
    assert c.tick(1000).removed == ()                      # not older than the timeout yet
    effects = c.tick(1001)
    assert [(x.member_id, x.reason) for x in effects.removed] == [("m1", "session timed out")]
    assert woken(effects) == {"m2"}
    assert hb(c, "m2", r.member_epoch, [], now=1002).assignment == tps("t0 t1 t2 t3")
    assert hb(c, "m1", 1, [], now=1003).error is errors.UnknownMemberIdError


def test_member_that_does_not_revoke_within_the_rebalance_timeout_is_removed():
    c = coordinator()
    a = join(c, now=0, rebalance_timeout_ms=500)
    join(c, now=0)
    hb(c, "m1", 1, a.assignment, now=100)                  # must revoke by 600
    hb(c, "m2", 2, [], now=600)
    hb(c, "m1", 1, a.assignment, now=600)                  # alive but still holding t2, t3
    assert c.tick(600).removed == ()
    effects = c.tick(601)
    assert [x.reason for x in effects.removed] == ["did not revoke within the rebalance timeout"]
    assert hb(c, "m2", 2, [], now=602).assignment == tps("t0 t1 t2 t3")


# --- static membership ---------------------------------------------------------------------------

def test_static_member_restart_takes_its_partitions_back_without_a_rebalance():
    c = coordinator()
    a = join(c, pid=1, conn="a", instance_id="i-a", session_timeout_ms=10_000)
    hb(c, "m1", 1, a.assignment)
    join(c, pid=2, conn="b")
    hb(c, "m1", 1, a.assignment)
    hb(c, "m1", 1, tps("t0 t1"))
    hb(c, "m2", 2, [])
    before = c.describe("g")
    assert before.group_epoch == 2

    effects = c.member_died(1, now_ms=100)                 # kill -9
    assert effects.removed == () and [x.member_id for x in effects.departed] == ["m1"]
    assert effects.wakeups == ()                           # nobody else is disturbed
    assert member(c, "m1").departed and member(c, "m1").assigned == tps("t0 t1")

    r = join(c, pid=3, conn="c", instance_id="i-a", now=200, session_timeout_ms=10_000)
    assert (r.member_id, r.member_epoch, r.assignment) == ("m3", 2, tps("t0 t1"))
    assert c.describe("g").group_epoch == 2 and woken(r.effects) == set()
    assert [m.member_id for m in c.describe("g").members] == ["m2", "m3"]
    # The old incarnation is fenced.
    assert hb(c, "m1", 2, [], instance_id="i-a").error is errors.FencedInstanceIdError
    assert hb(c, "m1", 2, []).error is errors.UnknownMemberIdError
    assert c.validate_commit("g", "m1", 2) is errors.UnknownMemberIdError
    assert c.validate_commit("g", "m3", 2) is None
    # A late leave from the old incarnation cannot remove the new one.
    assert c.leave("g", "m1", instance_id="i-a").error is errors.FencedInstanceIdError
    assert c.heartbeat("g", "m1", member_epoch=-1, instance_id="i-a",
                       now_ms=300).error is errors.FencedInstanceIdError
    assert "m3" in {m.member_id for m in c.describe("g").members}
    # An admin removes a static member by instance id alone.
    assert c.leave("g", "", instance_id="i-a").error is None
    assert [m.member_id for m in c.describe("g").members] == ["m2"]


def test_static_member_subscription_change_on_restart_bumps_the_epoch():
    c = coordinator({"t": 2, "u": 2})
    join(c, instance_id="i", pid=1)
    c.member_died(1, now_ms=1)
    r = join(c, topics=("t", "u"), instance_id="i", now=2)
    assert r.member_epoch == 2 and r.assignment == tps("t0 t1 u0 u1")


def test_departed_static_member_is_reserved_until_its_session_times_out():
    c = coordinator()
    join(c, conn="a", instance_id="i-a", session_timeout_ms=1000, now=0)
    join(c, conn="b", session_timeout_ms=5000, now=0)
    hb(c, "m1", 1, tps("t0 t1 t2 t3"), now=0)
    hb(c, "m1", 1, tps("t0 t1"), now=0)
    c.connection_closed("a", now_ms=10)
    assert c.tick(1000).removed == ()
    hb(c, "m2", 2, [], now=1000)
    assert member(c, "m2").assigned == tps("t2 t3")        # t0, t1 stay reserved
    assert hb(c, "m1", 2, tps("t0 t1"), now=1000).error is errors.FencedMemberEpochError
    effects = c.tick(1001)
    assert [x.member_id for x in effects.removed] == ["m1"] and woken(effects) == {"m2"}
    assert hb(c, "m2", 2, tps("t2 t3"), now=1002).assignment == tps("t0 t1 t2 t3")


def test_departed_static_member_frees_partitions_it_was_revoking():
    c = coordinator()
    a = join(c, conn="a", instance_id="i-a")
    join(c, conn="b")
    hb(c, "m1", 1, a.assignment)                           # revoking t2, t3
    effects = c.connection_closed("a", now_ms=1)
    assert woken(effects) == {"m2"}
    assert hb(c, "m2", 2, []).assignment == tps("t2 t3")
    assert member(c, "m1").assigned == tps("t0 t1")


def test_static_leave_temporarily_or_for_good():
    c = coordinator()
    join(c, instance_id="i")
    join(c)
    r = c.heartbeat("g", "m1", member_epoch=-2, instance_id="i", now_ms=1)
    assert r.error is None and [x.member_id for x in r.effects.departed] == ["m1"]
    assert c.describe("g").group_epoch == 2
    assert c.leave("g", "m1").error is None              # now for good: a rebalance
    assert c.describe("g").group_epoch == 3


def test_instance_id_in_use_by_a_live_member_is_refused():
    c = coordinator()
    join(c, instance_id="i", conn="a")
    r = c.heartbeat("g", None, member_epoch=0, instance_id="i", subscription=["t"], now_ms=1)
    assert r.error is errors.UnreleasedInstanceIdError
    assert "m1" in r.error_message


# --- fencing -------------------------------------------------------------------------------------

def test_fencing_errors():
    c = coordinator()
    a = join(c)
    assert hb(c, "m1", 2, a.assignment).error is errors.FencedMemberEpochError   # from the future
    assert hb(c, "nobody", 1, []).error is errors.UnknownMemberIdError
    assert hb(c, "m1", 1, [], group="other").error is errors.UnknownMemberIdError
    assert errors.FencedMemberEpochError.code == 110 and errors.UnknownMemberIdError.code == 25
    join(c)                                          # epoch 2
    hb(c, "m1", 1, a.assignment)
    hb(c, "m1", 1, tps("t0 t1"))                     # m1 now at epoch 2, previous 1
    # A lost response: the previous epoch is fine while owned is a subset of the assignment...
    r = hb(c, "m1", 1, tps("t0 t1"))
    assert (r.error, r.member_epoch) == (None, 2)
    # ...but not with partitions it should not have.
    assert hb(c, "m1", 1, tps("t0 t1 t2")).error is errors.FencedMemberEpochError


def test_fenced_member_rejoins_with_epoch_zero_and_loses_what_it_does_not_report():
    c = coordinator()
    join(c)
    r = hb(c, "m1", 0, [], subscription=["t"])       # rejoin with the same id, owning nothing
    assert (r.member_id, r.member_epoch, r.assignment) == ("m1", 1, tps("t0 t1 t2 t3"))
    assert c.describe("g").group_epoch == 1


def test_validate_commit():
    c = coordinator()
    assert c.validate_commit("g", "", -1) is None          # no group yet: group-less commit
    a = join(c)
    assert c.validate_commit("g", "", -1) is errors.UnknownMemberIdError
    assert c.validate_commit("g", "m1", a.member_epoch) is None
    assert c.validate_commit("g", "m1", 7) is errors.StaleMemberEpochError
    assert c.validate_commit("g", "zz", 1) is errors.UnknownMemberIdError
    c.leave("g", "m1")
    assert c.validate_commit("g", "", -1) is None          # empty again
    assert c.validate_commit("g", "m1", 1) is errors.UnknownMemberIdError


# --- rebalance triggers --------------------------------------------------------------------------

def test_more_partitions_bump_the_epoch_and_are_assigned():
    c = coordinator({"t": 2})
    a = join(c, conn="a")
    join(c, conn="b")
    hb(c, "m1", 1, a.assignment)
    hb(c, "m1", 1, tps("t0"))
    hb(c, "m2", 2, [])
    effects = c.set_topic_partitions("t", 4)
    assert woken(effects) == {"m1", "m2"} and c.describe("g").group_epoch == 3
    assert hb(c, "m1", 2, tps("t0")).assignment == tps("t0 t2")
    assert hb(c, "m2", 2, tps("t1")).assignment == tps("t1 t3")
    assert c.set_topic_partitions("t", 4).wakeups == ()               # no change, no bump
    assert c.set_topic_partitions("other", 3).wakeups == ()           # not subscribed


def test_subscription_change_revokes_the_dropped_topic():
    c = coordinator({"t": 2, "u": 2})
    a = join(c, topics=("t", "u"))
    r = hb(c, "m1", 1, a.assignment, subscription=["u"])
    assert (r.member_epoch, r.assignment) == (1, tps("u0 u1"))
    assert c.describe("g").group_epoch == 2
    r = hb(c, "m1", 1, tps("u0 u1"))
    assert (r.member_epoch, r.assignment) == (2, tps("u0 u1"))


def test_topic_deletion_revokes_its_partitions():
    c = coordinator({"t": 2, "u": 1})
    a = join(c, topics=("t", "u"))
    assert woken(c.delete_topic("u")) == {"m1"}
    assert hb(c, "m1", 1, a.assignment).assignment == tps("t0 t1")


def test_pattern_subscription_picks_up_new_topics_but_not_internal_ones():
    c = coordinator({"orders-eu": 1, "payments": 1, "__consumer_offsets": 50})
    r = join(c, subscription=re.compile(r"orders-.*"))
    assert r.assignment == tps("orders-eu0")
    assert woken(c.set_topic_partitions("orders-us", 2)) == {"m1"}
    r = hb(c, "m1", r.member_epoch, r.assignment)
    assert r.assignment == tps("orders-eu0 orders-us0 orders-us1")
    assert c.set_topic_partitions("invoices", 1).wakeups == ()
    d = member(c, "m1")
    assert (d.subscribed_pattern, d.subscribed_topics) == ("orders-.*", None)
    # A pattern given as text, and ".*" never matches internal topics.
    r = join(c, group="h", subscription=None, subscribed_pattern=".*")
    assert {t for t, _ in r.assignment} == {"orders-eu", "orders-us", "payments", "invoices"}


def test_explicit_subscription_to_a_topic_created_later():
    c = coordinator({})
    r = join(c, topics=("later",))
    assert r.assignment == frozenset()
    assert woken(c.set_topic_partitions("later", 2)) == {"m1"}
    assert hb(c, "m1", 1, []).assignment == tps("later0 later1")


def test_groups_are_independent_and_choose_their_assignor():
    c = coordinator({"t": 3, "u": 3})
    for g, assignor in (("g-range", "range"), ("g-rr", "roundrobin")):
        join(c, group=g, topics=("t", "u"), assignor=assignor)
        join(c, group=g, topics=("t", "u"), assignor=assignor)
    range_target = {m.member_id: m.target for m in c.describe("g-range").members}
    rr_target = {m.member_id: m.target for m in c.describe("g-rr").members}
    assert range_target == {"m1": tps("t0 t1 u0 u1"), "m2": tps("t2 u2")}
    assert rr_target == {"m3": tps("t0 t2 u1"), "m4": tps("t1 u0 u2")}
    assert c.describe("g-rr").assignor == "roundrobin"
    # The most wanted assignor wins; a tie keeps the current one.
    join(c, group="g-rr", topics=("t",), assignor="range")
    assert c.describe("g-rr").assignor == "roundrobin"
    join(c, group="g-rr", topics=("t",), assignor="range")
    assert c.describe("g-rr").assignor == "roundrobin"            # 2:2
    join(c, group="g-rr", topics=("t",), assignor="range")
    assert c.describe("g-rr").assignor == "range"                 # 2:3
    r = c.heartbeat("g", None, subscription=["t"], assignor="nope", now_ms=0)
    assert r.error is errors.UnsupportedAssignorError


# --- broker restart ------------------------------------------------------------------------------

def test_rejoining_members_keep_what_they_own_after_a_broker_restart():
    c = coordinator()
    a = join(c)
    join(c)
    hb(c, "m1", 1, a.assignment)
    hb(c, "m1", 1, tps("t0 t1"))
    hb(c, "m2", 2, [])

    fresh = coordinator(now_ms=1000, restart_grace_ms=500)
    r1 = hb(fresh, "m1", 0, tps("t0 t1"), now=1001, subscription=["t"])
    # Alone in the group its target is everything, but t2, t3 may still be consumed by a
    # member that has not rejoined yet: they are withheld during the grace period.
    assert (r1.member_id, r1.assignment) == ("m1", tps("t0 t1"))
    r2 = hb(fresh, "m2", 0, tps("t2 t3"), now=1002, subscription=["t"])
    assert r2.assignment == tps("t2 t3")
    r1 = hb(fresh, "m1", r1.member_epoch, tps("t0 t1"), now=1003)
    assert r1.assignment == tps("t0 t1") and fresh.describe("g").state is GroupState.STABLE


def test_restart_grace_withholds_unclaimed_partitions_until_it_ends():
    c = coordinator(now_ms=0, restart_grace_ms=500)
    r = join(c, now=10, conn="a")
    assert r.assignment == frozenset() and c.next_deadline_ms() == 500
    assert c.tick(499).wakeups == ()
    effects = c.tick(500)
    assert woken(effects) == {"m1"}
    assert hb(c, "m1", r.member_epoch, [], now=501).assignment == tps("t0 t1 t2 t3")


def test_partitions_created_during_the_grace_are_not_withheld():
    c = coordinator({}, now_ms=0, restart_grace_ms=500)
    join(c, now=1)
    c.set_topic_partitions("t", 2)
    assert hb(c, "m1", 1, [], now=2).assignment == tps("t0 t1")


# --- describe, list, delete, bad input -----------------------------------------------------------

def test_describe_list_and_delete_groups():
    c = coordinator()
    assert c.describe("nope").state is GroupState.DEAD
    join(c, pid=4, conn="x", instance_id="i", assignor="range")
    d = c.describe("g")
    m = d.members[0]
    assert (m.member_id, m.instance_id, m.pid, m.subscribed_topics, m.assignor) == (
        "m1", "i", 4, ("t",), "range")
    assert (m.assigned, m.target, m.state, m.member_epoch) == (
        tps("t0 t1 t2 t3"), tps("t0 t1 t2 t3"), MemberState.STABLE, 1)
    assert [(x.group_id, x.state, x.members) for x in c.list_groups()] == [
        ("g", GroupState.STABLE, 1)]
    assert c.delete_group("g") is errors.NonEmptyGroupError
    c.leave("g", "m1")
    assert c.delete_group("g") is None
    assert c.delete_group("g") is errors.GroupIdNotFoundError
    assert c.list_groups() == []


@pytest.mark.parametrize("kwargs, error", [
    ({"group_id": ""}, errors.InvalidGroupIdError),
    ({"subscription": None}, errors.InvalidRequestError),
    ({"subscription": "t"}, errors.InvalidRequestError),
    ({"subscription": ["t"], "subscribed_pattern": "t"}, errors.InvalidRequestError),
    ({"subscription": None, "subscribed_pattern": "("}, errors.InvalidRegularExpressionError),
    ({"owned_partitions": [("t", "0")]}, errors.InvalidRequestError),
    ({"session_timeout_ms": 1}, errors.InvalidSessionTimeoutError),
    ({"member_id": None, "member_epoch": 3}, errors.InvalidRequestError),
    ({"rebalance_timeout_ms": 0}, errors.InvalidRequestError),
])
def test_bad_requests_are_answered_with_an_error(kwargs, error):
    c = coordinator()
    args = {"group_id": "g", "member_id": None, "member_epoch": 0, "subscription": ["t"],
            "now_ms": 0} | kwargs
    r = c.heartbeat(args.pop("group_id"), args.pop("member_id"), **args)
    assert r.error is error and r.error_message
    assert c.describe("g").state is GroupState.DEAD          # no group was created


def test_group_max_size():
    c = coordinator(max_group_size=1)
    join(c)
    r = c.heartbeat("g", None, subscription=["t"], now_ms=0)
    assert r.error is errors.GroupMaxSizeReachedError


def test_owned_partitions_accept_msgpack_lists():
    c = coordinator()
    a = join(c)
    r = hb(c, "m1", a.member_epoch, [["t", 0], ["t", 1], ["t", 2], ["t", 3]])
    assert r.error is None and member(c, "m1").owned == tps("t0 t1 t2 t3")


# --- the state machine ---------------------------------------------------------------------------

SESSION_MS = 1_000
REBALANCE_MS = 2_000
GRACE_MS = 500
SUBSCRIPTIONS = [("a",), ("a", "b"), ("b", "c"), ("c",), re.compile("a|c"), re.compile(".*"),
                 re.compile("b.*")]
LIVE = ("active", "hung")


@dataclasses.dataclass(eq=False)
class Client:
    """A consumer process as the coordinator's contract expects it to behave."""
    group: str
    member_id: str | None
    instance_id: str | None
    pid: int
    conn: int
    subscription: object
    assignor: str
    epoch: int = 0
    owned: frozenset = frozenset()
    status: str = "active"      # active | hung | zombie (expired while hung) | dead | gone
    wake_pending: bool = True


class GroupMachine(RuleBasedStateMachine):
    """Random joins, leaves, deaths, hangs, lost responses, topic changes and broker restarts.

    Invariants: no partition is held by two members (coordinator view) or owned by two live
    clients; every live client owns only what the coordinator granted it; a partition that
    stays in a member's target is never taken from it; a member not woken would get the same
    answer from a heartbeat now (no missed wake-ups); the ``settle`` rule checks that every
    subscribed partition ends up assigned exactly once and every group Stable.
    """

    @initialize()
    def setup(self):
        self.now = 0
        self.topics = {"a": 2, "b": 3, "__internal": 1}
        self.ids = (f"m{i}" for i in itertools.count(1))
        self.pids = itertools.count(100)
        self.clients: list[Client] = []
        self.coord = self._new_coordinator(grace=0)

    def _new_coordinator(self, grace: int) -> GroupCoordinator:
        return GroupCoordinator(dict(self.topics), now_ms=self.now, restart_grace_ms=grace,
                                member_id_factory=lambda: next(self.ids))

    # -- helpers ---------------------------------------------------------------------------------

    def _effects(self, effects):
        for w in effects.wakeups:
            for c in self.clients:
                if c.member_id == w.member_id and c.group == w.group_id:
                    c.wake_pending = True
        for r in effects.removed:
            for c in self.clients:
                if c.member_id == r.member_id and c.group == r.group_id:
                    assert c.status != "active", f"an active client was removed: {r}"
                    if c.status == "hung":
                        c.status = "zombie"

    def _member(self, c: Client):
        for m in self.coord.describe(c.group).members:
            if m.member_id == c.member_id:
                return m
        return None

    def _heartbeat(self, c: Client, lose_response=False, subscription=None, join=False):
        epoch = 0 if join else c.epoch
        r = self.coord.heartbeat(
            c.group, c.member_id, member_epoch=epoch, instance_id=c.instance_id,
            subscription=(c.subscription if join else subscription), owned_partitions=c.owned,
            assignor=c.assignor, now_ms=self.now, pid=c.pid, conn_id=c.conn,
            rebalance_timeout_ms=REBALANCE_MS, session_timeout_ms=SESSION_MS)
        self._effects(r.effects)
        if r.error is errors.FencedInstanceIdError:
            c.status, c.owned = "gone", frozenset()    # another process took the instance id
            return r
        if r.error is not None:
            assert r.error in (errors.UnknownMemberIdError, errors.FencedMemberEpochError), r
            assert not join, r
            c.owned, c.epoch = frozenset(), 0          # on_partitions_lost, then rejoin
            return self._heartbeat(c, join=True)
        if lose_response:
            c.wake_pending = True                      # the client times out and retries
            return r
        c.member_id = r.member_id
        m = self._member(c)
        assert c.owned & m.target <= r.assignment, "a kept partition was taken away"
        c.member_id, c.epoch, c.owned = r.member_id, r.member_epoch, r.assignment
        c.wake_pending = False
        return r

    def _active(self):
        return [c for c in self.clients if c.status == "active"]

    def _expected(self, group: str) -> set:
        subscribed = set()
        for m in self.coord.describe(group).members:
            for topic in self.topics:
                if m.subscribed_pattern is not None:
                    hit = not topic.startswith("__") and re.fullmatch(m.subscribed_pattern,
                                                                      topic)
                else:
                    hit = topic in m.subscribed_topics
                if hit:
                    subscribed.add(topic)
        return {(t, p) for t in subscribed for p in range(self.topics[t])}

    # -- rules -----------------------------------------------------------------------------------

    @precondition(lambda self: sum(c.status in LIVE for c in self.clients) < 7)
    @rule(group=st.sampled_from(["g1", "g2"]), subscription=st.sampled_from(SUBSCRIPTIONS),
          instance=st.sampled_from([None, None, "i1", "i2", "i3"]),
          assignor=st.sampled_from(["sticky", "range", "roundrobin"]))
    def join(self, group, subscription, instance, assignor):
        if instance is not None and any(c.instance_id == instance and c.group == group
                                        and c.status in LIVE for c in self.clients):
            instance = None
        c = Client(group, None, instance, next(self.pids), next(self.pids), subscription,
                   assignor)
        self.clients.append(c)
        epoch_before = self.coord.describe(group).group_epoch
        departed = {m.instance_id: m for m in self.coord.describe(group).members if m.departed}
        r = self._heartbeat(c, join=True)
        old = departed.get(instance)
        if old is not None and (old.subscribed_pattern, old.subscribed_topics) == \
                (getattr(subscription, "pattern", None),
                 None if isinstance(subscription, re.Pattern) else tuple(sorted(subscription))) \
                and old.assignor == assignor:
            # A static restart: the reserved partitions come back with no rebalance.
            assert self.coord.describe(group).group_epoch == epoch_before
            assert old.assigned <= r.assignment

    @rule(data=st.data(), lose=st.booleans())
    def heartbeat(self, data, lose):
        active = self._active()
        if active:
            self._heartbeat(data.draw(st.sampled_from(active)), lose_response=lose)

    @rule(data=st.data(), subscription=st.sampled_from(SUBSCRIPTIONS))
    def change_subscription(self, data, subscription):
        active = self._active()
        if active:
            c = data.draw(st.sampled_from(active))
            c.subscription = subscription
            self._heartbeat(c, subscription=subscription)

    @rule(data=st.data())
    def die(self, data):
        live = [c for c in self.clients if c.status in LIVE]
        if live:
            c = data.draw(st.sampled_from(live))
            c.status, c.owned = "dead", frozenset()
            self._effects(self.coord.member_died(c.pid, self.now))

    @rule(data=st.data(), how=st.sampled_from(["close", "leave", "leave-temporarily"]))
    def go_away(self, data, how):
        active = self._active()
        if not active:
            return
        c = data.draw(st.sampled_from(active))
        c.status, c.owned = "gone", frozenset()          # revoke everything, then go
        if how == "close":
            self._effects(self.coord.connection_closed(c.conn, self.now))
        else:
            epoch = -2 if how == "leave-temporarily" and c.instance_id else -1
            r = self.coord.heartbeat(c.group, c.member_id, member_epoch=epoch,
                                     instance_id=c.instance_id, now_ms=self.now)
            assert r.error is None
            self._effects(r.effects)

    @rule(data=st.data())
    def hang(self, data):
        active = self._active()
        if active:
            data.draw(st.sampled_from(active)).status = "hung"

    @rule(data=st.data())
    def unhang(self, data):
        stuck = [c for c in self.clients if c.status in ("hung", "zombie")]
        if stuck:
            c = data.draw(st.sampled_from(stuck))
            c.status = "active"
            self._heartbeat(c)                 # a zombie learns it was expelled, and rejoins

    @rule(topic=st.sampled_from(["a", "b", "c"]), more=st.integers(1, 2))
    def add_partitions(self, topic, more):
        count = min(self.topics.get(topic, 0) + more, 6)
        self.topics[topic] = count
        self._effects(self.coord.set_topic_partitions(topic, count))

    def _answer_wakeups(self):
        for _ in range(5):     # clients answer wake-ups and retry lost responses promptly
            for c in self._active():
                if c.wake_pending:
                    self._heartbeat(c)

    @rule(ms=st.integers(1, 2_500))
    def advance_time(self, ms):
        self._answer_wakeups()
        self.now += ms
        for c in self._active():
            self._heartbeat(c)
        self._effects(self.coord.tick(self.now))

    @rule(data=st.data())
    def restart_broker(self, data):
        self.coord = self._new_coordinator(grace=GRACE_MS)
        for c in self.clients:
            if c.status == "hung":
                c.status = "zombie"
        order = data.draw(st.permutations(self._active()))
        for c in order:                                  # rejoin, reporting what they own
            before = c.owned
            self._heartbeat(c, join=True)
            assert before & self._member(c).target <= c.owned

    @rule()
    def settle(self):
        self._answer_wakeups()
        self.now += 10 * SESSION_MS
        for c in self._active():
            self._heartbeat(c)
        self._effects(self.coord.tick(self.now))
        for _ in range(20):
            before = [(c.epoch, c.owned) for c in self._active()]
            for c in self._active():
                self._heartbeat(c)
            if before == [(c.epoch, c.owned) for c in self._active()]:
                break
        else:
            raise AssertionError("heartbeats did not settle")
        for group in ("g1", "g2"):
            d = self.coord.describe(group)
            if not d.members:
                continue
            assert d.state is GroupState.STABLE, d
            assigned = [tp for m in d.members for tp in m.assigned]
            assert len(assigned) == len(set(assigned))
            assert set(assigned) == self._expected(group), "a subscribed partition is unassigned"
            for c in self._active():
                if c.group == group:
                    m = self._member(c)
                    assert c.owned == m.assigned == m.target

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def nobody_shares_a_partition(self):
        for group in ("g1", "g2"):
            held = [tp for m in self.coord.describe(group).members
                    for tp in m.assigned | m.pending_revocation]
            assert len(held) == len(set(held)), "the coordinator granted a partition twice"
            owned = [tp for c in self.clients if c.group == group and c.status in LIVE
                     for tp in c.owned]
            assert len(owned) == len(set(owned)), "two live clients own the same partition"
        for c in self.clients:
            if c.status in LIVE:
                m = self._member(c)
                assert m is not None, "a live client is not a member"
                assert c.owned <= m.assigned | m.pending_revocation, "owned but not granted"

    @invariant()
    def no_missed_wakeups(self):
        for c in self._active():
            if not c.wake_pending:
                group = self.coord.groups[c.group]
                _, epoch, assigned, _ = self.coord._next(group, group.members[c.member_id])
                assert (epoch, assigned) == (c.epoch, c.owned), "a member was not woken"


GroupMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50,
                                          deadline=None)
test_group_coordinator_state_machine = GroupMachine.TestCase
