"""Kafka listener specs with a protocol, the non-loopback refusal rule, the SASL config keys,
the failure delays and the SCRAM credential rules (KIP-554) over a real metadata log."""

from __future__ import annotations

import pytest

from mq.broker.apis.users import UserApis
from mq.broker.config import BrokerConfig, ConfigError
from mq.broker.kafka.addresses import Listener, check_listener, display, parse_listener
from mq.broker.kafka.sasl_wire import FailureDelays
from mq.broker.metadata import MetadataStore
from mq.log.log import PartitionLog
from mq.protocol.kafka.sasl import salted_password


def test_listener_spec_parser():
    assert parse_listener("127.0.0.1:9092") == Listener("PLAINTEXT", "127.0.0.1", 9092)
    assert parse_listener("SASL_PLAINTEXT://[::1]:0") == Listener("SASL_PLAINTEXT", "::1", 0)
    assert parse_listener("sasl_ssl://h:1").protocol == "SASL_SSL"
    assert parse_listener("SSL://h:1").tls and not parse_listener("SSL://h:1").sasl
    for bad, why in (("TLS://127.0.0.1:1", "must be one of"), ("SASL_PLAINTEXT://:1", "host"),
                     ("PLAINTEXT://127.0.0.1", "HOST:PORT"), (9092, "string")):
        with pytest.raises(ValueError, match=why):
            parse_listener(bad)
    assert display(parse_listener("127.0.0.1:1"), "127.0.0.1:5") == "127.0.0.1:5"
    assert display(parse_listener("SASL_PLAINTEXT://127.0.0.1:1"), "127.0.0.1:5") == \
        "SASL_PLAINTEXT://127.0.0.1:5"


@pytest.mark.parametrize("spec", ["0.0.0.0:9092", "PLAINTEXT://0.0.0.0:9092", "SSL://[::]:1"])
def test_a_listener_that_does_not_authenticate_binds_loopback_only(spec):
    with pytest.raises(ValueError, match="not a loopback address .* kafka_allow_anonymous"):
        check_listener(spec)
    assert check_listener(spec, allow_anonymous=True).port in (1, 9092)
    with pytest.raises(ConfigError, match="^--kafka-listener: Kafka listener"):
        BrokerConfig.load(None, socket="/tmp/s", kafka_listeners=[spec])
    assert BrokerConfig.from_mapping({"kafka_listeners": [spec], "kafka_allow_anonymous": True}
                                     ).kafka_listeners == (spec,)


@pytest.mark.parametrize("spec", ["SASL_PLAINTEXT://0.0.0.0:0", "SASL_SSL://0.0.0.0:0"])
def test_an_authenticating_listener_may_bind_any_address(spec):
    assert check_listener(spec).host == "0.0.0.0"
    assert BrokerConfig.from_mapping({"kafka_listeners": [spec]}).kafka_listeners == (spec,)
    assert check_listener("SSL://0.0.0.0:0", client_certificates=True).protocol == "SSL"


def test_sasl_config_keys():
    config = BrokerConfig.from_mapping({})
    assert config.kafka_sasl_mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    assert not config.kafka_allow_anonymous
    assert BrokerConfig.from_mapping({"kafka_sasl_mechanisms": ["PLAIN", "PLAIN"]}
                                     ).kafka_sasl_mechanisms == ("PLAIN",)
    for bad in ([], ["GSSAPI"], "PLAIN"):
        with pytest.raises(ConfigError, match="kafka_sasl_mechanisms"):
            BrokerConfig.from_mapping({"kafka_sasl_mechanisms": bad})
    with pytest.raises(ConfigError, match="true or false"):
        BrokerConfig.from_mapping({"kafka_allow_anonymous": "yes"})


def test_failure_delays_double_per_host_and_are_forgotten():
    delays = FailureDelays(first_s=0.1, max_s=1.0, forget_s=60, max_hosts=2)
    assert [delays.failed("h", t) for t in range(5)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert delays.failed("other", 5) == 0.1
    assert delays.failed("h", 100) == 0.1              # 60 s without a failure
    delays.failed("x", 101)                            # a third host: the oldest is dropped
    assert delays.failed("other", 102) == 0.1


def _users(tmp_path) -> tuple[UserApis, PartitionLog]:
    plog = PartitionLog.open(str(tmp_path / "__cluster_metadata-0"))
    return UserApis(MetadataStore(plog)), plog


def _upsert(user, mechanism="SCRAM-SHA-256", iterations=4096, password="pw"):
    salt = b"salt" * 4
    return [user, mechanism, iterations, salt,
            salted_password(mechanism, password, salt, iterations)
            if mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512") else b"x" * 32]


def test_scram_credentials_rules_and_replay(tmp_path):
    users, plog = _users(tmp_path)
    assert users.alter([], [_upsert("alice"), _upsert("alice", "SCRAM-SHA-512"),
                            _upsert("bob", iterations=100), _upsert("", "SCRAM-SHA-256"),
                            _upsert("carol", "SCRAM-SHA-1"), _upsert("dave"),
                            _upsert("dave")]) == [
        ["alice", 0, None],
        ["bob", 93, "SCRAM iterations must be from 4096 to 16384, got 100"],
        ["", 93, "Username must be 1 to 255 characters"],
        ["carol", 33, "Unknown SCRAM mechanism 'SCRAM-SHA-1'"],
        ["dave", 92, "A user credential cannot be altered twice in the same request"]]
    assert users.describe(None) == [["alice", 0, None, [["SCRAM-SHA-256", 4096],
                                                        ["SCRAM-SHA-512", 4096]]]]
    assert users.describe(["alice", "bob", "alice"])[1][:2] == ["bob", 91]
    assert users.describe(["alice", "alice"])[0][1] == 92
    assert users.alter([["alice", "SCRAM-SHA-256"], ["bob", "SCRAM-SHA-256"]], []) == [
        ["alice", 0, None],
        ["bob", 91, "Attempt to delete a user credential that does not exist"]]
    plog.close()
    users, plog = _users(tmp_path)                     # replayed from the log
    assert users.describe(None) == [["alice", 0, None, [["SCRAM-SHA-512", 4096]]]]
    cred = users.credential("alice", "SCRAM-SHA-512")
    assert cred is not None and b"pw" not in cred.stored_key + cred.server_key
    plog.close()
