"""Fixtures of the worker-pool tests: each test has its own broker on its own ``tmp_path``
(data dir, socket, shared-memory names), its own pool stats and events files, so ``-n auto``
is safe. Pools are real processes (``wk_pool.Pool``) that every test reaps."""

import pytest

import mq.testing


@pytest.fixture
def broker(tmp_path):
    """A started broker subprocess on ``tmp_path / "data"``; stopped after the test."""
    with mq.testing.broker(tmp_path / "data") as b:
        yield b


@pytest.fixture
def pools():
    """``pools(pool)`` registers a pool (or a ``Feeder``); every registered pool is killed and
    reaped after the test (its children die with it), every feeder stopped."""
    started = []
    yield started.append
    for pool in started:
        pool.close()
