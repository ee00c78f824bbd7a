"""The one seam every write-side file operation of the broker goes through.

Storage code never calls ``os.write``/``os.fdatasync``/``os.rename``... directly for files under
a data directory: it calls ``diskio.ops.<op>``. In production ``ops`` is a ``DiskIO``, a thin
pass-through to ``os``. Tests install a ``FaultyDiskIO`` (``with diskio.installed(faulty):``) to
make any single operation fail the way disks fail — ``ENOSPC``, ``EDQUOT``, ``EIO``, a short
write, part of a write then an error — on a seeded or counted schedule, as SQLite's test VFS
and TigerBeetle's simulated storage do (``docs/architecture.md``, "Write failures").

What callers may rely on, and what the storage engine promises above this layer:

- ``write_fully(fd, data, position)`` loops over short ``pwrite`` results; it either writes
  every byte or raises ``OSError`` (having maybe written a prefix: the caller truncates back).
- Files are written at tracked positions with ``pwrite``, never through ``O_APPEND`` or a
  writable memory map: a failed append leaves no fragment that a later append lands behind,
  and a full disk is an ``OSError`` here, never a ``SIGBUS`` from a page fault in a map.
- New files and directories get ``file_mode``/``dir_mode`` (owner read-write, the socket's
  group read-only, others nothing, by default); the broker sets them from its config.

``ENOSPC`` and ``EDQUOT`` are *space* errors: after the caller has put the files back as they
were, the same write can succeed once space returns. Every other errno (``EIO`` first) means the
disk or the page cache can no longer be trusted (``is_space_error``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import random
import threading
from collections.abc import Iterator
from typing import Final

__all__ = [
    "DEFAULT_DIR_MODE",
    "DEFAULT_FILE_MODE",
    "DiskIO",
    "Fault",
    "FaultyDiskIO",
    "dir_mode_for",
    "installed",
    "is_space_error",
    "ops",
    "write_fully",
]

DEFAULT_FILE_MODE: Final = 0o640
DEFAULT_DIR_MODE: Final = 0o750
_SPACE_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_space_error(err: BaseException) -> bool:
    """True for "no space left" and "quota exceeded": retriable once space returns."""
    return isinstance(err, OSError) and err.errno in _SPACE_ERRNOS


def dir_mode_for(file_mode: int) -> int:
    """The directory mode matching a file mode: search (x) wherever read (r) is allowed."""
    return file_mode | ((file_mode & 0o444) >> 2)


class DiskIO:
    """Pass-through to ``os``; the production seam."""

    def __init__(self, file_mode: int = DEFAULT_FILE_MODE) -> None:
        self.file_mode = file_mode
        self.dir_mode = dir_mode_for(file_mode)

    def open(self, path: str, flags: int, mode: int | None = None) -> int:
        return os.open(path, flags, self.file_mode if mode is None else mode)

    def pwrite(self, fd: int, data, position: int) -> int:
        return os.pwrite(fd, data, position)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def dup(self, fd: int) -> int:
        return os.dup(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, self.dir_mode)

    def makedirs(self, path: str) -> None:
        """``os.makedirs(path, exist_ok=True)`` with ``dir_mode`` for what it creates."""
        if os.path.isdir(path):
            return
        parent = os.path.dirname(os.path.abspath(path))
        if parent != path:
            self.makedirs(parent)
        try:
            self.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise


ops: DiskIO = DiskIO()


@contextlib.contextmanager
def installed(seam: DiskIO) -> Iterator[DiskIO]:
    """Route every storage file operation through ``seam`` for the duration (tests)."""
    global ops
    saved, ops = ops, seam
    try:
        yield seam
    finally:
        ops = saved


def write_fully(fd: int, data, position: int) -> None:
    """``pwrite`` every byte of ``data`` at ``position`` (a regular-file write can be short,
    e.g. when the disk fills mid-write: the next call then raises ``ENOSPC``)."""
    view = memoryview(data)
    while view:
        n = ops.pwrite(fd, view, position)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
        position += n


# --- fault injection (tests, chaos runs) ------------------------------------------------------

#: Operations that allocate space: the ones a full disk fails.
ALLOCATING_OPS: Final = frozenset({"open", "pwrite", "mkdir", "rename", "replace"})
WRITE_OPS: Final = frozenset({"open", "pwrite", "ftruncate", "fdatasync", "fsync", "dup",
                              "rename", "replace", "unlink", "mkdir"})


@dataclasses.dataclass
class Fault:
    """One planned failure. It matches an operation by name (``ops``; None: any of
    ``WRITE_OPS``) and by path (``path_contains``); it skips ``after`` matches, then fails the
    next ``times`` ones (-1: forever) with ``errno``. A ``short`` fault on ``pwrite`` writes
    ``short`` of the bytes (at least one, fewer than all) and reports that count instead of
    raising, so the next write raises (a disk filling mid-write)."""

    errno: int = errno.ENOSPC
    ops: frozenset[str] | None = None
    path_contains: str | None = None
    after: int = 0
    times: int = 1
    short: float = 0.0          # 0 < short < 1: fraction of the bytes a pwrite writes

    def matches(self, op: str, path: str) -> bool:
        return (op in (WRITE_OPS if self.ops is None else self.ops)
                and (self.path_contains is None or self.path_contains in path))


class FaultyDiskIO(DiskIO):
    """A ``DiskIO`` that fails operations as its ``faults`` say; thread-safe (the broker's
    flusher thread syncs while its loop thread writes). ``calls`` counts every write-side
    operation it saw, ``injected`` lists ``(op, path, errno)`` of each failure it caused.

    ``disk_full()`` is the common case: every allocating operation fails with ``ENOSPC``
    until ``clear()`` (freeing the space), while truncation, sync and unlink still work."""

    def __init__(self, faults: list[Fault] | None = None, file_mode: int = DEFAULT_FILE_MODE,
                 seed: int | None = None) -> None:
        super().__init__(file_mode)
        self.faults: list[Fault] = list(faults or [])
        self.calls = 0
        self.injected: list[tuple[str, str, int]] = []
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()
        self.random = random.Random(seed)

    # -- schedule ----------------------------------------------------------------------------
    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def disk_full(self, err: int = errno.ENOSPC) -> Fault:
        return self.add(Fault(err, ops=ALLOCATING_OPS, times=-1))

    def fail_nth(self, n: int, err: int = errno.EIO, forever: bool = False,
                 ops: frozenset[str] | None = None, short: float = 0.0) -> Fault:
        """Fail the ``n``-th (0-based) matching operation from now on (SQLite's ioerr loop)."""
        return self.add(Fault(err, ops=ops, after=n, times=-1 if forever else 1, short=short))

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def _check(self, op: str, path: str) -> Fault | None:
        with self._lock:
            self.calls += 1
            for fault in self.faults:
                if not fault.matches(op, path):
                    continue
                if fault.after > 0:
                    fault.after -= 1
                    continue
                if fault.times == 0:
                    continue
                if fault.times > 0:
                    fault.times -= 1
                self.injected.append((op, path, fault.errno))
                return fault
        return None

    def _raise_if(self, op: str, path: str) -> None:
        fault = self._check(op, path)
        if fault is not None:
            raise OSError(fault.errno, f"{os.strerror(fault.errno)} (injected)", path)

    def _path(self, fd: int) -> str:
        path = self._paths.get(fd)
        if path is None:                 # opened before this seam was installed
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = f"<fd {fd}>"
        return path

    # -- operations --------------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int | None = None) -> int:
        if flags & os.O_CREAT and not os.path.exists(path):
            self._raise_if("open", path)
        fd = super().open(path, flags, mode)
        with self._lock:
            self._paths[fd] = path
        return fd

    def pwrite(self, fd: int, data, position: int) -> int:
        path = self._path(fd)
        fault = self._check("pwrite", path)
        if fault is None:
            return super().pwrite(fd, data, position)
        size = len(data)
        if fault.short and size > 1:
            part = min(max(1, int(size * fault.short)), size - 1)
            return super().pwrite(fd, memoryview(data)[:part], position)
        raise OSError(fault.errno, f"{os.strerror(fault.errno)} (injected)", path)

    def ftruncate(self, fd: int, length: int) -> None:
        self._raise_if("ftruncate", self._path(fd))
        super().ftruncate(fd, length)

    def fdatasync(self, fd: int) -> None:
        self._raise_if("fdatasync", self._path(fd))
        super().fdatasync(fd)

    def fsync(self, fd: int) -> None:
        self._raise_if("fsync", self._path(fd))
        super().fsync(fd)

    def dup(self, fd: int) -> int:
        self._raise_if("dup", self._path(fd))
        new = super().dup(fd)
        with self._lock:
            self._paths[new] = self._path(fd)
        return new

    def close(self, fd: int) -> None:
        with self._lock:
            self._paths.pop(fd, None)
        super().close(fd)

    def rename(self, src: str, dst: str) -> None:
        self._raise_if("rename", dst)
        super().rename(src, dst)

    def replace(self, src: str, dst: str) -> None:
        self._raise_if("replace", dst)
        super().replace(src, dst)

    def unlink(self, path: str) -> None:
        self._raise_if("unlink", path)
        super().unlink(path)

    def mkdir(self, path: str) -> None:
        self._raise_if("mkdir", path)
        super().mkdir(path)
