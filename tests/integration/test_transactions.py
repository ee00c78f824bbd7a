"""Transactions against the real broker: what read_committed and read_uncommitted consumers see
of committed, aborted and open transactions; consumed offsets committed with a transaction;
zombie fencing between two producer processes on one transactional id; a producer SIGKILLed
inside a transaction, aborted after its timeout; a broker restart in the middle of one.

Producers that must be separate processes (fencing, SIGKILL) are ``txn_workers.py``. Nothing
sleeps to wait: the tests poll consumers or the coordinator's state, each with a deadline.
"""

from __future__ import annotations

import threading
import time

import pytest
from brokers import create_topic
from txn_workers import TxnWorker

import mq
import mq.testing
from mq.client.admin import Admin
from mq.client.consumer import Consumer
from mq.client.producer import Producer
from mq.client.types import TopicPartition
from mq.errors import InvalidTxnStateError

WAIT = 30


@pytest.fixture(autouse=True)
def _close_leftover_producers():
    yield
    from mq.client import producer as producer_module
    for producer in list(producer_module._LIVE):
        producer.close(timeout=1)


def read(socket: str, topic: str, isolation: str, until=None, timeout: float = WAIT
         ) -> list[bytes]:
    """Every value a consumer with this isolation level returns from the start of ``topic``,
    up to the end (the last stable offset for read_committed) as it is now — or, with
    ``until``, until ``until(values)`` holds."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    with Consumer(topic, socket=socket, isolation_level=isolation, value_bytes=True) as c:
        tps = sorted(c.assignment())
        c.seek_to_beginning()
        ends = c.end_offsets(tps)

        def done() -> bool:
            if until is not None:
                return until(values)
            return all(c.position(tp) >= ends[tp] for tp in tps)
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{isolation} read of {topic} got {values}")
            for records in c.poll(timeout_ms=200).values():
                values.extend(r.value for r in records)
    return values


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


# --- visibility -------------------------------------------------------------------------------

def test_committed_is_visible_to_read_committed_and_aborted_is_not(broker):
    create_topic(broker, "out", 2)
    with Producer(socket=broker.socket, transactional_id="vis") as producer:
        producer.init_transactions()
        for prefix, commit in (("a", True), ("b", False), ("c", True)):
            producer.begin_transaction()
            for i, value in enumerate(values(prefix, 10)):
                producer.send("out", value=value, partition=i % 2)
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    committed = read(broker.socket, "out", "read_committed")
    everything = read(broker.socket, "out", "read_uncommitted")
    assert sorted(committed) == sorted(values("a", 10) + values("c", 10))
    assert sorted(everything) == sorted(values("a", 10) + values("b", 10) + values("c", 10))


def test_an_open_transaction_holds_read_committed_readers_at_the_last_stable_offset(broker):
    create_topic(broker, "lso", 1)
    with Producer(socket=broker.socket, transactional_id="lso") as producer, \
            Producer(socket=broker.socket) as plain:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("lso", value=b"in-txn", partition=0)
        producer.flush(timeout=WAIT)
        plain.send("lso", value=b"plain", partition=0).get(timeout=WAIT)
        assert read(broker.socket, "lso", "read_uncommitted") == [b"in-txn", b"plain"]
        assert read(broker.socket, "lso", "read_committed") == []      # stops at the LSO
        with Admin(broker.socket) as admin:
            desc = admin.describe_transaction("lso")
            assert desc["state"] == "Ongoing" and desc["partitions"] == [["lso", 0]]
        producer.commit_transaction()
    assert read(broker.socket, "lso", "read_committed") == [b"in-txn", b"plain"]


def test_misuse_raises_invalid_txn_state(broker):
    create_topic(broker, "m", 1)
    with Producer(socket=broker.socket, transactional_id="misuse") as producer:
        with pytest.raises(InvalidTxnStateError, match="init_transactions"):
            producer.begin_transaction()
        producer.init_transactions()
        with pytest.raises(InvalidTxnStateError, match="only once"):
            producer.init_transactions()
        with pytest.raises(InvalidTxnStateError, match="begin_transaction"):
            producer.send("m", value=b"x")
        for call in (producer.commit_transaction, producer.abort_transaction):
            with pytest.raises(InvalidTxnStateError):
                call()
        producer.begin_transaction()
        with pytest.raises(InvalidTxnStateError, match="a transaction is open"):
            producer.begin_transaction()
        producer.send("m", value=b"x").get(timeout=WAIT)
        producer.commit_transaction()
    assert isinstance(InvalidTxnStateError(), mq.MQError)


def test_threads_send_in_one_transaction(broker):
    create_topic(broker, "threads", 3)
    with Producer(socket=broker.socket, transactional_id="threads") as producer:
        producer.init_transactions()
        producer.begin_transaction()

        def send(n: int) -> None:
            for i in range(500):
                producer.send("threads", value=b"%d-%d" % (n, i), key=b"%d" % i)
        threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        producer.commit_transaction()
    got = read(broker.socket, "threads", "read_committed")
    assert sorted(got) == sorted(b"%d-%d" % (n, i) for n in range(4) for i in range(500))


# --- consumed offsets -------------------------------------------------------------------------

def test_send_offsets_commit_the_groups_offsets_only_with_the_transaction(broker):
    create_topic(broker, "in", 1)
    create_topic(broker, "out", 1)
    with Producer(socket=broker.socket) as plain:
        for value in values("in", 10):
            plain.send("in", value=value)
    tp = TopicPartition("in", 0)
    with Producer(socket=broker.socket, transactional_id="etl") as producer, \
            Admin(broker.socket) as admin:
        producer.init_transactions()
        # A group id without live members.
        producer.begin_transaction()
        producer.send("out", value=b"aborted")
        producer.send_offsets_to_transaction({tp: 4}, "etl-group")
        producer.abort_transaction()
        assert admin.list_group_offsets("etl-group") == {}
        producer.begin_transaction()
        producer.send("out", value=b"committed")
        producer.send_offsets_to_transaction({tp: (4, "four")}, "etl-group")
        assert admin.list_group_offsets("etl-group") == {}         # not before the commit
        producer.commit_transaction()
        assert admin.list_group_offsets("etl-group") == {tp: 4}
        # A live group member: consume, produce, commit its position in the transaction.
        with Consumer("in", group_id="etl-members", socket=broker.socket,
                      enable_auto_commit=False, value_bytes=True) as consumer:
            got: list = []
            deadline = time.monotonic() + WAIT
            while len(got) < 10 and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=200).values():
                    got.extend(records)
            assert [r.value for r in got] == values("in", 10)
            assert consumer.group_metadata().member_epoch > 0
            producer.begin_transaction()
            for r in got:
                producer.send("out", value=b"copy-" + r.value)
            producer.send_offsets_to_transaction({tp: consumer.position(tp)}, consumer)
            producer.commit_transaction()
            assert consumer.committed(tp) == 10
    out = read(broker.socket, "out", "read_committed")
    assert out == [b"committed"] + [b"copy-" + v for v in values("in", 10)]


def test_read_committed_consumers_wait_for_offsets_an_open_transaction_holds(broker):
    """KIP-447: while a transaction holds newer offsets of a partition, a read_committed
    group consumer neither starts there nor answers ``committed()`` from the old commit; it
    waits for the transaction's end. A read_uncommitted one is answered at once."""
    create_topic(broker, "in", 1)
    with Producer(socket=broker.socket) as plain:
        for value in values("in", 10):
            plain.send("in", value=value)
    tp = TopicPartition("in", 0)
    with Producer(socket=broker.socket, transactional_id="holder") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 3}, "g")
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 7}, "g")        # held, not yet committed
        with Consumer("in", group_id="g", socket=broker.socket, enable_auto_commit=False,
                      value_bytes=True) as uncommitted:
            assert uncommitted.committed(tp) == 3
        with Consumer("in", group_id="g", socket=broker.socket, enable_auto_commit=False,
                      isolation_level="read_committed", value_bytes=True) as consumer:
            mq.testing.wait_for(lambda: consumer.poll(timeout_ms=20) == {} and
                                tp in consumer.assignment(), timeout=WAIT,
                                message="the partition to be assigned")
            assert consumer.poll(timeout_ms=100) == {}             # not started at 3
            answers: list[int | None] = []
            asking = threading.Thread(target=lambda: answers.append(consumer.committed(tp)))
            asking.start()
            producer.commit_transaction()
            asking.join(WAIT)
            assert answers == [7]
            got: list = []
            mq.testing.wait_for(lambda: got.extend(
                r for rs in consumer.poll(timeout_ms=50).values() for r in rs) or len(got) >= 3,
                timeout=WAIT, message="records from offset 7")
            assert [r.offset for r in got] == [7, 8, 9]


# --- fencing ----------------------------------------------------------------------------------

def test_a_zombie_producer_process_is_fenced(broker):
    """Two processes with one transactional id: the second's init_transactions() fences the
    first, aborting its open transaction; the first's later send and commit raise
    ProducerFencedError, and read_committed readers see only the second's records."""
    create_topic(broker, "z", 2)
    old = TxnWorker(broker.socket, "zombie")
    new = TxnWorker(broker.socket, "zombie")
    try:
        old.ok("init")
        old.ok("begin")
        old.ok("send z 0 old-1")
        new.ok("init")                      # fences: old's transaction is aborted
        new.ok("begin")
        new.ok("send z 0 new-1")
        new.ok("send z 1 new-2")
        new.ok("commit")
        fenced = old.do("send z 1 old-2")   # a partition new to its transaction
        assert fenced == {"ok": False, "error": "ProducerFencedError",
                          "message": fenced["message"]}
        for command in ("commit", "abort", "begin", "send z 0 old-3"):
            answer = old.do(command)
            assert answer["error"] == "ProducerFencedError", (command, answer)
    finally:
        old.close()
        new.close()
    assert sorted(read(broker.socket, "z", "read_committed")) == [b"new-1", b"new-2"]
    assert b"old-1" in read(broker.socket, "z", "read_uncommitted")


def test_a_fenced_batch_on_a_partition_already_in_the_transaction(broker):
    """The zombie's batch for a partition it had added reaches the partition with its old
    epoch: refused there (InvalidProducerEpoch), reported as ProducerFencedError."""
    create_topic(broker, "zb", 1)
    old = TxnWorker(broker.socket, "zombie-batch")
    new = TxnWorker(broker.socket, "zombie-batch")
    try:
        old.ok("init")
        old.ok("begin")
        old.ok("send zb 0 old-1")
        new.ok("init")
        answer = old.do("send zb 0 old-2")
        assert answer["error"] == "ProducerFencedError", answer
        assert old.do("commit")["error"] == "ProducerFencedError"
    finally:
        old.close()
        new.close()
    assert read(broker.socket, "zb", "read_committed") == []


def test_a_killed_producers_transaction_is_aborted_after_its_timeout(broker):
    """A producer SIGKILLed with a transaction open: read_committed readers are held at the
    last stable offset until the coordinator aborts it (transaction_timeout_ms), then move
    past it; its records stay invisible."""
    create_topic(broker, "k", 1)
    worker = TxnWorker(broker.socket, "killed", transaction_timeout_ms=1000)
    try:
        worker.ok("init")
        worker.ok("begin")
        worker.ok("send k 0 doomed-1")
        worker.ok("send k 0 doomed-2")
        worker.kill()
    finally:
        worker.close()
    with Producer(socket=broker.socket) as plain:
        plain.send("k", value=b"after", partition=0).get(timeout=WAIT)
    assert read(broker.socket, "k", "read_committed",
                until=lambda got: b"after" in got) == [b"after"]
    with Admin(broker.socket) as admin:             # the markers came first: then the end
        mq.testing.wait_for(lambda: admin.describe_transaction("killed")["state"] ==
                            "CompleteAbort", timeout=WAIT, message="CompleteAbort")
        assert admin.describe_transaction("killed")["producer_epoch"] >= 1     # fenced
    assert read(broker.socket, "k", "read_uncommitted") == [b"doomed-1", b"doomed-2", b"after"]


# --- the broker restarts ----------------------------------------------------------------------

def test_a_transaction_survives_a_broker_kill_9(broker):
    create_topic(broker, "r", 2)
    with Producer(socket=broker.socket, transactional_id="restart", retries=20) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i, value in enumerate(values("before", 6)):
            producer.send("r", value=value, partition=i % 2)
        producer.flush(timeout=WAIT)
        broker.kill()
        broker.start()
        for i, value in enumerate(values("after", 6)):
            producer.send("r", value=value, partition=i % 2)
        producer.commit_transaction()
    assert sorted(read(broker.socket, "r", "read_committed")) == \
        sorted(values("before", 6) + values("after", 6))


def test_admin_lists_and_describes_transactional_ids(broker):
    create_topic(broker, "d", 1)
    with Producer(socket=broker.socket, transactional_id="desc-1") as producer, \
            Admin(broker.socket) as admin:
        producer.init_transactions()
        desc = admin.describe_transaction("desc-1")
        assert desc["state"] == "Empty" and desc["partitions"] == []
        assert desc["timeout_ms"] == 60000 and desc["producer_id"] >= 0
        producer.begin_transaction()
        producer.send("d", value=b"x", partition=0)
        producer.commit_transaction()
        listed = {row["transactional_id"]: row for row in admin.list_transactions()}
        assert listed["desc-1"]["state"] == "CompleteCommit"
        assert listed["desc-1"]["producer_id"] == desc["producer_id"]
        with pytest.raises(mq.errors.TransactionalIdNotFoundError):
            admin.describe_transaction("nope")
