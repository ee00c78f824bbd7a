"""Where the client commands go (``mq.cli.common.client_options``): the local broker's
``--socket``, or a Kafka cluster's ``--bootstrap-server`` (also before a command group's
subcommand) with ``--command-config``, and ``$MQ_BOOTSTRAP_SERVERS`` when neither is given."""

from __future__ import annotations

import argparse

import pytest

from mq.cli.common import client_options, on_cluster
from mq.cli.main import UsageError, build_parser
from mq.client.kafka.config import ENV


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


def options(*argv: str) -> dict:
    return client_options(build_parser().parse_args(argv))


def test_socket_is_the_local_broker():
    assert options("topics", "list", "--socket", "/s") == {"socket": "/s"}
    assert options("topics", "--socket", "/s", "list") == {"socket": "/s"}
    assert options("offsets", "t") == {"socket": None}
    assert not on_cluster(options("offsets", "t"))


@pytest.mark.parametrize("argv", [
    ("topics", "list", "--bootstrap-server", "h1:9092, h2:9092"),
    ("topics", "--bootstrap-server", "h1:9092,h2:9092", "list"),
    ("groups", "describe", "g", "--bootstrap-server", "h1:9092,,h2:9092"),
    ("produce", "t", "--bootstrap-server", "h1:9092,h2:9092"),
    ("consume", "t", "--bootstrap-server", "h1:9092,h2:9092"),
    ("offsets", "t", "--bootstrap-server", "h1:9092,h2:9092"),
    ("top", "--bootstrap-server", "h1:9092,h2:9092"),
    ("transactions", "list", "--bootstrap-server", "h1:9092,h2:9092"),
    ("acls", "--bootstrap-server", "h1:9092,h2:9092", "list"),
    ("users", "list", "--bootstrap-server", "h1:9092,h2:9092"),
])
def test_bootstrap_server_on_every_client_command(argv):
    got = options(*argv)
    assert got == {"bootstrap_servers": "h1:9092,h2:9092", "kafka_config": None}
    assert on_cluster(got)


def test_the_environment_names_the_cluster_unless_a_socket_or_server_is_given(monkeypatch):
    monkeypatch.setenv(ENV, "env:9092")
    assert options("topics", "list") == {"bootstrap_servers": "env:9092", "kafka_config": None}
    assert options("topics", "list", "--socket", "/s") == {"socket": "/s"}
    assert options("topics", "list", "--bootstrap-server", "flag:9092")["bootstrap_servers"] \
        == "flag:9092"


def test_an_empty_environment_variable_is_none(monkeypatch):
    monkeypatch.setenv(ENV, "")
    assert options("topics", "list") == {"socket": None}


@pytest.mark.parametrize("argv, message", [
    (("topics", "list", "--socket", "/s", "--bootstrap-server", "h:1"), "not both"),
    (("topics", "--socket", "/s", "list", "--bootstrap-server", "h:1"), "not both"),
    (("topics", "list", "--bootstrap-server", " , "), "--bootstrap-server is empty"),
    (("topics", "list", "--command-config", "c.properties"),
     "--command-config is for a Kafka cluster"),
    (("topics", "list", "--socket", "/s", "--command-config", "c.properties"),
     "--command-config is for a Kafka cluster"),
])
def test_usage_errors(argv, message):
    with pytest.raises(ValueError, match=message):
        options(*argv)


def test_command_config_is_read_as_librdkafka_properties(tmp_path):
    props = tmp_path / "client.properties"
    props.write_text("# SASL\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanism: PLAIN\n"
                     "sasl.username = alice\n")
    got = options("topics", "--command-config", str(props), "list", "--bootstrap-server", "h:1")
    assert got["kafka_config"] == {"security.protocol": "SASL_PLAINTEXT",
                                   "sasl.mechanism": "PLAIN", "sasl.username": "alice"}


def test_a_bad_command_config_names_the_file_and_line(tmp_path):
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SSL\nnot a property\n")
    with pytest.raises(ValueError, match=r"client.properties:2: not a key=value line"):
        options("topics", "list", "--bootstrap-server", "h:1", "--command-config", str(props))
    with pytest.raises(FileNotFoundError):
        options("topics", "list", "--bootstrap-server", "h:1", "--command-config",
                str(tmp_path / "missing.properties"))


def test_workers_take_no_cluster_options():
    with pytest.raises(UsageError):
        build_parser().parse_args(["workers", "--bootstrap-server", "h:1", "stats"])


def _parser_of(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    return parser


@pytest.mark.parametrize("command", [
    ("topics",), ("topics", "create"), ("topics", "list"), ("topics", "describe"),
    ("topics", "alter"), ("topics", "delete"), ("produce",), ("consume",), ("offsets",),
    ("groups",), ("groups", "list"), ("groups", "describe"), ("groups", "delete"),
    ("groups", "reset-offsets"), ("transactions", "list"), ("transactions", "describe"),
    ("acls", "add"), ("acls", "list"), ("acls", "delete"), ("users", "add"),
    ("users", "delete"), ("users", "list"), ("top",),
])
def test_help_names_the_cluster_options(command):
    text = _parser_of(*command).format_help()
    assert "--bootstrap-server HOST:PORT" in text and "$MQ_BOOTSTRAP_SERVERS" in text
    assert "--command-config FILE" in text and "client.properties" in text
