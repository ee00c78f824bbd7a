"""Assignors: Kafka's documented examples exactly, and the invariants with Hypothesis."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.broker.assignors import (
    ASSIGNORS,
    canonical_assignor,
    range_assign,
    round_robin_assign,
    sticky_assign,
)

TOPICS = ("a", "b", "c", "d")


def tps(spec: str) -> set[tuple[str, int]]:
    """'t0p0 t1p2' -> {('t0', 0), ('t1', 2)}"""
    out = set()
    for word in spec.split():
        topic, _, p = word.rpartition("p")
        out.add((topic, int(p)))
    return out


# --- Kafka's examples ----------------------------------------------------------------------------

def test_range_kafka_javadoc_example():
    # RangeAssignor javadoc: C0, C1 subscribe to t0, t1 with 3 partitions each.
    members = {"C0": {"t0", "t1"}, "C1": {"t0", "t1"}}
    result = range_assign(members, {"t0": 3, "t1": 3})
    assert result == {"C0": tps("t0p0 t0p1 t1p0 t1p1"), "C1": tps("t0p2 t1p2")}


def test_round_robin_kafka_javadoc_examples():
    members = {"C0": {"t0", "t1"}, "C1": {"t0", "t1"}}
    assert round_robin_assign(members, {"t0": 3, "t1": 3}) == {
        "C0": tps("t0p0 t0p2 t1p1"), "C1": tps("t0p1 t1p0 t1p2")}
    # Unequal subscriptions: t0, t1, t2 with 1, 2, 3 partitions.
    members = {"C0": {"t0"}, "C1": {"t0", "t1"}, "C2": {"t0", "t1", "t2"}}
    assert round_robin_assign(members, {"t0": 1, "t1": 2, "t2": 3}) == {
        "C0": tps("t0p0"), "C1": tps("t1p0"), "C2": tps("t1p1 t2p0 t2p1 t2p2")}


def test_sticky_kafka_javadoc_example_equal_subscriptions():
    members = {c: {"t0", "t1", "t2", "t3"} for c in ("C0", "C1", "C2")}
    partitions = {t: 2 for t in ("t0", "t1", "t2", "t3")}
    first = sticky_assign(members, partitions)
    assert first == {"C0": tps("t0p0 t1p1 t3p0"), "C1": tps("t0p1 t2p0 t3p1"),
                     "C2": tps("t1p0 t2p1")}
    del members["C1"]
    # Kafka: C0 [t0p0, t1p1, t3p0, t2p0], C2 [t1p0, t2p1, t0p1, t3p1]
    assert sticky_assign(members, partitions, first) == {
        "C0": tps("t0p0 t1p1 t3p0 t2p0"), "C2": tps("t1p0 t2p1 t0p1 t3p1")}


def test_sticky_kafka_javadoc_example_unequal_subscriptions():
    members = {"C0": {"t0"}, "C1": {"t0", "t1"}, "C2": {"t0", "t1", "t2"}}
    partitions = {"t0": 1, "t1": 2, "t2": 3}
    first = sticky_assign(members, partitions)
    assert first == {"C0": tps("t0p0"), "C1": tps("t1p0 t1p1"), "C2": tps("t2p0 t2p1 t2p2")}
    del members["C0"]
    assert sticky_assign(members, partitions, first) == {
        "C1": tps("t0p0 t1p0 t1p1"), "C2": tps("t2p0 t2p1 t2p2")}


def test_static_members_sort_first_by_instance_id():
    members = {"m-a": {"t"}, "m-b": {"t"}, "m-c": {"t"}}
    # m-c is static with instance "i0": it sorts before every dynamic member.
    result = range_assign(members, {"t": 3}, instance_ids={"m-c": "i0", "m-a": None})
    assert result == {"m-c": tps("tp0"), "m-a": tps("tp1"), "m-b": tps("tp2")}
    # A static member restarting under a new member id keeps its range.
    members2 = {"m-a": {"t"}, "m-b": {"t"}, "zz-new": {"t"}}
    again = range_assign(members2, {"t": 3}, instance_ids={"zz-new": "i0"})
    assert again["zz-new"] == result["m-c"]


def test_missing_topics_and_empty_groups():
    for assign in ASSIGNORS.values():
        assert assign({}, {"t": 3}) == {}
        assert assign({"m": {"nope"}}, {"t": 3}) == {"m": set()}
        assert assign({"m": {"t"}, "n": set()}, {"t": 2, "u": 0}) == {
            "m": tps("tp0 tp1"), "n": set()}


def test_sticky_moves_the_highest_partitions_to_a_newcomer():
    result = sticky_assign({"A": {"t"}, "B": {"t"}}, {"t": 4}, {"A": tps("tp0 tp1 tp2 tp3")})
    assert result == {"A": tps("tp0 tp1"), "B": tps("tp2 tp3")}


def test_sticky_chain_moves_through_an_intermediate_member():
    # A holds 3 of x, B (x and y) holds 2 of y, C (y only) holds 1. No single move helps,
    # the chain A -> B -> C does: 2, 2, 2.
    members = {"A": {"x"}, "B": {"x", "y"}, "C": {"y"}}
    current = {"A": tps("xp0 xp1 xp2"), "B": tps("yp0 yp1"), "C": tps("yp2")}
    result = sticky_assign(members, {"x": 3, "y": 3}, current)
    assert sorted(len(v) for v in result.values()) == [2, 2, 2]
    assert result["A"] < current["A"] and result["C"] > current["C"]


def test_canonical_assignor_names():
    assert canonical_assignor("Range") == "range"
    assert canonical_assignor("round-robin") == "roundrobin"
    assert canonical_assignor("cooperative-sticky") == "sticky"
    assert canonical_assignor("uniform") == "sticky"
    with pytest.raises(ValueError, match="unknown partition assignor"):
        canonical_assignor("nope")


# --- properties ----------------------------------------------------------------------------------

member_ids = st.sampled_from([f"m{i}" for i in range(7)])
subscriptions = st.frozensets(st.sampled_from(TOPICS), max_size=len(TOPICS))
members_st = st.dictionaries(member_ids, subscriptions, max_size=6)
partitions_st = st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 7))
instance_st = st.dictionaries(member_ids, st.sampled_from(["i0", "i1", "i2", "i3"]),
                              max_size=3).map(
    lambda d: {m: i for m, i in d.items() if list(d.values()).count(i) == 1})


def check_valid(members, partitions, result):
    assert set(result) == set(members)
    owners = collections.Counter(tp for parts in result.values() for tp in parts)
    assert all(n == 1 for n in owners.values()), "a partition was assigned twice"
    wanted = {(t, p) for subs in members.values() for t in subs
              for p in range(partitions.get(t, 0))}
    assert set(owners) == wanted, "every subscribed partition is assigned"
    for m, parts in result.items():
        assert all(t in members[m] for t, _ in parts), "a partition went to a non-subscriber"


def has_cost_reducing_path(members, result) -> bool:
    """Is there a chain X0 -> ... -> Xk, each step "Xi holds a partition of a topic X(i+1)
    subscribes to", with load(Xk) <= load(X0) - 2? (then the assignment is not balanced)"""
    load = {m: len(v) for m, v in result.items()}
    for src in members:
        seen, frontier = {src}, [src]
        while frontier:
            u = frontier.pop()
            for v in members:
                if v not in seen and any(t in members[v] for t, _ in result[u]):
                    if load[v] <= load[src] - 2:
                        return True
                    seen.add(v)
                    frontier.append(v)
    return False


@given(members_st, partitions_st, instance_st)
def test_every_assignor_assigns_each_subscribed_partition_once(members, partitions, instances):
    for name, assign in ASSIGNORS.items():
        result = assign(members, partitions, instance_ids=instances)
        check_valid(members, partitions, result)
        # Deterministic, whatever the insertion order of the inputs.
        reordered = dict(reversed(list(members.items())))
        assert assign(reordered, dict(reversed(list(partitions.items()))),
                      instance_ids=instances) == result, name


@given(members_st, partitions_st)
def test_range_balances_each_topic(members, partitions):
    result = range_assign(members, partitions)
    for topic in partitions:
        subscribers = sorted(m for m in members if topic in members[m])
        counts = [len({tp for tp in result[m] if tp[0] == topic}) for m in subscribers]
        if subscribers:
            assert max(counts) - min(counts) <= 1
            assert counts == sorted(counts, reverse=True), "the first P mod M get one extra"
            for m in subscribers:                       # ranges are contiguous
                mine = sorted(p for t, p in result[m] if t == topic)
                assert mine == list(range(mine[0], mine[0] + len(mine))) if mine else True


@given(st.sets(member_ids, min_size=1), subscriptions, partitions_st)
def test_round_robin_balances_equal_subscriptions(ids, subs, partitions):
    members = {m: subs for m in ids}
    result = round_robin_assign(members, partitions)
    counts = [len(v) for v in result.values()]
    assert max(counts) - min(counts) <= 1


@given(members_st, partitions_st, st.data())
def test_sticky_is_balanced_and_sticky_from_any_current(members, partitions, data):
    holders = sorted(members) + ["gone1", "gone2"]
    all_tps = [(t, p) for t in TOPICS for p in range(9)]          # includes invalid ones
    current: dict[str, set] = collections.defaultdict(set)
    for tp in data.draw(st.lists(st.sampled_from(all_tps), unique=True, max_size=20)):
        current[data.draw(st.sampled_from(holders))].add(tp)
    result = sticky_assign(members, partitions, current)
    check_valid(members, partitions, result)
    assert not has_cost_reducing_path(members, result)
    for a in members:                           # equal subscriptions: counts differ by <= 1
        for b in members:
            if members[a] == members[b]:
                assert abs(len(result[a]) - len(result[b])) <= 1
    # Stable: feeding the result back changes nothing.
    assert sticky_assign(members, partitions, result) == result


@given(st.sets(member_ids, min_size=2), subscriptions, partitions_st, st.data())
def test_sticky_keeps_everything_whose_owner_stays(ids, subs, partitions, data):
    members = {m: subs for m in ids}
    before = sticky_assign(members, partitions)
    leaving = data.draw(st.sets(st.sampled_from(sorted(ids)), max_size=len(ids) - 1))
    survivors = {m: subs for m in ids - leaving}
    after = sticky_assign(survivors, partitions, before)
    check_valid(survivors, partitions, after)
    for m in survivors:
        assert before[m] <= after[m], "a surviving member lost a partition"
    # More partitions for the same members: nobody loses anything either.
    grown = {t: n + data.draw(st.integers(0, 3)) for t, n in partitions.items()}
    bigger = sticky_assign(members, grown, before)
    for m in members:
        assert before[m] <= bigger[m]


@given(st.sets(member_ids, min_size=1, max_size=4), subscriptions, partitions_st,
       st.sets(st.sampled_from(["n1", "n2", "n3"]), min_size=1))
def test_sticky_moves_the_minimum_when_members_join(ids, subs, partitions, joining):
    members = {m: subs for m in ids}
    before = sticky_assign(members, partitions)
    everyone = {m: subs for m in ids | joining}
    after = sticky_assign(everyone, partitions, before)
    check_valid(everyone, partitions, after)
    total = sum(len(v) for v in before.values())
    floor, extra = divmod(total, len(everyone))
    old_counts = [len(before[m]) for m in ids]
    best_kept = sum(min(n, floor) for n in old_counts) + min(
        extra, sum(1 for n in old_counts if n > floor))
    kept = sum(len(before[m] & after[m]) for m in ids)
    assert kept == best_kept
    for m in ids:
        lost = before[m] - after[m]
        assert not lost or len(after[m]) >= floor, "lost partitions below the fair share"
