"""A consumer's membership in a group as a state machine without I/O: Kafka's modern consumer
protocol (KIP-848) as the member sees it, against the broker's coordinator
(``mq.broker.group_coordinator``).

In: heartbeat replies and errors, the heartbeat connection (re)opened, the clock (``now``,
monotonic seconds) and the poll thread's progress (``poll_started``/``poll_ended``,
``reconciling``/``set_owned``/``reconciled``). Out: the ConsumerGroupHeartbeat request to send
(``heartbeat_request``, ``leave_request``), when to send it (``hb_due``, ``next_check``), and what
the poll thread must act on: ``version`` changes with every new ``target`` (start and revoke),
``lost`` (drop everything), ``error`` (fatal). ``membership.Membership`` drives it from the
heartbeat thread, under its lock.

Invariants:

- A heartbeat reports as owned everything the poll thread may read before it sees the reply:
  ``owned``, the latest ``target`` and the target it is reconciling (``starting``). The broker
  hands a granted partition on as soon as a heartbeat leaves it out (it takes that for a lost
  response), so reporting only ``owned`` would let a partition go while the poll thread, acting
  on an assignment received a moment before, starts it: two members would read it at once.
- A report that shrank (a partition revoked, or taken back before it was started) is due at
  once (``hb_due``).
- Fencing (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH), a connection lost to a broker that kept
  running, or ``max_poll_interval_ms`` without a poll set ``lost``: the poll thread drops every
  partition before the member rejoins with epoch 0. When the broker restarted instead (a new
  broker generation) nothing was lost: the member rejoins at once and reports what it owns.
- An offset commit refused for its member id or epoch (the epoch moved while it was in flight;
  the broker restarted and the member has not rejoined it yet), or cut off by the broker going
  away, goes again with the id and epoch of a later heartbeat reply only if every partition it
  commits stayed in ``target`` since the commit was first sent (``retry_commit``): one that
  left it may have another owner now, and its offset is not this member's to commit (a
  zombie's commit: ``CommitFailedError``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from mq import errors
from mq.client.types import TopicPartition

__all__ = ["JOIN_EPOCH", "LEAVE_EPOCH", "LEAVE_STATIC_EPOCH", "GroupMember"]

log = logging.getLogger("mq.client.membership")

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2
_REJOIN_CODES = frozenset({errors.UnknownMemberIdError.code, errors.FencedMemberEpochError.code})
_EMPTY: frozenset[TopicPartition] = frozenset()


class GroupMember:
    """One member's state (module doc). Not thread-safe: its driver holds a lock."""

    def __init__(self, group_id: str, *, topics: Iterable[str] = (), pattern: str | None = None,
                 instance_id: str | None = None, assignor: str | None = None,
                 session_timeout_ms: int = 45_000, max_poll_interval_ms: int = 300_000,
                 now: float = 0.0) -> None:
        self.group_id = group_id
        self.instance_id = instance_id
        self.assignor = assignor
        self.session_timeout_ms = session_timeout_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self._topics = sorted(set(topics))
        self._pattern = pattern
        self._send_subscription = True
        self.member_id: str | None = None
        self.epoch = JOIN_EPOCH
        self.target: frozenset[TopicPartition] = _EMPTY
        self.owned: frozenset[TopicPartition] = _EMPTY
        # the target the poll thread is reconciling (between ``reconciling`` and ``reconciled``)
        self.starting: frozenset[TopicPartition] = _EMPTY
        self.reported: frozenset[TopicPartition] = _EMPTY     # in the last heartbeat sent
        self.lost = False
        self.version = 0               # bumped on every change the poll thread must act on
        self.error: Exception | None = None
        self.interval_s = 1.0
        self.hb_due = True             # heartbeat at the next turn of the driver's loop
        self.next_hb = 0.0
        self.last_poll = now
        self.in_poll = False
        self._generation: int | None = None
        self.replies = 0               # successful heartbeat replies so far
        # each partition of ``target``: the reply (count) since which it has been there
        self._held_since: dict[TopicPartition, int] = {}

    # --- the poll thread ------------------------------------------------------------------------
    def reconciling(self, reading: frozenset[TopicPartition]
                    ) -> tuple[int, frozenset[TopicPartition], bool, Exception | None]:
        """The poll thread, reading ``reading``, starts reconciling: the ``(version, target,
        lost, error)`` to act on. Until ``reconciled``, heartbeats report that target as owned:
        the poll thread may start any of it even after a newer reply took part of it away."""
        self.owned, self.starting = reading, self.target
        return self.version, self.target, self.lost, self.error

    def set_owned(self, owned: frozenset[TopicPartition], *, lost_handled: bool = False) -> None:
        """The poll thread stopped reading what is not in ``owned`` (report it at once)."""
        self.owned = owned
        if lost_handled:
            self.lost = False
        self.hb_due = True

    def reconciled(self, owned: frozenset[TopicPartition]) -> bool:
        """The poll thread finished reconciling and reads exactly ``owned``. True (a
        heartbeat is due) if the broker still counts on us for a partition we will not read."""
        self.owned, self.starting = owned, _EMPTY
        shrank = bool(self.reported - self._report())
        if shrank:
            self.hb_due = True
        return shrank

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None) -> None:
        self._topics, self._pattern = sorted(set(topics)), pattern
        self._send_subscription = True
        self.hb_due = True

    def poll_started(self, now: float) -> None:
        """The poll thread is inside ``poll``: waiting there counts as polling."""
        self.last_poll = now
        self.in_poll = True

    def poll_ended(self, now: float) -> None:
        self.last_poll = now
        self.in_poll = False

    def commit_identity(self) -> tuple[str, int]:
        """``(member id, epoch)`` for an offset commit; epoch -1 until joined."""
        if self.member_id is None or self.epoch <= 0:
            return self.member_id or "", -1
        return self.member_id, self.epoch

    def commit_stamp(self) -> tuple[str, int, int]:
        """``(member id, epoch, replies)`` for a commit that ``retry_commit`` may send again:
        the member's own id and epoch even while it rejoins (epoch 0), so that the broker
        refuses the commit instead of taking it for a group-less one."""
        return self.member_id or "", self.epoch, self.replies

    def retry_commit(self, partitions: Iterable[TopicPartition], first: int,
                     last: int) -> tuple[str, int, int] | None:
        """A commit of ``partitions`` first sent at ``commit_stamp`` reply count ``first``,
        last at ``last``, was refused for its member id or epoch, or cut off: the
        ``commit_stamp`` to send it again with, once a reply came since ``last`` (None until
        then). Raises ``CommitFailedError`` if a partition left ``target`` since ``first``
        (fenced, lost, or not granted again after a broker restart), and the member's fatal
        error."""
        if self.error is not None:
            raise self.error
        moved = sorted(tp for tp in partitions if self._held_since.get(tp, first + 1) > first)
        if moved:
            raise errors.CommitFailedError(
                f"group {self.group_id!r}: cannot commit "
                f"{', '.join(f'{tp.topic}-{tp.partition}' for tp in moved)}: no longer assigned "
                f"to this member (another member may own them now)")
        if self.replies <= last or self.epoch <= 0:
            return None
        return self.commit_stamp()

    def _report(self) -> frozenset[TopicPartition]:
        """What the poll thread may be reading until it sees the next reply."""
        return self.owned | self.target | self.starting

    # --- the heartbeat ----------------------------------------------------------------------
    def connected(self, generation: int) -> bool:
        """A heartbeat connection opened to a broker of ``generation``: join (again). True if
        the partitions are lost (the same broker saw our connection close: it removed us,
        and others may own them now): wake the poll thread."""
        lost = self._generation is not None and generation == self._generation
        if lost:
            self._set_lost("the heartbeat connection was lost")
        self.epoch = JOIN_EPOCH               # a join sends the subscription
        self._generation = generation
        self.hb_due = True
        return lost

    def heartbeat_request(self) -> tuple:
        """The ConsumerGroupHeartbeat fields to send now (the subscription when joining or
        changed; the partitions reported as owned)."""
        send_sub = self._send_subscription or self.epoch == JOIN_EPOCH
        self.reported = self._report()
        self._send_subscription = False
        self.hb_due = False
        return (self.group_id, self.member_id, self.epoch, self.instance_id,
                self.max_poll_interval_ms, self.session_timeout_ms,
                (None if self._pattern is not None else self._topics) if send_sub else None,
                self._pattern if send_sub else None,
                self.assignor if send_sub else None,
                sorted([tp.topic, tp.partition] for tp in self.reported))

    def on_heartbeat_reply(self, member_id: str, epoch: int, interval_ms: int,
                           assignment: Iterable, now: float) -> bool:
        """A successful reply. True if the assignment changed (wake the poll thread)."""
        target = frozenset(TopicPartition(t, p) for t, p in assignment)
        self.member_id, self.epoch = member_id, epoch
        self.replies += 1
        self.interval_s = max(0.001, interval_ms / 1000)
        self.next_hb = now + self.interval_s
        changed = target != self.target
        if changed:
            self.target = target
            self._held_since = {tp: self._held_since.get(tp, self.replies) for tp in target}
            self.version += 1
        if self.reported - self._report():
            self.hb_due = True            # released before the poll thread started it: say so
        return changed

    def on_heartbeat_error(self, code: int, message: str) -> None:
        """An error reply: fenced or unknown, rejoin once the poll thread let go; anything
        else is fatal (``error``). Either way the poll thread must look."""
        if code in _REJOIN_CODES:
            log.info("group %s: %s; rejoining", self.group_id, message)
            self._set_lost(message)
            self.epoch = JOIN_EPOCH
            self.hb_due = True                # rejoin at once (after the poll thread let go)
            if code == errors.UnknownMemberIdError.code:
                self.member_id = None
            return
        self.fail(errors.error_for_code(code, f"group {self.group_id!r}: {message}"))

    def poll_interval_exceeded(self, now: float) -> bool:
        """``max_poll_interval_ms`` passed without a poll."""
        return not self.in_poll and (now - self.last_poll) * 1000 > self.max_poll_interval_ms

    def left_for_poll_interval(self) -> None:
        """The member left after ``poll_interval_exceeded``: it rejoins once polled again."""
        log.warning("group %s: no poll for max_poll_interval_ms=%d; left the group",
                    self.group_id, self.max_poll_interval_ms)
        self._set_lost("max_poll_interval_ms passed without a poll")
        self.epoch = JOIN_EPOCH

    def leave_request(self, static: bool) -> tuple | None:
        """The heartbeat that leaves the group (a static member: temporarily), or None when
        not joined."""
        if self.member_id is None or self.epoch <= 0:
            return None
        return (self.group_id, self.member_id, LEAVE_STATIC_EPOCH if static else LEAVE_EPOCH,
                self.instance_id, -1, -1, None, None, None, None)

    def next_check(self, now: float) -> float:
        """Seconds until the next heartbeat, or until ``max_poll_interval_ms`` could run out
        (it cannot while the poll thread is inside ``poll``)."""
        wait = self.next_hb - now
        if not self.in_poll:
            wait = min(wait, self.last_poll + self.max_poll_interval_ms / 1000 - now + 0.001)
        return max(0.001, wait)

    def _set_lost(self, reason: str) -> None:
        """The poll thread must drop everything it owns."""
        if self.owned or self.target:
            log.warning("group %s: partitions lost: %s", self.group_id, reason)
        self.target = _EMPTY
        self._held_since = {}
        self.lost = bool(self.owned or self.starting)
        self.version += 1

    def fail(self, err: Exception) -> None:
        """Fatal: ``poll`` raises ``err``."""
        self.error = err
        self.version += 1
