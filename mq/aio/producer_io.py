"""The asyncio producer's driver: ``mq.Producer``'s record path and its pure parts (the
accumulator, the sender), driven by an event loop instead of an I/O thread.

``ProducerIO`` (``mq/client/producer_io.py``) is the threaded driver; this one keeps its
decisions and borrows the methods that only make them (queueing a batch, writing the sender's
requests, a lost connection, dispatching replies, timeouts, the next wake-up), over an
``AsyncConnection``. What differs:

- Replies arrive in the loop's protocol callback (``AsyncConnection.on_replies``) and are
  settled there at once: no thread reads them, and the outcomes resolve the asyncio futures
  ``mq.aio.Producer.send`` returned (``finish``).
- Time is a task (``run``) that sleeps until the next thing the clock makes due (a batch's
  linger, a retry's backoff, a request's timeout, a reconnect) or until ``wake``.
- Where the threaded driver would block — room in flight, a topic's metadata, a partition
  joining the transaction — this one raises ``WouldBlock`` with what to await, and
  ``mq.aio.Producer`` awaits it and sends again. Its coroutines are ``learn``, ``room`` and
  the transaction's requests (``AsyncTransactions``).
- No batch arena: every batch goes through the socket (``shared_batches`` is ignored).

A driver belongs to the event loop it was opened in; a forked child must make its own.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import Any, TypeVar

from mq.aio.connection import AsyncConnection, open_connection
from mq.client.batch_accumulator import BatchAccumulator
from mq.client.idempotence import ProducerIdentity
from mq.client.producer_batches import Batch, FutureRecordMetadata, TopicState, finish_batch
from mq.client.producer_io import ProducerIO
from mq.client.producer_metadata import ProducerMetadata, unknown_topic
from mq.client.sender import MAX_BACKOFF_S, Sender
from mq.client.transaction_manager import TransactionManager
from mq.client.transactions import TransactionRequests, TxnOp
from mq.errors import (BrokerError, BrokerUnavailableError, ClosedError, MQError,
                       UnknownTopicOrPartitionError, WouldBlock, error_for_code)
from mq.protocol.messages import Api, Response

__all__ = ["AsyncProducerIO", "AsyncTransactions"]

log = logging.getLogger("mq.producer")

T = TypeVar("T")
_INF = math.inf


class _Room:
    """The threaded driver's condition, as far as the borrowed methods use it: notified
    whenever room may have opened, which wakes the coroutines waiting for it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def notify_all(self) -> None:
        self.event.set()


class AsyncProducerIO:
    """The I/O of one asyncio producer (see the module doc). Constructed by the record path
    (``Producer._build_parts``) with the threaded driver's arguments; ``open`` connects."""

    # The threaded driver's decisions, over this driver's attributes.
    queue = ProducerIO.queue
    pump = ProducerIO.pump
    _watch_timeout = ProducerIO._watch_timeout
    _disconnected = ProducerIO._disconnected
    _dispatch = ProducerIO._dispatch
    _service = ProducerIO._service
    _next_wake = ProducerIO._next_wake
    producer_id_refused = ProducerIO.producer_id_refused
    producer_id_renewed = ProducerIO.producer_id_renewed

    def __init__(self, socket: str, client_id: str, request_timeout_s: float,
                 backoff_s: float, shared_batches: bool, arena_slot_bytes: int,
                 transaction_timeout_ms: int, explicit_idempotence: bool,
                 accumulator: BatchAccumulator, sender: Sender,
                 metadata: ProducerMetadata) -> None:
        self.socket = socket
        self.client_id = client_id
        self.request_timeout_s = request_timeout_s
        self.backoff_s = backoff_s
        self.transaction_timeout_ms = transaction_timeout_ms
        self.explicit_idempotence = explicit_idempotence
        self.accumulator = accumulator
        self.sender = sender
        self.metadata = metadata
        self.lock = threading.Lock()              # the record path's; never contended here
        self.cond: _Room | None = None            # made in open(), in the loop
        self.conn: AsyncConnection | None = None
        self.fd = -1
        self.slots: dict[int, int] = {}           # no arena: always empty
        self.requests: dict[int, Any] = {}        # the threaded driver's; always empty
        self.io_thread: asyncio.Task | None = None    # the clock's task, once open
        self.io_ident = -1                        # no thread of its own: send() never is it
        self.wake_at = _INF
        self.reconnect_at = 0.0
        self.reconnect_backoff = backoff_s
        self.waiters: dict[Batch, list] = {}      # batch -> [(asyncio future, record's)]
        self.learned: str | None = None           # the topic learned for the send retried
        self.closed = False
        self.stopping = False
        self._kick: asyncio.Future | None = None
        self._create_future = None                # the loop's, from open()

    # --- start and stop -----------------------------------------------------------------------
    async def open(self, init_producer_id: bool) -> None:
        """Connect (InitProducerId first if ``init_producer_id``) and start the clock's
        task."""
        self.cond = _Room()
        # Bound once: asyncio.get_running_loop() costs a getpid() call in CPython 3.11, and
        # send() makes a future per record.
        self._create_future = asyncio.get_running_loop().create_future
        conn = await open_connection(self.socket, self.client_id, self.request_timeout_s)
        if init_producer_id:
            try:
                reply = await conn.call(Api.INIT_PRODUCER_ID, None,
                                        self.transaction_timeout_ms)
            except BrokerError as err:
                try:
                    self.producer_id_refused(err)
                except BaseException:
                    conn.close()
                    raise
            except BaseException:
                conn.close()
                raise
            else:
                self.sender.producer_id_received(reply["producer_id"],
                                                 reply["producer_epoch"])
        self._attach(conn)
        self.io_thread = asyncio.get_running_loop().create_task(
            self.run(), name=f"mq-producer-{self.client_id}")

    async def stop(self) -> None:
        """Fail what is left with ``ClosedError``, stop the task, close the connection.
        Idempotent."""
        if self.closed:
            return
        self.closed = self.stopping = True
        err = ClosedError("the producer was closed before this record was delivered")
        finished: list = [(batch, -1, -1, err) for batch in
                          self.accumulator.drop_all(self.metadata.all_topics.values())]
        self.sender.fail_all(err, finished)
        self.finish(finished)
        if self.conn is not None:
            self.conn.close()                     # fails a request the task awaits
            self.conn = None
        task = self.io_thread
        if task is not None and task is not asyncio.current_task():
            self.wake()
            await task
        self.metadata.close()
        if self.cond is not None:
            self.cond.notify_all()

    def _attach(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.reconnect_backoff = self.backoff_s
        self.metadata.attach(conn.broker_info)
        self.sender.request_cap = self.metadata.request_cap
        self.sender.broker_max_request = self.metadata.broker_max_request
        conn.on_replies(lambda replies: self._replied(conn, replies),
                        lambda err: self._lost(conn, err))
        self.cond.notify_all()

    async def _reconnect(self) -> None:
        try:
            conn = await open_connection(self.socket, self.client_id, self.request_timeout_s)
        except (MQError, OSError) as err:
            self.sender.last_error = err if isinstance(err, BrokerUnavailableError) else \
                BrokerUnavailableError(f"cannot reconnect: {err}")
            self.reconnect_at = time.monotonic() + self.reconnect_backoff
            self.reconnect_backoff = min(self.reconnect_backoff * 2, MAX_BACKOFF_S)
            return
        if self.stopping:
            conn.close()
            return
        log.info("producer reconnected to %s", self.socket)
        self._attach(conn)

    def wake(self) -> None:
        """Make the clock's task look in now."""
        kick = self._kick
        if kick is not None and not kick.done():
            kick.set_result(None)

    # --- what the record path cannot wait for itself -----------------------------------------
    def wait_for_room(self, max_block_s: float) -> None:
        raise WouldBlock(lambda: self.room(max_block_s))

    def due_reply(self) -> None:
        """Replies are read as they arrive: ``send()`` never looks for them."""
        return None

    def topic(self, topic: str, max_block_s: float) -> TopicState:
        """The topic just learned for this send, else ``WouldBlock`` until it is."""
        info = self.metadata.topics.get(topic)
        if info is not None and self.learned == topic:
            return info
        raise WouldBlock(lambda: self.learn(topic, max_block_s))

    def transactions(self, manager: TransactionManager, ids: ProducerIdentity,
                     max_block_s: float) -> AsyncTransactions:
        return AsyncTransactions(TransactionRequests(manager, ids, max_block_s,
                                                     self.request_timeout_s, self.backoff_s),
                                 self)

    async def room(self, max_block_s: float) -> None:
        """Wait while ``max_in_flight`` batches are queued; ``TimeoutError`` after
        ``max_block_s``."""
        sender = self.sender
        deadline = time.monotonic() + max_block_s
        while len(sender.ready) >= sender.max_in_flight and not self.closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"send() waited {max_block_s} s for room: "
                                   f"{len(sender.ready)} batches queued behind "
                                   f"{len(sender.in_flight)} in flight "
                                   f"({'connected' if self.conn else sender.last_error})")
            self.cond.event.clear()
            try:
                await asyncio.wait_for(self.cond.event.wait(), remaining)
            except TimeoutError:
                pass
        if self.closed:
            raise ClosedError("producer is closed")

    async def learn(self, topic: str, max_block_s: float) -> TopicState:
        """Fetch ``topic``'s metadata (``ProducerMetadata.requests``), waiting out a
        reconnect, up to ``max_block_s``. Raises ``UnknownTopicOrPartitionError``,
        ``BrokerUnavailableError``, ``TimeoutError``."""
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, got {type(topic).__name__}")
        deadline = time.monotonic() + max_block_s
        while True:
            try:
                replies = [await self.call(deadline, *request)
                           for request in self.metadata.requests(topic)]
                break
            except UnknownTopicOrPartitionError as err:
                raise unknown_topic(topic, err)  # noqa: B904 (its cause is err)
            except BrokerUnavailableError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.05)
        self.learned = topic
        return self.metadata.learned(topic, replies, time.monotonic())

    async def call(self, deadline: float, api: Api, *fields: Any) -> Response:
        """One request on the producer's connection, by ``deadline`` (waiting out a
        reconnect). Raises the broker's error, ``BrokerUnavailableError``, ``ClosedError``,
        ``TimeoutError``."""
        while self.conn is None or self.conn.closed:
            if self.closed:
                raise ClosedError("producer is closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerUnavailableError(f"no connection to the broker at {self.socket} "
                                             f"({self.sender.last_error})")
            self.cond.event.clear()
            self.wake()                           # the clock's task reconnects
            try:
                await asyncio.wait_for(self.cond.event.wait(), min(remaining, 0.05))
            except TimeoutError:
                pass
        reply = await self.conn.reply(self.conn.request(api, *fields),
                                      max(0.0, deadline - time.monotonic()))
        if reply.error_code:
            raise error_for_code(reply.error_code, reply.error_message or "")
        return reply

    # --- outcomes -------------------------------------------------------------------------------
    def future(self, record: FutureRecordMetadata | None, batch: Batch) -> asyncio.Future:
        """An asyncio future of ``record``'s outcome (None: of the batch's, resolving to
        None)."""
        future = self._create_future()
        if batch.done:
            _resolve(future, record, batch)
        else:
            waiting = self.waiters.get(batch)
            if waiting is None:
                waiting = self.waiters[batch] = []
            waiting.append((future, record))
        return future

    def finish(self, finished: list) -> None:
        """Resolve the outcomes in ``finished``, and the asyncio futures of their records."""
        waiters = self.waiters
        for args in finished:
            finish_batch(*args)
            for future, record in waiters.pop(args[0], ()):
                _resolve(future, record, args[0])

    # --- the connection's callbacks, in the loop --------------------------------------------------
    def _replied(self, conn: AsyncConnection, replies: list[Response]) -> None:
        if conn is not self.conn or self.stopping:
            return                                # what was in flight on it is re-sent
        finished: list = []
        now = time.monotonic()
        self._dispatch(replies, now, finished)
        self._service(now, finished)
        if self._next_wake(now) < self.wake_at:   # a retry's backoff
            self.wake()
        self.finish(finished)

    def _lost(self, conn: AsyncConnection, err: Exception) -> None:
        if self.stopping:
            return
        finished: list = []
        self._disconnected(conn, err, finished)
        self.finish(finished)

    # --- the clock's task -----------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._loop()
        except Exception:                         # a bug: fail loudly, never hang callers
            log.exception("asyncio producer's task crashed")
            self.io_thread = None
            await self.stop()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        sender = self.sender
        while not self.stopping:
            now = time.monotonic()
            if self.conn is None and now >= self.reconnect_at:
                await self._reconnect()
                now = time.monotonic()
            if self.conn is not None and sender.producer_id_due(now):
                await self._renew_producer_id()
                now = time.monotonic()
            finished: list = []
            self._service(now, finished)
            self.finish(finished)
            if self.stopping:
                return
            self.wake_at = wake_at = self._next_wake(time.monotonic())
            sender.wake = False
            self._kick = kick = loop.create_future()
            timer = None if wake_at == _INF else loop.call_at(
                wake_at, lambda: kick.done() or kick.set_result(None))
            try:
                await kick
            finally:
                if timer is not None:
                    timer.cancel()

    async def _renew_producer_id(self) -> None:
        """InitProducerId for a new producer id; the sender seals the batches that waited."""
        conn = self.conn
        try:
            reply = await conn.call(Api.INIT_PRODUCER_ID, None, self.transaction_timeout_ms)
            failure: BaseException | None = None
        except (MQError, TimeoutError, OSError) as err:
            reply, failure = None, err
        finished: list = []
        self.producer_id_renewed(conn, reply, failure, finished)
        self.finish(finished)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "connected" if self.conn else "disconnected"
        return f"<AsyncProducerIO {self.socket} {state}>"


def _resolve(future: asyncio.Future, record: FutureRecordMetadata | None,
             batch: Batch) -> None:
    if future.done():                             # cancelled by its owner
        return
    if batch.error is not None:
        future.set_exception(batch.error)
    else:
        future.set_result(None if record is None else record._metadata())


class AsyncTransactions:
    """``TransactionRequests`` awaited over the asyncio producer's connection. ``admit`` is
    the record path's (synchronous): a partition new to the transaction raises
    ``WouldBlock`` until AddPartitionsToTxn is done."""

    def __init__(self, requests: TransactionRequests, io: AsyncProducerIO) -> None:
        self.requests = requests
        self.manager = requests.manager
        self.ids = requests.ids
        self._io = io

    def admit(self, topic: str, partition: int) -> bool:
        if self.manager.check_send(topic, partition):
            return True
        raise WouldBlock(lambda: self.run(self.requests.admit(topic, partition)))

    async def run(self, op: TxnOp[T]) -> T:
        """Drive ``op``: its requests over the connection, its backoffs as sleeps."""
        try:
            step = next(op)
            while True:
                if isinstance(step, float):
                    await asyncio.sleep(step)
                    step = op.send(None)
                    continue
                try:
                    reply = await self._io.call(*step)
                except Exception as err:
                    step = op.throw(err)
                    continue
                step = op.send(reply)
        except StopIteration as stop:
            return stop.value
