"""The producer's sans-I/O sender (``mq.client.sender``) on its own: batches in, requests and
outcomes out, replies and the clock passed in — no socket, no thread."""

from __future__ import annotations

import threading

import pytest

from mq.client.idempotence import ProducerIdentity
from mq.client.producer_batches import Batch, TopicState
from mq.client.sender import MAX_BACKOFF_S, Sender
from mq.client.transaction_manager import TransactionManager, TxnState
from mq.errors import (
    DuplicateSequenceError,
    InvalidProducerEpochError,
    KafkaStorageError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordListTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from mq.log.batch import RecordBatch
from mq.protocol.messages import Api, Response

BACKOFF = 0.1
T0 = 1000.0


def topic(name: str = "t", partitions: int = 2) -> TopicState:
    info = TopicState(name)
    info.update(partitions, 16384, 1 << 20, T0)
    return info


def batch(info: TopicState, partition: int = 0, *values: bytes, now: float = T0) -> Batch:
    b = Batch(info, partition, 0, now, 0.005, threading.Lock(), [])
    for value in values or (b"v",):
        b.add(None, None, value, ())
    return b


def sender(acks: int = -1, max_in_flight: int = 5, retries: int = 5, ids=None, txn=None,
           request_timeout_s: float = 30.0, delivery_timeout_s: float = 120.0) -> Sender:
    return Sender(acks, max_in_flight, retries, BACKOFF, request_timeout_s, delivery_timeout_s,
                  ids, txn)


def identity(producer_id: int = 7, epoch: int = 0, transactional: bool = False):
    ids = ProducerIdentity(transactional)
    ids.set(producer_id, epoch)
    return ids


def ok(rid: int, base_offset: int, log_append_time: int = -1) -> Response:
    return Response(Api.PRODUCE, rid, 0, None, [base_offset, log_append_time])


def error(rid: int, err_type) -> Response:
    return Response(Api.PRODUCE, rid, err_type.code, "scripted", [])


class Wire:
    """Writes what the sender hands out, numbering requests as a connection does."""

    def __init__(self, s: Sender) -> None:
        self.s = s
        self.next_rid = 1
        self.written: list[tuple[int, Batch, bytes]] = []

    def pump(self, now: float, finished: list) -> list[int]:
        rids = []
        for b in self.s.requests(now, finished):
            rid, self.next_rid = self.next_rid, self.next_rid + 1
            self.written.append((rid, b, bytes(b.data)))
            self.s.sent(b, rid, now, finished)
            rids.append(rid)
        return rids


# --- queueing and sealing ---------------------------------------------------------------------

def test_queued_batches_are_sealed_with_consecutive_sequences_per_partition():
    info = topic()
    s = sender(ids=identity(42, 3))
    batches = [batch(info, 0, b"a", b"b"), batch(info, 1, b"c"), batch(info, 0, b"d")]
    for b in batches:
        assert s.enqueue(b) is False              # sealed at once: an id is known
    headers = [RecordBatch(bytes(b.data)) for b in batches]
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h in headers] == \
        [(42, 3, 0), (42, 3, 0), (42, 3, 2)]
    assert [b.seq for b in batches] == [1, 2, 3]
    assert list(s.ready) == batches and s.incomplete == set(batches)


def test_requests_go_out_in_order_up_to_max_in_flight():
    info = topic()
    s = sender(max_in_flight=2)
    batches = [batch(info, i % 2) for i in range(4)]
    for b in batches:
        s.enqueue(b)
    wire, finished = Wire(s), []
    assert wire.pump(T0, finished) == [1, 2]
    assert [b for _, b, _ in wire.written] == batches[:2]
    assert s.room == -2 and wire.pump(T0, finished) == []
    s.received([ok(1, 0)], T0, finished)
    assert finished == [(batches[0], 0, -1, None)]
    assert wire.pump(T0, finished) == [3]
    assert wire.written[-1][1] is batches[2]


def test_acks_0_outcomes_are_final_once_written():
    info = topic()
    s = sender(acks=0, max_in_flight=1)
    batches = [batch(info) for _ in range(3)]
    for b in batches:
        s.enqueue(b)
    finished: list = []
    Wire(s).pump(T0, finished)                    # no reply comes: nothing limits them
    assert finished == [(b, -1, -1, None) for b in batches]
    assert not s.in_flight and not s.incomplete
    assert all(b.attempts == 1 for b in batches)


def test_an_acknowledged_batch_gets_its_offsets():
    info = topic()
    s = sender()
    b = batch(info)
    s.enqueue(b)
    wire, finished = Wire(s), []
    wire.pump(T0, finished)
    s.received([ok(1, 17, 123456)], T0 + 0.01, finished)
    assert finished == [(b, 17, 123456, None)]
    assert not s.incomplete and not s.in_flight


# --- retries ----------------------------------------------------------------------------------

def test_a_retriable_error_is_retried_after_the_backoff_with_the_same_bytes():
    info = topic()
    s = sender(ids=identity())
    first, later, other = batch(info, 0, b"a"), batch(info, 0, b"b"), batch(info, 1, b"c")
    s.enqueue(first)
    wire, finished = Wire(s), []
    wire.pump(T0, finished)
    s.enqueue(later)
    s.enqueue(other)
    s.received([error(1, KafkaStorageError)], T0, finished)
    assert not finished and first.last_error is not None
    assert s.next_wake(T0, connected=True) == pytest.approx(T0 + BACKOFF)
    # The partition is muted: its later batch waits behind the retry; others go on.
    assert [b for b in s.requests(T0, finished)] == [other]
    s.unsent([other])
    assert s.requests(T0 + BACKOFF / 2, finished) == [other]
    s.unsent([other])
    assert [b for b in s.requests(T0 + BACKOFF, finished)] == [first, other]
    s.unsent([first, other])
    wire.pump(T0 + BACKOFF, finished)
    (_, b1, data1), (_, b2, data2) = wire.written[0], wire.written[1]
    assert b1 is b2 is first and data1 == data2     # the very same bytes, sequence and all
    assert first.attempts == 2
    s.received([ok(2, 0)], T0 + BACKOFF, finished)
    assert wire.pump(T0 + BACKOFF, finished) == [4]   # unmuted: the later batch goes
    assert wire.written[-1][1] is later


def test_the_backoff_doubles_per_attempt_up_to_a_second():
    info = topic()
    s = sender(retries=20, delivery_timeout_s=1e9)
    b = batch(info)
    s.enqueue(b)
    wire, finished, now = Wire(s), [], T0
    waits = []
    for _ in range(6):
        rid = wire.pump(now, finished)[0]
        s.received([error(rid, KafkaStorageError)], now, finished)
        waits.append(round(b.not_before - now, 6))
        now = b.not_before
    assert waits == [0.1, 0.2, 0.4, 0.8, MAX_BACKOFF_S, MAX_BACKOFF_S]
    assert not finished


def test_retries_exhausted_fail_the_batch_and_the_rest_of_its_partition():
    info = topic()
    ids = identity(7)
    s = sender(retries=1, max_in_flight=1, ids=ids)
    first, later = batch(info, 0, b"a"), batch(info, 0, b"b")
    s.enqueue(first)
    s.enqueue(later)
    wire, finished = Wire(s), []
    wire.pump(T0, finished)
    s.received([error(1, KafkaStorageError)], T0, finished)
    wire.pump(T0 + 1, finished)
    s.received([error(2, KafkaStorageError)], T0 + 1, finished)
    assert [(f[0], type(f[3])) for f in finished] == [(first, KafkaStorageError),
                                                      (later, KafkaStorageError)]
    # A gap in the partition's sequences: a plain idempotent producer wants a new id.
    assert s.awaiting_producer_id and s.wake and not ids.known
    assert s.producer_id_due(T0 + 1)
    assert not s.incomplete and not s.ready


def test_a_lost_connection_requeues_what_was_in_flight_in_order():
    info = topic()
    s = sender(ids=identity())
    batches = [batch(info, 0, b"%d" % i) for i in range(3)]
    for b in batches:
        s.enqueue(b)
    wire, finished = Wire(s), []
    wire.pump(T0, finished)
    s.connection_lost(RequestTimedOutError("gone"), T0, finished)
    assert not finished and list(s.ready) == batches and not s.in_flight
    # One at a time per partition until the first is acknowledged.
    assert wire.pump(T0, finished) == [4]
    assert wire.written[3][2] == wire.written[0][2]          # the same bytes again
    s.received([ok(4, 0)], T0, finished)
    assert wire.pump(T0, finished) == [5, 6]


def test_a_request_unanswered_too_long_times_out():
    info = topic()
    s = sender(request_timeout_s=30)
    s.enqueue(batch(info))
    Wire(s).pump(T0, [])
    assert s.timed_out(T0 + 30) is None
    assert isinstance(s.timed_out(T0 + 30.1), RequestTimedOutError)
    assert s.next_wake(T0, connected=True) == T0 + 30


def test_batches_held_back_too_long_fail_with_the_last_error():
    info = topic()
    s = sender(delivery_timeout_s=2)
    b = batch(info)
    s.enqueue(b)
    s.last_error = RequestTimedOutError("broker gone")
    finished: list = []
    s.expire(T0 + 1, connected=False, finished=finished)
    assert not finished
    assert s.next_wake(T0 + 1, connected=False) == T0 + 2
    s.expire(T0 + 3, connected=False, finished=finished)
    assert finished == [(b, -1, -1, s.last_error)]


def test_a_batch_too_large_for_the_broker_fails_instead_of_going_out():
    info = topic()
    s = sender()
    big = batch(info, 0, b"x" * 1000)
    s.enqueue(big)
    s.request_cap, s.broker_max_request = 600, 1112
    finished: list = []
    assert s.requests(T0, finished) == []
    assert finished[0][0] is big and isinstance(finished[0][3], RecordListTooLargeError)


def test_an_unknown_topic_fails_the_batch_and_asks_for_fresh_metadata():
    info = topic("gone")
    s = sender()
    b = batch(info)
    s.enqueue(b)
    finished: list = []
    Wire(s).pump(T0, finished)
    s.received([error(1, UnknownTopicOrPartitionError)], T0, finished)
    assert isinstance(finished[0][3], UnknownTopicOrPartitionError)
    assert s.stale_topics == ["gone"]


def test_a_non_retriable_error_is_final():
    info = topic()
    s = sender()
    b = batch(info)
    s.enqueue(b)
    finished: list = []
    Wire(s).pump(T0, finished)
    s.received([error(1, MessageTooLargeError)], T0, finished)
    assert isinstance(finished[0][3], MessageTooLargeError) and b.attempts == 1


# --- idempotence: sequence answers ------------------------------------------------------------

def test_a_duplicate_sequence_counts_as_delivered():
    info = topic()
    s = sender(ids=identity())
    b = batch(info)
    s.enqueue(b)
    finished: list = []
    Wire(s).pump(T0, finished)
    s.received([error(1, DuplicateSequenceError)], T0, finished)
    assert finished == [(b, -1, -1, None)]


def test_out_of_order_behind_a_retried_batch_waits_for_it():
    """The later batch of a partition comes back OutOfOrderSequence because the earlier one
    failed retriably: it is queued behind the retry, not failed."""
    info = topic()
    s = sender(ids=identity())
    first, second = batch(info, 0, b"a"), batch(info, 0, b"b")
    s.enqueue(first)
    s.enqueue(second)
    wire, finished = Wire(s), []
    wire.pump(T0, finished)
    s.received([error(1, KafkaStorageError), error(2, OutOfOrderSequenceError)], T0, finished)
    assert not finished and list(s.ready) == [first, second]
    wire.pump(T0 + BACKOFF, finished)
    assert [b for _, b, _ in wire.written[2:]] == [first]     # the retry alone
    s.received([ok(3, 0)], T0 + BACKOFF, finished)
    wire.pump(T0 + BACKOFF, finished)
    assert wire.written[-1][1] is second and wire.written[-1][2] == wire.written[1][2]


def test_out_of_order_with_nothing_pending_before_is_a_gap():
    info = topic()
    ids = identity(9)
    s = sender(ids=ids)
    b = batch(info)
    s.enqueue(b)
    finished: list = []
    Wire(s).pump(T0, finished)
    s.received([error(1, OutOfOrderSequenceError)], T0, finished)
    assert isinstance(finished[0][3], OutOfOrderSequenceError)
    assert s.awaiting_producer_id and not ids.known


def test_batches_wait_unsealed_for_a_new_producer_id_then_go_in_order():
    info = topic()
    ids = ProducerIdentity()
    s = sender(ids=ids)
    s.want_producer_id()
    batches = [batch(info, 0, b"a"), batch(info, 0, b"b", b"c"), batch(info, 1, b"d")]
    assert [s.enqueue(b) for b in batches] == [True] * 3     # waiting for an id
    assert s.hurry_producer_id(T0) is False                   # already due (retry_at 0)
    finished: list = []
    assert s.requests(T0, finished) == []
    assert s.producer_id_due(T0)
    s.producer_id_received(55, 2)
    sealed = [RecordBatch(bytes(b.data)) for b in batches]
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h in sealed] == \
        [(55, 2, 0), (55, 2, 1), (55, 2, 0)]
    assert s.requests(T0, finished) == batches


def test_a_failed_producer_id_request_counts_an_attempt_of_each_waiting_batch():
    info = topic()
    s = sender(ids=ProducerIdentity(), retries=1)
    s.want_producer_id()
    b = batch(info)
    s.enqueue(b)
    finished: list = []
    s.producer_id_failed(KafkaStorageError("disk full"), T0, finished)
    assert not finished and b.attempts == 1
    assert s.producer_id_retry_at == T0 + BACKOFF and not s.producer_id_due(T0)
    assert s.next_wake(T0, connected=True) == T0 + BACKOFF
    s.producer_id_failed(KafkaStorageError("disk full"), T0 + BACKOFF, finished)
    assert finished[0][0] is b and isinstance(finished[0][3], KafkaStorageError)
    assert s.producer_id_retry_at == pytest.approx(T0 + BACKOFF * 3)   # backoff doubled


# --- transactions -----------------------------------------------------------------------------

def in_transaction() -> TransactionManager:
    m = TransactionManager("txn-1", 60000)
    m.begin_init()
    m.initialized()
    m.begin()
    return m


def test_a_failed_batch_of_a_transaction_makes_it_abortable_and_keeps_the_id():
    info = topic()
    m = in_transaction()
    ids = identity(3, 1, transactional=True)
    s = sender(ids=ids, txn=m)
    b = batch(info)
    s.enqueue(b)
    assert RecordBatch(bytes(b.data)).is_transactional
    finished: list = []
    Wire(s).pump(T0, finished)
    s.received([error(1, MessageTooLargeError)], T0, finished)
    assert isinstance(finished[0][3], MessageTooLargeError)
    assert m.state is TxnState.ABORTABLE_ERROR and m.needs_epoch_bump
    assert ids.known and not s.awaiting_producer_id   # the abort takes a new epoch instead


def test_a_fenced_epoch_makes_the_transactional_producer_fatal():
    info = topic()
    m = in_transaction()
    s = sender(ids=identity(3, 1, transactional=True), txn=m)
    b = batch(info)
    s.enqueue(b)
    finished: list = []
    Wire(s).pump(T0, finished)
    s.received([error(1, InvalidProducerEpochError)], T0, finished)
    assert isinstance(finished[0][3], ProducerFencedError)
    assert m.state is TxnState.FATAL_ERROR
    with pytest.raises(ProducerFencedError):
        m.check_not_fatal()


def test_fail_all_fails_every_batch_not_yet_final():
    info = topic()
    s = sender(max_in_flight=1)
    batches = [batch(info) for _ in range(3)]
    for b in batches:
        s.enqueue(b)
    finished: list = []
    Wire(s).pump(T0, finished)
    err = RuntimeError("closed")
    s.fail_all(err, finished)
    assert sorted(f[0].seq for f in finished) == [1, 2, 3]
    assert all(f[3] is err for f in finished)
    assert not s.ready and not s.in_flight and not s.incomplete
