"""Setting up the real broker of an integration test: a broker with config-file settings, and
topics. (The plain per-test broker is the ``broker`` fixture of ``conftest.py``.)"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def kafka_listener(tmp_path, **settings):
    """``broker_with`` plus a Kafka listener on a free loopback port, topics created on first
    use as Kafka's defaults do; yields ``(broker, "127.0.0.1:PORT")``."""
    settings = {"kafka_listeners": ["127.0.0.1:0"], "auto_create_topics": True,
                "num_partitions": 1, **settings}
    with broker_with(tmp_path, **settings) as b:
        with Admin(b.socket) as admin:
            [listener] = admin.broker_stats()["broker"]["kafka_listeners"]
        address = listener.rpartition("://")[2]         # without a PROTOCOL:// prefix
        assert address.startswith("127.0.0.1:"), listener
        yield b, address
