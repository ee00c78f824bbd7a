"""``mq workers stats`` when no pool runs: a note for all pools, an error for a named group."""

from __future__ import annotations

import argparse

import pytest

import workers
from mq.cli.workers import run_stats
from mq.errors import MQError


def _args(group=None) -> argparse.Namespace:
    return argparse.Namespace(group=group, file=None, json=False, openmetrics=False,
                              prometheus=False)


def test_no_running_pool_is_a_note_and_status_0(monkeypatch, capsys):
    monkeypatch.setattr(workers, "find_stats", lambda group=None: [])
    assert run_stats(_args()) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("mq: no worker pool is running (none has a counter table in ")
    assert len(err.splitlines()) == 1


def test_a_group_without_a_running_pool_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr(workers, "find_stats", lambda group=None: [])
    monkeypatch.setattr("workers.stats.stats_dir", lambda: str(tmp_path))
    with pytest.raises(MQError, match="^no worker pool of group 'billing' is running "
                                      rf"\(none has a counter table in {tmp_path}; "):
        run_stats(_args("billing"))
    (tmp_path / "mq-workers-billing-eu-999999999.stats").touch()   # group billing-eu
    with pytest.raises(MQError, match="none has a counter table"):
        run_stats(_args("billing"))
    (tmp_path / "mq-workers-billing-999999999.stats").touch()      # its pool was killed
    with pytest.raises(MQError, match=r"^no worker pool of group 'billing' is running: its "
                                      r"pool \(pid 999999999\) has ended$"):
        run_stats(_args("billing"))
