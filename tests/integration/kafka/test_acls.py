"""ACLs through both doors: confluent-kafka's AdminClient (CreateAcls, DescribeAcls,
DeleteAcls with Kafka's filters) and ``mq acls add|list|delete`` over the Unix socket; both
see the same bindings, which survive a broker restart (records in the metadata log).

Denials of a real client need an authenticated principal (SASL or TLS, issue 21's other
parts); until those listeners exist the enforcement is tested per api family with a
connection that carries a principal (tests/unit/broker/kafka/test_kafka_acls.py)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation,
                                   AclPermissionType, AdminClient, ResourcePatternType,
                                   ResourceType)

import mq.testing
from tests.integration.cli_run import mq_run

TIMEOUT_S = 30.0
_CONFIG = 'kafka_listeners = ["127.0.0.1:0"]\n'


def _bootstrap(b) -> str:
    from mq.client.admin import Admin
    with Admin(b.socket) as admin:
        return admin.broker_stats()["broker"]["kafka_listeners"][0]


def _admin(b) -> AdminClient:
    return AdminClient({"bootstrap.servers": _bootstrap(b)})


def _done(futures) -> list:
    return [f.result(timeout=TIMEOUT_S) for f in
            (futures.values() if isinstance(futures, dict) else [futures])]


def _key(b) -> tuple:
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
            b.permission_type)


ORDERS_READ = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL,
                         "User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)
ETL_WRITE = AclBinding(ResourceType.TOPIC, "ord", ResourcePatternType.PREFIXED,
                       "User:etl", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
BOB_DENY = AclBinding(ResourceType.GROUP, "billing", ResourcePatternType.LITERAL,
                      "User:bob", "10.0.0.7", AclOperation.ALL, AclPermissionType.DENY)
ANY = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                       AclOperation.ANY, AclPermissionType.ANY)


def test_confluent_admin_creates_describes_and_deletes_acls(tmp_path):
    conf = tmp_path / "kafka.toml"
    conf.write_text(_CONFIG)
    with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as b:
        admin = _admin(b)
        _done(admin.create_acls([ORDERS_READ, ETL_WRITE, BOB_DENY]))
        (found,) = _done(admin.describe_acls(ANY))
        assert {_key(x) for x in found} == {_key(ORDERS_READ), _key(ETL_WRITE), _key(BOB_DENY)}
        # MATCH: the ACLs that apply to topic "orders" (the literal and the prefix "ord")
        match = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH,
                                 None, None, AclOperation.ANY, AclPermissionType.ANY)
        (found,) = _done(admin.describe_acls(match))
        assert {_key(x) for x in found} == {_key(ORDERS_READ), _key(ETL_WRITE)}
        # a binding Kafka refuses (a Cluster resource must be named kafka-cluster)
        bad = AclBinding(ResourceType.BROKER, "x", ResourcePatternType.LITERAL, "User:a", "*",
                         AclOperation.ALTER, AclPermissionType.ALLOW)
        with pytest.raises(KafkaException) as refused:
            admin.create_acls([bad])[bad].result(timeout=TIMEOUT_S)
        assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST, refused.value
        # DeleteAcls by principal; the others stay
        by_bob = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob",
                                  None, AclOperation.ANY, AclPermissionType.ANY)
        (deleted,) = _done(admin.delete_acls([by_bob]))
        assert [_key(x) for x in deleted] == [_key(BOB_DENY)]
        (found,) = _done(admin.describe_acls(ANY))
        assert {_key(x) for x in found} == {_key(ORDERS_READ), _key(ETL_WRITE)}

        # mq acls sees what the Kafka client made, and what it adds the client sees
        listed = mq_run("acls", "list", "--json", "--socket", b.socket)
        assert listed.code == 0, listed
        rows = [json.loads(line) for line in listed.out.splitlines()]
        assert {(r["name"], r["patternType"], r["principal"], r["operation"]) for r in rows} \
            == {("orders", "Literal", "User:alice", "Read"),
                ("ord", "Prefixed", "User:etl", "Write")}
        added = mq_run("acls", "add", "--allow-principal", "User:carol", "--operation", "Read",
                       "--operation", "describe", "--group", "billing", "--transactional-id",
                       "tx-1", "--socket", b.socket)
        assert added.code == 0 and added.out.count("User:carol") == 4, added
        (found,) = _done(admin.describe_acls(AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, "User:carol", None,
            AclOperation.ANY, AclPermissionType.ANY)))
        assert sorted((x.restype.name, x.name, x.operation.name) for x in found) == [
            ("GROUP", "billing", "DESCRIBE"), ("GROUP", "billing", "READ"),
            ("TRANSACTIONAL_ID", "tx-1", "DESCRIBE"), ("TRANSACTIONAL_ID", "tx-1", "READ")]


def test_mq_acls_round_trip_survives_a_restart_and_errors_are_one_line(tmp_path):
    conf = tmp_path / "kafka.toml"
    conf.write_text(_CONFIG)
    data = tmp_path / "data"
    with mq.testing.broker(data, config_file=str(conf)) as b:
        sock = b.socket
        r = mq_run("acls", "add", "--allow-principal", "User:etl", "--operation", "Write",
                   "--topic", "orders-", "--resource-pattern-type", "prefixed",
                   "--socket", sock)
        assert r.code == 0, r
        r = mq_run("acls", "add", "--deny-principal", "User:bob", "--deny-host", "10.0.0.7",
                   "--operation", "All", "--topic", "payroll", "--cluster", "--socket", sock)
        assert r.code == 0, r
        r = mq_run("acls", "list", "--topic", "orders-x", "--resource-pattern-type", "match",
                   "--socket", sock)
        assert r.code == 0 and r.out.splitlines()[0].split() == [
            "ResourceType", "Name", "PatternType", "Principal", "Host", "Operation",
            "Permission"], r
        assert r.out.splitlines()[1].split() == ["Topic", "orders-", "Prefixed", "User:etl",
                                                 "*", "Write", "Allow"], r
        for args, wanted in [
                (("add", "--allow-principal", "alice", "--operation", "Read", "--topic", "t"),
                 "must be of the form User:NAME"),
                (("add", "--allow-principal", "User:a", "--operation", "Reed", "--topic", "t"),
                 "unknown AclOperation 'Reed'"),
                (("add", "--allow-principal", "User:a", "--operation", "Read"),
                 "name a resource"),
                (("delete",), "name what to delete")]:
            r = mq_run("acls", *args, "--socket", sock)
            assert r.code == 2 and r.err.count("\n") == 1 and wanted in r.err, r
            assert "Traceback" not in r.err
    with mq.testing.broker(data, config_file=str(conf)) as b:
        r = mq_run("acls", "list", "--json", "--socket", b.socket)
        assert r.code == 0, r
        rows = sorted((d["resourceType"], d["name"], d["principal"], d["host"], d["operation"],
                       d["permission"]) for d in map(json.loads, r.out.splitlines()))
        assert rows == [("Cluster", "kafka-cluster", "User:bob", "10.0.0.7", "All", "Deny"),
                        ("Topic", "orders-", "User:etl", "*", "Write", "Allow"),
                        ("Topic", "payroll", "User:bob", "10.0.0.7", "All", "Deny")]
        r = mq_run("acls", "delete", "--principal", "User:bob", "--socket", b.socket)
        assert r.code == 0 and r.out.count("User:bob") == 2, r
        r = mq_run("acls", "list", "--json", "--socket", b.socket)
        assert [json.loads(line)["principal"] for line in r.out.splitlines()] == ["User:etl"]
    with mq.testing.broker(data, config_file=str(conf)) as b:      # the deletion stays
        r = mq_run("acls", "list", "--json", "--socket", b.socket)
        assert [json.loads(line)["principal"] for line in r.out.splitlines()] == ["User:etl"]
