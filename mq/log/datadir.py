"""What mq may touch: the data directory it is given, and the entries inside it that are its own.

mq never changes what it did not write (issue 19: a broker pointed at a user's directory used to
take every ``<name>-<digits>`` subdirectory for a partition, truncate it and remove it). The
rules, Kafka's where Kafka has one:

- **The data dir** (``prepare``) is one of: missing (created with its parents, ``dir_mode``);
  empty but for what a file system or mq's own start-up leaves there (``lost+found``, a socket,
  ``.lock``, ``broker.stderr.log``, ``meta.properties.tmp``); or a log dir already, which its
  ``meta.properties`` says (mq's or Apache Kafka's). Anything else is refused with one line
  naming the path and what was found, before anything is created, locked or changed. An empty
  string is no path (never "here"); a file, or a symlink to nothing, is refused by name. The
  permission bits of a directory mq did not create are never changed.
- **A partition directory nobody asked for** (``classify``): one named ``<topic>-<partition>``
  that the topic metadata does not list. If everything in it is named as mq names a partition's
  files (segments, indexes, snapshots, the leader-epoch checkpoint, their leftovers), it is a
  partition of a topic whose deletion a crash cut short: it is set aside, renamed
  ``<topic>-<partition>.<uuid>-stray`` as Kafka does (KIP-858), and kept for the operator. If
  anything else is in it, or nothing, it is not mq's: it stays where it is, as it is, and a
  warning names it.
- **Removing a partition** (``remove_partition_dir``) unlinks only the files mq names, then the
  directory if that left it empty; a foreign file keeps its directory, with a warning.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import stat
import uuid
from typing import Final

from mq.errors import DataDirError
from mq.log import diskio, files

__all__ = ["DELETE_SUFFIX", "DirKind", "classify", "foreign_entries", "is_deletion_leftover", "prepare", "read_meta",
           "is_partition_file", "remove_partition_dir", "renamed", "set_aside", "some", "STRAY_SUFFIX"]

log = logging.getLogger(__name__)

STRAY_SUFFIX: Final = "-stray"
DELETE_SUFFIX: Final = "-delete"
# What may be in a data dir that has no meta.properties yet, and still count as empty: a file
# system's own directory, and what mq writes before meta.properties (the lock, the log file of
# mq.testing and `mq demo`, an atomic write of meta.properties cut short). Sockets too (the
# default socket is <data-dir>/mq.sock, and systemd may create it before the first start).
START_LEFTOVERS: Final = frozenset({files.LOCK_FILE, "broker.stderr.log",
                                    files.META_FILE + files.TMP_SUFFIX, "lost+found"})
# <topic>-<partition>.<32 hex digits>-delete / -stray: the names mq gives a partition it
# removes or sets aside (LogManager.delete, set_aside).
_RENAMED_RE: Final = re.compile(r"^(.+-\d+)\.[0-9a-f]{32}(-delete|-stray)$")
# Files of a partition directory that are not segment files: epochs.LEADER_EPOCH_CHECKPOINT,
# and Kafka's partition.metadata (topic id), which a Kafka log dir may hold.
_PARTITION_FILES: Final = frozenset({"leader-epoch-checkpoint", "partition.metadata"})
_SHOWN = 3                                   # entries named in a refusal


def prepare(path: str) -> bool:
    """Make ``path`` ready to be a data dir, or refuse it having changed nothing. Returns
    whether it was created (only then did mq choose its permission bits).

    Raises ``DataDirError`` for an empty path, a path that is not a directory, a symlink to
    nothing, a directory that is neither empty nor a log dir, or an unreadable
    ``meta.properties``; ``OSError`` when the directory cannot be created or listed."""
    if not path or not path.strip():
        raise DataDirError("the data dir is an empty path: give a directory (an empty path "
                           "never means the current directory)")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise DataDirError(f"data dir {path} is a symlink to {os.readlink(path)}, which "
                               "does not exist") from None
        diskio.ops.makedirs(path)          # dir_mode for each directory it creates
        return True
    except NotADirectoryError as err:
        raise DataDirError(f"data dir {path}: a part of the path is a file, not a directory"
                           ) from err
    if not stat.S_ISDIR(mode):
        raise DataDirError(f"data dir {path} is {files.file_type(mode)}, not a directory")
    names = os.listdir(path)
    if files.META_FILE in names:
        read_meta(path)
        return False
    foreign = sorted(n for n in names if n not in START_LEFTOVERS
                     and not _is_socket(os.path.join(path, n)))
    if foreign:
        raise DataDirError(
            f"data dir {path} is not empty and not an mq data dir (no {files.META_FILE}): it "
            f"holds {len(foreign)} other entr{'y' if len(foreign) == 1 else 'ies'} "
            f"({some(foreign)}); "
            "mq changes nothing there: give a new or empty directory")
    return False


def read_meta(data_dir: str) -> dict[str, str]:
    """The ``key=value`` lines of ``meta.properties`` (mq's version 0, or Kafka's 0 or 1).
    Raises ``DataDirError`` when it cannot be read or has no ``cluster.id``."""
    path = os.path.join(data_dir, files.META_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise DataDirError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err}); "
                           "is this an mq data dir?") from err
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    if not props.get("cluster.id"):
        raise DataDirError(f"{path}: no cluster.id: not the meta.properties of an mq or Kafka "
                           "log dir")
    return props


class DirKind(enum.Enum):
    PARTITION = "partition"       # every entry is named as mq names a partition's files
    FOREIGN = "foreign"           # something else is in it, or nothing: not provably mq's


def classify(path: str) -> DirKind:
    """Whether a directory named ``<topic>-<partition>`` holds an mq partition."""
    names = os.listdir(path)
    if names and all(is_partition_file(n) for n in names):
        return DirKind.PARTITION
    return DirKind.FOREIGN


def foreign_entries(path: str) -> list[str]:
    """The entries of a partition directory that mq does not name, sorted."""
    return sorted(n for n in os.listdir(path) if not is_partition_file(n))


def set_aside(data_dir: str, name: str) -> str | None:
    """Handle the directory ``name`` that no topic lists: rename an mq partition to
    ``<name>.<uuid>-stray`` and return the new name; leave anything else untouched (None).
    Both are logged."""
    path = os.path.join(data_dir, name)
    if os.path.islink(path) or classify(path) is DirKind.FOREIGN:
        log.warning("%s: not a partition of any topic, and a symlink or holding files mq did "
                    "not write (or nothing): left as it is", path)
        return None
    stray = os.path.basename(renamed(path, STRAY_SUFFIX))
    os.rename(path, os.path.join(data_dir, stray))
    files.fsync_dir(data_dir)
    log.warning("%s: a partition no topic lists (a deletion cut short?): set aside as %s, "
                "kept; remove it when it is not needed", path, stray)
    return stray


def renamed(path: str, suffix: str) -> str:
    """``<path>.<uuid><suffix>``: where a partition directory goes when mq removes it
    (``DELETE_SUFFIX``) or sets it aside (``STRAY_SUFFIX``); ``is_deletion_leftover`` knows
    the first again."""
    return f"{path}.{uuid.uuid4().hex}{suffix}"


def some(names: list[str]) -> str:
    """The first ``_SHOWN`` of ``names`` for a one-line message: ``"a, b, c, ..."``."""
    return ", ".join(names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")


def is_deletion_leftover(name: str) -> bool:
    """``<topic>-<partition>.<uuid>-delete``: a removal ``LogManager.delete`` began."""
    m = _RENAMED_RE.match(name)
    return m is not None and m.group(2) == DELETE_SUFFIX


def remove_partition_dir(path: str) -> bool:
    """Unlink the files of a partition directory that mq names, then the directory if that
    emptied it. Returns whether it is gone; a directory that still holds files mq did not
    write is kept (logged)."""
    foreign = []
    for name in os.listdir(path):
        if is_partition_file(name):
            os.unlink(os.path.join(path, name))
        else:
            foreign.append(name)
    if foreign:
        log.warning("%s: kept, with %d file(s) mq did not write (%s)", path, len(foreign),
                    some(sorted(foreign)))
        return False
    os.rmdir(path)
    return True


def is_partition_file(name: str) -> bool:
    """A name mq (or Kafka) gives a file in a partition directory, leftovers included."""
    base = name[:-len(files.TMP_SUFFIX)] if name.endswith(files.TMP_SUFFIX) else name
    if base.endswith(files.DELETED_SUFFIX):
        base = base[:-len(files.DELETED_SUFFIX)]
    return base in _PARTITION_FILES or files.parse_segment_name(base) is not None


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False
