"""The transactional producer's state machine, without a broker: what each call is allowed to
do in each state, what a failed batch or request does to the transaction, and that a fenced
producer raises ``ProducerFencedError`` from then on. Also ``transactions.py``'s argument
parsing (offsets and the group)."""

from __future__ import annotations

import pytest

from mq.client.transaction_manager import TransactionManager, TxnState, fenced, is_fatal
from mq.client.transactions import group_identity, offset_items
from mq.client.types import ConsumerGroupMetadata, TopicPartition
from mq.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    KafkaStorageError,
    MQError,
    ProducerFencedError,
    UnknownMemberIdError,
)

S = TxnState


def ready() -> TransactionManager:
    m = TransactionManager("billing-1", 60000)
    m.begin_init()
    m.initialized()
    return m


def in_txn() -> TransactionManager:
    m = ready()
    m.begin()
    return m


# --- the happy paths --------------------------------------------------------------------------

def test_init_begin_send_commit():
    m = TransactionManager("billing-1", 60000)
    assert m.state is S.UNINITIALIZED
    m.begin_init()
    assert m.state is S.INITIALIZING
    m.initialized()
    assert m.state is S.READY
    m.begin()
    assert m.state is S.IN_TRANSACTION and not m.started
    assert m.check_send("t", 0) is False              # AddPartitionsToTxn first
    m.partition_added("t", 0, m.generation)
    assert m.check_send("t", 0) is True and m.started
    m.begin_commit()
    assert m.state is S.COMMITTING
    m.check_commit()
    m.completed()
    assert m.state is S.READY and not m.started and m.partitions == set()


def test_abort_then_next_transaction():
    m = in_txn()
    m.partition_added("t", 0, m.generation)
    m.group_added("g", m.generation)
    m.begin_abort()
    assert m.state is S.ABORTING and m.started
    m.ended()
    assert not m.started
    m.completed()
    m.begin()
    assert m.state is S.IN_TRANSACTION and m.partitions == set() and m.groups == set()


def test_a_failed_init_can_be_tried_again():
    m = TransactionManager("x", 1000)
    m.begin_init()
    m.init_failed()
    assert m.state is S.UNINITIALIZED
    m.begin_init()
    m.initialized()
    assert m.state is S.READY


def test_an_addition_from_a_finished_transaction_is_not_carried_over():
    m = in_txn()
    generation = m.generation
    m.begin_abort()
    m.completed()
    m.begin()
    m.partition_added("t", 0, generation)              # the reply came after the abort
    m.group_added("g", generation)
    assert m.partitions == set() and m.groups == set()


def test_commit_and_abort_in_progress_can_be_called_again():
    m = in_txn()
    m.begin_commit()
    m.begin_commit()                                   # a retry after a timeout
    assert m.state is S.COMMITTING
    with pytest.raises(InvalidTxnStateError, match="being committed"):
        m.begin_abort()
    m = in_txn()
    m.begin_abort()
    m.begin_abort()
    assert m.state is S.ABORTING
    with pytest.raises(InvalidTxnStateError, match="being aborted"):
        m.begin_commit()


# --- misuse -----------------------------------------------------------------------------------

@pytest.mark.parametrize("make, call, message", [
    (ready, lambda m: m.begin_init(), "init_transactions.*only once"),
    (in_txn, lambda m: m.begin_init(), "init_transactions"),
    (lambda: TransactionManager("x", 1), lambda m: m.begin(), "call init_transactions"),
    (in_txn, lambda m: m.begin(), "begin_transaction.*a transaction is open"),
    (ready, lambda m: m.check_send("t", 0), "send.*only inside a transaction.*begin_transac"),
    (lambda: TransactionManager("x", 1), lambda m: m.check_send("t", 0), "init_transactions"),
    (ready, lambda m: m.check_offsets(), "send_offsets_to_transaction"),
    (ready, lambda m: m.begin_commit(), "commit_transaction.*no transaction is open"),
    (ready, lambda m: m.begin_abort(), "abort_transaction.*no transaction is open"),
    (lambda: TransactionManager("x", 1), lambda m: m.begin_abort(), "abort_transaction"),
])
def test_misuse_raises_invalid_txn_state_and_changes_nothing(make, call, message):
    m = make()
    before = m.state
    with pytest.raises(InvalidTxnStateError, match=message) as info:
        call(m)
    assert m.state is before
    assert "billing-1" in str(info.value) or "'x'" in str(info.value)
    assert isinstance(info.value, MQError)


def test_sends_are_refused_while_committing():
    m = in_txn()
    m.begin_commit()
    with pytest.raises(InvalidTxnStateError, match="being committed"):
        m.check_send("t", 0)


# --- failures ---------------------------------------------------------------------------------

def test_a_failed_batch_makes_the_transaction_abortable():
    m = in_txn()
    err = KafkaStorageError("disk")
    assert m.batch_failed(err) is err
    assert m.state is S.ABORTABLE_ERROR and m.needs_epoch_bump
    for call in (lambda: m.check_send("t", 0), m.begin_commit, m.check_offsets):
        with pytest.raises(InvalidTxnStateError, match="can only be aborted") as info:
            call()
        assert info.value.__cause__ is err
    m.begin_abort()
    m.completed()
    assert m.state is S.READY and m.error is None
    assert m.needs_epoch_bump                          # the producer bumps, then clears it


def test_a_batch_failing_during_the_commit_flush_fails_the_commit():
    m = in_txn()
    m.begin_commit()
    m.batch_failed(KafkaStorageError("disk"))
    with pytest.raises(InvalidTxnStateError, match="abort_transaction"):
        m.check_commit()
    m.begin_abort()
    assert m.state is S.ABORTING


def test_a_batch_failing_during_the_abort_only_asks_for_an_epoch_bump():
    m = in_txn()
    m.begin_abort()
    m.batch_failed(KafkaStorageError("disk"))
    assert m.state is S.ABORTING and m.needs_epoch_bump


def test_fencing_is_fatal_and_every_later_call_raises_it():
    m = in_txn()
    err = m.batch_failed(InvalidProducerEpochError("epoch 3 < 4"))
    assert isinstance(err, ProducerFencedError)
    assert isinstance(err.__cause__, InvalidProducerEpochError)
    assert m.state is S.FATAL_ERROR
    calls = [m.begin_init, m.begin, lambda: m.check_send("t", 0), m.check_offsets,
             m.begin_commit, m.begin_abort, m.check_not_fatal, m.check_commit]
    for call in calls:
        with pytest.raises(ProducerFencedError):
            call()
    m.fatal(ProducerFencedError("later"))              # the first fatal error stays
    assert m.error is err


def test_which_errors_are_fatal():
    assert is_fatal(ProducerFencedError()) and is_fatal(InvalidProducerEpochError())
    assert is_fatal(InvalidTxnStateError())
    assert not is_fatal(ConcurrentTransactionsError())
    assert not is_fatal(UnknownMemberIdError()) and not is_fatal(TimeoutError())
    plain = KafkaStorageError("x")
    assert fenced(plain) is plain


# --- arguments of send_offsets_to_transaction -------------------------------------------------

def test_offsets_as_ints_or_with_metadata():
    tp = TopicPartition("in", 3)
    assert offset_items({tp: 42}) == [["in", 3, 42, -1, ""]]
    assert offset_items({("in", 1): (7, "note")}) == [["in", 1, 7, -1, "note"]]
    assert offset_items({tp: (7, None)}) == [["in", 3, 7, -1, ""]]
    for bad in (-1, "5", (5, 6), True, None):
        with pytest.raises(ValueError, match="in-3"):
            offset_items({tp: bad})


def test_group_as_id_metadata_or_consumer():
    assert group_identity("billing") == ConsumerGroupMetadata("billing", "", -1, None)
    meta = ConsumerGroupMetadata("billing", "m-1", 4)
    assert group_identity(meta) is meta

    class FakeConsumer:
        def group_metadata(self):
            return meta
    assert group_identity(FakeConsumer()) is meta
    with pytest.raises(ValueError):
        group_identity("")
    with pytest.raises(TypeError, match="group id"):
        group_identity(42)
