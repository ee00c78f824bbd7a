"""Fixtures of the tests where Apache Kafka judges mq's files (issue 23): ``kafka_node`` is one
real Kafka 4.3.1 node (``kafkanode``) per test session (per xdist worker), started the first
time a test asks for it and stopped at the session's end. It fails, never skips, without Java
or Maven (``.ci/run`` installs them)."""

from __future__ import annotations

import pytest
from javakafka import JavaUnavailable
from kafkanode import KafkaNode


@pytest.fixture(scope="session")
def kafka_node(tmp_path_factory):
    node = KafkaNode(tmp_path_factory.mktemp("kafka"))
    try:
        node.start()
    except JavaUnavailable as err:
        pytest.fail(str(err))
    yield node
    node.stop()
