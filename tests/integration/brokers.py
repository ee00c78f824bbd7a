"""Setting up the real broker of an integration test: a broker with config-file settings, and
topics. (The plain per-test broker is the ``broker`` fixture of ``conftest.py``.)"""

from __future__ import annotations

import json

import mq.testing
from mq.client.admin import Admin


def broker_with(tmp_path, **settings):
    """``mq.testing.broker`` on ``tmp_path / "data"`` with these config keys (written as TOML to
    ``tmp_path / "mq.toml"``); a context manager."""
    conf = tmp_path / "mq.toml"
    conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    return mq.testing.broker(tmp_path / "data", config_file=str(conf))


def create_topic(b, name: str, partitions: int = 1, config: dict | None = None) -> None:
    with Admin(b.socket) as admin:
        admin.create_topic(name, partitions, config)
