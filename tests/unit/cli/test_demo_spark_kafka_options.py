"""``mq demo --spark --bootstrap-server``'s options, without a cluster: which go together, the
``--command-config`` file, ``--connector-jars`` globs, and what the clients and Spark get."""

from __future__ import annotations

import argparse

import pytest

from mq.cli.demo_spark_kafka import Cluster
from mq.spark.kafka_connector import EXCLUDES, PACKAGE


def args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"bootstrap_server": None, "command_config": None,
                                 "connector_jars": None, "socket": None, "data_dir": None,
                                 **given})


def test_without_a_bootstrap_server_it_is_the_local_broker():
    assert Cluster.from_args(args()) is None
    for option in ("command_config", "connector_jars"):
        with pytest.raises(ValueError, match="go with --bootstrap-server"):
            Cluster.from_args(args(**{option: "x"}))


@pytest.mark.parametrize("local", [{"socket": "/run/mq.sock"}, {"data_dir": "/var/mq"}])
def test_a_local_broker_and_a_cluster_together_are_refused(local):
    with pytest.raises(ValueError, match="give one of them"):
        Cluster.from_args(args(bootstrap_server="k1:9092", **local))


def test_the_cluster_for_the_clients_and_for_spark(tmp_path):
    props = tmp_path / "client.properties"
    props.write_text("# a secured cluster\nsecurity.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                     "sasl.username=alice\nsasl.password=pw\n")
    for jar in ("kafka-clients-3.9.2.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"):
        (tmp_path / jar).write_bytes(b"")
    cluster = Cluster.from_args(args(bootstrap_server=" k1:9092, k2:9092 ",
                                     command_config=str(props),
                                     connector_jars=f"{tmp_path}/*.jar"))
    assert cluster.clients == {"bootstrap_servers": "k1:9092,k2:9092", "kafka_config": {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "alice",
        "sasl.password": "pw"}}
    assert cluster.spark_conf() == {"spark.jars": f"{tmp_path}/kafka-clients-3.9.2.jar,"
                                                  f"{tmp_path}/spark-sql-kafka-0-10_2.13-4.2.0.jar"}
    assert cluster.options()["kafka.security.protocol"] == "SASL_SSL"
    assert 'username="alice"' in cluster.options()["kafka.sasl.jaas.config"]
    plain = Cluster.from_args(args(bootstrap_server="k1:9092"))
    assert plain.clients == {"bootstrap_servers": "k1:9092", "kafka_config": None}
    assert plain.spark_conf() == {"spark.jars.packages": PACKAGE,
                                  "spark.jars.excludes": ",".join(EXCLUDES)}
    assert plain.options() == {}


def test_bad_input_is_one_usage_error(tmp_path):
    with pytest.raises(ValueError, match="bootstrap_servers is empty"):
        Cluster.from_args(args(bootstrap_server=" , "))
    with pytest.raises(ValueError, match=r"--command-config .*missing.properties: No such file"):
        Cluster.from_args(args(bootstrap_server="k:9092",
                               command_config=str(tmp_path / "missing.properties")))
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol SSL\n")
    with pytest.raises(ValueError, match="bad.properties:1: not a key=value line"):
        Cluster.from_args(args(bootstrap_server="k:9092", command_config=str(bad)))
    with pytest.raises(ValueError, match=r"--connector-jars: no file matches .*/none-\*\.jar"):
        Cluster.from_args(args(bootstrap_server="k:9092", connector_jars=f"{tmp_path}/none-*.jar"))
    gssapi = tmp_path / "gssapi.properties"
    gssapi.write_text("sasl.username=alice\nsasl.password=pw\n")
    with pytest.raises(ValueError, match="got GSSAPI"):
        Cluster.from_args(args(bootstrap_server="k:9092", command_config=str(gssapi)))
