"""Group commit: the broker's flusher thread and the event loop's side of it.

The loop thread never fsyncs a partition log. An ``acks="all"`` produce puts its partition in
the round's flush job (``_ack_after_flush``) and its reply is held (with ``high_watermark =
"durable"`` every produce puts its partition in); at the end of the round the loop hands the job
(duplicated descriptors of the segments past each recovery point) to ``Flusher``, which runs
``fdatasync`` with the GIL released and tells the loop through a pipe. ``_flush_done`` then
advances the recovery points (in durable mode also the high watermark) and sends the held
replies, so one fsync covers every produce that arrived while the previous one ran.
``_periodic_flush`` does the same every ``flush_interval_ms`` for what acks=0/1 produces left in
the page cache.

A failed ``fdatasync`` is never retried and never followed by an acknowledgement for that
partition: the kernel reports a writeback error once per open file description and may have
dropped the pages it could not write, so a later fsync of the same file can return 0 over a
hole (PostgreSQL's "fsyncgate"). The flusher remembers every partition whose fsync failed and
fails each later job's targets on it without looking; the loop takes the log offline
(``PartitionLog.fsync_failed``) and answers the held replies with ``KAFKA_STORAGE_ERROR``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
from typing import TYPE_CHECKING

from mq import errors
from mq.log import diskio
from mq.protocol.messages import response

if TYPE_CHECKING:
    from mq.broker.server import _Conn, _Partition

__all__ = ["Flusher", "Flushing"]

log = logging.getLogger("mq.broker")


@dataclasses.dataclass(eq=False)
class _FlushJob:
    fds: dict[_Partition, list[int]]
    targets: dict[_Partition, int]        # -> the log end offset the fsync covers
    replies: list[tuple[_Conn, list, _Partition]]
    failed: dict[_Partition, OSError] = dataclasses.field(default_factory=dict)


class Flusher(threading.Thread):
    """Runs fdatasync for the loop; one round covers every job queued before it started."""

    def __init__(self, notify_fd: int) -> None:
        super().__init__(name="mq-flusher", daemon=True)
        self._notify_fd = notify_fd
        self._cv = threading.Condition()
        self._queue: list[_FlushJob] = []
        self.finished: collections.deque[_FlushJob] = collections.deque()
        self._stopping = False
        self._failed: dict[_Partition, OSError] = {}     # only this thread touches it

    def submit(self, job: _FlushJob) -> None:
        with self._cv:
            self._queue.append(job)
            self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if not self._queue and self._stopping:
                    return
                jobs, self._queue = self._queue, []
            for job in jobs:
                for part, fds in job.fds.items():
                    if part in self._failed:
                        continue
                    for fd in fds:
                        try:
                            diskio.ops.fdatasync(fd)
                        except OSError as err:
                            self._failed[part] = err
                            break
            for job in jobs:
                job.failed = {part: self._failed[part] for part in job.targets
                              if part in self._failed}
                for fds in job.fds.values():
                    for fd in fds:
                        diskio.ops.close(fd)
                self.finished.append(job)
            os.write(self._notify_fd, b"\x01")


def _storage_error(reply: list, message: str) -> list:
    """The error answer to the request that ``reply`` would have answered."""
    return response(reply[0], reply[1], errors.KafkaStorageError.code, message)


class Flushing:
    """Mixed into ``Broker``: uses its ``partitions``, ``metadata``, ``logs``, ``config``,
    ``_flusher``, ``_flush_r``, ``_inflight_jobs``, ``_next_flush``, ``_pending_flush``,
    ``_pending_replies``, ``_dirty``, ``_publish``, ``_wake`` and ``_send``."""

    def _ack_after_flush(self, part: _Partition, conn: _Conn | None = None,
                         reply: list | None = None) -> None:
        """Have this round's flush job fsync ``part`` (and send ``reply`` once it did)."""
        self._pending_flush[part] = part.log.log_end_offset
        self._dirty.add(part)
        if conn is not None:
            self._pending_replies.append((conn, reply, part))

    def _submit_flush_job(self) -> None:
        """End of a round: one job for every partition to fsync. A partition whose segment
        descriptors cannot be duplicated (out of descriptors) is not synced this round: its
        held replies fail with a retriable storage error, and the log stays online."""
        fds: dict[_Partition, list[int]] = {}
        targets: dict[_Partition, int] = {}
        undone: dict[_Partition, OSError] = {}
        for part, offset in self._pending_flush.items():
            plog = part.log
            if plog.offline is not None or plog.closed:
                undone[part] = OSError(plog.offline or "log closed")
                continue
            dups: list[int] = []
            try:
                for seg in reversed(plog.segments):    # the unflushed ones are a suffix
                    if seg.next_offset <= plog.recovery_point:
                        break
                    if not seg.closed:
                        dups.append(seg.dup_fd())
            except OSError as err:
                for fd in dups:
                    diskio.ops.close(fd)
                undone[part] = err
                continue
            fds[part], targets[part] = dups, offset
        replies = []
        for conn, reply, part in self._pending_replies:
            if part in undone:
                self._send(conn, _storage_error(
                    reply, f"{part.topic}-{part.partition} could not be fsynced: "
                           f"{undone[part]}; nothing was acknowledged"))
            else:
                replies.append((conn, reply, part))
        self._pending_flush, self._pending_replies = {}, []
        if targets or replies:
            self._inflight_jobs += 1
            self._flusher.submit(_FlushJob(fds, targets, replies))

    def _flush_done(self) -> None:
        try:
            os.read(self._flush_r, 4096)
        except BlockingIOError:
            pass
        while self._flusher.finished:
            job = self._flusher.finished.popleft()
            self._inflight_jobs -= 1
            for part, offset in job.targets.items():
                plog = part.log
                if plog.closed:
                    continue
                err = job.failed.get(part)
                if err is not None:
                    plog.fsync_failed(err)          # offline; logged once
                    continue
                plog.recovery_point = max(plog.recovery_point, min(offset, plog.log_end_offset))
                if not plog.high_watermark_follows_log_end and offset > plog.high_watermark:
                    plog.high_watermark = min(offset, plog.log_end_offset)
                    self._publish(part)
                    self._wake(part)
            for conn, message, part in job.replies:
                err = job.failed.get(part)
                if err is not None:
                    message = _storage_error(
                        message, f"{part.topic}-{part.partition}: fsync failed "
                                 f"({err.strerror or err}); nothing was acknowledged and the "
                                 "partition is offline until a broker restart recovers it")
                self._send(conn, message)

    def _periodic_flush(self, now: float) -> None:
        """Every ``flush_interval_ms``: fsync what acks=0/1 produces left in the page cache (in
        the flusher thread) and checkpoint recovery points, so an unclean restart re-validates
        at most about one interval of data and a power loss loses at most that much."""
        self._next_flush = now + self.config.flush_interval_ms / 1e3
        for part in self.partitions.values():
            plog = part.log
            if plog.log_end_offset > plog.recovery_point and part not in self._pending_flush \
                    and plog.offline is None:
                self._pending_flush[part] = plog.log_end_offset
        meta = self.metadata.log
        if meta.log_end_offset > meta.recovery_point and meta.offline is None:
            try:
                meta.flush()
            except errors.LogWriteError:
                pass                       # offline now; logged by the log
        self.logs.checkpoint()
