"""Admission by free space (``mq.broker.space.FreeSpaceGuard``), with a fake file system and
clock: what is refused, when the reading is refreshed, and that space coming back ends it."""

from __future__ import annotations

import logging
import os

import pytest

from mq.broker.space import REFRESH_S, FreeSpaceGuard, format_bytes
from mq.errors import KafkaStorageError

MiB = 1 << 20


class FakeFs:
    def __init__(self, free: int) -> None:
        self.free = free
        self.readings = 0
        self.now = 0.0

    def statvfs(self, path: str) -> os.statvfs_result:
        self.readings += 1
        # (bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax)
        return os.statvfs_result((4096, 4096, 0, 0, self.free // 4096, 0, 0, 0, 0, 255))


def guard(fs: FakeFs, floor: int = 64 * MiB) -> FreeSpaceGuard:
    return FreeSpaceGuard("/data", floor, statvfs=fs.statvfs, clock=lambda: fs.now)


def test_admits_above_the_floor_reading_free_space_at_most_every_refresh():
    fs = FakeFs(1024 * MiB)
    g = guard(fs)
    for _ in range(1000):
        g.admit(1000)
    assert fs.readings == 1
    fs.now += REFRESH_S
    g.admit(1000)
    assert fs.readings == 2


def test_refuses_below_the_floor_with_a_retriable_error_naming_the_sizes(caplog):
    fs = FakeFs(65 * MiB)
    g = guard(fs)
    g.admit(MiB)                         # leaves exactly the floor
    fs.free -= MiB                       # ... written
    with pytest.raises(KafkaStorageError) as refused:
        g.admit(1)
    assert refused.value.retriable
    assert "64.0 MiB free" in str(refused.value) and "min_free_bytes (64.0 MiB)" in str(
        refused.value)
    assert g.refusing and "refusing produce requests" in caplog.text


def test_an_estimate_below_the_floor_is_checked_against_a_fresh_reading():
    fs = FakeFs(70 * MiB)
    g = guard(fs)
    g.admit(4 * MiB)                     # estimate: 66 MiB
    fs.free = 200 * MiB                  # space freed meanwhile, within the refresh time
    g.admit(4 * MiB)                     # the estimate says no; the reading says yes
    assert fs.readings == 2


def test_space_coming_back_ends_the_refusal(caplog):
    caplog.set_level(logging.INFO)
    fs = FakeFs(10 * MiB)
    g = guard(fs)
    with pytest.raises(KafkaStorageError):
        g.admit(100)
    fs.free = 500 * MiB
    fs.now += REFRESH_S
    g.admit(100)
    assert not g.refusing and "free again" in caplog.text


def test_zero_turns_it_off():
    fs = FakeFs(0)
    guard(fs, floor=0).admit(MiB)
    assert fs.readings == 0


def test_format_bytes():
    assert [format_bytes(n) for n in (0, 1023, 1024, 3 * MiB // 2, 5 << 30)] == \
        ["0 B", "1023 B", "1.0 KiB", "1.5 MiB", "5.0 GiB"]
