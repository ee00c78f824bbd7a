"""The broker's log cleaner: Kafka's LogCleaner manager on a thread of its own.

``mq.log.cleaner.clean`` does one pass over one log; this module decides when and over which
log, and makes the pass safe next to the broker's loop thread, which owns every
``PartitionLog`` (appends, rolls, retention, closes)::

    cleaner thread                                 loop thread (selector)
    calls.call(grab) ----------- pipe byte --->    run_pending(): list the logs, their
                                                   sections, pick the filthiest, claim it
    clean(): offset map, recopy into .cleaned      (serving clients meanwhile)
    calls.call(swap) ----------- pipe byte --->    run_pending(): replace_segments, then
                                                   on_swapped (republish the generation)
    cleaner-offset-checkpoint, stats, let go

Invariants:

- while a pass holds a log (``is_cleaning``) the loop neither closes it nor applies retention
  to it (Kafka's ``deletableLogs`` skips logs in progress too): the pass reads segments through
  their descriptors and index maps, which a close frees under it — a recycled descriptor
  number would even read another file. A loop that must close the log calls ``remove``, which
  aborts the pass and waits until it lets go: at most one batch, one fsync of a ``.cleaned``
  segment, or ``ABORT_POLL_S`` for a swap waiting in ``LoopCalls``;
- the cleaner never waits on the loop unconditionally: ``LoopCalls.call`` gives up on a stop
  or an abort as long as the loop has not started the call, so neither ``remove`` nor the
  broker's shutdown (which joins this thread before closing the logs) can deadlock. A swap
  given up that way raises ``ValueError`` in ``clean``, which removes its ``.cleaned`` files
  and leaves the old segments in place;
- ``cleaner-offset-checkpoint`` moves only after a completed pass (the first dirty offset
  becomes the pass's ``next_dirty_offset``), entries of logs that are gone — deleted, or
  deleted and created again under the same name — are dropped, and one thread writes it at a
  time.

Selection, every round (Kafka's ``grabFilthiestCompactedLog``): among logs whose
``cleanup.policy`` contains ``compact``, those ``should_clean`` accepts (dirty ratio above
``min.cleanable.dirty.ratio`` past ``min.compaction.lag.ms``, or overdue by
``max.compaction.lag.ms``), the filthiest first; when none is, a log whose tombstones' delete
horizon (from its last pass) has passed, so tombstones go after ``delete.retention.ms`` even
on a quiet topic. With nothing to do the thread sleeps ``backoff_ms``; ``wake`` and ``stop``
cut the sleep short. A pass never cleans at or past the log's last stable offset.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, Generic, TypeVar

from mq.errors import LogWriteError
from mq.log.cleaner import (
    CleanableRange,
    CleanerConfig,
    CleanerStats,
    clean,
    cleanable_range,
    filthiest,
    max_compaction_delay_ms,
    read_cleaner_checkpoint,
    resolve_first_dirty_offset,
    should_clean,
    write_cleaner_checkpoint,
)
from mq.log.layout import NO_TIMESTAMP
from mq.log.log import PartitionLog
from mq.log.segment import LogSegment

__all__ = ["ABORT_POLL_S", "FAILED_LOG_RETRY_MS", "BackgroundCleaner", "CleanerTotals",
           "LoopCalls"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = tuple[str, int]

# How often a thread waiting in LoopCalls.call looks at should_abort: a stop or an abort is
# noticed within 10 ms, while a call the loop runs normally completes within one round.
ABORT_POLL_S: Final = 0.01
# A pass that failed (corrupt batch, I/O error) keeps its log out of selection this long.
# Kafka marks the partition uncleanable until a restart; retrying heals errors that go away
# (ENOSPC), and a minute keeps a lasting one from becoming a loop of failing passes.
FAILED_LOG_RETRY_MS: Final = 60_000


def _wall_ms() -> int:
    return int(time.time() * 1000)


# --- running calls on the loop thread -----------------------------------------------------------

class _Call(Generic[T]):
    """One queued call and its outcome."""

    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.result: T | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as err:
            self.error = err
            if not isinstance(err, Exception):
                raise              # SystemExit and the like end the loop too
        finally:
            self.done.set()


class LoopCalls:
    """Lets other threads run callables on the loop thread and wait for the result.

    The loop registers ``fileno()`` (the read end of a pipe) in its selector and calls
    ``run_pending()`` when it is readable; ``call`` queues a callable, writes a byte to the
    pipe and waits. Calls run in the order they were queued.
    """

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._lock = threading.Lock()
        self._queue: collections.deque[_Call[Any]] = collections.deque()
        self._closed = False

    def fileno(self) -> int:
        return self._r

    def call(self, fn: Callable[[], T], should_abort: Callable[[], bool]) -> T:
        """Run ``fn`` on the loop thread; return its result or raise its exception.

        Raises ``ValueError("broker stopping")`` without running ``fn`` when ``should_abort()``
        turns true before the loop started it, or when the calls are (or get) closed.
        """
        pending: _Call[T] = _Call(fn)
        with self._lock:
            if self._closed:
                raise ValueError("broker stopping")
            self._queue.append(pending)
            try:
                os.write(self._w, b"\x01")
            except BlockingIOError:
                pass                 # the pipe is full: the loop has wake-ups queued already
        while not pending.done.wait(ABORT_POLL_S):
            if should_abort() and self._cancel(pending):
                raise ValueError("broker stopping")
        if pending.error is not None:
            raise pending.error
        return pending.result  # type: ignore[return-value]

    def _cancel(self, pending: _Call[Any]) -> bool:
        """Take ``pending`` off the queue; False when the loop already took it (it then
        finishes within the loop's current round)."""
        with self._lock:
            try:
                self._queue.remove(pending)
            except ValueError:
                return False
            return True

    def run_pending(self) -> None:
        """On the loop thread, when ``fileno()`` is readable: drain the pipe, run the queue.
        A call queued after the drain leaves its byte behind: one more (empty) wake-up."""
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            with self._lock:
                if not self._queue:
                    return
                pending = self._queue.popleft()
            pending.run()

    def close(self) -> None:
        """Fail the calls not run yet with ``ValueError("broker stopping")`` and close the
        pipe. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            failed, self._queue = self._queue, collections.deque()
            os.close(self._r)
            os.close(self._w)
        for pending in failed:
            pending.error = ValueError("broker stopping")
            pending.done.set()


# --- the cleaner thread -------------------------------------------------------------------------

@dataclasses.dataclass(slots=True)
class CleanerTotals:
    """Cumulative figures since the cleaner started (what Kafka's cleaner metrics report)."""

    passes: int = 0                  # passes that returned: completed or stopped early
    completed: int = 0
    failures: int = 0                # passes that raised (logged, log retried later)
    bytes_read: int = 0
    bytes_written: int = 0
    elapsed: float = 0.0             # seconds inside clean()
    last: dict[Key, CleanerStats] = dataclasses.field(default_factory=dict)

    @property
    def throughput_mb_s(self) -> float:
        """Recopy throughput over every pass, in MB/s (2^20 bytes), as CleanerStats'."""
        return self.bytes_read / (1 << 20) / self.elapsed if self.elapsed > 0 else 0.0

    def add(self, key: Key, stats: CleanerStats) -> None:
        self.passes += 1
        self.completed += stats.completed
        self.bytes_read += stats.bytes_read
        self.bytes_written += stats.bytes_written
        self.elapsed += stats.elapsed
        self.last[key] = stats


@dataclasses.dataclass(slots=True)
class _Known:
    """What the cleaner remembers about a live log between rounds."""

    plog: PartitionLog
    delete_horizon_ms: int = NO_TIMESTAMP    # earliest horizon of a tombstone kept last pass
    retry_at_ms: int = 0                     # after a failed pass


@dataclasses.dataclass(frozen=True, slots=True)
class _Job:
    plog: PartitionLog
    first_dirty_offset: int
    last_stable_offset: int
    now_ms: int


class BackgroundCleaner(threading.Thread):
    """Runs cleaning passes over the broker's compacted logs (see the module docstring).

    ``list_logs`` is called on the loop thread (through ``calls``) and returns every open
    ``PartitionLog``; ``on_swapped(plog)`` runs there after each swap. ``clock`` gives the
    wall clock in ms (tests pass their own).
    """

    def __init__(self, calls: LoopCalls, list_logs: Callable[[], Iterable[PartitionLog]],
                 data_dir: str, *, config: CleanerConfig | None = None,
                 backoff_ms: int = 15_000,
                 on_swapped: Callable[[PartitionLog], None] = lambda plog: None,
                 clock: Callable[[], int] = _wall_ms) -> None:
        super().__init__(name="mq-cleaner", daemon=True)
        self.data_dir = data_dir
        self._calls = calls
        self._list_logs = list_logs
        self._cleaner_config = config or CleanerConfig()
        self._backoff_s = backoff_ms / 1000
        self._on_swapped = on_swapped
        self._clock = clock
        self._stopping = threading.Event()
        self._wakeup = threading.Event()
        # Guards what both threads touch: the claimed and aborted logs, the checkpoint (and
        # its file), the per-log memory and the totals.
        self._cond = threading.Condition()
        self._current: PartitionLog | None = None
        self._aborting: PartitionLog | None = None
        self._checkpoint: dict[Key, int] = {}
        self._known: dict[Key, _Known] = {}
        self._totals = CleanerTotals()

    # --- control (any thread) ---------------------------------------------------------------
    def wake(self) -> None:
        """Start the next round now (a topic became compacted, or got dirtier)."""
        self._wakeup.set()

    def stop(self) -> None:
        """Ask the thread to finish: a pass in progress stops at its next batch or swap."""
        self._stopping.set()
        self._wakeup.set()

    def totals(self) -> CleanerTotals:
        """A copy of the cumulative figures."""
        with self._cond:
            return dataclasses.replace(self._totals, last=dict(self._totals.last))

    def is_cleaning(self, plog: PartitionLog) -> bool:
        """Whether a pass holds ``plog`` (exact on the loop thread, which claims logs)."""
        return self._current is plog

    def remove(self, plog: PartitionLog) -> None:
        """On the loop thread, before it closes or deletes ``plog``: abort a pass over it,
        wait until the pass lets go, and drop its checkpoint entry, so a topic created again
        under the same name starts from its log start. Not from inside a ``LoopCalls`` call:
        the pass may be waiting for that very call. Raises ``OSError`` when the checkpoint
        cannot be written."""
        key = (plog.topic, plog.partition)
        with self._cond:
            self._aborting = plog
            try:
                while self._current is plog:
                    self._cond.wait()
            finally:
                self._aborting = None
            self._known.pop(key, None)
            if self._checkpoint.pop(key, None) is not None:
                write_cleaner_checkpoint(self.data_dir, self._checkpoint)

    # --- the thread -------------------------------------------------------------------------
    def run(self) -> None:
        try:
            with self._cond:
                self._checkpoint = read_cleaner_checkpoint(self.data_dir)
        except OSError:
            log.exception("log cleaner: cannot read the checkpoint; cleaning from log starts")
        while not self._stopping.is_set():
            self._wakeup.clear()             # a wake() from here on cuts the next sleep short
            try:
                busy = self._round()
            except Exception:                # a bug or a failed checkpoint write: next round
                log.exception("log cleaner: round failed")
                busy = False
            if not busy:
                self._wakeup.wait(self._backoff_s)
        totals = self.totals()
        log.info("log cleaner stopped: %d pass(es), %.1f MB read, %.1f MB written, %.1f MB/s",
                 totals.passes, totals.bytes_read / (1 << 20), totals.bytes_written / (1 << 20),
                 totals.throughput_mb_s)

    def _round(self) -> bool:
        """Claim the filthiest log (on the loop thread) and clean it; True when the next
        round may start at once (see ``_run_pass``)."""
        try:
            job, pruned = self._calls.call(self._grab_filthiest, self._stopping.is_set)
        except ValueError:
            if self._stopping.is_set():
                return False                 # the broker is stopping: no error
            raise
        if pruned:
            with self._cond:
                write_cleaner_checkpoint(self.data_dir, self._checkpoint)
        return job is not None and self._run_pass(job)

    def _should_stop(self, plog: PartitionLog) -> bool:
        return self._stopping.is_set() or self._aborting is plog

    def _grab_filthiest(self) -> tuple[_Job | None, bool]:
        """On the loop thread: claim the log to clean next; also forget logs that are gone.
        Returns the job and whether checkpoint entries were dropped."""
        now = self._clock()
        live = {(p.topic, p.partition): p for p in self._list_logs() if not p.closed}
        with self._cond:
            pruned = self._prune(live)
            candidates = []
            expired = []
            for key, plog in live.items():
                if not plog.config.compact_enabled or plog.offline is not None:
                    continue          # an offline log takes no swap until a restart
                known = self._known.setdefault(key, _Known(plog))
                if known.retry_at_ms > now:
                    continue
                job, rng, delay = self._assess(plog, self._checkpoint.get(key), now)
                if should_clean(rng, plog.config, delay):
                    candidates.append((job, rng, delay))
                elif 0 <= known.delete_horizon_ms <= now:
                    expired.append((known.delete_horizon_ms, job))
            job = filthiest(candidates)
            if job is None and expired:
                job = min(expired, key=lambda item: item[0])[1]
            if job is not None:
                self._current = job.plog
        return job, pruned

    def _prune(self, live: dict[Key, PartitionLog]) -> bool:
        """Forget logs no longer open (or replaced by a new log under the same name) and
        checkpoint entries without a live log; True when the checkpoint changed."""
        gone = {key for key, known in self._known.items() if live.get(key) is not known.plog}
        for key in gone:
            del self._known[key]
        stale = [key for key in self._checkpoint if key not in live or key in gone]
        for key in stale:
            del self._checkpoint[key]
        return bool(stale)

    @staticmethod
    def _assess(plog: PartitionLog, checkpointed: int | None, now_ms: int
                ) -> tuple[_Job, CleanableRange, int]:
        """The job for ``plog``, its sections and how overdue it is (loop thread)."""
        cfg = plog.config
        metas = [seg.meta() for seg in plog.segments]
        first_dirty, _ = resolve_first_dirty_offset(checkpointed, plog.log_start_offset,
                                                    plog.log_end_offset)
        active = plog.active_segment.base_offset
        lso = plog.last_stable_offset
        rng = cleanable_range(metas, first_dirty, active, lso, now_ms, cfg.min_compaction_lag_ms)
        delay = max_compaction_delay_ms(metas, first_dirty, active, now_ms,
                                        cfg.max_compaction_lag_ms)
        return _Job(plog, first_dirty, lso, now_ms), rng, delay

    def _run_pass(self, job: _Job) -> bool:
        """One pass over the claimed log, then let go of it. True when the pass completed
        or failed (the log then waits ``FAILED_LOG_RETRY_MS``, the others need not); False
        when it stopped early — stopping, an aborted log, a refused swap — so the thread
        sleeps before it retries, rather than spin on a refusal that persists."""
        plog = job.plog
        key = (plog.topic, plog.partition)
        try:
            stats = clean(plog, job.now_ms, self._cleaner_config,
                          first_dirty_offset=job.first_dirty_offset,
                          last_stable_offset=job.last_stable_offset,
                          swap=lambda new, old, now_ms: self._swap(plog, new, old, now_ms),
                          should_stop=lambda: self._should_stop(plog))
            self._record(plog, stats)
            return stats.completed
        except Exception as err:
            if isinstance(err, (OSError, LogWriteError)):     # a full disk: no traceback
                log.warning("log cleaner: pass over %s failed (%s); the log is skipped for "
                            "%d s", plog.dir, err, FAILED_LOG_RETRY_MS // 1000)
            else:
                log.exception("log cleaner: pass over %s failed; the log is skipped for %d s",
                              plog.dir, FAILED_LOG_RETRY_MS // 1000)
            with self._cond:
                self._totals.failures += 1
                known = self._known.get(key)
                if known is not None:
                    known.retry_at_ms = self._clock() + FAILED_LOG_RETRY_MS
            return True
        finally:
            with self._cond:
                self._current = None
                self._cond.notify_all()

    def _swap(self, plog: PartitionLog, new: LogSegment, old: list[LogSegment],
              now_ms: int) -> None:
        """``clean``'s swap: ``replace_segments`` and ``on_swapped``, on the loop thread."""
        def install() -> None:
            plog.replace_segments(new, old, now_ms)
            self._on_swapped(plog)
        self._calls.call(install, lambda: self._should_stop(plog))

    def _record(self, plog: PartitionLog, stats: CleanerStats) -> None:
        """Totals; after a completed pass, the checkpoint and the delete horizon. Runs while
        the log is still claimed, so a ``remove`` waiting for it drops the entry after."""
        key = (plog.topic, plog.partition)
        with self._cond:
            self._totals.add(key, stats)
            if not stats.completed:
                # An abort for remove() surfaces as LoopCalls' "broker stopping": say why.
                reason = "log removed" if self._aborting is plog else stats.stopped_reason
                log.info("log cleaner: pass over %s stopped early: %s", plog.dir, reason)
                return
            known = self._known.get(key)
            if known is not None:
                known.delete_horizon_ms = stats.next_delete_horizon_ms
            self._checkpoint[key] = stats.next_dirty_offset
            write_cleaner_checkpoint(self.data_dir, self._checkpoint)
