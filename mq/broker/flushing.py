"""Group commit: the broker's flusher thread and the event loop's side of it.

The loop thread never fsyncs. An ``acks="all"`` produce puts its partition in the round's flush job
(``_ack_after_flush``) and its reply is held (with ``high_watermark = "durable"`` every produce
puts its partition in); at the end of the round the loop hands the job (duplicated descriptors of
the segments past each recovery point) to ``_Flusher``, which runs ``fdatasync`` with the GIL
released and tells the loop through a pipe. ``_flush_done`` then advances the recovery points (in
durable mode also the high watermark) and sends the held replies, so one fsync covers every produce
that arrived while the previous one ran. ``_periodic_flush`` does the same every
``flush_interval_ms`` for what acks=0/1 produces left in the page cache.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mq.broker.server import _Conn, _Partition

__all__ = ["Flushing"]

log = logging.getLogger("mq.broker")


@dataclasses.dataclass(eq=False)
class _FlushJob:
    fds: list[int]
    targets: dict[_Partition, int]        # -> the log end offset the fsync covers
    replies: list[tuple[_Conn, list]]


class _Flusher(threading.Thread):
    """Runs fdatasync for the loop; one round covers every job queued before it started."""

    def __init__(self, notify_fd: int) -> None:
        super().__init__(name="mq-flusher", daemon=True)
        self._notify_fd = notify_fd
        self._cv = threading.Condition()
        self._queue: list[_FlushJob] = []
        self.finished: collections.deque[_FlushJob] = collections.deque()
        self._stopping = False

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
            for fd in {fd for job in jobs for fd in job.fds}:
                try:
                    os.fdatasync(fd)
                except OSError:
                    log.exception("fdatasync failed")
            for job in jobs:
                for fd in job.fds:
                    os.close(fd)
                self.finished.append(job)
            os.write(self._notify_fd, b"\x01")


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
            self._pending_replies.append((conn, reply))

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
                plog.recovery_point = max(plog.recovery_point, min(offset, plog.log_end_offset))
                if not plog.high_watermark_follows_log_end and offset > plog.high_watermark:
                    plog.high_watermark = min(offset, plog.log_end_offset)
                    self._publish(part)
                    self._wake(part)
            for conn, message in job.replies:
                self._send(conn, message)

    def _periodic_flush(self, now: float) -> None:
        """Every ``flush_interval_ms``: fsync what acks=0/1 produces left in the page cache (in
        the flusher thread) and checkpoint recovery points, so an unclean restart re-validates
        at most about one interval of data and a power loss loses at most that much."""
        self._next_flush = now + self.config.flush_interval_ms / 1e3
        for part in self.partitions.values():
            plog = part.log
            if plog.log_end_offset > plog.recovery_point and part not in self._pending_flush:
                self._pending_flush[part] = plog.log_end_offset
        meta = self.metadata.log
        if meta.log_end_offset > meta.recovery_point:
            meta.flush()
        self.logs.checkpoint()
