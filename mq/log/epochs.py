"""``leader-epoch-checkpoint``: which leader epoch wrote which offsets (Kafka's
LeaderEpochFileCache), one file per partition directory::

    0                 version
    2                 entry count
    1 0               epoch startOffset: epoch 1 wrote offsets from 0
    3 1200            epoch 3 from offset 1200

mq has one broker, so an epoch is a broker start: each start uses one more than any epoch a
partition has recorded (``LogManager``), stamps it into every batch it appends
(``partitionLeaderEpoch``) and records here the first offset it wrote with it. The file is a
convenience (a Kafka broker leaves one; tools read it) rebuilt from the batches by recovery, so
it is written without an fsync, atomically; a write that fails keeps the previous file.
"""

from __future__ import annotations

import logging
import os

from mq.log import files

__all__ = ["LEADER_EPOCH_CHECKPOINT", "LeaderEpochCache"]

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

log = logging.getLogger(__name__)


class LeaderEpochCache:
    """``[(epoch, start offset)]`` of one partition, ascending in both."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
        self.entries: list[tuple[int, int]] = _read(self.path)

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else -1

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` wrote from ``start_offset`` on (no-op for a known epoch)."""
        if epoch <= self.latest_epoch:
            return
        self.entries.append((epoch, start_offset))
        self._write()

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or past ``end_offset`` (the log was cut there)."""
        keep = [(e, o) for e, o in self.entries if o < end_offset]
        if keep != self.entries:
            self.entries = keep
            self._write()

    def clear(self) -> None:
        if self.entries:
            self.entries = []
            self._write()

    def _write(self) -> None:
        lines = ["0", str(len(self.entries))] + [f"{e} {o}" for e, o in self.entries]
        try:
            files.atomic_write(self.path, ("\n".join(lines) + "\n").encode(), durable=False)
        except OSError as err:
            log.warning("%s not written (%s); recovery rebuilds it", self.path, err)


def _read(path: str) -> list[tuple[int, int]]:
    """The entries of a checkpoint; none for a missing or damaged file (recovery rebuilds)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        count = int(lines[1])
        entries = [tuple(map(int, line.split())) for line in lines[2:2 + count]]
        if lines[0].strip() != "0" or len(entries) != count or \
                any(len(e) != 2 for e in entries):
            raise ValueError("malformed")
        return [(e[0], e[1]) for e in entries]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, IndexError, UnicodeDecodeError) as err:
        log.warning("ignoring damaged %s: %s", path, err)
        return []
