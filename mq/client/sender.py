"""The producer's sender, sans I/O: closed batches in, the requests to write and the batches'
outcomes out. No socket, no thread, no clock: the driver (``producer_io.py``) passes ``now``
and the replies in, writes the batches ``requests()`` hands it, and resolves the outcomes
collected in a ``finished`` list, ``(batch, base_offset, log_append_time, error)`` each
(``producer_batches.finish_batch``), once it has let go of the producer's lock.

What it decides: the order batches go out in, how many are in flight, retries and their
backoff, request and delivery timeouts, sequence numbers and the idempotent producer's
answers (``idempotence.py``), and what a failed batch means for an open transaction
(``transaction_manager.py``).

Ordering, retries and reconnects
--------------------------------
Batches of one partition are sent in the order they were closed (``Batch.seq``), on one
connection, and the broker appends a connection's requests in order. ``ready`` stays sorted by
``seq``. A retriable error (``BrokerError.retriable``) re-queues the batch ahead of every later
batch of its partition and mutes the partition: only the retry goes out (after
``retry_backoff_ms``, doubling up to 1 s), and nothing after it until it is acknowledged.
Batches that were already in flight behind the failed one keep their outcome; a broker that
cannot take one request (shutting down, storage error) fails the later ones too, so that does
not reorder in practice, and ``max_in_flight=1`` rules it out (Kafka's advice for producers
without idempotence). Non-retriable errors (unknown topic or partition, message too large,
invalid request) fail the batch's futures with the broker's exception.

A lost connection (``connection_lost``) re-queues every batch that was in flight, in order (one
at a time per partition until the first is acknowledged), counting one attempt each; a batch
that exhausts ``retries`` fails with ``BrokerUnavailableError``, and any batch still
undelivered ``delivery_timeout_ms`` after it was created fails with the last error. The broker
may have appended an in-flight batch whose reply was lost. Without idempotence delivery is
therefore **at least once** (``future.attempts > 1`` tells which records were re-sent). With
idempotence (the default) the partition recognises the re-sent batch by its producer id and
sequence and answers with the offsets it got the first time: every acknowledged record is in
the log **exactly once**, in order. With ``acks=0`` a batch's outcome is final once written.

Idempotence: sequence answers and gaps
--------------------------------------
- A batch is sealed (producer id, epoch, base sequence) when it is queued, and its bytes never
  change afterwards: a retry or a re-send writes the very same bytes.
- ``DuplicateSequenceError`` (a batch the partition had) counts as success (offset -1), as in
  Kafka's producer.
- ``OutOfOrderSequenceError`` while an earlier batch of the same partition (same producer id
  and epoch) is still unacknowledged only means that batch is being retried: the later one is
  queued behind it again. Otherwise it is final: the partition lost track of this producer.
- A batch that fails for good leaves a gap in its partition's sequences, so no later batch
  sealed with the same id could be appended there: the later batches of that partition still
  queued fail with the same error. A plain idempotent producer then wants a new producer id
  (``awaiting_producer_id``; the driver asks for it); batches queued meanwhile wait unsealed
  and are sealed, in order, when it arrives. A transactional producer keeps its id: the
  transaction becomes abortable (``TransactionManager.batch_failed``), and the abort takes a
  new epoch; ``InvalidProducerEpochError`` makes it fatal (fenced).
- A failed InitProducerId counts as one attempt of every batch waiting for the id, so those
  fail as their sends would (at once for a non-retriable error, else after ``retries``).
"""

from __future__ import annotations

import collections
import logging
import math

from mq.client.idempotence import ProducerIdentity
from mq.client.producer_batches import Batch
from mq.client.transaction_manager import TransactionManager
from mq.errors import (
    BrokerError,
    DuplicateSequenceError,
    OutOfOrderSequenceError,
    RecordListTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    error_for_code,
)

__all__ = ["MAX_BACKOFF_S", "Sender"]

log = logging.getLogger("mq.producer")

MAX_BACKOFF_S = 1.0                         # Kafka's retry.backoff.max.ms
_INF = math.inf


class Sender:
    """Queued and in-flight batches of one producer, and what replies and time do to them
    (see the module doc). Not thread-safe: the producer calls it under its lock.

    Read by the driver: ``ready`` (closed batches waiting to be written, by ``seq``),
    ``in_flight`` (request id -> batch, oldest first), ``incomplete`` (queued or in flight),
    ``awaiting_producer_id``. ``wake`` is set when the driver must look in at once (a new
    producer id is wanted); the driver clears it."""

    def __init__(self, acks: int, max_in_flight: int, retries: int, backoff_s: float,
                 request_timeout_s: float, delivery_timeout_s: float,
                 ids: ProducerIdentity | None = None,
                 txn: TransactionManager | None = None) -> None:
        self.acks = acks
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.backoff_s = backoff_s
        self.request_timeout_s = request_timeout_s
        self.delivery_timeout_s = delivery_timeout_s
        self.ids = ids
        self.txn = txn
        self.ready: collections.deque[Batch] = collections.deque()
        self.in_flight: dict[int, Batch] = {}
        self.incomplete: set[Batch] = set()
        self.muted: dict[tuple[str, int], Batch] = {}   # partition -> its batch in retry
        self.retrying = 0                                 # queued batches with a backoff
        self.seq = 0
        self.request_cap = _INF                           # the largest batch a request takes
        self.broker_max_request: int | None = None        # the broker's max_request_bytes
        self.last_error: BaseException | None = None      # the connection's, for timeouts
        self.awaiting_producer_id = False                 # a new producer id is wanted
        self.producer_id_retry_at = 0.0
        self.producer_id_backoff = backoff_s
        self.stopping = False
        self.wake = False
        self.stale_topics: list[str] = []                 # unknown to the broker: refetch

    # --- queueing ---------------------------------------------------------------------------------
    @property
    def room(self) -> int:
        """Requests that could be added to those in flight and queued (may be negative)."""
        return self.max_in_flight - len(self.in_flight) - len(self.ready)

    def enqueue(self, batch: Batch) -> bool:
        """A closed batch: seal it (idempotence), build it and queue it behind the others.
        True when it waits for a producer id (``hurry_producer_id``)."""
        ids = self.ids
        unsealed = ids is not None and ids.producer_id < 0
        if ids is not None and not unsealed:
            self._seal(batch, ids)
        batch.data = batch.builder.build()
        self.admit(batch)
        self.ready.append(batch)
        return unsealed

    def admit(self, batch: Batch) -> None:
        """``batch``, built and sealed, is the sender's from now on (in close order)."""
        self.seq += 1
        batch.seq = self.seq
        self.incomplete.add(batch)

    def hurry_producer_id(self, now: float) -> bool:
        """A batch waits for a producer id: ask again soon (backoff from its start). True if
        that is sooner than planned (the driver must look in)."""
        self.producer_id_backoff = self.backoff_s
        if self.producer_id_retry_at > now + self.backoff_s:
            self.producer_id_retry_at = now + self.backoff_s
            return True
        return False

    @staticmethod
    def _seal(batch: Batch, ids: ProducerIdentity) -> None:
        builder = batch.builder
        batch.producer_id = builder.producer_id = ids.producer_id
        batch.producer_epoch = builder.producer_epoch = ids.epoch
        builder.base_sequence = ids.assign(batch.topic, batch.partition, len(builder))
        builder.is_transactional = ids.transactional

    # --- requests out -----------------------------------------------------------------------------
    def requests(self, now: float, finished: list) -> list[Batch]:
        """The batches to write now, in order, taken off the queue: while there is room in
        flight (always, with ``acks=0``), skipping muted partitions, batches in backoff and
        those waiting for a producer id. Hand each to ``sent`` once written, the unwritten
        rest back to ``unsent``. Batches too large for the broker fail here."""
        ready = self.ready
        out: list[Batch] = []
        if not ready:
            return out
        acks, room = self.acks, self.max_in_flight - len(self.in_flight)
        blocked: set | None = None
        muted = self.muted
        unsealed = self.awaiting_producer_id
        i = 0
        while i < len(ready) and (acks == 0 or len(out) < room):
            batch = ready[i]
            if muted or self.retrying or unsealed:
                tp = (batch.topic, batch.partition)
                if blocked is not None and tp in blocked:
                    i += 1
                    continue
                holder = muted.get(tp)
                if (holder is not None and holder is not batch) or batch.not_before > now \
                        or (unsealed and batch.producer_id < 0):
                    if blocked is None:
                        blocked = set()
                    blocked.add(tp)
                    i += 1
                    continue
                if batch.not_before:
                    batch.not_before = 0.0
                    self.retrying -= 1
            del ready[i]
            if len(batch.data) > self.request_cap:
                # Built before this broker's lower limit was known (it restarted with a new
                # config): sending it would only make the broker drop the connection, again
                # at every retry.
                self._done(batch, -1, -1, RecordListTooLargeError(
                    f"batch of {len(batch.data)} bytes for {batch.topic}-{batch.partition} is "
                    f"larger than the broker accepts in a request (max_request_bytes "
                    f"{self.broker_max_request} B, of which a batch may take "
                    f"{self.request_cap} B)"), finished)
                continue
            out.append(batch)
        return out

    def sent(self, batch: Batch, request_id: int, now: float, finished: list) -> None:
        """``batch`` was written as request ``request_id``."""
        batch.attempts += 1
        if self.acks == 0:
            self._done(batch, -1, -1, None, finished)
        else:
            batch.sent_at = now
            self.in_flight[request_id] = batch

    def unsent(self, batches: list[Batch]) -> None:
        """Batches from ``requests`` that were not written (the connection broke): back in
        their places."""
        for batch in batches:
            self._insert(batch)

    def _insert(self, batch: Batch) -> None:
        ready = self.ready
        i = len(ready)
        while i > 0 and ready[i - 1].seq > batch.seq:
            i -= 1
        ready.insert(i, batch)

    # --- replies and the connection in ------------------------------------------------------------
    def received(self, replies: list, now: float, finished: list) -> None:
        """Replies to produce requests (those to other requests are the driver's)."""
        in_flight = self.in_flight
        for reply in replies:
            batch = in_flight.pop(reply.request_id, None)
            if batch is None:
                if reply.error_code:              # acks=0 requests are answered on error only
                    log.warning("produce request failed (acks=0): %s",
                                error_for_code(reply.error_code, reply.error_message or ""))
                continue
            if not reply.error_code:
                self._done(batch, reply["first_offset"], reply["log_append_time"], None,
                           finished)
                continue
            err = error_for_code(reply.error_code, reply.error_message or "")
            if err.retriable:
                backoff = min(self.backoff_s * 2 ** max(batch.attempts - 1, 0), MAX_BACKOFF_S)
                self._requeue(batch, err, now, backoff, finished)
            elif isinstance(err, OutOfOrderSequenceError) and self._earlier_pending(batch):
                self._requeue(batch, err, now, 0.0, finished)   # behind the batch in retry
            elif isinstance(err, DuplicateSequenceError):
                self._done(batch, -1, -1, None, finished)
            else:
                if isinstance(err, UnknownTopicOrPartitionError):
                    self.stale_topics.append(batch.topic)
                self._done(batch, -1, -1, err, finished)

    def connection_lost(self, err: BaseException, now: float, finished: list) -> None:
        """The connection broke: what was in flight is re-queued, in order."""
        self.last_error = err
        for batch in self.in_flight.values():
            self._requeue(batch, err, now, 0.0, finished)
        self.in_flight.clear()

    def timed_out(self, now: float) -> RequestTimedOutError | None:
        """The error to drop the connection with when the oldest request went unanswered for
        ``request_timeout_ms``, else None."""
        if not self.in_flight:
            return None
        oldest = next(iter(self.in_flight.values()))
        if now - oldest.sent_at <= self.request_timeout_s:
            return None
        return RequestTimedOutError(f"no reply to a produce request for {oldest.topic}-"
                                    f"{oldest.partition} within {self.request_timeout_s} s")

    def expire(self, now: float, connected: bool, finished: list) -> None:
        """Fail queued batches older than ``delivery_timeout_ms`` that are held back (no
        connection, a retry, a muted partition, no producer id)."""
        if not self.ready or not (not connected or self.retrying or self.muted
                                  or self.awaiting_producer_id):
            return
        for batch in [b for b in self.ready if now - b.created > self.delivery_timeout_s]:
            if batch not in self.incomplete:
                continue                          # failed meanwhile (_sequence_gap)
            self.ready.remove(batch)
            if batch.not_before:
                self.retrying -= 1
            self._done(batch, -1, -1, batch.last_error or self.last_error or
                       RequestTimedOutError(f"not delivered within "
                                            f"{self.delivery_timeout_s} s"), finished)

    def next_wake(self, now: float, connected: bool, wake: float = _INF) -> float:
        """When the sender next has something to do by the clock (``wake``: the earliest
        time the caller already has)."""
        if self.in_flight:
            wake = min(wake, next(iter(self.in_flight.values())).sent_at
                       + self.request_timeout_s)
        elif wake == _INF and connected:
            # Look in anyway when a request sent from now on could time out: the driver then
            # need not be woken for each request sent into an empty pipeline.
            wake = now + self.request_timeout_s
        if connected and self.awaiting_producer_id:
            wake = min(wake, self.producer_id_retry_at)
        if self.retrying or (self.ready and (not connected or self.awaiting_producer_id)):
            for batch in self.ready:
                if batch.not_before > now:        # a past one waits for room, not time
                    wake = min(wake, batch.not_before)
                wake = min(wake, batch.created + self.delivery_timeout_s)
        return wake

    def fail_all(self, err: BaseException, finished: list) -> None:
        """The producer stops: every batch not yet final fails with ``err``."""
        self.stopping = True
        for batch in self.incomplete:
            finished.append((batch, -1, -1, err))
        self.ready.clear()
        self.in_flight.clear()
        self.incomplete.clear()
        self.muted.clear()

    # --- outcomes ---------------------------------------------------------------------------------
    def _requeue(self, batch: Batch, err: BaseException, now: float, backoff: float,
                 finished: list) -> None:
        """Retry ``batch`` (ahead of its partition's later batches) or fail it."""
        batch.last_error = err
        if batch.attempts > self.retries or now - batch.created > self.delivery_timeout_s:
            self._done(batch, -1, -1, err, finished)
            return
        tp = (batch.topic, batch.partition)
        holder = self.muted.get(tp)
        if holder is None or batch.seq < holder.seq:
            self.muted[tp] = batch
        if backoff:
            batch.not_before = now + backoff
            self.retrying += 1
        self._insert(batch)

    def _done(self, batch: Batch, base_offset: int, log_append_time: int,
              error: BaseException | None, finished: list) -> None:
        """The batch's outcome is final: unmute its partition; resolved by the driver."""
        self.incomplete.discard(batch)
        tp = (batch.topic, batch.partition)
        if self.muted.get(tp) is batch:
            del self.muted[tp]
        if error is None or batch.producer_id < 0 or self.stopping:
            finished.append((batch, base_offset, log_append_time, error))
            return
        if self.txn is not None:                  # abortable, or fenced: fatal
            error = self.txn.batch_failed(error)
        finished.append((batch, -1, -1, error))
        self._sequence_gap(batch, error, finished)

    def _earlier_pending(self, batch: Batch) -> bool:
        """Whether a batch sealed before ``batch`` for its partition, with the same producer id
        and epoch, is still unacknowledged. Only looked at on an error."""
        for b in self.incomplete:
            if b.seq < batch.seq and b.partition == batch.partition and \
                    b.topic == batch.topic and b.producer_id == batch.producer_id and \
                    b.producer_epoch == batch.producer_epoch:
                return True
        return False

    def _sequence_gap(self, failed: Batch, error: BaseException, finished: list) -> None:
        """``failed`` will never be in its partition: fail the later batches of the partition
        still queued with the same id (their sequences follow the gap); a plain idempotent
        producer that still uses that id wants a new one."""
        tp = (failed.topic, failed.partition)
        doomed = [b for b in self.ready if b.seq > failed.seq and b.partition == tp[1]
                  and b.topic == tp[0] and b.producer_id == failed.producer_id
                  and b.producer_epoch == failed.producer_epoch]
        for b in doomed:
            self.ready.remove(b)
            if b.not_before:
                self.retrying -= 1
            self.incomplete.discard(b)
            if self.muted.get(tp) is b:
                del self.muted[tp]
            finished.append((b, -1, -1, error))
        ids = self.ids
        if self.txn is None and ids is not None and ids.producer_id == failed.producer_id \
                and ids.epoch == failed.producer_epoch:
            log.warning("producer id %d: a batch for %s-%d failed for good (%s: %s); taking a "
                        "new producer id", ids.producer_id, tp[0], tp[1],
                        type(error).__name__, error)
            ids.clear()
            self.awaiting_producer_id = True
            self.producer_id_retry_at = 0.0
            self.wake = True

    # --- producer ids -----------------------------------------------------------------------------
    def want_producer_id(self) -> None:
        """InitProducerId failed at start with a retriable error: batches wait for an id."""
        self.awaiting_producer_id = True

    def producer_id_due(self, now: float) -> bool:
        """Whether the driver should ask for a new producer id now."""
        return self.awaiting_producer_id and now >= self.producer_id_retry_at

    def producer_id_received(self, producer_id: int, epoch: int) -> None:
        """The new producer id: seal the batches that waited for it, in order."""
        ids = self.ids
        assert ids is not None
        ids.set(producer_id, epoch)
        self.awaiting_producer_id = False
        self.producer_id_backoff = self.backoff_s
        for batch in self.ready:
            if batch.producer_id < 0:
                self._seal(batch, ids)
                batch.data = None                 # never sent: build() rewrites it in place
                batch.data = batch.builder.build()

    def producer_id_failed(self, err: BrokerError, now: float, finished: list) -> None:
        """InitProducerId failed: ask again after a backoff; each batch waiting for the id
        counts one attempt (so it fails as a send would: at once for a non-retriable error,
        else after ``retries``)."""
        self.producer_id_retry_at = now + self.producer_id_backoff
        self.producer_id_backoff = min(self.producer_id_backoff * 2, MAX_BACKOFF_S)
        for batch in [b for b in self.ready if b.producer_id < 0]:
            batch.attempts += 1
            batch.last_error = err
            if not err.retriable or batch.attempts > self.retries:
                self.ready.remove(batch)
                if batch.not_before:
                    self.retrying -= 1
                self._done(batch, -1, -1, err, finished)

    def __repr__(self) -> str:
        return (f"<Sender {len(self.ready)} queued, {len(self.in_flight)} in flight, "
                f"{len(self.incomplete)} incomplete>")
