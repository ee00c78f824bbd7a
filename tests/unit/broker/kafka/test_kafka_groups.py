"""Consumer groups for Kafka clients, without sockets: the consumer-protocol translation, the
classic member's heartbeat in the pure coordinator (eager and cooperative hand-overs), and
the JoinGroup/SyncGroup/Heartbeat/LeaveGroup handlers over a coordinator.

A partition is a ``("t", n)`` pair; the topic "t" has 4 partitions.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from mq import errors
from mq.broker.group_coordinator import GroupCoordinator
from mq.broker.kafka.group_admin import GroupAdminApis, commit_offsets, fetch_rows
from mq.broker.kafka.groups import (
    GroupWireApis,
    assignment_bytes,
    by_topic,
    parse_subscription_metadata,
)
from mq.protocol.kafka.codec import decode_data, encode_data
from mq.protocol.messages import Response

ALL = frozenset(("t", p) for p in range(4))


def subscription(topics=("t",), owned=(), version=1) -> bytes:
    return encode_data("ConsumerProtocolSubscription", version, {
        "topics": list(topics), "user_data": None,
        "owned_partitions": [{"topic": t, "partitions": ps}
                             for t, ps in by_topic(owned).items()]})


def assigned(blob: bytes) -> frozenset:
    _, body = decode_data("ConsumerProtocolAssignment", blob)
    return frozenset((row["topic"], p) for row in body["assigned_partitions"]
                     for p in row["partitions"])


# --- translation ---------------------------------------------------------------------------------

def test_the_subscription_of_the_first_protocol_with_its_owned_partitions():
    protocols = [{"name": "cooperative-sticky",
                  "metadata": subscription(("t", "u"), {("t", 2), ("t", 0)})},
                 {"name": "range", "metadata": subscription(("x",))}]
    assert parse_subscription_metadata(protocols) == \
        ("cooperative-sticky", ["t", "u"], [["t", 0], ["t", 2]])
    # version 0 (eager clients) has no owned partitions
    assert parse_subscription_metadata([{"name": "range",
                                         "metadata": subscription(version=0)}]) == \
        ("range", ["t"], [])


@pytest.mark.parametrize("protocols", [[], [{"name": "range", "metadata": b"\x00"}]])
def test_a_join_without_a_readable_subscription_is_refused(protocols):
    with pytest.raises(ValueError):
        parse_subscription_metadata(protocols)


def test_an_assignment_round_trips_through_the_consumer_protocol():
    parts = {("u", 1), ("t", 3), ("t", 0)}
    assert assigned(assignment_bytes(parts)) == parts
    assert assigned(assignment_bytes(())) == frozenset()


def test_offset_commit_and_fetch_rows():
    topics = [{"name": "t", "partitions": [
        {"partition_index": 1, "committed_offset": 5, "committed_leader_epoch": -1,
         "committed_metadata": None},
        {"partition_index": 2, "committed_offset": 7, "committed_leader_epoch": 3,
         "committed_metadata": "m"}]}]
    assert commit_offsets(topics) == [["t", 1, 5, -1, ""], ["t", 2, 7, 3, "m"]]
    rows = [["t", 1, 5, -1, "", 100, 0], ["u", 0, -1, -1, "", -1, 88]]
    assert fetch_rows(rows, 7) == [
        {"name": "t", "partitions": [{"partition_index": 1, "committed_offset": 5,
                                      "committed_leader_epoch": -1, "metadata": "",
                                      "error_code": 0}]},
        {"name": "u", "partitions": [{"partition_index": 0, "committed_offset": -1,
                                      "committed_leader_epoch": -1, "metadata": "",
                                      "error_code": 88}]}]


# --- the classic heartbeat in the coordinator --------------------------------------------------

def coordinator() -> GroupCoordinator:
    ids = (f"m{i}" for i in itertools.count(1))
    return GroupCoordinator({"t": 4}, member_id_factory=lambda: next(ids))


def classic_join(c, member_id=None, owned=(), now=0):
    r = c.heartbeat("g", member_id, member_epoch=0, subscription=["t"],
                    owned_partitions=[list(tp) for tp in owned], now_ms=now)
    assert r.error is None, r
    return r


def holders(c) -> list[frozenset]:
    return [m.assigned | m.pending_revocation for m in c.describe("g").members]


def disjoint(c) -> bool:
    sets = holders(c)
    return sum(map(len, sets)) == len(frozenset().union(*sets))


def test_eager_members_hand_over_only_after_the_owner_rejoined_without_it():
    c = coordinator()
    a = classic_join(c)
    assert a.assignment == ALL
    b = classic_join(c)                     # B's target is taken from A, which still has it
    assert b.assignment == frozenset() and disjoint(c)
    assert c.classic_heartbeat("g", "m2", generation=b.member_epoch, now_ms=1) == (None, False)
    assert c.classic_heartbeat("g", "m1", generation=a.member_epoch, now_ms=1) == (None, True)
    a = classic_join(c, "m1", now=2)        # an eager client revoked all before rejoining
    assert len(a.assignment) == 2 and disjoint(c)
    assert c.classic_heartbeat("g", "m2", generation=b.member_epoch, now_ms=3) == (None, True)
    b = classic_join(c, "m2", now=4)
    assert a.assignment | b.assignment == ALL and disjoint(c)
    for member_id, r in (("m1", a), ("m2", b)):
        assert c.classic_heartbeat("g", member_id, generation=r.member_epoch, now_ms=5) == \
            (None, False)


def test_a_cooperative_member_keeps_what_stays_and_is_asked_again_until_it_revoked():
    c = coordinator()
    a = classic_join(c)
    b = classic_join(c)
    a2 = classic_join(c, "m1", owned=ALL, now=1)      # reports what it owns
    kept = a2.assignment
    assert len(kept) == 2 and a2.member_epoch == a.member_epoch
    # still holding the other two: asked to rejoin, and B cannot have them yet
    assert c.classic_heartbeat("g", "m1", generation=a2.member_epoch, now_ms=2) == (None, True)
    assert c.classic_heartbeat("g", "m2", generation=b.member_epoch, now_ms=2) == (None, False)
    a3 = classic_join(c, "m1", owned=kept, now=3)
    assert a3.assignment == kept
    assert c.classic_heartbeat("g", "m2", generation=b.member_epoch, now_ms=4) == (None, True)
    assert classic_join(c, "m2", now=5).assignment == ALL - kept and disjoint(c)


def test_classic_heartbeat_errors():
    c = coordinator()
    a = classic_join(c)
    assert c.classic_heartbeat("g", "m1", generation=a.member_epoch + 1, now_ms=1)[0] is \
        errors.IllegalGenerationError
    assert c.classic_heartbeat("g", "nobody", generation=1, now_ms=1)[0] is \
        errors.UnknownMemberIdError
    assert c.classic_heartbeat("nogroup", "m1", generation=1, now_ms=1)[0] is \
        errors.UnknownMemberIdError
    s = c.heartbeat("g", None, member_epoch=0, instance_id="i", subscription=["t"], now_ms=1)
    assert c.classic_heartbeat("g", "m1", generation=a.member_epoch, instance_id="i",
                               now_ms=2)[0] is errors.FencedInstanceIdError
    assert c.classic_heartbeat("g", s.member_id, generation=s.member_epoch, instance_id="i",
                               now_ms=2)[0] is None


def test_the_classic_heartbeat_keeps_a_member_alive_past_its_session_timeout():
    c = coordinator()
    r = c.heartbeat("g", None, member_epoch=0, subscription=["t"], now_ms=0,
                    session_timeout_ms=100)
    for now in range(50, 500, 50):
        c.tick(now)
        assert c.classic_heartbeat("g", r.member_id, generation=r.member_epoch,
                                   now_ms=now)[0] is None
    c.tick(700)
    assert c.describe("g").members == ()


def test_a_member_told_to_rejoin_that_never_does_is_removed_after_its_rebalance_timeout():
    c = coordinator()
    a = c.heartbeat("g", None, member_epoch=0, subscription=["t"], now_ms=0,
                    rebalance_timeout_ms=1_000, session_timeout_ms=60_000)
    b = classic_join(c)
    for now in (100, 600):          # heartbeats on, but no rejoin
        assert c.classic_heartbeat("g", a.member_id, generation=a.member_epoch,
                                   now_ms=now) == (None, True)
        c.tick(now)
    c.tick(1_200)
    assert [m.member_id for m in c.describe("g").members] == [b.member_id]
    assert c.classic_heartbeat("g", b.member_id, generation=b.member_epoch,
                               now_ms=1_300) == (None, True)    # A's partitions are free


def test_the_rejoin_deadline_goes_when_its_reason_does():
    c = coordinator()
    a = c.heartbeat("g", None, member_epoch=0, subscription=["t"], now_ms=0,
                    rebalance_timeout_ms=1_000, session_timeout_ms=60_000)
    b = classic_join(c)
    assert c.classic_heartbeat("g", a.member_id, generation=a.member_epoch, now_ms=100)[1]
    c.leave("g", b.member_id)              # B leaves before A rejoined: A keeps everything
    a2 = classic_join(c, a.member_id, owned=ALL, now=150)
    assert a2.assignment == ALL
    assert c.classic_heartbeat("g", a.member_id, generation=a2.member_epoch,
                               now_ms=200) == (None, False)
    c.tick(5_000)
    assert [m.member_id for m in c.describe("g").members] == [a.member_id]


def test_sync_sends_a_member_back_only_when_it_has_nothing_to_revoke():
    c = coordinator()
    classic_join(c)                                       # m1, then m2
    b = classic_join(c)
    a2 = classic_join(c, "m1", owned=ALL, now=1)          # cooperative: two to give up
    assert c.classic_heartbeat("g", "m1", generation=a2.member_epoch, sync=True,
                               now_ms=2) == (None, False)
    classic_join(c, "m1", owned=a2.assignment, now=3)     # revoked: B's are free now
    assert c.classic_heartbeat("g", "m2", generation=b.member_epoch, sync=True,
                               now_ms=4) == (None, True)


# --- the handlers --------------------------------------------------------------------------------

class FakeGroupApis:
    """``GroupApis``' member methods over a bare coordinator (what the handlers call)."""

    def __init__(self) -> None:
        self.coordinator = coordinator()
        self.now = 0

    def member_heartbeat(self, group, member_id, *, member_epoch, instance_id, topics,
                         pattern, assignor, owned, pid, conn_id, rebalance_timeout_ms,
                         session_timeout_ms):
        return self.coordinator.heartbeat(
            group, member_id, member_epoch=member_epoch, instance_id=instance_id,
            subscription=topics, subscribed_pattern=pattern, assignor=assignor,
            owned_partitions=owned, now_ms=self.now, pid=pid, conn_id=conn_id,
            rebalance_timeout_ms=None if rebalance_timeout_ms < 0 else rebalance_timeout_ms,
            session_timeout_ms=None if session_timeout_ms < 0 else session_timeout_ms)

    def classic_heartbeat(self, group, member_id, *, generation, instance_id, sync=False):
        return self.coordinator.classic_heartbeat(group, member_id, generation=generation,
                                                  instance_id=instance_id, sync=sync,
                                                  now_ms=self.now)

    def leave_member(self, group, member_id, *, instance_id=None, temporary=False):
        return self.coordinator.leave(group, member_id, instance_id=instance_id,
                                      temporary=temporary).error


CONN = SimpleNamespace(client_id="app", peer="127.0.0.1:5555")


def join_body(member_id="", instance_id=None, protocols=("range",), owned=()):
    return {"group_id": "g", "session_timeout_ms": 10_000, "rebalance_timeout_ms": 30_000,
            "member_id": member_id, "group_instance_id": instance_id,
            "protocol_type": "consumer", "reason": None,
            "protocols": [{"name": n, "metadata": subscription(owned=owned)}
                          for n in protocols]}


def sync(apis, r, version=5) -> dict:
    return apis.sync_group(CONN, version, {
        "group_id": "g", "generation_id": r["generation_id"], "member_id": r["member_id"],
        "group_instance_id": None, "protocol_type": "consumer",
        "protocol_name": r["protocol_name"], "assignments": []})


def beat(apis, r, instance_id=None) -> int:
    return apis.heartbeat(CONN, 4, {"group_id": "g", "generation_id": r["generation_id"],
                                    "member_id": r["member_id"],
                                    "group_instance_id": instance_id})["error_code"]


@pytest.fixture
def groups():
    return FakeGroupApis()


@pytest.fixture
def apis(groups):
    return GroupWireApis(groups, SimpleNamespace(topics={}))


def test_join_v4_without_a_member_id_is_member_id_required_with_a_fresh_id(apis, groups):
    r = apis.join_group(CONN, 4, join_body())
    assert r["error_code"] == 79 and r["member_id"].startswith("app-")
    assert groups.coordinator.groups == {}           # nothing joined yet
    r2 = apis.join_group(CONN, 4, join_body(r["member_id"]))
    assert r2["error_code"] == 0 and r2["member_id"] == r["member_id"]
    assert r2["leader"] == "" and r2["members"] == []     # every member is a follower
    assert r2["protocol_name"] == "range"
    # before v4 the broker names the member at once
    assert apis.join_group(CONN, 3, join_body())["error_code"] == 0


def test_sync_returns_the_brokers_assignment_and_heartbeat_signals_the_rebalance(apis):
    a = apis.join_group(CONN, 3, join_body(protocols=("cooperative-sticky", "range")))
    assert a["protocol_name"] == "cooperative-sticky"
    s = sync(apis, a)
    assert s["error_code"] == 0 and assigned(s["assignment"]) == ALL
    assert s["protocol_name"] == "cooperative-sticky"
    assert beat(apis, a) == 0
    b = apis.join_group(CONN, 3, join_body())
    assert assigned(sync(apis, b)["assignment"]) == frozenset()
    assert beat(apis, a) == 27 and beat(apis, b) == 0        # A must give some up first
    a = apis.join_group(CONN, 3, join_body(a["member_id"], owned=ALL))
    kept = assigned(sync(apis, a)["assignment"])
    a = apis.join_group(CONN, 3, join_body(a["member_id"], owned=kept))
    assert beat(apis, a) == 0 and beat(apis, b) == 27
    b = apis.join_group(CONN, 3, join_body(b["member_id"]))
    assert assigned(sync(apis, b)["assignment"]) == ALL - kept
    assert beat(apis, {**b, "generation_id": b["generation_id"] + 1}) == 22


def test_a_static_member_restarts_into_its_place_without_a_rebalance(apis):
    a = apis.join_group(CONN, 5, join_body(instance_id="a"))
    b = apis.join_group(CONN, 5, join_body(instance_id="b"))
    a = apis.join_group(CONN, 5, join_body(a["member_id"], "a"))     # eager: after A's revoke
    b = apis.join_group(CONN, 5, join_body(b["member_id"], "b"))
    held_b = assigned(sync(apis, b)["assignment"])
    assert len(held_b) == 2 and beat(apis, a, "a") == 0
    b2 = apis.join_group(CONN, 5, join_body("", "b"))      # a new process, same instance id
    assert b2["error_code"] == 0 and b2["member_id"] != b["member_id"]
    assert assigned(sync(apis, b2)["assignment"]) == held_b
    assert beat(apis, a, "a") == 0                         # no rebalance for A
    assert beat(apis, b, "b") == 82                        # the old incarnation is fenced
    assert apis.join_group(CONN, 5, join_body(b["member_id"], "b"))["error_code"] == 82
    assert beat(apis, b2, "b") == 0


def test_leave_group_frees_the_partitions(apis):
    a = apis.join_group(CONN, 3, join_body())
    b = apis.join_group(CONN, 3, join_body())
    r = apis.leave_group(CONN, 3, {"group_id": "g", "member_id": "",
                                   "members": [{"member_id": a["member_id"],
                                                "group_instance_id": None, "reason": None},
                                               {"member_id": "nobody",
                                                "group_instance_id": None, "reason": None}]})
    assert [m["error_code"] for m in r["members"]] == [0, 25]
    assert beat(apis, b) == 27
    b = apis.join_group(CONN, 3, join_body(b["member_id"]))
    assert assigned(sync(apis, b)["assignment"]) == ALL
    assert apis.classic.keys() == {("g", b["member_id"])}


def test_a_sync_naming_another_protocol_than_its_join_is_refused(apis):
    a = apis.join_group(CONN, 3, join_body(protocols=("range", "roundrobin")))
    assert sync(apis, {**a, "protocol_name": "roundrobin"})["error_code"] == 23
    assert sync(apis, {**a, "protocol_name": "roundrobin"}, version=4)["error_code"] == 0
    assert sync(apis, a)["error_code"] == 0


def test_a_join_that_is_not_the_consumer_protocol_is_refused(apis):
    body = {**join_body(), "protocol_type": "connect"}
    assert apis.join_group(CONN, 3, body)["error_code"] == 23
    body = {**join_body(), "protocols": [{"name": "range", "metadata": b"junk"}]}
    assert apis.join_group(CONN, 3, body)["error_code"] == 23


def run(gen, *replies):
    """Drive a handler generator: answer each ``Calls`` with the next native replies."""
    calls = []
    try:
        wanted = next(gen)
        for reply in replies:
            calls.append(wanted.calls)
            wanted = gen.send([Response.from_message(r) for r in reply])
    except StopIteration as stop:
        return calls, stop.value
    raise AssertionError("the handler wanted more calls")


def test_a_stale_commit_is_illegal_generation_for_a_classic_member_only(apis, groups):
    admin = GroupAdminApis(groups, apis, SimpleNamespace(topics={}))
    a = apis.join_group(CONN, 3, join_body())

    def commit(member_id):
        body = {"group_id": "g", "generation_id_or_member_epoch": 1, "member_id": member_id,
                "group_instance_id": None, "retention_time_ms": -1, "topics": [
                    {"name": "t", "partitions": [
                        {"partition_index": 0, "committed_offset": 4,
                         "committed_leader_epoch": -1, "committed_metadata": "x"}]}]}
        calls, out = run(admin.offset_commit(CONN, 8, body), [[8, 1, 113, "stale"]])
        assert calls[0][0].fields["offsets"] == [["t", 0, 4, -1, "x"]]
        return out["topics"][0]["partitions"][0]["error_code"]
    assert commit(a["member_id"]) == 22
    assert commit("a-kip848-member") == 113
