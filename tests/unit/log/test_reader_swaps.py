"""``PartitionReader`` while the log cleaner swaps cleaned segments in
(``PartitionLog.replace_segments``): the swap is stopped after each of its renames (through
the ``diskio`` seam every storage rename goes through) and readers read there, in the same
process, step by step — the race a consumer loses only now and then under load.

Kafka's guarantee is checked at every step: a reader starting at any offset reads, offsets
increasing, every key whose latest record is at or past that offset at its latest value.
Every test owns its ``tmp_path``; time is passed as ``now_ms``, nothing sleeps.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import pytest

from mq.log import diskio
from mq.log.builder import BatchBuilder
from mq.log.cleaner import clean
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.log.reader import PartitionReader

# Single-record batches of one size (5-byte keys, 62-byte values), 7 to a segment. Reopened
# with room for 3 segments a segment, the cleaner groups them by 3: a swap replaces several
# files.
WRITE = LogConfig(segment_bytes=1000, index_interval_bytes=100, cleanup_policy="compact",
                  file_delete_delay_ms=0)
CLEAN = dataclasses.replace(WRITE, segment_bytes=3000)
KEYS = [b"key-%d" % i for i in range(5)]


class Swapping:
    """A log of updates to ``KEYS`` followed by filler with keys of its own (so the latest
    record of each key sits in a segment the cleaner rewrites), and what it holds."""

    def __init__(self, path: str, updates: int, fillers: int) -> None:
        self.latest: dict[bytes, tuple[int, bytes]] = {}      # key -> (offset, value)
        plog = PartitionLog.open(path, WRITE, now_ms=0)
        for seq in range(updates + fillers):
            key = KEYS[seq % len(KEYS)] if seq < updates else b"f%04d" % seq
            self.append(plog, key, b"%s=%06d" % (key, seq) + b"." * 50)
        plog.close()
        self.plog = PartitionLog.open(path, CLEAN, now_ms=0)

    def append(self, plog: PartitionLog, key: bytes, value: bytes) -> None:
        builder = BatchBuilder()
        builder.append(1_000, key, value)
        self.latest[key] = (plog.log_end_offset, value)
        plog.append(builder.build(), now_ms=1_000)

    def end(self) -> tuple[int, int]:
        return self.plog.active_segment.base_offset, self.plog.active_segment.size


class AfterEachRename(diskio.DiskIO):
    """The production pass-through, calling ``then(src, dst)`` after every rename."""

    def __init__(self, then: Callable[[str, str], None]) -> None:
        super().__init__()
        self.then = then

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        self.then(src, dst)


def read_from(reader: PartitionReader, offset: int, end: tuple[int, int],
              max_bytes: int) -> list[tuple[int, bytes, bytes]]:
    """Every record from ``offset`` to ``end``, read as the consumer reads."""
    rows = []
    while True:
        batches = reader.read(offset, *end, max_bytes)
        if not batches:
            return rows
        for batch in batches:
            rows += [(r.offset, bytes(r.key), bytes(r.value)) for r in batch.records()
                     if r.offset >= offset]
        offset = batches[-1].next_offset


def missed(log: Swapping, reader: PartitionReader, start: int, max_bytes: int) -> list:
    """What a read from ``start`` got wrong: offsets not increasing, or keys whose latest
    record is at or past ``start`` not read at their latest value."""
    rows = read_from(reader, start, log.end(), max_bytes)
    offsets = [offset for offset, _, _ in rows]
    if offsets != sorted(set(offsets)):
        return [("offsets go back", start)]
    found = {key: value for _, key, value in rows}
    return [(start, key, offset) for key, (offset, value) in log.latest.items()
            if offset >= start and found.get(key) != value]


@pytest.mark.parametrize("max_bytes", [100, 1 << 20])
def test_readers_at_every_step_of_a_swap_read_every_latest_record(tmp_path, max_bytes):
    """After each rename of every swap of a pass: a new reader (its listing taken there), a
    reader that read everything before the pass and re-lists there (a consumer seeing a new
    segment-set generation), and one that never re-lists on its own (it does when a file it
    listed is gone) each read from every fourth offset."""
    log = Swapping(str(tmp_path / "t-0"), updates=60, fillers=30)
    plog = log.plog
    relisting = PartitionReader(plog.dir)
    stale = PartitionReader(plog.dir)
    for reader in (relisting, stale):
        assert missed(log, reader, 0, max_bytes) == []
    steps: list[str] = []
    wrong: list = []

    def check(src: str, dst: str) -> None:
        steps.append(os.path.basename(dst))
        relisting.refresh()
        fresh = PartitionReader(plog.dir)
        try:
            for reader in (fresh, relisting, stale):
                for start in range(0, plog.log_end_offset, 4):
                    wrong.extend((steps[-1], *m) for m in missed(log, reader, start, max_bytes))
        except Exception as err:          # listed with the step it happened at
            wrong.append((steps[-1], repr(err)))
        finally:
            fresh.close()

    with diskio.installed(AfterEachRename(check)):
        stats = clean(plog, now_ms=10_000)
    relisting.close()
    stale.close()
    assert stats.completed and stats.groups_swapped >= 3
    assert any(name.endswith(".log.deleted") for name in steps)     # the hole's moment
    assert wrong == []
    with PartitionReader(plog.dir) as after:
        assert missed(log, after, 0, max_bytes) == []
    plog.close()


@pytest.mark.parametrize("evicted", [False, True], ids=["mapped", "evicted"])
def test_a_segment_swapped_at_its_base_is_read_from_its_new_bytes(tmp_path, evicted):
    """A reader that stopped at the end of a segment, which a swap then replaced by a longer
    cleaned file at the same base, goes on at the next offset: positions and the final size
    it knew were those of the old file. (At the old end position the new file holds a later
    batch of the same size, so reusing it would skip the records in between.) Its file may
    have been closed meanwhile, as the ``max_mapped_segments`` limit closes one: it is
    opened again as another inode."""
    log = Swapping(str(tmp_path / "t-0"), updates=12, fillers=30)
    plog = log.plog
    size = plog.segments[0].size
    reader = PartitionReader(plog.dir)
    batches = reader.read(0, *log.end(), size, generation=1)
    assert batches[-1].next_offset == plog.segments[1].base_offset
    if evicted:
        reader._segments[0].close()
    stats = clean(plog, now_ms=10_000)
    assert stats.groups_swapped >= 1 and plog.segments[0].base_offset == 0
    assert plog.segments[0].size > size                   # the group merged 3 segments
    nxt = batches[-1].next_offset
    reader.refresh()                                     # the broker's generation moved
    got = read_from(reader, nxt, log.end(), 1 << 20)
    with PartitionReader(plog.dir) as fresh:
        assert got == read_from(fresh, nxt, log.end(), 1 << 20)
    assert got[0][0] == nxt                              # kept: the latest of its key
    reader.close()
    plog.close()
