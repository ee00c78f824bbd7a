"""The producer's open batches (``mq.client.batch_accumulator``) on their own: which batches
are due at a given ``now`` with a given room in flight — no socket, no thread, no clock."""

from __future__ import annotations

import math
import threading

from mq.client.batch_accumulator import BatchAccumulator
from mq.client.producer_batches import TopicState
from mq.log.layout import MAX_RECORD_OVERHEAD

T0 = 500.0
LINGER = 0.005


def topic(batch_limit: int = 1000, grow_limit: int = 4000, partitions: int = 3) -> TopicState:
    info = TopicState("t")
    info.update(partitions, batch_limit, grow_limit, T0)
    return info


def accumulator(linger_s: float = LINGER, acks: int = 1, hook=None) -> BatchAccumulator:
    return BatchAccumulator(0, linger_s, acks, threading.Lock(), hook)


def test_a_batch_is_due_when_its_linger_runs_out_and_there_is_room():
    acc, info = accumulator(), topic()
    b = acc.open_batch(info, 0, T0)
    b.add(None, None, b"v", ())
    assert info.open[0] is b and len(acc) == 1
    assert acc.next_due(T0, room=1) == T0 + LINGER
    assert acc.due(T0 + LINGER / 2, room=1) == []
    assert acc.due(T0 + LINGER, room=0) == []            # no room in flight: it waits
    assert acc.next_due(T0, room=0) == math.inf
    assert acc.due(T0 + LINGER, room=1) == [b]
    assert info.open[0] is None and len(acc) == 0


def test_lingered_batches_close_oldest_first_as_far_as_room_goes():
    acc, info = accumulator(), topic()
    batches = [acc.open_batch(info, p, T0 + p * 0.001) for p in range(3)]
    assert acc.due(T0 + 1, room=2) == batches[:2]
    assert acc.due(T0 + 1, room=5) == batches[2:]


def test_without_acks_nothing_waits_for_room():
    acc, info = accumulator(acks=0), topic()
    batches = [acc.open_batch(info, p, T0) for p in range(3)]
    assert acc.next_due(T0, room=-4) == T0 + LINGER
    assert acc.due(T0 + LINGER, room=-4) == batches


def test_a_full_batch_closes_at_once_when_there_is_room():
    acc, info = accumulator(), topic(batch_limit=150)
    b = acc.open_batch(info, 0, T0)
    b.add(None, None, b"x" * 40, ())
    need = b.records.size + 40 + MAX_RECORD_OVERHEAD
    assert need > info.batch_limit
    assert acc.settle(b, info, need, room=1) is True
    assert acc.settle(b, info, b.records.size, room=1) is False    # the next one fits


def test_without_room_a_full_batch_keeps_filling_up_to_the_grow_limit():
    acc, info = accumulator(), topic(batch_limit=100, grow_limit=300)
    b = acc.open_batch(info, 0, T0)
    b.add(None, None, b"x" * 60, ())
    assert acc.may_grow(b, info, 60, room=0)
    assert not acc.may_grow(b, info, 60, room=1)            # room: close it instead
    assert not acc.may_grow(b, info, 400, room=0)           # past the grow limit
    assert acc.settle(b, info, 150, room=0) is False        # waits in `full`
    assert b in acc.full
    assert acc.settle(b, info, 301, room=0) is True         # past grow_limit: close anyway
    # Full batches go first once there is room, before older lingered ones.
    older = acc.open_batch(info, 1, T0 - 1)
    assert acc.next_due(T0, room=1) == T0                   # a full one is due now
    assert acc.due(T0, room=1) == [b]
    assert acc.due(T0, room=1) == [older]


def test_with_linger_0_a_batch_closes_after_its_record_while_there_is_room():
    acc, info = accumulator(linger_s=0), topic()
    b = acc.open_batch(info, 0, T0)
    b.add(None, None, b"v", ())
    assert acc.closes_at_once(room=1) and not acc.closes_at_once(room=0)
    assert acc.settle(b, info, b.records.size, room=1) is True
    assert acc.settle(b, info, b.records.size, room=0) is False
    assert not accumulator().closes_at_once(room=1)          # linger: the I/O thread does


def test_closing_tells_the_partitioner_and_frees_the_partition():
    closed = []
    acc, info = accumulator(hook=lambda *args: closed.append(args)), topic()
    b = acc.open_batch(info, 2, T0)
    assert acc.close(b) is b
    assert closed == [("t", 2, [0, 1, 2], [0, 1, 2])]
    assert info.open[2] is None and not acc.open
    fresh = acc.open_batch(info, 2, T0)                      # a new one may open there
    assert info.open[2] is fresh


def test_a_raising_partitioner_hook_does_not_stop_the_close():
    def hook(*args):
        raise ValueError("bug in a partitioner")
    acc, info = accumulator(hook=hook), topic()
    b = acc.open_batch(info, 0, T0)
    assert acc.close(b) is b and not acc.open


def test_close_all_and_drop_all():
    acc, info = accumulator(), topic()
    batches = [acc.open_batch(info, p, T0) for p in (2, 0, 1)]
    assert acc.close_all() == batches                        # oldest first
    again = [acc.open_batch(info, p, T0) for p in range(3)]
    assert acc.drop_all([info]) == again
    assert info.open == [None] * 3 and not acc.open and not acc.full
