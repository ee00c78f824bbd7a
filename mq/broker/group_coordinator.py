"""The consumer-group coordinator: Kafka's broker-side group protocol (KIP-848), pure.

No sockets, threads or clocks: the broker calls the methods below from its loop, passes the time
in as ``now_ms`` and turns the returned values into responses and wake-ups.

Protocol. A member heartbeats with its subscription, its member epoch and the partitions it
owns. Any change of membership, subscription, assignor or subscribed topic metadata bumps the
*group epoch*, and the target assignment is recomputed at once with the group's assignor
(``mq.broker.assignors``). Each member then converges to its target one heartbeat at a time:

- ``STABLE``: it owns its whole target, at the target epoch.
- ``UNREVOKED_PARTITIONS``: it holds partitions that left its target; its response lists only
  what it keeps, it must stop consuming the rest (``on_partitions_revoked``, commit) and report
  its smaller owned set. Its member epoch does not move until it has, so commits for the
  partitions it is giving up still pass ``validate_commit``.
- ``UNRELEASED_PARTITIONS``: at the target epoch, but part of its target is still held by a
  member that has not revoked it; those partitions are granted on a later heartbeat.

Invariant: a partition is granted to a member only when no other member holds it (assigned or
pending revocation) — a partition changes hands only after its previous holder revoked it, left
or died. Partitions that stay in a member's target are never taken away, so members that keep
their partitions consume through any rebalance.

Liveness. ``connection_closed(conn_id)`` and ``member_died(pid)`` remove a dynamic member at
once and free its partitions without waiting for a revocation (a closed connection means the
client stopped consuming: the client contract). Members whose assignment changed as a result
come back in ``Effects.wakeups``; the broker should prod them to heartbeat now, which is how a
partition of a killed consumer is reassigned within 100 ms. ``tick(now_ms)`` expires members
that have not heartbeated for ``session_timeout_ms`` (a hung process) and members that did not
revoke within ``rebalance_timeout_ms``. ``max_poll_interval_ms`` is enforced by the client: a
consumer whose handler has not polled for that long leaves the group (Kafka's behaviour); the
client also sends it as ``rebalance_timeout_ms``.

Classic members (JoinGroup clients of the Kafka listener) join and rejoin through ``heartbeat``
with epoch 0 and no connection or pid, so their session timeout is their liveness;
``classic_heartbeat`` keeps them alive and tells them when to rejoin, since a classic client
learns an assignment only from a join.

Static membership (``instance_id``). A static member that goes away without leaving for good
(connection closed, pid gone, or a temporary leave with epoch -2) stays in the group with its
partitions reserved until its session times out, and nothing is rebalanced. A process joining
with the same instance id takes over the member id's place: its assignment and epoch, with no
group epoch bump unless the subscription changed. Trade-off: a static member killed with
kill -9 leaves its partitions unconsumed for up to ``session_timeout_ms`` even though the broker
knows the process is gone — that is what makes a quick restart cheap (Kafka's semantics).
Partitions it was asked to revoke are freed at once: it is certainly not consuming them.

Broker restart. The coordinator starts empty; members rejoin with epoch 0, their old member id
and the partitions they still own. Reported partitions that no one holds are granted to the
rejoining member straight away and count as its current assignment for the sticky assignor, so
members keep consuming through a broker restart. With ``restart_grace_ms`` the coordinator
withholds, for that long after it starts, partitions no member has reported — a member that
has not rejoined yet may still be consuming them. ``grace_groups`` limits that to the groups
that existed before the restart (the broker passes those with committed offsets), so a new
group is not kept waiting.

Client contract (what the consumer must do for the invariant to hold end to end): report its
owned partitions on every heartbeat (``None`` only when unchanged since its last report — the
coordinator then assumes it started everything granted since), counting those it may still
start from an assignment already received: a granted partition left out is released at once;
after each response stop consuming whatever is not in ``assignment``
(``on_partitions_revoked``, commit) and heartbeat at once to report it; heartbeat at once when
woken; on ``FENCED_MEMBER_EPOCH`` or ``UNKNOWN_MEMBER_ID`` drop everything
(``on_partitions_lost``) and rejoin with epoch 0; treat its own connection closing as having
stopped consuming, except when the broker restarted (a new broker generation): then keep
consuming and rejoin reporting what it owns.

Errors are Kafka's codes as mq's broker error classes (``mq.errors``), returned as values:
nothing here raises on bad client input. The values and records are in ``group_model.py``.

Fencing. Heartbeats with an unknown member id get ``UNKNOWN_MEMBER_ID``, with a wrong epoch
``FENCED_MEMBER_EPOCH`` (the member must drop its partitions — ``on_partitions_lost`` — and
rejoin with epoch 0); the previous epoch is accepted when the owned partitions are a subset of
the assignment (the response carrying the new epoch was lost). Offset commits pass
``validate_commit``: the exact member epoch, or epoch -1 for a group without members.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable

from mq import errors
from mq.broker.assignors import ASSIGNORS, canonical_assignor
from mq.broker.group_model import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_MIN_SESSION_TIMEOUT_MS,
    DEFAULT_REBALANCE_TIMEOUT_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
    EMPTY,
    JOIN_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    Effects,
    Group,
    GroupDescription,
    GroupListing,
    GroupState,
    HeartbeatResult,
    LeaveResult,
    Member,
    MemberDescription,
    MemberState,
    Removal,
    Wakeup,
    matches_pattern,
    merge_effects,
    parse_assignor,
    parse_partitions,
    parse_subscription,
    pattern_text,
)
from mq.errors import BrokerError
from mq.protocol.types import TopicPartition

__all__ = ["GroupCoordinator"]


_Next = tuple[MemberState, int, frozenset[TopicPartition], frozenset[TopicPartition]]


class GroupCoordinator:
    """Every consumer group of the broker. Methods take ``now_ms`` where time matters and
    return errors and effects as values; nothing here raises on bad client input."""

    def __init__(self, topics: dict[str, int] | None = None, *, now_ms: int = 0,
                 restart_grace_ms: int = 0, grace_groups: Collection[str] | None = None,
                 default_assignor: str = "sticky",
                 heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
                 session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
                 rebalance_timeout_ms: int = DEFAULT_REBALANCE_TIMEOUT_MS,
                 min_session_timeout_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS,
                 max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
                 max_group_size: int | None = None,
                 member_id_factory: Callable[[], str] | None = None) -> None:
        self.topics: dict[str, int] = dict(topics or {})
        self.groups: dict[str, Group] = {}
        self.default_assignor = canonical_assignor(default_assignor)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.max_group_size = max_group_size
        self._new_member_id = member_id_factory or (lambda: str(uuid.uuid4()))
        self._grace_until_ms: int | None = now_ms + restart_grace_ms if restart_grace_ms > 0 \
            else None
        self._fresh: set[TopicPartition] = set()     # created during the restart grace
        # Groups the grace applies to (None: all) — those that can have been consuming before.
        self._grace_groups = None if grace_groups is None else frozenset(grace_groups)

    # --- the heartbeat -------------------------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str | None = None, *,
                  member_epoch: int = JOIN_GROUP_MEMBER_EPOCH, instance_id: str | None = None,
                  subscription: Collection[str] | re.Pattern[str] | None = None,
                  subscribed_pattern: str | None = None,
                  owned_partitions: Iterable[Iterable] | None = None,
                  assignor: str | None = None, now_ms: int, pid: int | None = None,
                  conn_id: Hashable | None = None, rebalance_timeout_ms: int | None = None,
                  session_timeout_ms: int | None = None) -> HeartbeatResult:
        """Join (``member_epoch`` 0), heartbeat, or leave (-1; -2 = static, temporarily).

        ``subscription`` is a collection of topic names or a compiled regex; a regex may also
        come as source text in ``subscribed_pattern``. Both ``None``: unchanged (required on a
        first join). ``owned_partitions`` ``None``: unchanged since the last heartbeat.
        """
        wakeups: list[Wakeup] = []
        try:
            if not isinstance(group_id, str) or not group_id:
                raise errors.InvalidGroupIdError("the group id must be a non-empty string")
            effects = self._advance_clock(now_ms)
            wakeups.extend(effects.wakeups)
            if member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                left = self.leave(group_id, member_id or "", instance_id=instance_id,
                                  temporary=member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH)
                if left.error is not None:
                    raise left.error(f"member {member_id!r} cannot leave group {group_id!r}")
                return HeartbeatResult(member_id, member_epoch, EMPTY, 0,
                                       effects=merge_effects(effects, left.effects))
            sub = parse_subscription(subscription, subscribed_pattern)
            owned = parse_partitions(owned_partitions)
            session = self._session_timeout(session_timeout_ms)
            rebalance = rebalance_timeout_ms
            if rebalance is not None and rebalance <= 0:
                raise errors.InvalidRequestError(
                    f"rebalance timeout must be positive, got {rebalance} ms")
            pref = None if assignor is None else parse_assignor(assignor)
            if member_epoch == JOIN_GROUP_MEMBER_EPOCH:
                group, member = self._join(group_id, member_id, instance_id, sub, owned,
                                           session, rebalance, now_ms)
            else:
                group, member = self._existing(group_id, member_id, instance_id, member_epoch,
                                               owned, sub)
            if conn_id is not None:
                member.conn_id = conn_id
            if pid is not None:
                member.pid = pid
            if session is not None:
                member.session_timeout_ms = session
            if rebalance is not None:
                member.rebalance_timeout_ms = rebalance
            member.last_heartbeat_ms = now_ms
            # None: unchanged since the last report, so it may have started what it was
            # granted since; assume it did, or a revocation could skip waiting for it.
            member.owned = owned if owned is not None else member.owned | member.assigned
            if sub is not None and (member.topics, pattern_text(member.pattern)) != \
                    (sub[0], pattern_text(sub[1])):
                member.topics, member.pattern = sub
                group.dirty = True
            if member.assignor != pref and pref is not None:
                member.assignor = pref
                group.dirty = True
            self._refresh_target(group)
            self._apply(group, member, self._next(group, member), now_ms)
            member.last_sent = member.woken_for = (member.epoch, member.assigned)
            wakeups.extend(self._wakeups(group, exclude=member.member_id))
            interval = min(self.heartbeat_interval_ms, member.session_timeout_ms // 3)
            return HeartbeatResult(member.member_id, member.epoch, member.assigned,
                                   max(1, interval),
                                   effects=Effects(tuple(wakeups), effects.removed,
                                                   effects.departed))
        except BrokerError as err:
            return HeartbeatResult(member_id, -1, EMPTY, 0, type(err), err.message,
                                   Effects(tuple(wakeups)))

    def classic_heartbeat(self, group_id: str, member_id: str, *, generation: int,
                          instance_id: str | None = None, sync: bool = False,
                          now_ms: int) -> tuple[type[BrokerError] | None, bool]:
        """A classic member's Heartbeat or SyncGroup (a JoinGroup/SyncGroup client, which joins
        through ``heartbeat`` with epoch 0 and its generation as member epoch): keep it alive
        and say whether it must rejoin (Kafka's REBALANCE_IN_PROGRESS) — it has partitions to
        give up, or more to be granted, or a newer epoch. Returns (error, rejoin).

        Nothing moves here: a classic client learns its assignment only from a join, so it
        consumes exactly what its last join gave it, which is therefore what it owns. Told to
        rejoin, it must within its rebalance timeout or ``tick`` removes it (Kafka's join
        timeout). At ``sync`` a member with partitions to give up is not sent back: it takes
        what it keeps, revokes the rest and rejoins by itself (KIP-429)."""
        group = self.groups.get(group_id)
        if group is not None and instance_id is not None and \
                group.instances.get(instance_id, member_id) != member_id:
            return errors.FencedInstanceIdError, False
        member = group.members.get(member_id) if group is not None else None
        if member is None or member.departed:
            return errors.UnknownMemberIdError, False
        if generation != member.epoch:
            return errors.IllegalGenerationError, False
        member.last_heartbeat_ms = now_ms
        member.owned = member.owned | member.assigned
        _, epoch, assigned, pending = self._next(group, member)
        rejoin = bool(pending) or (epoch, assigned) != (member.epoch, member.assigned)
        if rejoin and member.revoke_deadline_ms is None:
            member.revoke_deadline_ms = now_ms + member.rebalance_timeout_ms
        elif not rejoin and not member.pending_revocation:
            member.revoke_deadline_ms = None          # what it was told to rejoin for is gone
        return None, rejoin and not (sync and pending)

    def _join(self, group_id: str, member_id: str | None, instance_id: str | None,
              sub: tuple | None, owned: frozenset[TopicPartition] | None, session: int | None,
              rebalance: int | None, now_ms: int) -> tuple[Group, Member]:
        group = self.groups.get(group_id) or Group(group_id, self.default_assignor)
        if member_id is not None and member_id in group.members:
            member = group.members[member_id]      # a rejoin: it lost what it does not report
            if member.instance_id != instance_id:
                raise errors.InvalidRequestError(
                    f"member {member_id!r} joined with another instance id")
            if not member.departed:
                owned = owned if owned is not None else EMPTY
                self._hold(group, member, member.assigned & owned,
                           member.pending_revocation & owned)
                return group, member
        if instance_id is not None and instance_id in group.instances:
            old = group.members[group.instances[instance_id]]
            if not old.departed and old.member_id != member_id:
                raise errors.UnreleasedInstanceIdError(
                    f"instance id {instance_id!r} is in use by member {old.member_id}")
            return group, self._take_over(group, old, member_id or self._new_member_id())
        if sub is None:
            raise errors.InvalidRequestError("a joining member must send a subscription")
        if self.max_group_size is not None and len(group.members) >= self.max_group_size:
            raise errors.GroupMaxSizeReachedError(
                f"group {group_id!r} has {len(group.members)} members already")
        member = Member(member_id or self._new_member_id(), instance_id, sub[0], sub[1], None,
                         None, None, session or self.session_timeout_ms,
                         rebalance or self.rebalance_timeout_ms, now_ms)
        self.groups.setdefault(group_id, group)       # created only once a member joins
        group.members[member.member_id] = member
        if instance_id is not None:
            group.instances[instance_id] = member.member_id
        claims = frozenset(tp for tp in owned or () if tp not in group.holder and
                           0 <= tp[1] < self.topics.get(tp[0], 0))
        self._hold(group, member, claims, EMPTY)     # after a broker restart: keep consuming
        group.dirty = True
        return group, member

    def _take_over(self, group: Group, old: Member, member_id: str) -> Member:
        """A static member's new incarnation inherits the old one's place, with no rebalance."""
        self._hold(group, old, old.assigned & group.target.get(old.member_id, EMPTY), EMPTY)
        new = dataclasses.replace(old, member_id=member_id, departed=False, last_sent=None,
                                  woken_for=None, owned=EMPTY, revoke_deadline_ms=None,
                                  state=MemberState.STABLE)
        del group.members[old.member_id]
        for tp in new.assigned:
            group.holder[tp] = member_id
        group.members[member_id] = new
        group.instances[new.instance_id] = member_id
        group.target[member_id] = group.target.pop(old.member_id, EMPTY)
        return new

    def _existing(self, group_id: str, member_id: str | None, instance_id: str | None,
                  member_epoch: int, owned: frozenset[TopicPartition] | None,
                  sub: tuple | None) -> tuple[Group, Member]:
        group = self.groups.get(group_id)
        if not member_id:
            raise errors.InvalidRequestError("member id required unless joining")
        if group is None:
            raise errors.UnknownMemberIdError(f"group {group_id!r} has no members")
        if instance_id is not None:
            current = group.instances.get(instance_id)
            if current is None:
                raise errors.UnknownMemberIdError(f"unknown instance id {instance_id!r}")
            if current != member_id:
                raise errors.FencedInstanceIdError(
                    f"instance id {instance_id!r} now belongs to member {current}")
        member = group.members.get(member_id)
        if member is None:
            raise errors.UnknownMemberIdError(f"unknown member id {member_id!r}")
        if member.departed:
            raise errors.FencedMemberEpochError(
                "the member's connection closed; rejoin with epoch 0")
        if member_epoch > member.epoch:
            raise errors.FencedMemberEpochError(
                f"epoch {member_epoch} is newer than the member's {member.epoch}")
        if member_epoch < member.epoch:
            reported = owned if owned is not None else member.owned
            if member_epoch != member.previous_epoch or not reported <= member.assigned:
                raise errors.FencedMemberEpochError(
                    f"epoch {member_epoch} is stale, the member is at {member.epoch}")
        return group, member

    # --- leaving, dying, timing out ------------------------------------------------------------

    def leave(self, group_id: str, member_id: str, *, instance_id: str | None = None,
              temporary: bool = False) -> LeaveResult:
        """Remove a member (LeaveGroup, or heartbeat epoch -1). ``temporary`` (epoch -2) keeps a
        static member's partitions reserved until its session times out. An empty
        ``member_id`` with an ``instance_id`` removes that static member (an admin's
        "remove member"); a stale member id with an instance id now used by another member is
        FENCED_INSTANCE_ID."""
        group = self.groups.get(group_id)
        if group is None:
            return LeaveResult(errors.UnknownMemberIdError)
        if instance_id is not None and member_id and \
                group.instances.get(instance_id, member_id) != member_id:
            return LeaveResult(errors.FencedInstanceIdError)
        by_instance = group.instances.get(instance_id or "", "") if not member_id else member_id
        member = group.members.get(by_instance)
        if member is None:
            return LeaveResult(errors.UnknownMemberIdError)
        removed: list[Removal] = []
        departed: list[Removal] = []
        if temporary and member.instance_id is not None:
            self._depart(group, member, "left temporarily", departed)
        else:
            self._remove(group, member, "left the group", removed)
        self._refresh_target(group)
        return LeaveResult(None, Effects(tuple(self._wakeups(group)), tuple(removed),
                                         tuple(departed)))

    def connection_closed(self, conn_id: Hashable, now_ms: int) -> Effects:
        """The member's socket closed: dynamic members leave, static ones depart."""
        return self._gone(lambda m: m.conn_id == conn_id, "connection closed", now_ms)

    def member_died(self, pid: int, now_ms: int) -> Effects:
        """The member's process is gone (the broker checked its pid)."""
        return self._gone(lambda m: m.pid == pid, "process died", now_ms)

    def _gone(self, match: Callable[[Member], bool], reason: str, now_ms: int) -> Effects:
        clock = self._advance_clock(now_ms)
        wakeups, removed, departed = list(clock.wakeups), [], []
        for group in list(self.groups.values()):
            hit = [m for m in group.members.values() if match(m) and not m.departed]
            for member in hit:
                if member.instance_id is not None:
                    self._depart(group, member, reason, departed)
                else:
                    self._remove(group, member, reason, removed)
            if hit:
                self._refresh_target(group)
                wakeups.extend(self._wakeups(group))
        return Effects(tuple(wakeups), tuple(removed), tuple(departed))

    def tick(self, now_ms: int) -> Effects:
        """Expire members silent for longer than their session timeout and members that did not
        revoke within their rebalance timeout; end the restart grace period."""
        clock = self._advance_clock(now_ms)
        wakeups, removed = list(clock.wakeups), []
        for group in list(self.groups.values()):
            hit = False
            for member in list(group.members.values()):
                if now_ms - member.last_heartbeat_ms > member.session_timeout_ms:
                    self._remove(group, member, "session timed out", removed)
                    hit = True
                elif member.revoke_deadline_ms is not None and \
                        now_ms > member.revoke_deadline_ms and not member.departed:
                    self._remove(group, member, "did not revoke within the rebalance timeout",
                                 removed)
                    hit = True
            if hit:
                self._refresh_target(group)
                wakeups.extend(self._wakeups(group))
        return Effects(tuple(wakeups), tuple(removed))

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` has something to do next (None: nothing pending)."""
        times = [self._grace_until_ms] if self._grace_until_ms is not None else []
        for group in self.groups.values():
            for m in group.members.values():
                times.append(m.last_heartbeat_ms + m.session_timeout_ms + 1)
                if m.revoke_deadline_ms is not None and not m.departed:
                    times.append(m.revoke_deadline_ms + 1)
        return min(times, default=None)

    def _advance_clock(self, now_ms: int) -> Effects:
        if self._grace_until_ms is None or now_ms < self._grace_until_ms:
            return Effects()
        self._grace_until_ms = None
        self._fresh.clear()
        wakeups = []
        for group in self.groups.values():
            group.known_free.clear()
            wakeups.extend(self._wakeups(group))
        return Effects(tuple(wakeups))

    def _remove(self, group: Group, member: Member, reason: str, out: list[Removal]) -> None:
        self._hold(group, member, EMPTY, EMPTY)
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        if member.instance_id is not None and \
                group.instances.get(member.instance_id) == member.member_id:
            del group.instances[member.instance_id]
        group.dirty = True
        out.append(Removal(group.group_id, member.member_id, member.instance_id, reason))

    def _depart(self, group: Group, member: Member, reason: str, out: list[Removal]) -> None:
        member.departed, member.conn_id = True, None
        member.state, member.revoke_deadline_ms = MemberState.STABLE, None
        self._hold(group, member, member.assigned & group.target.get(member.member_id, EMPTY),
                   EMPTY)
        out.append(Removal(group.group_id, member.member_id, member.instance_id, reason))

    # --- metadata ------------------------------------------------------------------------------

    def set_topic_partitions(self, topic: str, count: int) -> Effects:
        """A topic was created or got more partitions (``count`` 0 deletes it)."""
        old = self.topics.get(topic, 0)
        if count > 0:
            self.topics[topic] = count
        else:
            self.topics.pop(topic, None)
        if count == old:
            return Effects()
        if self._grace_until_ms is not None:
            self._fresh.update(TopicPartition(topic, p) for p in range(old, count))
        wakeups = []
        for group in self.groups.values():
            if any(topic in (m.topics or ()) or matches_pattern(m, topic)
                   for m in group.members.values()):
                group.dirty = True
                self._refresh_target(group)
                wakeups.extend(self._wakeups(group))
        return Effects(tuple(wakeups))

    def delete_topic(self, topic: str) -> Effects:
        return self.set_topic_partitions(topic, 0)

    def _subscribed(self, member: Member) -> frozenset[str]:
        if member.pattern is not None:
            return frozenset(t for t in self.topics if matches_pattern(member, t))
        return frozenset(t for t in member.topics or () if t in self.topics)

    # --- target and reconciliation -------------------------------------------------------------

    def _refresh_target(self, group: Group) -> None:
        if not group.dirty:
            return
        group.dirty = False
        group.epoch += 1
        prefs = Counter(m.assignor for m in group.members.values() if m.assignor)
        if prefs:
            top = max(prefs.values())
            tied = sorted(a for a, n in prefs.items() if n == top)
            group.assignor = group.assignor if group.assignor in tied else tied[0]
        subs = {m.member_id: self._subscribed(m) for m in group.members.values()}
        partitions = {t: self.topics[t] for t in set().union(*subs.values())} if subs else {}
        current: dict[str, set[TopicPartition]] = {m: set(group.members[m].assigned)
                                                   for m in subs}
        held = set().union(*current.values()) if current else set()
        for m, tps in group.target.items():
            if m in current:
                current[m].update(tps - held)
        instance_ids = {m.member_id: m.instance_id for m in group.members.values()}
        target = ASSIGNORS[group.assignor](subs, partitions, current, instance_ids=instance_ids)
        group.target = {m: frozenset(target.get(m, ())) for m in subs}
        group.target_epoch = group.epoch
        for member in group.members.values():
            if member.departed:    # nobody consumes them: what left its target is free now
                self._hold(group, member, member.assigned & group.target[member.member_id],
                           EMPTY)

    def _next(self, group: Group, m: Member) -> _Next:
        """Where the member goes on this heartbeat (pure: nothing is changed).

        Revocation waits only for partitions the member reports owning: one it was granted but
        does not report (the response was lost, or a restarted static member) is released now,
        and one pending revocation that came back into its target is simply kept.
        """
        target = group.target.get(m.member_id, EMPTY)
        held = m.assigned | (m.pending_revocation & m.owned)
        kept, revoke = held & target, (held - target) & m.owned
        if revoke:
            epoch = m.epoch if m.epoch != JOIN_GROUP_MEMBER_EPOCH else group.target_epoch
            return MemberState.UNREVOKED_PARTITIONS, epoch, kept, revoke
        grants = frozenset(tp for tp in target - kept if self._grantable(group, tp, m))
        state = MemberState.STABLE if kept | grants == target \
            else MemberState.UNRELEASED_PARTITIONS
        return state, group.target_epoch, kept | grants, EMPTY

    def _grantable(self, group: Group, tp: TopicPartition, m: Member) -> bool:
        holder = group.holder.get(tp)
        if holder is not None:
            return holder == m.member_id
        if self._grace_groups is not None and group.group_id not in self._grace_groups:
            return True
        return self._grace_until_ms is None or tp in group.known_free or tp in self._fresh

    def _apply(self, group: Group, m: Member, nxt: _Next, now_ms: int) -> None:
        state, epoch, assigned, pending = nxt
        if not pending:
            m.revoke_deadline_ms = None
        elif m.revoke_deadline_ms is None or pending - m.pending_revocation:
            m.revoke_deadline_ms = now_ms + m.rebalance_timeout_ms   # a new revocation starts
        if epoch != m.epoch:
            m.previous_epoch, m.epoch = m.epoch, epoch
        m.state = state
        self._hold(group, m, assigned, pending)

    def _hold(self, group: Group, m: Member, assigned: frozenset[TopicPartition],
              pending: frozenset[TopicPartition]) -> None:
        """Set what the member holds, keeping ``group.holder`` in step."""
        before = m.assigned | m.pending_revocation
        after = assigned | pending
        for tp in before - after:
            if group.holder.get(tp) == m.member_id:
                del group.holder[tp]
                if self._grace_until_ms is not None:
                    group.known_free.add(tp)
        for tp in after - before:
            group.holder[tp] = m.member_id
        m.assigned, m.pending_revocation = assigned, pending

    def _wakeups(self, group: Group, exclude: str | None = None) -> list[Wakeup]:
        out = []
        for m in group.members.values():
            if m.departed or m.member_id == exclude:
                continue
            _, epoch, assigned, _ = self._next(group, m)
            if (epoch, assigned) not in (m.last_sent, m.woken_for):
                m.woken_for = (epoch, assigned)
                out.append(Wakeup(group.group_id, m.member_id, m.conn_id, m.pid))
        return out

    # --- offsets and admin ---------------------------------------------------------------------

    def validate_commit(self, group_id: str, member_id: str,
                        member_epoch: int) -> type[BrokerError] | None:
        """May this offset commit go through? ``member_epoch`` is the member epoch (a classic
        client's generation id). Epoch -1 (group-less consumers, admin tools) is accepted only
        while the group has no members; a member must send its current epoch exactly
        (STALE_MEMBER_EPOCH otherwise, Kafka's answer: refresh the epoch by heartbeat, retry)."""
        group = self.groups.get(group_id)
        if member_epoch < 0 and (group is None or not group.members):
            return None
        member = group.members.get(member_id) if group else None
        if member is None:
            return errors.UnknownMemberIdError
        if member.departed or member_epoch != member.epoch:
            return errors.StaleMemberEpochError
        return None

    def delete_group(self, group_id: str) -> type[BrokerError] | None:
        """Forget an Empty group (its offsets are deleted elsewhere)."""
        group = self.groups.get(group_id)
        if group is None:
            return errors.GroupIdNotFoundError
        if group.members:
            return errors.NonEmptyGroupError
        del self.groups[group_id]
        return None

    def group_state(self, group_id: str) -> GroupState:
        group = self.groups.get(group_id)
        if group is None:
            return GroupState.DEAD
        if not group.members:
            return GroupState.EMPTY
        if group.target_epoch < group.epoch:
            return GroupState.ASSIGNING
        if all(m.departed or (m.state is MemberState.STABLE and m.epoch == group.target_epoch)
               for m in group.members.values()):
            return GroupState.STABLE
        return GroupState.RECONCILING

    def describe(self, group_id: str) -> GroupDescription:
        group = self.groups.get(group_id)
        if group is None:
            return GroupDescription(group_id, GroupState.DEAD, 0, 0, self.default_assignor, ())
        members = tuple(MemberDescription(
            m.member_id, m.instance_id, m.pid, m.conn_id,
            None if m.topics is None else tuple(sorted(m.topics)), pattern_text(m.pattern),
            m.assignor, m.epoch, m.state, m.departed, m.assigned, m.pending_revocation,
            group.target.get(m.member_id, EMPTY), m.owned, m.last_heartbeat_ms,
            m.session_timeout_ms) for m in sorted(group.members.values(),
                                                  key=lambda m: m.member_id))
        return GroupDescription(group_id, self.group_state(group_id), group.epoch,
                                group.target_epoch, group.assignor, members)

    def list_groups(self) -> list[GroupListing]:
        return [GroupListing(g, self.group_state(g), len(self.groups[g].members))
                for g in sorted(self.groups)]

    def _session_timeout(self, value: int | None) -> int | None:
        if value is None:
            return None
        if not self.min_session_timeout_ms <= value <= self.max_session_timeout_ms:
            raise errors.InvalidSessionTimeoutError(
                f"session timeout {value} ms is outside [{self.min_session_timeout_ms}, "
                f"{self.max_session_timeout_ms}] ms")
        return value
