"""The broker's idempotence and transaction apis, spoken at the protocol level against a real
broker subprocess: producer ids, duplicate answers and sequence checks (across kill -9),
transactions committed and aborted (markers, the last stable offset, ``.txnindex``,
read_committed consumers), offsets committed in a transaction, fencing, timeouts, and the
describe/list apis. (The Producer client's transactions are tested with the client.)"""

from __future__ import annotations

import errno
import time

import pytest
from brokers import create_topic
from test_write_faults_broker import InProcessBroker, scratch

import mq.testing
from mq.client.admin import Admin
from mq.client.connection import Connection
from mq.client.consumer import Consumer
from mq.client.types import TopicPartition
from mq.errors import (
    ConcurrentTransactionsError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    KafkaStorageError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    UnstableOffsetCommitError,
)
from mq.log import diskio
from mq.log.builder import BatchBuilder
from mq.log.diskio import Fault, FaultyDiskIO
from mq.log.reader import PartitionReader
from mq.protocol.messages import Api

TP = TopicPartition("t", 0)


@pytest.fixture
def broker(tmp_path):
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, "t", 2)
        yield b


def batch(pid: int, epoch: int, seq: int, values, *, txn: bool = False) -> bytes:
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                     is_transactional=txn)
    for v in values:
        b.append(1000, None, v)
    return bytes(b.build())


def produce(conn: Connection, data: bytes, partition: int = 0) -> int:
    return conn.call(Api.PRODUCE, "t", partition, -1, data)["first_offset"]


def read(b, isolation: str, partitions=(0,)) -> list[bytes]:
    return read_from(b.socket, isolation, partitions)


def read_from(sock: str, isolation: str, partitions=(0,)) -> list[bytes]:
    tps = [TopicPartition("t", p) for p in partitions]
    with Consumer(socket=sock, isolation_level=isolation, enable_auto_commit=False) as c:
        c.assign(tps)
        c.seek_to_beginning()
        ends = c.end_offsets(tps)                 # the LSO for read_committed
        out: list[bytes] = []
        deadline = time.monotonic() + 10
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline
            for records in c.poll(timeout_ms=200).values():
                out += [bytes(r.value) for r in records]
        return out


def init(conn: Connection, tid: str | None, timeout_ms: int = 60_000) -> tuple[int, int]:
    deadline = time.monotonic() + 10
    while True:
        try:
            return tuple(conn.call(Api.INIT_PRODUCER_ID, tid, timeout_ms).fields)
        except ConcurrentTransactionsError:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def slot_lso(b, partition: int = 0) -> tuple[int, int]:
    """(last stable offset, high watermark) as the broker publishes them."""
    tp = TopicPartition("t", partition)
    with Consumer(socket=b.socket, isolation_level="read_committed") as c:
        c.assign([tp])
        lso = c.end_offsets([tp])[tp]
    with Consumer(socket=b.socket) as c:
        c.assign([tp])
        hw = c.end_offsets([tp])[tp]
    return lso, hw


def describe_on(conn: Connection, tid: str) -> dict:
    [row] = conn.call(Api.DESCRIBE_TRANSACTIONS, [tid])["rows"]
    return row


def describe(b, tid: str) -> dict:
    with Connection(b.socket) as conn:
        return describe_on(conn, tid)


def test_producer_ids_are_unique_across_restarts(broker):
    with Connection(broker.socket) as conn:
        first = {init(conn, None)[0] for _ in range(3)}
    broker.kill()
    broker.start()
    with Connection(broker.socket) as conn:
        pid, epoch = init(conn, None)
    assert len(first) == 3 and pid not in first and epoch == 0


def test_a_retried_batch_gets_its_first_offset_and_is_not_appended_even_after_kill_9(broker):
    with Connection(broker.socket) as conn:
        pid, epoch = init(conn, None)
        assert produce(conn, batch(pid, epoch, 0, [b"a", b"b"])) == 0
        assert produce(conn, batch(pid, epoch, 2, [b"c"])) == 2
        assert produce(conn, batch(pid, epoch, 0, [b"a", b"b"])) == 0      # a retry
        with pytest.raises(OutOfOrderSequenceError):
            produce(conn, batch(pid, epoch, 7, [b"x"]))
    broker.kill()
    broker.start()
    with Connection(broker.socket) as conn:
        assert produce(conn, batch(pid, epoch, 2, [b"c"])) == 2            # still known
        assert produce(conn, batch(pid, epoch, 3, [b"d"])) == 3
    assert read(broker, "read_uncommitted") == [b"a", b"b", b"c", b"d"]


def test_commit_and_abort_with_the_last_stable_offset_and_the_txnindex(broker):
    with Connection(broker.socket) as conn:
        pid, epoch = init(conn, "billing")
        conn.call(Api.ADD_PARTITIONS_TO_TXN, "billing", pid, epoch, [["t", 0], ["t", 1]])
        produce(conn, batch(pid, epoch, 0, [b"c1", b"c2"], txn=True))
        produce(conn, batch(pid, epoch, 0, [b"c3"], txn=True), partition=1)
        assert slot_lso(broker) == (0, 2)               # undecided: read_committed waits
        assert read(broker, "read_committed") == []
        conn.call(Api.END_TXN, "billing", pid, epoch, 1)
        assert slot_lso(broker) == (3, 3)               # the marker is offset 2
        conn.call(Api.ADD_PARTITIONS_TO_TXN, "billing", pid, epoch, [["t", 0]])
        produce(conn, batch(pid, epoch, 2, [b"a1", b"a2"], txn=True))
        conn.call(Api.END_TXN, "billing", pid, epoch, 0)
    assert read(broker, "read_committed", (0, 1)) == [b"c1", b"c2", b"c3"]
    assert read(broker, "read_uncommitted") == [b"c1", b"c2", b"a1", b"a2"]
    with PartitionReader(f"{broker.data_dir}/t-0") as reader:
        entries = reader.aborted_transactions(0, 100)
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in entries] == [(pid, 3, 5)]
    row = describe(broker, "billing")
    assert row["state"] == "CompleteAbort" and row["producer_id"] == pid
    with Connection(broker.socket) as conn:
        assert conn.call(Api.LIST_TRANSACTIONS)["rows"] == [["billing", pid, "CompleteAbort"]]


def test_transactional_batches_only_on_partitions_of_the_open_transaction(broker):
    with Connection(broker.socket) as conn:
        pid, epoch = init(conn, "strict")
        with pytest.raises(InvalidTxnStateError, match="add the partition"):
            produce(conn, batch(pid, epoch, 0, [b"x"], txn=True))
        conn.call(Api.ADD_PARTITIONS_TO_TXN, "strict", pid, epoch, [["t", 0]])
        with pytest.raises(InvalidTxnStateError):
            produce(conn, batch(pid, epoch, 0, [b"x"], txn=True), partition=1)
        assert produce(conn, batch(pid, epoch, 0, [b"x"], txn=True)) == 0


def test_a_new_producer_fences_the_old_one_and_aborts_its_open_transaction(broker):
    with Connection(broker.socket) as old, Connection(broker.socket) as new:
        pid, epoch = init(old, "worker-1")
        old.call(Api.ADD_PARTITIONS_TO_TXN, "worker-1", pid, epoch, [["t", 0]])
        produce(old, batch(pid, epoch, 0, [b"zombie"], txn=True))
        with pytest.raises(ConcurrentTransactionsError):
            new.call(Api.INIT_PRODUCER_ID, "worker-1", 60_000)      # the abort starts
        pid2, epoch2 = init(new, "worker-1")
        assert (pid2, epoch2) == (pid, epoch + 2)
        with pytest.raises(ProducerFencedError):
            old.call(Api.END_TXN, "worker-1", pid, epoch, 1)
        with pytest.raises((InvalidProducerEpochError, InvalidTxnStateError)):
            produce(old, batch(pid, epoch, 1, [b"late"], txn=True))
    assert read(broker, "read_committed") == []
    assert slot_lso(broker)[0] == slot_lso(broker)[1]


def test_a_transaction_open_past_its_timeout_is_aborted_and_readers_move_on(broker):
    with Connection(broker.socket) as conn:
        pid, epoch = init(conn, "slow", timeout_ms=300)
        conn.call(Api.ADD_PARTITIONS_TO_TXN, "slow", pid, epoch, [["t", 0]])
        produce(conn, batch(pid, epoch, 0, [b"lost"], txn=True))
        conn.call(Api.PRODUCE, "t", 0, -1, _plain([b"after"]))
        mq.testing.wait_for(lambda: describe(broker, "slow")["state"] == "CompleteAbort",
                            timeout=10, message="the timed-out transaction's abort")
        assert slot_lso(broker)[0] == slot_lso(broker)[1]
        with pytest.raises(ProducerFencedError):
            conn.call(Api.END_TXN, "slow", pid, epoch, 1)
    assert read(broker, "read_committed") == [b"after"]


def _plain(values) -> bytes:
    b = BatchBuilder()
    for v in values:
        b.append(1000, None, v)
    return bytes(b.build())


def test_offsets_sent_to_a_transaction_count_only_when_it_commits(broker):
    group_tp = [["t", 0, 5, -1, ""]]
    with Connection(broker.socket) as conn:
        pid, epoch = init(conn, "etl")
        for commit, offset in ((0, 5), (1, 7)):
            conn.call(Api.ADD_OFFSETS_TO_TXN, "etl", pid, epoch, "g")
            group_tp[0][2] = offset
            conn.call(Api.TXN_OFFSET_COMMIT, "etl", "g", pid, epoch, "", -1, group_tp)
            fetched = conn.call(Api.OFFSET_FETCH, "g", [["t", 0]], 0)["rows"]
            assert fetched[0][2] == -1                  # pending until the marker
            # A read_committed consumer is told to wait instead (KIP-447).
            stable = conn.call(Api.OFFSET_FETCH, "g", [["t", 0]], 1)["rows"]
            assert stable[0][2] == -1 and stable[0][6] == UnstableOffsetCommitError.code
            conn.call(Api.END_TXN, "etl", pid, epoch, commit)
            for require_stable in (0, 1):
                fetched = conn.call(Api.OFFSET_FETCH, "g", [["t", 0]], require_stable)["rows"]
                assert fetched[0][2] == (-1 if not commit else 7) and fetched[0][6] == 0
        with pytest.raises(InvalidTxnStateError):
            conn.call(Api.TXN_OFFSET_COMMIT, "etl", "g", pid, epoch, "", -1, group_tp)
        conn.call(Api.ADD_OFFSETS_TO_TXN, "etl", pid, epoch, "g")
        conn.call(Api.TXN_OFFSET_COMMIT, "etl", "g", pid, epoch, "", -1, [["t", 0, 9, -1, ""]])
    broker.kill()                   # replayed from __consumer_offsets, the open one pending
    broker.start()
    with Connection(broker.socket) as conn:
        assert conn.call(Api.OFFSET_FETCH, "g", [["t", 0]], 0)["rows"][0][2] == 7
        stable = conn.call(Api.OFFSET_FETCH, "g", [["t", 0]], 1)["rows"]
        assert stable[0][6] == UnstableOffsetCommitError.code


def test_a_prepared_transaction_is_finished_by_the_next_start():
    """EndTxn's decision (PrepareCommit) is durable before any marker. Here the marker's
    fsync fails (the partition goes offline, the transaction stays prepared); the next start
    writes the markers and completes the commit."""
    with scratch() as (data_dir, sock):
        b = InProcessBroker(data_dir, sock).start()
        seam = FaultyDiskIO()
        with diskio.installed(seam), Connection(sock) as conn:
            with Admin(sock) as admin:
                admin.create_topic("t", 1)
            pid, epoch = init(conn, "crash")
            conn.call(Api.ADD_PARTITIONS_TO_TXN, "crash", pid, epoch, [["t", 0]])
            produce(conn, batch(pid, epoch, 0, [b"kept"], txn=True))
            seam.add(Fault(errno.EIO, ops=frozenset({"fdatasync"}), path_contains="/t-0/"))
            with pytest.raises(KafkaStorageError):
                conn.call(Api.END_TXN, "crash", pid, epoch, 1)
            assert describe_on(conn, "crash")["state"] == "PrepareCommit"
        b.stop()
        b.start()                                     # recovery, then recover(): markers
        with Connection(sock) as conn:
            mq.testing.wait_for(lambda: describe_on(conn, "crash")["state"] ==
                                "CompleteCommit", timeout=10,
                                message="the commit finished at restart")
        assert read_from(sock, "read_committed") == [b"kept"]
        b.stop()
