"""The file-operations seam (``mq.log.diskio``) and its fault injector."""

from __future__ import annotations

import errno
import os

import pytest

from mq.log import diskio
from mq.log.diskio import ALLOCATING_OPS, DiskIO, Fault, FaultyDiskIO, dir_mode_for, write_fully


def test_write_fully_writes_a_large_buffer(tmp_path):
    data = os.urandom(3 << 20)
    fd = os.open(tmp_path / "big", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_fully(fd, data, 0)
    finally:
        os.close(fd)
    assert (tmp_path / "big").read_bytes() == data


def test_write_fully_finishes_short_writes_at_the_right_place(tmp_path):
    path = str(tmp_path / "f")
    seam = FaultyDiskIO([Fault(errno.ENOSPC, ops=frozenset({"pwrite"}), short=0.25, times=3)])
    with diskio.installed(seam):
        fd = diskio.ops.open(path, os.O_RDWR | os.O_CREAT)
        write_fully(fd, b"head", 0)
        write_fully(fd, b"0123456789" * 10, 4)
        diskio.ops.close(fd)
    assert (tmp_path / "f").read_bytes() == b"head" + b"0123456789" * 10
    assert len(seam.injected) == 3


def test_write_fully_raises_when_the_disk_fills_mid_write(tmp_path):
    path = str(tmp_path / "f")
    seam = FaultyDiskIO([Fault(errno.ENOSPC, ops=frozenset({"pwrite"}), short=0.5),
                         Fault(errno.ENOSPC, ops=frozenset({"pwrite"}))])
    with diskio.installed(seam):
        fd = diskio.ops.open(path, os.O_RDWR | os.O_CREAT)
        with pytest.raises(OSError) as failed:
            write_fully(fd, b"x" * 100, 0)
        diskio.ops.close(fd)
    assert failed.value.errno == errno.ENOSPC and diskio.is_space_error(failed.value)
    assert os.path.getsize(path) == 50          # the caller truncates back


def test_fail_nth_counts_matching_operations_and_fails_once_or_forever(tmp_path):
    seam = FaultyDiskIO()
    seam.fail_nth(2, errno.EIO, ops=frozenset({"fsync"}))
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        seam.fsync(fd)
        seam.fsync(fd)
        with pytest.raises(OSError, match="injected") as failed:
            seam.fsync(fd)
        assert failed.value.errno == errno.EIO and not diskio.is_space_error(failed.value)
        seam.fsync(fd)                                   # once
        seam.fail_nth(0, errno.EIO, forever=True, ops=frozenset({"fsync"}))
        for _ in range(3):
            with pytest.raises(OSError):
                seam.fsync(fd)
    finally:
        os.close(fd)
    assert [op for op, _, _ in seam.injected] == ["fsync"] * 4
    assert seam.injected[0][1] == str(tmp_path)          # the path behind the descriptor


def test_disk_full_fails_allocating_operations_only_until_cleared(tmp_path):
    seam = FaultyDiskIO()
    seam.disk_full()
    target = str(tmp_path / "new")
    with pytest.raises(OSError) as failed:
        seam.open(target, os.O_RDWR | os.O_CREAT)
    assert failed.value.errno == errno.ENOSPC and not os.path.exists(target)
    with open(target, "wb") as f:
        f.write(b"abc")
    fd = seam.open(target, os.O_RDWR | os.O_CREAT)       # exists: creating nothing
    try:
        with pytest.raises(OSError):
            seam.pwrite(fd, b"x", 3)
        seam.ftruncate(fd, 1)                            # shrinking needs no space
        seam.fdatasync(fd)
        seam.clear()
        assert seam.pwrite(fd, b"y", 1) == 1
    finally:
        seam.close(fd)
    assert (tmp_path / "new").read_bytes() == b"ay"
    assert {"open", "pwrite"} <= ALLOCATING_OPS and "ftruncate" not in ALLOCATING_OPS


def test_path_filter_and_installed_restores_the_seam(tmp_path):
    seam = FaultyDiskIO([Fault(errno.EIO, path_contains="checkpoint", times=-1)])
    before = diskio.ops
    with diskio.installed(seam):
        assert diskio.ops is seam
        fd = diskio.ops.open(str(tmp_path / "data.log"), os.O_RDWR | os.O_CREAT)
        diskio.ops.close(fd)
        with pytest.raises(OSError):
            diskio.ops.open(str(tmp_path / "recovery-point-offset-checkpoint"),
                            os.O_RDWR | os.O_CREAT)
    assert diskio.ops is before


def test_modes_of_created_files_and_directories(tmp_path):
    old = os.umask(0o022)
    try:
        seam = DiskIO(file_mode=0o640)
        seam.makedirs(str(tmp_path / "a" / "b"))
        fd = seam.open(str(tmp_path / "a" / "b" / "f"), os.O_RDWR | os.O_CREAT)
        seam.close(fd)
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "a").st_mode & 0o777 == 0o750
    assert os.stat(tmp_path / "a" / "b").st_mode & 0o777 == 0o750
    assert os.stat(tmp_path / "a" / "b" / "f").st_mode & 0o777 == 0o640
    assert dir_mode_for(0o600) == 0o700 and dir_mode_for(0o644) == 0o755
