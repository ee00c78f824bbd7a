"""Copying a topic's partitions between an mq data dir and a stopped Apache Kafka broker's log
dir (``mq log export-kafka`` and ``mq log import-kafka``), both laid out alike::

    <log-dir>/                             the source's or the destination's
      .lock                                held by its broker while it runs
      .kafka_cleanshutdown                 present after a clean stop
      <topic>-<p>/                         one per partition, p = 0 .. n-1
        partition.metadata                 the topic id of this log dir's broker
        00000000000000000000.log           segments, indexes, .txnindex, .snapshot
        leader-epoch-checkpoint

Neither broker adopts a partition directory its own metadata does not name (Kafka renames it
``-stray``), so the topic must exist on both sides with the same partition count: the
destination's partitions are created by its broker, empty, and the source's segment files
(``.log``, ``.index``, ``.timeindex``, ``.txnindex``, ``.snapshot``) are copied into them
under the destination's ``partition.metadata`` (its topic id; that file is copied as it is).
The ``leader-epoch-checkpoint`` is rebuilt from the batches as Kafka's recovery rebuilds it.

Refused, with nothing changed (``LogTransferError``): a live broker on either side (its
``.lock`` held: mq's broker holds an ``flock``, Kafka's JVM a POSIX ``fcntl`` lock, so both
are probed on both sides and both are held for the whole copy, which keeps either broker
from starting meanwhile); a source not stopped cleanly (no ``.kafka_cleanshutdown``: its
broker would recover the logs at its next start) or one whose partitions do not check clean
(``mq.log.check``); partition directories of one side naming different topic ids, or none;
partition counts that differ; a destination partition that holds data, or a file neither
broker writes; a source log start offset inside its first segment (DeleteRecords: the
records below it would come back).

Kafka's leader epochs: a consumer that read a batch of leader epoch E and later asks Kafka
for the end of E (OffsetsForLeaderEpoch, when it resumes from a committed offset) takes an
epoch Kafka never had for a truncated log and resets its position. mq counts one epoch per
broker start, so its batches usually carry epochs above a new Kafka topic's. The export stamps
the destination's latest epoch (its ``leader-epoch-checkpoint``, 0 for none) into every batch
above it: the field lies outside the batch CRC, and Kafka's leader stamps it the same way on
every append. The import copies batches as they are: mq's next start takes an epoch above
every epoch on disk.

Crash safety: each destination partition is written whole into a new sibling directory
``<topic>-<p>.<uuid>-delete`` (every file fsynced, then the directory), and only when every
partition is written does one ``renameat2(RENAME_EXCHANGE)`` per partition swap it with the
destination partition (then the log dir is fsynced); the destination's old, empty directory
then has the temporary name and is removed (only files named as the brokers name them). A
crash leaves a ``-delete`` directory, which both brokers remove at start as a deletion cut
short. Where the file system cannot exchange, two renames do, the old directory first.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import os
import struct
from collections.abc import Callable, Iterator
from typing import Final

from mq.errors import LogTransferError
from mq.log import datadir, diskio, epochs, files, partition_metadata
from mq.log.check import check_partition
from mq.log.layout import (
    HEADER,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    PARTITION_LEADER_EPOCH_OFFSET,
    field,
)

__all__ = ["LogDir", "PartitionCopy", "TopicCopy", "copy_topic", "held"]

COPIED_SUFFIXES: Final = (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX,
                          files.TXNINDEX_SUFFIX, files.SNAPSHOT_SUFFIX)
CHUNK: Final = 1 << 20                  # bytes a copy moves between progress reports
# A batch's first fields (mq.log.layout): baseOffset, batchLength, partitionLeaderEpoch.
_HEAD: Final = struct.Struct(HEADER.format[:4])
_EPOCH: Final = field("partitionLeaderEpoch")
_AT_FDCWD: Final = -100
_RENAME_EXCHANGE: Final = 2

Progress = Callable[[int, int], None]   # (bytes copied, bytes in all)
Checking = Callable[[str, int], None]   # (partition directory, bytes) about to be checked


@dataclasses.dataclass(frozen=True, slots=True)
class LogDir:
    """One side: a log dir and whose it is ("mq" or "Kafka"), as messages name it."""

    path: str
    broker: str

    def __str__(self) -> str:
        return f"{self.broker}'s {'data' if self.broker == 'mq' else 'log'} dir {self.path}"


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionCopy:
    """One partition to copy: the files of ``source`` to write into ``destination``."""

    partition: int
    source: str
    destination: str
    names: tuple[str, ...]
    size: int
    summary: str            # the check's: segments, batches, records, offsets, bytes
    max_epoch: int | None = None    # leader epochs above it are stamped down to it


@dataclasses.dataclass(frozen=True, slots=True)
class TopicCopy:
    """What ``copy_topic`` checked (and copied, unless it was a dry run)."""

    topic: str
    source: LogDir
    destination: LogDir
    topic_id: str           # the destination's, 32 hex digits
    partitions: tuple[PartitionCopy, ...]

    @property
    def size(self) -> int:
        return sum(p.size for p in self.partitions)


# --- locks ------------------------------------------------------------------------------------

@contextlib.contextmanager
def held(*dirs: LogDir) -> Iterator[None]:
    """Hold each log dir's ``.lock`` (an ``flock`` as mq's broker takes it and a POSIX lock as
    Kafka's takes it), so that no broker runs on it or starts meanwhile. A dir without a
    ``.lock`` never had a broker; none is created. Raises ``LogTransferError`` when a broker
    holds one."""
    fds: list[int] = []
    try:
        for d in dirs:
            fd = _lock(d)
            if fd is not None:
                fds.append(fd)
        yield
    finally:
        for fd in fds:
            os.close(fd)                # releases both locks


def _lock(d: LogDir) -> int | None:
    path = os.path.join(d.path, files.LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise
        raise LogTransferError(f"{d} is in use: a running broker holds {path}; stop it "
                               "first (copying under a live broker would corrupt its log)"
                               ) from err
    return fd


# --- checks -----------------------------------------------------------------------------------

def _partition_dirs(d: LogDir, topic: str) -> dict[int, str]:
    """``{partition: path}`` of the topic's directories in ``d``, numbered 0 .. n-1."""
    found = {}
    for name in os.listdir(d.path):
        parsed = files.parse_partition_dir(name)
        path = os.path.join(d.path, name)
        if parsed is not None and parsed[0] == topic and os.path.isdir(path) \
                and not os.path.islink(path):
            found[parsed[1]] = path
    if not found:
        raise LogTransferError(f"{d} has no partition of topic {topic}: create the topic "
                               "with its broker first")
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise LogTransferError(f"{d} has {topic}-{max(found)} but no {topic}-{missing[0]}: "
                               "every partition must be in this one log dir")
    return found


def _topic_id(d: LogDir, topic: str, dirs: dict[int, str]) -> str:
    """The one topic id that every partition directory of ``topic`` in ``d`` names."""
    ids = {}
    for p, path in sorted(dirs.items()):
        topic_id = partition_metadata.read_topic_id(path)
        if topic_id is None:
            raise LogTransferError(f"{d}: {path} has no readable "
                                   f"{partition_metadata.PARTITION_METADATA} (no topic id: "
                                   "its broker would set the directory aside as stray)")
        ids.setdefault(topic_id, p)
    if len(ids) > 1:
        (a, pa), (b, pb) = sorted(ids.items(), key=lambda item: item[1])[:2]
        raise LogTransferError(f"topic id mismatch in {d}: {topic}-{pa} belongs to topic id "
                               f"{a}, {topic}-{pb} to {b} (a directory of another topic of "
                               "that name?)")
    return next(iter(ids))


def _require_clean_stop(d: LogDir, hint: str) -> None:
    if not os.path.exists(os.path.join(d.path, files.CLEAN_SHUTDOWN_FILE)):
        raise LogTransferError(f"{d} was not shut down cleanly (no "
                               f"{files.CLEAN_SHUTDOWN_FILE}): {hint}")


def _source_files(d: LogDir, topic: str, p: int, path: str) -> PartitionCopy:
    """The segment files of a source partition that checks clean."""
    result = check_partition(path, live_broker=False)
    if not result.clean:
        first = result.problems[0].message
        more = len(result.problems) - 1
        raise LogTransferError(f"{d}: {topic}-{p} does not check clean: {first}"
                               + (f" (and {more} more)" if more else "")
                               + f"; 'mq log check {path}' lists the problems")
    names = sorted(n for n in os.listdir(path) if _copied(n))
    first_base = min((s.base_offset for s in result.segments), default=0)
    start = files.read_checkpoint(os.path.join(d.path, files.LOG_START_OFFSET_CHECKPOINT)
                                  ).get((topic, p), 0)
    if start > first_base:
        raise LogTransferError(f"{d}: {topic}-{p} starts at offset {start}, inside its first "
                               f"segment (from offset {first_base}, records deleted by "
                               "DeleteRecords): a copy would bring them back; wait until "
                               "retention removes that segment")
    return PartitionCopy(p, path, "", tuple(names), _du(path), result.summary())


def _du(path: str) -> int:
    """Bytes in the files of a partition directory that a copy copies."""
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if _copied(n))


def _copied(name: str) -> bool:
    parsed = files.parse_segment_name(name)
    return parsed is not None and not parsed[2] and parsed[1] in COPIED_SUFFIXES


def _require_empty(d: LogDir, topic: str, p: int, path: str) -> None:
    """A destination partition holds no data and nothing its broker did not write."""
    foreign = datadir.foreign_entries(path)
    if foreign:
        raise LogTransferError(f"{d}: {path} holds files neither broker writes "
                               f"({datadir.some(foreign)}); nothing is copied over them")
    for name in sorted(os.listdir(path)):
        parsed = files.parse_segment_name(name)
        if parsed is None:
            continue
        full = os.path.join(path, name)
        if parsed[0] > 0 or (parsed[1] == files.LOG_SUFFIX and os.path.getsize(full)):
            raise LogTransferError(f"{d}: {topic}-{p} is not empty ({name}: "
                                   f"{os.path.getsize(full)} bytes): a copy never replaces "
                                   "data; delete and create the topic again to empty it")


def plan(topic: str, source: LogDir, destination: LogDir, *, stamp_epochs: bool,
         source_hint: str, checking: Checking | None = None) -> TopicCopy:
    """Check everything ``copy_topic`` needs (with both log dirs ``held``); ``checking``
    hears of each source partition before it is read whole. Raises ``LogTransferError`` for
    every refusal the module docstring lists, ``OSError`` when a file cannot be read."""
    files.validate_topic_name(topic)
    if topic.startswith("__"):
        raise LogTransferError(f"{topic} is an internal topic of its broker: only user topics "
                               "are copied")
    if os.path.realpath(source.path) == os.path.realpath(destination.path):
        raise LogTransferError(f"{source} and {destination} are the same directory")
    for d in (source, destination):
        datadir.read_meta(d.path)
    _require_clean_stop(source, source_hint)
    sources = _partition_dirs(source, topic)
    targets = _partition_dirs(destination, topic)
    if len(sources) != len(targets):
        raise LogTransferError(f"{topic} has {len(sources)} partitions in {source} but "
                               f"{len(targets)} in {destination}: create it there with "
                               f"{len(sources)}")
    _topic_id(source, topic, sources)
    topic_id = _topic_id(destination, topic, targets)
    copies = []
    for p in sorted(targets):
        _require_empty(destination, topic, p, targets[p])
        if checking is not None:
            checking(sources[p], _du(sources[p]))
        one = _source_files(source, topic, p, sources[p])
        # the destination partition's latest epoch (its broker's, as it last led it)
        latest = max(0, epochs.LeaderEpochCache(targets[p]).latest_epoch)
        copies.append(dataclasses.replace(one, destination=targets[p],
                                          max_epoch=latest if stamp_epochs else None))
    return TopicCopy(topic, source, destination, topic_id, tuple(copies))


# --- copying ----------------------------------------------------------------------------------

def copy_topic(copy: TopicCopy, progress: Progress | None = None) -> None:
    """Write every partition of ``copy`` (``plan``'s) beside its destination, then swap each
    in (see the module docstring). On any error while writing, the directories written so far
    are removed and the destination is as it was. Raises ``OSError``."""
    total, done = copy.size, [0]

    def moved(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress(done[0], total)

    written: list[tuple[str, str]] = []
    try:
        for part in copy.partitions:
            tmp = datadir.renamed(part.destination, datadir.DELETE_SUFFIX)
            written.append((tmp, part.destination))
            _write_partition(part, tmp, moved)
    except BaseException:
        for tmp, _ in written:
            if os.path.isdir(tmp):
                datadir.remove_partition_dir(tmp)
        raise
    for tmp, dest in written:
        _exchange(tmp, dest)
    files.fsync_dir(copy.destination.path)
    for tmp, _ in written:
        datadir.remove_partition_dir(tmp)
    files.fsync_dir(copy.destination.path)


def _write_partition(part: PartitionCopy, tmp: str, moved: Callable[[int], None]) -> None:
    """The new partition directory, whole and fsynced: the source's files, the destination's
    ``partition.metadata``, and a leader-epoch checkpoint of the batches as written."""
    modes = os.stat(os.path.join(part.destination, partition_metadata.PARTITION_METADATA))
    os.mkdir(tmp, os.stat(part.destination).st_mode & 0o7777)
    with open(os.path.join(part.destination, partition_metadata.PARTITION_METADATA), "rb") as f:
        _write_file(os.path.join(tmp, partition_metadata.PARTITION_METADATA), [f.read()],
                    modes.st_mode)
    epoch_starts: list[tuple[int, int]] = []
    for name in part.names:
        src, dst = os.path.join(part.source, name), os.path.join(tmp, name)
        with open(src, "rb") as f:
            _write_file(dst, iter(lambda: f.read(CHUNK), b""), modes.st_mode, moved)
        if name.endswith(files.LOG_SUFFIX):
            _stamp_epochs(dst, part.max_epoch, epoch_starts)
    lines = ["0", str(len(epoch_starts)), *(f"{e} {o}" for e, o in epoch_starts)]
    _write_file(os.path.join(tmp, epochs.LEADER_EPOCH_CHECKPOINT),
                [("\n".join(lines) + "\n").encode()], modes.st_mode)
    files.fsync_dir(tmp)


def _write_file(path: str, chunks, mode: int, moved: Callable[[int], None] | None = None
                ) -> None:
    ops = diskio.ops
    fd = ops.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o7777)
    try:
        position = 0
        for chunk in chunks:
            diskio.write_fully(fd, chunk, position)
            position += len(chunk)
            if moved is not None:
                moved(len(chunk))
        ops.fsync(fd)
    finally:
        ops.close(fd)


def _stamp_epochs(path: str, max_epoch: int | None, starts: list[tuple[int, int]]) -> None:
    """Walk the batch headers of a copied ``.log``: lower each leader epoch above
    ``max_epoch`` to it (in place, fsynced), and note in ``starts`` where each epoch begins
    (Kafka's rule at recovery: a batch whose epoch is above the latest starts a new one)."""
    fd = diskio.ops.open(path, os.O_RDWR)
    try:
        end, pos, stamped = os.fstat(fd).st_size, 0, False
        while end - pos >= _HEAD.size:
            base, length, epoch = _HEAD.unpack(os.pread(fd, _HEAD.size, pos))
            if max_epoch is not None and epoch > max_epoch:
                diskio.write_fully(fd, _EPOCH.pack(max_epoch), pos + PARTITION_LEADER_EPOCH_OFFSET)
                epoch, stamped = max_epoch, True
            if epoch >= 0 and (not starts or epoch > starts[-1][0]):
                starts.append((epoch, base))
            if length < MIN_BATCH_LENGTH:
                raise LogTransferError(f"{path}: no batch at byte {pos} (length {length})")
            pos += LOG_OVERHEAD + length
        if stamped:
            diskio.ops.fsync(fd)
    finally:
        diskio.ops.close(fd)


def _exchange(new: str, old: str) -> None:
    """Swap two directories at once (``renameat2(RENAME_EXCHANGE)``); where the file system
    cannot, move the old one to ``new``'s name's sibling first, then ``new`` in."""
    libc = ctypes.CDLL(None, use_errno=True)
    rename2 = getattr(libc, "renameat2", None)
    if rename2 is not None and rename2(_AT_FDCWD, os.fsencode(new), _AT_FDCWD,
                                       os.fsencode(old), _RENAME_EXCHANGE) == 0:
        return
    err = ctypes.get_errno() if rename2 is not None else errno.ENOSYS
    if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        raise OSError(err, os.strerror(err), new, None, old)
    aside = datadir.renamed(old, datadir.DELETE_SUFFIX)
    diskio.ops.rename(old, aside)
    diskio.ops.rename(new, old)
    diskio.ops.rename(aside, new)
