"""Fixtures of the worker-pool tests: each test has its own broker on its own ``tmp_path``
(data dir, socket, shared-memory names), its own pool stats and events files, so ``-n auto``
is safe. Pools are real processes (``wk_pool.Pool``) that every test reaps."""

import sys
from pathlib import Path

import pytest

import mq.testing

# kafkanode and javakafka, the real Kafka node's helpers (until a shared cluster fixture)
_JAVA = Path(__file__).resolve().parents[1] / "integration" / "kafka" / "java"
sys.path[:0] = [p for p in (str(_JAVA), str(_JAVA / "judge")) if p not in sys.path]


@pytest.fixture
def broker(tmp_path):
    """A started broker subprocess on ``tmp_path / "data"``; stopped after the test."""
    with mq.testing.broker(tmp_path / "data") as b:
        yield b


@pytest.fixture
def pools():
    """``pools(pool)`` registers a pool; every registered pool is killed and reaped after the
    test (its children die with it)."""
    started = []
    yield started.append
    for pool in started:
        pool.close()


@pytest.fixture
def kafka_listener(tmp_path):
    """A started broker with a Kafka listener on a free loopback port (as
    ``tests/integration/kafka/conftest.py``'s ``kafka_mq``): its ``"127.0.0.1:PORT"``."""
    conf = tmp_path / "kafka.toml"
    conf.write_text('kafka_listeners = ["127.0.0.1:0"]\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as b:
        with mq.Admin(b.socket) as admin:
            [listener] = admin.broker_stats()["broker"]["kafka_listeners"]
        yield listener.rpartition("://")[2]             # without a PROTOCOL:// prefix


@pytest.fixture(scope="session")
def _kafka_node_of_session(tmp_path_factory):
    from kafkanode import KafkaNode
    node = KafkaNode(tmp_path_factory.mktemp("kafka"))
    yield node
    node.stop()


@pytest.fixture
def kafka_node(_kafka_node_of_session):
    """One real Apache Kafka node per session (``tests/integration/kafka/java/judge``'s
    ``kafkanode``), started the first time a test asks for it; tests share it, so each names
    its topics and groups uniquely. Fails, never skips, without Java or Maven."""
    from javakafka import JavaUnavailable
    node = _kafka_node_of_session
    if not node.running:
        try:
            node.start()
        except JavaUnavailable as err:
            pytest.fail(str(err))
    return node
