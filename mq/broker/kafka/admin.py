"""Kafka's cluster and topic apis on mq's topic component: Metadata, CreateTopics,
DeleteTopics, CreatePartitions, DeleteRecords, DescribeCluster, DescribeLogDirs (the data dir
is the one log dir).

One host is a cluster of one node: every partition's leader, only replica and only in-sync
replica is node ``node_id``, reached at the address the client connected to (so a client that
came through ``127.0.0.1:9092`` is sent back there, and one through ``[::1]:9092`` there). The
cluster id is the data dir's (``meta.properties``). Topic ids are the ids mq keeps in its
metadata log, served from Metadata v10 on.

Topic changes go through the native apis (``apis/topics.py``): the same validation,
crash-safe creation and state-slot accounting as ``mq topics``. Metadata and Produce create
an unknown topic with ``num_partitions`` partitions when ``auto_create_topics`` is on
(Kafka's ``auto.create.topics.enable``, on by default) and the client allows it.

**ACLs** (``acls.py``), as Kafka's: Metadata lists only the topics the principal may
Describe when asked for all, and answers TOPIC_AUTHORIZATION_FAILED for a named one it may
not (or may not Create, when it would be auto-created); CreateTopics needs Create on the
Cluster or the topic, DeleteTopics and DeleteRecords Delete, CreatePartitions Alter on the
topic, DescribeLogDirs Describe on the Cluster. DescribeCluster needs no ACL, as in Kafka
(whose Describe on the Cluster only gates the cluster's authorized operations, which mq does
not report): Kafka's admin client (3.9+) asks it for the nodes when it describes topics, as
Spark's Kafka connector does before every read.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping

from mq import errors
from mq.broker.acls import OPEN, AclOperation, Authorizer, ResourceType
from mq.broker.config import BrokerConfig
from mq.broker.internal_topics import is_internal
from mq.broker.kafka.configs import creatable, created_topic
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls, call_each
from mq.errors import BrokerError
from mq.broker.metadata import MetadataStore
from mq.broker.partitions import PartitionTable
from mq.protocol.messages import Api, Response

__all__ = ["AdminApis", "topic_id_bytes"]


_AUTHORIZED_OPERATIONS_UNKNOWN = -(1 << 31)     # "not requested"


def topic_id_bytes(topic_id: str | None) -> bytes:
    """A topic id as Kafka's 16-byte uuid (mq keeps it as 32 hex digits)."""
    if not topic_id:
        return bytes(16)
    try:
        return uuid.UUID(hex=topic_id).bytes
    except ValueError:
        return bytes(16)


class AdminApis:
    """The cluster and topic handlers of the Kafka listener."""

    def __init__(self, config: BrokerConfig, table: PartitionTable, metadata: MetadataStore,
                 *, leader_epoch: int, cluster_id: str, authz: Authorizer = OPEN) -> None:
        self._authz = authz
        self._config = config
        self._table = table
        self._metadata = metadata
        self._epoch = leader_epoch
        self.cluster_id = cluster_id
        self.node_id = config.node_id

    def handlers(self) -> Mapping[int, object]:
        return {3: self.metadata, 19: self.create_topics, 20: self.delete_topics,
                21: self.delete_records, 35: self.describe_log_dirs,
                37: self.create_partitions, 60: self.describe_cluster}

    def node(self, conn: KafkaConn) -> dict:
        """This node as the client reaches it."""
        host, port = conn.local_address
        return {"node_id": self.node_id, "host": host, "port": port, "rack": None}

    # --- Metadata -----------------------------------------------------------------------------
    def metadata(self, conn: KafkaConn, version: int, body: dict):
        requested = body["topics"]
        denied: set[str] = set()
        if requested is None or (version == 0 and not requested):     # v0: [] is all
            names = [n for n in sorted(self._metadata.topics)
                     if self._topic_allowed(conn, AclOperation.DESCRIBE, n)]
        else:      # by name, or by id (v10+; a KIP-848 client resolves its assignment so)
            by_id = {topic_id_bytes(info.topic_id): name
                     for name, info in self._metadata.topics.items()}
            names = [t["name"] if t["name"] is not None else
                     by_id.get(bytes(t.get("topic_id") or bytes(16)), "")
                     for t in requested]
            names = [n for n in names if n]
            denied = {n for n in names
                      if not self._topic_allowed(conn, AclOperation.DESCRIBE, n)}
        allow = body["allow_auto_topic_creation"] if version >= 4 else True
        missing = [n for n in names if n not in self._metadata.topics and n not in denied]
        if missing and allow and self._config.auto_create_topics:
            denied |= {n for n in missing if not self._authz.may_create_topic(conn, n)}
            missing = [n for n in missing if n not in denied]
        created: dict[str, int] = {}
        if missing and allow and self._config.auto_create_topics:
            replies = yield Calls([self.create_call(n) for n in missing])
            created = {n: r.error_code for n, r in zip(missing, replies, strict=True)}
        topics = []
        for name in names:
            info = self._metadata.topics.get(name)
            if name in denied:
                topics.append({"error_code": errors.TopicAuthorizationFailedError.code,
                               "name": name,
                               "topic_id": None, "is_internal": is_internal(name),
                               "partitions": []})
                continue
            if info is None:
                code = created.get(name) or errors.UnknownTopicOrPartitionError.code
                topics.append({"error_code": code, "name": name, "topic_id": None,
                               "is_internal": is_internal(name), "partitions": []})
                continue
            topics.append({
                "error_code": errors.NONE, "name": name, "topic_id": topic_id_bytes(info.topic_id),
                "is_internal": False,
                "partitions": [self._partition(p) for p in range(info.partitions)],
                "topic_authorized_operations": _AUTHORIZED_OPERATIONS_UNKNOWN})
        return {"throttle_time_ms": 0, "brokers": [self.node(conn)],
                "cluster_id": self.cluster_id, "controller_id": self.node_id,
                "topics": topics,
                "cluster_authorized_operations": _AUTHORIZED_OPERATIONS_UNKNOWN}

    def _topic_allowed(self, conn: KafkaConn, op: AclOperation, name: str) -> bool:
        return self._authz.allows(conn, op, ResourceType.TOPIC, name)

    def _partition(self, index: int) -> dict:
        return {"error_code": errors.NONE, "partition_index": index, "leader_id": self.node_id,
                "leader_epoch": self._epoch, "replica_nodes": [self.node_id],
                "isr_nodes": [self.node_id], "offline_replicas": []}

    def create_call(self, name: str, partitions: int | None = None,
                    config: dict[str, str] | None = None) -> Call:
        """The native CreateTopics of an auto-created topic (``num_partitions``)."""
        return Call(Api.CREATE_TOPICS, {"topic": name,
                                        "partitions": partitions or
                                        self._config.num_partitions,
                                        "config": config or {}})

    # --- CreateTopics / DeleteTopics / CreatePartitions ---------------------------------------
    def create_topics(self, conn: KafkaConn, version: int, body: dict):
        rows, calls, called, validated = [], [], [], []
        for t in body["topics"]:
            name, count = t["name"], t["num_partitions"]
            if t["assignments"]:
                count = len(t["assignments"])
            elif count == -1:
                count = self._config.num_partitions
            row = {"name": name, "topic_id": None, "error_code": errors.NONE, "error_message": None,
                   "num_partitions": count, "replication_factor": 1, "configs": None}
            try:
                config = creatable({c["name"]: c["value"] for c in t["configs"]
                                    if c["value"] is not None})
            except BrokerError as err:            # a config mq holds at another value
                row.update(error_code=err.code, error_message=err.message)
                rows.append(row)
                continue
            if not self._authz.may_create_topic(conn, name):
                row.update(error_code=errors.TopicAuthorizationFailedError.code,
                           error_message=f"not authorized to create topic {name!r}")
            elif t["replication_factor"] not in (-1, 1):
                row.update(error_code=errors.InvalidReplicationFactorError.code,
                           error_message=f"replication factor {t['replication_factor']} is "
                           "larger than the 1 broker this cluster has")
            elif any(node != self.node_id for a in t["assignments"] for node in a["broker_ids"]):
                row.update(error_code=errors.InvalidRequestError.code,
                           error_message=f"this cluster has one broker, node {self.node_id}")
            elif body["validate_only"]:
                if name in self._metadata.topics:
                    row.update(error_code=36, error_message=f"topic {name!r} already exists")
                else:
                    validated.append((row, config))
            else:
                calls.append(self.create_call(name, count, config))
                called.append(row)
            rows.append(row)
        if calls:
            replies = yield Calls(calls)
            for row, reply in zip(called, replies, strict=True):
                if reply.error_code != errors.NONE:
                    row.update(error_code=reply.error_code, error_message=reply.error_message)
                else:
                    row["topic_id"] = topic_id_bytes(reply["metadata"]["id"])
        created = [row for row in called if row["error_code"] == errors.NONE]
        if version >= 5 and (created or validated):     # configs are in the response from v5
            replies = yield Calls([Call(Api.DESCRIBE_CONFIGS, {"topic": ""})] +
                                  [Call(Api.DESCRIBE_CONFIGS, {"topic": row["name"]})
                                   for row in created])
            defaults = replies[0]["config"]
            for row, reply in zip(created, replies[1:], strict=True):
                if reply.error_code == errors.NONE:
                    row["configs"] = created_topic(reply["config"], reply["overrides"], defaults)
            for row, config in validated:
                row["configs"] = created_topic({**defaults, **config}, config, defaults)
        return {"throttle_time_ms": 0, "topics": rows}

    def delete_topics(self, conn: KafkaConn, version: int, body: dict):
        names = list(body["topic_names"]) + [t["name"] for t in body["topics"] if t["name"]]
        allowed = [n for n in names if self._topic_allowed(conn, AclOperation.DELETE, n)]
        replies = yield from call_each({n: Call(Api.DELETE_TOPICS, {"topic": n})
                                        for n in allowed})
        return {"throttle_time_ms": 0, "responses": [
            {"name": n, "topic_id": None, "error_code": r.error_code,
             "error_message": r.error_message if r.error_code else None}
            for n, r in ((n, replies.get(n, _denied(n))) for n in names)]}

    def create_partitions(self, conn: KafkaConn, version: int, body: dict):
        topics = body["topics"]
        allowed = [t for t in topics
                   if self._topic_allowed(conn, AclOperation.ALTER, t["name"])]
        if body["validate_only"]:
            unknown = errors.UnknownTopicOrPartitionError.code
            replies = {t["name"]: Response.refused(
                errors.NONE if t["name"] in self._metadata.topics else unknown, None)
                for t in allowed}
        else:
            replies = yield from call_each({
                t["name"]: Call(Api.CREATE_PARTITIONS, {"topic": t["name"],
                                                        "total": t["count"]})
                for t in allowed})
        return {"throttle_time_ms": 0, "results": [
            {"name": n, "error_code": r.error_code,
             "error_message": r.error_message if r.error_code else None}
            for n, r in ((t["name"], replies.get(t["name"], _denied(t["name"])))
                         for t in topics)]}

    # --- DeleteRecords ------------------------------------------------------------------------
    def delete_records(self, conn: KafkaConn, version: int, body: dict):
        where = [(t["name"], p["partition_index"], p["offset"]) for t in body["topics"]
                 for p in t["partitions"]]
        calls = []
        for topic, index, offset in where:
            if not self._topic_allowed(conn, AclOperation.DELETE, topic):
                calls.append(None)
                continue
            if offset == -1:                       # -1: up to the high watermark
                part = self._table.get(topic, index)
                offset = part.log.high_watermark if part is not None else 0
            calls.append(Call(Api.DELETE_RECORDS, {"topic": topic, "partition": index,
                                                   "offset": offset}))
        made = yield from call_each({i: c for i, c in enumerate(calls) if c is not None})
        replies = [made.get(i) or _denied(topic) for i, (topic, _, _) in enumerate(where)]
        by_topic: dict[str, list[dict]] = {}
        for (topic, index, _), r in zip(where, replies, strict=True):
            by_topic.setdefault(topic, []).append(
                {"partition_index": index, "error_code": r.error_code,
                 "low_watermark": r["log_start_offset"] if r.error_code == errors.NONE else -1})
        return {"throttle_time_ms": 0, "topics": [
            {"name": topic, "partitions": rows} for topic, rows in by_topic.items()]}

    # --- DescribeLogDirs ----------------------------------------------------------------------
    def describe_log_dirs(self, conn: KafkaConn, version: int, body: dict) -> dict:
        """The one log dir, the data dir, with the size of each partition asked for (every
        one when ``topics`` is null) and its file system's size and free space. Needs
        Describe on the Cluster, as in Kafka (below v3 a refusal is an empty list)."""
        if not self._authz.allows(conn, AclOperation.DESCRIBE, ResourceType.CLUSTER):
            return {"throttle_time_ms": 0,
                    "error_code": errors.ClusterAuthorizationFailedError.code, "results": []}
        wanted = None if body["topics"] is None else \
            {(t["topic"], p) for t in body["topics"] for p in t["partitions"]}
        by_topic: dict[str, list[dict]] = {}
        for part in sorted(self._table, key=lambda p: (p.topic, p.partition)):
            if wanted is None or (part.topic, part.partition) in wanted:
                by_topic.setdefault(part.topic, []).append({
                    "partition_index": part.partition, "partition_size": part.log.size_in_bytes,
                    "offset_lag": 0, "is_future_key": False})
        log_dir = os.path.abspath(self._config.data_dir)
        disk = shutil.disk_usage(log_dir)
        return {"throttle_time_ms": 0, "error_code": errors.NONE, "results": [{
            "error_code": errors.NONE, "log_dir": log_dir,
            "topics": [{"name": name, "partitions": rows} for name, rows in by_topic.items()],
            "total_bytes": disk.total, "usable_bytes": disk.free, "is_cordoned": False}]}

    # --- DescribeCluster ----------------------------------------------------------------------
    def describe_cluster(self, conn: KafkaConn, version: int, body: dict) -> dict:
        node = self.node(conn)
        return {"throttle_time_ms": 0, "error_code": errors.NONE, "error_message": None,
                "endpoint_type": 1, "cluster_id": self.cluster_id,
                "controller_id": self.node_id,
                "brokers": [{"broker_id": node["node_id"], "host": node["host"],
                             "port": node["port"], "rack": None}],
                "cluster_authorized_operations": _AUTHORIZED_OPERATIONS_UNKNOWN}


def _denied(topic: str) -> Response:
    """TOPIC_AUTHORIZATION_FAILED for a call not made."""
    return Response.refused(errors.TopicAuthorizationFailedError.code,
                            f"not authorized for topic {topic!r}")
