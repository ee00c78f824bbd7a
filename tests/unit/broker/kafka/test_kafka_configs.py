"""The pure parts of the Kafka config apis: what DescribeConfigs lists, and how
IncrementalAlterConfigs' operations become overrides to set and delete."""

from __future__ import annotations

import pytest

from mq.broker.config import BrokerConfig
from mq.broker.kafka.configs import (APPEND, DEFAULT_CONFIG, DELETE, DYNAMIC_TOPIC_CONFIG,
                                     FIXED, SET,
                                     STATIC_BROKER_CONFIG, SUBTRACT, TOPIC_CONFIGS,
                                     creatable, created_topic, describe_broker, describe_topic,
                                     plan_alteration, plan_replacement)
from mq.log.config import DEFAULTS, LogConfig
from mq.errors import BrokerError

INVALID_CONFIG, INVALID_REQUEST = 40, 42     # Kafka's numbers, pinned here


def op(name, kind, value=None):
    return {"name": name, "config_operation": kind, "value": value}


def test_describe_topic_sources_and_synonyms():
    broker = LogConfig.from_properties({"retention.ms": "1000"}).to_properties()
    effective = LogConfig.from_properties({"segment.bytes": "100000"},
                                          LogConfig.from_properties(broker)).to_properties()
    entries = {e["name"]: e for e in describe_topic(effective, {"segment.bytes": "100000"},
                                                    broker, synonyms=True,
                                                    documentation=True)}
    assert set(entries) == set(TOPIC_CONFIGS) | set(FIXED)
    seg = entries["segment.bytes"]
    assert (seg["value"], seg["config_source"]) == ("100000", DYNAMIC_TOPIC_CONFIG)
    assert [(s["name"], s["source"]) for s in seg["synonyms"]] == [
        ("segment.bytes", DYNAMIC_TOPIC_CONFIG), ("log.segment.bytes", DEFAULT_CONFIG)]
    ret = entries["retention.ms"]
    assert (ret["value"], ret["config_source"]) == ("1000", STATIC_BROKER_CONFIG)
    assert [(s["value"], s["source"]) for s in ret["synonyms"]] == [
        ("1000", STATIC_BROKER_CONFIG), (DEFAULTS.to_properties()["retention.ms"],
                                         DEFAULT_CONFIG)]
    mir = entries["min.insync.replicas"]
    assert (mir["value"], mir["read_only"], mir["config_source"]) == ("1", True,
                                                                      DEFAULT_CONFIG)
    assert "replica" in mir["documentation"]
    plain = describe_topic(effective, {}, broker, synonyms=False, documentation=False)
    assert all(e["synonyms"] == [] and e["documentation"] is None for e in plain)


def test_created_topic_has_create_topics_five_fields():
    broker = DEFAULTS.to_properties()
    effective = {**broker, "retention.ms": "9000"}
    entries = {e["name"]: e for e in created_topic(effective, {"retention.ms": "9000"}, broker)}
    assert set(entries) == set(TOPIC_CONFIGS) | set(FIXED)
    assert entries["retention.ms"] == {"name": "retention.ms", "value": "9000",
                                       "read_only": False,
                                       "config_source": DYNAMIC_TOPIC_CONFIG,
                                       "is_sensitive": False}
    assert entries["min.insync.replicas"]["read_only"] is True


def test_describe_broker_names_and_sources():
    config = BrokerConfig(node_id=3, num_partitions=4,
                          kafka_listeners=("127.0.0.1:0", "[::1]:9092"))
    defaults = LogConfig.from_properties({"max.message.bytes": "2000"}).to_properties()
    entries = {e["name"]: e for e in describe_broker(config, defaults, ("::1", 9092))}
    assert entries["node.id"]["value"] == "3"
    assert entries["listeners"]["value"] == "PLAINTEXT://127.0.0.1:0,PLAINTEXT://[::1]:9092"
    assert entries["advertised.listeners"]["value"] == "PLAINTEXT://[::1]:9092"
    assert (entries["num.partitions"]["value"], entries["num.partitions"]["config_source"]) \
        == ("4", STATIC_BROKER_CONFIG)
    assert entries["auto.create.topics.enable"]["value"] == "true"
    assert (entries["message.max.bytes"]["value"],
            entries["message.max.bytes"]["config_source"]) == ("2000", STATIC_BROKER_CONFIG)
    assert entries["log.roll.ms"]["config_source"] == DEFAULT_CONFIG
    assert entries["min.insync.replicas"]["value"] == "1"
    assert all(e["read_only"] for e in entries.values())


def test_plan_set_delete_append_subtract():
    effective = {**DEFAULTS.to_properties(), "cleanup.policy": "delete"}
    assert plan_alteration([op("retention.ms", SET, "5"), op("segment.bytes", DELETE),
                            op("cleanup.policy", APPEND, "compact,delete")], effective) == \
        ({"retention.ms": "5", "cleanup.policy": "delete,compact"}, ["segment.bytes"])
    effective["cleanup.policy"] = "compact,delete"
    assert plan_alteration([op("cleanup.policy", SUBTRACT, "delete")], effective) == \
        ({"cleanup.policy": "compact"}, [])


def test_plan_fixed_configs_take_only_their_value():
    effective = DEFAULTS.to_properties()
    assert plan_alteration([op("min.insync.replicas", SET, "1"),
                            op("preallocate", DELETE)], effective) == ({}, [])
    with pytest.raises(match="one broker holds the only replica") as info:
        plan_alteration([op("min.insync.replicas", SET, "2")], effective)
    assert info.value.code == INVALID_CONFIG


@pytest.mark.parametrize("ops, code", [
    ([op("no.such", SET, "1")], INVALID_CONFIG),
    ([op("retention.ms", APPEND, "1")], INVALID_CONFIG),
    ([op("retention.ms", SET, None)], INVALID_CONFIG),
    ([op("retention.ms", 9, "1")], INVALID_REQUEST),
    ([op("retention.ms", SET, "1"), op("retention.ms", DELETE)], INVALID_REQUEST),
])
def test_plan_refusals(ops, code):
    with pytest.raises(BrokerError) as info:
        plan_alteration(ops, DEFAULTS.to_properties())
    assert info.value.code == code


def test_creatable_drops_fixed_configs_at_their_value():
    assert creatable({"min.insync.replicas": "1", "compression.type": "producer",
                      "retention.ms": "5"}) == {"retention.ms": "5"}
    with pytest.raises(match="recompress") as info:
        creatable({"compression.type": "lz4"})
    assert info.value.code == INVALID_CONFIG


def test_alter_configs_replaces_the_overrides_with_those_it_lists():
    effective = LogConfig().to_properties()
    current = {"retention.ms": "1000", "segment.bytes": "1000000"}
    changes, delete = plan_replacement(
        [{"name": "retention.ms", "value": "5"}, {"name": "cleanup.policy", "value": None},
         {"name": "min.insync.replicas", "value": "1"}], effective, current)
    assert changes == {"retention.ms": "5"}
    assert sorted(delete) == ["cleanup.policy", "segment.bytes"]
    with pytest.raises(BrokerError) as info:
        plan_replacement([{"name": "min.insync.replicas", "value": "2"}], effective, {})
    assert info.value.code == INVALID_CONFIG
