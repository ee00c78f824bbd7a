"""A data directory: every partition log in it, its lock, checkpoints and shutdown marker.

Open sequence (Kafka's ``LogManager.loadLogs``): check that the path may be used
(``datadir.prepare``: missing, empty, or a log dir by its ``meta.properties``; anything else is
refused with nothing changed); take the ``.lock`` (flock, one owner per data dir); note whether
``.kafka_cleanshutdown`` exists and delete it at once (a crash while loading must count as
unclean); read ``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint``; list
the ``<topic>-<partition>/`` directories; open and recover the ones the caller names
(``load``); set aside the ones nobody named (``finish_loading``, ``datadir.set_aside``): a
directory is opened, and so written to, only once something says it is a partition.

Close sequence: flush and close every log, write both checkpoints (recovery point = log end),
then write the marker, fsynced. Checkpoints are written atomically (temp, fsync, rename, fsync
dir), so a crash leaves the previous or the next checkpoint; the broker's periodic one is
written by a thread of its own (``checkpoint_in_background``), one write at a time and never
an older one over a newer one. A partition found on disk but not
loaded yet keeps its checkpoint entries, and a close before loading finished (a start that
failed) writes no clean-shutdown marker: what was not opened was not recovered.

Write failures: a checkpoint that cannot be written (a full disk) keeps the previous file and
is retried at the next one (a stale checkpoint only lengthens recovery), never stopping the
broker. After any write failure in the data dir — a failed checkpoint, a log's failed append,
fsync or close, an offline log — close writes no clean-shutdown marker (KAFKA-13773), and an
offline log's recovery point stays at its last good fsync, so the next start recovers from
disk.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from mq.errors import ClosedError, DataDirError, LogDirLockedError
from mq.log import datadir, diskio, files, partition_metadata
from mq.log.config import LogConfig
from mq.log.log import PartitionLog

__all__ = ["LogManager"]

log = logging.getLogger(__name__)

LOCK_RETRY_S = 0.1


def _read_checkpoint_or_empty(path: str) -> dict[tuple[str, int], int]:
    """A damaged checkpoint is not fatal (Kafka warns and carries on): without it every
    segment is validated (recovery point 0) and the log start falls back to the first
    segment — slower, never lossy."""
    try:
        return files.read_checkpoint(path)
    except files.CheckpointError as err:
        log.warning("ignoring damaged checkpoint: %s", err)
        return {}


class LogManager:
    """Owns ``data_dir`` while open. ``config_for(topic)`` supplies each topic's config."""

    def __init__(self, data_dir: str,
                 config_for: Callable[[str], LogConfig] | None = None) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.config_for = config_for or (lambda topic: LogConfig())
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self.clean_shutdown = False
        self.closed = True
        self._lock_fd = -1
        self.write_failures = 0           # the data dir's own (checkpoints, topic removal)
        self.leader_epoch = 0             # this start's epoch, stamped into every batch
        # Partition directories found at open and not loaded yet: (topic, partition) -> path.
        self.unloaded: dict[tuple[str, int], str] = {}
        self._recovery: dict[tuple[str, int], int] = {}
        self._starts: dict[tuple[str, int], int] = {}
        self._now_ms: int | None = None
        self._progress: Callable[[int, int], None] | None = None
        self._loaded = 0
        self._total = 0
        # Checkpoint writes (``checkpoint``, ``checkpoint_in_background``): one at a time,
        # numbered as taken, so an older one never lands over a newer one.
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_seq = 0
        self._written_seq = 0
        self._writer: ThreadPoolExecutor | None = None
        self._writing: Future | None = None
        self._written: list | None = None  # a background write's points, to prune

    @classmethod
    def open(cls, data_dir: str, config_for: Callable[[str], LogConfig] | None = None,
             now_ms: int | None = None,
             progress: Callable[[int, int], None] | None = None, *,
             load_all: bool = True) -> LogManager:
        """Check, lock and load ``data_dir``. ``progress(done, total)`` hears of loading as it
        moves: once with ``(0, total)`` partitions, then after every segment loaded or
        recovered (``done`` counts the partitions finished), so a caller can tell a long
        recovery that advances from one that hangs (the broker extends systemd's start timeout
        with it).

        ``load_all``: open every partition directory found that holds only files mq names,
        for a caller that owns the data dir (tests, tools); the broker passes False, then ``load``s what its metadata lists and
        calls ``finish_loading``, which sets the rest aside.

        Raises ``DataDirError`` (nothing changed) when ``data_dir`` may not be used,
        ``LogDirLockedError`` when another process holds it."""
        self = cls(data_dir, config_for)
        # abspath("") is the current directory: an empty path must reach prepare as it is.
        created = datadir.prepare(self.data_dir if data_dir else "")
        self._lock()
        if not created:
            _warn_if_open_to_others(self.data_dir, diskio.ops.dir_mode)
        self._now_ms = now_ms
        self._progress = progress
        try:
            self._start()
            if load_all:
                self.load([key for key, path in self.unloaded.items()
                           if datadir.classify(path) is datadir.DirKind.PARTITION])
                self.finish_loading()
        except BaseException:
            self._unlock()
            raise
        self.closed = False
        return self

    def _lock(self) -> None:
        fd = os.open(os.path.join(self.data_dir, files.LOCK_FILE), os.O_RDWR | os.O_CREAT,
                     diskio.ops.file_mode)
        # ``mq log check`` probes the lock with a shared flock for a moment: a start that
        # meets such a probe tries again for up to LOCK_RETRY_S before it gives up.
        deadline = time.monotonic() + LOCK_RETRY_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as err:
                if time.monotonic() < deadline:
                    time.sleep(0.005)
                    continue
                os.close(fd)
                raise LogDirLockedError(f"{self.data_dir} is in use by another process "
                                        "(is a broker already running on it?)") from err
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)        # closing the fd releases the flock
            self._lock_fd = -1

    def _start(self) -> None:
        meta = os.path.join(self.data_dir, files.META_FILE)
        if not os.path.exists(meta):
            files.atomic_write(meta, f"version=0\ncluster.id={uuid.uuid4().hex}\n"
                               "node.id=0\n".encode())
        marker = os.path.join(self.data_dir, files.CLEAN_SHUTDOWN_FILE)
        self.clean_shutdown = os.path.exists(marker)
        if self.clean_shutdown:
            os.unlink(marker)
            files.fsync_dir(self.data_dir)
        self._recovery = _read_checkpoint_or_empty(
            os.path.join(self.data_dir, files.RECOVERY_POINT_CHECKPOINT))
        self._starts = _read_checkpoint_or_empty(
            os.path.join(self.data_dir, files.LOG_START_OFFSET_CHECKPOINT))
        for name in sorted(os.listdir(self.data_dir)):
            path = os.path.join(self.data_dir, name)
            if not os.path.isdir(path):
                continue
            if datadir.is_deletion_leftover(name) and not os.path.islink(path):
                _remove(path)                  # a topic deletion that did not finish
                continue
            parsed = files.parse_partition_dir(name)
            if parsed is not None:
                self.unloaded[parsed] = path
        self._total = len(self.unloaded)
        if self._progress is not None:
            self._progress(0, self._total)

    def load(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Open and recover those of ``partitions`` whose directories are on disk and not open
        yet (the others are skipped: ``create`` makes new ones)."""
        for key in partitions:
            path = self.unloaded.pop(key, None)
            if path is None:
                continue
            step = None if self._progress is None else self._step
            self.logs[key] = PartitionLog.open(
                path, self.config_for(key[0]), recovery_point=self._recovery.get(key, 0),
                log_start_offset=self._starts.get(key, 0), clean_shutdown=self.clean_shutdown,
                now_ms=self._now_ms, on_segment=step)
            self._loaded += 1
            if step is not None:
                step()

    def _step(self) -> None:
        assert self._progress is not None
        self._progress(self._loaded, self._total)

    def finish_loading(self) -> None:
        """Set aside every partition directory no one loaded (``datadir.set_aside``: an mq
        partition is renamed ``*-stray`` and kept, anything else left as it is), write the
        checkpoints, and fix this start's leader epoch."""
        for key, path in sorted(self.unloaded.items()):
            datadir.set_aside(self.data_dir, os.path.basename(path))
        self.unloaded.clear()
        self.checkpoint()
        # One broker: every start is a new leader epoch, above any a partition recorded.
        self.leader_epoch = 1 + max((lg.leader_epochs.latest_epoch for lg in self.logs.values()),
                                    default=0)
        if not self._total:               # no partition on disk at start: a new data dir
            log.info("%s: new data directory", self.data_dir)
        else:
            internal = sum(1 for topic, _ in self.logs if topic.startswith("__"))
            log.info("%s: opened %d partition log(s) (%d of internal topics) after %s "
                     "shutdown", self.data_dir, len(self.logs), internal,
                     "a clean" if self.clean_shutdown else "an unclean")

    # --- partitions ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"{self.data_dir}: log manager is closed")

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))

    def create(self, topic: str, partition: int, config: LogConfig | None = None, *,
               topic_id: str | None = None) -> PartitionLog:
        """Create (or return) the log of a partition; a new one gets ``partition.metadata``
        when ``topic_id`` (32 hex digits) is given. Raises ``DataDirError`` when its
        directory's name is taken by something mq did not open as a partition (a directory
        left alone at open, a file): mq writes into no directory it did not make."""
        self._check_open()
        files.validate_topic_name(topic)
        key = (topic, partition)
        if key not in self.logs:
            if key in self.unloaded:
                self.load([key])
                return self.logs[key]
            path = os.path.join(self.data_dir, files.partition_dir_name(topic, partition))
            if os.path.lexists(path):
                raise DataDirError(f"{path} exists and is not a partition of this broker: "
                                   "move it out of the data dir to create this partition")
            plog = PartitionLog.open(path, config or self.config_for(topic))
            try:
                if topic_id is not None:
                    partition_metadata.write_topic_id(path, topic_id)
                files.fsync_dir(self.data_dir)
            except BaseException:
                plog.close()
                _remove(path)
                raise
            self.logs[key] = plog
        return self.logs[key]

    def delete(self, topic: str, partition: int) -> None:
        """Remove a partition: rename its directory to ``<name>.<uuid>-delete`` (atomic), then
        remove it; an interrupted removal is finished at the next open."""
        self._check_open()
        plog = self.logs.pop((topic, partition), None)
        if plog is None:
            return
        plog.close()
        doomed = datadir.renamed(plog.dir, datadir.DELETE_SUFFIX)
        try:
            diskio.ops.rename(plog.dir, doomed)
            files.fsync_dir(self.data_dir)
        except OSError as err:
            # The topic is gone from the metadata: the next start removes a renamed
            # directory, and sets aside (keeps) one the rename did not reach.
            self.write_failures += 1
            log.warning("%s: not removed now (%s); the next start removes or sets it aside",
                        plog.dir, err)
            if not os.path.exists(doomed):
                return
        _remove(doomed)

    def __iter__(self) -> Iterator[PartitionLog]:
        return iter(list(self.logs.values()))

    # --- checkpoints and lifecycle ------------------------------------------------------------
    def checkpoint(self) -> bool:
        """Write both checkpoint files from the logs' current state; False (logged, the old
        files kept) when they could not be written."""
        taken = self._checkpoint_contents()
        if not self._write_checkpoints(*taken[:3]):
            return False
        self._prune(taken[3])
        return True

    def checkpoint_in_background(self) -> None:
        """The periodic checkpoint, its files written by a thread of their own: the writes
        are fsynced (milliseconds), and the caller, the broker's loop, serves meanwhile. What
        is written is taken here, from recovery points that only completed fsyncs moved, so a
        late write is stale at worst, never ahead of the data. Skipped while the last one is
        still being written (the next one is fresher); the producer snapshots below what it
        wrote are pruned at the next call, on the caller's thread."""
        done, self._written = self._written, None
        if done is not None:
            self._prune([(key, lg, point) for key, lg, point in done
                         if self.logs.get(key) is lg and not lg.closed])
        if self._writing is not None and not self._writing.done():
            return
        seq, recovery, starts, points = self._checkpoint_contents()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="mq-checkpoint")

        def write() -> None:
            if self._write_checkpoints(seq, recovery, starts):
                self._written = points
        self._writing = self._writer.submit(write)

    def _checkpoint_contents(self) -> tuple[int, dict, dict, list]:
        """What the checkpoints say now, numbered: ``(seq, recovery points, log starts,
        [(key, log, recovery point)])``."""
        for lg in self.logs.values():
            lg.take_recovery_snapshot()
        points = [(k, lg, lg.recovery_point) for k, lg in self.logs.items()]
        # A partition not loaded (yet) keeps what the last checkpoints said of it.
        kept = [k for k in self.unloaded if k in self._recovery or k in self._starts]
        recovery = {**{k: self._recovery[k] for k in kept if k in self._recovery},
                    **{k: point for k, _, point in points}}
        starts = {**{k: self._starts[k] for k in kept if k in self._starts},
                  **{k: lg.log_start_offset for k, lg in self.logs.items()
                     if lg.log_start_offset > lg.segments[0].base_offset}}
        self._checkpoint_seq += 1
        return self._checkpoint_seq, recovery, starts, points

    def _write_checkpoints(self, seq: int, recovery: dict, starts: dict) -> bool:
        """Write both files (on any thread: one writer at a time, and contents older than
        what is on disk already are not written over it)."""
        with self._checkpoint_lock:
            if seq < self._written_seq:
                return True
            try:
                files.write_checkpoint(
                    os.path.join(self.data_dir, files.RECOVERY_POINT_CHECKPOINT), recovery)
                files.write_checkpoint(
                    os.path.join(self.data_dir, files.LOG_START_OFFSET_CHECKPOINT), starts)
            except OSError as err:
                self.write_failures += 1
                log.warning("%s: checkpoints not written (%s); the previous ones stay",
                            self.data_dir, err.strerror or err)
                return False
            self._written_seq = seq
            return True

    @staticmethod
    def _prune(points: list) -> None:
        """A checkpoint of these recovery points is on disk: the producer snapshots no
        recovery starts from go."""
        for _, lg, point in points:
            lg.prune_recovery_snapshots(point)

    def _stop_writer(self) -> None:
        """Wait for a checkpoint being written in the background, and end its thread."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = self._writing = None

    @property
    def had_write_failure(self) -> bool:
        """A write in this data dir failed since it was opened (no clean marker at close)."""
        return bool(self.write_failures) or any(
            lg.write_failures or lg.offline is not None for lg in self.logs.values())

    def flush_all(self) -> None:
        for plog in self:
            if plog.offline is None:
                plog.flush()
        self.checkpoint()

    def apply_retention(self, now_ms: int | None = None) -> int:
        deleted = sum(plog.apply_retention(now_ms) for plog in self)
        if deleted:
            self.checkpoint()
        return deleted

    def close(self) -> None:
        """Clean shutdown: flush and close every log, checkpoint, write the marker."""
        if self.closed:
            return
        try:
            self._stop_writer()
            for plog in self:
                plog.close()
            # A log that closed cleanly flushed to its end; an offline one stays at its last
            # good fsync.
            written = self.checkpoint()
            if self.unloaded:
                # Closed before loading finished (a start that failed): the partitions not
                # opened were not recovered, so the next start must not take them as clean.
                log.warning("%s: closed with %d partition(s) not opened: no clean-shutdown "
                            "marker", self.data_dir, len(self.unloaded))
            elif written and not self.had_write_failure:
                files.atomic_write(os.path.join(self.data_dir, files.CLEAN_SHUTDOWN_FILE),
                                   json.dumps({"version": 0, "brokerEpoch": 0}).encode())
            else:
                log.warning("%s: closed after write failures: no clean-shutdown marker, so "
                            "the next start recovers from disk", self.data_dir)
        except OSError as err:
            self.write_failures += 1
            log.warning("%s: no clean-shutdown marker (%s)", self.data_dir, err)
        finally:
            self.closed = True
            self._unlock()

    def __enter__(self) -> LogManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove(path: str) -> None:
    """Remove a partition directory mq made (``datadir.remove_partition_dir``: only the
    files mq names); what cannot be removed now is logged and left to the next start."""
    try:
        datadir.remove_partition_dir(path)
    except OSError as err:
        log.warning("%s: not removed (%s); the next start removes it", path, err)


def _warn_if_open_to_others(path: str, mode: int) -> None:
    """A data dir mq did not create keeps the permission bits its owner gave it; say so when
    they grant what ``file_mode`` does not (other users could read the logs)."""
    try:
        current = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    if current & ~mode:
        log.warning("%s: mode %04o grants more than file_mode allows (%04o); mq changes no "
                    "permission of a directory it did not create: chmod %04o %s",
                    path, current, mode, current & mode, path)
