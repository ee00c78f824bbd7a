"""``mq.Producer``: records in, RecordBatch v2 requests out, futures back.

The parts
---------
``Producer`` holds three parts and delegates to them; none calls back into it:

- the accumulator (``batch_accumulator.BatchAccumulator``, pure): the open batch of each
  partition, and which batches are due at ``now`` (``batch_size``, ``linger_ms``, room in
  flight);
- the sender (``sender.Sender``, sans I/O): closed batches in, the requests to write and the
  batches' outcomes out — order, retries, sequences, idempotence and what a failed batch
  means for a transaction;
- the driver (``producer_io.ProducerIO``): the connection, the I/O thread, the wake-up pipe
  and the batch arena, feeding the sender replies and the clock.

What the producer knows of topics and the broker's limits is ``producer_metadata.py``;
batches and the futures ``send()`` returns are ``producer_batches.py``.

Where the work happens
----------------------
Encoding runs in the thread that calls ``send()``: the record is appended to its partition's
open batch by its record accumulator (``accumulator.RecordAccumulator``, in C when the
extension is built), one call that encodes the record and returns its future — a view of the batch's
outcome (batch, offset delta, timestamp), not an object with state of its own; ``send()``'s
Python work per record is the checks, the partition and the full-batch test around that call
(the accumulator's fast path, inlined). ``send_many()`` does that work once per call and lets
the record accumulator encode a batch at a time (``extend``), for callers with many records
at once. A batch is ready when it holds ``batch_size`` bytes (uncompressed) or ``linger_ms``
after its first record; closing it hands it to the sender, which seals and builds it
(compression, CRC-32C), and the thread that closed it writes it at once if fewer than
``max_in_flight`` requests are outstanding. Nothing per record crosses threads. While
``max_in_flight`` requests are outstanding a full batch is not closed but keeps filling, up to
``min(max_request_size, the topic's max.message.bytes)``: a busy pipeline (``acks="all"``
waiting for an fsync) then carries fewer, larger requests — Kafka gets the same effect by
packing every ready batch of a broker into one request, which mq's one-batch Produce cannot.

Exactly once
------------
Idempotence is on by default (Kafka 3.x: with ``acks="all"`` and ``max_in_flight <= 5``;
``idempotence.py`` has the rules and the sequence numbers). The producer gets its producer id
(InitProducerId) when it is constructed — eagerly, so that a broker without it fails the
constructor rather than a later send, and the first batch never waits for a round trip — and
seals every batch with it, its epoch and the partition's next base sequence: a few attribute
writes per batch, nothing per record. A retried or re-sent batch the partition already has is
answered with its first offsets and not appended again. Sequence errors, gaps and new ids:
``sender.py``. ``transactional_id`` makes the producer transactional:
``init_transactions()``, ``begin_transaction()``, ``send()``,
``send_offsets_to_transaction()``, ``commit_transaction()``/``abort_transaction()``, as in
Kafka (``transactions.py``; the client's state machine and its errors —
``InvalidTxnStateError`` for misuse, ``ProducerFencedError`` once fenced, fatal — in
``transaction_manager.py``). A transactional producer belongs to one process: a forked child
must call ``init_transactions()`` again (which fences the parent).

Fork safety: a producer used in a forked child gets a fresh lock, connection and I/O thread on
first use there. Records the parent had buffered are not inherited — the child never sends them
and their futures never complete in the child; ``flush()`` before forking.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from mq.client.batch_accumulator import BatchAccumulator
from mq.client.connection import resolve_socket
from mq.client.idempotence import ProducerIdentity, resolve_idempotence
from mq.client.kafka.config import backend_args, bootstrap
from mq.client.partitioner import DefaultPartitioner, murmur2
from mq.client.producer_batches import Batch, FutureRecordMetadata, TopicState, wait_done
from mq.client.producer_io import ProducerIO
from mq.client.producer_metadata import REQUEST_ENVELOPE_BYTES, ProducerMetadata
from mq.client.producer_records import (
    as_bytes,
    check_headers,
    check_record_size,
    check_timestamp,
)
from mq.client.transaction_manager import TransactionManager, TxnState
from mq.client.sender import Sender
from mq.client.transactions import Transactions
from mq.client.types import RecordMetadata, TopicPartition
from mq.errors import (
    ClosedError,
    InvalidTxnStateError,
    UnknownTopicOrPartitionError,
)
from mq.log import native
from mq.log.compression import NONE, available_codecs, codec_from_name
from mq.log.layout import MAX_RECORD_OVERHEAD, RECORD_BATCH_OVERHEAD
from mq.protocol.messages import ACKS_ALL

__all__ = ["REQUEST_ENVELOPE_BYTES", "FutureRecordMetadata", "Producer", "RecordMetadata",
           "TopicPartition"]

log = logging.getLogger("mq.producer")

# Keys repeat (user ids, order ids): remembering recent hashes saves murmur2's Python loop.
_KEY_CACHE_SIZE = 16384                   # about 2 MB of keys at most
_WHOLE_MAX_BYTES = 16384                  # send_whole: larger records take the general path


_IN_TRANSACTION = TxnState.IN_TRANSACTION
_ACKS = {0: 0, 1: 1, -1: ACKS_ALL, "all": ACKS_ALL, "0": 0, "1": 1, "-1": ACKS_ALL}


class _Run(list):
    """One partition's share of a keyed ``send_many``: its futures (the list), and the
    records' values, keys and places in the call's ``values``."""

    __slots__ = ("indices", "values", "keys")

    def __init__(self) -> None:
        super().__init__()
        self.indices: list[int] = []
        self.values: list = []
        self.keys: list = []


def _checked(items: Iterable, serializer: Callable | None, what: str) -> tuple[list, int]:
    """``send_many``'s values or keys as a list of bytes (or None), serialized and checked
    as ``send()`` does, with the length of the longest."""
    if serializer is None:
        out = list(items)
    else:
        out = [None if x is None else serializer(x) for x in items]
    longest = 0
    for i, x in enumerate(out):
        if x is not None:
            if type(x) is not bytes:
                x = out[i] = as_bytes(x, what)
            if len(x) > longest:
                longest = len(x)
    return out, longest


class Producer:
    """Publishes records to the broker; see the module docstrings (this one, ``sender.py``
    and ``producer_io.py``) for the design.

    ``acks``: 0 (no reply), 1 (after the write) or ``"all"``/-1 (after an fsync covering it).
    ``linger_ms``/``batch_size``: a batch goes out when it holds ``batch_size`` bytes or its
    first record is ``linger_ms`` old. ``compression_type``: None, "gzip", "snappy", "lz4",
    "zstd". ``partitioner``: ``callable(topic, key_bytes, all_partitions, available) -> int``
    or an object with such a ``partition`` method. ``max_request_size``: the largest batch
    (and so record) sent; never more than the broker accepts (its ``max_request_bytes``, less
    ``REQUEST_ENVELOPE_BYTES`` for the rest of the request). ``max_in_flight``: unanswered
    requests at once. ``retries`` / ``retry_backoff_ms`` / ``delivery_timeout_ms``: how long
    a batch is retried.
    ``request_timeout_ms``: a request unanswered that long drops the connection (its batches
    are re-sent). ``max_block_ms``: how long ``send()`` may wait for room or metadata.
    ``key_serializer``/``value_serializer``: callables applied to non-None keys/values.
    ``enable_idempotence``: None (default: on when ``acks="all"`` and ``max_in_flight <= 5``),
    True or False. ``transactional_id`` / ``transaction_timeout_ms``: a transactional producer
    (see the module doc); the coordinator aborts its open transaction, fencing it, when it
    stays open longer than ``transaction_timeout_ms``. ``shared_batches``: with acks, send
    batches of 32 KiB and more through a shared-memory arena the broker writes the log from
    (``arena.py``) instead of through the socket, when the broker takes one (default True).
    ``bootstrap_servers`` ("host:port,...") and ``kafka_config`` (librdkafka properties:
    security...): a Kafka cluster instead of the local broker, with the same options and API
    (``mq/client/kafka/producer.py`` says what differs).

    Raises ``BrokerUnavailableError`` if no broker answers on the socket, ``ValueError`` for
    settings that conflict (``enable_idempotence=True`` or a ``transactional_id`` with
    ``acks`` other than "all" or ``max_in_flight > 5``), the broker's error if InitProducerId
    fails (``UnsupportedVersionError``/``InvalidRequestError`` from a broker without it when
    ``enable_idempotence=True``).
    """

    # The driver: the blocking one, with its I/O thread. ``mq.aio.Producer`` runs the same
    # record path over an event loop's driver instead.
    _io_type: type = ProducerIO

    def __new__(cls, socket: str | None = None, *args: Any,
                bootstrap_servers: str | Iterable[str] | None = None,
                kafka_config: dict | None = None, **options: Any) -> Any:
        """The local producer, or with a Kafka cluster (``bootstrap_servers``, else
        ``$MQ_BOOTSTRAP_SERVERS`` when no ``socket`` is given) the backend on it
        (``mq/client/kafka/``), which takes the same options."""
        servers = bootstrap(socket, bootstrap_servers)
        backend_args(servers, args, kafka_config)
        if servers is None:
            return super().__new__(cls)
        return cls._kafka_backend()(servers, kafka_config=kafka_config, **options)

    @staticmethod
    def _kafka_backend() -> type:
        from mq.client.kafka.producer import KafkaProducer
        return KafkaProducer

    def __init__(self, socket: str | None = None, acks: int | str = "all", linger_ms: float = 5,
                 batch_size: int = 16384, compression_type: str | None = None,
                 partitioner: Any = None, max_request_size: int = 1048576,
                 retries: int = 5, retry_backoff_ms: float = 100,
                 request_timeout_ms: float = 30000, delivery_timeout_ms: float = 120000,
                 max_in_flight: int = 5, max_block_ms: float = 60000,
                 metadata_max_age_ms: float = 300000, client_id: str = "mq-producer",
                 key_serializer: Callable[[Any], bytes] | None = None,
                 value_serializer: Callable[[Any], bytes] | None = None,
                 enable_idempotence: bool | None = None, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60000, shared_batches: bool = True,
                 bootstrap_servers: str | Iterable[str] | None = None,
                 kafka_config: dict | None = None) -> None:
        if acks not in _ACKS:
            raise ValueError(f"acks must be 0, 1 or 'all' (-1), got {acks!r}")
        if type(transaction_timeout_ms) is not int or transaction_timeout_ms <= 0:
            raise ValueError(f"transaction_timeout_ms must be a positive int, got "
                             f"{transaction_timeout_ms!r}")
        idempotent = resolve_idempotence(enable_idempotence, _ACKS[acks], max_in_flight,
                                         transactional_id)
        codec = codec_from_name(compression_type)
        if compression_type and not available_codecs().get(compression_type.lower()):
            raise ValueError(f"{compression_type} compression is not available; install "
                             "mq[codecs]")
        if batch_size < 1 or max_request_size < RECORD_BATCH_OVERHEAD + 8:
            raise ValueError("batch_size and max_request_size must be positive (and "
                             "max_request_size hold at least one record)")
        if max_in_flight < 1 or retries < 0 or linger_ms < 0:
            raise ValueError("max_in_flight must be >= 1, retries and linger_ms >= 0")
        self._socket = resolve_socket(socket)
        self._acks = _ACKS[acks]
        self._linger_s = linger_ms / 1000
        self._codec = codec
        self._shared_batches = shared_batches
        self._meta = ProducerMetadata(batch_size, max_request_size, metadata_max_age_ms / 1000)
        self._topics = self._meta.topics          # fresh metadata, read without the lock
        self._retries = retries
        self._backoff_s = retry_backoff_ms / 1000
        self._request_timeout_s = request_timeout_ms / 1000
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._max_in_flight = max_in_flight
        self._max_block_s = max_block_ms / 1000
        self._client_id = client_id
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        if partitioner is None:
            partitioner = DefaultPartitioner()
        self._partitioner = partitioner
        self._keyed_default = type(partitioner) is DefaultPartitioner
        self._sticky = partitioner.sticky if self._keyed_default else {}
        self._key_hashes: dict[bytes, int] = {}     # key -> to_positive(murmur2(key))
        self._partition_fn = getattr(self._partitioner, "partition", self._partitioner)
        self._on_batch_closed = getattr(self._partitioner, "on_batch_closed", None)
        self._explicit_idempotence = enable_idempotence is True
        self._transactional_id = transactional_id
        self._transaction_timeout_ms = transaction_timeout_ms
        # send() writes a record whole, in one C call, where linger_ms=0 closes its batch at
        # once anyway (ProducerIO.send_whole; not mq.aio's driver, whose writes are the loop's)
        self._whole = not linger_ms and codec == NONE and self._acks != 0 and \
            transactional_id is None and hasattr(self._io_type, "send_whole")
        self._build_parts(ProducerIdentity(transactional_id is not None) if idempotent else None)
        self._start()

    # --- state, start, fork -------------------------------------------------------------------
    def _build_parts(self, ids: ProducerIdentity | None) -> None:
        """The parts, fresh: in ``__init__``, and in a forked child (none of the parent's
        lock, batches, connection or thread)."""
        self._owner_pid = os.getpid()              # the OS process these parts belong to
        manager = None
        if self._transactional_id is not None:
            manager = TransactionManager(self._transactional_id, self._transaction_timeout_ms)
        self._acc = BatchAccumulator(self._codec, self._linger_s, self._acks, threading.Lock(),
                                     self._on_batch_closed)
        self._sender = Sender(self._acks, self._max_in_flight, self._retries, self._backoff_s,
                              self._request_timeout_s, self._delivery_timeout_s, ids, manager)
        self._io = self._io_type(self._socket, self._client_id, self._request_timeout_s,
                              self._backoff_s, self._shared_batches,
                              self._meta.wanted_max_request_size, self._transaction_timeout_ms,
                              self._explicit_idempotence, self._acc, self._sender, self._meta)
        self._lock = self._io.lock
        self._ready = self._sender.ready          # read by send() for room: never rebound
        # send()'s common case in one C call (native.send_open): a record into its
        # partition's open batch, where linger_ms > 0 keeps batches open; None: Python's.
        self._open_state = None
        if self._linger_s and self._key_serializer is None and self._value_serializer is None \
                and self._transactional_id is None:
            self._open_state = (self._topics, self._sticky if self._keyed_default else None,
                                self._key_hashes, self._io, self._lock.acquire,
                                self._lock.release, self._ready, self._max_in_flight,
                                self._meta)
        self._txn: Transactions | None = None
        if manager is not None:
            self._txn = self._io.transactions(manager, ids, self._max_block_s)

    def _start(self) -> None:
        """Connect and start the I/O thread (in ``__init__``, and in a forked child)."""
        self._io.start(init_producer_id=self._sender.ids is not None and self._txn is None)
        _LIVE.add(self)

    def _after_fork_in_child(self) -> None:
        """Runs in a forked child: forget everything of the parent's except its config and
        metadata; the parent's socket, pipe and thread are not ours (not closed: the objects
        may be mid-use by a parent thread that was copied into a half-done state)."""
        self._inherited = self._io
        self._io.forget_after_fork()
        self._acc.drop_all(self._meta.all_topics.values())
        ids = self._sender.ids
        if ids is not None:
            ids.clear()                           # the parent's id is the parent's
        self._build_parts(ids)
        state = self._meta.state
        self._meta.version = state.metadata_version if state is not None else -1

    def _ensure_started(self) -> None:
        io = self._io
        if io.io_thread is None:
            if io.closed:
                raise ClosedError("producer is closed")
            with self._lock:
                if io.io_thread is None:
                    self._start()

    # --- public API ---------------------------------------------------------------------------
    def send(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
             headers: Iterable | None = None, timestamp_ms: int | None = None,
             ) -> FutureRecordMetadata:
        """Queue one record; returns a future. Raises at once: ``TypeError`` for a value or key
        that is not bytes-like, ``ValueError`` for a ``timestamp_ms`` below -1 (None: now),
        ``UnknownTopicOrPartitionError`` for an unknown topic or a partition out of range,
        ``MessageTooLargeError`` for a record over ``max_request_size``,
        ``RecordListTooLargeError`` for one over what the broker accepts in a request (its
        ``max_request_bytes``), ``ClosedError`` after ``close()``, ``BrokerUnavailableError``
        when metadata is needed and no broker answers, ``TimeoutError`` after waiting
        ``max_block_ms`` for room. A transactional producer also raises
        ``InvalidTxnStateError`` outside a transaction (or once it can only be aborted),
        ``ProducerFencedError`` once fenced, and AddPartitionsToTxn's errors for the first
        record of a partition in the transaction. The future fails with
        ``InvalidTimestampError`` when the topic refuses the record's timestamp
        (``message.timestamp.after.max.ms``, ``message.timestamp.before.max.ms``)."""
        state = self._open_state
        if state is not None:
            fast = native.send_open
            if fast is not None:
                fut = fast(state, topic, value, key, partition, headers, timestamp_ms)
                if fut is not None:
                    return fut
        io = self._io
        if io.closed:
            raise ClosedError("producer is closed")
        if value is not None:
            if self._value_serializer is not None:
                value = self._value_serializer(value)
            if type(value) is not bytes:
                value = as_bytes(value, "value")
        if key is not None:
            if self._key_serializer is not None:
                key = self._key_serializer(key)
            if type(key) is not bytes:
                key = as_bytes(key, "key")
        info = self._topics.get(topic)
        if info is None:
            info = self._topic(topic)
        sticky = False
        if partition is None:
            if self._keyed_default:               # Kafka's rules, inlined: the hot path
                if key is not None:
                    h = self._key_hashes.get(key)
                    if h is None:                 # murmur2 in Python: ~2.5 us a key
                        if len(self._key_hashes) >= _KEY_CACHE_SIZE:
                            self._key_hashes.clear()
                        h = self._key_hashes[key] = murmur2(key) & 0x7FFFFFFF
                    partition = h % info.num_partitions
                else:
                    sticky = True
                    partition = self._sticky.get(topic)
                    if partition is None or partition >= info.num_partitions:
                        partition = self._partitioner.sticky_partition(
                            topic, info.partitions, info.partitions)
            else:
                partition = self._partition_fn(topic, key, info.partitions, info.partitions)
                if not 0 <= partition < info.num_partitions:
                    raise UnknownTopicOrPartitionError(
                        f"partitioner chose partition {partition} of topic {topic!r}, which "
                        f"has {info.num_partitions}")
        elif type(partition) is not int or not 0 <= partition < info.num_partitions:
            if type(partition) is not int:
                raise TypeError(f"partition must be an int, got {type(partition).__name__}")
            info = self._topic(topic)             # partitions may have been added since
            if not 0 <= partition < info.num_partitions:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has no partition {partition} (it has "
                    f"{info.num_partitions})")
        if timestamp_ms is not None:
            check_timestamp(timestamp_ms)
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        if headers:
            headers, hsize = check_headers(headers)
            size += hsize
        else:
            headers = ()
        if size > self._meta.big_record:
            meta = self._meta
            check_record_size(topic, partition, timestamp_ms, key, value, headers,
                              meta.max_request_size, meta.request_cap, meta.broker_max_request)
        if self._whole and len(self._sender.in_flight) >= self._max_in_flight:
            io.read_for_room()                    # so the record can go out whole, now
        with self._lock:
            if io.closed:
                raise ClosedError("producer is closed")
            if len(self._ready) >= self._max_in_flight and \
                    threading.get_ident() != io.io_ident:
                io.wait_for_room(self._max_block_s)
            txn = self._txn
            if txn is not None:                   # inline: in the txn with this partition?
                m = txn.manager
                if m.state is not _IN_TRANSACTION or (topic, partition) not in m.partitions:
                    self._admit(topic, partition)
                sticky = False                    # stay on the partition the txn has
            # With linger_ms=0, a record goes out whole when its partition has no open
            # batch (ProducerIO.send_whole). Else the accumulator's fast path, inlined: the
            # partition's open batch takes the record if it fits (one C call), and keeps
            # filling.
            batch = info.open[partition]
            fut = None
            if batch is None and self._whole and size <= _WHOLE_MAX_BYTES:
                self._meta.refresh(info, time.monotonic())
                fut = io.send_whole(info, partition, timestamp_ms, key, value, headers)
            if fut is not None:
                if not self._sender.ready:
                    return fut
                closed = True                     # its write failed: pump finds out why
            else:
                # a batch this big takes the record
                fits = info.batch_limit - MAX_RECORD_OVERHEAD - size
                if batch is not None and batch.records.size <= fits:
                    fut = batch.add(timestamp_ms, key, value, headers)     # None: now, in C
                    if batch.records.size <= fits and self._linger_s:
                        return fut                # the common case: the batch keeps filling
                    closed = False
                else:
                    closed = False
                    acc, sender = self._acc, self._sender
                    while batch is not None and batch.records.size > fits and \
                            batch.records.size > RECORD_BATCH_OVERHEAD:
                        if acc.may_grow(batch, info, size, sender.room):
                            break                 # nowhere to send it yet: let it grow
                        self._close_batch(batch)  # the record does not fit: close, start anew
                        closed = True
                        if sticky:                # KIP-480: a new batch, maybe a new partition
                            sticky = False
                            new = self._sticky.get(topic, partition)
                            if new < info.num_partitions:
                                partition = new
                        batch = info.open[partition]
                    if batch is None:
                        batch = self._new_batch(info, partition)
                    fut = batch.add(timestamp_ms, key, value, headers)
                if self._acc.settle(batch, info, batch.records.size + size + MAX_RECORD_OVERHEAD,
                                    self._sender.room):
                    self._close_batch(batch)
                    closed = True
            if closed:
                finished: list = []
                io.pump(finished)
                conn = None
            else:
                conn = io.due_reply()             # no room in flight: read replies now?
                if conn is None:
                    return fut
        if conn is not None:
            io.read(conn, caller=True)
            return fut
        io.finish(finished)
        return fut

    def send_many(self, topic: str, values: Iterable, keys: Iterable | None = None,
                  partition: int | None = None, headers: Iterable | None = None,
                  timestamp_ms: int | None = None) -> list[FutureRecordMetadata]:
        """Queue many records at once: ``send(topic, value, key, partition, headers,
        timestamp_ms)`` for each value (with the key at the same index of ``keys``, which must
        be as long), in order, at a fraction of the Python cost per record — the records are
        encoded a batch at a time in C. ``headers`` and ``timestamp_ms`` (None: now) apply to
        every record. Returns one future per record, in order, as ``send()`` does; each
        reports its own record's outcome (records of one batch share it).

        Every value, key, header and size is checked before anything is queued, so
        ``TypeError``, ``MessageTooLargeError``... leave nothing sent. Records go where
        ``send()`` would put them: to ``partition``, by key, or (no keys, the default
        partitioner) to the sticky partition, moving on when a batch fills. Per partition
        they keep their order. Raises as ``send()``; a ``ClosedError`` or ``TimeoutError``
        raised midway (another thread closed the producer; no room within ``max_block_ms``)
        leaves the records before it queued, their futures out of reach: ``flush()`` waits
        for them."""
        if self._io.closed:
            raise ClosedError("producer is closed")
        values, longest = _checked(values, self._value_serializer, "value")
        if keys is not None:
            keys, longest_key = _checked(keys, self._key_serializer, "key")
            if len(keys) != len(values):
                raise ValueError(f"send_many: {len(keys)} keys for {len(values)} values")
            longest += longest_key
        info = self._topics.get(topic)
        if info is None:
            info = self._topic(topic)
        if timestamp_ms is not None:
            check_timestamp(timestamp_ms)
        if headers:
            headers, size = check_headers(headers)
        else:
            headers, size = (), 0
        runs = self._runs(topic, info, values, keys, partition)
        meta = self._meta
        if longest + size > meta.big_record:
            for p, vals, ks, _ in runs:
                for i, value in enumerate(vals):
                    key = None if ks is None else ks[i]
                    check_record_size(topic, p, timestamp_ms, key, value, headers,
                                      meta.max_request_size, meta.request_cap,
                                      meta.broker_max_request)
        size += longest
        finished: list = []
        try:
            with self._lock:
                for p, vals, ks, futs in runs:
                    self._append_run(info, topic, p, vals, ks, headers, timestamp_ms, size,
                                     futs, finished)
        finally:
            self._io.finish(finished)
        if len(runs) == 1:
            return runs[0][3]
        out: list = [None] * len(values)
        for _, _, _, futs in runs:
            for index, fut in zip(futs.indices, futs, strict=True):
                out[index] = fut
        return out

    def _runs(self, topic: str, info: TopicState, values: list, keys: list | None,
              partition: int | None) -> list:
        """``send_many``'s records by partition: ``[(partition or -1 for sticky, values, keys,
        futures list)]``; with several partitions, each futures list has ``.indices``, the
        records' places in ``values``."""
        if partition is not None:
            if type(partition) is not int:
                raise TypeError(f"partition must be an int, got {type(partition).__name__}")
            if not 0 <= partition < info.num_partitions:
                info = self._topic(topic)         # partitions may have been added since
                if not 0 <= partition < info.num_partitions:
                    raise UnknownTopicOrPartitionError(
                        f"topic {topic!r} has no partition {partition} (it has "
                        f"{info.num_partitions})")
            return [(partition, values, keys, [])]
        if keys is None and self._keyed_default:
            return [(-1, values, None, [])]       # sticky
        groups: dict[int, _Run] = {}
        for i, value in enumerate(values):
            key = None if keys is None else keys[i]
            p = self._choose(topic, info, key)
            run = groups.get(p)
            if run is None:
                run = groups[p] = _Run()
            run.indices.append(i)
            run.values.append(value)
            run.keys.append(key)
        return [(p, run.values, run.keys, run) for p, run in groups.items()]

    def _choose(self, topic: str, info: TopicState, key: bytes | None) -> int:
        """The partition of one keyed record (or any record, with a custom partitioner)."""
        if self._keyed_default and key is not None:
            h = self._key_hashes.get(key)
            if h is None:
                if len(self._key_hashes) >= _KEY_CACHE_SIZE:
                    self._key_hashes.clear()
                h = self._key_hashes[key] = murmur2(key) & 0x7FFFFFFF
            return h % info.num_partitions
        if self._keyed_default:
            return self._partitioner.sticky_partition(topic, info.partitions, info.partitions)
        partition = self._partition_fn(topic, key, info.partitions, info.partitions)
        if not 0 <= partition < info.num_partitions:
            raise UnknownTopicOrPartitionError(
                f"partitioner chose partition {partition} of topic {topic!r}, which has "
                f"{info.num_partitions}")
        return partition

    def _append_run(self, info: TopicState, topic: str, partition: int, values: list,
                    keys: list | None, headers, timestamp_ms: int | None, size: int,
                    futs: list, finished: list) -> None:
        """Under the lock: ``values`` (and ``keys``) into ``partition``'s batches (-1: the
        sticky partition, moving on as batches fill), a batch at a time, their futures
        appended to ``futs``; batches closed and sent as ``send()`` would."""
        sticky = partition < 0
        io, sender, acc = self._io, self._sender, self._acc
        i = 0
        while i < len(values):
            if io.closed:
                raise ClosedError("producer is closed")
            if len(sender.ready) >= self._max_in_flight and \
                    threading.get_ident() != io.io_ident:
                io.wait_for_room(self._max_block_s)
            if sticky:
                partition = self._sticky.get(topic, -1)
                if not 0 <= partition < info.num_partitions:
                    partition = self._partitioner.sticky_partition(topic, info.partitions,
                                                                   info.partitions)
            txn = self._txn
            if txn is not None:
                m = txn.manager
                if m.state is not _IN_TRANSACTION or (topic, partition) not in m.partitions:
                    self._admit(topic, partition)
            batch = info.open[partition]
            if batch is None:
                batch = self._new_batch(info, partition)
            busy = self._acks and sender.room <= 0
            i = batch.records.extend(timestamp_ms, values, keys, headers, i,
                                     info.grow_limit if busy else info.batch_limit, futs)
            if i < len(values) or acc.settle(batch, info, batch.records.size + size +
                                             MAX_RECORD_OVERHEAD, sender.room):
                self._close_batch(batch)          # full, or due
            else:
                continue
            io.pump(finished)

    def flush(self, timeout: float | None = None) -> None:
        """Send every buffered record now (ignoring ``linger_ms``) and wait until all of them
        are acknowledged or failed. Raises ``TimeoutError`` after ``timeout`` seconds."""
        io = self._io
        if threading.get_ident() == io.io_ident:
            raise RuntimeError("flush() from a producer callback would wait for itself")
        if io.io_thread is None:
            return                            # a forked child that never sent anything
        finished: list = []
        with self._lock:
            for batch in self._acc.close_all():
                io.queue(batch)
            io.pump(finished)
            pending = list(self._sender.incomplete)
        io.finish(finished)
        io.wake()
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not wait_done(batch, remaining):
                left = sum(1 for b in pending if not b.done)
                raise TimeoutError(f"flush: {left} batch(es) still unacknowledged after "
                                   f"{timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then stop; records still undelivered fail with
        ``ClosedError``. Idempotent."""
        io = self._io
        if io.closed:
            return
        try:
            if io.io_thread is not None and threading.get_ident() != io.io_ident:
                self.flush(timeout)
        except TimeoutError:
            log.warning("closing the producer with undelivered records (flush timed out)")
        finally:
            io.stop()
            _LIVE.discard(self)

    # --- transactions (transactions.py) ---------------------------------------------------------
    def _transactions(self) -> Transactions:
        if self._io.closed:
            raise ClosedError("producer is closed")
        if self._txn is None:
            raise InvalidTxnStateError("not a transactional producer: create it with "
                                       "transactional_id=...")
        self._ensure_started()
        return self._txn

    def init_transactions(self) -> None:
        """Register ``transactional_id`` with the broker: get the producer id and a new epoch,
        fencing older producers with the same id (an open transaction of theirs is aborted
        first). Once per producer. Raises ``InvalidTxnStateError`` when called twice,
        ``TimeoutError`` after ``max_block_ms`` (call it again), the broker's error
        (``InvalidTransactionTimeoutError``...)."""
        self._transactions().init()

    def begin_transaction(self) -> None:
        """Open a transaction: the following sends and offsets commit or abort together.
        Raises ``InvalidTxnStateError`` (before ``init_transactions()``, or with a transaction
        open), ``ProducerFencedError`` once fenced."""
        self._transactions().begin()

    def send_offsets_to_transaction(self, offsets: dict, group: Any) -> None:
        """Commit consumed offsets (``{TopicPartition: offset}`` or ``{tp: (offset,
        metadata)}``: positions, the next record to read) for ``group`` as part of the open
        transaction: the group sees them only if it commits. ``group``: a group id, a
        ``Consumer`` (its ``group_metadata()``: the broker then refuses the offsets of a
        member that lost its partitions) or a ``ConsumerGroupMetadata``. Raises
        ``InvalidTxnStateError`` outside a transaction, ``ProducerFencedError``, the group's
        errors (``FencedMemberEpochError``, ``StaleMemberEpochError``...; the transaction
        must then be aborted), ``TimeoutError``."""
        self._transactions().send_offsets(offsets, group)

    def commit_transaction(self) -> None:
        """Flush every send of the transaction, then commit it: its records become visible
        to ``read_committed`` consumers and its offsets the group's. Raises
        ``InvalidTxnStateError`` without an open transaction, or (caused by the failure) when
        a send of the transaction failed — then only ``abort_transaction()`` is left;
        ``ProducerFencedError``; ``TimeoutError`` (call it again to finish)."""
        txn = self._transactions()
        txn.prepare_commit()
        self.flush(self._max_block_s)             # TimeoutError: still committing, retry
        txn.commit()

    def abort_transaction(self) -> None:
        """Wait for the transaction's pending sends, then abort it: ``read_committed``
        consumers skip its records and its offsets are dropped. Raises
        ``InvalidTxnStateError`` without an open transaction, ``ProducerFencedError``,
        ``TimeoutError`` (call it again to finish)."""
        txn = self._transactions()
        txn.prepare_abort()
        self.flush(self._max_block_s)             # failures are moot: it is aborted
        txn.abort()

    def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of ``topic``. Raises ``UnknownTopicOrPartitionError``."""
        info = self._topics.get(topic) or self._topic(topic)
        return set(info.partitions)

    @property
    def closed(self) -> bool:
        return self._io.closed

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> None:
        raise TypeError("a Producer cannot be pickled; create one in each process")

    # --- metadata -----------------------------------------------------------------------------
    def _topic(self, topic: str) -> TopicState:
        """Fetch ``topic``'s partition count and effective ``max.message.bytes`` (so that no
        batch is built larger than the topic accepts). Raises
        ``UnknownTopicOrPartitionError``, ``BrokerUnavailableError``, ``TimeoutError``."""
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, got {type(topic).__name__}")
        self._ensure_started()
        return self._io.topic(topic, min(self._max_block_s, self._request_timeout_s))

    # --- batches (all under self._lock) -------------------------------------------------------
    def _new_batch(self, info: TopicState, partition: int) -> Batch:
        io = self._io
        if io.closed:
            raise ClosedError("producer is closed")
        if io.io_thread is None:                  # first batch in a forked child
            self._start()
        now = time.monotonic()
        self._meta.refresh(info, now)
        batch = self._acc.open_batch(info, partition, now)
        room = self._sender.room
        # The I/O thread must close the batch in time, unless send() closes it before it lets
        # go of the lock: waking the thread for nothing costs the caller a GIL hand-over on
        # every record.
        if batch.deadline < io.wake_at and (self._acks == 0 or room > 0) and \
                not self._acc.closes_at_once(room):
            io.wake_at = batch.deadline
            io.wake()
        return batch

    def _close_batch(self, batch: Batch) -> None:
        """Records can no longer join ``batch``: the sender seals, builds and queues it."""
        self._io.queue(self._acc.close(batch))

    def _admit(self, topic: str, partition: int) -> None:
        """Transactional ``send()``, under the lock: return once a record for this partition
        may join the open transaction (AddPartitionsToTxn done), with room to queue it."""
        io = self._io
        while not self._txn.admit(topic, partition):   # it waited for a reply: look again
            if io.closed:
                raise ClosedError("producer is closed")
            if len(self._sender.ready) >= self._max_in_flight and \
                    threading.get_ident() != io.io_ident:
                io.wait_for_room(self._max_block_s)

    def __repr__(self) -> str:
        io = self._io
        state = "closed" if io.closed else "connected" if io.conn else "disconnected"
        ids = self._sender.ids
        idempotence = "" if ids is None else \
            f" producer_id={ids.producer_id} epoch={ids.epoch}"
        if self._txn is not None:
            idempotence += f" txn={self._transactional_id!r} " \
                           f"({self._txn.manager.state.value})"
        pending = len(self._sender.incomplete) + len(self._acc.open)
        return (f"<Producer {self._client_id} {self._socket} acks={self._acks}{idempotence} "
                f"{state}, {pending} batch(es) pending>")


# --- process-wide hooks -----------------------------------------------------------------------
_LIVE: weakref.WeakSet[Producer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for producer in list(_LIVE):
        if not producer.closed:
            producer._after_fork_in_child()


def _close_at_exit() -> None:
    """Records buffered when the interpreter exits are sent, as kafka-python does."""
    for producer in list(_LIVE):
        if producer._owner_pid == os.getpid() and not producer.closed:
            try:
                producer.close(timeout=producer._request_timeout_s)
            except Exception:
                log.exception("closing a producer at exit")


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_at_exit)
