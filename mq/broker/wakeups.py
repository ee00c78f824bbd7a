"""State publication and consumer wake-ups: what a consumer reads and what it waits on.

The broker publishes each partition's offsets into its slot of the shared-memory state region
(``mq/protocol/state.py``), which consumers read without a round trip. A consumer with nothing to read
sends WAIT with its own semaphore and positions; the broker posts the semaphore at once if a
position is already below the high watermark, else remembers the waiter on the partition and
posts when the high watermark passes it (``mq/client/consumer.py`` draws the protocol).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import posix_ipc

from mq.errors import InvalidRequestError
from mq.protocol.messages import Request
from mq.protocol.state import PartitionState

if TYPE_CHECKING:
    from mq.broker.server import _Conn, _Partition

__all__ = ["Wakeups"]


def _post(sem: posix_ipc.Semaphore) -> None:
    """Wake a consumer; one that already went away (semaphore unlinked) is no error."""
    try:
        sem.release()
    except posix_ipc.Error:
        pass


class Wakeups:
    """Mixed into ``Broker``: uses its ``partitions``, ``state`` and ``_sem_prefix``."""

    def _publish(self, part: _Partition) -> None:
        """Write the partition's slot. The readable end is published as (segment base, byte
        position): normally the active segment's end; in durable mode the high watermark can
        trail the log end, even into an older segment."""
        plog = part.log
        # A compaction swap can keep the segment bases and count, so it counts too.
        shape = (plog.segments[0].base_offset, plog.active_segment.base_offset,
                 len(plog.segments), plog.swap_count)
        if shape != part.shape:
            part.shape = shape
            part.generation += 1
        hw = plog.high_watermark
        if hw >= plog.log_end_offset:
            seg = plog.active_segment
            hw_base, hw_position = seg.base_offset, seg.size
        else:
            seg = plog.segments[plog._segment_for(hw)]
            found = seg.translate_offset(hw)
            hw_base, hw_position = seg.base_offset, (found.position if found else seg.size)
        assert self.state is not None
        self.state.publish(part.slot, PartitionState(
            high_watermark=hw, last_stable_offset=hw, log_start_offset=plog.log_start_offset,
            active_segment_base=hw_base, hw_position=hw_position,
            segment_generation=part.generation, log_end_offset=plog.log_end_offset))

    def _wake(self, part: _Partition) -> None:
        hw = part.log.high_watermark
        keep = []
        for conn, sem, offset in part.waiters:
            if conn.closing:
                continue
            if offset < hw:
                _post(sem)
            else:
                keep.append((conn, sem, offset))
        part.waiters = keep

    def _api_wait(self, conn: _Conn, req: Request) -> None:
        name = req["semaphore"]
        if not name.startswith(self._sem_prefix):
            raise InvalidRequestError(f"semaphore {name!r} is not one of this broker's")
        sem = conn.semaphores.get(name)
        if sem is None:
            try:
                sem = posix_ipc.Semaphore(name)
            except posix_ipc.Error as err:
                raise InvalidRequestError(f"cannot open semaphore {name!r}: {err}") from err
            conn.semaphores[name] = sem
        ready = False
        for topic, partition, offset in req["positions"]:
            part = self.partitions.get((topic, partition))
            if part is None or offset < part.log.high_watermark or \
                    offset < part.log.log_start_offset:
                ready = True
            else:
                # One waiter per (connection, semaphore) and partition: a WAIT re-armed after
                # a timeout replaces the old entry instead of piling up (unbounded growth).
                part.waiters = [w for w in part.waiters if w[0] is not conn or w[1] is not sem]
                part.waiters.append((conn, sem, offset))
        if ready:
            _post(sem)
