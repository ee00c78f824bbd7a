"""The transactional producer's state machine (Kafka's client ``TransactionManager``), pure: no
I/O, no clock. The producer calls it under its lock; ``transactions.py`` does the requests.

States and what moves between them::

    UNINITIALIZED --init_transactions--> INITIALIZING --InitProducerId ok--> READY
          ^                                   | (failed, not fenced: try init again)
          +-----------------------------------+
    READY --begin_transaction--> IN_TRANSACTION
    IN_TRANSACTION --commit_transaction--> COMMITTING --EndTxn(commit) ok--> READY
    IN_TRANSACTION | ABORTABLE_ERROR --abort_transaction--> ABORTING --EndTxn(abort) ok--> READY
    IN_TRANSACTION | COMMITTING --a send of the transaction failed--> ABORTABLE_ERROR
    any --fenced (a newer producer holds the id)--> FATAL_ERROR

- Misuse raises ``InvalidTxnStateError`` and changes nothing: init twice, begin twice or before
  init, send or send offsets outside a transaction, commit or abort without one.
- ``ABORTABLE_ERROR``: a record of the transaction could not be written (or a request of the
  transaction failed); the transaction can only be aborted, and sends, offsets and commit raise
  ``InvalidTxnStateError`` whose ``__cause__`` is that failure.
- ``FATAL_ERROR``: ``ProducerFencedError`` (a newer producer with the same transactional id
  took over; a partition's ``InvalidProducerEpochError`` means the same). Every later call
  raises it; only ``close()`` is left.
- A commit or abort whose EndTxn did not get through (timeout, broker gone) stays in
  ``COMMITTING``/``ABORTING``: calling the same method again finishes it.
- ``needs_epoch_bump``: a batch of the transaction failed for good, so the partition's sequence
  numbers have a gap; after the abort the producer takes a new epoch (InitProducerId again)
  and every partition starts at sequence 0 (Kafka's KIP-360).
"""

from __future__ import annotations

import enum
from typing import NoReturn

from mq.errors import (
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionalIdNotFoundError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)

__all__ = ["TransactionManager", "TxnState", "fenced", "is_fatal"]


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


# Errors of the coordinator apis after which the producer cannot go on (Kafka's fatal ones).
_FATAL = (ProducerFencedError, InvalidProducerEpochError, TransactionalIdNotFoundError,
          InvalidProducerIdMappingError, InvalidTxnStateError,
          TransactionCoordinatorFencedError, InvalidTransactionTimeoutError,
          UnknownProducerIdError)


def is_fatal(err: BaseException) -> bool:
    """Whether a coordinator api's error leaves the producer unusable."""
    return isinstance(err, _FATAL)


def fenced(err: BaseException) -> BaseException:
    """``ProducerFencedError`` for the partition's ``InvalidProducerEpochError`` (the same
    thing seen from a partition: a newer producer took over); other errors unchanged."""
    if isinstance(err, InvalidProducerEpochError):
        new = ProducerFencedError(f"fenced: a newer producer with this transactional id took "
                                  f"over ({err})")
        new.__cause__ = err
        return new
    return err


class TransactionManager:
    """State of one transactional producer; see the module doc."""

    __slots__ = (
        "error",
        "generation",
        "groups",
        "needs_epoch_bump",
        "partitions",
        "state",
        "timeout_ms",
        "transactional_id",
    )

    def __init__(self, transactional_id: str, timeout_ms: int) -> None:
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.state = TxnState.UNINITIALIZED
        self.partitions: set[tuple[str, int]] = set()   # added to the open transaction
        self.groups: set[str] = set()                   # AddOffsetsToTxn done for these
        self.error: BaseException | None = None         # the abortable or fatal error
        self.generation = 0                              # +1 at each begin_transaction
        self.needs_epoch_bump = False

    # --- checks ---------------------------------------------------------------------------------
    def _refuse(self, action: str, allowed: str) -> NoReturn:
        if self.state is TxnState.FATAL_ERROR:
            raise self.error                                # type: ignore[misc]
        hint = {TxnState.UNINITIALIZED: "call init_transactions() first",
                TxnState.INITIALIZING: "init_transactions() has not finished",
                TxnState.READY: "no transaction is open: call begin_transaction() first",
                TxnState.IN_TRANSACTION: "a transaction is open",
                TxnState.COMMITTING: "the transaction is being committed (call "
                                     "commit_transaction() again to finish)",
                TxnState.ABORTING: "the transaction is being aborted (call "
                                   "abort_transaction() again to finish)",
                TxnState.ABORTABLE_ERROR: "the transaction failed and can only be aborted "
                                          "(call abort_transaction())"}[self.state]
        err = InvalidTxnStateError(f"transactional producer {self.transactional_id!r}: cannot "
                                   f"{action} in state {self.state.value!r} ({allowed}); "
                                   f"{hint}")
        if self.state is TxnState.ABORTABLE_ERROR and self.error is not None:
            raise err from self.error
        raise err

    def check_not_fatal(self) -> None:
        if self.state is TxnState.FATAL_ERROR:
            raise self.error                                # type: ignore[misc]

    # --- init -----------------------------------------------------------------------------------
    def begin_init(self) -> None:
        if self.state is not TxnState.UNINITIALIZED:
            self._refuse("init_transactions()", "only once, first")
        self.state = TxnState.INITIALIZING

    def init_failed(self) -> None:
        if self.state is TxnState.INITIALIZING:
            self.state = TxnState.UNINITIALIZED

    def initialized(self) -> None:
        self.state = TxnState.READY
        self._clear()
        self.needs_epoch_bump = False

    # --- the transaction ------------------------------------------------------------------------
    def begin(self) -> None:
        if self.state is not TxnState.READY:
            self._refuse("begin_transaction()", "only after init_transactions() and the end "
                                                "of the previous transaction")
        self.state = TxnState.IN_TRANSACTION
        self.generation += 1

    def check_send(self, topic: str, partition: int) -> bool:
        """Raise unless a record may be sent now; True if its partition is in the
        transaction already (else AddPartitionsToTxn must succeed first)."""
        if self.state is not TxnState.IN_TRANSACTION:
            self._refuse("send()", "only inside a transaction")
        return (topic, partition) in self.partitions

    def partition_added(self, topic: str, partition: int, generation: int) -> None:
        if generation == self.generation and self.state is TxnState.IN_TRANSACTION:
            self.partitions.add((topic, partition))

    def check_offsets(self) -> None:
        if self.state is not TxnState.IN_TRANSACTION:
            self._refuse("send_offsets_to_transaction()", "only inside a transaction")

    def group_added(self, group: str, generation: int) -> None:
        if generation == self.generation and self.state is TxnState.IN_TRANSACTION:
            self.groups.add(group)

    @property
    def started(self) -> bool:
        """Whether the coordinator knows of the open transaction (so EndTxn is needed)."""
        return bool(self.partitions or self.groups)

    def begin_commit(self) -> None:
        if self.state is TxnState.COMMITTING:
            return                                          # a retry of an unfinished commit
        if self.state is not TxnState.IN_TRANSACTION:
            self._refuse("commit_transaction()", "only inside a transaction")
        self.state = TxnState.COMMITTING

    def check_commit(self) -> None:
        """After the flush: raise (the transaction is abortable) if a send failed."""
        if self.state is not TxnState.COMMITTING:
            self._refuse("commit_transaction()", "only inside a transaction")

    def begin_abort(self) -> None:
        if self.state is TxnState.ABORTING:
            return
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR):
            self._refuse("abort_transaction()", "only inside a transaction")
        self.state = TxnState.ABORTING

    def ended(self) -> None:
        """EndTxn succeeded: the coordinator has closed the transaction (an abort may still
        have its epoch bump to do)."""
        self.partitions = set()
        self.groups = set()

    def completed(self) -> None:
        """The commit or abort is done: ready for the next transaction."""
        self.state = TxnState.READY
        self._clear()

    def _clear(self) -> None:
        self.partitions = set()
        self.groups = set()
        self.error = None

    # --- failures -------------------------------------------------------------------------------
    def abortable(self, err: BaseException) -> None:
        """A send or request of the open transaction failed: only abort is left."""
        if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):
            self.state = TxnState.ABORTABLE_ERROR
            self.error = err

    def batch_failed(self, err: BaseException) -> BaseException:
        """A batch of this producer failed for good; returns the error its records get
        (``ProducerFencedError`` when fenced, which makes the producer fatal)."""
        err = fenced(err)
        if isinstance(err, ProducerFencedError):
            self.fatal(err)
        else:
            self.needs_epoch_bump = True
            self.abortable(err)
        return err

    def fatal(self, err: BaseException) -> None:
        if self.state is not TxnState.FATAL_ERROR:
            self.state = TxnState.FATAL_ERROR
            self.error = err

    def __repr__(self) -> str:
        return f"<TransactionManager {self.transactional_id!r} {self.state.value}>"
