"""Group commit without a broker or a socket: the pure ``FlushTracker`` (what the next fsync
covers, which replies wait for it, what a finished one acknowledges), then ``GroupCommit``
with its real flusher thread over real logs, its replies queued on real ``Connections``.
"""

from __future__ import annotations

import os
import select

import pytest

from mq import errors
from mq.broker.conns import Conn, Connections
from mq.broker.flushing import FlushJob, FlushTracker, GroupCommit
from mq.broker.partitions import Partition, PartitionTable
from mq.broker.wakeups import StatePublisher
from mq.log.builder import BatchBuilder
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.protocol.frames import FrameReader
from mq.protocol.messages import Api, response
from mq.protocol.state import StateReader, StateWriter


def batch() -> bytearray:
    builder = BatchBuilder()
    builder.append(1_000, None, b"value")
    return builder.build()


def conn(conn_id: int = 1) -> Conn:
    return Conn(sock=None, pid=1, reader=FrameReader(), conn_id=conn_id)


def part(partition: int) -> Partition:
    """A partition as the tracker sees it: a key with a name (no log behind it)."""
    return Partition("t", partition, log=None, slot=partition)


def reply(request_id: int) -> list:
    return response(Api.PRODUCE, request_id, 0, None, 0, -1, 0)


def sent(c: Conn) -> list[list]:
    reader = FrameReader()
    reader.feed(bytes(c.out))
    return list(reader.messages())


# --- the pure tracker ---------------------------------------------------------------------------

def test_hold_want_drop_take():
    t = FlushTracker()
    assert not t
    a, b, c = part(0), part(1), part(2)
    c1 = conn()
    t.hold(a, 5, c1, reply(1))
    t.want(a, 9)                             # held already: its offset stays
    t.want(b, 3)
    t.hold(c, 7)
    t.drop(c)
    assert t
    targets, replies, callbacks = t.take()
    assert targets == {a: 5, b: 3}
    assert replies == [(c1, reply(1), a)] and callbacks == []
    assert not t and t.take() == ({}, [], [])


def test_on_durable_covers_each_partitions_log_end_and_keeps_the_callback():
    t = FlushTracker()
    a, b = part(0), part(1)
    t.want(a, 0)
    def callback(failed):
        raise AssertionError("the tracker never calls it")
    t.on_durable({a: 4, b: 2}, callback)
    assert t
    targets, replies, callbacks = t.take()
    assert targets == {a: 4, b: 2}
    [(parts, called)] = callbacks
    assert parts == {a, b} and called is callback


def test_refuse_answers_what_cannot_be_synced_with_a_retriable_storage_error():
    a, b = part(0), part(1)
    c1, c2 = conn(1), conn(2)
    answers, kept = FlushTracker.refuse([(c1, reply(1), a), (c2, reply(2), b)],
                                        {a: OSError(24, "Too many open files")})
    assert kept == [(c2, reply(2), b)]
    [(who, message)] = answers
    assert who is c1 and message[:3] == [int(Api.PRODUCE), 1, errors.KafkaStorageError.code]
    assert message[3].startswith("t-0 could not be fsynced") and "nothing was acknowledged" in \
        message[3]
    assert errors.KafkaStorageError.retriable


def test_settle_acknowledges_only_what_the_fsync_covered():
    good, bad = part(0), part(1)
    c1, c2 = conn(1), conn(2)
    job = FlushJob({}, {good: 1, bad: 1}, [(c1, reply(1), good), (c2, reply(2), bad)],
                   failed={bad: OSError(5, "Input/output error")})
    [(w1, m1), (w2, m2)] = FlushTracker.settle(job)
    assert (w1, m1) == (c1, reply(1))
    assert w2 is c2 and m2[:3] == [int(Api.PRODUCE), 2, errors.KafkaStorageError.code]
    assert m2[3].startswith("t-1: fsync failed") and "offline" in m2[3]


# --- the loop's side, with the flusher thread ---------------------------------------------------

@pytest.fixture
def commit_over(tmp_path):
    made = []

    def make(durable: bool = False):
        plog = PartitionLog.open(os.path.join(tmp_path, "t-0"), LogConfig())
        plog.high_watermark_follows_log_end = not durable
        table = PartitionTable(slots=4)
        p = table.add("t", 0, plog)
        state = StateWriter(str(tmp_path), slots=4)
        conns = Connections(1 << 20)
        commit = GroupCommit(table, conns, StatePublisher(state, table))
        commit.start()
        made.append((commit, state, plog))
        return commit, p, conns, state
    yield make
    for commit, state, plog in made:
        commit.close()
        state.close()
        plog.close()


def run_round(commit: GroupCommit) -> None:
    """What the loop does: submit at the end of a round, then ``done`` once the pipe says so."""
    commit.submit()
    while commit.inflight:
        assert select.select([commit.fileno()], [], [], 10)[0], "the flusher never finished"
        commit.done()


def test_a_held_reply_is_sent_after_the_fsync_and_the_recovery_point_moves(commit_over):
    commit, p, conns, _ = commit_over()
    c = conn()
    p.log.append(batch())
    commit.ack_after_flush(p, c, reply(7))
    assert p.log.recovery_point == 0 and not c.out
    run_round(commit)
    assert p.log.recovery_point == 1
    assert sent(c) == [reply(7)] and conns.take_unsent() == {c}


def test_durable_mode_moves_the_high_watermark_and_publishes_it(commit_over, tmp_path):
    commit, p, _, _ = commit_over(durable=True)
    p.log.append(batch())
    assert p.log.high_watermark == 0
    commit.ack_after_flush(p)
    run_round(commit)
    assert p.log.high_watermark == 1
    reader = StateReader(str(tmp_path))
    try:
        assert reader.read(p.slot).high_watermark == 1
    finally:
        reader.close()


def test_an_offline_log_is_not_synced_and_its_replies_fail_at_once(commit_over):
    commit, p, _, _ = commit_over()
    c = conn()
    p.log.append(batch())
    commit.ack_after_flush(p, c, reply(3))
    p.log.take_offline("a test")
    commit.submit()
    assert commit.inflight == 0
    [message] = sent(c)
    assert message[:3] == [int(Api.PRODUCE), 3, errors.KafkaStorageError.code]
    assert p.log.recovery_point == 0


def test_the_periodic_flush_covers_what_acks_1_left_behind(commit_over):
    commit, p, _, _ = commit_over()
    p.log.append(batch())
    metadata_log = p.log                     # any log stands in; it is flushed in place
    commit.periodic(metadata_log)
    run_round(commit)
    assert p.log.recovery_point == 1
