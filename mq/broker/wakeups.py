"""State publication and consumer wake-ups: what a consumer reads and what it waits on.

The broker publishes each partition's offsets into its slot of the shared-memory state region
(``mq/protocol/state.py``), which consumers read without a round trip. A consumer with nothing
to read sends WAIT with its own semaphore and positions (``apis/produce.py``); the partition
table arms a waiter, and ``wake`` posts the semaphore whenever the high watermark passes the
waiter's offset (``mq/client/consumer.py`` draws the protocol). What a slot says and which
waiters are due is decided by the pure ``PartitionTable``; this module does the writing and
posting.

A semaphore whose count is already above zero is not posted again (``nudge``): its consumer
has a wake-up pending, and reads the state after taking it, so one more post would only be a
spurious wake-up. That keeps the count of a consumer busy elsewhere at one, however many
rounds pass, and posts a consumer reading several partitions once per round.
"""

from __future__ import annotations

import posix_ipc

from mq.broker.partitions import VACANT, Partition, PartitionTable
from mq.log import native
from mq.protocol.state import StateWriter, slot_offset

__all__ = ["StatePublisher", "nudge", "post"]


def post(sem: posix_ipc.Semaphore) -> None:
    """Wake a consumer; one that already went away (semaphore unlinked) is no error."""
    try:
        sem.release()
    except posix_ipc.Error:
        pass


def _nudge(sem: posix_ipc.Semaphore) -> None:
    try:
        if not sem.value:                 # a user-space read: no syscall
            sem.release()
    except posix_ipc.Error:
        pass


# Post unless a post is pending (the module doc); where the count cannot be read, always post.
nudge = _nudge if posix_ipc.SEMAPHORE_VALUE_SUPPORTED else post


class StatePublisher:
    """Writes partitions' slots and posts the semaphores of consumers waiting on them."""

    def __init__(self, state: StateWriter, table: PartitionTable) -> None:
        self.state = state
        self._table = table

    def publish(self, part: Partition) -> None:
        """Write ``part``'s slot now: in one C call in the common case (the high watermark at
        the log end, no transaction open), else as the partition table says."""
        fast = native.publish_slot
        if fast is None or not fast(self.state.region, slot_offset(part.slot), part.log, part):
            self.state.publish(part.slot, self._table.state_of(part))

    def wake(self, part: Partition) -> None:
        """Post every waiter of ``part`` that the high watermark passed."""
        for sem in self._table.due(part):
            nudge(sem)

    def publish_touched(self) -> None:
        """End of a loop round: publish the partitions whose state moved, then wake their
        waiters (published first, so a woken consumer reads the new state)."""
        touched = self._table.touched
        for part in touched:
            self.publish(part)
            if part.waiters:
                self.wake(part)
        touched.clear()

    def vacate(self, part: Partition) -> None:
        """``part`` was removed (its topic deleted): every waiter is posted so it notices, and
        the slot says so until it is reused (written before the posts: a woken consumer reads
        it)."""
        self.state.publish(part.slot, VACANT)
        for _, sem, _ in part.waiters:
            post(sem)
        part.waiters = []

    def metadata_changed(self) -> None:
        """Topics or partitions changed (slots may have moved): clients re-read the metadata."""
        self.state.bump_metadata_version()
