"""Fixtures of the tests of Apache Kafka's own Java clients, CLI tools and Spark's Kafka
connector against mq's Kafka listener (``javakafka`` says how the jars are had).

``java_kafka`` (session) is the resolved classpath. ``security`` is the listener's protocol:
PLAINTEXT unless a test parametrizes it over ``javakafka.SECURITY``. On SASL_SSL, ``kafka_mq``
(the parent conftest's, through ``kafka_config``) has one SASL_SSL listener with a certificate
of a test CA (``tlscerts``), and the users of ``USERS``; none of them is a super user unless a
module overrides ``kafka_super_users``, so a user needs ACLs (``grant``), which are enforced.

``java_client(user)`` is a ``KafkaTarget``: ``kafka_mq``'s address with that user's client
properties (``javakafka.client_properties``: none on PLAINTEXT); ``kafka_java`` is alice's,
and ``kafka_client_props`` her properties, for Spark's connector.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from javakafka import (
    JavaKafka,
    JavaUnavailable,
    KafkaTarget,
    client_properties,
    write_properties,
)
from tlscerts import Pair, issue, make_ca

from mq.broker.acls import AclBinding, AclOperation, PatternType, Permission, ResourceType
from mq.client.admin import Admin

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture(scope="session")
def java_kafka() -> JavaKafka:
    try:
        return JavaKafka.load()
    except JavaUnavailable as err:
        pytest.fail(str(err))


@pytest.fixture
def security() -> str:
    return "PLAINTEXT"


@pytest.fixture
def kafka_super_users() -> list[str]:
    return []


@pytest.fixture
def test_ca(tmp_path) -> Pair:
    return make_ca(tmp_path / "certs", "test-ca")


@pytest.fixture
def kafka_config(kafka_config, security, kafka_super_users, test_ca, tmp_path) -> str:
    if security == "PLAINTEXT":
        return kafka_config
    server = issue(test_ca, tmp_path / "certs", "broker", {"CN": "localhost"}, server=True)
    return ('kafka_listeners = ["SASL_SSL://127.0.0.1:0"]\n'
            f'kafka_ssl_certfile = "{server.cert}"\n'
            f'kafka_ssl_keyfile = "{server.key}"\n'
            f"kafka_super_users = {json.dumps(kafka_super_users)}\n")


@pytest.fixture
def kafka_users(kafka_mq, security) -> dict[str, str]:
    """``USERS``, added over the Unix socket on a SASL listener."""
    if security != "PLAINTEXT":
        with Admin(kafka_mq.socket) as admin:
            for user, password in USERS.items():
                admin.add_user(user, password)
    return USERS


@pytest.fixture
def grant(kafka_mq) -> Callable:
    """``grant(user, (resource_type, name, operation), ..., pattern=LITERAL)``: ALLOW ACLs for
    ``User:user`` from any host (on PLAINTEXT, where clients are User:ANONYMOUS, they are
    inert)."""
    def allow(user: str, *acls: tuple[ResourceType, str, AclOperation],
              pattern: PatternType = PatternType.LITERAL) -> None:
        with Admin(kafka_mq.socket) as admin:
            admin.create_acls(AclBinding(rtype, name, pattern, f"User:{user}", "*", op,
                                         Permission.ALLOW).as_list() for rtype, name, op in acls)
    return allow


@pytest.fixture
def java_client(java_kafka, kafka_mq, security, kafka_users, test_ca,
                tmp_path) -> Callable[[str], KafkaTarget]:
    def target(user: str) -> KafkaTarget:
        props = client_properties(security, user, kafka_users[user], test_ca.cert)
        config = write_properties(tmp_path / f"{user}.properties", props)
        return KafkaTarget(java_kafka, kafka_mq.bootstrap, config)
    return target


@pytest.fixture
def kafka_java(java_client) -> KafkaTarget:
    return java_client("alice")


@pytest.fixture
def kafka_client_props(security, kafka_users, test_ca) -> dict[str, str]:
    return client_properties(security, "alice", kafka_users["alice"], test_ca.cert)
