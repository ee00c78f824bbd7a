"""``mq.aio.Producer``: ``mq.Producer`` for asyncio, with no thread and no blocking wait.

It is the threaded producer's record path — the same checks, partitioner, batches, sender,
idempotence and transaction state machine (``mq/client/producer.py`` and its parts) — over
an event loop's driver (``producer_io.AsyncProducerIO``) instead of an I/O thread. Where the
record path would block (no room in flight, a topic not yet known, a partition new to the
transaction) the driver raises ``WouldBlock``; ``send`` awaits what it names and sends again.
Shaped like aiokafka's ``AIOKafkaProducer``::

    async with mq.aio.Producer(linger_ms=5) as producer:
        future = await producer.send("orders", b"payload", key=b"user-1")
        metadata = await future                        # RecordMetadata(topic, partition, ...)
        await producer.send_and_wait("orders", b"another")

    async with mq.aio.Producer(transactional_id="orders-etl") as producer:
        async with producer.transaction():             # commits, or aborts on an exception
            await producer.send("orders", b"in the transaction")

Guarantees are the threaded producer's: acks and their durability, order per partition,
retries and reconnects, exactly once with idempotence (on by default) and transactions.
Differences: every batch goes through the socket (no shared-memory arena), and callbacks are
the asyncio futures' own (``add_done_callback``), run by the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from mq.aio.producer_io import AsyncProducerIO, AsyncTransactions
from mq.client.connection import resolve_socket
from mq.client.kafka.config import backend_args, bootstrap
from mq.client.producer import Producer as RecordPath
from mq.client.types import RecordMetadata
from mq.errors import ClosedError, InvalidTxnStateError, WouldBlock

__all__ = ["Producer"]

log = logging.getLogger("mq.producer")


class _EventLoopRecordPath(RecordPath):
    """``mq.Producer``'s record path over the asyncio driver. It starts when the driver is
    opened (``Producer.start``), never on its own."""

    _io_type = AsyncProducerIO

    def _start(self) -> None:
        pass


class Producer:
    """Publishes records to the broker from a coroutine. Takes ``mq.Producer``'s options
    (``acks``, ``linger_ms``, ``batch_size``, ``compression_type``, ``partitioner``,
    ``enable_idempotence``, ``transactional_id``...); connects on ``start()``, ``async with``
    or the first send. A transactional producer runs ``init_transactions`` in ``start()``,
    as aiokafka does."""

    def __new__(cls, socket: str | None = None, *,
                bootstrap_servers: str | Iterable[str] | None = None,
                kafka_config: dict | None = None, **options: Any) -> Any:
        """This producer, or on a Kafka cluster (``bootstrap_servers``, else
        ``$MQ_BOOTSTRAP_SERVERS`` when no ``socket`` is given) ``kafka.AsyncKafkaProducer``,
        with the same options and coroutines."""
        servers = bootstrap(socket, bootstrap_servers)
        backend_args(servers, (), kafka_config)
        if servers is None:
            return super().__new__(cls)
        from mq.aio.kafka import AsyncKafkaProducer
        return AsyncKafkaProducer(servers, kafka_config=kafka_config, **options)

    def __init__(self, socket: str | None = None, *,
                 key_serializer: Callable[[Any], bytes] | None = None,
                 value_serializer: Callable[[Any], bytes] | None = None,
                 bootstrap_servers: str | Iterable[str] | None = None,
                 kafka_config: dict | None = None, **options: Any) -> None:
        # Serialized here, before the record path: a send the driver makes wait is sent
        # again, and a serializer must run once per record.
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._path = _EventLoopRecordPath(resolve_socket(socket), **options)
        self._io: AsyncProducerIO = self._path._io
        self._max_block_s = self._path._max_block_s
        self._metadata_wait_s = min(self._max_block_s, self._path._request_timeout_s)
        self._opening: asyncio.Lock | None = None
        self._started = False

    # --- life -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect (and get the producer id; with ``transactional_id``, fence older
        producers). Raises ``BrokerUnavailableError``, the broker's refusal."""
        if self._io.closed:
            raise ClosedError("producer is closed")
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._started:
                return
            path = self._path
            try:
                await self._io.open(init_producer_id=path._sender.ids is not None
                                    and path._txn is None)
                if path._txn is not None:
                    await path._txn.run(path._txn.requests.init())
            except BaseException:
                await self._io.stop()
                raise
            self._started = True

    async def stop(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then stop; records still undelivered fail with
        ``ClosedError``. Idempotent."""
        if self._io.closed:
            return
        try:
            if self._started:
                await self.flush(timeout)
        except TimeoutError:
            log.warning("stopping the producer with undelivered records (flush timed out)")
        finally:
            await self._io.stop()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _ready(self) -> RecordPath:
        if not self._started:
            await self.start()
        return self._path

    # --- sending --------------------------------------------------------------------------------
    async def send(self, topic: str, value: Any = None, key: Any = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Iterable | None = None) -> asyncio.Future[RecordMetadata]:
        """Queue one record; returns a future of its ``RecordMetadata`` (awaiting the send
        waits only for room, never for the broker's answer). Raises as ``mq.Producer.send``
        (``TypeError``, ``UnknownTopicOrPartitionError``, ``MessageTooLargeError``,
        ``TimeoutError`` after ``max_block_ms`` without room...); the future fails as its
        future would."""
        path = await self._ready()
        if value is not None and self._value_serializer is not None:
            value = self._value_serializer(value)
        if key is not None and self._key_serializer is not None:
            key = self._key_serializer(key)
        io = self._io
        io.learned = None
        if topic not in path._topics:
            await io.learn(topic, self._metadata_wait_s)
        while True:
            if len(path._sender.ready) >= path._max_in_flight:
                await io.room(self._max_block_s)
            try:
                record = path.send(topic, value, key, partition, headers, timestamp_ms)
            except WouldBlock as wait:
                await wait.wait()
                continue
            return io.future(record, record._batch)

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Iterable | None = None) -> RecordMetadata:
        """``send``, then its outcome: the record's ``RecordMetadata``, or its failure."""
        return await (await self.send(topic, value, key, partition, timestamp_ms, headers))

    async def flush(self, timeout: float | None = None) -> None:
        """Send every buffered record now (ignoring ``linger_ms``) and wait until all of them
        are acknowledged or failed. Raises ``TimeoutError`` after ``timeout`` seconds."""
        if not self._started:
            return
        path, io = self._path, self._io
        finished: list = []
        for batch in path._acc.close_all():
            io.queue(batch)
        io.pump(finished)
        io.finish(finished)
        io.wake()
        pending = [io.future(None, batch) for batch in list(path._sender.incomplete)]
        if not pending:
            return
        done, left = await asyncio.wait(pending, timeout=timeout)
        for future in done:
            future.exception()                    # the records' futures report it
        if left:
            raise TimeoutError(f"flush: {len(left)} batch(es) still unacknowledged after "
                               f"{timeout} s")

    async def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of ``topic``. Raises ``UnknownTopicOrPartitionError``."""
        path = await self._ready()
        info = path._topics.get(topic) or await self._io.learn(topic, self._metadata_wait_s)
        return set(info.partitions)

    # --- transactions ---------------------------------------------------------------------------
    def _transactions(self) -> AsyncTransactions:
        if self._io.closed:
            raise ClosedError("producer is closed")
        if self._path._txn is None:
            raise InvalidTxnStateError("not a transactional producer: create it with "
                                       "transactional_id=...")
        return self._path._txn

    async def begin_transaction(self) -> None:
        """Open a transaction: the following sends and offsets commit or abort together."""
        await self._ready()
        self._transactions().manager.begin()

    async def send_offsets_to_transaction(self, offsets: dict, group: Any) -> None:
        """Commit consumed offsets for ``group`` (a group id, or a consumer's
        ``group_metadata()``) with the open transaction, as ``mq.Producer``'s."""
        txn = self._transactions()
        await txn.run(txn.requests.send_offsets(offsets, group))

    async def commit_transaction(self) -> None:
        """Flush every send of the transaction, then commit it. Raises as
        ``mq.Producer.commit_transaction``."""
        txn = self._transactions()
        txn.manager.begin_commit()
        await self.flush(self._max_block_s)      # TimeoutError: still committing, retry
        await txn.run(txn.requests.commit())

    async def abort_transaction(self) -> None:
        """Wait for the transaction's pending sends, then abort it."""
        txn = self._transactions()
        txn.manager.begin_abort()
        await self.flush(self._max_block_s)      # failures are moot: it is aborted
        await txn.run(txn.requests.abort())

    def transaction(self) -> _Transaction:
        """``async with producer.transaction():`` begins a transaction, commits it when the
        block ends, and aborts it when the block raises."""
        return _Transaction(self)

    @property
    def closed(self) -> bool:
        return self._io.closed

    def __repr__(self) -> str:
        return "<mq.aio." + repr(self._path)[1:]


class _Transaction:
    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    async def __aenter__(self) -> Producer:
        await self._producer.begin_transaction()
        return self._producer

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            await self._producer.commit_transaction()
        else:
            await self._producer.abort_transaction()
