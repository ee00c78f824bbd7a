"""The producer's open batches, pure: which partition's batch takes the next record, and which
batches are due to close at ``now`` (``batch_size``, ``linger_ms``, room in flight). No lock,
no thread, no clock: the producer calls it under its lock with ``now`` and ``room`` (how many
more requests the sender would take: ``Sender.room``).

The records themselves are encoded by each batch's record accumulator (``accumulator.py``,
in C when the extension is built). ``send()`` reads a partition's open batch from
``TopicState.open`` and adds a record to it directly when it fits — one C call per record, no
Python call into this class — and asks this class only when a batch opens, fills or closes.

Invariants:

- a partition has at most one open batch (``TopicState.open[p]``); ``open`` lists every open
  batch, oldest first, so the first one's ``deadline`` is the next linger to run out;
- a batch is due when the next record would take it past ``batch_size`` (uncompressed), or
  ``linger_ms`` after its first record, or at once with ``linger_ms=0`` — but with acks it
  closes only while there is room in flight: without room a full batch keeps filling up to
  ``grow_limit`` (``min(max_request_size, the topic's max.message.bytes)``) and waits in
  ``full``, so a busy pipeline (``acks="all"`` waiting for an fsync) carries fewer, larger
  requests; with ``acks=0`` nothing waits for room;
- ``close`` takes a batch out for good: records never join a closed batch. Closed batches go
  to the sender (``sender.py``), which seals and builds them.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from mq.client.producer_batches import Batch, TopicState
from mq.log.layout import MAX_RECORD_OVERHEAD

__all__ = ["BatchAccumulator"]

log = logging.getLogger("mq.producer")



class BatchAccumulator:
    """The open batches of one producer (see the module doc).

    ``on_batch_closed``: the partitioner's hook (``topic, partition, partitions,
    available``), called for each batch closed, so a sticky partitioner moves on."""

    def __init__(self, compression: int, linger_s: float, acks: int, cb_lock: threading.Lock,
                 on_batch_closed: Callable | None = None) -> None:
        self.compression = compression
        self.linger_s = linger_s
        self.acks = acks
        self.cb_lock = cb_lock                        # the futures' callbacks lock
        self.on_batch_closed = on_batch_closed
        self.open: dict[Batch, None] = {}             # open batches, oldest first
        self.full: dict[Batch, None] = {}             # open, full, waiting for room
        self.buffers: list[bytearray] = []            # finished batches' buffers, reused

    def open_batch(self, info: TopicState, partition: int, now: float) -> Batch:
        """A new open batch for ``partition`` (which has none)."""
        batch = Batch(info, partition, self.compression, now, self.linger_s, self.cb_lock,
                      self.buffers)
        info.open[partition] = batch
        self.open[batch] = None
        return batch

    def closes_at_once(self, room: int) -> bool:
        """Whether a batch opened now is closed by ``send()`` right after its record (so it
        needs no linger timer): ``linger_ms=0`` with room in flight."""
        return not self.linger_s and room > 0

    def may_grow(self, batch: Batch, info: TopicState, size: int, room: int) -> bool:
        """Whether ``batch``, too full for a record of ``size`` bytes at ``batch_size``, keeps
        filling instead (no room in flight, with acks, within ``grow_limit``)."""
        return bool(batch.records.size + size + MAX_RECORD_OVERHEAD <= info.grow_limit and self.acks
                    and room <= 0)

    def settle(self, batch: Batch, info: TopicState, need: int, room: int) -> bool:
        """After records joined ``batch``: whether it is due now (close it), given ``need``,
        its size with one more record like the last. A full batch without room waits in
        ``full``, still taking records up to ``grow_limit``."""
        if need > info.batch_limit:
            if not self.acks or need > info.grow_limit or room > 0:
                return True
            self.full[batch] = None
            return False
        return not self.linger_s and room > 0

    def close(self, batch: Batch) -> Batch:
        """Take ``batch`` out: no record joins it any more. Returns it (for the sender)."""
        info = batch.info
        if info.open[batch.partition] is batch:
            info.open[batch.partition] = None
        del self.open[batch]
        self.full.pop(batch, None)
        self.closed(info, batch.partition)
        return batch

    def closed(self, info: TopicState, partition: int) -> None:
        """A batch of ``partition`` was closed (here, or built whole by ``send()``): the
        partitioner's hook."""
        if self.on_batch_closed is not None:
            try:
                self.on_batch_closed(info.name, partition, info.partitions, info.partitions)
            except Exception:
                log.exception("partitioner's on_batch_closed raised")

    def due(self, now: float, room: int) -> list[Batch]:
        """The batches to close at ``now`` with ``room`` requests free in flight: full ones
        first, then those whose linger ran out, oldest first — as many as there is room for
        (all of them with ``acks=0``). Closes them."""
        if not self.open or (room <= 0 and self.acks):
            return []
        expired = list(self.full)[:max(room, 0)]
        for batch in self.open:
            if batch.deadline > now or (len(expired) >= room and self.acks):
                break
            if batch not in self.full:
                expired.append(batch)
        return [self.close(batch) for batch in expired]

    def next_due(self, now: float, room: int) -> float:
        """When a batch is next due by the clock (``math.inf``: none, or no room)."""
        if self.open and (room > 0 or not self.acks):
            return now if self.full else next(iter(self.open)).deadline
        return math.inf

    def close_all(self) -> list[Batch]:
        """Close every open batch (``flush()``), oldest first."""
        return [self.close(batch) for batch in list(self.open)]

    def drop_all(self, topics) -> list[Batch]:
        """Forget every open batch without closing it (the producer stops, or this is a forked
        child's copy); returns them. ``topics``: every ``TopicState`` of the producer."""
        dropped = list(self.open)
        self.open.clear()
        self.full.clear()
        for info in topics:
            info.open = [None] * len(info.open)
        return dropped

    def __len__(self) -> int:
        return len(self.open)

    def __repr__(self) -> str:
        return f"<BatchAccumulator {len(self.open)} open, {len(self.full)} full>"
