"""Fixtures of the integration tests. Each test's broker runs on its own ``tmp_path`` data dir,
so its socket and shared-memory/semaphore names are its own too (``-n auto`` is safe).

A module that wants topics in every test's broker overrides ``broker`` with a fixture of the
same name that takes this one and creates them.
"""

import pytest

import mq.testing


@pytest.fixture
def broker(tmp_path):
    """A started broker subprocess on ``tmp_path / "data"``; stopped (SIGTERM) after the test."""
    with mq.testing.broker(tmp_path / "data") as b:
        yield b
