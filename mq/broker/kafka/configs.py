"""Kafka's config apis on mq's topic configs: DescribeConfigs (v1-4), IncrementalAlterConfigs
(v0-1) and the older AlterConfigs (v0-2), which replaces a topic's overrides with the ones it
lists (those it leaves out are deleted; kafka-python's and confluent-kafka's ``alter_configs``
send it).

A topic's config is mq's ``LogConfig``: the topic's overrides (kept in the metadata log) over
the broker's ``[topic_defaults]`` over Kafka's defaults. Both apis go through the native
DescribeConfigs / IncrementalAlterConfigs (``apis/topics.py``), so a change made by a Kafka
client is the same metadata record, validation and live reconfiguration as ``mq topics
alter``. DescribeConfigs lists every topic config Kafka has, each with its value and where it
comes from, as Kafka's ``ConfigHelper`` does (librdkafka and Kafka tools read the defaults):

    config_source  DYNAMIC_TOPIC_CONFIG   the topic overrides it
                   STATIC_BROKER_CONFIG   the broker's [topic_defaults] sets it (Kafka's
                                          server.properties: ``log.retention.ms`` ...)
                   DEFAULT_CONFIG         Kafka's default

and, when asked, the synonyms in that order (topic key, then the broker key of Kafka's
``TopicConfigSynonyms``).

Kafka topic configs that mean nothing on one host or that mq does not implement (``FIXED``:
replication, remote storage, broker-side recompression, preallocation) are listed with the
only value mq has, read-only. Setting one to that value is accepted and changes nothing (tools
that set ``min.insync.replicas=1`` work); any other value is INVALID_CONFIG naming why.

Broker resources (type 4, the node id or ""): the broker settings that have a Kafka name,
read-only — mq's broker is configured by its config file, and SIGHUP reloads
``[topic_defaults]``. ``listeners`` is ``kafka_listeners`` as configured (port 0 stays 0, as in
Kafka); ``advertised.listeners`` is the address the asking client reached, which is the one
address Metadata names to it (Kafka lists both, and kafka-python's admin tests read them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from mq import errors
from mq.broker.acls import OPEN, AclOperation, Authorizer, ResourceType
from mq.broker.config import BrokerConfig
from mq.broker.kafka.addresses import parse_listener
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls
from mq.log.config import DEFAULTS
from mq.errors import BrokerError, InvalidConfigurationError, InvalidRequestError
from mq.protocol.messages import Api

__all__ = ["ConfigApis", "FIXED", "TOPIC_CONFIGS", "creatable", "describe_broker",
           "describe_topic", "plan_alteration"]


TOPIC, BROKER = 2, 4                                    # ConfigResource.Type
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5     # ConfigSource
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7              # ConfigType
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3              # AlterConfigOp.OpType


@dataclasses.dataclass(frozen=True, slots=True)
class Key:
    """A Kafka topic config: its type, and its broker synonym (None: the topic name)."""

    type: int
    broker_name: str | None


# The topic configs mq implements (``LogConfig``), with Kafka's broker synonyms.
TOPIC_CONFIGS: Final[dict[str, Key]] = {
    "cleanup.policy": Key(LIST, "log.cleanup.policy"),
    "delete.retention.ms": Key(LONG, "log.cleaner.delete.retention.ms"),
    "file.delete.delay.ms": Key(LONG, "log.segment.delete.delay.ms"),
    "flush.messages": Key(LONG, "log.flush.interval.messages"),
    "flush.ms": Key(LONG, "log.flush.interval.ms"),
    "index.interval.bytes": Key(INT, "log.index.interval.bytes"),
    "max.compaction.lag.ms": Key(LONG, "log.cleaner.max.compaction.lag.ms"),
    "max.message.bytes": Key(INT, "message.max.bytes"),
    "message.timestamp.after.max.ms": Key(LONG, "log.message.timestamp.after.max.ms"),
    "message.timestamp.before.max.ms": Key(LONG, "log.message.timestamp.before.max.ms"),
    "message.timestamp.type": Key(STRING, "log.message.timestamp.type"),
    "min.cleanable.dirty.ratio": Key(DOUBLE, "log.cleaner.min.cleanable.ratio"),
    "min.compaction.lag.ms": Key(LONG, "log.cleaner.min.compaction.lag.ms"),
    "retention.bytes": Key(LONG, "log.retention.bytes"),
    "retention.ms": Key(LONG, "log.retention.ms"),
    "segment.bytes": Key(INT, "log.segment.bytes"),
    "segment.index.bytes": Key(INT, "log.index.size.max.bytes"),
    "segment.jitter.ms": Key(LONG, "log.roll.jitter.ms"),
    "segment.ms": Key(LONG, "log.roll.ms"),
}
if set(TOPIC_CONFIGS) != set(DEFAULTS.to_properties()):
    raise AssertionError("TOPIC_CONFIGS must name exactly LogConfig's keys: "
                         f"{sorted(set(TOPIC_CONFIGS) ^ set(DEFAULTS.to_properties()))}")


@dataclasses.dataclass(frozen=True, slots=True)
class Fixed:
    """A Kafka topic config mq holds at one value, and why."""

    key: Key
    value: str
    why: str


_ONE_REPLICA = "one broker holds the only replica of every partition"
_NO_TIERING = "mq has no remote (tiered) storage"
_NO_RECOMPRESSION = ("mq stores each batch as the producer compressed it and never "
                     "recompresses (Kafka's compression.type=producer)")
FIXED: Final[dict[str, Fixed]] = {
    "compression.type": Fixed(Key(STRING, "compression.type"), "producer", _NO_RECOMPRESSION),
    "compression.gzip.level": Fixed(Key(INT, "compression.gzip.level"), "-1",
                                    _NO_RECOMPRESSION),
    "compression.lz4.level": Fixed(Key(INT, "compression.lz4.level"), "9", _NO_RECOMPRESSION),
    "compression.zstd.level": Fixed(Key(INT, "compression.zstd.level"), "3",
                                    _NO_RECOMPRESSION),
    "min.insync.replicas": Fixed(Key(INT, "min.insync.replicas"), "1", _ONE_REPLICA),
    "unclean.leader.election.enable": Fixed(Key(BOOLEAN, "unclean.leader.election.enable"),
                                            "false", _ONE_REPLICA),
    "leader.replication.throttled.replicas": Fixed(Key(LIST, None), "", _ONE_REPLICA),
    "follower.replication.throttled.replicas": Fixed(Key(LIST, None), "", _ONE_REPLICA),
    "preallocate": Fixed(Key(BOOLEAN, "log.preallocate"), "false",
                         "mq grows segment files as it writes them"),
    "remote.storage.enable": Fixed(Key(BOOLEAN, None), "false", _NO_TIERING),
    "remote.log.copy.disable": Fixed(Key(BOOLEAN, None), "false", _NO_TIERING),
    "remote.log.delete.on.disable": Fixed(Key(BOOLEAN, None), "false", _NO_TIERING),
    "local.retention.bytes": Fixed(Key(LONG, "log.local.retention.bytes"), "-2", _NO_TIERING),
    "local.retention.ms": Fixed(Key(LONG, "log.local.retention.ms"), "-2", _NO_TIERING),
}

# Broker settings with a Kafka name: (name, type, the value in mq's config, Kafka's default).
_BROKER_SETTINGS: Final = (
    ("node.id", INT, lambda c: c.node_id, None),
    ("log.dirs", STRING, lambda c: c.data_dir, None),
    ("auto.create.topics.enable", BOOLEAN, lambda c: c.auto_create_topics, "true"),
    ("num.partitions", INT, lambda c: c.num_partitions, "1"),
    ("default.replication.factor", INT, lambda c: 1, "1"),
    ("transaction.max.timeout.ms", INT, lambda c: c.transaction_max_timeout_ms, "900000"),
    ("producer.id.expiration.ms", INT, lambda c: c.producer_id_expiration_ms, "86400000"),
    ("socket.request.max.bytes", INT, lambda c: c.max_request_bytes, "104857600"),
    ("log.retention.check.interval.ms", LONG, lambda c: c.retention_check_interval_ms,
     "300000"),
    ("log.cleaner.backoff.ms", LONG, lambda c: c.cleaner_backoff_ms, "15000"),
    ("log.cleaner.dedupe.buffer.size", LONG, lambda c: c.cleaner_dedupe_buffer_bytes,
     "134217728"),
    ("offsets.retention.minutes", INT, lambda c: c.offsets_retention_minutes, "10080"),
    ("offsets.retention.check.interval.ms", LONG,
     lambda c: c.offsets_retention_check_interval_ms, "600000"),
    ("group.consumer.heartbeat.interval.ms", INT, lambda c: c.group_heartbeat_interval_ms,
     "5000"),
    ("group.consumer.session.timeout.ms", INT, lambda c: c.group_session_timeout_ms, "45000"),
    ("group.consumer.min.session.timeout.ms", INT, lambda c: c.group_min_session_timeout_ms,
     "45000"),
    ("group.consumer.max.session.timeout.ms", INT, lambda c: c.group_max_session_timeout_ms,
     "60000"),
)


def _text(value: object) -> str:
    """A setting as Kafka prints it: booleans in lower case, whole floats as integers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _entry(name: str, value: str | None, source: int, type_: int, *, read_only: bool,
           synonyms: list[dict], doc: str | None) -> dict:
    return {"name": name, "value": value, "read_only": read_only, "config_source": source,
            "is_sensitive": False, "synonyms": synonyms, "config_type": type_,
            "documentation": doc}


def describe_topic(effective: Mapping[str, str], overrides: Mapping[str, str],
                   broker: Mapping[str, str], *, synonyms: bool, documentation: bool
                   ) -> list[dict]:
    """Every Kafka topic config of a topic: ``effective`` values, the topic's ``overrides``,
    the ``broker``'s topic defaults (pure)."""
    kafka = DEFAULTS.to_properties()
    out = []
    for name, key in sorted(TOPIC_CONFIGS.items()):
        broker_name = key.broker_name or name
        chain = []
        if name in overrides:
            chain.append({"name": name, "value": overrides[name],
                          "source": DYNAMIC_TOPIC_CONFIG})
        if broker[name] != kafka[name]:
            chain.append({"name": broker_name, "value": broker[name],
                          "source": STATIC_BROKER_CONFIG})
        chain.append({"name": broker_name, "value": kafka[name], "source": DEFAULT_CONFIG})
        out.append(_entry(name, effective[name], chain[0]["source"], key.type,
                          read_only=False, synonyms=chain if synonyms else [], doc=None))
    for name, fixed in sorted(FIXED.items()):
        chain = [{"name": fixed.key.broker_name or name, "value": fixed.value,
                  "source": DEFAULT_CONFIG}]
        out.append(_entry(name, fixed.value, DEFAULT_CONFIG, fixed.key.type, read_only=True,
                          synonyms=chain if synonyms else [],
                          doc=f"fixed in mq: {fixed.why}" if documentation else None))
    return out


def created_topic(effective: Mapping[str, str], overrides: Mapping[str, str],
                  broker: Mapping[str, str]) -> list[dict]:
    """The ``configs`` of a CreateTopics (v5+) result: every config of the new topic, as
    ``describe_topic`` has them, in the response's five fields (pure). Kafka's admin client
    reads them for every created topic (``KafkaAdminClient.createTopics``), and fails on null."""
    fields = ("name", "value", "read_only", "config_source", "is_sensitive")
    return [{f: e[f] for f in fields}
            for e in describe_topic(effective, overrides, broker, synonyms=False,
                                    documentation=False)]


def _listener(host: str, port: int, protocol: str = "PLAINTEXT") -> str:
    return f"{protocol}://[{host}]:{port}" if ":" in host else f"{protocol}://{host}:{port}"


def _configured(text: str) -> str:
    """A configured listener in Kafka's form, its protocol kept."""
    lis = parse_listener(text)
    return _listener(lis.host, lis.port, lis.protocol)


def describe_broker(config: BrokerConfig, topic_defaults: Mapping[str, str],
                    advertised: tuple[str, int]) -> list[dict]:
    """The broker's settings with Kafka names, its listeners (``advertised``: the address
    the client reached), and its topic defaults under their broker names (pure)."""
    listeners = ",".join(_configured(a) for a in config.kafka_listeners)
    out = [_entry("listeners", listeners, STATIC_BROKER_CONFIG, STRING, read_only=True,
                  synonyms=[], doc=None),
           _entry("advertised.listeners", _listener(*advertised), STATIC_BROKER_CONFIG,
                  STRING, read_only=True, synonyms=[], doc=None)]
    for name, type_, get, default in _BROKER_SETTINGS:
        value = _text(get(config))
        source = DEFAULT_CONFIG if value == default else STATIC_BROKER_CONFIG
        out.append(_entry(name, value, source, type_, read_only=True, synonyms=[], doc=None))
    kafka = DEFAULTS.to_properties()
    for name, key in sorted(TOPIC_CONFIGS.items()):
        value = topic_defaults[name]
        source = DEFAULT_CONFIG if value == kafka[name] else STATIC_BROKER_CONFIG
        out.append(_entry(key.broker_name or name, value, source, key.type, read_only=True,
                          synonyms=[], doc=None))
    for name, fixed in sorted(FIXED.items()):
        if fixed.key.broker_name and fixed.key.broker_name not in {e["name"] for e in out}:
            out.append(_entry(fixed.key.broker_name, fixed.value, DEFAULT_CONFIG,
                              fixed.key.type, read_only=True, synonyms=[], doc=None))
    return out


def plan_alteration(ops: list[dict], effective: Mapping[str, str]
                    ) -> tuple[dict[str, str], list[str]]:
    """A topic's IncrementalAlterConfigs operations as (overrides to set, overrides to
    delete) over its ``effective`` config (pure). Raises ``InvalidRequestError`` or
    ``InvalidConfigurationError``."""
    names = [op["name"] for op in ops]
    if len(set(names)) != len(names):
        raise InvalidRequestError("a config is named twice in one resource: "
                          f"{sorted({n for n in names if names.count(n) > 1})}")
    changes: dict[str, str] = {}
    delete: list[str] = []
    for op in ops:
        name, kind, value = op["name"], op["config_operation"], op["value"]
        if kind not in (SET, DELETE, APPEND, SUBTRACT):
            raise InvalidRequestError(f"{name}: unknown operation {kind}")
        fixed = FIXED.get(name)
        if fixed is not None:
            if kind in (SET, APPEND):
                creatable({name: value or ""})          # refuses another value
            continue
        key = TOPIC_CONFIGS.get(name)
        if key is None:
            raise InvalidConfigurationError(f"unknown topic config {name!r}")
        if kind == DELETE:
            delete.append(name)
            continue
        if value is None:
            raise InvalidConfigurationError(f"{name}: a null value (use DELETE to remove "
                              "an override)")
        if kind == SET:
            changes[name] = value
            continue
        if key.type != LIST:
            raise InvalidConfigurationError(f"{name} is not a list: "
                              f"{'APPEND' if kind == APPEND else 'SUBTRACT'} does not apply")
        items = [v for v in effective[name].split(",") if v]
        given = [v.strip() for v in value.split(",") if v.strip()]
        if kind == APPEND:
            items += [v for v in given if v not in items]
        else:
            items = [v for v in items if v not in given]
        changes[name] = ",".join(items)
    return changes, delete


def plan_replacement(configs: list[dict], effective: Mapping[str, str],
                     overrides: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """AlterConfigs' list of (name, value) for a topic as (overrides to set, overrides to
    delete) (pure): every listed config is set (a null value: not overridden), every current
    override not listed is deleted. Raises as ``plan_alteration``."""
    ops = [{"name": c["name"], "config_operation": DELETE if c["value"] is None else SET,
            "value": c["value"]} for c in configs]
    listed = {c["name"] for c in configs}
    ops += [{"name": name, "config_operation": DELETE, "value": None}
            for name in sorted(overrides) if name not in listed]
    return plan_alteration(ops, effective)


def creatable(config: Mapping[str, str]) -> dict[str, str]:
    """A CreateTopics request's configs as mq's overrides: the ``FIXED`` ones at their only
    value dropped (pure). Raises ``InvalidConfigurationError`` for another value."""
    out = {}
    for name, value in config.items():
        fixed = FIXED.get(name)
        if fixed is None:
            out[name] = value
        elif value != fixed.value:
            raise InvalidConfigurationError(f"{name} is fixed at {fixed.value!r} in mq: "
                               f"{fixed.why}")
    return out


class ConfigApis:
    """The config handlers of the Kafka listener. ACLs (``acls.py``), as Kafka's:
    DescribeConfigs needs DescribeConfigs on the topic (TOPIC_AUTHORIZATION_FAILED) or on the
    Cluster for the broker (CLUSTER_AUTHORIZATION_FAILED); IncrementalAlterConfigs and
    AlterConfigs need AlterConfigs on them."""

    def __init__(self, config: BrokerConfig, authz: Authorizer = OPEN) -> None:
        self._config = config
        self._authz = authz

    def _denied(self, conn: KafkaConn, op: AclOperation, kind: int, name: str) -> int:
        """The authorization error for ``op`` on a topic or broker resource, else NONE."""
        if kind == TOPIC:
            return errors.NONE if self._authz.allows(conn, op, ResourceType.TOPIC, name) \
                else errors.TopicAuthorizationFailedError.code
        return errors.NONE if self._authz.allows(conn, op, ResourceType.CLUSTER) \
            else errors.ClusterAuthorizationFailedError.code

    def handlers(self) -> Mapping[int, object]:
        return {32: self.describe_configs, 33: self.alter_configs,
                44: self.incremental_alter_configs}

    def _is_this_broker(self, name: str) -> bool:
        return name in ("", str(self._config.node_id))

    # --- DescribeConfigs ----------------------------------------------------------------------
    def describe_configs(self, conn: KafkaConn, version: int, body: dict):
        resources = [r for r in body["resources"] if not self._denied(
            conn, AclOperation.DESCRIBE_CONFIGS, r["resource_type"], r["resource_name"])]
        topics = [r["resource_name"] for r in resources if r["resource_type"] == TOPIC]
        replies = yield Calls([Call(Api.DESCRIBE_CONFIGS, {"topic": ""})] +
                              [Call(Api.DESCRIBE_CONFIGS, {"topic": t}) for t in topics])
        defaults, by_topic = replies[0]["config"], dict(zip(topics, replies[1:], strict=True))
        synonyms = body["include_synonyms"]
        documentation = body["include_documentation"]
        results = []
        for r in body["resources"]:
            kind, name = r["resource_type"], r["resource_name"]
            row = {"error_code": errors.NONE, "error_message": None, "resource_type": kind,
                   "resource_name": name, "configs": []}
            denied = self._denied(conn, AclOperation.DESCRIBE_CONFIGS, kind, name)
            if denied:
                row.update(error_code=denied, error_message="not authorized")
            elif kind == TOPIC:
                reply = by_topic[name]
                if reply.error_code != errors.NONE:
                    row.update(error_code=reply.error_code, error_message=reply.error_message)
                else:
                    row["configs"] = describe_topic(reply["config"], reply["overrides"], defaults,
                                                    synonyms=synonyms,
                                                    documentation=documentation)
            elif kind == BROKER and self._is_this_broker(name):
                row["configs"] = describe_broker(self._config, defaults, conn.local_address)
            else:
                row.update(error_code=errors.InvalidRequestError.code,
                           error_message=_unsupported(kind, name, self._config.node_id))
            keys = r["configuration_keys"]
            if keys is not None:
                row["configs"] = [c for c in row["configs"] if c["name"] in keys]
            results.append(row)
        return {"throttle_time_ms": 0, "results": results}

    # --- IncrementalAlterConfigs and AlterConfigs ---------------------------------------------
    def incremental_alter_configs(self, conn: KafkaConn, version: int, body: dict):
        rows = yield from self._alter(conn, body, lambda r, effective, overrides:
                                      plan_alteration(r["configs"], effective))
        return {"throttle_time_ms": 0, "responses": rows}

    def alter_configs(self, conn: KafkaConn, version: int, body: dict):
        rows = yield from self._alter(conn, body, lambda r, effective, overrides:
                                      plan_replacement(r["configs"], effective, overrides))
        return {"throttle_time_ms": 0, "responses": rows}

    def _alter(self, conn: KafkaConn, body: dict, plan):
        """``yield from``: each resource's response row, its topic altered as ``plan(resource,
        effective config, overrides)`` says (overrides to set, to delete)."""
        resources = body["resources"]
        rows = [{"error_code": errors.NONE, "error_message": None,
                 "resource_type": r["resource_type"],
                 "resource_name": r["resource_name"]} for r in resources]
        for row, r in zip(rows, resources, strict=True):
            denied = self._denied(conn, AclOperation.ALTER_CONFIGS, r["resource_type"],
                                  r["resource_name"])
            if denied:
                row.update(error_code=denied, error_message="not authorized")
            elif r["resource_type"] == BROKER and self._is_this_broker(r["resource_name"]):
                row.update(error_code=errors.InvalidRequestError.code, error_message=(
                    "mq's broker settings come from its config file (SIGHUP reloads "
                    "[topic_defaults]); they cannot be altered over the Kafka protocol"))
            elif r["resource_type"] != TOPIC:
                row.update(error_code=errors.InvalidRequestError.code, error_message=_unsupported(
                    r["resource_type"], r["resource_name"], self._config.node_id))
        topics = [(row, r) for row, r in zip(rows, resources, strict=True)
                  if r["resource_type"] == TOPIC and row["error_code"] == errors.NONE]
        current = yield Calls([Call(Api.DESCRIBE_CONFIGS, {"topic": r["resource_name"]})
                               for _, r in topics])
        calls, called = [], []
        for (row, r), reply in zip(topics, current, strict=True):
            if reply.error_code != errors.NONE:
                row.update(error_code=reply.error_code, error_message=reply.error_message)
                continue
            try:
                changes, delete = plan(r, reply["config"], reply["overrides"])
            except BrokerError as err:
                row.update(error_code=err.code, error_message=err.message)
                continue
            calls.append(Call(Api.INCREMENTAL_ALTER_CONFIGS, {
                "topic": r["resource_name"], "set": changes, "delete": delete,
                "validate_only": int(body["validate_only"])}))
            called.append(row)
        if calls:
            replies = yield Calls(calls)
            for row, reply in zip(called, replies, strict=True):
                if reply.error_code != errors.NONE:
                    row.update(error_code=reply.error_code, error_message=reply.error_message)
        return rows


def _unsupported(kind: int, name: str, node_id: int) -> str:
    if kind == BROKER:
        return f"no broker {name!r}: this cluster is one broker, node {node_id}"
    return f"resource type {kind} is not served: mq has topic (2) and broker (4) configs"
