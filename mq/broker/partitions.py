"""The broker's partitions as clients see them: slots in the shared state region, the state
published in each, and the consumers waiting on each. Pure: no I/O (``wakeups.py`` writes the
region and posts the semaphores).

Every partition with a slot — user topics' and ``__consumer_offsets``'; the metadata log has
none — is a ``Partition`` in the ``PartitionTable``:

- **Slots.** A partition takes the lowest free slot index of the region (``state_slots`` of
  them, ``mq/protocol/state.py``; at most ``MAX_STATE_SLOTS``) and gives it back when its topic
  is deleted; clients find a partition's slot in the topic metadata. ``check_room`` says before
  a topic change is recorded whether its partitions will fit, so the metadata never names a
  partition without a slot.
- **Published state.** ``state_of`` is what a partition's slot says: its offsets, where the
  readable data ends (segment base and byte position of the high watermark) and a segment-set
  generation that moves whenever the segment list changes shape (roll, retention, a
  compaction swap), so readers know to re-list. ``touch`` marks a partition whose state moved
  this loop round; the loop publishes the touched ones at the end of the round.
- **Waiters.** A consumer with nothing to read arms a waiter — (connection, semaphore, offset)
  — on each partition it reads (``arm``); ``due`` hands back the semaphores whose offset the
  high watermark has passed. A waiter stays armed after its post, its offset moved up to the
  high watermark, so every later advance posts again: a consumer that caught up sleeps again
  without another WAIT (one WAIT per assignment, not one per catch-up). A WAIT replaces every
  waiter of its (connection, semaphore), on whichever partitions (idle consumers polling with
  short timeouts must not grow the broker, and partitions no longer read stop posting).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import posix_ipc

from mq.broker.conns import Conn
from mq.errors import InvalidPartitionsError, UnknownTopicOrPartitionError
from mq.log.log import PartitionLog
from mq.protocol.state import PartitionState

__all__ = ["MAX_STATE_SLOTS", "VACANT", "Partition", "PartitionTable", "Waiter"]

# The most slots ``state_slots`` may ask for: 64 MiB of /dev/shm at 64 bytes a slot (the
# region is reserved whole at start, and Docker's default /dev/shm is 64 MiB), 256 times the
# default 4,096 — more partitions than one host's open-file limit lets a broker serve.
MAX_STATE_SLOTS = 1 << 20

# (connection, semaphore, offset): post the semaphore once the high watermark passes offset.
Waiter = tuple[Conn, posix_ipc.Semaphore, int]
# What a slot says once its partition is gone: every field -1, so readers notice.
VACANT = PartitionState(-1, -1, -1, -1, -1, -1, -1)


@dataclasses.dataclass(eq=False)
class Partition:
    """One partition with a slot (hashable by identity)."""

    topic: str
    partition: int
    log: PartitionLog
    slot: int
    generation: int = 0                 # segment-set generation, published in the slot
    shape: tuple = ()                   # what the generation was last computed from
    waiters: list[Waiter] = dataclasses.field(default_factory=list)
    # Counted by Produce since the broker started (retries an idempotent producer sent again
    # append nothing and count nothing), for the metrics and ``mq top``.
    produced_records: int = 0
    produced_bytes: int = 0


class PartitionTable:
    """Every partition with a slot, by (topic, partition), and what the slots say."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        # The same dict for the table's life: the Produce hot path looks partitions up in it
        # from C (``by_key``, ``mq.log.native.produce_plain``).
        self.by_key: dict[tuple[str, int], Partition] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        # Partitions whose published state moved this round (``touch``); the loop publishes
        # them and clears the set at the end of the round. The same set object for the
        # table's life, so the hot paths may keep a reference and add to it directly.
        self.touched: set[Partition] = set()
        # Where each semaphore's waiters are armed, so a WAIT replaces them all.
        self._armed: dict[posix_ipc.Semaphore, list[Partition]] = {}

    # --- lookup -------------------------------------------------------------------------------
    def get(self, topic: str, partition: int) -> Partition | None:
        return self.by_key.get((topic, partition))

    def partition(self, topic: str, partition: int) -> Partition:
        """The partition, or ``UnknownTopicOrPartitionError`` naming what is missing."""
        part = self.by_key.get((topic, partition))
        if part is None:
            count = sum(1 for key in self.by_key if key[0] == topic)
            if not count:
                raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
            raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition} "
                                               f"(it has {count})")
        return part

    def of_topic(self, topic: str) -> list[Partition]:
        """The topic's partitions, by partition number."""
        return sorted((p for p in self.by_key.values() if p.topic == topic),
                      key=lambda p: p.partition)

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self.by_key.values()))

    def __len__(self) -> int:
        return len(self.by_key)

    # --- slots --------------------------------------------------------------------------------
    def check_room(self, count: int) -> None:
        """Raise ``InvalidPartitionsError`` unless ``count`` more partitions fit the region."""
        free = self.slots - self._next_slot + len(self._free_slots)
        if count > free:
            raise self._full(count, free)

    def _full(self, count: int, free: int) -> InvalidPartitionsError:
        return InvalidPartitionsError(
            f"not enough state slots for {count} more partition(s): {free} of the broker's "
            f"{self.slots} are free; raise state_slots in its config file (at most "
            f"{MAX_STATE_SLOTS}) and restart it")

    def add(self, topic: str, partition: int, log: PartitionLog) -> Partition:
        """Give ``log`` a slot. Raises ``InvalidPartitionsError`` when the region is full."""
        if self._free_slots:
            slot = self._free_slots.pop()
        elif self._next_slot < self.slots:
            slot, self._next_slot = self._next_slot, self._next_slot + 1
        else:
            raise self._full(1, 0)
        part = Partition(topic, partition, log, slot)
        self.by_key[(topic, partition)] = part
        return part

    def remove(self, topic: str, partition: int) -> Partition:
        """Take the partition out and free its slot (its waiters stay on the returned
        ``Partition``, to be woken so they notice)."""
        part = self.by_key.pop((topic, partition))
        self._free_slots.append(part.slot)
        self.touched.discard(part)
        return part

    # --- published state ----------------------------------------------------------------------
    def touch(self, part: Partition) -> None:
        """``part``'s state moved: publish it at the end of this round."""
        self.touched.add(part)

    @staticmethod
    def state_of(part: Partition) -> PartitionState:
        """What ``part``'s slot says now; moves its segment-set generation when the segment
        list changed shape. The readable end is (segment base, byte position): normally the
        active segment's end; in durable mode the high watermark can trail the log end, even
        into an older segment."""
        plog = part.log
        segments = plog.segments
        # A compaction swap can keep the segment bases and count, so it counts too.
        shape = (segments[0].base_offset, plog.active_segment.base_offset, len(segments),
                 plog.swap_count)
        if shape != part.shape:
            part.shape = shape
            part.generation += 1
        hw = plog.high_watermark
        if hw >= plog.log_end_offset:
            seg = plog.active_segment
            hw_base, hw_position = seg.base_offset, seg.size
        else:
            seg = segments[plog.segment_for(hw)]
            found = seg.translate_offset(hw)
            hw_base, hw_position = seg.base_offset, (found.position if found else seg.size)
        return PartitionState(
            high_watermark=hw, last_stable_offset=plog.last_stable_offset,
            log_start_offset=plog.log_start_offset,
            active_segment_base=hw_base, hw_position=hw_position,
            segment_generation=part.generation, log_end_offset=plog.log_end_offset)

    # --- waiters ------------------------------------------------------------------------------
    def arm(self, conn: Conn, sem: posix_ipc.Semaphore,
            positions: Iterable[tuple[str, int, int]]) -> bool:
        """WAIT: wake ``sem`` once any of ``positions`` (topic, partition, offset) has data at
        its offset, and at every advance of their high watermarks after that (replacing the
        semaphore's earlier waiters). True when one has data already — or is gone, or its
        offset lies below the log start — and the caller should post at once; the others are
        armed either way."""
        for part in self._armed.pop(sem, ()):
            part.waiters = [w for w in part.waiters if w[1] is not sem]
        ready = False
        armed = []
        for topic, partition, offset in positions:
            part = self.by_key.get((topic, partition))
            if part is None:
                ready = True
                continue
            hw = part.log.high_watermark
            if offset < hw or offset < part.log.log_start_offset:
                ready, offset = True, hw        # posted now: the next advance posts again
            part.waiters.append((conn, sem, offset))
            armed.append(part)
        if armed:
            self._armed[sem] = armed
        return ready

    @staticmethod
    def due(part: Partition) -> list[posix_ipc.Semaphore]:
        """The semaphores to post now: waiters whose offset the high watermark passed (they
        stay, their offset moved to the high watermark). Waiters of closing connections are
        dropped."""
        hw = part.log.high_watermark
        keep, due = [], []
        for waiter in part.waiters:
            conn, sem, offset = waiter
            if conn.closing:
                continue
            if offset < hw:
                due.append(sem)
                waiter = (conn, sem, hw)
            keep.append(waiter)
        part.waiters = keep
        return due

    def disarm(self, conn: Conn) -> None:
        """Forget every waiter of ``conn`` (its connection closed)."""
        for sem in conn.semaphores.values():
            self._armed.pop(sem, None)
        for part in self.by_key.values():
            if part.waiters:
                part.waiters = [w for w in part.waiters if w[0] is not conn]
