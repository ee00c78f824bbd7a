"""The open files of one log segment: the ``.log`` descriptor and the lazily opened ``.index``
and ``.timeindex`` (``mq.log.segment`` owns what is in them).

Open files (Kafka opens a segment's files lazily too): a segment keeps its ``.log`` and index
descriptors open between calls only while ``pinned`` — its log pins the active segment, 3
descriptors (``.log``, ``.index``, ``.timeindex``; the ``.txnindex`` is opened per write). Any
other segment opens what a call needs when the call starts and closes it when the call (the
outermost, on whichever thread: the cleaner reads beside the broker's loop) ends, so a
partition's older segments cost no descriptor. Files stay open past a call only while an index
is not trimmed (preallocated, or with failed entries past its count): opened again, its zero
tail would count as entries; the next call that leaves it trimmed closes it. An append opens
the ``.log`` if it is closed and leaves it so (``open_log``). Files closed for good raise
``EBADF``.

Threading: one lock guards the descriptors, the lazily opened indexes and the count of calls
using them; a call may run on any thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator

from mq.log import diskio, files
from mq.log.index import OffsetIndex, TimeIndex

__all__ = ["SegmentFiles"]


class SegmentFiles:
    """The descriptors of one segment's ``.log`` and indexes, open while a call uses them or
    while ``pinned``. ``path(kind)`` names the segment's file of that kind under its current
    suffix. Read-only files (the mq log tools read a segment or two) stay open."""

    def __init__(self, path: Callable[[str], str], base_offset: int, index_bytes: int, *,
                 read_only: bool) -> None:
        self._path = path
        self._base_offset = base_offset
        self._index_bytes = index_bytes
        self._read_only = read_only
        self._lock = threading.Lock()      # guards the open files and the count of their users
        self._users = 0
        # The mq log tools read a segment or two: they keep its files open.
        self.pinned = read_only
        log_path = path(files.LOG_SUFFIX)
        if read_only:
            self._fd = os.open(log_path, os.O_RDONLY)
        else:
            self._fd = diskio.ops.open(log_path, os.O_RDWR | os.O_CREAT)
        self.size_at_open = os.fstat(self._fd).st_size
        if not read_only:
            diskio.ops.close(self._fd)
            self._fd = -1
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self.closed = False

    @property
    def fd(self) -> int:
        """The ``.log`` descriptor: valid inside ``in_use`` or after ``open_log``."""
        return self._fd

    def pin(self) -> None:
        """Keep the files open between calls from now on (the active segment)."""
        with self._lock:
            self.pinned = True
            self._open_log()

    def unpin(self) -> None:
        """Close the files once no call uses them and the indexes are trimmed (a roll)."""
        with self._lock:
            self.pinned = False
            if not self._users:
                self._close_if_trimmed()

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """The files open for one call (module doc). Raises ``OSError(EBADF)`` when closed."""
        with self._lock:
            self._open_log()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if not self._users and not self.pinned:
                    self._close_if_trimmed()

    def open_log(self) -> None:
        """Open the ``.log`` unless it is open, and leave it so (an append)."""
        if self._fd < 0:
            with self._lock:
                self._open_log()

    def _open_log(self) -> None:
        """Open the ``.log`` unless it is open; the caller holds the lock."""
        if self.closed:
            raise OSError(errno.EBADF, f"{self._path(files.LOG_SUFFIX)}: the segment is closed")
        if self._fd < 0:
            # Read-only ones stay open.
            self._fd = diskio.ops.open(self._path(files.LOG_SUFFIX), os.O_RDWR)

    def _close_if_trimmed(self) -> None:
        """Close every file unless an index is not trimmed; the caller holds the lock."""
        indexes = (self._offset_index, self._time_index)
        if any(index is not None and not index.trimmed for index in indexes):
            return
        self._offset_index = self._time_index = None
        for index in indexes:
            if index is not None:
                index.close_without_trim()
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            diskio.ops.close(fd)

    # --- lazy indexes ---------------------------------------------------------------------------
    def loaded(self, kind: str) -> OffsetIndex | TimeIndex | None:
        """The index of ``kind`` if it is open now, else None (nothing is opened)."""
        if kind == files.INDEX_SUFFIX:
            return self._offset_index
        return self._time_index if kind == files.TIMEINDEX_SUFFIX else None

    def loaded_indexes(self) -> tuple[OffsetIndex | None, TimeIndex | None]:
        """The offset and time index, each if open now, else None."""
        return self._offset_index, self._time_index

    def existing_index(self, kind: str) -> OffsetIndex | TimeIndex | None:
        """The index if its file exists, else None: a read never creates a file (on a full
        disk it could not, and a lookup must not fail for it)."""
        index = self.loaded(kind)
        if index is None and os.path.exists(self._path(kind)):
            index = self.index(kind)
        return index

    def index(self, kind: str) -> OffsetIndex | TimeIndex:
        """The index of ``kind``, opened (creating it, when writable) if it is not open."""
        return self.loaded(kind) or self._open_index(kind)

    def _open_index(self, kind: str):
        """Open (creating, when writable) one index; under the lock, as the cleaner's thread
        may ask at the same time."""
        with self._lock:
            offsets = kind == files.INDEX_SUFFIX
            index = self._offset_index if offsets else self._time_index
            if index is None:
                index = (OffsetIndex if offsets else TimeIndex)(
                    self._path(kind), self._base_offset, self._index_bytes,
                    writable=not self._read_only)
                if offsets:
                    self._offset_index = index
                else:
                    self._time_index = index
            return index

    # --- descriptors for others, and closing ------------------------------------------------------
    def dup_fd(self) -> int:
        """A descriptor of the ``.log`` of its own (a duplicate, or opened when the files are
        closed), for an fsync in another thread that must not race with this segment being
        closed. An fsync covers the file's pages whichever descriptor wrote them, and a
        writeback error no descriptor has seen yet is reported to one opened after it (Linux
        4.16 and later)."""
        with self._lock:
            if self._fd >= 0:
                return diskio.ops.dup(self._fd)
            return diskio.ops.open(self._path(files.LOG_SUFFIX), os.O_RDONLY)

    def close(self) -> None:
        """Close the ``.log`` descriptor (the indexes are closed by their owner first);
        idempotent."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            diskio.ops.close(fd)
