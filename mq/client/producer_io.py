"""The producer's driver: the connection, the I/O thread, the wake-up pipe and the batch arena
around the two pure parts (``batch_accumulator.py``, ``sender.py``).

Everything here runs under the producer's lock (``lock``, ``cond``), but the I/O thread's loop
(``_run``), which takes it itself. Outcomes are collected in a ``finished`` list and resolved
(``finish_batch``) once the lock is released.

The I/O thread
--------------
One daemon I/O thread per producer blocks in ``poll`` on the socket and the wake-up pipe, with
the GIL released; it never busy-polls. (Kafka runs its ``Sender`` as that thread; here the
decisions are the sans-I/O sender's, ``sender.py``, and the thread does the I/O.) It reads
replies and completes futures (so callbacks run on it), closes batches whose ``linger_ms`` ran
out — records must leave within about ``linger_ms`` even if ``send()`` is never called again,
which no thread-free design can promise — and it retries, reconnects and enforces timeouts,
as the sender decides. On 2 vCPUs a thread that needs the GIL while the caller is busy waits
up to the 5 ms switch interval (``sys.getswitchinterval()``), so the design keeps the I/O
thread off the hot path: the caller writes its own batches (``pump``), and when
``max_in_flight`` requests are outstanding and ``max_in_flight`` more batches are queued,
``send()`` waits on the condition (``wait_for_room``) — which hands the GIL to the I/O thread
at once. With ``linger_ms=0`` a record is due at once, so ``send()`` does not wake the thread
for it, and when ``max_in_flight`` requests are out it reads the replies waiting on the socket
itself (at most every 50 µs, ``due_reply``) and sends the batch they made room for: a caller
that keeps the CPU busy between sends would otherwise hold every record back for the switch
interval. Callbacks still run on the I/O thread. ``wake_at`` is when the thread plans to look
in next; whoever makes it due sooner writes to the pipe (``wake``).

The connection and the arena
----------------------------
If the connection is lost (broker killed or restarted, e.g. by systemd), the I/O thread
reconnects with backoff (from ``retry_backoff_ms``, doubling to 1 s); the sender re-queues what
was in flight. A batch of ``ARENA_MIN_BYTES`` or more goes out as ``ProduceShared``: copied
into a slot of the connection's shared-memory arena (``arena.py``), with only its place on the
socket, when the producer waits for acks and the broker took the arena at connect
(``_connect``). Its reply frees the slot (``slots``: request id -> slot); a lost connection
takes its arena with it, and the re-sent batches go into the next connection's.

Producer ids: InitProducerId runs at ``start`` (eagerly, so that a broker without it fails the
constructor), and on the I/O thread, the lock released meanwhile, when the sender wants a new
id (``Sender.producer_id_due``). A retriable error at start does not fail the constructor:
batches wait for the id and the I/O thread asks again.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from typing import Any

from mq.client.arena import Arena, arena_supported
from mq.client.batch_accumulator import BatchAccumulator
from mq.client.connection import Connection
from mq.client.idempotence import ProducerIdentity
from mq.client.producer_batches import (
    Batch,
    FutureRecordMetadata,
    TopicState,
    finish_batch,
)
from mq.client.producer_metadata import ProducerMetadata, unknown_topic
from mq.client.sender import MAX_BACKOFF_S, Sender
from mq.client.transaction_manager import TransactionManager
from mq.client.transactions import Transactions
from mq.errors import (
    BrokerError,
    BrokerUnavailableError,
    ClosedError,
    InvalidRequestError,
    MQError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for_code,
)
from mq.log import native
from mq.protocol.messages import Api

__all__ = ["ARENA_MIN_BYTES", "ProducerIO"]

log = logging.getLogger("mq.producer")

_INF = math.inf
_CALLER_READ_S = 50e-6                     # send() looks for replies at most this often
# Batches from this size up go through the arena; smaller ones are cheaper to copy through
# the socket than the broker's check of the written bytes (a map of them) costs.
ARENA_MIN_BYTES = 32 * 1024
_PRODUCE = int(Api.PRODUCE)


class ProducerIO:
    """The I/O of one producer (see the module doc): ``accumulator``, ``sender`` and
    ``metadata`` are the producer's parts, driven here."""

    def __init__(self, socket: str, client_id: str, request_timeout_s: float,
                 backoff_s: float, shared_batches: bool, arena_slot_bytes: int,
                 transaction_timeout_ms: int, explicit_idempotence: bool,
                 accumulator: BatchAccumulator, sender: Sender,
                 metadata: ProducerMetadata) -> None:
        self.socket = socket
        self.client_id = client_id
        self.request_timeout_s = request_timeout_s
        self.backoff_s = backoff_s
        self.shared_batches = shared_batches
        self.arena_slot_bytes = arena_slot_bytes
        self.transaction_timeout_ms = transaction_timeout_ms
        self.explicit_idempotence = explicit_idempotence
        self.accumulator = accumulator
        self.sender = sender
        self.metadata = metadata
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.conn: Connection | None = None
        self.fd = -1
        self.slots: dict[int, int] = {}            # request id -> its arena slot
        self.io_thread: threading.Thread | None = None
        self.io_ident = -1
        self.wake_at = _INF                         # when the I/O thread looks in next
        self.wake_r = self.wake_w = -1
        self.reconnect_at = 0.0
        self.reconnect_backoff = backoff_s
        self.requests: dict[int, Any] = {}          # other requests' id -> reply
        self.check_stash = False
        self.caller_read_at = 0.0                   # due_reply: no look before
        self.finish_later: list = []                # outcomes with callbacks, for the I/O thread
        self.closed = False
        self.stopping = False

    # --- start and stop -----------------------------------------------------------------------
    def start(self, init_producer_id: bool) -> None:
        """Connect (InitProducerId first if ``init_producer_id``) and start the I/O thread."""
        conn = self._connect()
        if init_producer_id:
            try:
                self._init_producer_id(conn)
            except BaseException:
                conn.close()
                raise
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self._attach(conn)
        self.io_thread = threading.Thread(target=self._run, daemon=True,
                                          name=f"mq-producer-{self.client_id}")
        self.io_thread.start()
        self.io_ident = self.io_thread.ident

    def stop(self) -> None:
        """Fail what is left with ``ClosedError``, stop the I/O thread, close the connection.
        Idempotent."""
        finished: list = []
        with self.lock:
            self.closed = True
            self.stopping = True
            err = ClosedError("the producer was closed before this record was delivered")
            finished.extend(self.finish_later)    # delivered: their real outcome
            self.finish_later = []
            for batch in self.accumulator.drop_all(self.metadata.all_topics.values()):
                finished.append((batch, -1, -1, err))
            self.sender.fail_all(err, finished)
            self.cond.notify_all()
        for args in finished:
            finish_batch(*args)
        self.wake()
        thread = self.io_thread
        if thread is not None and thread.ident != threading.get_ident():
            thread.join(timeout=10)
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None
            self.metadata.close()
            for fd in (self.wake_r, self.wake_w):
                if fd >= 0:
                    os.close(fd)
            self.wake_r = self.wake_w = -1

    def forget_after_fork(self) -> None:
        """In a forked child: close the parent's pipe (its socket, map and thread are left
        alone: a parent thread may have been copied mid-use)."""
        for fd in (self.wake_r, self.wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _connect(self) -> Connection:
        """A new connection to the broker, with a batch arena (``arena.py``) when this
        producer waits for acks and the broker takes one; without, if either side cannot
        (the reason is logged), since the socket carries every batch just as well."""
        conn = Connection(self.socket, self.client_id, self.request_timeout_s)
        if not (self.sender.acks and self.shared_batches and arena_supported()
                and conn.broker_info.get("shared_batches")):
            return conn
        try:
            arena = Arena(self.arena_slot_bytes, self.sender.max_in_flight)
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

    def _attach(self, conn: Connection) -> None:
        self.conn = conn
        self.fd = conn.fileno()
        self.reconnect_backoff = self.backoff_s
        self.metadata.attach(conn.broker_info)
        self.sender.request_cap = self.metadata.request_cap
        self.sender.broker_max_request = self.metadata.broker_max_request

    def _reconnect(self) -> Connection | None:
        try:
            conn = self._connect()
        except (MQError, OSError) as err:
            with self.lock:
                self.sender.last_error = err if isinstance(err, BrokerUnavailableError) else \
                    BrokerUnavailableError(f"cannot reconnect: {err}")
                self.reconnect_at = time.monotonic() + self.reconnect_backoff
                self.reconnect_backoff = min(self.reconnect_backoff * 2, MAX_BACKOFF_S)
            return None
        log.info("producer reconnected to %s", self.socket)
        return conn

    def _disconnected(self, conn: Connection, err: BaseException, finished: list) -> None:
        """The connection broke: close it; the sender re-queues what was in flight."""
        if conn is not self.conn:
            return
        log.warning("producer lost the broker connection: %s", err)
        if not isinstance(err, BrokerUnavailableError):
            err = BrokerUnavailableError(f"broker connection lost: {err}")
        self.conn = None
        self.fd = -1
        conn.close()
        self.slots.clear()                        # the arena closed with the connection
        now = time.monotonic()
        self.sender.connection_lost(err, now, finished)
        for rid in self.requests:
            self.requests[rid] = err
        self.reconnect_at = now + self.reconnect_backoff
        self.cond.notify_all()
        self.wake()

    def wake(self) -> None:
        """Make the I/O thread look in now."""
        try:
            os.write(self.wake_w, b"\x01")
        except (BlockingIOError, OSError):
            pass                                  # full (already awake) or closed

    # --- batches ------------------------------------------------------------------------------
    def queue(self, batch: Batch) -> None:
        """A batch the accumulator closed goes to the sender (sealed, built, queued)."""
        sender = self.sender
        if sender.enqueue(batch) and sender.hurry_producer_id(time.monotonic()):
            self.wake()

    def pump(self, finished: list) -> None:
        """Write the requests the sender has for now, in order."""
        sender = self.sender
        conn = self.conn
        if not sender.ready or conn is None:
            return
        now = time.monotonic()
        batches = sender.requests(now, finished)
        arena = conn.arena                        # None with acks=0: no reply frees a slot
        acks = sender.acks
        for i, batch in enumerate(batches):
            data = batch.data
            taken = arena.put(data) if arena is not None and len(data) >= ARENA_MIN_BYTES \
                else None
            try:
                if taken is None:
                    rid = conn.send(Api.PRODUCE, batch.topic, batch.partition, acks, data)
                else:
                    rid = conn.send(Api.PRODUCE_SHARED, batch.topic, batch.partition, acks,
                                    taken[1], len(data))
            except MQError as err:
                sender.unsent(batches[i:])
                self._disconnected(conn, err, finished)
                return
            if taken is not None:
                self.slots[rid] = taken[0]
            sender.sent(batch, rid, now, finished)
            if acks:
                self._watch_timeout(now)
        if sender.wake:
            sender.wake = False
            self.wake()

    def _watch_timeout(self, now: float) -> None:
        """A request went out at ``now``: wake the I/O thread if it would look in after its
        timeout."""
        if now + self.request_timeout_s < self.wake_at:
            self.wake_at = now + self.request_timeout_s
            self.wake()

    def send_whole(self, info: TopicState, partition: int, timestamp_ms: int | None, key,
                   value, headers) -> FutureRecordMetadata | None:
        """In ``send()``, under the lock, with ``linger_ms=0`` and no open batch for the
        partition: a batch of this one record would be opened, closed, sealed, built, queued
        and written at once, so write it now: built with its request around it and written
        by one C call (``produce_send``). Returns its future, or None where the general path must go
        (nothing queued ahead of it, a connection that takes frame tails, room in flight, a
        producer id if idempotent, no partition in retry): the record is then untouched. A
        write that fails leaves the batch queued, as the general path does, for ``pump`` to
        find the lost connection."""
        sender, conn = self.sender, self.conn
        build = native.produce_send
        if conn is None or build is None or not sender.acks or sender.ready or sender.muted \
                or sender.retrying or len(sender.in_flight) >= sender.max_in_flight \
                or not conn.takes_tails or self.io_thread is None:
            return None
        ids = sender.ids
        if ids is None:
            producer_id = epoch = sequence = -1
        elif ids.producer_id < 0:
            return None
        else:
            producer_id, epoch = ids.producer_id, ids.epoch
            sequence = ids.next_sequence(info.name, partition)
        rid = conn.next_id()
        if rid is None:
            return None
        # Built and written first, booked after: the broker works on it meanwhile. Its reply
        # is taken under the lock this send() holds, so it finds the batch in flight. Larger
        # than the request cap, or one for the arena: not written, the general path's.
        limit = sender.request_cap if conn.arena is None else \
            min(sender.request_cap, ARENA_MIN_BYTES - 1)
        got = conn.send_built(build, limit, _PRODUCE, rid, info.name, partition, sender.acks,
                              timestamp_ms, key, value, headers, producer_id, epoch, sequence, 0)
        if got is None:
            return None
        _, data, ts, written = got
        if ids is not None:
            ids.assign(info.name, partition, 1)
        acc = self.accumulator
        now = time.monotonic()
        batch = Batch.whole(info, partition, data, now, acc.cb_lock, acc.buffers,
                            producer_id, epoch)
        sender.admit(batch)
        if written:
            sender.sent(batch, rid, now, None)    # type: ignore[arg-type]  # acks: no outcome
            self._watch_timeout(now)
        else:
            sender.ready.append(batch)            # nothing was queued ahead of it
        acc.closed(info, partition)
        return FutureRecordMetadata(batch, 0, ts)

    def wait_for_room(self, max_block_s: float) -> None:
        """In ``send()``, under the lock: wait while ``max_in_flight`` batches are queued.
        Raises ``TimeoutError`` after ``max_block_s``."""
        sender = self.sender
        deadline = time.monotonic() + max_block_s
        while len(sender.ready) >= sender.max_in_flight and not self.closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"send() waited {max_block_s} s for room: "
                                   f"{len(sender.ready)} batches queued behind "
                                   f"{len(sender.in_flight)} in flight "
                                   f"({'connected' if self.conn else sender.last_error})")
            self.cond.wait(remaining)

    # --- replies ------------------------------------------------------------------------------
    def due_reply(self) -> Connection | None:
        """In ``send()``, under the lock, when a batch was not sent for lack of room in
        flight: with ``linger_ms=0`` (and acks) it is due, but ``max_in_flight`` requests are
        out. Their replies may already wait on the socket for an I/O thread that itself waits
        for the GIL while this thread is busy, up to the 5 ms switch interval, and the batch
        with it. Returns the connection to read them from if a look is due: the oldest
        request is at least 50 µs old (a broker's answer takes about that), and the last
        look was 50 µs ago or more."""
        conn = self.conn
        in_flight = self.sender.in_flight
        if self.accumulator.linger_s or not self.sender.acks or conn is None or \
                not in_flight or threading.get_ident() == self.io_ident:
            return None
        now = time.monotonic()
        if now < self.caller_read_at or \
                now - next(iter(in_flight.values())).sent_at < _CALLER_READ_S:
            return None
        self.caller_read_at = now + _CALLER_READ_S
        return conn

    def read_for_room(self) -> None:
        """In ``send()``, before its lock, with ``linger_ms=0`` and ``max_in_flight`` requests
        out: their replies are likely on the socket already, waiting for an I/O thread that
        waits for the GIL (a caller busy between its sends holds it for up to the 5 ms switch
        interval). Take them now, so this record goes out whole at once instead of queued
        behind them."""
        conn = self.conn
        if conn is not None and threading.get_ident() != self.io_ident:
            self.read(conn, caller=True)

    def read(self, conn: Connection, caller: bool = False) -> None:
        """Take the replies waiting on ``conn``, never waiting for one: the I/O thread reads
        once ``poll`` says the socket is readable, ``send()`` (``caller``) when ``due_reply``
        says a look is due. A broken connection is left to the I/O thread, and ``send()``
        looks no further when nothing came."""
        try:
            replies = conn.poll_any(0.0)
        except (MQError, OSError) as err:
            if caller:
                return
            finished: list = []
            with self.lock:
                self._disconnected(conn, err, finished)
            for args in finished:
                finish_batch(*args)
            return
        if replies or not caller:
            self.take_replies(conn, replies, caller)

    def take_replies(self, conn: Connection, replies: list, caller: bool = True) -> None:
        """What the replies taken off ``conn`` settle, on the I/O thread and by ``send()``
        (``caller``): there, outcomes with callbacks go to the I/O thread, where callbacks
        always run, and the thread is woken if it now has to look in sooner than it planned
        (a retry's backoff): it may have gone to sleep after these replies left the
        socket."""
        finished: list = []
        with self.lock:
            if conn is self.conn:                 # else what was in flight on it is re-sent
                now = time.monotonic()
                self._dispatch(replies, now, finished)
                self._service(now, finished)
                self.cond.notify_all()
                if caller:
                    wake_at = self._next_wake(now)
                    if wake_at < self.wake_at:
                        self.wake_at = wake_at
                        self.wake()
                    if not self.stopping and any(args[0].callbacks for args in finished):
                        self.finish_later.extend(finished)
                        finished = []
                        self.wake()
        for args in finished:
            finish_batch(*args)

    def _dispatch(self, replies: list, now: float, finished: list) -> None:
        """Replies to other requests go to their waiters (``request``), the rest to the
        sender; an answered batch's arena slot is free again."""
        produced = []
        for reply in replies:
            rid = reply.request_id
            slot = self.slots.pop(rid, None)
            if slot is not None:
                self.conn.arena.release(slot)
            if rid in self.requests:
                self.requests[rid] = reply
            else:
                produced.append(reply)
        sender = self.sender
        sender.received(produced, now, finished)
        if sender.stale_topics:
            for topic in sender.stale_topics:
                self.metadata.forget(topic)
            sender.stale_topics.clear()

    # --- other requests on the shared connection ------------------------------------------------
    def request(self, deadline: float, api: Api, *fields: Any):
        """One request on the producer's connection, under the lock. The I/O thread reads
        every reply, so other threads wait for it to hand theirs over; the I/O thread itself
        (a callback calling send()) reads inline. Raises the broker's error,
        ``BrokerUnavailableError``, ``ClosedError``, ``TimeoutError``."""
        while self.conn is None:
            remaining = deadline - time.monotonic()
            if self.closed:
                raise ClosedError("producer is closed")
            if remaining <= 0:
                raise BrokerUnavailableError(f"no connection to the broker at {self.socket} "
                                             f"({self.sender.last_error})")
            self.cond.wait(remaining)             # notified on reconnect and close
        conn = self.conn
        if threading.get_ident() == self.io_ident:
            try:
                return conn.call(api, *fields, timeout=max(0.0, deadline - time.monotonic()))
            finally:
                self.check_stash = True           # it may have kept others' replies
        try:
            rid = conn.send(api, *fields)
        except MQError as err:                    # the I/O thread sees the EOF and reconnects
            raise BrokerUnavailableError(f"cannot send {api.name}: {err}") from err
        self.requests[rid] = None
        try:
            while self.requests[rid] is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no reply to {api.name} within "
                                       f"{self.request_timeout_s} s")
                self.cond.wait(remaining)
            reply = self.requests[rid]
        finally:
            self.requests.pop(rid, None)
        if isinstance(reply, BaseException):
            raise BrokerUnavailableError(f"{api.name} failed: {reply}") from reply
        if reply.error_code:
            raise error_for_code(reply.error_code, reply.error_message or "")
        return reply

    def topic(self, topic: str, max_block_s: float) -> TopicState:
        """Learn ``topic`` (``ProducerMetadata.requests``), waiting up to ``max_block_s``.
        Raises ``UnknownTopicOrPartitionError``, ``BrokerUnavailableError``,
        ``TimeoutError``."""
        deadline = time.monotonic() + max_block_s
        with self.lock:
            while True:
                try:
                    replies = [self.request(deadline, *request)
                               for request in self.metadata.requests(topic)]
                    return self.metadata.learned(topic, replies, time.monotonic())
                except UnknownTopicOrPartitionError as err:
                    raise unknown_topic(topic, err)  # noqa: B904 (its cause is err)
                except BrokerUnavailableError:
                    # The broker went away mid-request (a restart): metadata requests are
                    # idempotent, so wait for the I/O thread to reconnect and ask again,
                    # within max_block_ms like Kafka's send().
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise
                    self.cond.wait(min(remaining, 0.05))

    def transactions(self, manager: TransactionManager, ids: ProducerIdentity,
                     max_block_s: float) -> Transactions:
        """A transactional producer's coordinator requests, run over this connection."""
        return Transactions(manager, ids, self.cond, self.request, max_block_s,
                            self.request_timeout_s, self.backoff_s)

    @staticmethod
    def finish(finished: list) -> None:
        """Resolve the outcomes in ``finished`` (never under the lock)."""
        for args in finished:
            finish_batch(*args)

    # --- the I/O thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except Exception:                         # a bug: fail loudly, never hang callers
            log.exception("producer I/O thread crashed")
            self.stop()

    def _loop(self) -> None:
        poller, polled_fd = None, -2
        sender = self.sender
        while True:
            with self.lock:
                finished, self.finish_later = self.finish_later, []
                if self.stopping:
                    return
                now = time.monotonic()
                conn = self.conn
                if conn is None and now >= self.reconnect_at:
                    self.lock.release()
                    try:
                        conn = self._reconnect()
                    finally:
                        self.lock.acquire()
                    if self.stopping:
                        if conn is not None:
                            conn.close()
                        return
                    if conn is not None:
                        self._attach(conn)
                        self.cond.notify_all()
                    now = time.monotonic()
                if self.conn is not None and sender.producer_id_due(now):
                    self._renew_producer_id(finished)
                    if self.stopping:
                        return
                    now = time.monotonic()
                self._service(now, finished)
                wake_at = self._next_wake(now)
                self.wake_at = wake_at
                sender.wake = False               # planned for above
                fd, conn, wake_r = self.fd, self.conn, self.wake_r
            for args in finished:
                finish_batch(*args)
            if self.check_stash and conn is not None:   # set on this thread only
                # Replies a call on this thread took off the socket (InitProducerId above, a
                # callback's metadata request just now) wait in the connection's stash, where
                # poll never sees them, and this read also takes those that arrived since:
                # the answers to the batches the new id just let out, on a busy machine. What
                # they settle can move the wake-up earlier (a retry's backoff), so plan again:
                # polling until wake_at, planned before them, slept a 1 ms retry until the
                # request timeout (30 s; 1 run in 75 on 2 busy cores).
                self.check_stash = False
                self.read(conn)
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
                    self.read(conn)

    def _service(self, now: float, finished: list) -> None:
        """Timeouts, then send: queued batches first, then lingered ones while there is room."""
        sender = self.sender
        err = sender.timed_out(now)
        if err is not None and self.conn is not None:
            self._disconnected(self.conn, err, finished)
        sender.expire(now, self.conn is not None, finished)
        self.pump(finished)
        due = self.accumulator.due(now, sender.room)
        if due:
            for batch in due:
                self.queue(batch)
            self.pump(finished)
        self.cond.notify_all()                    # room for senders blocked in send()

    def _next_wake(self, now: float) -> float:
        sender = self.sender
        wake = self.accumulator.next_due(now, sender.room)
        wake = sender.next_wake(now, self.conn is not None, wake)
        if self.conn is None:
            wake = min(wake, self.reconnect_at)
        return wake

    # --- producer ids -------------------------------------------------------------------------
    def _init_producer_id(self, conn: Connection) -> None:
        """InitProducerId for an idempotent producer, on a connection no other thread reads
        yet."""
        try:
            reply = conn.call(Api.INIT_PRODUCER_ID, None, self.transaction_timeout_ms)
        except BrokerError as err:
            self.producer_id_refused(err)
            return
        self.sender.producer_id_received(reply["producer_id"], reply["producer_epoch"])

    def producer_id_refused(self, err: BrokerError) -> None:
        """InitProducerId failed at start: a broker without it means no idempotence, unless
        it was asked for explicitly (raises ``err``); a retriable error leaves batches waiting
        for an id, asked for again later; any other is raised."""
        if isinstance(err, (InvalidRequestError, UnsupportedVersionError)):
            if self.explicit_idempotence:
                raise err
            log.warning("the broker at %s does not give producer ids (%s): this producer is "
                        "not idempotent", self.socket, err)
            self.sender.ids = None
            return
        if not err.retriable:
            raise err
        log.warning("InitProducerId failed (%s); the producer asks again", err)
        self.sender.want_producer_id()

    def _renew_producer_id(self, finished: list) -> None:
        """On the I/O thread, under the lock (released during the call): InitProducerId for a
        new producer id; the sender seals the batches that waited for it."""
        conn = self.conn
        assert conn is not None
        self.lock.release()
        try:
            reply = conn.call(Api.INIT_PRODUCER_ID, None, self.transaction_timeout_ms,
                              timeout=self.request_timeout_s)
            failure: BaseException | None = None
        except (MQError, TimeoutError, OSError) as err:
            reply, failure = None, err
        finally:
            self.lock.acquire()
            self.check_stash = True               # replies that came meanwhile wait there
        self.producer_id_renewed(conn, reply, failure, finished)

    def producer_id_renewed(self, conn, reply, failure: BaseException | None,
                            finished: list) -> None:
        """The outcome of a renewing InitProducerId on ``conn``: the new id, a retry after
        a backoff (the broker's error), or a lost connection."""
        if self.stopping or not self.sender.awaiting_producer_id:
            return
        if failure is None:
            self.sender.producer_id_received(reply["producer_id"], reply["producer_epoch"])
            self.cond.notify_all()
        elif isinstance(failure, BrokerError):
            log.warning("producer: InitProducerId failed (%s); retrying", failure)
            self.sender.producer_id_failed(failure, time.monotonic(), finished)
        else:
            self._disconnected(conn, failure, finished)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "connected" if self.conn else "disconnected"
        return f"<ProducerIO {self.socket} {state}>"
