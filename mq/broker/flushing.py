"""Group commit: the broker's flusher thread, the pure bookkeeping of what each fsync
acknowledges, and the event loop's side of both.

The loop thread never fsyncs a partition log's appended data: an ``acks="all"`` produce (or an
offset commit) holds its reply in the ``FlushTracker`` with the log end offset its fsync must
cover (with ``high_watermark = "durable"`` every produce is held so); at the end of the round
``GroupCommit.submit`` hands one job — duplicated descriptors of the segments past each recovery
point — to the ``Flusher`` thread, which runs ``fdatasync`` with the GIL released and tells the
loop through a pipe. ``GroupCommit.done`` then advances the recovery points (in durable mode
also the high watermark) and sends the held replies, so one fsync covers every produce that
arrived while the previous one ran. ``GroupCommit.periodic`` does the same every
``flush_interval_ms`` for what acks=0/1 produces left in the page cache. What the loop does
fsync itself is small and rare: the metadata log's record before it answers a topic change,
checkpoint files, and the directory after a roll, a retention deletion or a compaction swap.

A failed ``fdatasync`` is never retried and never followed by an acknowledgement for that
partition: the kernel reports a writeback error once per open file description and may have
dropped the pages it could not write, so a later fsync of the same file can return 0 over a
hole (PostgreSQL's "fsyncgate"). The flusher remembers every partition whose fsync failed and
fails each later job's targets on it without looking; the loop takes the log offline
(``PartitionLog.fsync_failed``) and answers the held replies with ``KAFKA_STORAGE_ERROR``.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable

from mq import errors
from mq.broker.conns import Conn, Connections
from mq.broker.partitions import Partition, PartitionTable
from mq.broker.wakeups import StatePublisher
from mq.log import diskio
from mq.log.log import PartitionLog
from mq.protocol.messages import response

__all__ = ["FlushJob", "FlushTracker", "Flusher", "FsyncLatency", "GroupCommit", "HeldReply"]

log = logging.getLogger("mq.broker")

# A reply held until an fsync covers its partition: (connection, response, partition).
HeldReply = tuple[Conn, list, Partition]
# Called once an fsync covered every partition of a set, with the ones whose fsync failed.
DurableCallback = Callable[[dict[Partition, OSError]], None]


@dataclasses.dataclass(eq=False)
class FlushJob:
    fds: dict[Partition, list[int]]
    targets: dict[Partition, int]        # -> the log end offset the fsync covers
    replies: list[HeldReply]
    failed: dict[Partition, OSError] = dataclasses.field(default_factory=dict)
    callbacks: list[tuple[frozenset[Partition], DurableCallback]] = \
        dataclasses.field(default_factory=list)


class FsyncLatency:
    """How long each ``fdatasync`` took: cumulative bucket counts and a sum, as a Prometheus
    histogram reports them. Only the flusher thread writes; a reader on another thread
    (``snapshot``) copies the lists under the GIL and may see one observation half counted
    (in a bucket, not yet in the sum), which a scrape of cumulative counters tolerates."""

    # Seconds: page-cache-only tmpfs at the low end, a struggling disk at the high end.
    BOUNDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
              0.5, 1.0, 2.5, 5.0, 10.0, math.inf)

    def __init__(self) -> None:
        self.counts = [0] * len(self.BOUNDS)          # per bucket, not cumulative
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.BOUNDS, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> dict:
        """``count``, ``sum_seconds`` and ``buckets``: [[upper bound, cumulative count]]."""
        counts, total = list(self.counts), self.sum
        return {"count": sum(counts), "sum_seconds": total,
                "buckets": [[bound, n] for bound, n in zip(self.BOUNDS,
                                                           itertools.accumulate(counts),
                                                           strict=True)]}


class Flusher(threading.Thread):
    """Runs fdatasync for the loop; one round covers every job queued before it started."""

    def __init__(self, notify_fd: int) -> None:
        super().__init__(name="mq-flusher", daemon=True)
        self.latency = FsyncLatency()
        self._notify_fd = notify_fd
        self._cv = threading.Condition()
        self._queue: list[FlushJob] = []
        self.finished: collections.deque[FlushJob] = collections.deque()
        self._stopping = False
        self._failed: dict[Partition, OSError] = {}     # only this thread touches it

    def submit(self, job: FlushJob) -> None:
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
                        started = time.perf_counter()
                        try:
                            diskio.ops.fdatasync(fd)
                        except OSError as err:
                            self._failed[part] = err
                            break
                        finally:
                            self.latency.observe(time.perf_counter() - started)
            for job in jobs:
                job.failed = {part: self._failed[part] for part in job.targets
                              if part in self._failed}
                for fds in job.fds.values():
                    for fd in fds:
                        diskio.ops.close(fd)
                self.finished.append(job)
            os.write(self._notify_fd, b"\x01")


def storage_error(reply: list, message: str) -> list:
    """The error answer to the request that ``reply`` would have answered."""
    return response(reply[0], reply[1], errors.KafkaStorageError.code, message)


class FlushTracker:
    """What the next fsync must cover and which replies wait for it; what a finished one
    acknowledges. Pure: partitions and connections are only keys here."""

    def __init__(self) -> None:
        self.targets: dict[Partition, int] = {}       # -> log end offset to fsync
        self.replies: list[HeldReply] = []
        self.callbacks: list[tuple[frozenset[Partition], DurableCallback]] = []
        self.inflight = 0                             # jobs submitted, not yet done

    def hold(self, part: Partition, offset: int, conn: Conn | None = None,
             reply: list | None = None) -> None:
        """Have this round's job fsync ``part`` up to ``offset`` (and send ``reply`` on
        ``conn`` once it did)."""
        self.targets[part] = offset
        if conn is not None:
            self.replies.append((conn, reply, part))

    def on_durable(self, offsets: dict[Partition, int], callback: DurableCallback) -> None:
        """Call ``callback(failed)`` once this round's job made each partition durable up to
        its offset (``failed``: those whose fsync failed, or could not be tried)."""
        for part, offset in offsets.items():
            self.targets[part] = max(self.targets.get(part, 0), offset)
        self.callbacks.append((frozenset(offsets), callback))

    def want(self, part: Partition, offset: int) -> None:
        """Fsync ``part`` up to ``offset`` in this round's job, unless it is in already."""
        if part not in self.targets:
            self.targets[part] = offset

    def drop(self, part: Partition) -> None:
        """``part`` is gone (its topic deleted): nothing to fsync."""
        self.targets.pop(part, None)

    def __bool__(self) -> bool:
        return bool(self.targets or self.replies or self.callbacks)

    def take(self) -> tuple[dict[Partition, int], list[HeldReply],
                            list[tuple[frozenset[Partition], DurableCallback]]]:
        """This round's targets, held replies and callbacks; the tracker starts the next
        round empty."""
        taken = self.targets, self.replies, self.callbacks
        self.targets, self.replies, self.callbacks = {}, [], []
        return taken

    @staticmethod
    def refuse(replies: list[HeldReply], undone: dict[Partition, OSError]
               ) -> tuple[list[tuple[Conn, list]], list[HeldReply]]:
        """Split held replies at submission: (answers now, for partitions that cannot be
        synced this round — retriable storage errors, nothing acknowledged; the rest)."""
        answers, kept = [], []
        for conn, reply, part in replies:
            if part in undone:
                answers.append((conn, storage_error(
                    reply, f"{part.topic}-{part.partition} could not be fsynced: "
                           f"{undone[part]}; nothing was acknowledged")))
            else:
                kept.append((conn, reply, part))
        return answers, kept

    @staticmethod
    def settle(job: FlushJob) -> list[tuple[Conn, list]]:
        """What a finished job acknowledges: each held reply, or a storage error for a
        partition whose fsync failed (it is offline from now on)."""
        answers = []
        for conn, message, part in job.replies:
            err = job.failed.get(part)
            if err is not None:
                message = storage_error(
                    message, f"{part.topic}-{part.partition}: fsync failed "
                             f"({err.strerror or err}); nothing was acknowledged and the "
                             "partition is offline until a broker restart recovers it")
            answers.append((conn, message))
        return answers


class GroupCommit:
    """The loop's side of group commit: submits the round's job to the flusher thread and
    applies what it reports."""

    def __init__(self, table: PartitionTable, conns: Connections,
                 publisher: StatePublisher) -> None:
        self.tracker = FlushTracker()
        self._table = table
        self._conns = conns
        self._publisher = publisher
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._flusher = Flusher(self._w)

    def fileno(self) -> int:
        """Readable when the flusher finished a job (``done``)."""
        return self._r

    @property
    def inflight(self) -> int:
        return self.tracker.inflight

    @property
    def fsync_latency(self) -> FsyncLatency:
        return self._flusher.latency

    def start(self) -> None:
        self._flusher.start()

    def on_durable(self, parts, callback: DurableCallback) -> None:
        """Call ``callback(failed)`` once an fsync made every partition of ``parts`` durable up
        to its log end now (the multi-step writes of a transaction chain on it)."""
        offsets = {part: part.log.log_end_offset for part in parts}
        self.tracker.on_durable(offsets, callback)
        self._table.touched.update(offsets)

    def ack_after_flush(self, part: Partition, conn: Conn | None = None,
                        reply: list | None = None) -> None:
        """Fsync what ``part`` holds now in this round's job (and send ``reply`` once it
        did); ``part``'s state is published at the end of the round."""
        self.tracker.hold(part, part.log.log_end_offset, conn, reply)
        self._table.touched.add(part)

    def submit(self) -> None:
        """End of a round: one job for every partition to fsync. A partition whose segment
        descriptors cannot be duplicated (out of descriptors) is not synced this round: its
        held replies fail with a retriable storage error, and the log stays online."""
        if not self.tracker:
            return
        targets, replies, callbacks = self.tracker.take()
        fds: dict[Partition, list[int]] = {}
        undone: dict[Partition, OSError] = {}
        for part in list(targets):
            plog = part.log
            if plog.offline is not None or plog.closed:
                undone[part] = OSError(plog.offline or "log closed")
                del targets[part]
                continue
            try:
                fds[part] = _dup_unflushed(plog)
            except OSError as err:
                undone[part] = err
                del targets[part]
        answers, replies = FlushTracker.refuse(replies, undone)
        for conn, message in answers:
            self._conns.send(conn, message)
        kept = []
        for parts, callback in callbacks:
            failed = {part: undone[part] for part in parts if part in undone}
            if failed:
                callback(failed)
            else:
                kept.append((parts, callback))
        if targets or replies or kept:
            self.tracker.inflight += 1
            self._flusher.submit(FlushJob(fds, targets, replies, callbacks=kept))

    def done(self) -> None:
        """The flusher finished jobs: advance recovery points (and durable high watermarks)
        and send the replies they held."""
        try:
            os.read(self._r, 4096)
        except BlockingIOError:
            pass
        finished = self._flusher.finished
        while finished:
            job = finished.popleft()
            self.tracker.inflight -= 1
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
                    self._publisher.publish(part)
                    self._publisher.wake(part)
            for conn, message in FlushTracker.settle(job):
                self._conns.send(conn, message)
            for parts, callback in job.callbacks:
                callback({part: job.failed[part] for part in parts if part in job.failed})

    def periodic(self, metadata_log: PartitionLog) -> None:
        """Every ``flush_interval_ms``: queue an fsync (in the flusher thread) of what acks=0/1
        produces left in the page cache, and fsync the metadata log's stragglers here, so an
        unclean restart re-validates at most about one interval of data and a power loss
        loses at most that much. The caller checkpoints recovery points after it."""
        for part in self._table:
            plog = part.log
            if plog.log_end_offset > plog.recovery_point and plog.offline is None:
                self.tracker.want(part, plog.log_end_offset)
        if metadata_log.log_end_offset > metadata_log.recovery_point and \
                metadata_log.offline is None:
            try:
                metadata_log.flush()
            except errors.LogWriteError:
                pass                       # offline now; logged by the log

    def stop(self) -> None:
        """Stop the flusher thread and wait for it (idempotent)."""
        self._flusher.stop()
        if self._flusher.is_alive():
            self._flusher.join()

    def close(self) -> None:
        self.stop()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


def _dup_unflushed(plog: PartitionLog) -> list[int]:
    """Duplicated descriptors of the segments past the recovery point (a suffix of the list);
    on failure none is left open."""
    dups: list[int] = []
    try:
        for seg in reversed(plog.segments):
            if seg.next_offset <= plog.recovery_point:
                break
            if not seg.closed:
                dups.append(seg.dup_fd())
    except OSError:
        for fd in dups:
            diskio.ops.close(fd)
        raise
    return dups
