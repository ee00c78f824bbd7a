"""The sending half of ``mq.Producer``: request pipelining, the I/O thread, retries, reconnects.

Mixed into ``Producer`` (``producer.py``, which fills and closes batches). The I/O thread's loop
(``_run``, ``_loop``, ``_reconnect``, ``_read``) takes the producer's lock itself; the other
methods run under it and collect final outcomes in a ``finished`` list, resolved
(``finish_batch``) once the lock is released.

One daemon I/O thread per producer (Kafka's "sender", much reduced) blocks in ``poll`` on the
socket and a wake-up pipe, with the GIL released; it never busy-polls. It reads responses and
completes futures (so callbacks run on it), closes batches whose ``linger_ms`` ran out — records
must leave within about ``linger_ms`` even if ``send()`` is never called again, which no
thread-free design can promise — and it retries, reconnects and enforces timeouts. On 2 vCPUs a
helper thread that needs the GIL while the caller is busy waits up to the 5 ms switch interval
(``sys.getswitchinterval()``), so the design keeps the thread off the hot path: the caller
sends its own batches, and when ``max_in_flight`` requests are outstanding and
``max_in_flight`` more batches are queued, ``send()`` waits on a condition — which hands the
GIL to the I/O thread at once.
With ``linger_ms=0`` a record is due at once, so ``send()`` does not wake the thread for it,
and when ``max_in_flight`` requests are out it reads the replies waiting on the socket itself
(at most every 50 µs) and sends the batch they made room for: a caller that keeps the CPU
busy between sends would otherwise hold every record back for the switch interval
(``_due_reply``). Callbacks still run on the I/O thread.

A batch of ``ARENA_MIN_BYTES`` or more goes out as ``ProduceShared``: copied into a slot of the
connection's shared-memory arena (``arena.py``), with only its place on the socket, when the
producer waits for acks and the broker took the arena at connect (``_connect``). Its reply
(``_dispatch``) frees the slot; a lost connection takes its arena with it, and the re-sent
batches go into the next connection's.

Ordering, retries and reconnects
--------------------------------
Batches of one partition are sent in the order they were closed, on one connection, and the
broker appends a connection's requests in order. A retriable error (``BrokerError.retriable``)
re-queues the batch ahead of every later batch of its partition and mutes the partition: only
the retry goes out (after ``retry_backoff_ms``, doubling up to 1 s), and nothing after it until
it is acknowledged. Batches that were already in flight behind the failed one keep their
outcome; a broker that cannot take one request (shutting down, storage error) fails the later
ones too, so that does not reorder in practice, and ``max_in_flight=1`` rules it out (Kafka's
advice for producers without idempotence). Non-retriable errors (unknown topic or partition,
message too large, invalid request) fail the batch's futures with the broker's exception.

If the connection is lost (broker killed or restarted, e.g. by systemd), the I/O thread
reconnects with backoff and re-sends every batch that was in flight, in order (one at a time
per partition until the first is acknowledged), counting one attempt each; a batch that
exhausts ``retries`` fails with ``BrokerUnavailableError``, and any batch still undelivered
``delivery_timeout_ms`` after it was created fails with the last error. The broker may have
appended an in-flight batch whose reply was lost. Without idempotence delivery is therefore
**at least once**: a re-sent batch can appear twice in the log (``future.attempts > 1`` tells
which records were re-sent). With idempotence (the default) the partition recognises the
re-sent batch by its producer id and sequence and answers with the offsets it got the first
time: every acknowledged record is in the log **exactly once**, in order.
A batch acknowledged with ``acks="all"`` was fsync'd before the reply and is never lost; with
``acks=1`` it was in the page cache (survives a broker crash, not a power loss); with
``acks=0`` nothing is acknowledged and futures resolve, with offset -1, as soon as the request
is written to the socket.

Idempotence: sequence answers and gaps
--------------------------------------
- ``DuplicateSequenceError`` (a batch the partition had) counts as success (offset -1 when
  the broker did not say where), as in Kafka's producer.
- ``OutOfOrderSequenceError`` while an earlier batch of the same partition (same producer id
  and epoch) is still unacknowledged only means that batch is being retried: the later one is
  queued behind it again. Otherwise it is final: the partition lost track of this producer.
- A batch that fails for good (that error, a non-retriable one, retries or
  ``delivery_timeout_ms`` exhausted) leaves a gap in its partition's sequences, so no later
  batch sealed with the same id could be appended there: the later batches of that partition
  still queued fail with the same error (those in flight come back with
  ``OutOfOrderSequenceError``). A plain idempotent producer then takes a new producer id
  (InitProducerId, on the I/O thread, the lock released meanwhile); batches sealed while it is
  fetched wait unstamped and are stamped, in order, when it arrives. A transactional producer
  keeps its id: the transaction becomes abortable, and the abort takes a new epoch
  (``transactions.py``); ``InvalidProducerEpochError`` makes it fatal (fenced).
- A retriable error to InitProducerId (the broker cannot write its producer id block: disk
  full) does not fail the constructor: the I/O thread asks again (backoff from
  ``retry_backoff_ms``, doubling to 1 s, back to the start when a batch starts waiting), and
  each failure counts as one attempt of every batch waiting for the id, so those fail as
  their sends would (``future.attempts`` counts them).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Any

from mq.client.arena import Arena, arena_supported
from mq.client.connection import Connection
from mq.client.producer_batches import Batch, finish_batch
from mq.errors import (
    BrokerError,
    BrokerUnavailableError,
    ClosedError,
    DuplicateSequenceError,
    InvalidRequestError,
    MQError,
    OutOfOrderSequenceError,
    RecordListTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for_code,
)
from mq.protocol.messages import Api

__all__ = ["Sender"]

log = logging.getLogger("mq.producer")

_INF = float("inf")
_MAX_BACKOFF_S = 1.0                       # Kafka's retry.backoff.max.ms
_CALLER_READ_S = 50e-6                     # send() looks for replies at most this often
# Batches from this size up go through the arena; smaller ones are cheaper to copy through
# the socket than the broker's check of the written bytes (a map of them) costs.
ARENA_MIN_BYTES = 32 * 1024


class Sender:
    """Sending methods of ``Producer`` (see the module doc)."""

    # --- sending ------------------------------------------------------------------------------
    def _pump(self, finished: list) -> None:
        """Send queued batches, in order, while there is room in flight."""
        ready = self._ready
        conn = self._conn
        if not ready or conn is None:
            return
        acks, limit, in_flight = self._acks, self._max_in_flight, self._in_flight
        now = time.monotonic()
        blocked: set | None = None
        i = 0
        muted = self._muted
        unstamped = self._pid_pending
        arena = conn.arena                        # None with acks=0: no reply frees a slot
        while i < len(ready) and (acks == 0 or len(in_flight) < limit):
            batch = ready[i]
            if muted or self._retrying or unstamped:
                # A partition in retry sends only its retried batch, and nothing after it
                # until that one is acknowledged; so do batches still in backoff, and those
                # waiting for a producer id.
                tp = (batch.topic, batch.partition)
                if blocked is not None and tp in blocked:
                    i += 1
                    continue
                holder = muted.get(tp)
                if (holder is not None and holder is not batch) or batch.not_before > now \
                        or (unstamped and batch.producer_id < 0):
                    if blocked is None:
                        blocked = set()
                    blocked.add(tp)
                    i += 1
                    continue
                if batch.not_before:
                    batch.not_before = 0.0
                    self._retrying -= 1
            del ready[i]
            if len(batch.data) > self._request_cap:
                # Built before this broker's lower limit was known (it restarted with a new
                # config): sending it would only make the broker drop the connection, again
                # at every retry.
                self._done(batch, -1, -1, RecordListTooLargeError(
                    f"batch of {len(batch.data)} bytes for {batch.topic}-{batch.partition} is "
                    f"larger than the broker accepts in a request (max_request_bytes "
                    f"{self._broker_max_request} B, of which a batch may take "
                    f"{self._request_cap} B)"), finished)
                continue
            data = batch.data
            taken = arena.put(data) if arena is not None and len(data) >= ARENA_MIN_BYTES \
                else None
            try:
                if taken is None:
                    rid = conn.send(Api.PRODUCE, batch.topic, batch.partition, acks, data)
                else:
                    batch.slot = taken[0]
                    rid = conn.send(Api.PRODUCE_SHARED, batch.topic, batch.partition, acks,
                                    taken[1], len(data))
            except MQError as err:
                batch.slot = -1                   # the arena goes with the connection
                ready.insert(i, batch)
                self._disconnected(conn, err, finished)
                return
            batch.attempts += 1
            if acks == 0:
                self._done(batch, -1, -1, None, finished)
            else:
                batch.sent_at = now
                in_flight[rid] = batch
                if now + self._request_timeout_s < self._helper_wake_at:
                    self._helper_wake_at = now + self._request_timeout_s
                    self._wake()                  # so the I/O thread watches the timeout

    def _due_reply(self) -> Connection | None:
        """In ``send()``, under the lock, when a batch was not sent for lack of room in
        flight: with ``linger_ms=0`` (and acks) it is due, but ``max_in_flight`` requests are
        out. Their replies may already wait on the socket for
        an I/O thread that itself waits for the GIL while this thread is busy, up to the 5 ms
        switch interval, and the batch with it. Returns the connection to read them from if a
        look is due: the oldest request is at least 50 µs old (a broker's answer takes about
        that), and the last look was 50 µs ago or more."""
        conn = self._conn
        if self._linger_s or not self._acks or conn is None or not self._in_flight or \
                threading.get_ident() == self._helper_ident:
            return None
        now = time.monotonic()
        if now < self._caller_read_at or \
                now - next(iter(self._in_flight.values())).sent_at < _CALLER_READ_S:
            return None
        self._caller_read_at = now + _CALLER_READ_S
        return conn

    def _take_replies(self, conn: Connection, replies: list, caller: bool = True) -> None:
        """What the replies taken off ``conn`` settle, as the I/O thread's ``_read`` does, and
        by ``send()`` (``caller``, through ``_read``): there, outcomes with callbacks go to
        the I/O thread, where callbacks always run, and the thread is woken if it now has to
        look in sooner than it planned (a retry's backoff): it may have gone to sleep after
        these replies left the socket."""
        finished: list = []
        with self._lock:
            if conn is self._conn:                # else what was in flight on it is re-sent
                self._dispatch(replies, finished)
                now = time.monotonic()
                self._service(now, finished)
                self._cond.notify_all()
                if caller:
                    wake_at = self._next_wake(now)
                    if wake_at < self._helper_wake_at:
                        self._helper_wake_at = wake_at
                        self._wake()
                    if not self._stopping and any(args[0].callbacks for args in finished):
                        self._finish_later.extend(finished)
                        finished = []
                        self._wake()
        for args in finished:
            finish_batch(*args)

    def _requeue(self, batch: Batch, err: BaseException, backoff: float,
                 finished: list) -> None:
        """Retry ``batch`` (ahead of its partition's later batches) or fail it."""
        batch.last_error = err
        now = time.monotonic()
        if batch.attempts > self._retries or now - batch.created > self._delivery_timeout_s:
            self._done(batch, -1, -1, err, finished)
            return
        tp = (batch.topic, batch.partition)
        holder = self._muted.get(tp)
        if holder is None or batch.seq < holder.seq:
            self._muted[tp] = batch
        if backoff:
            batch.not_before = now + backoff
            self._retrying += 1
        ready = self._ready
        i = len(ready)
        while i > 0 and ready[i - 1].seq > batch.seq:
            i -= 1
        ready.insert(i, batch)

    def _disconnected(self, conn: Connection, err: BaseException, finished: list) -> None:
        """The connection broke: close it and re-queue what was in flight (in order)."""
        if conn is not self._conn:
            return
        log.warning("producer lost the broker connection: %s", err)
        if not isinstance(err, BrokerUnavailableError):
            err = BrokerUnavailableError(f"broker connection lost: {err}")
        self._last_error = err
        self._conn = None
        self._fd = -1
        conn.close()
        for batch in self._in_flight.values():
            batch.slot = -1                       # the arena closed with the connection
            self._requeue(batch, err, 0.0, finished)
        self._in_flight.clear()
        for rid in self._requests:
            self._requests[rid] = err
        self._reconnect_at = time.monotonic() + self._reconnect_backoff
        self._cond.notify_all()
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\x01")
        except (BlockingIOError, OSError):
            pass                                  # full (already awake) or closed

    # --- requests on the shared connection ---------------------------------------------------
    def _request(self, deadline: float, api: Api, *fields: Any):
        """One request on the producer's connection, under the lock. The I/O thread reads
        every reply, so other threads wait for it to hand theirs over; the I/O thread itself
        (a callback calling send()) reads inline."""
        while self._conn is None:
            remaining = deadline - time.monotonic()
            if self._closed:
                raise ClosedError("producer is closed")
            if remaining <= 0:
                raise BrokerUnavailableError(f"no connection to the broker at {self._socket} "
                                             f"({self._last_error})")
            self._cond.wait(remaining)            # notified on reconnect and close
        conn = self._conn
        if threading.get_ident() == self._helper_ident:
            try:
                return conn.call(api, *fields, timeout=max(0.0, deadline - time.monotonic()))
            finally:
                self._check_stash = True          # it may have kept others' replies
        try:
            rid = conn.send(api, *fields)
        except MQError as err:                    # the I/O thread sees the EOF and reconnects
            raise BrokerUnavailableError(f"cannot send {api.name}: {err}") from err
        self._requests[rid] = None
        try:
            while self._requests[rid] is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no reply to {api.name} within "
                                       f"{self._request_timeout_s} s")
                self._cond.wait(remaining)
            reply = self._requests[rid]
        finally:
            self._requests.pop(rid, None)
        if isinstance(reply, BaseException):
            raise BrokerUnavailableError(f"{api.name} failed: {reply}") from reply
        if reply.error_code:
            raise error_for_code(reply.error_code, reply.error_message or "")
        return reply

    # --- the I/O thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception:                         # a bug: fail loudly, never hang callers
            log.exception("producer I/O thread crashed")
            self._shutdown()

    def _loop(self) -> None:
        poller, polled_fd = None, -2
        while True:
            with self._lock:
                finished, self._finish_later = self._finish_later, []
                if self._stopping:
                    return
                now = time.monotonic()
                conn = self._conn
                if conn is None and now >= self._reconnect_at:
                    self._lock.release()
                    try:
                        conn = self._reconnect()
                    finally:
                        self._lock.acquire()
                    if self._stopping:
                        if conn is not None:
                            conn.close()
                        return
                    if conn is not None:
                        self._attach(conn)
                        self._cond.notify_all()
                    now = time.monotonic()
                if self._pid_pending and self._conn is not None and now >= self._pid_retry_at:
                    self._renew_producer_id(finished)
                    if self._stopping:
                        return
                    now = time.monotonic()
                self._service(now, finished)
                wake_at = self._next_wake(now)
                self._helper_wake_at = wake_at
                fd, conn, wake_r = self._fd, self._conn, self._wake_r
            for args in finished:
                finish_batch(*args)
            if self._check_stash and conn is not None:   # set on this thread only
                # Replies a call on this thread took off the socket (InitProducerId above, a
                # callback's metadata request just now) wait in the connection's stash, where
                # poll never sees them, and this read also takes those that arrived since:
                # the answers to the batches the new id just let out, on a busy machine. What
                # they settle can move the wake-up earlier (a retry's backoff), so plan again:
                # polling until wake_at, planned before them, slept a 1 ms retry until the
                # request timeout (30 s; 1 run in 75 on 2 busy cores).
                self._check_stash = False
                self._read(conn)
                continue
            if fd != polled_fd:
                poller = select.poll()
                poller.register(wake_r, select.POLLIN)
                if fd >= 0:
                    poller.register(fd, select.POLLIN)
                polled_fd = fd
            timeout = -1 if wake_at == _INF else max(0, int((wake_at - time.monotonic()) * 1e3
                                                           + 0.999))
            try:
                events = poller.poll(timeout)     # releases the GIL; no busy polling
            except OSError:
                continue
            for ready_fd, _ in events:
                if ready_fd == wake_r:
                    try:
                        os.read(wake_r, 4096)
                    except (BlockingIOError, OSError):
                        pass
                elif ready_fd == fd and conn is not None:
                    # Readable, so nothing to wait for; send() may have taken the replies.
                    self._read(conn)

    def _connect(self) -> Connection:
        """A new connection to the broker, with a batch arena (``arena.py``) when this
        producer waits for acks and the broker takes one; without, if either side cannot
        (the reason is logged), since the socket carries every batch just as well."""
        conn = Connection(self._socket, self._client_id, self._request_timeout_s)
        if not (self._acks and self._shared_batches and arena_supported()
                and conn.broker_info.get("shared_batches")):
            return conn
        try:
            arena = Arena(self._wanted_max_request_size, self._max_in_flight)
        except OSError as err:
            log.info("producer sends batches through the socket: no arena (%s)", err)
            return conn
        try:
            conn.share_arena(arena)
        except BrokerUnavailableError:
            arena.close()
            conn.close()
            raise
        except MQError as err:
            arena.close()
            log.info("producer sends batches through the socket: the broker refused its "
                     "arena (%s)", err)
        return conn

    def _reconnect(self) -> Connection | None:
        try:
            conn = self._connect()
        except (MQError, OSError) as err:
            with self._lock:
                self._last_error = err if isinstance(err, BrokerUnavailableError) else \
                    BrokerUnavailableError(f"cannot reconnect: {err}")
                self._reconnect_at = time.monotonic() + self._reconnect_backoff
                self._reconnect_backoff = min(self._reconnect_backoff * 2, _MAX_BACKOFF_S)
            return None
        log.info("producer reconnected to %s", self._socket)
        return conn

    def _read(self, conn: Connection, caller: bool = False) -> None:
        """Take the replies waiting on ``conn``, never waiting for one: the I/O thread reads
        once ``poll`` says the socket is readable, ``send()`` (``caller``) when ``_due_reply``
        says a look is due. A broken connection is left to the I/O thread, and ``send()``
        looks no further when nothing came."""
        try:
            replies = conn.poll_any(0.0)
        except (MQError, OSError) as err:
            if caller:
                return
            finished: list = []
            with self._lock:
                self._disconnected(conn, err, finished)
            for args in finished:
                finish_batch(*args)
            return
        if replies or not caller:
            self._take_replies(conn, replies, caller)

    def _dispatch(self, replies: list, finished: list) -> None:
        in_flight = self._in_flight
        for reply in replies:
            batch = in_flight.pop(reply.request_id, None)
            if batch is None:
                if reply.request_id in self._requests:
                    self._requests[reply.request_id] = reply
                elif reply.error_code:            # acks=0 requests are answered on error only
                    log.warning("produce request failed (acks=0): %s",
                                error_for_code(reply.error_code, reply.error_message or ""))
                continue
            if batch.slot >= 0:
                self._conn.arena.release(batch.slot)
                batch.slot = -1
            if not reply.error_code:
                self._done(batch, reply["first_offset"], reply["log_append_time"], None, finished)
                continue
            err = error_for_code(reply.error_code, reply.error_message or "")
            if err.retriable:
                backoff = min(self._backoff_s * 2 ** max(batch.attempts - 1, 0), _MAX_BACKOFF_S)
                self._requeue(batch, err, backoff, finished)
            elif isinstance(err, OutOfOrderSequenceError) and self._earlier_pending(batch):
                self._requeue(batch, err, 0.0, finished)   # behind the batch being retried
            elif isinstance(err, DuplicateSequenceError):
                self._done(batch, -1, -1, None, finished)
            else:
                if isinstance(err, UnknownTopicOrPartitionError):
                    self._topics.pop(batch.topic, None)
                self._done(batch, -1, -1, err, finished)

    def _done(self, batch: Batch, base_offset: int, log_append_time: int,
              error: BaseException | None, finished: list) -> None:
        """The batch's outcome is final: unmute its partition; resolve after the lock."""
        self._incomplete.discard(batch)
        tp = (batch.topic, batch.partition)
        if self._muted.get(tp) is batch:
            del self._muted[tp]
        if error is None or batch.producer_id < 0 or self._stopping:
            finished.append((batch, base_offset, log_append_time, error))
            return
        if self._txn is not None:                 # abortable, or fenced: fatal
            error = self._txn.manager.batch_failed(error)
        finished.append((batch, -1, -1, error))
        self._sequence_gap(batch, error, finished)

    def _service(self, now: float, finished: list) -> None:
        """Timeouts, then send: queued batches first, then lingered ones while there is room."""
        if self._in_flight:
            oldest = next(iter(self._in_flight.values()))
            if now - oldest.sent_at > self._request_timeout_s and self._conn is not None:
                self._disconnected(self._conn, RequestTimedOutError(
                    f"no reply to a produce request for {oldest.topic}-{oldest.partition} "
                    f"within {self._request_timeout_s} s"), finished)
        if self._ready and (self._conn is None or self._retrying or self._muted
                            or self._pid_pending):
            for batch in [b for b in self._ready if now - b.created > self._delivery_timeout_s]:
                if batch not in self._incomplete:
                    continue                      # failed meanwhile (_sequence_gap)
                self._ready.remove(batch)
                if batch.not_before:
                    self._retrying -= 1
                self._done(batch, -1, -1, batch.last_error or self._last_error or
                           RequestTimedOutError(f"not delivered within "
                                                f"{self._delivery_timeout_s} s"), finished)
        self._pump(finished)
        room = self._max_in_flight - len(self._in_flight) - len(self._ready)
        if self._open and (room > 0 or self._acks == 0):
            expired = list(self._full)[:max(room, 0)]   # full ones first, then lingered ones
            for batch in self._open:
                if batch.deadline > now or (len(expired) >= room and self._acks != 0):
                    break
                if batch not in self._full:
                    expired.append(batch)
            for batch in expired:
                self._close_batch(batch)
            self._pump(finished)
        self._cond.notify_all()                   # room for senders blocked in send()

    def _next_wake(self, now: float) -> float:
        wake = _INF
        if self._open:
            room = self._max_in_flight - len(self._in_flight) - len(self._ready)
            if room > 0 or self._acks == 0:
                wake = now if self._full else next(iter(self._open)).deadline
        if self._in_flight:
            wake = min(wake, next(iter(self._in_flight.values())).sent_at
                       + self._request_timeout_s)
        elif wake == _INF and self._conn is not None:
            # Look in anyway when a request sent from now on could time out: _pump then need
            # not wake this thread for each request sent into an empty pipeline.
            wake = now + self._request_timeout_s
        if self._conn is None:
            wake = min(wake, self._reconnect_at)
        elif self._pid_pending:
            wake = min(wake, self._pid_retry_at)
        if self._retrying or (self._ready and (self._conn is None or self._pid_pending)):
            for batch in self._ready:
                if batch.not_before > now:        # a past one waits for room, not time
                    wake = min(wake, batch.not_before)
                wake = min(wake, batch.created + self._delivery_timeout_s)
        return wake

    # --- idempotence (see the module doc) ------------------------------------------------------
    def _init_producer_id(self, conn: Connection) -> None:
        """InitProducerId for an idempotent producer, on a connection no other thread reads
        yet. A broker without it: no idempotence, unless it was asked for explicitly."""
        try:
            reply = conn.call(Api.INIT_PRODUCER_ID, None, self._transaction_timeout_ms)
        except (InvalidRequestError, UnsupportedVersionError) as err:
            if self._explicit_idempotence:
                raise
            log.warning("the broker at %s does not give producer ids (%s): this producer is "
                        "not idempotent", self._socket, err)
            self._ids = None
            return
        except BrokerError as err:
            if not err.retriable:
                raise
            log.warning("InitProducerId failed (%s); the I/O thread asks again", err)
            self._pid_pending = True              # batches wait for it (_renew_producer_id)
            return
        assert self._ids is not None
        self._ids.set(reply["producer_id"], reply["producer_epoch"])

    def _earlier_pending(self, batch: Batch) -> bool:
        """Whether a batch sealed before ``batch`` for its partition, with the same producer id
        and epoch, is still unacknowledged. Only looked at on an error."""
        for b in self._incomplete:
            if b.seq < batch.seq and b.partition == batch.partition and \
                    b.topic == batch.topic and b.producer_id == batch.producer_id and \
                    b.producer_epoch == batch.producer_epoch:
                return True
        return False

    def _sequence_gap(self, failed: Batch, error: BaseException, finished: list) -> None:
        """``failed`` will never be in its partition: fail the later batches of the partition
        still queued with the same id (their sequences follow the gap); a plain idempotent
        producer that still uses that id takes a new one."""
        tp = (failed.topic, failed.partition)
        doomed = [b for b in self._ready if b.seq > failed.seq and b.partition == tp[1]
                  and b.topic == tp[0] and b.producer_id == failed.producer_id
                  and b.producer_epoch == failed.producer_epoch]
        for b in doomed:
            self._ready.remove(b)
            if b.not_before:
                self._retrying -= 1
            self._incomplete.discard(b)
            if self._muted.get(tp) is b:
                del self._muted[tp]
            finished.append((b, -1, -1, error))
        ids = self._ids
        if self._txn is None and ids is not None and ids.producer_id == failed.producer_id \
                and ids.epoch == failed.producer_epoch:
            log.warning("producer id %d: a batch for %s-%d failed for good (%s: %s); taking a "
                        "new producer id", ids.producer_id, tp[0], tp[1],
                        type(error).__name__, error)
            ids.clear()
            self._pid_pending = True
            self._pid_retry_at = 0.0
            self._wake()

    def _renew_producer_id(self, finished: list) -> None:
        """On the I/O thread, under the lock (released during the call): InitProducerId for a
        new producer id, then stamp the batches that waited for it, in order."""
        conn = self._conn
        assert conn is not None and self._ids is not None
        self._lock.release()
        try:
            reply = conn.call(Api.INIT_PRODUCER_ID, None, self._transaction_timeout_ms,
                              timeout=self._request_timeout_s)
            failure: BaseException | None = None
        except (MQError, TimeoutError, OSError) as err:
            reply, failure = None, err
        finally:
            self._lock.acquire()
            self._check_stash = True              # replies that came meanwhile wait there
        if self._stopping or not self._pid_pending:
            return
        if failure is not None:
            if isinstance(failure, BrokerError):
                log.warning("producer: InitProducerId failed (%s); retrying", failure)
                self._pid_retry_at = time.monotonic() + self._pid_backoff
                self._pid_backoff = min(self._pid_backoff * 2, _MAX_BACKOFF_S)
                self._pid_failed(failure, finished)
            else:
                self._disconnected(conn, failure, finished)
            return
        ids = self._ids
        ids.set(reply["producer_id"], reply["producer_epoch"])
        self._pid_pending = False
        self._pid_backoff = self._backoff_s
        for batch in self._ready:
            if batch.producer_id < 0:
                builder = batch.builder
                batch.producer_id = builder.producer_id = ids.producer_id
                batch.producer_epoch = builder.producer_epoch = ids.epoch
                builder.base_sequence = ids.assign(batch.topic, batch.partition, len(builder))
                batch.data = None                 # never sent: build() rewrites it in place
                batch.data = builder.build()
        self._cond.notify_all()

    def _pid_failed(self, err: BrokerError, finished: list) -> None:
        """InitProducerId failed: each batch waiting for the id counts one attempt (so it
        fails as a send would: at once for a non-retriable error, else after ``retries``)."""
        for batch in [b for b in self._ready if b.producer_id < 0]:
            batch.attempts += 1
            batch.last_error = err
            if not err.retriable or batch.attempts > self._retries:
                self._ready.remove(batch)
                if batch.not_before:
                    self._retrying -= 1
                self._done(batch, -1, -1, err, finished)
