"""The whole exception tree of mq.

One root, ``MQError``. Storage errors name the file, the byte position and what was wrong with
it, so a message read in a log is enough to find the bytes. Broker errors (added with the broker)
carry Kafka's numeric error code and a ``retriable`` flag.
"""

from __future__ import annotations

import os

__all__ = [
    "MQError",
    "StorageError",
    "CorruptRecordError",
    "CorruptIndexError",
    "UnsupportedCodecError",
    "InvalidOffsetError",
    "IndexFullError",
    "OffsetOutOfRangeError",
    "ClosedError",
    "LogDirLockedError",
]


class MQError(Exception):
    """Root of every error mq raises on purpose."""


class StorageError(MQError):
    """Something is wrong with files under a data directory."""


class CorruptRecordError(StorageError):
    """Bytes that should hold a RecordBatch v2 do not.

    ``path`` is the file (or ``None`` for an in-memory buffer), ``position`` the byte offset of
    the batch (or record) that failed, ``reason`` a short description.
    """

    def __init__(self, path: str | os.PathLike[str] | None, position: int, reason: str) -> None:
        self.path = None if path is None else os.fspath(path)
        self.position = position
        self.reason = reason
        where = f"{self.path}" if self.path is not None else "<buffer>"
        super().__init__(f"{where} at byte {position}: {reason}")

    def __reduce__(self):  # keep pickling (multiprocessing, xdist) working with the custom init
        return (type(self), (self.path, self.position, self.reason))


class UnsupportedCodecError(CorruptRecordError):
    """A batch is compressed with a codec whose package is not installed (or that is invalid).

    Subclass of ``CorruptRecordError`` so that readers that only guard against malformed data
    still stop cleanly, but callers can tell "install zstandard" from "this file is damaged".
    """


class CorruptIndexError(StorageError):
    """An ``.index`` or ``.timeindex`` file fails its sanity check; recovery rebuilds it."""

    def __init__(self, path: str | os.PathLike[str] | None, reason: str) -> None:
        self.path = None if path is None else os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class InvalidOffsetError(StorageError):
    """An append or index entry would break offset order (Kafka's InvalidOffsetException)."""


class IndexFullError(StorageError):
    """An index has no free slot; the segment must roll first."""


class OffsetOutOfRangeError(MQError):
    """The requested offset is below the log start offset or above the log end offset."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int,
                 partition: str = "") -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.partition = partition
        where = f"{partition}: " if partition else ""
        super().__init__(
            f"{where}offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")

    def __reduce__(self):
        return (type(self),
                (self.offset, self.log_start_offset, self.log_end_offset, self.partition))


class ClosedError(MQError):
    """The object was closed by its owner and can no longer be used."""


class LogDirLockedError(StorageError):
    """Another process holds the data directory's lock."""
