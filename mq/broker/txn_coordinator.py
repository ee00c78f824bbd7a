"""The transaction coordinator, pure: Kafka's TransactionCoordinator state machine without I/O.

Each transactional id has one ``TxnMetadata`` (``transaction_log``): its producer id and
epoch, timeout, state and the partitions of its open transaction. A request becomes a
``Transition`` (the metadata it leads to); the broker appends ``transition.after`` to
``__transaction_state``, and once that record is durable calls ``record_written``. At most one
transition per id is in flight; another request for the id meanwhile gets
``CONCURRENT_TRANSACTIONS`` (retriable). Ending a transaction takes two records::

    Ongoing --EndTxn--> PrepareCommit/PrepareAbort  (durable: the decision is made)
        record_written() -> MarkerJob: write COMMIT/ABORT markers to every partition of the
                            transaction (``__consumer_offsets`` included), make them durable
        markers_written() -> the CompleteCommit/CompleteAbort transition, written the same way

After a restart the broker replays ``__transaction_state`` (``load``) and finishes every
transaction found in a Prepare state (``recover``): markers are idempotent on a partition (a
second marker for a closed transaction closes nothing).

Fencing: ``init_producer_id`` for an id in use bumps its epoch (a new producer id once the
epoch would pass 32766), so the previous holder's requests fail with ``ProducerFencedError``
and its batches with ``InvalidProducerEpochError`` on the partitions. An id with an open
transaction is fenced by aborting that transaction with the bumped epoch first; the new
producer retries until the abort completed (Kafka's PrepareEpochFence path). ``expired`` does
the same for transactions open longer than their timeout (a producer that went away).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from mq import errors
from mq.broker.transaction_log import TxnMetadata, TxnState

__all__ = ["MAX_EPOCH", "MarkerJob", "TransactionCoordinator", "Transition"]

MAX_EPOCH = 32767                   # Short.MAX_VALUE; a bump at MAX_EPOCH - 1 takes a new id
_PREPARE = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
_COMPLETE = (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    """A change to make durable: ``after`` is the record to append. ``retry``: once it is
    under way, answer the request with ``CONCURRENT_TRANSACTIONS`` (a fence in progress)."""

    before: TxnMetadata | None
    after: TxnMetadata
    retry: bool = False

    @property
    def transactional_id(self) -> str:
        return self.after.transactional_id


@dataclasses.dataclass(frozen=True, slots=True)
class MarkerJob:
    """Markers to write: one per partition, for ``producer_id`` at ``producer_epoch``;
    ``marked`` collects the partitions done (a retry writes only the rest)."""

    transition: Transition
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[tuple[str, int]]
    marked: set[tuple[str, int]] = dataclasses.field(default_factory=set, compare=False)


class TransactionCoordinator:
    """All transactional ids' state. ``allocate_producer_id()`` hands out producer ids that
    are never reused (the broker persists them)."""

    def __init__(self, allocate_producer_id: Callable[[], int], *,
                 max_timeout_ms: int = 900_000) -> None:
        self.allocate_producer_id = allocate_producer_id
        self.max_timeout_ms = max_timeout_ms
        self.txns: dict[str, TxnMetadata] = {}
        self.pending: dict[str, Transition] = {}
        self._by_producer: dict[int, str] = {}

    # --- loading ------------------------------------------------------------------------------
    def load(self, records: Iterable[tuple[str, TxnMetadata | None]]) -> None:
        """Replay ``__transaction_state`` (a ``None`` value removes the id)."""
        for tid, meta in records:
            self._set(tid, meta)

    def recover(self) -> list[Transition]:
        """Transitions to drive to their end after a restart: every transaction left in a
        Prepare state (its markers may be missing). Marks them pending."""
        out = []
        for meta in list(self.txns.values()):
            if meta.state in _PREPARE and meta.transactional_id not in self.pending:
                t = Transition(meta, meta)
                self.pending[meta.transactional_id] = t
                out.append(t)
        return out

    def _set(self, tid: str, meta: TxnMetadata | None) -> None:
        old = self.txns.pop(tid, None)
        if old is not None and self._by_producer.get(old.producer_id) == tid:
            del self._by_producer[old.producer_id]
        if meta is not None:
            self.txns[tid] = meta
            self._by_producer[meta.producer_id] = tid

    # --- requests -----------------------------------------------------------------------------
    def _idle(self, tid: str) -> TxnMetadata | None:
        if tid in self.pending:
            raise errors.ConcurrentTransactionsError(
                f"transactional id {tid!r} is completing a transaction; retry")
        return self.txns.get(tid)

    def _owned(self, tid: str, producer_id: int, epoch: int) -> TxnMetadata:
        meta = self._idle(tid)
        if meta is None:
            raise errors.TransactionalIdNotFoundError(f"unknown transactional id {tid!r}")
        if meta.producer_id != producer_id:
            raise errors.InvalidProducerIdMappingError(
                f"producer id {producer_id} does not hold transactional id {tid!r}")
        if epoch != meta.producer_epoch:
            raise errors.ProducerFencedError(
                f"producer epoch {epoch} of {tid!r} is fenced: epoch {meta.producer_epoch} "
                "belongs to a newer producer")
        if meta.state in _PREPARE:
            raise errors.ConcurrentTransactionsError(
                f"transactional id {tid!r} is completing a transaction; retry")
        return meta

    def init_producer_id(self, tid: str, timeout_ms: int, now_ms: int) -> Transition:
        """``InitProducerId`` for ``tid``: a new id, or the next epoch of the existing one."""
        if not 1 <= timeout_ms <= self.max_timeout_ms:
            raise errors.InvalidTransactionTimeoutError(
                f"transaction_timeout_ms {timeout_ms} is outside 1..{self.max_timeout_ms}")
        meta = self._idle(tid)
        if meta is None:
            after = TxnMetadata(tid, self.allocate_producer_id(), 0, timeout_ms,
                                TxnState.EMPTY, frozenset(), now_ms, -1)
            return self._begin(Transition(None, after))
        if meta.state in _PREPARE or meta.state == TxnState.PREPARE_EPOCH_FENCE:
            raise errors.ConcurrentTransactionsError(
                f"transactional id {tid!r} is completing a transaction; retry")
        if meta.state == TxnState.ONGOING:
            return self._begin(self._fence_abort(meta, now_ms, retry=True))
        pid, epoch = self._next_epoch(meta)
        after = dataclasses.replace(meta, producer_id=pid, producer_epoch=epoch,
                                    timeout_ms=timeout_ms, state=TxnState.EMPTY,
                                    partitions=frozenset(), last_update_ms=now_ms, start_ms=-1)
        return self._begin(Transition(meta, after))

    def add_partitions(self, tid: str, producer_id: int, epoch: int,
                       partitions: Iterable[tuple[str, int]], now_ms: int
                       ) -> Transition | None:
        """``AddPartitionsToTxn`` (and ``AddOffsetsToTxn``, with the group's offsets
        partition): None when the transaction holds them already."""
        meta = self._owned(tid, producer_id, epoch)
        wanted = frozenset(partitions)
        if meta.state == TxnState.ONGOING:
            if wanted <= meta.partitions:
                return None
            after = dataclasses.replace(meta, partitions=meta.partitions | wanted,
                                        last_update_ms=now_ms)
        else:
            after = dataclasses.replace(meta, state=TxnState.ONGOING, partitions=wanted,
                                        last_update_ms=now_ms, start_ms=now_ms)
        return self._begin(Transition(meta, after))

    def end_txn(self, tid: str, producer_id: int, epoch: int, commit: bool, now_ms: int
                ) -> Transition | None:
        """``EndTxn``: the Prepare transition, or None for a retry of an end already done."""
        meta = self._owned(tid, producer_id, epoch)
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        if meta.state == done:
            return None
        if meta.state != TxnState.ONGOING:
            raise errors.InvalidTxnStateError(
                f"cannot {'commit' if commit else 'abort'} transactional id {tid!r}: it is "
                f"{meta.state.kafka_name}, no transaction is open")
        after = dataclasses.replace(
            meta, state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
            last_update_ms=now_ms)
        return self._begin(Transition(meta, after))

    def expired(self, now_ms: int) -> list[Transition]:
        """Fence-aborts of open transactions past their timeout (producers that went away)."""
        out = []
        for meta in list(self.txns.values()):
            if meta.state == TxnState.ONGOING and meta.transactional_id not in self.pending \
                    and now_ms - meta.start_ms > meta.timeout_ms:
                out.append(self._begin(self._fence_abort(meta, now_ms)))
        return out

    def _fence_abort(self, meta: TxnMetadata, now_ms: int, retry: bool = False) -> Transition:
        """Abort ``meta``'s open transaction with the next epoch: markers of that epoch fence
        the producer that opened it."""
        if meta.producer_epoch >= MAX_EPOCH - 1:
            epoch = meta.producer_epoch       # cannot bump: the next init takes a new id
        else:
            epoch = meta.producer_epoch + 1
        after = dataclasses.replace(meta, producer_epoch=epoch, state=TxnState.PREPARE_ABORT,
                                    last_update_ms=now_ms)
        return Transition(meta, after, retry)

    def _next_epoch(self, meta: TxnMetadata) -> tuple[int, int]:
        if meta.producer_epoch >= MAX_EPOCH - 1:
            return self.allocate_producer_id(), 0
        return meta.producer_id, meta.producer_epoch + 1

    def _begin(self, t: Transition) -> Transition:
        self.pending[t.transactional_id] = t
        return t

    # --- completions --------------------------------------------------------------------------
    def record_written(self, t: Transition) -> MarkerJob | None:
        """``t.after`` is durable in ``__transaction_state``. For a Prepare state, returns the
        markers to write next (call ``markers_written`` once they are durable); otherwise the
        transition is done."""
        self._set(t.transactional_id, t.after)
        if t.after.state in _PREPARE:
            return MarkerJob(t, t.after.producer_id, t.after.producer_epoch,
                             t.after.state == TxnState.PREPARE_COMMIT, t.after.partitions)
        if self.pending.get(t.transactional_id) is t:
            del self.pending[t.transactional_id]
        return None

    def markers_written(self, job: MarkerJob, now_ms: int) -> Transition:
        """The markers of ``job`` are durable: the Complete transition to write."""
        meta = job.transition.after
        after = dataclasses.replace(
            meta, state=TxnState.COMPLETE_COMMIT if job.commit else TxnState.COMPLETE_ABORT,
            partitions=frozenset(), last_update_ms=now_ms, start_ms=-1)
        t = Transition(meta, after)
        self.pending[t.transactional_id] = t
        return t

    def abandon(self, t: Transition) -> None:
        """``t`` could not be written: nothing changed (a Prepare record that may have reached
        the log is finished by the next restart's ``recover``)."""
        if self.pending.get(t.transactional_id) is t:
            del self.pending[t.transactional_id]

    # --- facts --------------------------------------------------------------------------------
    def open_partitions(self, producer_id: int, epoch: int) -> frozenset[tuple[str, int]] | None:
        """The partitions of the transaction ``producer_id`` has open at ``epoch``, or None
        (no such transaction)."""
        tid = self._by_producer.get(producer_id)
        meta = self.txns.get(tid) if tid is not None else None
        if meta is None or meta.producer_epoch != epoch or meta.state != TxnState.ONGOING:
            return None
        return meta.partitions

    def transactional_id_of(self, producer_id: int) -> str | None:
        return self._by_producer.get(producer_id)

    def epoch_of(self, producer_id: int) -> int:
        """The current epoch of the transactional id ``producer_id`` holds (-1: none)."""
        tid = self._by_producer.get(producer_id)
        meta = self.txns.get(tid) if tid is not None else None
        return -1 if meta is None else meta.producer_epoch
