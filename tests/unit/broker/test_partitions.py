"""The partition table without a broker or a socket: slots, lookup, the state a slot publishes,
and consumers' waiters.

Partitions are real ``PartitionLog``s in ``tmp_path``; connections are real ``Conn`` values
without a socket (the table never reads or writes one). The table never touches a semaphore
either: it only hands back the ones to post, so plain tokens stand in for them.
"""

from __future__ import annotations

import os

import pytest

from mq.broker.conns import Conn
from mq.broker.partitions import PartitionTable
from mq.errors import InvalidPartitionsError, UnknownTopicOrPartitionError
from mq.log.builder import BatchBuilder
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.protocol.frames import FrameReader


def batch(n: int = 1) -> bytearray:
    builder = BatchBuilder()
    for i in range(n):
        builder.append(1_000 + i, None, b"value-%d" % i)
    return builder.build()


def conn(conn_id: int) -> Conn:
    return Conn(sock=None, pid=1, reader=FrameReader(), conn_id=conn_id)


class Sem:
    """A semaphore's stand-in: the table only hands it back."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Sem({self.name})"


@pytest.fixture
def open_log(tmp_path):
    logs: list[PartitionLog] = []

    def open_(name: str = "t-0", config: LogConfig | None = None) -> PartitionLog:
        plog = PartitionLog.open(os.path.join(tmp_path, name), config or LogConfig())
        logs.append(plog)
        return plog
    yield open_
    for plog in logs:
        plog.close()


# --- slots and lookup ---------------------------------------------------------------------------

def test_slots_are_taken_freed_and_reused(open_log):
    table = PartitionTable(slots=3)
    a, b = table.add("t", 0, open_log("t-0")), table.add("t", 1, open_log("t-1"))
    assert (a.slot, b.slot) == (0, 1)
    table.check_room(1)
    with pytest.raises(InvalidPartitionsError,
                       match=r"^not enough state slots for 2 more partition\(s\): 1 of the "
                             r"broker's 3 are free; raise state_slots in its config file \(at "
                             r"most 1048576\) and restart it$"):
        table.check_room(2)
    assert table.remove("t", 0) is a
    assert table.add("u", 0, open_log("u-0")).slot == 0      # the freed slot first
    assert table.add("u", 1, open_log("u-1")).slot == 2
    with pytest.raises(InvalidPartitionsError, match="state_slots"):
        table.add("u", 2, open_log("u-2"))
    assert len(table) == 3 and {p.slot for p in table} == {0, 1, 2}


def test_lookup_names_what_is_missing(open_log):
    table = PartitionTable(slots=8)
    parts = [table.add("t", p, open_log(f"t-{p}")) for p in range(2)]
    assert table.partition("t", 1) is parts[1] and table.get("t", 1) is parts[1]
    assert table.get("t", 2) is None
    assert table.of_topic("t") == parts and table.of_topic("nope") == []
    with pytest.raises(UnknownTopicOrPartitionError, match=r"has no partition 2 \(it has 2\)"):
        table.partition("t", 2)
    with pytest.raises(UnknownTopicOrPartitionError, match="unknown topic 'nope'"):
        table.partition("nope", 0)


def test_removed_partition_is_no_longer_touched(open_log):
    table = PartitionTable(slots=2)
    part = table.add("t", 0, open_log())
    table.touch(part)
    table.remove("t", 0)
    assert not table.touched


# --- the published state ------------------------------------------------------------------------

def test_state_follows_the_log_and_the_generation_moves_on_rolls_only(open_log):
    table = PartitionTable(slots=1)
    part = table.add("t", 0, open_log())
    first = table.state_of(part)
    assert (first.high_watermark, first.log_end_offset, first.hw_position) == (0, 0, 0)
    part.log.append(batch(3))
    st = table.state_of(part)
    assert (st.high_watermark, st.last_stable_offset, st.log_end_offset) == (3, 3, 3)
    assert (st.active_segment_base, st.hw_position) == (0, part.log.active_segment.size)
    assert st.segment_generation == first.segment_generation        # an append is no roll
    part.log.roll()
    part.log.append(batch())
    rolled = table.state_of(part)
    assert rolled.segment_generation == st.segment_generation + 1
    assert (rolled.active_segment_base, rolled.log_end_offset) == (3, 4)
    assert table.state_of(part).segment_generation == rolled.segment_generation


def test_a_trailing_high_watermark_ends_where_its_batch_starts(open_log):
    """Durable mode: the high watermark trails the log end, here into an older segment."""
    table = PartitionTable(slots=1)
    plog = open_log()
    plog.high_watermark_follows_log_end = False
    part = table.add("t", 0, plog)
    plog.append(batch(2))                       # offsets 0-1
    position = plog.active_segment.size
    plog.append(batch(2))                       # offsets 2-3, in the same segment
    plog.roll()
    plog.append(batch())                        # offset 4, in the next segment
    plog.high_watermark = 2
    st = table.state_of(part)
    assert (st.high_watermark, st.log_end_offset) == (2, 5)
    assert (st.active_segment_base, st.hw_position) == (0, position)


# --- waiters ------------------------------------------------------------------------------------

def test_arm_is_ready_at_once_when_there_is_data_or_no_partition(open_log):
    table = PartitionTable(slots=2)
    part = table.add("t", 0, open_log())
    part.log.append(batch(2))
    c, sem = conn(1), Sem("a")
    assert table.arm(c, sem, [("t", 0, 1)])            # offset 1 < high watermark 2
    assert table.arm(c, sem, [("gone", 0, 0)])         # deleted: let the consumer notice
    assert not part.waiters
    assert not table.arm(c, sem, [("t", 0, 2)])        # caught up: armed
    assert part.waiters == [(c, sem, 2)]


def test_one_waiter_per_connection_semaphore_and_partition(open_log):
    """A WAIT re-armed after a timeout replaces the consumer's previous waiter instead of
    adding one (idle consumers polling with short timeouts must not grow the broker)."""
    table = PartitionTable(slots=2)
    p0, p1 = table.add("w", 0, open_log("w-0")), table.add("w", 1, open_log("w-1"))
    p0.log.append(batch())
    c, sem, other = conn(1), Sem("a"), Sem("b")
    for offset in (1, 1, 1, 2):
        table.arm(c, sem, [("w", 0, offset), ("w", 1, 0)])
    assert [w[2] for w in p0.waiters] == [2]
    assert len(p1.waiters) == 1
    table.arm(c, other, [("w", 1, 0)])                  # another semaphore: its own waiter
    assert [w[1] for w in p1.waiters] == [sem, other]


def test_due_posts_the_passed_waiters_and_keeps_them_armed(open_log):
    """A posted waiter stays, its offset moved to the high watermark: the next advance posts
    it again without another WAIT, and no advance posts nothing."""
    table = PartitionTable(slots=1)
    part = table.add("t", 0, open_log())
    a, b, c = conn(1), conn(2), conn(3)
    sa, sb, sc = Sem("a"), Sem("b"), Sem("c")
    table.arm(a, sa, [("t", 0, 0)])
    table.arm(b, sb, [("t", 0, 2)])
    table.arm(c, sc, [("t", 0, 0)])
    assert table.due(part) == []                        # nothing written yet
    c.closing = True
    part.log.append(batch())                            # high watermark 1
    assert table.due(part) == [sa]                      # c's connection is closing: dropped
    assert part.waiters == [(a, sa, 1), (b, sb, 2)]
    assert table.due(part) == []                        # posted once per advance
    part.log.append(batch(2))                           # high watermark 3
    assert table.due(part) == [sa, sb]
    assert part.waiters == [(a, sa, 3), (b, sb, 3)]


def test_a_wait_replaces_every_waiter_of_its_semaphore(open_log):
    """Partitions a consumer no longer waits on stop posting it; a ready position is armed at
    the high watermark (the post at once covers what is there)."""
    table = PartitionTable(slots=2)
    p0, p1 = table.add("w", 0, open_log("w-0")), table.add("w", 1, open_log("w-1"))
    p1.log.append(batch(2))
    c, sem, other = conn(1), Sem("a"), Sem("b")
    table.arm(c, sem, [("w", 0, 0), ("w", 1, 2)])
    table.arm(c, other, [("w", 0, 0)])
    assert table.arm(c, sem, [("w", 1, 0)])             # offset 0 < high watermark 2
    assert p0.waiters == [(c, other, 0)]
    assert p1.waiters == [(c, sem, 2)]
    assert table.due(p1) == []                          # the post at once covered it
    assert not table.arm(c, sem, [])                    # nothing: disarmed
    assert not p1.waiters and p0.waiters == [(c, other, 0)]


def test_disarm_forgets_a_connection_everywhere(open_log):
    table = PartitionTable(slots=2)
    parts = [table.add("t", p, open_log(f"t-{p}")) for p in range(2)]
    a, b = conn(1), conn(2)
    table.arm(a, Sem("a"), [("t", 0, 0), ("t", 1, 0)])
    table.arm(b, Sem("b"), [("t", 1, 0)])
    table.disarm(a)
    assert parts[0].waiters == [] and [w[0] for w in parts[1].waiters] == [b]
