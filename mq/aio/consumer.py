"""``mq.aio.Consumer``: ``mq.Consumer``'s reads for asyncio, with no thread and no blocking
wait.

It reads as the threaded consumer does, through the same ``Fetcher`` (``mq/client/fetcher.py``):
records are decoded from read-only maps of the segment files, bounded by the partition slots
of the broker's shared state, with the same positions, ``auto_offset_reset`` and
``read_committed`` rules. Only the driver differs (``AsyncConsumerDriver``): its connection is
an ``AsyncConnection``, and a caught-up consumer arms a ``Wait`` that names no semaphore, so
the broker's wake-up is a push on that connection, which the event loop itself watches::

    async with mq.aio.Consumer("orders", auto_offset_reset="earliest") as consumer:
        async for record in consumer:
            ...
        batch = await consumer.getmany(timeout_ms=500)    # {tp: [Record, ...]}

Invariants:

- No wake-up is lost: the event is cleared before the ``Wait`` is armed, and the broker pushes
  at once when a watched position already has data.
- The metadata is refreshed (awaited) before a read whenever the broker's changed: the fetcher
  never reads a slot of a topic it does not know (``MetadataChangedError`` sends it back).
- A lost connection is reopened on the next call, with backoff; a restarted broker's segment
  lists are read again (the generation changes), as in the threaded consumer.

With a ``group_id`` it is a member of the group, as the threaded consumer is: the same
``ConsumerGroup`` steps (reconcile, commit, leave, committed offsets), awaited here, over a
heartbeat task (``mq/aio/membership.py``) instead of a thread. Rebalance listeners may be
plain or ``async def`` methods; auto-commit runs inside ``getmany``, as the threaded
consumer's runs inside ``poll``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from mq.aio.connection import AsyncConnection, open_connection
from mq.aio.membership import AsyncMembership
from mq.client.admin_ops import first_error
from mq.client.consumer_options import (
    check_group_options,
    check_read_options,
    check_subscription,
)
from mq.client.consumer_driver import RECONNECT_BACKOFF_S, ConsumerDriver
from mq.client.consumer_group import (FRESH_METADATA, ConsumerGroup, ConsumerRebalanceListener,
                                      CommitRetry, GroupOp, Joined, Notify, SendCommit)
from mq.client.fetcher import Fetcher, Record
from mq.client.kafka.config import backend_args, bootstrap
from mq.client.types import ConsumerGroupMetadata, TopicPartition
from mq.errors import (BrokerUnavailableError, ClosedError, MetadataChangedError, MQError,
                       UnknownTopicOrPartitionError)
from mq.protocol.messages import Api
from mq.protocol.state import StateReader

__all__ = ["AsyncConsumerDriver", "Consumer"]

log = logging.getLogger("mq.client.consumer")


class _Session:
    """One connection and the state map it names (``ConsumerDriver.state`` reads
    ``session.state``)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.generation = conn.broker_info["generation"]
        self.data_dir = conn.broker_info["data_dir"]
        self.state = StateReader(self.data_dir)

    def close(self) -> None:
        self.state.close()
        self.conn.close()


class AsyncConsumerDriver:
    """What the ``Fetcher`` asks of a driver (``data_dir``, ``generation``, ``topics``,
    ``state``, ``check_metadata``) over an ``AsyncConnection``. Slots are read by the threaded
    driver's own rules; a metadata change raises ``MetadataChangedError`` instead of calling the
    broker, and the consumer awaits ``refresh``."""

    # The threaded driver's slot rules (a topic's slot, a snapshot consistent with the
    # metadata, a WAIT's positions), over this driver's topics and session.
    slot = ConsumerDriver.slot
    state = ConsumerDriver.state
    wait_positions = ConsumerDriver.wait_positions

    def __init__(self, socket_path: str | None, timeout: float, read_committed: bool) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.read_committed = read_committed
        self.session: _Session | None = None
        self.topics: dict[str, dict] = {}
        self.meta_version = -1
        self.generation = -1
        self.data_dir = ""
        self.interrupt = lambda: None       # the group's heartbeat: the consumer must look
        self._backoff = RECONNECT_BACKOFF_S[0]

    async def connect(self, on_wake) -> None:
        """A new session (raises ``BrokerUnavailableError``); pushes of ``Wait`` and the
        connection's loss call ``on_wake``."""
        conn = await open_connection(self.socket_path, "mq-aio-consumer", self.timeout)
        try:
            session = _Session(conn)
        except BaseException:
            conn.close()
            raise
        conn.on_push(Api.WAIT, lambda reply: on_wake())
        self.session = session
        self.generation = session.generation
        self.data_dir = session.data_dir
        self.meta_version = -1
        await self.refresh()

    async def live(self, on_wake) -> _Session:
        """The session, reopened (with backoff while the broker is away) if it was lost."""
        while self.session is None or self.session.conn.closed:
            if self.session is not None:
                self.session.close()
                self.session = None
            try:
                await self.connect(on_wake)
            except BrokerUnavailableError:
                await asyncio.sleep(self._backoff)
                self._backoff = min(self._backoff * 2, RECONNECT_BACKOFF_S[1])
                continue
            self._backoff = RECONNECT_BACKOFF_S[0]
        return self.session

    async def reopened(self, on_wake) -> _Session:
        """The session; if its connection broke, one attempt to open a new one (raises
        ``BrokerUnavailableError`` while the broker is away)."""
        if self.session is not None and not self.session.conn.closed:
            return self.session
        if self.session is not None:
            self.session.close()
            self.session = None
        await self.connect(on_wake)
        return self.session

    def require(self) -> _Session:
        if self.session is None:
            raise BrokerUnavailableError("the consumer is not connected (await start())")
        return self.session

    async def refresh(self) -> None:
        session = self.require()
        version = session.state.metadata_version     # before the call: never miss a change
        self.topics = (await session.conn.call(Api.METADATA, None))["topics"]
        self.meta_version = version

    def check_metadata(self, session: _Session) -> None:
        if session.state.metadata_version != self.meta_version:
            raise MetadataChangedError

    async def fresh_metadata(self) -> None:
        """Refresh the metadata if the broker's changed since the last refresh."""
        if self.require().state.metadata_version != self.meta_version:
            await self.refresh()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


class Consumer:
    """Reads ``topics`` (every partition, following new ones) or what ``assign`` names; with
    ``group_id``, subscribes the group to ``topics`` (or ``pattern``). Options as
    ``mq.Consumer``'s; connects on ``start()`` or ``async with``."""

    def __new__(cls, *topics: str, socket: str | None = None,
                bootstrap_servers: str | Iterable[str] | None = None,
                kafka_config: dict | None = None, **options: Any) -> Any:
        """This consumer, or on a Kafka cluster (``bootstrap_servers``, else
        ``$MQ_BOOTSTRAP_SERVERS`` when no ``socket`` is given) ``kafka.AsyncKafkaConsumer``,
        with the same options and coroutines."""
        servers = bootstrap(socket, bootstrap_servers)
        backend_args(servers, (), kafka_config)
        if servers is None:
            return super().__new__(cls)
        from mq.aio.kafka import AsyncKafkaConsumer
        return AsyncKafkaConsumer(servers, *topics, kafka_config=kafka_config, **options)

    def __init__(self, *topics: str, socket: str | None = None, group_id: str | None = None,
                 auto_offset_reset: str = "earliest", enable_auto_commit: bool = True,
                 isolation_level: str = "read_uncommitted", max_poll_records: int = 500,
                 max_partition_fetch_bytes: int = 1 << 20, value_bytes: bool = False,
                 key_deserializer=None, value_deserializer=None,
                 request_timeout_ms: int = 30_000, check_crcs: bool = True,
                 pattern: str | None = None, listener: ConsumerRebalanceListener | None = None,
                 group_instance_id: str | None = None, assignor: str | None = None,
                 session_timeout_ms: int = 45_000, max_poll_interval_ms: int = 300_000,
                 auto_commit_interval_ms: int = 5_000,
                 bootstrap_servers: str | Iterable[str] | None = None,
                 kafka_config: dict | None = None) -> None:
        check_read_options(auto_offset_reset, isolation_level, max_poll_records,
                           max_partition_fetch_bytes)
        check_group_options(group_id, pattern, session_timeout_ms, max_poll_interval_ms,
                            auto_commit_interval_ms)
        self.group_id = group_id
        self.max_poll_records = max_poll_records
        self._topics = tuple(topics) if group_id is None else ()
        self._subscription = (list(topics), pattern) if group_id is not None and \
            (topics or pattern is not None) else None
        read_committed = isolation_level == "read_committed"
        self._driver = AsyncConsumerDriver(socket, request_timeout_ms / 1000, read_committed)
        self._fetcher = Fetcher(self._driver, read_committed=read_committed,
                                auto_offset_reset=auto_offset_reset,
                                max_partition_fetch_bytes=max_partition_fetch_bytes,
                                check_crcs=check_crcs, value_bytes=value_bytes,
                                key_deserializer=key_deserializer,
                                value_deserializer=value_deserializer)
        self._group = ConsumerGroup(self._driver, self._fetcher, group_id=group_id,
                                    read_committed=read_committed,
                                    enable_auto_commit=enable_auto_commit, listener=listener,
                                    instance_id=group_instance_id, assignor=assignor,
                                    session_timeout_ms=session_timeout_ms,
                                    max_poll_interval_ms=max_poll_interval_ms,
                                    auto_commit_interval_ms=auto_commit_interval_ms,
                                    membership_type=AsyncMembership)
        self._woken = asyncio.Event()
        self._driver.interrupt = self._woken.set
        self._buffered: collections.deque[Record] = collections.deque()
        self._followed: dict | None = None    # the metadata _follow_topics last looked at
        self._started = False
        self._closed = False

    # --- life -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, and assign the constructor's topics (``UnknownTopicOrPartitionError``
        for one that does not exist)."""
        self._check_open()
        if self._started:
            return
        try:
            await self._driver.connect(self._woken.set)
            missing = [t for t in self._topics if t not in self._driver.topics]
            if missing:
                raise UnknownTopicOrPartitionError(f"unknown topic {missing[0]!r}")
        except BaseException:
            await self.stop()
            raise
        self._started = True
        self._follow_topics()
        if self._subscription is not None:
            self.subscribe(*self._subscription)

    async def stop(self) -> None:
        """Leave the group (committing first with auto-commit), close the connection and the
        maps. Idempotent."""
        if self._closed:
            return
        try:
            await self._leave()
        finally:
            self._closed = True
            self._fetcher.close()
            self._driver.close()

    async def _leave(self) -> None:
        group = self._group
        m = group.membership
        if m is None:
            return
        try:
            await self._run(group.leaving(m))
        finally:
            group.membership = None
            await m.leave()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("consumer is closed")

    def _follow_topics(self) -> None:
        """Every partition of the constructor's topics, as the metadata now has them (looked
        at again only when the metadata was refreshed)."""
        if not self._topics or self._followed is self._driver.topics:
            return
        self._followed = topics = self._driver.topics
        wanted = [TopicPartition(t, p) for t in self._topics if t in topics
                  for p in range(topics[t]["partitions"])]
        if set(wanted) != set(self._fetcher.cursors):
            self._fetcher.assign(wanted)

    # --- the group ------------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join (or change the subscription in) the consumer's group, as
        ``mq.Consumer.subscribe``; ``listener``'s methods may be coroutines. Called in the
        event loop (the heartbeat is a task of it)."""
        self._check_open()
        topics = check_subscription(self.group_id, topics, pattern)
        if listener is not None:
            self._group.listener = listener
        if not self._started:
            self._subscription = (topics, pattern)    # joined by start()
            return
        if self._group.membership is None and self._fetcher.cursors:
            self._fetcher.assign([])
        self._buffered.clear()
        self._group.join(topics, pattern)

    async def unsubscribe(self) -> None:
        """Leave the group (committing first with auto-commit) and drop every partition."""
        self._check_open()
        await self._leave()
        self._fetcher.assign([])

    def group_metadata(self) -> ConsumerGroupMetadata:
        """Group id, member id and member epoch, for ``send_offsets_to_transaction``."""
        return self._group.metadata()

    async def commit(self, offsets: Mapping | None = None) -> None:
        """Commit offsets (default: the position of every assigned partition, less what
        ``getone`` still holds) and wait until the broker has them on disk; across a broker
        restart as ``mq.Consumer.commit`` (raises ``CommitFailedError`` likewise)."""
        self._check_open()
        if offsets is None and self._buffered:
            self._rewind_buffered()
        await self._run(self._group.committing(offsets, self._group.membership))

    async def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset for ``partition`` (None if it has none)."""
        self._check_open()
        return await self._run(self._group.committed_offset(TopicPartition(*partition)))

    async def _run(self, op: GroupOp):
        """Drive a ``ConsumerGroup`` step generator in the event loop (its steps:
        ``mq/client/consumer_group.py``)."""
        group, driver = self._group, self._driver
        try:
            step = next(op)
            while True:
                if isinstance(step, list):
                    try:
                        conn = (await driver.reopened(self._woken.set)).conn
                        futures = [conn.request(api, *fields) for api, *fields in step]
                        replies = [await conn.reply(f) for f in futures]
                    except (MQError, TimeoutError, OSError) as err:
                        step = op.throw(err)          # the broker went away, say
                        continue
                    err = first_error(replies)
                    step = op.send(replies) if err is None else op.throw(err)
                    continue
                value = None
                if isinstance(step, float):
                    await asyncio.sleep(step)
                elif isinstance(step, Notify):
                    value = await self._notify(step)
                elif step is FRESH_METADATA:
                    await driver.fresh_metadata()
                elif isinstance(step, Joined):
                    m = group.membership
                    if m is not None:
                        try:
                            await asyncio.wait_for(m.joined.wait(), step.timeout)
                        except TimeoutError:
                            pass
                elif isinstance(step, CommitRetry):
                    try:
                        value = await group.membership.wait_commit_retry(*step)
                    except MQError as err:           # CommitFailedError, or the member's
                        step = op.throw(err)          # fatal error
                        continue
                elif isinstance(step, SendCommit):
                    conn = driver.require().conn
                    member_id, epoch = group.membership.commit_identity()
                    reply = await conn.reply(conn.request(
                        Api.OFFSET_COMMIT, group.group_id, member_id, epoch, step.items))
                    group.commit_done(step.plain, step.callback, step.auto, reply)
                else:
                    raise AssertionError(f"unknown group step {step!r}")
                step = op.send(value)
        except StopIteration as stop:
            return stop.value

    async def _notify(self, step: Notify) -> Exception | None:
        """The rebalance listener's method (awaited if a coroutine); what it raised."""
        try:
            result = getattr(self._group.listener, step.method)(set(step.partitions))
            if inspect.isawaitable(result):
                await result
        except Exception as err:           # raised from getmany once reconciliation is done
            log.exception("group %s: %s raised", self.group_id, step.method)
            return err
        return None

    # --- assignment and positions ---------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (the constructor's topics no longer followed)."""
        self._check_open()
        if self._group.membership is not None:
            raise ValueError(f"this consumer subscribes through group {self.group_id!r}; "
                             "unsubscribe() first")
        tps = [TopicPartition(*tp) for tp in partitions]
        for tp in tps:
            self._driver.slot(tp)
        self._topics = ()
        self._buffered.clear()
        self._fetcher.assign(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetcher.cursors)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
        self._forget(partition)
        self._fetcher.cursor(partition).seek(offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for c in self._cursors(partitions):
            self._forget(c.tp)
            c.seek((await self._state(c.tp)).log_start_offset)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        for c in self._cursors(partitions):
            self._forget(c.tp)
            c.seek(self._fetcher.bound(await self._state(c.tp)))

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record ``getmany``/``getone`` returns for ``partition``; a
        member's partition whose newer offsets an unfinished transaction holds waits for it
        (``read_committed``), as ``mq.Consumer.position`` does."""
        tp = TopicPartition(*partition)
        for r in self._buffered:
            if (r.topic, r.partition) == tp:
                return r.offset
        c = self._fetcher.cursor(tp)
        if c.position is None and c.held:          # waits for the transaction holding it
            committed = await self.committed(tp)
            if c.offset is None:
                self._group.start(tp, committed)
        if c.position is None:
            self._fetcher.reset(c, await self._state(tp), None)
        return c.position

    async def end_offsets(self, partitions: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        """``{tp: high watermark}`` (last stable offset with ``read_committed``)."""
        return {TopicPartition(*tp): self._fetcher.bound(await self._state(TopicPartition(*tp)))
                for tp in partitions}

    async def _state(self, tp: TopicPartition):
        """``tp``'s slot snapshot, the metadata refreshed first when the broker's changed."""
        self._check_open()
        while True:
            try:
                return self._driver.state(tp)
            except MetadataChangedError:
                await self._driver.refresh()

    def _cursors(self, partitions) -> list:
        self._check_open()
        if not partitions:
            return list(self._fetcher.order)
        return [self._fetcher.cursor(tp) for tp in partitions]

    def _forget(self, tp: TopicPartition) -> None:
        """Drop ``getone``'s buffered records of ``tp``: they are read again from the first."""
        tp = TopicPartition(*tp)
        first = next((r.offset for r in self._buffered if (r.topic, r.partition) == tp), None)
        if first is not None:
            self._fetcher.cursor(tp).seek(first)
            self._buffered = collections.deque(
                r for r in self._buffered if (r.topic, r.partition) != tp)

    # --- flow control ---------------------------------------------------------------------------
    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of these partitions until ``resume`` (what ``getone``
        holds of them is read again after), as ``mq.Consumer.pause``."""
        tps = [self._fetcher.cursor(tp).tp for tp in partitions]
        for tp in tps:
            self._forget(tp)
        self._fetcher.pause(tps)

    def resume(self, *partitions: TopicPartition) -> None:
        self._fetcher.resume(partitions)

    def paused(self) -> set[TopicPartition]:
        return self._fetcher.paused()

    # --- reading --------------------------------------------------------------------------------
    async def getmany(self, timeout_ms: float = 0, max_records: int | None = None
                      ) -> dict[TopicPartition, list[Record]]:
        """Records of the assigned partitions, ``{tp: [Record, ...]}``, at most
        ``max_records`` (default ``max_poll_records``), in offset order per partition.
        Awaits up to ``timeout_ms`` when nothing is readable; ``{}`` if still nothing."""
        self._check_open()
        if not self._started:
            await self.start()
        if self._buffered:
            self._rewind_buffered()
        m = self._group.membership
        if m is None:
            return await self._getmany(timeout_ms, max_records)
        m.poll_started()
        try:
            return await self._getmany(timeout_ms, max_records)
        finally:
            m.poll_ended()

    async def _getmany(self, timeout_ms: float, max_records: int | None
                       ) -> dict[TopicPartition, list[Record]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        group = self._group
        while True:
            session = await self._driver.live(self._woken.set)
            in_group = group.membership is not None
            try:
                if in_group:
                    self._woken.clear()           # a heartbeat's wake-up from here on counts
                    await self._run(group.rounds())
                self._follow_topics()
                out = self._fetcher.take(session, max_records or self.max_poll_records,
                                         in_group)
            except MetadataChangedError:
                await self._driver.refresh()
                continue
            if out:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {}
            if group.held:                        # asking again for held offsets is due then
                remaining = min(remaining, max(0.0, group.retry_held_at - time.monotonic()))
            if in_group and group.changed():
                continue
            if not in_group:
                self._woken.clear()
            try:
                self._arm(session)
            except MetadataChangedError:
                await self._driver.refresh()
                continue
            try:
                await asyncio.wait_for(self._woken.wait(), remaining)
            except TimeoutError:
                pass

    def _arm(self, session: _Session) -> None:
        """Ask the broker to push a wake-up when data passes a watched position."""
        positions = self._driver.wait_positions(session, self._fetcher.watched())
        try:
            session.conn.send_one_way(Api.WAIT, "", positions)
        except BrokerUnavailableError:
            self._woken.set()                 # reconnect at the next look

    async def getone(self) -> Record:
        """The next record, awaited for as long as it takes."""
        while not self._buffered:
            got = await self.getmany(timeout_ms=1000)
            self._buffered.extend(r for records in got.values() for r in records)
        return self._buffered.popleft()

    def _rewind_buffered(self) -> None:
        """``getmany`` after ``getone``: the records ``getone`` holds are read again."""
        firsts: dict[TopicPartition, int] = {}
        for r in self._buffered:
            firsts.setdefault(TopicPartition(r.topic, r.partition), r.offset)
        for tp, offset in firsts.items():
            self._fetcher.cursor(tp).seek(offset)
        self._buffered.clear()

    def __aiter__(self) -> AsyncIterator[Record]:
        return self

    async def __anext__(self) -> Record:
        return await self.getone()
