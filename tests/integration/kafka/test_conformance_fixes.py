"""Behaviour Kafka clients' own integration suites expect of a broker, found by running those
suites against mq (kafka-python 3.0.12's ``test/integration`` and confluent-kafka-python's
``tests/integration``; Tansu's method), each checked here with a real client so it stays
fixed."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, ConsumerGroupType
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from kclients import LOGGER, WAIT, admin, create_topic

import mq
import mq.testing

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


def _member(bootstrap: str, protocol: str) -> Consumer:
    """A member of group "updown" on topic "updown", subscribed, speaking ``protocol``."""
    c = Consumer({**LOGGER, "bootstrap.servers": bootstrap, "group.id": "updown",
                  "group.protocol": protocol, "enable.auto.commit": False})
    c.subscribe(["updown"])
    return c


def _group_type(client: AdminClient, members: list[Consumer]) -> ConsumerGroupType:
    """The group's type once its members hold all of the topic's 2 partitions."""
    def settled() -> bool:
        for c in members:
            c.poll(0.05)
        return sum(len(c.assignment()) for c in members) == 2
    mq.testing.wait_for(settled, WAIT, 0, "the members to share both partitions")
    return client.describe_consumer_groups(["updown"])["updown"].result(WAIT).type


def test_a_group_of_classic_members_is_described_as_classic(kafka_mq):
    """confluent-kafka's test_consumer_upgrade_downgrade adds a classic member, then a
    ``group.protocol=consumer`` one, removes the latter and expects the group's type to be
    CLASSIC whenever only classic members are left. The client describes with
    ConsumerGroupDescribe and falls back to DescribeGroups on the GROUP_ID_NOT_FOUND that
    Kafka answers for a classic group."""
    create_topic(kafka_mq.bootstrap, "updown", 2)
    client = admin(kafka_mq.bootstrap)
    classic = _member(kafka_mq.bootstrap, "classic")
    try:
        assert _group_type(client, [classic]) == ConsumerGroupType.CLASSIC
        upgraded = _member(kafka_mq.bootstrap, "consumer")
        try:
            assert _group_type(client, [classic, upgraded]) == ConsumerGroupType.CONSUMER
        finally:
            upgraded.close()
        assert _group_type(client, [classic]) == ConsumerGroupType.CLASSIC
    finally:
        classic.close()
