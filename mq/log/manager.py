"""A data directory: every partition log in it, its lock, checkpoints and shutdown marker.

Open sequence (Kafka's ``LogManager.loadLogs``): take the ``.lock`` (flock, one owner per data
dir); note whether ``.kafka_cleanshutdown`` exists and delete it at once (a crash while
loading must count as unclean); read ``recovery-point-offset-checkpoint`` and
``log-start-offset-checkpoint``; open and recover each ``<topic>-<partition>/`` directory.

Close sequence: flush and close every log, write both checkpoints (recovery point = log end),
then write the marker, fsynced. Checkpoints are written atomically (temp, fsync, rename, fsync
dir), so a crash leaves the previous or the next checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator

from mq.errors import ClosedError, LogDirLockedError
from mq.log import files
from mq.log.config import LogConfig
from mq.log.log import PartitionLog

__all__ = ["LogManager"]

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
META_FILE = "meta.properties"


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

    @classmethod
    def open(cls, data_dir: str, config_for: Callable[[str], LogConfig] | None = None,
             now_ms: int | None = None) -> LogManager:
        self = cls(data_dir, config_for)
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock()
        try:
            self._load(now_ms)
        except BaseException:
            self._unlock()
            raise
        self.closed = False
        return self

    def _lock(self) -> None:
        fd = os.open(os.path.join(self.data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogDirLockedError(f"{self.data_dir} is in use by another process "
                                    "(is a broker already running on it?)") from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)        # closing the fd releases the flock
            self._lock_fd = -1

    def _load(self, now_ms: int | None) -> None:
        meta = os.path.join(self.data_dir, META_FILE)
        if not os.path.exists(meta):
            files.atomic_write(meta, f"version=0\ncluster.id={uuid.uuid4().hex}\n"
                               "node.id=0\n".encode())
        marker = os.path.join(self.data_dir, files.CLEAN_SHUTDOWN_FILE)
        self.clean_shutdown = os.path.exists(marker)
        if self.clean_shutdown:
            os.unlink(marker)
            files.fsync_dir(self.data_dir)
        recovery = _read_checkpoint_or_empty(
            os.path.join(self.data_dir, files.RECOVERY_POINT_CHECKPOINT))
        starts = _read_checkpoint_or_empty(
            os.path.join(self.data_dir, files.LOG_START_OFFSET_CHECKPOINT))
        for name in sorted(os.listdir(self.data_dir)):
            path = os.path.join(self.data_dir, name)
            if name.endswith("-delete") and os.path.isdir(path):
                shutil.rmtree(path)        # a topic deletion that did not finish
                continue
            parsed = files.parse_partition_dir(name)
            if parsed is None or not os.path.isdir(path):
                continue
            topic, partition = parsed
            self.logs[parsed] = PartitionLog.open(
                path, self.config_for(topic), recovery_point=recovery.get(parsed, 0),
                log_start_offset=starts.get(parsed, 0), clean_shutdown=self.clean_shutdown,
                now_ms=now_ms)
        self.checkpoint()
        if not self.logs:
            log.info("%s: new data directory", self.data_dir)
        else:
            log.info("%s: opened %d partition log(s) after %s shutdown", self.data_dir,
                     len(self.logs), "a clean" if self.clean_shutdown else "an unclean")

    # --- partitions ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"{self.data_dir}: log manager is closed")

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))

    def create(self, topic: str, partition: int, config: LogConfig | None = None
               ) -> PartitionLog:
        """Create (or return) the log of a partition."""
        self._check_open()
        files.validate_topic_name(topic)
        key = (topic, partition)
        if key not in self.logs:
            path = os.path.join(self.data_dir, files.partition_dir_name(topic, partition))
            self.logs[key] = PartitionLog.open(path, config or self.config_for(topic))
            files.fsync_dir(self.data_dir)
        return self.logs[key]

    def delete(self, topic: str, partition: int) -> None:
        """Remove a partition: rename its directory to ``<name>.<uuid>-delete`` (atomic), then
        remove it; an interrupted removal is finished at the next open."""
        self._check_open()
        plog = self.logs.pop((topic, partition), None)
        if plog is None:
            return
        plog.close()
        doomed = f"{plog.dir}.{uuid.uuid4().hex}-delete"
        os.rename(plog.dir, doomed)
        files.fsync_dir(self.data_dir)
        shutil.rmtree(doomed, ignore_errors=True)

    def __iter__(self) -> Iterator[PartitionLog]:
        return iter(list(self.logs.values()))

    # --- checkpoints and lifecycle ------------------------------------------------------------
    def checkpoint(self) -> None:
        """Write both checkpoint files from the logs' current state."""
        self._write_checkpoints({k: lg.recovery_point for k, lg in self.logs.items()})

    def _write_checkpoints(self, recovery_points: dict[tuple[str, int], int]) -> None:
        files.write_checkpoint(os.path.join(self.data_dir, files.RECOVERY_POINT_CHECKPOINT),
                               recovery_points)
        files.write_checkpoint(
            os.path.join(self.data_dir, files.LOG_START_OFFSET_CHECKPOINT),
            {k: lg.log_start_offset for k, lg in self.logs.items()
             if lg.log_start_offset > lg.segments[0].base_offset})

    def flush_all(self) -> None:
        for plog in self:
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
            for plog in self:
                plog.close()
            self._write_checkpoints({k: lg.log_end_offset for k, lg in self.logs.items()})
            files.atomic_write(os.path.join(self.data_dir, files.CLEAN_SHUTDOWN_FILE),
                               json.dumps({"version": 0, "brokerEpoch": 0}).encode())
        finally:
            self.closed = True
            self._unlock()

    def __enter__(self) -> LogManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
