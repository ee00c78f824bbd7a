"""A producer's batch arena: shared memory the broker writes Produce batches from.

A large batch sent through the socket is copied twice on its way to the log (the producer's
``sendmsg`` into the kernel, the broker's read out of it) before the broker's ``pwrite``
copies it into the page cache. With an arena the producer puts the finished batch in memory
the broker also maps, and the socket carries only ``ProduceShared(topic, partition, acks,
offset, length)``: the broker writes the log straight from the arena.

The arena is a ``memfd`` of ``slots`` slots of ``slot_bytes``, one per request in flight,
mapped here read-write and handed to the broker once per connection with ``SCM_RIGHTS``
(``ShareMemory``); no name in ``/dev/shm``, nothing to clean up after a crash. It is sealed
against shrinking and growing before it is handed over, so the broker's map can never fault
(``SIGBUS``) because a client truncated it; the broker refuses an fd without those seals.

A slot is taken when its batch is sent and given back when the batch's reply arrives; a new
connection gets a new arena, so a request still queued at the old connection's broker side
can never meet a slot reused for another batch. The broker never trusts the arena: it parses
a private copy of the batch header and checks the CRC on the bytes that reached the file
(``PartitionLog.append(shared_head=)``), so a client that rewrites a slot in flight only gets
its own batch refused.
"""

from __future__ import annotations

import fcntl
import mmap
import os

from mq.protocol.messages import ARENA_SEALS

__all__ = ["Arena", "arena_supported"]


def arena_supported() -> bool:
    """memfd with sealing and fd passing: Linux."""
    return hasattr(os, "memfd_create") and hasattr(os, "MFD_ALLOW_SEALING")


class Arena:
    """``slots`` slots of ``slot_bytes`` (rounded up to whole pages) in one sealed memfd."""

    __slots__ = ("fd", "size", "slot_bytes", "_map", "_free")

    def __init__(self, slot_bytes: int, slots: int) -> None:
        if slot_bytes < 1 or slots < 1:
            raise ValueError("an arena needs at least one slot of at least one byte")
        page = mmap.PAGESIZE
        self.slot_bytes = -(-slot_bytes // page) * page
        self.size = self.slot_bytes * slots
        self.fd = os.memfd_create("mq-producer-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, ARENA_SEALS)
            self._map: mmap.mmap | None = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self._free = list(range(slots - 1, -1, -1))     # popped from the end: slot 0 first

    def put(self, data) -> tuple[int, int] | None:
        """Copy ``data`` into a free slot: ``(slot, offset)``, or None when every slot is
        taken (or the data is larger than one, or the arena is closed)."""
        if not self._free or len(data) > self.slot_bytes or self._map is None:
            return None
        slot = self._free.pop()
        offset = slot * self.slot_bytes
        self._map[offset:offset + len(data)] = data
        return slot, offset

    def release(self, slot: int) -> None:
        """The batch in ``slot`` was answered: the slot may hold another."""
        self._free.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def close(self) -> None:
        """Unmap and close (the broker keeps its own map until it closes the connection)."""
        if self._map is not None:
            self._map.close()
            self._map = None
            os.close(self.fd)
