"""Fixtures of the tests where Apache Kafka judges mq's files (issue 23): ``kafka_node`` is one
real Kafka 4.3.1 node (``kafkanode``) per test session (per xdist worker), started the first
time a test asks for it and stopped at the session's end; a test may stop and start it (to
swap files in), and the next test gets it running again even if that test failed with it
stopped. It fails, never skips, without Java or Maven (``.ci/run`` installs them)."""

from __future__ import annotations

import pytest
from javakafka import JavaUnavailable
from kafkanode import KafkaNode


@pytest.fixture(scope="session")
def _kafka_node_of_session(tmp_path_factory):
    node = KafkaNode(tmp_path_factory.mktemp("kafka"))
    yield node
    node.stop()


@pytest.fixture
def kafka_node(_kafka_node_of_session) -> KafkaNode:
    node = _kafka_node_of_session
    if not node.running:
        try:
            node.start()
        except JavaUnavailable as err:
            pytest.fail(str(err))
    return node
