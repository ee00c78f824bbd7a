"""The pure transaction coordinator and the ``__transaction_state`` record formats."""

from __future__ import annotations

import itertools
import struct

import pytest

from mq import errors
from mq.broker.transaction_log import (
    TxnMetadata,
    TxnState,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from mq.broker.txn_coordinator import MAX_EPOCH, TransactionCoordinator

T = 1_000


def coordinator() -> TransactionCoordinator:
    ids = itertools.count(100)
    return TransactionCoordinator(lambda: next(ids), max_timeout_ms=60_000)


def settle(c, t):
    """Make ``t`` durable, and if it prepares an end, its markers and the completion too."""
    job = c.record_written(t)
    if job is not None:
        done = c.markers_written(job, T)
        assert c.record_written(done) is None
    return job


def init(c, tid="billing", timeout=10_000, now=T):
    t = c.init_producer_id(tid, timeout, now)
    settle(c, t)
    return t.after


def test_init_allocates_then_bumps_the_epoch_and_fences_the_old_producer():
    c = coordinator()
    first = init(c)
    assert (first.producer_id, first.producer_epoch, first.state) == (100, 0, TxnState.EMPTY)
    second = init(c)
    assert (second.producer_id, second.producer_epoch) == (100, 1)
    with pytest.raises(errors.ProducerFencedError):
        c.add_partitions("billing", 100, 0, [("t", 0)], T)
    with pytest.raises(errors.InvalidProducerIdMappingError):
        c.add_partitions("billing", 7, 1, [("t", 0)], T)
    with pytest.raises(errors.TransactionalIdNotFoundError):
        c.add_partitions("nobody", 100, 1, [("t", 0)], T)
    with pytest.raises(errors.InvalidTransactionTimeoutError):
        c.init_producer_id("billing", 60_001, T)


def test_a_transaction_adds_partitions_then_commits_through_prepare_and_markers():
    c = coordinator()
    meta = init(c)
    t = c.add_partitions("billing", meta.producer_id, 0, [("a", 0), ("a", 1)], T + 1)
    settle(c, t)
    assert c.txns["billing"].state == TxnState.ONGOING
    assert c.txns["billing"].start_ms == T + 1
    assert c.add_partitions("billing", meta.producer_id, 0, [("a", 1)], T + 2) is None
    settle(c, c.add_partitions("billing", meta.producer_id, 0, [("__consumer_offsets", 0)],
                               T + 2))
    assert c.open_partitions(meta.producer_id, 0) == {("a", 0), ("a", 1),
                                                      ("__consumer_offsets", 0)}
    prepare = c.end_txn("billing", meta.producer_id, 0, True, T + 3)
    job = c.record_written(prepare)
    assert c.txns["billing"].state == TxnState.PREPARE_COMMIT
    assert job.commit and job.partitions == prepare.after.partitions
    with pytest.raises(errors.ConcurrentTransactionsError):     # in flight: retry
        c.add_partitions("billing", meta.producer_id, 0, [("a", 0)], T + 4)
    complete = c.markers_written(job, T + 5)
    assert c.record_written(complete) is None
    done = c.txns["billing"]
    assert done.state == TxnState.COMPLETE_COMMIT and done.partitions == frozenset()
    assert c.end_txn("billing", meta.producer_id, 0, True, T + 6) is None   # a retry
    with pytest.raises(errors.InvalidTxnStateError):
        c.end_txn("billing", meta.producer_id, 0, False, T + 6)
    assert c.open_partitions(meta.producer_id, 0) is None


def test_init_with_an_open_transaction_aborts_it_with_a_fencing_epoch_first():
    c = coordinator()
    meta = init(c)
    settle(c, c.add_partitions("billing", meta.producer_id, 0, [("a", 0)], T))
    fence = c.init_producer_id("billing", 10_000, T + 1)
    assert fence.retry and fence.after.state == TxnState.PREPARE_ABORT
    assert fence.after.producer_epoch == 1
    with pytest.raises(errors.ConcurrentTransactionsError):
        c.init_producer_id("billing", 10_000, T + 1)
    job = settle(c, fence)
    assert not job.commit and job.producer_epoch == 1 and job.partitions == {("a", 0)}
    assert c.txns["billing"].state == TxnState.COMPLETE_ABORT
    again = init(c)
    assert again.producer_epoch == 2 and again.state == TxnState.EMPTY
    with pytest.raises(errors.ProducerFencedError):
        c.end_txn("billing", meta.producer_id, 0, True, T + 2)


def test_transactions_past_their_timeout_are_fence_aborted():
    c = coordinator()
    meta = init(c, timeout=500)
    settle(c, c.add_partitions("billing", meta.producer_id, 0, [("a", 0)], T))
    assert c.expired(T + 500) == []
    [t] = c.expired(T + 501)
    assert t.after.state == TxnState.PREPARE_ABORT and t.after.producer_epoch == 1
    assert c.expired(T + 600) == []                        # under way: not twice
    settle(c, t)
    assert c.txns["billing"].state == TxnState.COMPLETE_ABORT


def test_a_bump_at_the_last_epoch_takes_a_new_producer_id():
    c = coordinator()
    c.load([("old", TxnMetadata("old", 5, MAX_EPOCH - 1, 1000, TxnState.EMPTY))])
    after = init(c, "old")
    assert (after.producer_id, after.producer_epoch) == (100, 0)


def test_load_and_recover_finish_prepared_transactions():
    c = coordinator()
    prepared = TxnMetadata("x", 9, 3, 1000, TxnState.PREPARE_ABORT, frozenset({("t", 2)}),
                           T, T)
    c.load([("x", TxnMetadata("x", 9, 2, 1000, TxnState.EMPTY)), ("x", prepared),
            ("gone", TxnMetadata("gone", 8, 0, 1000, TxnState.EMPTY)), ("gone", None)])
    assert set(c.txns) == {"x"} and c.transactional_id_of(9) == "x"
    [t] = c.recover()
    job = c.record_written(t)
    assert (job.producer_id, job.producer_epoch, job.commit) == (9, 3, False)
    assert c.record_written(c.markers_written(job, T)) is None
    assert c.txns["x"].state == TxnState.COMPLETE_ABORT and not c.pending


def test_abandon_leaves_the_state_as_it_was():
    c = coordinator()
    meta = init(c)
    t = c.add_partitions("billing", meta.producer_id, 0, [("a", 0)], T)
    c.abandon(t)
    assert c.txns["billing"].state == TxnState.EMPTY and not c.pending


def test_record_formats_are_kafkas():
    key = encode_key("billing")
    assert key == struct.pack(">hh", 0, 7) + b"billing" and decode_key(key) == "billing"
    meta = TxnMetadata("billing", 4242, 7, 60_000, TxnState.ONGOING,
                       frozenset({("b", 1), ("a", 0), ("a", 3)}), 1_700_000_000_123, 1_700)
    value = encode_value(meta)
    version, pid, epoch, timeout, status, topics = struct.unpack_from(">hqhibi", value)
    assert (version, pid, epoch, timeout, status, topics) == (0, 4242, 7, 60_000, 1, 2)
    assert value[21:23] == struct.pack(">h", 1) and value[23:24] == b"a"   # topics sorted
    assert decode_value("billing", value) == meta
    with pytest.raises(ValueError):
        decode_key(struct.pack(">hh", 1, 0))


def test_epoch_of_tells_the_current_epoch_of_a_producer_id():
    c = coordinator()
    meta = init(c)
    assert c.epoch_of(meta.producer_id) == 0 and c.epoch_of(12345) == -1
    init(c)
    assert c.epoch_of(meta.producer_id) == 1
