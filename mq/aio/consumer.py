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

Consumer groups are not joined yet: a ``group_id`` is refused (use ``mq.Consumer``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Iterable

from mq.aio.connection import AsyncConnection, open_connection
from mq.client.consumer import check_read_options
from mq.client.consumer_driver import RECONNECT_BACKOFF_S, ConsumerDriver
from mq.client.fetcher import Fetcher, Record
from mq.client.types import TopicPartition
from mq.errors import (BrokerUnavailableError, ClosedError, MetadataChangedError,
                       UnknownTopicOrPartitionError)
from mq.protocol.messages import Api
from mq.protocol.state import StateReader

__all__ = ["AsyncConsumerDriver", "Consumer"]


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

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


class Consumer:
    """Reads ``topics`` (every partition, following new ones) or what ``assign`` names.
    Options as ``mq.Consumer``'s reading options; connects on ``start()`` or ``async with``."""

    def __init__(self, *topics: str, socket: str | None = None, group_id: str | None = None,
                 auto_offset_reset: str = "earliest",
                 isolation_level: str = "read_uncommitted", max_poll_records: int = 500,
                 max_partition_fetch_bytes: int = 1 << 20, value_bytes: bool = False,
                 key_deserializer=None, value_deserializer=None,
                 request_timeout_ms: int = 30_000, check_crcs: bool = True) -> None:
        if group_id is not None:
            raise ValueError("mq.aio.Consumer does not join consumer groups yet; use "
                             "mq.Consumer for a group")
        check_read_options(auto_offset_reset, isolation_level, max_poll_records,
                           max_partition_fetch_bytes)
        self.max_poll_records = max_poll_records
        self._topics = tuple(topics)
        read_committed = isolation_level == "read_committed"
        self._driver = AsyncConsumerDriver(socket, request_timeout_ms / 1000, read_committed)
        self._fetcher = Fetcher(self._driver, read_committed=read_committed,
                                auto_offset_reset=auto_offset_reset,
                                max_partition_fetch_bytes=max_partition_fetch_bytes,
                                check_crcs=check_crcs, value_bytes=value_bytes,
                                key_deserializer=key_deserializer,
                                value_deserializer=value_deserializer)
        self._woken = asyncio.Event()
        self._buffered: collections.deque[Record] = collections.deque()
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

    async def stop(self) -> None:
        """Close the connection and the maps. Idempotent."""
        self._closed = True
        self._fetcher.close()
        self._driver.close()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("consumer is closed")

    def _follow_topics(self) -> None:
        """Every partition of the constructor's topics, as the metadata now has them."""
        if not self._topics:
            return
        topics = self._driver.topics
        wanted = [TopicPartition(t, p) for t in self._topics if t in topics
                  for p in range(topics[t]["partitions"])]
        if set(wanted) != set(self._fetcher.cursors):
            self._fetcher.assign(wanted)

    # --- assignment and positions ---------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (the constructor's topics no longer followed)."""
        self._check_open()
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
        """The offset of the next record ``getmany``/``getone`` returns for ``partition``."""
        tp = TopicPartition(*partition)
        for r in self._buffered:
            if (r.topic, r.partition) == tp:
                return r.offset
        c = self._fetcher.cursor(tp)
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            session = await self._driver.live(self._woken.set)
            try:
                self._follow_topics()
                out = self._fetcher.take(session, max_records or self.max_poll_records, False)
            except MetadataChangedError:
                await self._driver.refresh()
                continue
            if out:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {}
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
