"""Fixtures of the tests of Apache Kafka's own Java clients, CLI tools and Spark's Kafka
connector against mq's Kafka listener (``javakafka`` says how the jars are had).

``java_kafka`` (session) is the resolved classpath; ``kafka_client_props`` (empty: PLAINTEXT) the
client properties every tool and client gets, for a secured listener's tests to override;
``kafka_java`` a ``KafkaTarget``: ``kafka_mq``'s address with those properties.
"""

from __future__ import annotations

import pytest
from javakafka import JavaKafka, JavaUnavailable, KafkaTarget, write_properties


@pytest.fixture(scope="session")
def java_kafka() -> JavaKafka:
    try:
        return JavaKafka.load()
    except JavaUnavailable as err:
        pytest.fail(str(err))


@pytest.fixture
def kafka_client_props() -> dict[str, str]:
    return {}


@pytest.fixture
def kafka_java(java_kafka, kafka_mq, kafka_client_props, tmp_path) -> KafkaTarget:
    config = write_properties(tmp_path / "client.properties", kafka_client_props)
    return KafkaTarget(java_kafka, kafka_mq.bootstrap, config)
