"""The transactional producer's protocol against the scripted fake broker (``fake_broker.py``):
the order of its requests, retries of ConcurrentTransactions, what a failed send does to the
transaction, and fencing seen from a partition. The real broker's side is test_transactions.py.
"""

from __future__ import annotations

import fake_broker as fakes
import pytest

from mq.client.consumer import Consumer  # noqa: F401 -- the type send_offsets takes
from mq.client.producer import Producer
from mq.client.types import ConsumerGroupMetadata, TopicPartition
from mq.errors import (
    FencedMemberEpochError,
    InvalidTxnStateError,
    KafkaStorageError,
    ProducerFencedError,
)

fake_broker = fakes.fake_broker        # the fixture (fake_broker.py)
WAIT = 30
STORAGE_ERROR, INVALID_PRODUCER_EPOCH, CONCURRENT = 56, 47, 51


@pytest.fixture(autouse=True)
def _close_leftover_producers():
    yield
    from mq.client import producer as producer_module
    for producer in list(producer_module._LIVE):
        producer.close(timeout=1)


def ok(partition, values, attempt):
    return 0


def fields_of(fake, name: str) -> list:
    """The fields of every ``name`` request the fake got, in order."""
    return [event[1] for event in fake.events if event[0] == name]


def names(fake) -> list:
    """The requests after InitProducerId, as ``(API, partition or None)``."""
    out = []
    for event in fake.events:
        if event[0] == "PRODUCE":
            out.append(("PRODUCE", event[1]))
        elif event[0] == "ADD_PARTITIONS_TO_TXN":
            out.append((event[0], tuple(map(tuple, event[1][3]))))
        else:
            out.append((event[0], None))
    return out


def test_add_partitions_before_the_first_batch_of_each_partition_in_each_transaction(
        fake_broker):
    b = fake_broker(2, ok, sequences=True)
    with Producer(socket=b.path, transactional_id="t1", linger_ms=0) as producer:
        assert b.init_requests == []                      # not before init_transactions()
        producer.init_transactions()
        assert b.init_requests == [["t1", 60000]]
        for txn in range(2):
            producer.begin_transaction()
            futures = [producer.send("t", value=b"%d-%d" % (txn, i), partition=i % 2)
                       for i in range(6)]
            producer.commit_transaction()
            assert all(f.succeeded() for f in futures)
    events = names(b)
    assert events[0] == ("INIT_PRODUCER_ID", None)
    for txn_events in (events[1:events.index(("END_TXN", None)) + 1],
                       events[events.index(("END_TXN", None)) + 1:]):
        for p in (0, 1):
            added = txn_events.index(("ADD_PARTITIONS_TO_TXN", (("t", p),)))
            first = txn_events.index(("PRODUCE", p))
            assert added < first
        assert txn_events[-1] == ("END_TXN", None)
    end = fields_of(b, "END_TXN")
    assert end == [["t1", 1000, 0, 1], ["t1", 1000, 0, 1]]
    batches = [batch for batch in b.batches]
    assert all(pid == 1000 and epoch == 0 and transactional
               for _, pid, epoch, _, transactional, _ in batches)
    for p in (0, 1):                                      # sequences go on across transactions
        bases = [base for part, _, _, base, _, _ in batches if part == p]
        assert bases == sorted(bases) and bases[0] == 0


def test_an_empty_transaction_ends_without_end_txn(fake_broker):
    b = fake_broker(1, ok)
    with Producer(socket=b.path, transactional_id="t1") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.commit_transaction()
        producer.begin_transaction()
        producer.abort_transaction()
    assert names(b) == [("INIT_PRODUCER_ID", None)]


def test_concurrent_transactions_is_retried(fake_broker):
    # The coordinator answers CONCURRENT_TRANSACTIONS while it aborts a fenced transaction.
    b = fake_broker(1, ok, init_error=lambda n: CONCURRENT if n <= 3 else 0)
    with Producer(socket=b.path, transactional_id="t1", retry_backoff_ms=1) as producer:
        producer.init_transactions()
        assert len(b.init_requests) == 4
        calls = {"n": 0}

        def end_txn_busy(api, fields):
            calls["n"] += 1
            return CONCURRENT if calls["n"] <= 2 else 0
        b.txn_script = end_txn_busy
        producer.begin_transaction()
        producer.send("t", value=b"x", partition=0)
        producer.commit_transaction()
    assert calls["n"] == 4                                # AddPartitions twice, EndTxn twice


def test_init_gives_up_after_max_block_ms_and_can_be_called_again(fake_broker):
    b = fake_broker(1, ok, init_error=lambda n: CONCURRENT if n <= 1000 else 0)
    with Producer(socket=b.path, transactional_id="t1", retry_backoff_ms=1,
                  max_block_ms=200) as producer:
        with pytest.raises(TimeoutError, match="init_transactions.*max_block_ms"):
            producer.init_transactions()
        b.init_error = 0
        producer.init_transactions()
        producer.begin_transaction()


def test_a_failed_send_makes_commit_raise_and_the_abort_takes_a_new_epoch(fake_broker):
    def script(partition, values, attempt):
        return STORAGE_ERROR if values[0] == b"bad" else 0

    b = fake_broker(2, script, sequences=True)
    with Producer(socket=b.path, transactional_id="t1", linger_ms=0, retries=0) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        good = producer.send("t", value=b"good", partition=1)
        bad = producer.send("t", value=b"bad", partition=0)
        with pytest.raises(InvalidTxnStateError, match="abort_transaction") as info:
            producer.commit_transaction()
        assert isinstance(info.value.__cause__, KafkaStorageError)
        assert isinstance(bad.exception(), KafkaStorageError) and good.succeeded()
        with pytest.raises(InvalidTxnStateError, match="can only be aborted"):
            producer.send("t", value=b"more", partition=1)
        producer.abort_transaction()
        # The gap in partition 0's sequences: a new epoch, every partition at sequence 0.
        assert b.init_requests == [["t1", 60000], ["t1", 60000]]
        producer.begin_transaction()
        producer.send("t", value=b"next", partition=0).get(timeout=WAIT)
        producer.commit_transaction()
    end = [fields[3] for fields in fields_of(b, "END_TXN")]
    assert end == [0, 1]                                  # abort, then commit
    last = b.batches[-1]
    assert last[1:4] == (1000, 1, 0) and last[5] == [b"next"]


def test_fenced_on_a_partition_is_fatal(fake_broker):
    def script(partition, values, attempt):
        return INVALID_PRODUCER_EPOCH if values[0] == b"zombie" else 0

    b = fake_broker(1, script)
    with Producer(socket=b.path, transactional_id="t1", linger_ms=0) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        fut = producer.send("t", value=b"zombie", partition=0)
        with pytest.raises(ProducerFencedError):
            fut.get(timeout=WAIT)
        for call in (producer.commit_transaction, producer.abort_transaction,
                     producer.begin_transaction, producer.init_transactions,
                     lambda: producer.send("t", value=b"x", partition=0),
                     lambda: producer.send_offsets_to_transaction({("t", 0): 1}, "g")):
            with pytest.raises(ProducerFencedError):
                call()
    assert fields_of(b, "END_TXN") == []


def test_fenced_by_the_coordinator_is_fatal(fake_broker):
    b = fake_broker(1, ok, txn_script=lambda api, fields: 90)     # PRODUCER_FENCED
    with Producer(socket=b.path, transactional_id="t1") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(ProducerFencedError):
            producer.send("t", value=b"x", partition=0)
        with pytest.raises(ProducerFencedError):
            producer.commit_transaction()


def test_send_offsets_adds_the_group_once_then_commits_with_the_member(fake_broker):
    b = fake_broker(1, ok)
    with Producer(socket=b.path, transactional_id="t1") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        tp = TopicPartition("in", 0)
        producer.send_offsets_to_transaction({tp: 5}, "g")
        producer.send_offsets_to_transaction({tp: (9, "meta")},
                                             ConsumerGroupMetadata("g", "member-1", 7))
        producer.commit_transaction()
    assert [(name, fields) for name, fields in b.events if name != "INIT_PRODUCER_ID"] == [
        ("ADD_OFFSETS_TO_TXN", ["t1", 1000, 0, "g"]),
        ("TXN_OFFSET_COMMIT", ["t1", "g", 1000, 0, "", -1, [["in", 0, 5, -1, ""]]]),
        ("TXN_OFFSET_COMMIT", ["t1", "g", 1000, 0, "member-1", 7, [["in", 0, 9, -1, "meta"]]]),
        ("END_TXN", ["t1", 1000, 0, 1])]


def test_a_fenced_member_makes_the_transaction_abortable(fake_broker):
    def script(api, fields):
        return 110 if api.name == "TXN_OFFSET_COMMIT" else 0       # FENCED_MEMBER_EPOCH

    b = fake_broker(1, ok, txn_script=script)
    with Producer(socket=b.path, transactional_id="t1") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(FencedMemberEpochError):
            producer.send_offsets_to_transaction({("in", 0): 5},
                                                 ConsumerGroupMetadata("g", "m", 3))
        with pytest.raises(InvalidTxnStateError, match="can only be aborted"):
            producer.commit_transaction()
        producer.abort_transaction()
        producer.begin_transaction()


def test_a_non_transactional_producer_has_no_transactions(fake_broker):
    b = fake_broker(1, ok)
    with Producer(socket=b.path) as producer:
        for call in (producer.init_transactions, producer.begin_transaction,
                     producer.commit_transaction, producer.abort_transaction):
            with pytest.raises(InvalidTxnStateError, match="not a transactional producer"):
                call()
