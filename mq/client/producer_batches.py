"""The producer's units of work: the open batch of each partition, one batch's life from its
first record to its reply, and the futures ``send()`` returns, which read that outcome.

A ``Batch`` is filled and closed by the accumulator (``batch_accumulator.py``, and
``send()``'s fast path) under the producer's lock, sealed and queued by the sender
(``sender.py``) and written by the driver (``producer_io.py``). ``finish_batch`` gives it
its outcome exactly once, outside that lock, and runs its futures' callbacks on the thread
that finished it (normally the I/O thread; ``close()`` fails what is left).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from mq.client.accumulator import FutureBase
from mq.client.accumulator import ProducerBatchBuilder as BatchBuilder
from mq.client.types import RecordMetadata

__all__ = ["Batch", "FutureRecordMetadata", "TopicState", "finish_batch", "wait_done"]

log = logging.getLogger("mq.producer")

POOLED_BUFFERS = 4           # finished batches' buffers a producer keeps for its next batches


class TopicState:
    """Cached metadata of one topic plus the open batch of each partition."""

    __slots__ = ("name", "num_partitions", "partitions", "open", "fetched", "batch_limit",
                 "grow_limit")

    def __init__(self, name: str) -> None:
        self.name = name
        self.num_partitions = 0
        self.partitions: list[int] = []
        self.open: list[Batch | None] = []
        self.fetched = 0.0
        self.batch_limit = 0         # min(batch_size, the topic's max.message.bytes)
        self.grow_limit = 0          # min(max_request_size, max.message.bytes)

    def update(self, num_partitions: int, batch_limit: int, grow_limit: int,
               now: float) -> None:
        self.batch_limit = batch_limit
        self.grow_limit = max(grow_limit, batch_limit)
        self.num_partitions = num_partitions
        self.partitions = list(range(num_partitions))
        if len(self.open) < num_partitions:
            self.open.extend([None] * (num_partitions - len(self.open)))
        self.fetched = now


class Batch:
    """One batch of one partition, from its first record to its reply."""

    __slots__ = ("topic", "partition", "info", "builder", "add", "records", "created", "deadline",
                 "data", "seq", "attempts", "not_before", "sent_at", "base_offset",
                 "log_append_time", "error", "last_error", "done", "event", "callbacks", "lock",
                 "producer_id", "producer_epoch", "pool")

    def __init__(self, info: TopicState, partition: int, compression: int, now: float,
                 linger_s: float, lock: threading.Lock, pool: list[bytearray]) -> None:
        self.topic = info.name
        self.partition = partition
        self.info = info
        # pool: finished batches' buffers (finish_batch); popped only under the producer's
        # lock, which this runs under, so a non-empty pool stays non-empty until the pop.
        self.builder = builder = BatchBuilder(compression=compression,
                                              future_type=FutureRecordMetadata, owner=self,
                                              capacity=info.batch_limit,
                                              buffer=pool.pop() if pool else None)
        self.pool = pool
        # add(timestamp_ms | None, key, value, headers) -> the record's future: one C call;
        # records.size: the batch's size so far (read for every record)
        self.add = builder.add
        self.records = builder.accumulator
        self.created = now
        self.deadline = now + linger_s
        self.data: bytearray | None = None
        self.seq = 0                               # the producer's close order
        self.producer_id = -1                      # sealed with (idempotence), else -1
        self.producer_epoch = -1
        self.attempts = 0
        self.not_before = 0.0
        self.sent_at = 0.0
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self.last_error: BaseException | None = None
        self.done = False
        # Made by the first waiter (wait_done): an Event per batch cost send() about 2 us, and
        # with linger_ms=0 a batch is one record that nobody may wait for.
        self.event: threading.Event | None = None
        self.callbacks: list | None = None
        self.lock = lock

    @classmethod
    def whole(cls, info: TopicState, partition: int, data: bytearray, now: float,
              lock: threading.Lock, pool: list[bytearray], producer_id: int,
              producer_epoch: int) -> Batch:
        """A batch built and sealed whole, ``data`` (``ProducerIO.send_whole``): closed from
        the start, with no builder."""
        batch = cls.__new__(cls)
        batch.topic = info.name
        batch.partition = partition
        batch.info = info
        batch.builder = batch.add = batch.records = None
        batch.created = batch.deadline = now
        batch.data = data
        batch.seq = 0
        batch.producer_id = producer_id
        batch.producer_epoch = producer_epoch
        batch.attempts = 0
        batch.not_before = batch.sent_at = 0.0
        batch.base_offset = batch.log_append_time = -1
        batch.error = batch.last_error = None
        batch.done = False
        batch.event = batch.callbacks = None
        batch.lock = lock
        batch.pool = pool
        return batch


class FutureRecordMetadata(FutureBase):
    """The outcome of one ``send()``: a ``RecordMetadata`` or the exception that failed it.

    A light view of its batch's outcome — ``_batch``, ``_delta`` (the record's offset delta)
    and ``_ts`` (its timestamp), fields of ``records.RecordFuture`` — made by the batch's
    record accumulator together with the record (in C when the extension is built), so a
    record costs no Python-level constructor; everything below reads the batch."""

    __slots__ = ()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait for the outcome. Raises the failure (a ``BrokerError`` subclass,
        ``BrokerUnavailableError``, ``ClosedError``...) or ``TimeoutError`` after ``timeout``
        seconds."""
        batch = self._batch
        if not batch.done and not wait_done(batch, timeout):
            raise TimeoutError(f"record for {batch.topic}-{batch.partition} not acknowledged "
                               f"within {timeout} s")
        if batch.error is not None:
            raise batch.error
        return self._metadata()

    def _metadata(self) -> RecordMetadata:
        b = self._batch
        offset = b.base_offset + self._delta if b.base_offset >= 0 else -1
        ts = b.log_append_time if b.log_append_time >= 0 else self._ts
        return RecordMetadata(b.topic, b.partition, offset, ts)

    @property
    def is_done(self) -> bool:
        return self._batch.done

    def succeeded(self) -> bool:
        return self._batch.done and self._batch.error is None

    def failed(self) -> bool:
        return self._batch.done and self._batch.error is not None

    def exception(self) -> BaseException | None:
        """The failure, or ``None`` (not done yet, or succeeded)."""
        return self._batch.error if self._batch.done else None

    @property
    def attempts(self) -> int:
        """How many times this record's batch was sent (more than 1: it was re-sent after an
        error or a lost connection; without idempotence it may then be in the log twice)."""
        return self._batch.attempts

    def add_callback(self, fn: Callable, *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``fn(*args, metadata, **kwargs)`` on success (at once if already done)."""
        self._add(fn, args, kwargs, False)
        return self

    def add_errback(self, fn: Callable, *args: Any, **kwargs: Any) -> FutureRecordMetadata:
        """Call ``fn(*args, exception, **kwargs)`` on failure (at once if already failed)."""
        self._add(fn, args, kwargs, True)
        return self

    def _add(self, fn: Callable, args: tuple, kwargs: dict, errback: bool) -> None:
        batch = self._batch
        with batch.lock:
            if not batch.done:
                if batch.callbacks is None:
                    batch.callbacks = []
                batch.callbacks.append((self, fn, args, kwargs, errback))
                return
        _run_callback(self, fn, args, kwargs, errback)

    def __repr__(self) -> str:
        b = self._batch
        state = ("pending" if not b.done else f"failed: {b.error!r}" if b.error is not None
                 else f"offset {self._metadata().offset}")
        return f"<FutureRecordMetadata {b.topic}-{b.partition} {state}>"


def _run_callback(fut: FutureRecordMetadata, fn: Callable, args: tuple, kwargs: dict,
                  errback: bool) -> None:
    batch = fut._batch
    try:
        if batch.error is None:
            if not errback:
                fn(*args, fut._metadata(), **kwargs)
        elif errback:
            fn(*args, batch.error, **kwargs)
    except Exception:
        log.exception("producer callback %r raised", fn)


def wait_done(batch: Batch, timeout: float | None) -> bool:
    """Wait until ``batch`` is finished; False if ``timeout`` seconds passed first."""
    with batch.lock:
        if batch.done:
            return True
        if batch.event is None:
            batch.event = threading.Event()       # finish_batch sets it: it reads it under the lock
        event = batch.event
    return event.wait(timeout)


def finish_batch(batch: Batch, base_offset: int, log_append_time: int,
            error: BaseException | None) -> None:
    """Resolve a batch's futures and run their callbacks (never under the producer lock)."""
    with batch.lock:
        if batch.done:
            return
        batch.base_offset = base_offset
        batch.log_append_time = log_append_time
        batch.error = error
        batch.done = True
        callbacks, batch.callbacks = batch.callbacks, None
        event = batch.event
    if event is not None:
        event.set()
    batch.builder = batch.add = batch.records = None   # sent: let the records' bytes go
    data, batch.data = batch.data, None
    # The next batch is built in this one's buffer, if nothing else holds it (getrefcount:
    # `data` and its own argument): a 1 MiB batch in fresh memory costs 256 page faults.
    if type(data) is bytearray and len(batch.pool) < POOLED_BUFFERS and \
            sys.getrefcount(data) == 2:
        batch.pool.append(data)
    if callbacks:
        for fut, fn, args, kwargs, errback in callbacks:
            _run_callback(fut, fn, args, kwargs, errback)
