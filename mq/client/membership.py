"""A consumer's membership in a consumer group: the heartbeat thread of Kafka's modern
consumer protocol (KIP-848), talking to the broker-side coordinator
(``mq.broker.group_coordinator``).

Two threads share the state below under one lock:

- the *heartbeat thread* owns a connection of its own (the broker knows the member by it: the
  connection closing is the member leaving). It heartbeats every ``heartbeat_interval_ms``, at
  once when the broker pushes ``[68, 0, ...]`` on that connection (the member's assignment
  changed: another member died, joined or revoked) and at once when the poll thread asks
  (it finished revoking). It stores the broker's assignment in ``target`` and posts the
  consumer's semaphore so a poll blocked on it looks at once.
- the *poll thread* (the user's, inside ``Consumer.poll``) reconciles: it takes ``target``
  (``reconciling``), revokes what left it (commit, ``on_partitions_revoked``), starts what
  joined it (committed offsets, ``on_partitions_assigned``) and records the result in ``owned``
  (``reconciled``). A partition therefore moves only after its old owner stopped reading it.

A heartbeat reports as owned everything the poll thread may read before it sees the reply:
``owned``, the latest ``target`` and the target it is reconciling (``starting``). The broker
hands a granted partition on as soon as a heartbeat leaves it out (it takes that for a lost
response), so reporting only ``owned`` would let a partition go while the poll thread, acting
on an assignment received a moment before, starts it: two members would read it at once. A
report that shrank (a partition revoked, or taken back before it was started) is sent at once.

Fencing (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH), a connection lost to a broker that kept
running, or ``max_poll_interval_ms`` without a poll set ``lost``: the poll thread drops every
partition (``on_partitions_lost``) before the member rejoins with epoch 0. When the broker
restarted instead (a new broker generation), nothing was lost: the member rejoins at once and
reports what it owns, and keeps consuming meanwhile.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable

from mq import errors
from mq.client.connection import Connection, poll_ms
from mq.client.types import TopicPartition
from mq.protocol.messages import PUSH_REQUEST_ID, Api

__all__ = ["ConsumerRebalanceListener", "Membership"]

log = logging.getLogger(__name__)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2
_RECONNECT_BACKOFF_S = (0.02, 0.5)
_REJOIN_CODES = frozenset({errors.UnknownMemberIdError.code, errors.FencedMemberEpochError.code})
_EMPTY: frozenset[TopicPartition] = frozenset()


class ConsumerRebalanceListener:
    """Override any of these; they run inside ``poll`` on the consumer's thread.

    ``on_partitions_revoked``: these partitions go to another member after this returns —
    commit what you processed (auto-commit already did). ``on_partitions_assigned``: newly
    yours, positioned at the committed offsets. ``on_partitions_lost``: taken away without a
    revocation (fenced, session expired, max.poll.interval exceeded); another member may
    already own them, so do not commit. By default it calls ``on_partitions_revoked``,
    Kafka's behaviour.
    """

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.on_partitions_revoked(lost)


class Membership(threading.Thread):
    """The heartbeat thread and the state it shares with the poll thread (see module doc)."""

    def __init__(self, socket_path: str | None, group_id: str, *,
                 topics: Iterable[str] = (), pattern: str | None = None,
                 instance_id: str | None = None, assignor: str | None = None,
                 session_timeout_ms: int = 45_000, max_poll_interval_ms: int = 300_000,
                 request_timeout: float = 30.0, wake: Callable[[], None]) -> None:
        super().__init__(name=f"mq-heartbeat-{group_id}", daemon=True)
        self.socket_path = socket_path
        self.group_id = group_id
        self.instance_id = instance_id
        self.assignor = assignor
        self.session_timeout_ms = session_timeout_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self._timeout = request_timeout
        self._wake = wake
        self.lock = threading.Lock()
        self._epoch_changed = threading.Condition(self.lock)
        self._topics = sorted(set(topics))
        self._pattern = pattern
        self._send_subscription = True
        self.member_id: str | None = None
        self.epoch = JOIN_EPOCH
        self.target: frozenset[TopicPartition] = _EMPTY
        self.owned: frozenset[TopicPartition] = _EMPTY
        # the target the poll thread is reconciling (between ``reconciling`` and ``reconciled``)
        self.starting: frozenset[TopicPartition] = _EMPTY
        self._reported: frozenset[TopicPartition] = _EMPTY     # in the last heartbeat sent
        self.lost = False
        self.version = 0               # bumped on every change the poll thread must act on
        self.error: Exception | None = None
        self.joined = threading.Event()
        self.last_poll = time.monotonic()
        self.in_poll = False
        self._interval = 1.0
        self._hb_due = True             # heartbeat at the next turn of the loop
        self._next_hb = 0.0
        self._long_sleep = False
        self._stopping = False
        self._static_leave = instance_id is not None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._conn: Connection | None = None
        self._generation: int | None = None
        self._backoff = _RECONNECT_BACKOFF_S[0]

    # --- called by the poll thread ------------------------------------------------------------
    def heartbeat_now(self) -> None:
        self._hb_due = True
        self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"h")
        except OSError:                 # full (it is non-blocking) or closed: awake anyway
            pass

    def reconciling(self, reading: frozenset[TopicPartition]
                    ) -> tuple[int, frozenset[TopicPartition], bool, Exception | None]:
        """The poll thread, reading ``reading``, starts reconciling: the ``(version, target,
        lost, error)`` to act on. Until ``reconciled``, heartbeats report that target as owned:
        the poll thread may start any of it even after a newer reply took part of it away."""
        with self.lock:
            self.owned, self.starting = reading, self.target
            return self.version, self.target, self.lost, self.error

    def set_owned(self, owned: frozenset[TopicPartition], *, lost_handled: bool = False) -> None:
        with self.lock:
            self.owned = owned
            if lost_handled:
                self.lost = False
        self.heartbeat_now()

    def reconciled(self, owned: frozenset[TopicPartition]) -> None:
        """The poll thread finished reconciling and reads exactly ``owned``; heartbeat at once
        if the broker still counts on us for a partition we will not read."""
        with self.lock:
            self.owned, self.starting = owned, _EMPTY
            shrank = bool(self._reported - self._report())
        if shrank:
            self.heartbeat_now()

    def _report(self) -> frozenset[TopicPartition]:
        """(lock held) What the poll thread may be reading until it sees the next reply."""
        return self.owned | self.target | self.starting

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None) -> None:
        with self.lock:
            self._topics, self._pattern = sorted(set(topics)), pattern
            self._send_subscription = True
        self.heartbeat_now()

    def poll_started(self) -> None:
        """The poll thread is inside ``poll``: waiting there counts as polling."""
        self.last_poll = time.monotonic()
        self.in_poll = True

    def poll_ended(self) -> None:
        self.last_poll = time.monotonic()
        self.in_poll = False
        if self._long_sleep:            # sleeping as if polling went on: re-time the sleep
            self._long_sleep = False
            self._poke()

    def commit_identity(self) -> tuple[str, int]:
        with self.lock:
            if self.member_id is None or self.epoch <= 0:
                return self.member_id or "", -1
            return self.member_id, self.epoch

    def wait_for_epoch_change(self, epoch: int, timeout: float) -> None:
        """Ask for a heartbeat and wait until the member epoch is not ``epoch``."""
        self.heartbeat_now()
        with self.lock:
            self._epoch_changed.wait_for(lambda: self.epoch != epoch or self.error is not None,
                                         timeout)

    def leave(self, timeout: float = 5.0) -> None:
        """Leave the group (a static member: temporarily) and stop the thread."""
        self._stopping = True
        self.heartbeat_now()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # --- the heartbeat thread -----------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self._stopping:
                if self._conn is None and not self._connect():
                    self._sleep(self._backoff)
                    self._backoff = min(self._backoff * 2, _RECONNECT_BACKOFF_S[1])
                    continue
                if self._poll_interval_exceeded():
                    continue
                if self._must_wait_for_poll_thread():
                    self._sleep(self._interval)
                    continue
                if not self._hb_due and time.monotonic() < self._next_hb:
                    self._sleep(self._until_next_check())
                    continue
                self._hb_due = False
                try:
                    self._heartbeat()
                except (errors.BrokerUnavailableError, TimeoutError, OSError) as err:
                    log.info("group %s: heartbeat connection lost: %s", self.group_id, err)
                    self._drop_connection()
                    continue
                if self.error is not None:
                    return
                self._next_hb = time.monotonic() + self._interval
                if self._conn.take_pushed(PUSH_REQUEST_ID):
                    self._hb_due = True
            self._send_leave()
        except Exception as err:      # a bug: surface it in poll instead of dying silently
            log.exception("group %s: heartbeat thread failed", self.group_id)
            self._fail(err)
        finally:
            self._drop_connection()

    def _connect(self) -> bool:
        try:
            conn = Connection(self.socket_path, "mq-consumer-group", self._timeout)
        except errors.BrokerUnavailableError:
            return False
        generation = conn.broker_info["generation"]
        with self.lock:
            if self._generation is not None and generation == self._generation:
                # The same broker saw our connection close: it removed us, and others may
                # own our partitions now.
                self._set_lost("the heartbeat connection was lost")
            self.epoch = JOIN_EPOCH             # a join sends the subscription
        self._generation = generation
        self._conn = conn
        self._hb_due = True
        self._backoff = _RECONNECT_BACKOFF_S[0]
        return True

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _until_next_check(self) -> float:
        """Sleep until the next heartbeat, or until ``max_poll_interval_ms`` could run out.
        While the poll thread is inside ``poll`` that cannot happen; ``poll_ended`` then
        interrupts the sleep (``_long_sleep``) so it is timed again."""
        now = time.monotonic()
        wait = self._next_hb - now
        self._long_sleep = True           # before looking at in_poll: no lost poke
        if not self.in_poll:
            self._long_sleep = False
            wait = min(wait, self.last_poll + self.max_poll_interval_ms / 1000 - now + 0.001)
        return max(0.001, wait)

    def _poll_interval_exceeded(self) -> bool:
        """``max_poll_interval_ms`` without a poll: leave, and rejoin once polled again."""
        if self.in_poll or \
                (time.monotonic() - self.last_poll) * 1000 <= self.max_poll_interval_ms:
            return False
        with self.lock:
            joined = self.epoch > 0
        if joined:
            log.warning("group %s: no poll for max_poll_interval_ms=%d; leaving the group",
                        self.group_id, self.max_poll_interval_ms)
            self._send_leave(static=False)
            with self.lock:
                self._set_lost("max_poll_interval_ms passed without a poll")
                self.epoch = JOIN_EPOCH
        self._sleep(min(self._interval, 0.5))
        return True

    def _must_wait_for_poll_thread(self) -> bool:
        """After a loss the poll thread must drop its partitions before we rejoin."""
        with self.lock:
            return self.lost

    def _heartbeat(self) -> None:
        with self.lock:
            joining = self.epoch == JOIN_EPOCH
            send_sub = self._send_subscription or joining
            self._reported = self._report()
            fields = (self.group_id, self.member_id, self.epoch, self.instance_id,
                      self.max_poll_interval_ms, self.session_timeout_ms,
                      (None if self._pattern is not None else self._topics) if send_sub
                      else None,
                      self._pattern if send_sub else None,
                      self.assignor if send_sub else None,
                      sorted([tp.topic, tp.partition] for tp in self._reported))
            self._send_subscription = False
        reply = self._conn.wait_raw(self._conn.send(Api.CONSUMER_GROUP_HEARTBEAT, *fields))
        if reply.error_code:
            self._heartbeat_error(reply.error_code, reply.error_message or "")
            return
        member_id, epoch = reply["member_id"], reply["member_epoch"]
        interval_ms, assignment = reply["heartbeat_interval_ms"], reply["assignment"]
        target = frozenset(TopicPartition(t, p) for t, p in assignment)
        with self.lock:
            self.member_id, self.epoch = member_id, epoch
            self._epoch_changed.notify_all()
            self._interval = max(0.001, interval_ms / 1000)
            changed = target != self.target
            if changed:
                self.target = target
                self.version += 1
            if self._reported - self._report():
                self._hb_due = True       # released before the poll thread started it: say so
        self.joined.set()
        if changed:
            self._wake()

    def _heartbeat_error(self, code: int, message: str) -> None:
        with self.lock:
            if code in _REJOIN_CODES:
                log.info("group %s: %s; rejoining", self.group_id, message)
                self._set_lost(message)
                self.epoch = JOIN_EPOCH
                self._hb_due = True           # rejoin at once (after the poll thread let go)
                if code == errors.UnknownMemberIdError.code:
                    self.member_id = None
                return
        self._fail(errors.error_for_code(code, f"group {self.group_id!r}: {message}"))

    def _set_lost(self, reason: str) -> None:
        """(lock held) The poll thread must drop everything it owns."""
        if self.owned or self.target:
            log.warning("group %s: partitions lost: %s", self.group_id, reason)
        self.target = _EMPTY
        self.lost = bool(self.owned or self.starting)
        self.version += 1
        self._wake()

    def _fail(self, err: Exception) -> None:
        with self.lock:
            self.error = err
            self.version += 1
        self.joined.set()
        self._wake()

    def _send_leave(self, static: bool | None = None) -> None:
        with self.lock:
            member_id, joined = self.member_id, self.epoch > 0
        if self._conn is None or member_id is None or not joined:
            return
        static = self._static_leave if static is None else static
        try:
            self._conn.call(Api.CONSUMER_GROUP_HEARTBEAT, self.group_id, member_id,
                            LEAVE_STATIC_EPOCH if static else LEAVE_EPOCH, self.instance_id,
                            -1, -1, None, None, None, None, timeout=min(self._timeout, 5.0))
        except errors.MQError as err:
            log.debug("group %s: leave failed (the connection closing does it): %s",
                      self.group_id, err)
        with self.lock:
            self.epoch = JOIN_EPOCH

    def _sleep(self, seconds: float) -> None:
        """Until ``seconds`` pass, the broker pushes, or the poll thread asks."""
        conn_fd = self._conn.fileno() if self._conn is not None else -1
        # poll, not select: select() fails for a descriptor >= 1024 (FD_SETSIZE).
        try:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            if conn_fd >= 0:
                poller.register(conn_fd, select.POLLIN)
            readable = {fd for fd, _ in poller.poll(poll_ms(seconds))}
        except (OSError, ValueError):
            return
        if self._wake_r in readable:
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass
        if self._conn is not None and conn_fd in readable:
            self._hb_due = True                         # the push: heartbeat now
            try:
                self._conn.ready()
            except errors.BrokerUnavailableError:
                self._drop_connection()
