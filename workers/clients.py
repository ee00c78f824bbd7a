"""A child's clients, and the runner of the steps its parts write instead of calling them.

The writes, commits and transactions of ``delivery.Delivery``, the engines' reads, settles
and dead letters, and the child's start and shutdown (``child.serve``) are written once, as
generators of steps (``Op``). A step is ``(name, *args)``: the runner (``_drive``) calls the
clients' method of that name and sends the result back into the generator, awaited if it is
a coroutine, or throws in what it raised. Two kinds of clients perform them, as
``ConsumerGroup.run`` and ``mq.aio.Consumer._run`` perform the consumer group's steps
(``mq/client/consumer_group.py``):

- ``SyncClients``, for a plain handler's child (``engine.SyncEngine``): the threaded
  ``mq.Producer`` and ``mq.Consumer``, each step a blocking call;
- ``AsyncClients``, for an ``async def`` handler's child (``aio.AsyncEngine``): ``mq.aio``'s
  producer and consumer, each step awaited, so the event loop never blocks on the broker
  and the child runs no thread: handlers' awaits go on during a poll, a flush, a commit or
  a transaction.

A plain handler's outputs are the one exception, for speed (an operation costs about 0.5 us
more than a call, per record): ``Delivery.send_now`` calls ``SyncClients.send`` itself when
the sends are the only steps.

Steps: ``start_producer``, ``start_consumer``, ``partitions_for``, ``begin_transaction``,
``send`` (returns the record's future), ``send_and_wait``, ``flush``, ``outcomes`` (of
futures: None for a record acknowledged, else its error), ``send_offsets``,
``commit_transaction``, ``abort_transaction``, ``poll``, ``position``, ``commit``,
``commit_async``, ``sleep``, ``engine`` (run the engine's loop) and ``close``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

import mq
import mq.aio
from mq.errors import ClosedError

__all__ = ["AsyncClients", "Listener", "Op", "SyncClients"]

log = logging.getLogger("workers.child")

T = TypeVar("T")
Op = Generator[tuple, Any, T]


async def _drive(clients, op: Op[T]) -> T:
    """Run ``op`` with ``clients``: each step is the call of their method of that name, its
    result (awaited if the method is a coroutine) sent back into ``op``, or what it raised
    thrown in. The one runner of both kinds of clients."""
    try:
        step = next(op)
        while True:
            try:
                value = getattr(clients, step[0])(*step[1:])
                if inspect.isawaitable(value):
                    value = await value
            except BaseException as err:            # noqa: BLE001 -- the op's to handle
                step = op.throw(err)
                continue
            step = op.send(value)
    except StopIteration as stop:
        return stop.value


def _not_acknowledged() -> TimeoutError:
    return TimeoutError("not acknowledged yet")


class Listener(mq.ConsumerRebalanceListener):
    """A child's rebalance listener: the engine's ``revoked`` and ``lost`` operations, run by
    the clients (``AsyncClients`` returns the coroutine, which ``mq.aio.Consumer`` awaits).
    Nothing before the engine exists."""

    def __init__(self, clients) -> None:
        self.clients = clients
        self.engine = None

    def on_partitions_revoked(self, revoked):
        if self.engine is not None:
            return self.clients.run(self.engine.revoked(revoked))
        return None

    def on_partitions_lost(self, lost):
        if self.engine is not None:
            return self.clients.run(self.engine.lost(lost))
        return None


class SyncClients:
    """Steps performed with the threaded clients. ``producer_options`` and ``consumer_options``
    (``topics`` and the constructor's keywords) make them."""

    def __init__(self, producer_options: dict, consumer_options: dict) -> None:
        self._producer_options = producer_options
        self._consumer_options = dict(consumer_options)
        self._topics = self._consumer_options.pop("topics")
        self._producer: mq.Producer | None = None
        self.consumer: mq.Consumer | None = None
        self.listener = Listener(self)

    def run(self, op: Op[T]) -> T:
        """Drive ``op``, every step a call: ``_drive``, whose coroutine never waits here."""
        coro = _drive(self, op)
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        coro.close()
        raise AssertionError("a step of the threaded clients returned an awaitable")

    def drive(self, op: Op[T]) -> T:
        return self.run(op)

    @property
    def producer(self) -> mq.Producer:
        if self._producer is None:
            self._producer = mq.Producer(**self._producer_options)
        return self._producer

    # --- the steps ----------------------------------------------------------------------------
    def start_producer(self) -> mq.Producer:
        """A transactional producer, its transactions initialized (fences older ones)."""
        producer = mq.Producer(**self._producer_options)
        try:
            producer.init_transactions()
        except BaseException:
            producer.close(timeout=1)
            raise
        self._producer = producer
        return producer

    def start_consumer(self) -> mq.Consumer:
        self.consumer = mq.Consumer(*self._topics, listener=self.listener,
                                    **self._consumer_options)
        return self.consumer

    def partitions_for(self, topic: str) -> set[int]:
        return self.producer.partitions_for(topic)

    def begin_transaction(self) -> None:
        self.producer.begin_transaction()

    def send(self, output: tuple):
        """``output``: ``(topic, key, value, headers)``."""
        topic, key, value, headers = output
        return self.producer.send(topic, value=value, key=key, headers=headers)

    def send_and_wait(self, output: tuple) -> None:
        topic, key, value, headers = output
        self.producer.send(topic, value=value, key=key, headers=headers).get()

    def flush(self) -> None:
        self.producer.flush()

    def outcomes(self, futures: list) -> list:
        return [None if f.succeeded() else f.exception() if f.is_done else _not_acknowledged()
                for f in futures]

    def send_offsets(self, offsets: dict) -> None:
        self.producer.send_offsets_to_transaction(offsets, self.consumer)

    def commit_transaction(self) -> None:
        self.producer.commit_transaction()

    def abort_transaction(self) -> None:
        self.producer.abort_transaction()

    def poll(self, timeout_s: float) -> dict:
        return self.consumer.poll(timeout_ms=timeout_s * 1000)      # type: ignore[union-attr]

    def position(self, tp: mq.TopicPartition) -> int:
        return self.consumer.position(tp)                           # type: ignore[union-attr]

    def commit(self, offsets: dict) -> None:
        self.consumer.commit(offsets)                               # type: ignore[union-attr]

    def commit_async(self, offsets: dict, callback) -> None:
        self.consumer.commit_async(offsets, callback)               # type: ignore[union-attr]

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def engine(self, engine) -> None:
        engine.run()

    def close(self) -> None:
        """The consumer (leaving the group: the revocation commits), then the producer."""
        if self.consumer is not None:
            try:
                self.consumer.close()
            except Exception as err:               # noqa: BLE001 -- closing anyway
                log.warning("closing the consumer: %s", err)
        if self._producer is not None:
            self._producer.close(timeout=10)
            self._producer = None


class AsyncClients:
    """Steps awaited with ``mq.aio``'s clients, in one event loop (``drive``). ``commit_async``
    is a task (one at a time: ``Delivery`` waits for its callback before the next)."""

    def __init__(self, producer_options: dict, consumer_options: dict) -> None:
        self._producer_options = producer_options
        self._consumer_options = dict(consumer_options)
        self._topics = self._consumer_options.pop("topics")
        self._producer: mq.aio.Producer | None = None
        self._starting = asyncio.Lock()
        self.consumer: mq.aio.Consumer | None = None
        self.listener = Listener(self)
        self._commits: set[asyncio.Task] = set()

    def run(self, op: Op[T]) -> Coroutine[Any, Any, T]:
        """Drive ``op``, every step awaited (``_drive``): a coroutine."""
        return _drive(self, op)

    def drive(self, op: Op[T]) -> T:
        """Run ``op`` in a new event loop, which the clients belong to."""
        return asyncio.run(self.run(op))

    async def producer(self) -> mq.aio.Producer:
        """The producer, started (connected; exactly once, its transactions initialized). A
        start that fails leaves none: the next step makes a new one."""
        if self._producer is None:
            async with self._starting:
                if self._producer is None:
                    producer = mq.aio.Producer(**self._producer_options)
                    await producer.start()        # it stops itself if this fails
                    self._producer = producer
        return self._producer

    # --- the steps ----------------------------------------------------------------------------
    async def start_producer(self) -> mq.aio.Producer:
        return await self.producer()

    async def start_consumer(self) -> mq.aio.Consumer:
        consumer = mq.aio.Consumer(*self._topics, listener=self.listener,
                                   **self._consumer_options)
        await consumer.start()
        self.consumer = consumer
        return consumer

    async def partitions_for(self, topic: str) -> set[int]:
        return await (await self.producer()).partitions_for(topic)

    async def begin_transaction(self) -> None:
        await (await self.producer()).begin_transaction()

    async def send(self, output: tuple) -> asyncio.Future:
        topic, key, value, headers = output
        producer = self._producer or await self.producer()
        future = await producer.send(topic, value=value, key=key, headers=headers)
        future.add_done_callback(_retrieve)
        return future

    async def send_and_wait(self, output: tuple) -> None:
        topic, key, value, headers = output
        producer = await self.producer()
        await producer.send_and_wait(topic, value=value, key=key, headers=headers)

    async def flush(self) -> None:
        await (await self.producer()).flush()

    async def outcomes(self, futures: list) -> list:
        return [f.exception() if f.done() else _not_acknowledged() for f in futures]

    async def send_offsets(self, offsets: dict) -> None:
        await (await self.producer()).send_offsets_to_transaction(offsets, self.consumer)

    async def commit_transaction(self) -> None:
        await (await self.producer()).commit_transaction()

    async def abort_transaction(self) -> None:
        await (await self.producer()).abort_transaction()

    async def poll(self, timeout_s: float) -> dict:
        return await self.consumer.getmany(timeout_ms=timeout_s * 1000)   # type: ignore

    async def position(self, tp: mq.TopicPartition) -> int:
        return await self.consumer.position(tp)                     # type: ignore[union-attr]

    async def commit(self, offsets: dict) -> None:
        await self.consumer.commit(offsets)                         # type: ignore[union-attr]

    async def commit_async(self, offsets: dict, callback) -> None:
        """The commit as a task; ``callback(offsets, error or None)`` when it is done. The task,
        not this call, hands the commit to the consumer: a step awaited after this one (a poll)
        may reach it first, so ``aio.AsyncEngine`` commits synchronously instead."""
        task = asyncio.get_running_loop().create_task(self.consumer.commit(offsets))
        self._commits.add(task)

        def done(t: asyncio.Task) -> None:
            self._commits.discard(t)
            callback(offsets, ClosedError("the commit was cancelled") if t.cancelled()
                     else t.exception())
        task.add_done_callback(done)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def engine(self, engine) -> None:
        await engine.run()

    async def close(self) -> None:
        """The commit task in flight, the consumer (leaving the group: the revocation
        commits), then the producer."""
        if self._commits:
            await asyncio.wait(list(self._commits), timeout=10)
        if self.consumer is not None:
            try:
                await self.consumer.stop()
            except Exception as err:               # noqa: BLE001 -- closing anyway
                log.warning("closing the consumer: %s", err)
        if self._producer is not None:
            await self._producer.stop(timeout=10)
            self._producer = None


def _retrieve(future: asyncio.Future) -> None:
    """An output's failure is read at the next commit, if at all (a lost partition drops
    it): never reported as an exception nobody retrieved."""
    if not future.cancelled():
        future.exception()
