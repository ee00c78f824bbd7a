"""ACL enforcement in every Kafka api family, driven as the listener drives a handler, with a
connection that carries the principal an authenticating listener (SASL, TLS) sets: what a
denied principal is answered, and that nothing is done for it (no native call is made).

The end-to-end denials of a real client over SASL come with the SASL listener (issue 21)."""

from __future__ import annotations

import types
from collections.abc import Generator

import pytest

from mq.broker.acls import (AclBinding, AclIndex, AclOperation as Op, Authorizer, PatternType,
                            Permission, ResourceType as R)
from mq.broker.config import BrokerConfig
from mq.broker.kafka.acl_apis import AclWireApis
from mq.broker.kafka.admin import AdminApis
from mq.broker.kafka.configs import ConfigApis
from mq.broker.kafka.coordination import CoordinationApis
from mq.broker.kafka.data import DataApis
from mq.broker.kafka.exchange import Call, CloseConnection
from mq.broker.kafka.group_admin import GroupAdminApis
from mq.broker.kafka.groups import GroupWireApis
from mq.broker.kafka.transactions import TransactionWireApis
from mq.broker.metadata import MetadataStore
from mq.log.log import PartitionLog
from mq.protocol.messages import Api, Response

TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED = 29, 30, 31, 53


def allow(rtype: R, name: str, op: Op, pattern: PatternType = PatternType.LITERAL,
          principal: str = "User:alice") -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, Permission.ALLOW)


def conn(principal: str | None = "User:alice"):
    c = types.SimpleNamespace(peer="127.0.0.1:40000", local_address=("127.0.0.1", 9092),
                              client_id="test")
    if principal is not None:
        c.principal = principal
    return c


def drive(out, answer=None):
    """Run a handler's result to its response, answering each native call with
    ``answer(call)`` (default: success with no fields); (response, calls made)."""
    made = []
    if not isinstance(out, Generator):
        return out, made
    value = None
    try:
        while True:
            wanted = out.send(value)
            made.extend(wanted.calls)
            value = [Response.from_message((answer or (lambda c: [c.api, 1, 0, None]))(c))
                     for c in wanted.calls]
    except StopIteration as stop:
        return stop.value, made


@pytest.fixture
def acls():
    return []


@pytest.fixture
def authz(acls):
    return Authorizer(lambda: AclIndex(acls), super_users=["admin"])


@pytest.fixture
def metadata(tmp_path):
    plog = PartitionLog.open(str(tmp_path / "__cluster_metadata-0"))
    store = MetadataStore(plog)
    for name in ("orders", "payroll"):
        store.create_topic(name, 1, {})
    yield store
    plog.close()


class _NoPartitions:
    def get(self, topic, partition):
        return None


# --- Produce, Fetch, ListOffsets --------------------------------------------------------------

def _produce_body(*topics, tid=None):
    return {"transactional_id": tid, "acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": t, "partition_data": [{"index": 0, "records": b"x"}]} for t in topics]}


def test_produce_writes_only_the_topics_the_principal_may_write(acls, authz):
    acls.append(allow(R.TOPIC, "ord", Op.WRITE, PatternType.PREFIXED))
    data = DataApis(_NoPartitions(), leader_epoch=0, node_id=0, authz=authz)
    out, made = drive(data.produce(conn(), 9, _produce_body("orders", "payroll")),
                      lambda c: [c.api, 1, 0, None, 5, -1, 0])
    assert [c.fields["topic"] for c in made] == ["orders"]
    codes = {t["name"]: t["partition_responses"][0]["error_code"] for t in out["responses"]}
    assert codes == {"orders": 0, "payroll": TOPIC_DENIED}


def test_a_transactional_produce_needs_write_on_its_transactional_id(acls, authz):
    acls.append(allow(R.TOPIC, "orders", Op.WRITE))
    data = DataApis(_NoPartitions(), leader_epoch=0, node_id=0, authz=authz)
    out, made = drive(data.produce(conn(), 9, _produce_body("orders", tid="tx")))
    assert made == []
    assert out["responses"][0]["partition_responses"][0]["error_code"] == TXN_DENIED


def test_an_acks_0_produce_that_is_denied_closes_the_connection(authz):
    data = DataApis(_NoPartitions(), leader_epoch=0, node_id=0, authz=authz)
    body = {**_produce_body("orders"), "acks": 0}
    out, made = drive(data.produce(conn(), 9, body))
    assert made == [] and isinstance(out, CloseConnection)


def test_produce_auto_creates_only_with_create(acls, authz):
    acls.append(allow(R.TOPIC, "new", Op.WRITE))
    data = DataApis(_NoPartitions(), leader_epoch=0, node_id=0, authz=authz,
                    auto_create=lambda name: Call(Api.CREATE_TOPICS, {"topic": name}))
    _, made = drive(data.produce(conn(), 9, _produce_body("new")),
                    lambda c: [c.api, 1, 3, "unknown"])
    assert [c.api for c in made] == [Api.PRODUCE]            # no CreateTopics
    acls.append(allow(R.TOPIC, "new", Op.CREATE))
    _, made = drive(data.produce(conn(), 9, _produce_body("new")),
                    lambda c: [c.api, 1, 3, "unknown"])
    assert [c.api for c in made] == [Api.CREATE_TOPICS, Api.PRODUCE]


def test_fetch_list_offsets_and_epochs_need_read_or_describe(acls, authz):
    data = DataApis(_NoPartitions(), leader_epoch=0, node_id=0, authz=authz)
    fetch = {"max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
             "topics": [{"topic": "orders", "partitions": [
                 {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                  "partition_max_bytes": 1 << 20}]}]}
    out, _ = drive(data.fetch(conn(), 12, fetch))
    assert out["responses"][0]["partitions"][0]["error_code"] == TOPIC_DENIED
    listed = data.list_offsets(conn(), 8, {"isolation_level": 0, "topics": [
        {"name": "orders", "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                          "timestamp": -1}]}]})
    assert listed["topics"][0]["partitions"][0]["error_code"] == TOPIC_DENIED
    epochs = data.offset_for_leader_epoch(conn(), 4, {"topics": [
        {"topic": "orders", "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                           "leader_epoch": 0}]}]})
    assert epochs["topics"][0]["partitions"][0]["error_code"] == TOPIC_DENIED
    acls.append(allow(R.TOPIC, "orders", Op.READ))     # Read implies Describe
    out, _ = drive(data.fetch(conn(), 12, fetch))
    assert out["responses"][0]["partitions"][0]["error_code"] == 3    # on to the table
    listed = data.list_offsets(conn(), 8, {"isolation_level": 0, "topics": [
        {"name": "orders", "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                          "timestamp": -1}]}]})
    assert listed["topics"][0]["partitions"][0]["error_code"] == 3


# --- Metadata and topic administration --------------------------------------------------------

def _admin(metadata, authz, **config):
    return AdminApis(BrokerConfig(**config), _NoPartitions(), metadata, leader_epoch=0,
                     cluster_id="c", authz=authz)


def test_metadata_hides_topics_and_refuses_named_ones(acls, authz, metadata):
    acls.append(allow(R.TOPIC, "orders", Op.DESCRIBE))
    admin = _admin(metadata, authz)
    every = {"topics": None, "allow_auto_topic_creation": True}
    out, _ = drive(admin.metadata(conn(), 12, every))
    assert [t["name"] for t in out["topics"]] == ["orders"]
    named = {"topics": [{"name": "payroll", "topic_id": None},
                        {"name": "orders", "topic_id": None},
                        {"name": "fresh", "topic_id": None}],
             "allow_auto_topic_creation": True}
    out, made = drive(admin.metadata(conn(), 12, named))
    assert made == []                        # "fresh" is not created: no Create
    assert [(t["name"], t["error_code"]) for t in out["topics"]] == [
        ("payroll", TOPIC_DENIED), ("orders", 0), ("fresh", TOPIC_DENIED)]
    acls.append(allow(R.CLUSTER, "kafka-cluster", Op.CREATE))
    acls.append(allow(R.TOPIC, "fresh", Op.DESCRIBE))
    _, made = drive(admin.metadata(conn(), 12, named), lambda c: [c.api, 1, 0, None, {}])
    assert [c.fields["topic"] for c in made] == ["fresh"]


def test_topic_administration_needs_create_delete_alter(acls, authz, metadata):
    admin = _admin(metadata, authz)
    out, made = drive(admin.create_topics(conn(), 5, {"validate_only": False, "topics": [
        {"name": "n", "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}]}))
    assert made == [] and out["topics"][0]["error_code"] == TOPIC_DENIED
    out, made = drive(admin.delete_topics(conn(), 4, {"topic_names": ["orders"],
                                                       "topics": []}))
    assert made == [] and out["responses"][0]["error_code"] == TOPIC_DENIED
    out, made = drive(admin.create_partitions(conn(), 3, {"validate_only": False, "topics": [
        {"name": "orders", "count": 2, "assignments": None}]}))
    assert made == [] and out["results"][0]["error_code"] == TOPIC_DENIED
    out, made = drive(admin.delete_records(conn(), 2, {"topics": [
        {"name": "orders", "partitions": [{"partition_index": 0, "offset": 5}]}]}))
    assert made == [] and out["topics"][0]["partitions"][0]["error_code"] == TOPIC_DENIED
    acls.extend([allow(R.TOPIC, "orders", Op.DELETE), allow(R.TOPIC, "orders", Op.ALTER)])
    _, made = drive(admin.delete_topics(conn(), 4, {"topic_names": ["orders"], "topics": []}))
    assert [c.api for c in made] == [Api.DELETE_TOPICS]
    _, made = drive(admin.create_partitions(conn(), 3, {"validate_only": False, "topics": [
        {"name": "orders", "count": 2, "assignments": None}]}), lambda c: [c.api, 1, 0, None])
    assert [c.api for c in made] == [Api.CREATE_PARTITIONS]


def test_describe_cluster_needs_no_acl(metadata, authz):
    """As Kafka's: an ACL-less user is told the nodes (Kafka 3.9's admin client asks before it
    describes topics, as Spark's Kafka connector does before a read)."""
    out, _ = drive(_admin(metadata, authz).describe_cluster(conn(), 1, {}))
    assert out["error_code"] == 0 and [b["broker_id"] for b in out["brokers"]] == [0]


def test_configs_need_describe_configs_and_alter_configs(acls, authz):
    configs = ConfigApis(BrokerConfig(), authz)
    body = {"include_synonyms": False, "include_documentation": False, "resources": [
        {"resource_type": 2, "resource_name": "orders", "configuration_keys": None},
        {"resource_type": 4, "resource_name": "0", "configuration_keys": None}]}
    out, made = drive(configs.describe_configs(conn(), 4, body),
                      lambda c: [c.api, 1, 0, None, {}, {}])
    assert [c.fields["topic"] for c in made] == [""]        # the defaults only
    assert [r["error_code"] for r in out["results"]] == [TOPIC_DENIED, CLUSTER_DENIED]
    out, made = drive(configs.incremental_alter_configs(conn(), 1, {
        "validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": "orders", "configs": [
                {"name": "retention.ms", "config_operation": 0, "value": "5"}]}]}))
    assert made == [] and out["responses"][0]["error_code"] == TOPIC_DENIED
    out, made = drive(configs.alter_configs(conn(), 2, {
        "validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": "orders", "configs": [
                {"name": "retention.ms", "value": "5"}]}]}))
    assert made == [] and out["responses"][0]["error_code"] == TOPIC_DENIED


def test_describe_log_dirs_needs_describe_on_the_cluster(acls, authz, metadata):
    out = _admin(metadata, authz).describe_log_dirs(conn(), 4, {"topics": None})
    assert (out["error_code"], out["results"]) == (CLUSTER_DENIED, [])


# --- groups -----------------------------------------------------------------------------------

class _Groups:
    """What the group families reach of the native group component before their checks."""

    coordinator = types.SimpleNamespace(groups={})


def test_membership_and_offsets_need_read_on_the_group(acls, authz, metadata):
    groups = GroupWireApis(_Groups(), metadata, authz)
    out = groups.join_group(conn(), 7, {"group_id": "billing", "member_id": "m",
                                        "group_instance_id": None, "protocol_type": "consumer",
                                        "protocols": [], "session_timeout_ms": 45000,
                                        "rebalance_timeout_ms": 1000, "reason": None})
    assert out["error_code"] == GROUP_DENIED
    assert groups.heartbeat(conn(), 4, {"group_id": "billing", "member_id": "m",
                                        "generation_id": 1,
                                        "group_instance_id": None})["error_code"] == GROUP_DENIED
    out = groups.consumer_group_heartbeat(conn(), 1, {"group_id": "billing"})
    assert out["error_code"] == GROUP_DENIED
    admin = GroupAdminApis(_Groups(), groups, metadata, authz)
    commit = {"group_id": "billing", "member_id": "m", "generation_id_or_member_epoch": 1,
              "topics": [{"name": "orders", "partitions": [
                  {"partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
                   "committed_metadata": None}]}]}
    out, made = drive(admin.offset_commit(conn(), 8, commit))
    assert made == [] and out["topics"][0]["partitions"][0]["error_code"] == GROUP_DENIED
    acls.append(allow(R.GROUP, "billing", Op.READ))
    out, made = drive(admin.offset_commit(conn(), 8, commit))
    assert made[0].fields["offsets"] == []            # Read on the group, not the topic
    assert out["topics"][0]["partitions"][0]["error_code"] == TOPIC_DENIED


def test_offset_fetch_shows_only_describable_topics(acls, authz, metadata):
    acls.extend([allow(R.GROUP, "billing", Op.DESCRIBE), allow(R.TOPIC, "orders", Op.READ)])
    admin = GroupAdminApis(_Groups(), GroupWireApis(_Groups(), metadata, authz), metadata,
                           authz)
    rows = [["orders", 0, 5, -1, "", 1, 0], ["payroll", 0, 7, -1, "", 1, 0]]
    out, _ = drive(admin.offset_fetch(conn(), 8, {"groups": [
        {"group_id": "billing", "topics": None}, {"group_id": "other", "topics": None}],
        "require_stable": False}), lambda c: [c.api, 1, 0, None, rows])
    billing, other = out["groups"]
    assert [t["name"] for t in billing["topics"]] == ["orders"]
    assert other["error_code"] == GROUP_DENIED


def test_group_listing_and_administration(acls, authz, metadata):
    acls.append(allow(R.GROUP, "billing", Op.DESCRIBE))
    admin = GroupAdminApis(_Groups(), GroupWireApis(_Groups(), metadata, authz), metadata,
                           authz)
    listed = [["billing", "Stable", "consumer"], ["secret", "Stable", "consumer"]]
    out, _ = drive(admin.list_groups(conn(), 4, {"states_filter": []}),
                   lambda c: [c.api, 1, 0, None, listed])
    assert [g["group_id"] for g in out["groups"]] == ["billing"]
    out, _ = drive(admin.list_groups(conn("User:admin"), 4, {"states_filter": []}),
                   lambda c: [c.api, 1, 0, None, listed])
    assert [g["group_id"] for g in out["groups"]] == ["billing", "secret"]
    out, made = drive(admin.describe_groups(conn(), 5, {"groups": ["secret"]}))
    assert made == [] and out["groups"][0]["error_code"] == GROUP_DENIED
    out, made = drive(admin.delete_groups(conn(), 2, {"groups_names": ["billing"]}))
    assert made == [] and out["results"][0]["error_code"] == GROUP_DENIED   # Delete, not Describe


# --- coordination and transactions ------------------------------------------------------------

def test_find_coordinator_and_init_producer_id(acls, authz, metadata):
    coordination = CoordinationApis(_admin(metadata, authz), authz)
    out = coordination.find_coordinator(conn(), 4, {"key_type": 0, "key": "",
                                                    "coordinator_keys": ["billing"]})
    assert out["coordinators"][0]["error_code"] == GROUP_DENIED
    out = coordination.find_coordinator(conn(), 3, {"key_type": 1, "key": "tx",
                                                    "coordinator_keys": []})
    assert out["error_code"] == TXN_DENIED
    body = {"transactional_id": None, "transaction_timeout_ms": 1000, "producer_id": -1,
            "producer_epoch": -1}
    out, made = drive(coordination.init_producer_id(conn(), 4, body))
    assert made == [] and out["error_code"] == CLUSTER_DENIED
    out, made = drive(coordination.init_producer_id(conn(), 4, {**body,
                                                                "transactional_id": "tx"}))
    assert made == [] and out["error_code"] == TXN_DENIED
    acls.append(allow(R.TOPIC, "orders", Op.WRITE))    # KIP-679: Write on a topic is enough
    out, made = drive(coordination.init_producer_id(conn(), 4, body),
                      lambda c: [c.api, 1, 0, None, 7, 0])
    assert out["error_code"] == 0 and out["producer_id"] == 7


def test_transaction_apis_need_write_on_the_transactional_id(acls, authz):
    txns = TransactionWireApis(_NoPartitions(), authz)
    add = {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": 1,
           "v3_and_below_producer_epoch": 0,
           "v3_and_below_topics": [{"name": "orders", "partitions": [0]}]}
    out, made = drive(txns.add_partitions_to_txn(conn(), 3, add))
    code = out["results_by_topic_v3_and_below"][0]["results_by_partition"][0]
    assert made == [] and code["partition_error_code"] == TXN_DENIED
    out, made = drive(txns.end_txn(conn(), 3, {"transactional_id": "tx", "producer_id": 1,
                                               "producer_epoch": 0, "committed": True}))
    assert made == [] and out["error_code"] == TXN_DENIED
    acls.append(allow(R.TRANSACTIONAL_ID, "tx", Op.WRITE))
    out, made = drive(txns.add_partitions_to_txn(conn(), 3, add))
    code = out["results_by_topic_v3_and_below"][0]["results_by_partition"][0]
    assert made == [] and code["partition_error_code"] == TOPIC_DENIED
    commit = {"transactional_id": "tx", "group_id": "billing", "producer_id": 1,
              "producer_epoch": 0, "generation_id": -1, "member_id": "",
              "group_instance_id": None, "topics": []}
    out, made = drive(txns.txn_offset_commit(conn(), 3, commit))
    assert made == []
    out, made = drive(txns.add_offsets_to_txn(conn(), 3, {
        "transactional_id": "tx", "producer_id": 1, "producer_epoch": 0,
        "group_id": "billing"}))
    assert made == [] and out["error_code"] == GROUP_DENIED
    out, made = drive(txns.describe_transactions(conn(), 0, {"transactional_ids": ["other"]}))
    assert made == [] and out["transaction_states"][0]["error_code"] == TXN_DENIED


# --- the ACL apis themselves, and the unauthenticated principal ------------------------------

def test_acl_apis_need_alter_or_describe_on_the_cluster(acls, authz):
    apis = AclWireApis(authz)
    create = {"creations": [{"resource_type": 2, "resource_name": "t",
                             "resource_pattern_type": 3, "principal": "User:alice",
                             "host": "*", "operation": 2, "permission_type": 3}]}
    out, made = drive(apis.create_acls(conn(), 3, create))
    assert made == [] and out["results"][0]["error_code"] == CLUSTER_DENIED
    describe = {"resource_type_filter": 1, "resource_name_filter": None,
                "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                "operation": 1, "permission_type": 1}
    out, made = drive(apis.describe_acls(conn(), 3, describe))
    assert made == [] and out["error_code"] == CLUSTER_DENIED
    out, made = drive(apis.delete_acls(conn(), 3, {"filters": [describe]}))
    assert made == [] and out["filter_results"][0]["error_code"] == CLUSTER_DENIED
    out, made = drive(apis.create_acls(conn("User:admin"), 3, create),
                      lambda c: [c.api, 1, 0, None, [[0, None]]])
    assert [c.api for c in made] == [Api.CREATE_ACLS] and out["results"][0]["error_code"] == 0
    acls.append(allow(R.CLUSTER, "kafka-cluster", Op.DESCRIBE))
    _, made = drive(apis.describe_acls(conn(), 3, describe),
                    lambda c: [c.api, 1, 0, None, []])
    assert [c.api for c in made] == [Api.DESCRIBE_ACLS]


def test_anonymous_clients_pass_unless_enforced(acls):
    data = DataApis(_NoPartitions(), leader_epoch=0, node_id=0,
                    authz=Authorizer(AclIndex))
    for c in (conn(None), conn("User:ANONYMOUS")):
        _, made = drive(data.produce(c, 9, _produce_body("orders")),
                        lambda c: [c.api, 1, 0, None, 5, -1, 0])
        assert [c.api for c in made] == [Api.PRODUCE]
    strict = DataApis(_NoPartitions(), leader_epoch=0, node_id=0,
                      authz=Authorizer(AclIndex, enforce_anonymous=True))
    out, made = drive(strict.produce(conn(None), 9, _produce_body("orders")))
    assert made == [] and \
        out["responses"][0]["partition_responses"][0]["error_code"] == TOPIC_DENIED
