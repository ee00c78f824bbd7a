"""``mq.aio``'s clients on a Kafka cluster: ``mq.aio.Producer``, ``Consumer`` and ``Admin``
given ``bootstrap_servers=`` (or ``$MQ_BOOTSTRAP_SERVERS`` without a socket) are these, with
the same coroutines, over the blocking Kafka backend (``mq/client/kafka/``).

librdkafka works in its own threads, so nothing here blocks the event loop by itself:

- **Producer.** ``send`` hands the record to librdkafka from the loop (a call that never
  waits; a full queue is waited out with ``asyncio.sleep``) and returns an asyncio future
  that librdkafka's delivery report settles through ``call_soon_threadsafe``. Only the first
  send to a topic (its partitions) and the transactional calls wait, in a thread.
- **Consumer.** Every call that may wait runs on the consumer's one thread (a
  single-worker executor), so calls keep their order and the consumer is only ever used from
  one thread, as librdkafka's Python binding expects; ``getmany`` polls in slices of
  ``_SLICE_S`` there, so a cancelled ``getmany`` gives its thread back quickly, and records
  a cancelled poll took are sought back (never lost to an auto-commit). A rebalance
  listener's methods may be coroutines: they run on the loop while the poll waits for them.
- **Admin.** Each method is the blocking one run in a thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import queue
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mq.client.kafka.admin import KafkaAdmin
from mq.client.kafka.consumer import KafkaConsumer
from mq.client.kafka.errors import from_kafka
from mq.client.kafka.producer import KafkaProducer, delivered
from mq.client.types import ConsumerGroupMetadata, RecordMetadata, TopicPartition
from mq.errors import ClosedError

__all__ = ["AsyncKafkaAdmin", "AsyncKafkaConsumer", "AsyncKafkaProducer"]

_SLICE_S = 0.1


def _settle(future: asyncio.Future, err: Any, msg: Any) -> None:
    """A delivery report, on the loop: the send's future resolved."""
    if future.done():
        return
    if err is not None:
        future.set_exception(from_kafka(err, f"record for {msg.topic()}-{msg.partition()}"))
    else:
        future.set_result(delivered(msg))


class AsyncKafkaProducer:
    """``mq.aio.Producer(bootstrap_servers=...)``; see the module doc."""

    def __init__(self, servers: str, **options: Any) -> None:
        self._producer = KafkaProducer(servers, **options)
        self._transactional = "transactional_id" in options and \
            options["transactional_id"] is not None
        self._started = False

    async def start(self) -> None:
        """With ``transactional_id``, register it (``init_transactions``), as aiokafka does."""
        if self._producer.closed:
            raise ClosedError("producer is closed")
        if not self._started:
            self._started = True
            if self._transactional:
                await asyncio.to_thread(self._producer.init_transactions)

    async def stop(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then stop. Idempotent."""
        await asyncio.to_thread(self._producer.close, timeout)

    async def __aenter__(self) -> AsyncKafkaProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def send(self, topic: str, value: Any = None, key: Any = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Iterable | None = None) -> asyncio.Future[RecordMetadata]:
        """Queue one record; returns a future of its ``RecordMetadata``."""
        if not self._started:
            await self.start()
        producer = self._producer
        rd = producer._handle()
        if not producer.known(topic):
            await asyncio.to_thread(producer.partitions_for, topic)
        args = producer.record(topic, value, key, partition, headers, timestamp_ms)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        args["on_delivery"] = lambda err, msg: loop.call_soon_threadsafe(_settle, future, err,
                                                                         msg)
        deadline = loop.time() + producer._max_block_s
        while True:
            try:
                producer.produce(rd, topic, args)
                return future
            except BufferError:
                if loop.time() >= deadline:
                    raise TimeoutError(f"no room in the producer's queue within "
                                       f"{producer._max_block_s} s") from None
                await asyncio.sleep(0.01)

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Iterable | None = None) -> RecordMetadata:
        return await (await self.send(topic, value, key, partition, timestamp_ms, headers))

    async def flush(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self._producer.flush, timeout)

    async def partitions_for(self, topic: str) -> set[int]:
        return await asyncio.to_thread(self._producer.partitions_for, topic)

    async def begin_transaction(self) -> None:
        if not self._started:
            await self.start()
        self._producer.begin_transaction()

    async def send_offsets_to_transaction(self, offsets: dict, group: Any) -> None:
        if isinstance(group, AsyncKafkaConsumer):
            group = await group._call(group._ready().group_metadata)
        await asyncio.to_thread(self._producer.send_offsets_to_transaction, offsets, group)

    async def commit_transaction(self) -> None:
        await asyncio.to_thread(self._producer.commit_transaction)

    async def abort_transaction(self) -> None:
        await asyncio.to_thread(self._producer.abort_transaction)

    def transaction(self) -> _Transaction:
        """``async with producer.transaction():`` commits, or aborts when the block raises."""
        return _Transaction(self)

    @property
    def closed(self) -> bool:
        return self._producer.closed


class _Transaction:
    def __init__(self, producer: AsyncKafkaProducer) -> None:
        self._producer = producer

    async def __aenter__(self) -> AsyncKafkaProducer:
        await self._producer.begin_transaction()
        return self._producer

    async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is None:
            await self._producer.commit_transaction()
        else:
            await self._producer.abort_transaction()


class _LoopListener:
    """A rebalance listener whose methods may be coroutines, called from the consumer's
    thread: a coroutine runs on ``loop`` while that thread waits for it, and meanwhile runs
    the consumer calls the coroutine makes (a commit before giving partitions up), which
    ``AsyncKafkaConsumer._call`` hands it through ``inbox``: librdkafka answers them only
    from the thread inside its rebalance callback."""

    def __init__(self, listener: Any, loop: asyncio.AbstractEventLoop,
                 owner: AsyncKafkaConsumer) -> None:
        self._listener = listener
        self._loop = loop
        self._owner = owner

    def _call(self, name: str, partitions: set[TopicPartition]) -> None:
        result = getattr(self._listener, name)(partitions)
        if not inspect.isawaitable(result):
            return
        loop, inbox = self._loop, queue.SimpleQueue()
        self._owner._inbox = inbox
        try:
            done = asyncio.run_coroutine_threadsafe(_awaited(result), loop)
            done.add_done_callback(lambda _: inbox.put(None))
            while (item := inbox.get()) is not None:
                fn, future = item
                try:
                    value = fn()
                except BaseException as err:         # noqa: BLE001 - to the coroutine
                    loop.call_soon_threadsafe(_settle_call, future, None, err)
                else:
                    loop.call_soon_threadsafe(_settle_call, future, value, None)
            done.result()
        finally:
            self._owner._inbox = None

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._call("on_partitions_revoked", revoked)

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._call("on_partitions_assigned", assigned)

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self._call("on_partitions_lost", lost)


def _settle_call(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


class AsyncKafkaConsumer:
    """``mq.aio.Consumer(bootstrap_servers=...)``; see the module doc."""

    def __init__(self, servers: str, *topics: str, listener: Any = None,
                 **options: Any) -> None:
        self._args = (servers, topics, listener, options)
        self._consumer: KafkaConsumer | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="mq-kafka-consumer")
        self._buffered: list = []
        self._closed = False
        self._inbox: queue.SimpleQueue | None = None   # set while a listener's coroutine runs
        self.group_id = options.get("group_id")
        self.max_poll_records = options.get("max_poll_records", 500)

    async def _call(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` on the consumer's thread: queued to it, or, while it waits inside
        a rebalance for a listener's coroutine, handed to it there (``_LoopListener``)."""
        if self._closed:
            raise ClosedError("consumer is closed")
        loop = asyncio.get_running_loop()
        inbox = self._inbox
        if inbox is not None:
            future = loop.create_future()
            inbox.put((functools.partial(fn, *args), future))
            return await future
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args))

    async def start(self) -> None:
        """Create the consumer (subscribing or assigning the constructor's topics)."""
        if self._consumer is not None:
            return
        servers, topics, listener, options = self._args
        if listener is not None:
            listener = _LoopListener(listener, asyncio.get_running_loop(), self)
        self._consumer = await self._call(
            functools.partial(KafkaConsumer, servers, *topics, listener=listener, **options))

    async def stop(self) -> None:
        """Commit (with auto-commit), leave the group and close. Idempotent."""
        if self._closed:
            return
        if self._consumer is not None:
            await self._call(self._consumer.close)
        self._closed = True
        self._thread.shutdown(wait=False)

    async def __aenter__(self) -> AsyncKafkaConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _ready(self) -> KafkaConsumer:
        if self._closed:
            raise ClosedError("consumer is closed")
        if self._consumer is None:
            raise RuntimeError("call await consumer.start() first")
        return self._consumer

    # --- reading ---------------------------------------------------------------------------
    async def getmany(self, timeout_ms: float = 0, max_records: int | None = None
                      ) -> dict[TopicPartition, list]:
        """Records, ``{tp: [Record, ...]}``, awaited up to ``timeout_ms``."""
        if self._consumer is None:
            await self.start()
        consumer = self._ready()
        if self._buffered:
            await self._call(self._seek_back, self._buffered)
            self._buffered = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            left = max(0.0, min(_SLICE_S, deadline - loop.time()))
            poll = loop.run_in_executor(self._thread, consumer.poll, left * 1000, max_records)
            try:
                out = await asyncio.shield(poll)
            except asyncio.CancelledError:
                poll.add_done_callback(self._undo)
                raise
            if out or loop.time() >= deadline:
                return out

    def _undo(self, poll: asyncio.Future) -> None:
        """A cancelled ``getmany``'s records: read again (seek back, on the thread)."""
        if not poll.cancelled() and poll.exception() is None and poll.result():
            records = [r for rs in poll.result().values() for r in rs]
            self._thread.submit(self._seek_back, records)

    def _seek_back(self, records: list) -> None:
        firsts: dict[TopicPartition, int] = {}
        for r in records:
            firsts.setdefault(TopicPartition(r.topic, r.partition), r.offset)
        for tp, offset in firsts.items():
            self._ready().seek(tp, offset)

    async def getone(self) -> Any:
        """The next record, awaited for as long as it takes."""
        while not self._buffered:
            got = await self.getmany(timeout_ms=1000)
            self._buffered = [r for records in got.values() for r in records]
        return self._buffered.pop(0)

    def __aiter__(self) -> AsyncIterator:
        return self

    async def __anext__(self) -> Any:
        return await self.getone()

    # --- the rest: the blocking consumer's, on its thread ----------------------------------------
    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None,
                  listener: Any = None) -> None:
        if listener is not None:
            listener = _LoopListener(listener, asyncio.get_running_loop(), self)
        self._thread.submit(self._ready().subscribe, topics, pattern, listener).result()

    async def unsubscribe(self) -> None:
        await self._call(self._ready().unsubscribe)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._thread.submit(self._ready().assign, list(partitions)).result()

    def assignment(self) -> set[TopicPartition]:
        return self._ready().assignment()

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group's metadata as of the consumer's last rebalance: asked of
        librdkafka from the loop's thread while the consumer's is inside a rebalance, it would
        wait for that rebalance, which waits for the loop (``send_offsets_to_transaction``
        asks the consumer's thread)."""
        return self._ready().recent_group_metadata()

    async def commit(self, offsets: Mapping | None = None) -> None:
        await self._call(self._ready().commit, offsets)

    async def committed(self, partition: TopicPartition) -> int | None:
        return await self._call(self._ready().committed, partition)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._ready().seek(partition, offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        await self._call(self._ready().seek_to_beginning, *partitions)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        await self._call(self._ready().seek_to_end, *partitions)

    async def position(self, partition: TopicPartition) -> int:
        return await self._call(self._ready().position, partition)

    async def end_offsets(self, partitions: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        return await self._call(self._ready().end_offsets, list(partitions))

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]
                                ) -> dict[TopicPartition, int]:
        return await self._call(self._ready().beginning_offsets, list(partitions))

    def pause(self, *partitions: TopicPartition) -> None:
        self._ready().pause(*partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._ready().resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        return self._ready().paused()


class AsyncKafkaAdmin:
    """``mq.aio.Admin(bootstrap_servers=...)``: every ``KafkaAdmin`` method as a coroutine
    run in a thread."""

    def __init__(self, servers: str, timeout: float = 30.0,
                 kafka_config: Mapping[str, Any] | None = None) -> None:
        self._admin = KafkaAdmin(servers, timeout, kafka_config)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._admin.close()

    async def __aenter__(self) -> AsyncKafkaAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._admin, name)
        if name.startswith("_") or not callable(method):
            return method

        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)
        return call
