"""``mq.spark.kafka_connector``, pure: librdkafka's properties as the Java client properties
of Spark's Kafka connector, and its pinned version."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mq.spark.kafka_connector import PACKAGE, VERSION, connector_options, java_properties

POM = Path(__file__).resolve().parents[2] / "java" / "spark" / "pom.xml"


def test_scram_over_tls_becomes_a_jaas_config_and_a_pem_trust_store():
    assert java_properties({
        "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-256",
        "sasl.username": "alice", "sasl.password": "alice-secret",
        "ssl.ca.location": "/etc/ca.pem"}) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                            'username="alice" password="alice-secret";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/etc/ca.pem"}


def test_plain_and_quotes_in_a_password_are_escaped():
    props = java_properties({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                             "sasl.username": "bob", "sasl.password": 'a"b\\c'})
    assert props["sasl.jaas.config"] == ("org.apache.kafka.common.security.plain.PlainLoginModule"
                                         ' required username="bob" password="a\\"b\\\\c";')
    assert "sasl.username" not in props and "sasl.password" not in props


def test_names_both_clients_share_pass_as_they_are_and_java_ones_win():
    config = {"client.id": "demo", "ssl.endpoint.identification.algorithm": "https",
              "ssl.ca.location": "/ca.pem", "ssl.truststore.location": "/other.pem"}
    assert java_properties(config) == {
        "client.id": "demo", "ssl.endpoint.identification.algorithm": "https",
        "ssl.truststore.location": "/other.pem", "ssl.truststore.type": "PEM"}
    assert config["ssl.ca.location"] == "/ca.pem"                # the input is left alone


def test_a_password_without_a_mechanism_the_connector_takes_is_an_error():
    with pytest.raises(ValueError, match="need sasl.mechanism PLAIN, SCRAM-SHA-256 or "
                                         "SCRAM-SHA-512 .* got GSSAPI"):
        java_properties({"sasl.username": "alice", "sasl.password": "x"})


def test_connector_options_are_kafka_dot_properties_without_the_servers():
    assert connector_options(None) == {}
    assert connector_options({"bootstrap.servers": "k:9092", "security.protocol": "SSL"}) == {
        "kafka.security.protocol": "SSL"}


def test_the_pinned_connector_is_the_one_the_tests_resolve():
    assert PACKAGE == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{VERSION}"
    pinned = re.search(r"<artifactId>spark-sql-kafka-0-10_2.13</artifactId>\s*"
                       r"<version>([^<]+)</version>", POM.read_text())
    assert pinned and pinned.group(1) == VERSION
