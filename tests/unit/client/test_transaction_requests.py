"""The transactional producer's requests (``mq.client.transactions.Transactions``) over a
scripted ``request`` instead of a connection: which requests a transaction makes, in which
states, and what retriable, fencing and lasting errors do to it."""

from __future__ import annotations

import threading

import pytest

from mq.client.idempotence import ProducerIdentity
from mq.client.transaction_manager import TransactionManager, TxnState
from mq.client.transactions import Transactions
from mq.errors import (
    ConcurrentTransactionsError,
    InvalidTxnStateError,
    KafkaStorageError,
    ProducerFencedError,
    UnknownTopicOrPartitionError,
)
from mq.protocol.messages import Api, Response


class Coordinator:
    """Answers requests from a script: ``errors[api]`` is a list of exceptions raised by the
    next calls of that api; otherwise a success (InitProducerId bumps the epoch)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.errors: dict[Api, list[BaseException]] = {}
        self.epoch = -1

    def request(self, deadline: float, api: Api, *fields):
        self.calls.append((api, *fields))
        pending = self.errors.get(api)
        if pending:
            raise pending.pop(0)
        if api is Api.INIT_PRODUCER_ID:
            self.epoch += 1
            return Response(api, len(self.calls), 0, None, [4000, self.epoch])
        return Response(api, len(self.calls), 0, None, [])

    def apis(self) -> list[Api]:
        return [call[0] for call in self.calls]


LOCK = threading.Condition()          # the producer's lock, which admit() runs under


def transactions(coordinator: Coordinator, max_block_s: float = 5.0):
    manager = TransactionManager("txn-a", 60000)
    ids = ProducerIdentity(transactional=True)
    txn = Transactions(manager, ids, LOCK, coordinator.request, max_block_s, 1.0, 0.001)
    return txn, manager, ids


def test_a_transaction_adds_its_partition_once_then_commits():
    c = Coordinator()
    txn, m, ids = transactions(c)
    txn.init()
    assert m.state is TxnState.READY and (ids.producer_id, ids.epoch) == (4000, 0)
    assert c.calls[0] == (Api.INIT_PRODUCER_ID, "txn-a", 60000)
    txn.begin()
    with LOCK:
        assert txn.admit("t", 1) is False         # AddPartitionsToTxn, then look again
        assert txn.admit("t", 1) is True
    txn.prepare_commit()
    assert m.state is TxnState.COMMITTING
    txn.commit()
    assert m.state is TxnState.READY
    assert c.apis() == [Api.INIT_PRODUCER_ID, Api.ADD_PARTITIONS_TO_TXN, Api.END_TXN]
    assert c.calls[1] == (Api.ADD_PARTITIONS_TO_TXN, "txn-a", 4000, 0, [["t", 1]])
    assert c.calls[2] == (Api.END_TXN, "txn-a", 4000, 0, 1)


def test_an_empty_transaction_ends_without_end_txn():
    c = Coordinator()
    txn, m, _ = transactions(c)
    txn.init()
    txn.begin()
    txn.prepare_abort()
    txn.abort()
    assert m.state is TxnState.READY and c.apis() == [Api.INIT_PRODUCER_ID]


def test_concurrent_transactions_is_retried_until_it_succeeds():
    c = Coordinator()
    c.errors[Api.INIT_PRODUCER_ID] = [ConcurrentTransactionsError("previous one ending")] * 3
    txn, m, ids = transactions(c)
    txn.init()
    assert m.state is TxnState.READY and ids.epoch == 0
    assert c.apis().count(Api.INIT_PRODUCER_ID) == 4


def test_a_commit_that_times_out_stays_committing_and_finishes_when_called_again():
    c = Coordinator()
    txn, m, _ = transactions(c, max_block_s=0.05)
    txn.init()
    txn.begin()
    with LOCK:
        txn.admit("t", 0)
    c.errors[Api.END_TXN] = [ConcurrentTransactionsError("busy")] * 1000
    txn.prepare_commit()
    with pytest.raises(TimeoutError, match="commit_transaction"):
        txn.commit()
    assert m.state is TxnState.COMMITTING
    c.errors[Api.END_TXN] = []
    txn.prepare_commit()                          # calling commit_transaction() again
    txn.commit()
    assert m.state is TxnState.READY


def test_fencing_makes_the_producer_fatal():
    c = Coordinator()
    txn, m, _ = transactions(c)
    txn.init()
    txn.begin()
    c.errors[Api.ADD_PARTITIONS_TO_TXN] = [ProducerFencedError("newer producer")]
    with LOCK, pytest.raises(ProducerFencedError):
        txn.admit("t", 0)
    assert m.state is TxnState.FATAL_ERROR
    with pytest.raises(ProducerFencedError):
        txn.prepare_abort()


def test_a_lasting_error_of_a_transactions_request_makes_it_abortable():
    c = Coordinator()
    txn, m, _ = transactions(c)
    txn.init()
    txn.begin()
    c.errors[Api.ADD_PARTITIONS_TO_TXN] = [UnknownTopicOrPartitionError("deleted")]
    with LOCK, pytest.raises(UnknownTopicOrPartitionError):
        txn.admit("t", 0)
    assert m.state is TxnState.ABORTABLE_ERROR
    with pytest.raises(InvalidTxnStateError) as refused:
        txn.prepare_commit()
    assert isinstance(refused.value.__cause__, UnknownTopicOrPartitionError)
    txn.prepare_abort()
    txn.abort()
    assert m.state is TxnState.READY


def test_an_abort_after_a_failed_batch_takes_a_new_epoch():
    c = Coordinator()
    txn, m, ids = transactions(c)
    txn.init()
    txn.begin()
    with LOCK:
        txn.admit("t", 0)
    m.batch_failed(KafkaStorageError("retries exhausted"))    # as the sender reports it
    assert m.state is TxnState.ABORTABLE_ERROR and m.needs_epoch_bump
    with pytest.raises(InvalidTxnStateError):
        txn.prepare_commit()
    txn.prepare_abort()
    txn.abort()
    assert c.apis()[-2:] == [Api.END_TXN, Api.INIT_PRODUCER_ID]
    assert c.calls[-2][-1] == 0                   # EndTxn(abort)
    assert m.state is TxnState.READY and ids.epoch == 1 and not m.needs_epoch_bump
