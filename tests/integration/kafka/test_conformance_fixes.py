"""Behaviour Kafka clients' own integration suites expect of a broker, found by running those
suites against mq (kafka-python 3.0.12's ``test/integration``; Tansu's method), each checked
here with a real client so it stays fixed."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

import mq

# kafka-python 3 loads its schemas with importlib.resources' legacy functions (Python 3.11), so
# it is imported inside the tests, under this filter.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:(open|read)_text is deprecated:DeprecationWarning")


def test_broker_configs_name_the_listeners(kafka_mq):
    """kafka-python's test_describe_configs_broker_resource_returns_configs reads
    ``advertised.listeners`` of the broker resource; Kafka 4 lists it, read-only, from the
    broker's static config."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType
    with KafkaAdminClient(bootstrap_servers=kafka_mq.bootstrap) as admin:
        configs = admin.describe_configs([KPConfigResource(ConfigResourceType.BROKER, 0)],
                                         config_filter="all")["broker"]["0"]
    advertised = configs["advertised.listeners"]
    assert advertised["value"] == f"PLAINTEXT://{kafka_mq.bootstrap}"
    assert (advertised["config_source"], advertised["read_only"], advertised["is_sensitive"]) \
        == ("STATIC_BROKER_CONFIG", True, False)
    assert configs["listeners"]["value"] == "PLAINTEXT://127.0.0.1:0"


def _alter_cleanup_policy(broker, topic: str, op: AlterConfigOpType, value: str) -> str:
    """Create ``topic``, alter its cleanup.policy by ``op`` with confluent-kafka, and return
    the value DescribeConfigs reports."""
    with mq.Admin(socket=broker.socket) as admin:
        admin.create_topic(topic, partitions=1)
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", value, incremental_operation=op)])
    for future in client.incremental_alter_configs([resource]).values():
        future.result(30)
    described = client.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    return next(iter(described.values())).result(30)["cleanup.policy"].value


def test_cleanup_policy_may_be_emptied(mixed):
    """confluent-kafka's test_incremental_alter_configs SUBTRACTs ``delete`` from a topic's
    ``cleanup.policy``: Kafka accepts the empty list that leaves (neither retention nor
    compaction) and describes it as ""."""
    assert _alter_cleanup_policy(mixed, "kept", AlterConfigOpType.SUBTRACT, "delete") == ""


def test_cleanup_policy_keeps_its_order(mixed):
    """The same test APPENDs ``compact`` to ``delete`` and reads back "delete,compact", the
    order Kafka keeps."""
    assert _alter_cleanup_policy(mixed, "both", AlterConfigOpType.APPEND, "compact") == \
        "delete,compact"
