"""The broker's shared state region when /dev/shm cannot hold it: one line naming state_slots."""

from __future__ import annotations

import errno

import pytest

from mq.broker import server
from mq.errors import ConfigError


def test_a_full_dev_shm_names_state_slots(monkeypatch, tmp_path):
    def full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(server, "StateWriter", full)
    with pytest.raises(ConfigError, match=r"^cannot reserve the 64.0 MiB state region of "
                                          r"state_slots = 1048576 in /dev/shm: No space left "
                                          r"on device; lower state_slots or give /dev/shm more "
                                          r"room$"):
        server.state_region(str(tmp_path), 1 << 20, 0)


def test_other_errors_pass_through(monkeypatch, tmp_path):
    def denied(*_args):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(server, "StateWriter", denied)
    with pytest.raises(PermissionError):
        server.state_region(str(tmp_path), 8, 0)


def test_the_region_is_made_when_it_fits(tmp_path):
    region = server.state_region(str(tmp_path), 8, 0)
    try:
        assert region.slots == 8
    finally:
        region.close()
