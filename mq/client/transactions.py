"""The transactional producer's requests: ``init_transactions``, ``begin_transaction``, adding
partitions and consumed offsets, ``commit_transaction`` and ``abort_transaction`` (Kafka's
names and semantics; ``Producer`` delegates each to ``Transactions``).

The protocol, one transaction::

    init_transactions()      InitProducerId(txn id, timeout)  -> producer id, bumped epoch
                             (fences every older producer with this id; an open transaction of
                             theirs is aborted first: CONCURRENT_TRANSACTIONS until then)
    begin_transaction()      local only
    send(topic, ..., p)      the first record for (topic, p) in this transaction waits for
                             AddPartitionsToTxn, so that no batch of the transaction reaches a
                             partition the coordinator does not know of; batches are sealed
                             with is_transactional and the producer id and epoch
    send_offsets_to_transaction(offsets, group)
                             AddOffsetsToTxn(group), then TxnOffsetCommit: the offsets become
                             the group's committed offsets only if the transaction commits
    commit_transaction()     flush every pending send; if any failed, the transaction can only
                             be aborted (InvalidTxnStateError, caused by that failure); else
                             EndTxn(commit), answered once the markers are durable
    abort_transaction()      wait for every pending send, then EndTxn(abort); if a batch failed
                             for good (a gap in its partition's sequences), InitProducerId
                             again for a new epoch, so every partition starts at sequence 0

Every request is retried while the broker answers a retriable error
(``ConcurrentTransactionsError`` above all) or is unreachable (a restart), with backoff from
``retry_backoff_ms`` doubling to 1 s, for up to ``max_block_ms``; then ``TimeoutError``, after
which calling the same method again resumes (a commit or abort whose EndTxn did not get
through stays in progress; the coordinator answers a repeated EndTxn alike). A fencing answer
(``ProducerFencedError``, ``InvalidProducerEpochError``) and the other fatal coordinator errors
make the producer fatal: that call and every later one raise ``ProducerFencedError`` (or the
fatal error). Other failures of a transaction's request make it abortable.

The requests are written once, without I/O (``TransactionRequests``: generators of requests
and backoffs); ``Transactions`` runs them for the threaded producer, under its lock, and
``mq.aio.Producer`` awaits them. They are meant for one caller at a time, like Kafka's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Mapping
from typing import Any, NoReturn, TypeVar

from mq.client.idempotence import ProducerIdentity
from mq.client.transaction_manager import TransactionManager, fenced, is_fatal
from mq.client.types import ConsumerGroupMetadata, TopicPartition
from mq.errors import BrokerError, BrokerUnavailableError, MQError, StaleMemberEpochError
from mq.protocol.messages import Api

__all__ = ["TransactionRequests", "Transactions", "TxnOp", "group_identity", "offset_items"]

T = TypeVar("T")

_MAX_BACKOFF_S = 1.0


def group_identity(group: Any) -> ConsumerGroupMetadata:
    """``send_offsets_to_transaction``'s ``group``: a group id, a ``ConsumerGroupMetadata``, or
    a consumer (its ``group_metadata()``: group id, member id and member epoch, so that the
    broker refuses the offsets of a member that lost its partitions). Raises ``TypeError`` /
    ``ValueError``."""
    if isinstance(group, str):
        if not group:
            raise ValueError("the group id must be a non-empty string")
        return ConsumerGroupMetadata(group)
    if isinstance(group, ConsumerGroupMetadata):
        return group
    metadata = getattr(group, "group_metadata", None)
    if callable(metadata):
        return metadata()
    raise TypeError(f"group must be a group id (str), a consumer or its group_metadata(), got "
                    f"{type(group).__name__}")


def offset_items(offsets: Mapping) -> list[list]:
    """TxnOffsetCommit's ``[[topic, partition, offset, leader_epoch, metadata], ...]`` for
    ``{tp: offset}`` or ``{tp: (offset, metadata)}``. Raises ``ValueError`` naming the
    partition."""
    items = []
    for tp, value in offsets.items():
        tp = TopicPartition(*tp)
        if isinstance(value, int) and not isinstance(value, bool):
            offset, metadata = value, ""
        else:
            try:
                offset, metadata = value
            except (TypeError, ValueError):
                offset, metadata = getattr(value, "offset", None), getattr(value, "metadata", "")
            metadata = metadata or ""
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0 or \
                not isinstance(metadata, str):
            raise ValueError(f"bad offset for {tp.topic}-{tp.partition}: {value!r} (an int "
                             ">= 0, or (offset, metadata str))")
        items.append([tp.topic, tp.partition, offset, -1, metadata])
    return items


Step = Any   # a backoff in seconds (float), or a request: (deadline, api, *fields)
TxnOp = Generator[Step, Any, T]


class TransactionRequests:
    """The coordinator requests of a transactional producer, without I/O: each operation is a
    generator that yields its steps — a request ``(deadline, api, *fields)``, sent its reply
    (or thrown the error: the broker's, ``BrokerUnavailableError``, ``TimeoutError``), or a
    backoff in seconds, sent None — and returns the operation's result. ``Transactions``
    runs them blocking under the producer's lock; ``mq.aio.Producer`` awaits them.

    ``manager`` and ``ids`` are shared with the producer's sender, which reads them when it
    seals batches. A commit or an abort is two operations around the producer's flush:
    ``prepare_commit()``, flush, ``commit()``."""

    def __init__(self, manager: TransactionManager, ids: ProducerIdentity, max_block_s: float,
                 request_timeout_s: float, backoff_s: float) -> None:
        self.manager = manager
        self.ids = ids
        self.max_block_s = max_block_s
        self.request_timeout_s = request_timeout_s
        self.backoff_s = backoff_s

    @property
    def transactional_id(self) -> str:
        return self.manager.transactional_id

    # --- the operations ---------------------------------------------------------------------------
    def init(self) -> TxnOp[None]:
        m = self.manager
        m.begin_init()
        try:
            yield from self._init_producer_id("init_transactions()")
        except BaseException:
            m.init_failed()
            raise
        m.initialized()

    def admit(self, topic: str, partition: int) -> TxnOp[bool]:
        """For ``send()``: raise unless a record for this partition may join the open
        transaction. True if it may at once; False if AddPartitionsToTxn was needed (done
        now; the producer's lock was released meanwhile, so the caller checks again)."""
        m = self.manager
        if m.check_send(topic, partition):
            return True
        generation = m.generation
        ids = self.ids
        yield from self._txn_call(f"send() to {topic}-{partition}", Api.ADD_PARTITIONS_TO_TXN,
                                  m.transactional_id, ids.producer_id, ids.epoch,
                                  [[topic, partition]])
        m.partition_added(topic, partition, generation)
        return False

    def send_offsets(self, offsets: Mapping, group: Any) -> TxnOp[None]:
        meta = group_identity(group)
        items = offset_items(offsets)
        m, ids = self.manager, self.ids
        m.check_offsets()
        if not items:
            return
        generation = m.generation
        if meta.group_id not in m.groups:
            yield from self._txn_call("send_offsets_to_transaction()", Api.ADD_OFFSETS_TO_TXN,
                                      m.transactional_id, ids.producer_id, ids.epoch,
                                      meta.group_id)
            m.group_added(meta.group_id, generation)
        m.check_offsets()
        # A stale member epoch is not retried: the member's partitions may have moved.
        yield from self._txn_call("send_offsets_to_transaction()", Api.TXN_OFFSET_COMMIT,
                                  m.transactional_id, meta.group_id, ids.producer_id,
                                  ids.epoch, meta.member_id or "", meta.member_epoch, items,
                                  no_retry=(StaleMemberEpochError,))

    def commit(self) -> TxnOp[None]:
        """After the flush: EndTxn(commit), unless a send failed."""
        m, ids = self.manager, self.ids
        m.check_commit()                             # a send failed: abortable, raises
        if m.started:
            yield from self._txn_call("commit_transaction()", Api.END_TXN, m.transactional_id,
                                      ids.producer_id, ids.epoch, 1)
        m.completed()

    def abort(self) -> TxnOp[None]:
        """After the flush: EndTxn(abort), then a new epoch if a batch failed for good."""
        m, ids = self.manager, self.ids
        m.check_not_fatal()
        if m.started:
            yield from self._txn_call("abort_transaction()", Api.END_TXN, m.transactional_id,
                                      ids.producer_id, ids.epoch, 0)
            m.ended()
        if m.needs_epoch_bump:
            try:
                yield from self._init_producer_id("abort_transaction()")
            except (MQError, TimeoutError) as err:
                self._raise_failed(err)
            m.needs_epoch_bump = False
        m.completed()

    # --- requests -------------------------------------------------------------------------------
    def _init_producer_id(self, what: str) -> TxnOp[None]:
        reply = yield from self._call(what, Api.INIT_PRODUCER_ID,
                                      self.manager.transactional_id, self.manager.timeout_ms)
        self.ids.set(reply["producer_id"], reply["producer_epoch"])

    def _txn_call(self, what: str, api: Api, *fields: Any, no_retry: tuple = ()) -> TxnOp:
        """``_call`` for a request of the open transaction: its failure may make the producer
        fatal or the transaction abortable (``_failed``)."""
        try:
            return (yield from self._call(what, api, *fields, no_retry=no_retry))
        except (MQError, TimeoutError) as err:
            self._raise_failed(err)

    def _call(self, what: str, api: Api, *fields: Any, no_retry: tuple = ()) -> TxnOp:
        """One request, retried (see the module doc) for up to max_block_ms. Raises the
        broker's non-retriable error, or ``TimeoutError``."""
        deadline = time.monotonic() + self.max_block_s
        backoff = self.backoff_s
        while True:
            try:
                return (yield (min(deadline, time.monotonic() + self.request_timeout_s), api)
                        + fields)
            except (BrokerError, BrokerUnavailableError, TimeoutError) as err:
                if isinstance(err, BrokerError) and (not err.retriable
                                                     or isinstance(err, no_retry)):
                    raise
                if time.monotonic() + backoff >= deadline:
                    raise TimeoutError(f"{what}: {api.name} did not succeed within "
                                       f"max_block_ms ({self.max_block_s * 1000:.0f} ms); "
                                       f"last: {type(err).__name__}: {err}") from err
                yield backoff
                backoff = min(backoff * 2, _MAX_BACKOFF_S)

    def _raise_failed(self, err: BaseException) -> NoReturn:
        """Raise what ``_failed`` makes of ``err`` (``err`` itself, or the fatal error)."""
        new = self._failed(err)
        if new is err:
            raise err
        raise new from err

    def _failed(self, err: BaseException) -> BaseException:
        """What a failed request of a transaction means for it: fatal errors make the
        producer fatal, timeouts change nothing (call again), anything else makes the open
        transaction abortable. Returns the error to raise."""
        m = self.manager
        if is_fatal(err):
            err = fenced(err)
            m.fatal(err)
            return m.error if m.error is not None else err
        if not isinstance(err, (TimeoutError, BrokerUnavailableError)):
            m.abortable(err)
        return err


class Transactions:
    """``TransactionRequests`` run blocking over the threaded producer's connection.

    ``cond``: the producer's condition (its lock); ``request(deadline, api, *fields)``: one
    request under that lock, raising the broker's error. Each method takes the lock (but
    ``admit``, called by ``send()`` under it) and waits on the condition, so the I/O thread
    runs meanwhile."""

    def __init__(self, manager: TransactionManager, ids: ProducerIdentity,
                 cond: threading.Condition, request: Callable, max_block_s: float,
                 request_timeout_s: float, backoff_s: float) -> None:
        self.requests = TransactionRequests(manager, ids, max_block_s, request_timeout_s,
                                            backoff_s)
        self.manager = manager
        self.ids = ids
        self._cond = cond
        self._request = request

    def init(self) -> None:
        with self._cond:
            self._run(self.requests.init())

    def begin(self) -> None:
        with self._cond:
            self.manager.begin()

    def admit(self, topic: str, partition: int) -> bool:
        """Under the producer's lock: ``TransactionRequests.admit``."""
        return self._run(self.requests.admit(topic, partition))

    def send_offsets(self, offsets: Mapping, group: Any) -> None:
        with self._cond:
            self._run(self.requests.send_offsets(offsets, group))

    def prepare_commit(self) -> None:
        """Before the flush: the transaction is committing (no more sends)."""
        with self._cond:
            self.manager.begin_commit()

    def commit(self) -> None:
        with self._cond:
            self._run(self.requests.commit())

    def prepare_abort(self) -> None:
        """Before the flush (which waits for the pending sends): the transaction is
        aborting."""
        with self._cond:
            self.manager.begin_abort()

    def abort(self) -> None:
        with self._cond:
            self._run(self.requests.abort())

    def _run(self, op: TxnOp[T]) -> T:
        """Drive ``op`` under the lock: its requests through ``request``, its backoffs as
        waits on the condition (the lock released meanwhile)."""
        try:
            step = next(op)
            while True:
                if isinstance(step, float):
                    until = time.monotonic() + step
                    while (left := until - time.monotonic()) > 0:
                        self._cond.wait(left)
                    step = op.send(None)
                    continue
                try:
                    reply = self._request(*step)
                except Exception as err:
                    step = op.throw(err)
                    continue
                step = op.send(reply)
        except StopIteration as stop:
            return stop.value
