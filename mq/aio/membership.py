"""The heartbeat of an asyncio consumer in a group: a task driving its ``GroupMember``
(``mq/client/group_member.py``, the sans-I/O state machine of KIP-848's consumer protocol),
as ``mq/client/membership.py``'s thread drives the threaded consumer's.

``AsyncMembership`` owns a connection of its own (the broker knows the member by it: the
connection closing is the member leaving) and one task that heartbeats every
``heartbeat_interval_ms``, at once when the broker pushes ``[68, 0, ...]`` on that connection
(the member's assignment changed) and at once when the consumer asks (it finished revoking).
It feeds the member the replies, the clock and the consumer's progress, sends what the member
asks, and calls ``wake`` when the member's ``version`` moved. Everything runs in the event
loop's thread, so the member needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from mq import errors
from mq.aio.connection import AsyncConnection, open_connection
from mq.client.group_member import JOIN_EPOCH, GroupMember
from mq.client.types import TopicPartition
from mq.protocol.messages import Api, Response

__all__ = ["AsyncMembership"]

log = logging.getLogger("mq.client.membership")

_RECONNECT_BACKOFF_S = (0.02, 0.5)


class AsyncMembership:
    """The heartbeat task driving a ``GroupMember`` (see the module doc). ``start`` creates
    the task; ``leave`` ends it."""

    def __init__(self, socket_path: str | None, group_id: str, *,
                 topics: Iterable[str] = (), pattern: str | None = None,
                 instance_id: str | None = None, assignor: str | None = None,
                 session_timeout_ms: int = 45_000, max_poll_interval_ms: int = 300_000,
                 request_timeout: float = 30.0, wake: Callable[[], None]) -> None:
        self.socket_path = socket_path
        self.group_id = group_id
        self.member = GroupMember(group_id, topics=topics, pattern=pattern,
                                  instance_id=instance_id, assignor=assignor,
                                  session_timeout_ms=session_timeout_ms,
                                  max_poll_interval_ms=max_poll_interval_ms,
                                  now=time.monotonic())
        self._timeout = request_timeout
        self._wake = wake
        self.joined = asyncio.Event()
        self._replied = asyncio.Event()       # set on every reply, error or loss
        self._poked = asyncio.Event()
        self._long_sleep = False
        self._stopping = False
        self._static_leave = instance_id is not None
        self._conn: AsyncConnection | None = None
        self._backoff = _RECONNECT_BACKOFF_S[0]
        self._task: asyncio.Task | None = None

    @property
    def version(self) -> int:
        """Moves with every change the consumer must act on."""
        return self.member.version

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"mq-heartbeat-{self.group_id}")

    # --- called by the consumer ---------------------------------------------------------------
    def heartbeat_now(self) -> None:
        self.member.hb_due = True
        self._poked.set()

    def reconciling(self, reading: frozenset[TopicPartition]
                    ) -> tuple[int, frozenset[TopicPartition], bool, Exception | None]:
        return self.member.reconciling(reading)

    def set_owned(self, owned: frozenset[TopicPartition], *, lost_handled: bool = False) -> None:
        self.member.set_owned(owned, lost_handled=lost_handled)
        self._poked.set()

    def reconciled(self, owned: frozenset[TopicPartition]) -> None:
        if self.member.reconciled(owned):
            self._poked.set()

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None) -> None:
        self.member.subscribe(topics, pattern)
        self._poked.set()

    def poll_started(self) -> None:
        self.member.poll_started(time.monotonic())

    def poll_ended(self) -> None:
        self.member.poll_ended(time.monotonic())
        if self._long_sleep:             # sleeping as if polling went on: re-time the sleep
            self._long_sleep = False
            self._poked.set()

    def commit_identity(self) -> tuple[str, int]:
        return self.member.commit_identity()

    def commit_stamp(self) -> tuple[str, int, int]:
        return self.member.commit_stamp()

    async def wait_commit_retry(self, partitions: frozenset[TopicPartition], first: int,
                                last: int, timeout: float) -> tuple[str, int, int] | None:
        """``GroupMember.retry_commit``, waiting up to ``timeout`` for the heartbeat it needs
        (asked for at once); None if none came in time."""
        self.heartbeat_now()
        deadline = time.monotonic() + timeout
        while True:
            self._replied.clear()
            retry = self.member.retry_commit(partitions, first, last)
            remaining = deadline - time.monotonic()
            if retry is not None or remaining <= 0:
                return retry
            try:
                await asyncio.wait_for(self._replied.wait(), remaining)
            except TimeoutError:
                return None

    async def leave(self, timeout: float = 5.0) -> None:
        """Leave the group (a static member: temporarily) and end the task."""
        self._stopping = True
        self.heartbeat_now()
        task = self._task
        if task is not None and task is not asyncio.current_task():
            try:
                await asyncio.wait_for(task, timeout)
            except TimeoutError:
                task.cancel()
        self._drop_connection()

    # --- the task ---------------------------------------------------------------------------
    async def _run(self) -> None:
        member = self.member
        try:
            while not self._stopping:
                if self._conn is None and not await self._connect():
                    await self._sleep(self._backoff)
                    self._backoff = min(self._backoff * 2, _RECONNECT_BACKOFF_S[1])
                    continue
                if await self._poll_interval_exceeded():
                    continue
                if member.lost:               # the consumer must drop its partitions first
                    await self._sleep(member.interval_s)
                    continue
                if not (member.hb_due or time.monotonic() >= member.next_hb):
                    await self._sleep(self._until_next_check())
                    continue
                try:
                    await self._heartbeat()
                except (errors.BrokerUnavailableError, TimeoutError, OSError) as err:
                    log.info("group %s: heartbeat connection lost: %s", self.group_id, err)
                    self._drop_connection()
                    continue
                if member.error is not None:
                    return
            await self._send_leave()
        except Exception as err:          # a bug: surface it in the consumer, never hang
            log.exception("group %s: heartbeat task failed", self.group_id)
            self._fail(err)
        finally:
            self._drop_connection()

    async def _connect(self) -> bool:
        try:
            conn = await open_connection(self.socket_path, "mq-consumer-group", self._timeout)
        except errors.BrokerUnavailableError:
            return False
        conn.on_push(Api.CONSUMER_GROUP_HEARTBEAT, self._pushed)
        if self.member.connected(conn.broker_info["generation"]):
            self._wake()
        self._replied.set()
        self._conn = conn
        self._backoff = _RECONNECT_BACKOFF_S[0]
        return True

    def _pushed(self, reply: Response) -> None:
        """The broker's push (the assignment changed), or the connection's loss: look now."""
        self.member.hb_due = True
        self._poked.set()

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _until_next_check(self) -> float:
        """Until the next heartbeat, or until ``max_poll_interval_ms`` could run out; while
        the consumer is inside a read that cannot happen, and ``poll_ended`` re-times the
        sleep (``_long_sleep``)."""
        self._long_sleep = self.member.in_poll
        return self.member.next_check(time.monotonic())

    async def _poll_interval_exceeded(self) -> bool:
        """``max_poll_interval_ms`` without a read: leave, and rejoin once read again."""
        member = self.member
        if not member.poll_interval_exceeded(time.monotonic()):
            return False
        if member.epoch > 0:
            await self._send_leave(static=False)
            member.left_for_poll_interval()
            self._replied.set()
            self._wake()
        await self._sleep(min(member.interval_s, 0.5))
        return True

    async def _heartbeat(self) -> None:
        member = self.member
        fields = member.heartbeat_request()
        conn = self._conn
        if conn is None or conn.closed:
            raise errors.BrokerUnavailableError("the heartbeat connection is closed")
        reply = await conn.reply(conn.request(Api.CONSUMER_GROUP_HEARTBEAT, *fields))
        if reply.error_code:
            member.on_heartbeat_error(reply.error_code, reply.error_message or "")
            if member.error is not None:
                self.joined.set()
            self._replied.set()
            self._wake()
            return
        changed = member.on_heartbeat_reply(
            reply["member_id"], reply["member_epoch"], reply["heartbeat_interval_ms"],
            reply["assignment"], time.monotonic())
        self._replied.set()
        self.joined.set()
        if changed:
            self._wake()

    def _fail(self, err: Exception) -> None:
        self.member.fail(err)
        self._replied.set()
        self.joined.set()
        self._wake()

    async def _send_leave(self, static: bool | None = None) -> None:
        static = self._static_leave if static is None else static
        fields = self.member.leave_request(static)
        if self._conn is None or fields is None:
            return
        try:
            await self._conn.reply(self._conn.request(Api.CONSUMER_GROUP_HEARTBEAT, *fields),
                                   min(self._timeout, 5.0))
        except (errors.MQError, TimeoutError) as err:
            log.debug("group %s: leave failed (the connection closing does it): %s",
                      self.group_id, err)
        self.member.epoch = JOIN_EPOCH

    async def _sleep(self, seconds: float) -> None:
        """Until ``seconds`` pass, the broker pushes, or the consumer asks."""
        self._poked.clear()
        try:
            await asyncio.wait_for(self._poked.wait(), seconds)
        except TimeoutError:
            pass
