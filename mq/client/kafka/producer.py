"""``mq.Producer`` on a Kafka cluster: mq's producer API over librdkafka's producer.

``send()`` checks and serializes the record as the local producer does, hands it to
librdkafka (which batches, compresses, retries, keeps idempotence's sequences and follows
leaders) and returns a ``KafkaFuture`` with the local future's methods. One daemon thread
serves librdkafka's delivery reports (``poll``), so futures complete and callbacks run on it,
as they run on the local producer's I/O thread.

mq's options become librdkafka's (``_derived``): ``acks``, ``linger_ms``, ``batch_size``,
``compression_type``, ``max_request_size``, ``retries``, ``retry_backoff_ms``,
``request_timeout_ms``, ``delivery_timeout_ms``, ``max_in_flight``, ``metadata_max_age_ms``,
``client_id``, idempotence (on by default with ``acks="all"`` and ``max_in_flight <= 5``, as
locally) and the transactional settings; ``max_block_ms`` bounds the waits for room in
librdkafka's queue and for metadata. Keys go to partitions by murmur2, as locally and in
Kafka's Java client, so a keyed stream keeps its partitions when it moves; a ``partitioner``
callable is asked in Python with the topic's partitions. ``shared_batches`` has no meaning
here (there is no shared memory with a remote broker) and is ignored.

Semantics that differ from the local broker: ``acks="all"`` waits for the in-sync replicas
(``min.insync.replicas``), not for an fsync — Kafka's durability is replication; a topic the
cluster does not know is created on the first send if the cluster auto-creates topics.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mq.client.idempotence import resolve_idempotence
from mq.client.producer_records import as_bytes, check_headers, check_timestamp
from mq.client.types import ConsumerGroupMetadata, RecordMetadata
from mq.errors import (
    ClosedError,
    InvalidTxnStateError,
    ProducerFencedError,
    UnknownTopicOrPartitionError,
)
from mq.client.kafka.config import connection_only, native, with_overrides
from mq.client.kafka.errors import from_kafka, raising

__all__ = ["KafkaFuture", "KafkaProducer"]

log = logging.getLogger("mq.producer")

_ACKS = {0: 0, 1: 1, -1: -1, "all": -1, "0": 0, "1": 1, "-1": -1}
_TOPIC_TTL_S = 30.0                      # how long a send trusts a topic's partition count
# A topic created a moment ago through another node may be unknown to the node asked: each
# learns it from the metadata log in its own time.
_NEW_TOPIC_GRACE_S = 1.0


def delivered(msg: Any) -> RecordMetadata:
    """A successful delivery report's metadata. Its offset is -1 when librdkafka does not
    know it (``msg.offset()`` is ``None``): an idempotent producer's retry of a batch the
    leader had already written is answered DUPLICATE_SEQUENCE_NUMBER, which is a success
    without an offset (seen when a node is killed under load)."""
    offset = msg.offset()
    return RecordMetadata(msg.topic(), msg.partition(), -1 if offset is None else offset,
                          msg.timestamp()[1])


class KafkaFuture:
    """The outcome of one ``send()``: a ``RecordMetadata`` or the exception that failed it,
    with ``mq.FutureRecordMetadata``'s methods. Its event is made only when someone waits
    before the outcome is in (an Event per record would be a third of ``send()``'s cost)."""

    __slots__ = ("_done", "_event", "_metadata", "_error", "_callbacks", "_lock")

    def __init__(self, lock: threading.Lock) -> None:
        self._done = False
        self._event: threading.Event | None = None
        self._metadata: RecordMetadata | None = None
        self._error: BaseException | None = None
        self._callbacks: list | None = None
        self._lock = lock

    def _deliver(self, err: Any, msg: Any) -> None:
        """librdkafka's delivery report (on the poll thread)."""
        if err is not None:
            error: BaseException | None = from_kafka(err, f"record for {msg.topic()}-"
                                                          f"{msg.partition()}")
            metadata = None
        else:
            error, metadata = None, delivered(msg)
        self._settle(metadata, error)

    def _settle(self, metadata: RecordMetadata | None, error: BaseException | None) -> None:
        with self._lock:
            if self._done:
                return
            self._metadata, self._error = metadata, error
            callbacks, self._callbacks = self._callbacks, None
            self._done = True
            event = self._event
        if event is not None:
            event.set()
        for fn, args, kwargs, errback in callbacks or ():
            self._run(fn, args, kwargs, errback)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait for the outcome. Raises the failure, or ``TimeoutError`` after ``timeout``
        seconds."""
        if not self._done:
            with self._lock:
                if not self._done and self._event is None:
                    self._event = threading.Event()
            if not self._done and not self._event.wait(timeout):
                raise TimeoutError(f"record not acknowledged within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._metadata is not None
        return self._metadata

    @property
    def is_done(self) -> bool:
        return self._done

    def succeeded(self) -> bool:
        return self._done and self._error is None

    def failed(self) -> bool:
        return self._done and self._error is not None

    def exception(self) -> BaseException | None:
        """The failure, or ``None`` (not done yet, or succeeded)."""
        return self._error if self._done else None

    @property
    def attempts(self) -> int:
        """1: librdkafka does not say how often it re-sent a record (with idempotence, a
        re-sent record is in the log once)."""
        return 1

    def add_callback(self, fn: Callable, *args: Any, **kwargs: Any) -> KafkaFuture:
        """Call ``fn(*args, metadata, **kwargs)`` on success (at once if already done)."""
        self._add(fn, args, kwargs, False)
        return self

    def add_errback(self, fn: Callable, *args: Any, **kwargs: Any) -> KafkaFuture:
        """Call ``fn(*args, exception, **kwargs)`` on failure (at once if already failed)."""
        self._add(fn, args, kwargs, True)
        return self

    def _add(self, fn: Callable, args: tuple, kwargs: dict, errback: bool) -> None:
        with self._lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append((fn, args, kwargs, errback))
                return
        self._run(fn, args, kwargs, errback)

    def _run(self, fn: Callable, args: tuple, kwargs: dict, errback: bool) -> None:
        try:
            if self._error is None:
                if not errback:
                    fn(*args, self._metadata, **kwargs)
            elif errback:
                fn(*args, self._error, **kwargs)
        except Exception:
            log.exception("producer callback %r raised", fn)

    def __repr__(self) -> str:
        state = ("pending" if not self._done else f"failed: {self._error!r}"
                 if self._error is not None else f"{self._metadata}")
        return f"<KafkaFuture {state}>"


def _derived(acks: int, linger_ms: float, batch_size: int, compression_type: str | None,
             max_request_size: int, retries: int, retry_backoff_ms: float,
             request_timeout_ms: float, delivery_timeout_ms: float, max_in_flight: int,
             metadata_max_age_ms: float, client_id: str, idempotent: bool,
             transactional_id: str | None, transaction_timeout_ms: int) -> dict[str, Any]:
    """mq's producer options as librdkafka's properties."""
    conf: dict[str, Any] = {
        "acks": acks, "linger.ms": linger_ms, "batch.size": batch_size,
        "compression.type": compression_type or "none", "message.max.bytes": max_request_size,
        "retries": retries, "retry.backoff.ms": int(retry_backoff_ms),
        "request.timeout.ms": int(request_timeout_ms),
        "delivery.timeout.ms": int(delivery_timeout_ms),
        "max.in.flight.requests.per.connection": max_in_flight,
        "metadata.max.age.ms": int(metadata_max_age_ms), "client.id": client_id,
        "enable.idempotence": idempotent, "partitioner": "murmur2_random",
    }
    if transactional_id is not None:
        conf["transactional.id"] = transactional_id
        conf["transaction.timeout.ms"] = transaction_timeout_ms
        # librdkafka: a record may not outlive its transaction
        conf["delivery.timeout.ms"] = min(int(delivery_timeout_ms), transaction_timeout_ms)
    return conf


class KafkaProducer:
    """``mq.Producer(bootstrap_servers=...)``: see the module doc and ``mq.Producer``'s."""

    def __init__(self, servers: str, *, acks: int | str = "all", linger_ms: float = 5,
                 batch_size: int = 16384, compression_type: str | None = None,
                 partitioner: Any = None, max_request_size: int = 1048576, retries: int = 5,
                 retry_backoff_ms: float = 100, request_timeout_ms: float = 30000,
                 delivery_timeout_ms: float = 120000, max_in_flight: int = 5,
                 max_block_ms: float = 60000, metadata_max_age_ms: float = 300000,
                 client_id: str = "mq-producer",
                 key_serializer: Callable[[Any], bytes] | None = None,
                 value_serializer: Callable[[Any], bytes] | None = None,
                 enable_idempotence: bool | None = None, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60000, shared_batches: bool = True,
                 kafka_config: Mapping[str, Any] | None = None) -> None:
        if acks not in _ACKS:
            raise ValueError(f"acks must be 0, 1 or 'all' (-1), got {acks!r}")
        if type(transaction_timeout_ms) is not int or transaction_timeout_ms <= 0:
            raise ValueError(f"transaction_timeout_ms must be a positive int, got "
                             f"{transaction_timeout_ms!r}")
        if batch_size < 1 or max_in_flight < 1 or retries < 0 or linger_ms < 0:
            raise ValueError("batch_size and max_in_flight must be >= 1, retries and "
                             "linger_ms >= 0")
        idempotent = resolve_idempotence(enable_idempotence, _ACKS[acks], max_in_flight,
                                         transactional_id)
        self._conf = with_overrides(servers, _derived(
            _ACKS[acks], linger_ms, batch_size, compression_type, max_request_size, retries,
            retry_backoff_ms, request_timeout_ms, delivery_timeout_ms, max_in_flight,
            metadata_max_age_ms, client_id, idempotent,
            transactional_id, transaction_timeout_ms), kafka_config)
        self._max_block_s = max_block_ms / 1000
        self._wait_s = min(max_block_ms, request_timeout_ms) / 1000
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._partition_fn = (None if partitioner is None
                              else getattr(partitioner, "partition", partitioner))
        self._transactional = transactional_id is not None
        self._closed = False
        self._topics: dict[str, tuple[float, int]] = {}   # topic -> (fetched at, partitions)
        self._open()

    # --- the librdkafka handle and its poll thread (again in a forked child) ---------------
    def _open(self) -> None:
        from confluent_kafka import Producer as RdProducer
        with raising("producer"):
            self._rd = native(self, RdProducer, self._conf)
        self._pid = os.getpid()
        self._forked = False                        # set in a forked child (_forked_child)
        self._lock = threading.Lock()               # the futures' lock
        self._stopping = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="mq-kafka-producer",
                                        daemon=True)
        self._poller.start()
        self._topics.clear()

    def _forked_child(self) -> None:
        self._forked = True

    def _poll_loop(self) -> None:
        rd, stopping = self._rd, self._stopping
        while not stopping.is_set():
            try:
                rd.poll(0.1)
            except Exception:               # noqa: BLE001 -- a bug; the thread must go on
                log.exception("a librdkafka callback raised on the producer's poll thread")

    def _handle(self) -> Any:
        if self._closed:
            raise ClosedError("producer is closed")
        if self._forked:
            self._open()      # a forked child: the parent's handle and thread are not ours
        return self._rd

    # --- public API --------------------------------------------------------------------------
    def send(self, topic: str, value: Any = None, key: Any = None, partition: int | None = None,
             headers: Iterable | None = None, timestamp_ms: int | None = None) -> KafkaFuture:
        """Queue one record; returns a future (``mq.Producer.send``'s contract). Raises at
        once for a bad record, an unknown topic or partition, after ``close()``, and
        ``TimeoutError`` when librdkafka's queue stays full for ``max_block_ms``."""
        rd = self._handle()
        fut = KafkaFuture(self._lock)
        args = self.record(topic, value, key, partition, headers, timestamp_ms)
        args["on_delivery"] = fut._deliver
        deadline = None
        while True:
            try:
                self.produce(rd, topic, args)
                return fut
            except BufferError:                     # librdkafka's queue is full: wait
                now = time.monotonic()
                deadline = deadline or now + self._max_block_s
                if now >= deadline:
                    raise TimeoutError(f"no room in the producer's queue within "
                                       f"{self._max_block_s} s") from None
                rd.poll(0.05)

    def record(self, topic: str, value: Any, key: Any, partition: int | None,
               headers: Iterable | None, timestamp_ms: int | None) -> dict[str, Any]:
        """``send()``'s checks and serialization: librdkafka's ``produce`` arguments for the
        record (``mq.aio``'s producer shares them). Asks the cluster for the topic's
        partitions when it has not yet."""
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
        if headers is not None:
            headers = check_headers(headers)[0] or None
        if timestamp_ms is not None:
            check_timestamp(timestamp_ms)
        partitions = self._partitions(topic)
        if partition is None:
            if self._partition_fn is not None:
                every = list(range(partitions))
                partition = self._partition_fn(topic, key, every, every)
        elif type(partition) is not int or not 0 <= partition < partitions:
            raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition!r} "
                                               f"(it has {partitions})")
        args: dict[str, Any] = {"value": value, "key": key}
        if partition is not None:
            args["partition"] = partition
        if headers:
            args["headers"] = headers
        if timestamp_ms is not None and timestamp_ms >= 0:
            args["timestamp"] = timestamp_ms
        return args

    @staticmethod
    def produce(rd: Any, topic: str, args: dict[str, Any]) -> None:
        """Hand a record to librdkafka; ``BufferError`` when its queue is full."""
        from confluent_kafka import KafkaException
        try:
            rd.produce(topic, **args)
        except KafkaException as err:
            raise from_kafka(err, f"send to {topic}") from err

    def known(self, topic: str) -> bool:
        """Whether ``send()`` to ``topic`` would not ask the cluster for its partitions."""
        fetched = self._topics.get(topic)
        return fetched is not None and time.monotonic() - fetched[0] < _TOPIC_TTL_S

    def send_many(self, topic: str, values: Iterable, keys: Iterable | None = None,
                  partition: int | None = None, headers: Iterable | None = None,
                  timestamp_ms: int | None = None) -> list[KafkaFuture]:
        """``send()`` for each value (with the key at the same index of ``keys``)."""
        values = list(values)
        if keys is None:
            keys = [None] * len(values)
        else:
            keys = list(keys)
            if len(keys) != len(values):
                raise ValueError(f"send_many: {len(values)} values but {len(keys)} keys")
        headers = None if headers is None else check_headers(headers)[0]
        return [self.send(topic, v, k, partition, headers, timestamp_ms)
                for v, k in zip(values, keys)]

    def flush(self, timeout: float | None = None) -> None:
        """Send every queued record now and wait until all are acknowledged or failed.
        Raises ``TimeoutError`` after ``timeout`` seconds."""
        rd = self._handle()
        left = rd.flush(-1 if timeout is None else timeout)
        if left:
            raise TimeoutError(f"flush: {left} record(s) still unacknowledged after "
                               f"{timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` seconds), then stop; records still undelivered fail with
        ``ClosedError``. Idempotent."""
        if self._closed:
            return
        try:
            if self._pid == os.getpid():
                try:
                    self.flush(timeout)
                except TimeoutError:
                    log.warning("closing the producer with undelivered records (flush "
                                "timed out)")
                self._rd.purge()
                self._rd.poll(0)                    # the purged records' reports
        finally:
            self._closed = True
            self._stopping.set()
            if self._poller is not threading.current_thread() and self._pid == os.getpid():
                self._poller.join()

    def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of ``topic``. Raises ``UnknownTopicOrPartitionError``."""
        return set(range(self._partitions(topic)))

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> KafkaProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> None:
        raise TypeError("a Producer cannot be pickled; create one in each process")

    # --- transactions --------------------------------------------------------------------------
    def init_transactions(self) -> None:
        """Register ``transactional_id`` with the cluster, fencing older producers with it."""
        self._txn_call("init_transactions", self._max_block_s)

    def begin_transaction(self) -> None:
        """Open a transaction."""
        self._txn_call("begin_transaction")

    def send_offsets_to_transaction(self, offsets: dict, group: Any) -> None:
        """Commit consumed offsets (``{TopicPartition: offset}`` or ``{tp: (offset,
        metadata)}``) for ``group`` (a group id, a consumer or its ``group_metadata()``) as
        part of the open transaction."""
        from confluent_kafka import TopicPartition as RdPartition
        positions = []
        for tp, offset in offsets.items():
            offset, metadata = offset if isinstance(offset, tuple) else (offset, None)
            positions.append(RdPartition(tp[0], tp[1], offset, metadata=metadata)
                             if metadata else RdPartition(tp[0], tp[1], offset))
        self._txn_call("send_offsets_to_transaction", positions,
                       group_metadata(group, self._conf), self._max_block_s)

    def commit_transaction(self) -> None:
        """Flush the transaction's sends, then commit it."""
        self._txn_call("commit_transaction", self._max_block_s)

    def abort_transaction(self) -> None:
        """Abort the open transaction (its pending sends fail)."""
        self._txn_call("abort_transaction", self._max_block_s)

    def _txn_call(self, name: str, *args: Any) -> None:
        from confluent_kafka import KafkaError, KafkaException
        rd = self._handle()
        if not self._transactional:
            raise InvalidTxnStateError("not a transactional producer: create it with "
                                       "transactional_id=...")
        try:
            getattr(rd, name)(*args)
        except KafkaException as exc:
            err = exc.args[0]
            what = name.replace("_", " ")
            if err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                              KafkaError.INVALID_PRODUCER_EPOCH):
                raise ProducerFencedError(f"{what}: {err.str()}") from exc
            if err.txn_requires_abort():
                raise InvalidTxnStateError(f"{what}: {err.str()}; the transaction can only "
                                           "be aborted") from exc
            if err.retriable() or err.code() == KafkaError._TIMED_OUT:
                raise TimeoutError(f"{what}: {err.str()} (call it again)") from exc
            raise from_kafka(err, what) from exc

    # --- metadata ----------------------------------------------------------------------------
    def _partitions(self, topic: str) -> int:
        """``topic``'s partition count (fetched at most every ``_TOPIC_TTL_S``). Raises
        ``UnknownTopicOrPartitionError``, ``BrokerUnavailableError``."""
        known = self._topics.get(topic)
        now = time.monotonic()
        if known is not None and now - known[0] < _TOPIC_TTL_S:
            return known[1]
        if not isinstance(topic, str):
            raise TypeError(f"topic must be str, got {type(topic).__name__}")
        count = topic_partitions(self._rd, topic, self._wait_s)
        self._topics[topic] = (now, count)
        return count


def topic_partitions(rd: Any, topic: str, timeout: float) -> int:
    """How many partitions ``topic`` has, asking the cluster through the librdkafka handle
    ``rd``. Raises ``UnknownTopicOrPartitionError``, ``BrokerUnavailableError``."""
    from confluent_kafka import KafkaError
    now = time.monotonic()
    deadline, unknown_until = now + timeout, now + min(timeout, _NEW_TOPIC_GRACE_S)
    while True:
        with raising(f"metadata of {topic}"):
            meta = rd.list_topics(topic, max(0.1, deadline - time.monotonic()))
        info = meta.topics.get(topic)
        err = info.error if info is not None else None
        if info is not None and info.partitions and err is None:
            return len(info.partitions)
        if err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART and \
                time.monotonic() >= unknown_until:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        if time.monotonic() >= deadline:          # being created, or its leader elected
            raise (from_kafka(err, f"metadata of {topic}") if err is not None else
                   UnknownTopicOrPartitionError(f"topic {topic!r} has no partitions"))
        time.sleep(0.05)


def group_metadata(group: Any, conf: Mapping[str, Any]) -> Any:
    """librdkafka's group metadata for ``send_offsets_to_transaction``: the consumer's own
    (``KafkaConsumer``, or what its ``group_metadata()`` returned), else one for the group
    id alone (no member: the coordinator does not check generations)."""
    native = getattr(group, "native_group_metadata", None)
    if callable(native):
        return native()
    if native is not None:
        return native
    group_id = group.group_id if isinstance(group, ConsumerGroupMetadata) else group
    if not isinstance(group_id, str):
        raise TypeError(f"group must be a group id, a Consumer or its group_metadata(), got "
                        f"{type(group).__name__}")
    from confluent_kafka import Consumer as RdConsumer
    probe = RdConsumer({**connection_only(conf), "group.id": group_id})
    try:
        return probe.consumer_group_metadata()
    finally:
        probe.close()
