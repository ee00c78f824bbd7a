"""File-name rules, atomic writes and checkpoint files — Kafka's data-directory conventions.

Layout of a data directory::

    <data-dir>/
      .lock                              flock: one broker per data dir
      meta.properties                    version, cluster and broker ids
      .kafka_cleanshutdown               present only after a clean shutdown
      recovery-point-offset-checkpoint   "0\\n<count>\\n<topic> <partition> <offset>\\n..."
      log-start-offset-checkpoint        same format
      <topic>-<partition>/
        00000000000000000000.log         base offset, 20-digit zero-padded, + suffix
        00000000000000000000.index
        00000000000000000000.timeindex

Suffixes that mark work in progress: ``.deleted`` (segment being removed), ``.cleaned``
(cleaner output being written), ``.swap`` (finished output awaiting installation), ``.tmp``
(an atomic write that never reached its rename). Open finishes or removes each of them.

Every change that spans files goes through ``atomic_write``: write ``<name>.tmp``, fsync it,
rename over the target, fsync the directory. A crash leaves either the old or the new file.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from typing import Final

from mq.errors import CheckpointError
from mq.log import diskio

__all__ = [
    "LOG_SUFFIX", "INDEX_SUFFIX", "TIMEINDEX_SUFFIX", "TXNINDEX_SUFFIX", "SNAPSHOT_SUFFIX",
    "DELETED_SUFFIX", "CLEANED_SUFFIX", "SWAP_SUFFIX", "TMP_SUFFIX", "CLEAN_SHUTDOWN_FILE",
    "RECOVERY_POINT_CHECKPOINT", "LOG_START_OFFSET_CHECKPOINT", "LOCK_FILE", "META_FILE",
    "segment_name", "file_type",
    "parse_segment_name", "partition_dir_name", "parse_partition_dir", "count_partition_dirs",
    "atomic_write",
    "fsync_dir", "write_checkpoint", "read_checkpoint", "CheckpointError",
]

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIMEINDEX_SUFFIX: Final = ".timeindex"
TXNINDEX_SUFFIX: Final = ".txnindex"
SNAPSHOT_SUFFIX: Final = ".snapshot"
DELETED_SUFFIX: Final = ".deleted"
CLEANED_SUFFIX: Final = ".cleaned"
SWAP_SUFFIX: Final = ".swap"
TMP_SUFFIX: Final = ".tmp"
SEGMENT_FILE_SUFFIXES: Final = (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX)

CLEAN_SHUTDOWN_FILE: Final = ".kafka_cleanshutdown"
LOCK_FILE: Final = ".lock"
META_FILE: Final = "meta.properties"
RECOVERY_POINT_CHECKPOINT: Final = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT: Final = "log-start-offset-checkpoint"

_SEGMENT_RE: Final = re.compile(
    r"^(\d{20})(\.log|\.index|\.timeindex|\.txnindex|\.snapshot)"
    r"(\.deleted|\.cleaned|\.swap)?$")
_PARTITION_RE: Final = re.compile(r"^(.+)-(\d+)$")
_TOPIC_RE: Final = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def segment_name(base_offset: int, suffix: str) -> str:
    """``segment_name(42, ".log")`` -> ``"00000000000000000042.log"``."""
    return f"{base_offset:020d}{suffix}"


def parse_segment_name(name: str) -> tuple[int, str, str] | None:
    """``"00000000000000000042.index.swap"`` -> ``(42, ".index", ".swap")``; None otherwise."""
    m = _SEGMENT_RE.match(name)
    if m is None:
        return None
    return int(m.group(1)), m.group(2), m.group(3) or ""


def validate_topic_name(topic: str) -> None:
    """Kafka's rules: 1-249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``."""
    if topic in (".", "..") or not _TOPIC_RE.match(topic):
        raise ValueError(f"invalid topic name {topic!r}: use 1-249 characters of "
                         "letters, digits, '.', '_' and '-'")


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """``"orders-3"`` -> ``("orders", 3)``; None for anything else (including ``-delete``)."""
    m = _PARTITION_RE.match(name)
    if m is None or not _TOPIC_RE.match(m.group(1)):
        return None
    return m.group(1), int(m.group(2))


def count_partition_dirs(data_dir: str) -> int:
    """How many ``<topic>-<partition>`` directories ``data_dir`` holds (0 when it cannot be
    listed: opening it says why); reads the listing only, changes nothing."""
    try:
        with os.scandir(data_dir) as entries:
            return sum(1 for e in entries
                       if parse_partition_dir(e.name) is not None and e.is_dir())
    except OSError:
        return 0


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creates, renames, unlinks) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        diskio.ops.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content.

    ``durable=False`` skips both fsyncs: for files that recovery rebuilds or whose reader
    checks them (a power loss may leave the new name with empty content). On any failure (a
    full disk, an I/O error) the temp file is removed and ``path`` keeps its old content; the
    ``OSError`` propagates."""
    tmp = path + TMP_SUFFIX
    ops = diskio.ops
    try:
        fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            diskio.write_fully(fd, data, 0)
            if durable:
                ops.fsync(fd)
        finally:
            ops.close(fd)
        ops.replace(tmp, path)
    except BaseException:
        remove_quietly([tmp])
        raise
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_checkpoint(path: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """Kafka's offset checkpoint text file: version 0, count, then ``topic partition offset``."""
    lines = ["0", str(len(offsets))]
    lines += [f"{topic} {partition} {offset}"
              for (topic, partition), offset in sorted(offsets.items())]
    atomic_write(path, ("\n".join(lines) + "\n").encode())


def read_checkpoint(path: str) -> dict[tuple[str, int], int]:
    """Read a checkpoint written by ``write_checkpoint``; a missing file is empty.

    Raises ``CheckpointError`` for a wrong version, a count mismatch or a malformed line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: not a text checkpoint file") from err
    if len(lines) < 2 or lines[0].strip() != "0":
        raise CheckpointError(f"{path}: unsupported checkpoint version "
                              f"{lines[0] if lines else '(empty file)'!r}")
    try:
        count = int(lines[1])
    except ValueError as err:
        raise CheckpointError(f"{path}: bad entry count {lines[1]!r}") from err
    entries = [line for line in lines[2:] if line.strip()]
    if len(entries) != count:
        raise CheckpointError(f"{path}: expected {count} entries, found {len(entries)}")
    out: dict[tuple[str, int], int] = {}
    for line in entries:
        parts = line.split()
        try:
            topic, partition, offset = parts[0], int(parts[1]), int(parts[2])
        except (IndexError, ValueError) as err:
            raise CheckpointError(f"{path}: malformed line {line!r}") from err
        if len(parts) != 3:
            raise CheckpointError(f"{path}: malformed line {line!r}")
        out[(topic, partition)] = offset
    return out


_FILE_TYPES: Final = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"),
                      (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                      (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_type(mode: int) -> str:
    """``file_type(os.stat(p).st_mode)`` -> ``"a regular file"``, ``"a FIFO"``, ...: what a
    path is, for a message that says why it is refused."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "an unknown file type")


def remove_quietly(paths: Iterable[str]) -> None:
    """Unlink each path that exists; other errors (an injected or real I/O error) are left to
    recovery, which removes leftovers at the next open."""
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass
