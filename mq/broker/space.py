"""Room to breathe: produce is refused before the data dir's file system is full.

A full disk fails writes the broker cannot refuse: checkpoints, offset commits, metadata,
compaction output. So produce requests, the one writer that can wait, are refused with a
retriable ``KAFKA_STORAGE_ERROR`` while free space is below ``min_free_bytes`` (etcd's NOSPACE
alarm, Redis's MISCONF, JetStream's reservations: ``docs/architecture.md``, "Write
failures").
Producers retry with backoff and get through once space returns; reads never stop.

Free space is ``f_bavail * f_frsize`` (what an unprivileged writer may use). ``statvfs`` costs
about a microsecond, so it is read at most every ``REFRESH_S`` and in between estimated by
subtracting what was admitted since; an estimate below the floor triggers a fresh reading
before anything is refused.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Final

from mq.errors import KafkaStorageError

__all__ = ["FreeSpaceGuard", "format_bytes"]

log = logging.getLogger("mq.broker")

REFRESH_S: Final = 0.1


def format_bytes(n: int) -> str:
    """``format_bytes(3 << 20)`` -> ``"3.0 MiB"``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class FreeSpaceGuard:
    """Admission by free space on ``path``'s file system; ``min_free_bytes`` 0 turns it off."""

    def __init__(self, path: str, min_free_bytes: int,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.min_free_bytes = min_free_bytes
        self._statvfs = statvfs
        self._clock = clock
        self._free = 0
        self._admitted = 0              # bytes admitted since the last reading
        self._next_refresh = float("-inf")
        self.refusing = False

    def free_bytes(self) -> int:
        """A fresh reading of the free space."""
        st = self._statvfs(self.path)
        self._free = st.f_bavail * st.f_frsize
        self._admitted = 0
        self._next_refresh = self._clock() + REFRESH_S
        return self._free

    def admit(self, nbytes: int) -> None:
        """Count ``nbytes`` about to be written, or raise ``KafkaStorageError`` (retriable)
        if that would leave less than ``min_free_bytes`` free."""
        if self.min_free_bytes <= 0:
            return
        if self._clock() >= self._next_refresh or \
                self._free - self._admitted - nbytes < self.min_free_bytes:
            self.free_bytes()
        left = self._free - self._admitted - nbytes
        if left < self.min_free_bytes:
            if not self.refusing:
                self.refusing = True
                log.warning("%s: %s free, below min_free_bytes (%s): refusing produce requests "
                            "until space is freed", self.path, format_bytes(self._free),
                            format_bytes(self.min_free_bytes))
            raise KafkaStorageError(
                f"not enough free space for the data dir {self.path}: "
                f"{format_bytes(self._free)} free, and the broker keeps min_free_bytes "
                f"({format_bytes(self.min_free_bytes)}) free; produce is refused until space "
                "is freed (delete topics or records, lower retention, or add disk)")
        if self.refusing:
            self.refusing = False
            log.info("%s: %s free again: taking produce requests", self.path,
                     format_bytes(self._free))
        self._admitted += nbytes
