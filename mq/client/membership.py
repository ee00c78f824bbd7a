"""The heartbeat thread of a consumer in a group: the driver of its ``GroupMember``
(``group_member.py``, the sans-I/O state machine of KIP-848's consumer protocol), and the
listener interface of rebalances.

``Membership`` owns a connection of its own (the broker knows the member by it: the connection
closing is the member leaving) and a thread that heartbeats every ``heartbeat_interval_ms``, at
once when the broker pushes ``[68, 0, ...]`` on that connection (the member's assignment
changed: another member died, joined or revoked) and at once when the poll thread asks (it
finished revoking). It feeds the member the replies, the clock and the poll thread's progress,
sends what the member asks, and wakes a poll blocked in the consumer when the member's
``version`` moved. The poll thread (``ConsumerGroup``) reconciles through the methods below; the
member's state is only touched under ``lock``, never across I/O.

A partition therefore moves only after its old owner stopped reading it (``group_member.py``
says why heartbeats report more than ``owned``).
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
from mq.client.group_member import JOIN_EPOCH, GroupMember
from mq.client.types import TopicPartition
from mq.protocol.messages import PUSH_REQUEST_ID, Api

__all__ = ["ConsumerRebalanceListener", "Membership"]

log = logging.getLogger(__name__)

_RECONNECT_BACKOFF_S = (0.02, 0.5)


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
    """The heartbeat thread driving a ``GroupMember`` (see the module doc)."""

    def __init__(self, socket_path: str | None, group_id: str, *,
                 topics: Iterable[str] = (), pattern: str | None = None,
                 instance_id: str | None = None, assignor: str | None = None,
                 session_timeout_ms: int = 45_000, max_poll_interval_ms: int = 300_000,
                 request_timeout: float = 30.0, wake: Callable[[], None]) -> None:
        super().__init__(name=f"mq-heartbeat-{group_id}", daemon=True)
        self.socket_path = socket_path
        self.group_id = group_id
        self.member = GroupMember(group_id, topics=topics, pattern=pattern,
                                  instance_id=instance_id, assignor=assignor,
                                  session_timeout_ms=session_timeout_ms,
                                  max_poll_interval_ms=max_poll_interval_ms,
                                  now=time.monotonic())
        self._timeout = request_timeout
        self._wake = wake
        self.lock = threading.Lock()
        self._replied = threading.Condition(self.lock)   # a reply, error, or lost partitions
        self.joined = threading.Event()
        self._long_sleep = False
        self._stopping = False
        self._static_leave = instance_id is not None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._conn: Connection | None = None
        self._backoff = _RECONNECT_BACKOFF_S[0]

    @property
    def version(self) -> int:
        """Moves with every change the poll thread must act on (an int read: no lock)."""
        return self.member.version

    # --- called by the poll thread ------------------------------------------------------------
    def heartbeat_now(self) -> None:
        with self.lock:
            self.member.hb_due = True
        self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"h")
        except OSError:                 # full (it is non-blocking) or closed: awake anyway
            pass

    def reconciling(self, reading: frozenset[TopicPartition]
                    ) -> tuple[int, frozenset[TopicPartition], bool, Exception | None]:
        """``GroupMember.reconciling``."""
        with self.lock:
            return self.member.reconciling(reading)

    def set_owned(self, owned: frozenset[TopicPartition], *, lost_handled: bool = False) -> None:
        """``GroupMember.set_owned``; the heartbeat goes at once."""
        with self.lock:
            self.member.set_owned(owned, lost_handled=lost_handled)
        self._poke()

    def reconciled(self, owned: frozenset[TopicPartition]) -> None:
        """``GroupMember.reconciled``; heartbeat at once if the report shrank."""
        with self.lock:
            due = self.member.reconciled(owned)
        if due:
            self._poke()

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None) -> None:
        with self.lock:
            self.member.subscribe(topics, pattern)
        self._poke()

    def poll_started(self) -> None:
        """The poll thread is inside ``poll``: waiting there counts as polling."""
        with self.lock:
            self.member.poll_started(time.monotonic())

    def poll_ended(self) -> None:
        with self.lock:
            self.member.poll_ended(time.monotonic())
        if self._long_sleep:            # sleeping as if polling went on: re-time the sleep
            self._long_sleep = False
            self._poke()

    def commit_identity(self) -> tuple[str, int]:
        with self.lock:
            return self.member.commit_identity()

    def commit_stamp(self) -> tuple[str, int, int]:
        with self.lock:
            return self.member.commit_stamp()

    def wait_commit_retry(self, partitions: frozenset[TopicPartition], first: int, last: int,
                          timeout: float) -> tuple[str, int, int] | None:
        """``GroupMember.retry_commit``, waiting up to ``timeout`` for the heartbeat it needs
        (asked for at once); None if none came in time."""
        self.heartbeat_now()
        retry = None

        def ready() -> bool:
            nonlocal retry
            retry = self.member.retry_commit(partitions, first, last)
            return retry is not None
        with self.lock:
            self._replied.wait_for(ready, max(0.0, timeout))
        return retry

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
                with self.lock:
                    lost, interval = self.member.lost, self.member.interval_s
                    due = self.member.hb_due or time.monotonic() >= self.member.next_hb
                if lost:                  # the poll thread must drop its partitions first
                    self._sleep(interval)
                    continue
                if not due:
                    self._sleep(self._until_next_check())
                    continue
                try:
                    self._heartbeat()
                except (errors.BrokerUnavailableError, TimeoutError, OSError) as err:
                    log.info("group %s: heartbeat connection lost: %s", self.group_id, err)
                    self._drop_connection()
                    continue
                if self.member.error is not None:
                    return
                if self._conn.take_pushed(PUSH_REQUEST_ID):
                    with self.lock:
                        self.member.hb_due = True
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
        with self.lock:
            lost = self.member.connected(conn.broker_info["generation"])
            self._replied.notify_all()
        if lost:
            self._wake()
        self._conn = conn
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
        self._long_sleep = True           # before looking at in_poll: no lost poke
        with self.lock:
            in_poll = self.member.in_poll
            wait = self.member.next_check(time.monotonic())
        if not in_poll:
            self._long_sleep = False
        return wait

    def _poll_interval_exceeded(self) -> bool:
        """``max_poll_interval_ms`` without a poll: leave, and rejoin once polled again."""
        with self.lock:
            if not self.member.poll_interval_exceeded(time.monotonic()):
                return False
            joined, interval = self.member.epoch > 0, self.member.interval_s
        if joined:
            self._send_leave(static=False)
            with self.lock:
                self.member.left_for_poll_interval()
                self._replied.notify_all()
            self._wake()
        self._sleep(min(interval, 0.5))
        return True

    def _heartbeat(self) -> None:
        with self.lock:
            fields = self.member.heartbeat_request()
        reply = self._conn.wait_raw(self._conn.send(Api.CONSUMER_GROUP_HEARTBEAT, *fields))
        if reply.error_code:
            with self.lock:
                self.member.on_heartbeat_error(reply.error_code, reply.error_message or "")
                failed = self.member.error is not None
                self._replied.notify_all()
            if failed:
                self.joined.set()
            self._wake()
            return
        with self.lock:
            changed = self.member.on_heartbeat_reply(
                reply["member_id"], reply["member_epoch"], reply["heartbeat_interval_ms"],
                reply["assignment"], time.monotonic())
            self._replied.notify_all()
        self.joined.set()
        if changed:
            self._wake()

    def _fail(self, err: Exception) -> None:
        with self.lock:
            self.member.fail(err)
            self._replied.notify_all()
        self.joined.set()
        self._wake()

    def _send_leave(self, static: bool | None = None) -> None:
        static = self._static_leave if static is None else static
        with self.lock:
            fields = self.member.leave_request(static)
        if self._conn is None or fields is None:
            return
        try:
            self._conn.call(Api.CONSUMER_GROUP_HEARTBEAT, *fields,
                            timeout=min(self._timeout, 5.0))
        except errors.MQError as err:
            log.debug("group %s: leave failed (the connection closing does it): %s",
                      self.group_id, err)
        with self.lock:
            self.member.epoch = JOIN_EPOCH

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
            with self.lock:
                self.member.hb_due = True               # the push: heartbeat now
            try:
                self._conn.ready()
            except errors.BrokerUnavailableError:
                self._drop_connection()
