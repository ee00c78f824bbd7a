"""The producer's batch arena: slots, seals, and what happens when it is full."""

import fcntl
import mmap
import os

import pytest

from mq.client.arena import Arena
from mq.protocol.messages import ARENA_SEALS as SEALS


def test_slots_are_whole_pages_and_handed_out_until_none_is_left():
    arena = Arena(5000, 3)
    try:
        assert arena.slot_bytes % mmap.PAGESIZE == 0 and arena.slot_bytes >= 5000
        assert arena.size == 3 * arena.slot_bytes == os.fstat(arena.fd).st_size
        taken = [arena.put(b"x" * 10) for _ in range(3)]
        assert [offset for _, offset in taken] == [0, arena.slot_bytes, 2 * arena.slot_bytes]
        assert arena.put(b"y") is None and arena.free_slots == 0
        arena.release(taken[1][0])
        assert arena.put(b"z" * 7) == taken[1]
        with open(f"/proc/self/fd/{arena.fd}", "rb") as f:
            f.seek(taken[1][1])
            assert f.read(8) == b"z" * 7 + b"x"      # the rest of the slot is the old batch
    finally:
        arena.close()


def test_a_batch_larger_than_a_slot_is_not_taken():
    arena = Arena(mmap.PAGESIZE, 2)
    try:
        assert arena.put(bytes(mmap.PAGESIZE + 1)) is None
        assert arena.free_slots == 2
    finally:
        arena.close()


def test_the_memfd_is_sealed_so_the_broker_map_can_never_fault():
    arena = Arena(100, 1)
    try:
        assert fcntl.fcntl(arena.fd, fcntl.F_GET_SEALS) & SEALS == SEALS
        with pytest.raises(PermissionError):
            os.ftruncate(arena.fd, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(arena.fd, arena.size * 2)
    finally:
        arena.close()


def test_closed_arena_takes_nothing_and_closes_once():
    arena = Arena(100, 1)
    arena.close()
    arena.close()
    assert arena.put(b"x") is None


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        Arena(0, 1)
    with pytest.raises(ValueError):
        Arena(100, 0)
