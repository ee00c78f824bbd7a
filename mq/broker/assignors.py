"""Partition assignors for consumer groups: range, round-robin and sticky (pure functions).

The group coordinator computes a group's *target* assignment with one of these whenever the
group epoch moves (a member joins, leaves or dies, a subscription or the topic metadata
changes). All three share one signature::

    assign(members, partitions, current=None, *, instance_ids=None) -> {member_id: {(topic, p)}}

``members`` maps a member id to the topics it subscribes to (already resolved: a regex
subscription arrives here as the topic names it matches); ``partitions`` maps a topic to its
partition count; ``current`` (sticky only) is who holds what now. Every member of ``members``
is a key of the result, possibly with an empty set.

Invariants, for every assignor (tests/unit/broker/test_assignors.py checks them with Hypothesis):

- every partition of a topic that at least one member subscribes to is assigned exactly once;
- no partition goes to a member that does not subscribe to its topic; topics missing from
  ``partitions`` are ignored (not created yet);
- the result depends only on the arguments (no randomness, no dict or set iteration order):
  members are ordered like Kafka's ``MemberInfo.compareTo`` — static members (with a
  ``group.instance.id``) first, by instance id, then dynamic members by member id — so a static
  member that restarts under a new member id lands on the same partitions.

Balance: range balances each topic separately (⌊P/M⌋ each, the first P mod M subscribers one
more), round-robin deals the sorted partitions over the sorted members (counts differ by ≤ 1
when all members subscribe to the same topics). Sticky first restores balance in Kafka's sense
and only then keeps as many partitions with their current holder as it can; see
``sticky_assign``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Iterable, Mapping

from mq.protocol.types import TopicPartition

__all__ = ["Assignment", "range_assign", "round_robin_assign", "sticky_assign",
           "ASSIGNORS", "canonical_assignor", "member_sort_key"]

Assignment = dict[str, set[TopicPartition]]
Assignor = Callable[..., Assignment]


def member_sort_key(member_id: str,
                    instance_ids: Mapping[str, str | None] | None = None) -> tuple[int, str]:
    """Kafka's member order: static members by instance id first, then the rest by member id."""
    instance_id = instance_ids.get(member_id) if instance_ids else None
    return (0, instance_id) if instance_id is not None else (1, member_id)


def _ordered(members: Iterable[str],
             instance_ids: Mapping[str, str | None] | None) -> list[str]:
    return sorted(members, key=lambda m: member_sort_key(m, instance_ids))


def _subscribed_topics(members: Mapping[str, Collection[str]],
                       partitions: Mapping[str, int]) -> list[str]:
    wanted = set().union(*members.values()) if members else set()
    return sorted(t for t in wanted if partitions.get(t, 0) > 0)


def range_assign(members: Mapping[str, Collection[str]], partitions: Mapping[str, int],
                 current: Mapping[str, Collection[TopicPartition]] | None = None, *,
                 instance_ids: Mapping[str, str | None] | None = None) -> Assignment:
    """Kafka's RangeAssignor: per topic, contiguous ranges over the sorted subscribers.

    With P partitions and M subscribers of a topic, each subscriber gets ⌊P/M⌋ consecutive
    partitions and the first P mod M get one more. ``current`` is ignored.
    """
    result: Assignment = {m: set() for m in members}
    order = _ordered(members, instance_ids)
    for topic in _subscribed_topics(members, partitions):
        subscribers = [m for m in order if topic in members[m]]
        quota, extra = divmod(partitions[topic], len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            count = quota + (1 if i < extra else 0)
            result[member].update(TopicPartition(topic, p) for p in range(start, start + count))
            start += count
    return result


def round_robin_assign(members: Mapping[str, Collection[str]], partitions: Mapping[str, int],
                       current: Mapping[str, Collection[TopicPartition]] | None = None, *,
                       instance_ids: Mapping[str, str | None] | None = None) -> Assignment:
    """Kafka's RoundRobinAssignor: all partitions sorted by (topic, partition), dealt over the
    sorted members in a circle, skipping members that do not subscribe to the partition's topic.
    ``current`` is ignored.
    """
    result: Assignment = {m: set() for m in members}
    order = _ordered(members, instance_ids)
    turn = 0
    for topic in _subscribed_topics(members, partitions):
        for p in range(partitions[topic]):
            while topic not in members[order[turn % len(order)]]:
                turn += 1     # terminates: the topic has at least one subscriber
            result[order[turn % len(order)]].add(TopicPartition(topic, p))
            turn += 1
    return result


def sticky_assign(members: Mapping[str, Collection[str]], partitions: Mapping[str, int],
                  current: Mapping[str, Collection[TopicPartition]] | None = None, *,
                  instance_ids: Mapping[str, str | None] | None = None) -> Assignment:
    """Balanced first, then sticky (Kafka's StickyAssignor / the broker's "uniform" assignor).

    1. Every partition stays with its current holder if the holder is still a member and
       still subscribes to the topic (a partition claimed twice goes to the first member in
       Kafka's member order).
    2. The remaining partitions go, those with the fewest possible owners first, to the
       least-loaded subscriber.
    3. Balance: while some member with n partitions can pass one along a chain of "X holds a
       partition of a topic Y subscribes to" steps to a member with at most n - 2, move one
       partition along the chain to the least loaded such member (most loaded sender first,
       then the shortest chain, then member order). Each move lowers the
       sum of squared loads by at least 2, so this ends, and it ends at an optimal
       semi-matching: no member could give a partition to a less loaded one even indirectly.
       In particular members with the same subscriptions end with counts that differ by ≤ 1.
       Moves prefer partitions the sender did not hold before this call and, second, partitions
       the receiver did hold, so stickiness is lost only where balance needs it.

    With identical subscriptions this moves the minimum number of partitions; a current
    assignment that is already balanced comes back unchanged.
    """
    order = _ordered(members, instance_ids)
    rank = {m: i for i, m in enumerate(order)}
    subs = {m: frozenset(members[m]) for m in order}
    valid = {TopicPartition(t, p) for t in _subscribed_topics(members, partitions)
             for p in range(partitions[t])}
    previous: dict[str, frozenset[TopicPartition]] = {
        m: frozenset(current.get(m, ())) if current else frozenset() for m in order}

    owned: dict[str, set[TopicPartition]] = {m: set() for m in order}
    taken: set[TopicPartition] = set()
    for m in order:                                               # 1. keep current holders
        for tp in sorted(previous[m]):
            if tp in valid and tp not in taken and tp[0] in subs[m]:
                owned[m].add(tp)
                taken.add(tp)

    eligible = {t: [m for m in order if t in subs[m]] for t in {tp[0] for tp in valid}}
    for tp in sorted(valid - taken, key=lambda tp: (len(eligible[tp[0]]), tp)):   # 2.
        best = min(eligible[tp[0]], key=lambda m: (len(owned[m]), rank[m]))
        owned[best].add(tp)

    while _move_along_cost_reducing_path(order, subs, owned, previous):           # 3.
        pass
    return {m: owned[m] for m in members}


def _move_along_cost_reducing_path(order: list[str], subs: Mapping[str, frozenset[str]],
                                   owned: dict[str, set[TopicPartition]],
                                   previous: Mapping[str, frozenset[TopicPartition]]) -> bool:
    """Find one chain src -> ... -> dst with load(dst) <= load(src) - 2 and shift a partition
    along each step; False when there is none (the assignment is balanced)."""
    if len(order) < 2:
        return False
    load = {m: len(owned[m]) for m in order}
    lowest = min(load.values())
    topics_held = {m: collections.Counter(t for t, _ in owned[m]) for m in order}
    for src in sorted(order, key=lambda m: -load[m]):      # stable: ties keep member order
        if load[src] < lowest + 2:
            return False
        parent: dict[str, str] = {src: src}
        reached: list[str] = []               # breadth-first order
        frontier = [src]
        while frontier:
            nxt: list[str] = []
            for u in frontier:
                for v in order:
                    if v not in parent and any(t in subs[v] for t in topics_held[u]):
                        parent[v] = u
                        reached.append(v)
                        nxt.append(v)
            frontier = nxt
        if not reached:
            continue
        dst = min(reached, key=lambda v: load[v])    # least loaded, then nearest
        if load[dst] > load[src] - 2:
            continue
        v = dst
        while v != src:
            u = parent[v]
            candidates = sorted((tp for tp in owned[u] if tp[0] in subs[v]), reverse=True)
            tp = min(candidates, key=lambda tp: (tp not in previous[v], tp in previous[u]))
            owned[u].remove(tp)
            owned[v].add(tp)
            v = u
        return True
    return False


ASSIGNORS: Mapping[str, Assignor] = {
    "range": range_assign,
    "roundrobin": round_robin_assign,
    "sticky": sticky_assign,
}

_ALIASES = {
    "range": "range",
    "roundrobin": "roundrobin", "round-robin": "roundrobin", "round_robin": "roundrobin",
    "sticky": "sticky", "cooperative-sticky": "sticky", "uniform": "sticky",
}


def canonical_assignor(name: str) -> str:
    """The canonical name for an assignor name or alias (``cooperative-sticky`` and Kafka's
    server-side ``uniform`` are ``sticky``). Raises ``ValueError`` for an unknown name."""
    try:
        return _ALIASES[name.strip().lower()]
    except (KeyError, AttributeError) as err:
        raise ValueError(f"unknown partition assignor {name!r}; "
                         f"known: {', '.join(sorted(_ALIASES))}") from err
