"""The pure parts of the Kafka listener's TLS (mq/broker/kafka/tls.py), and a connection's
writes through a TLS session: Fetch regions copied, never sent with ``sendfile``."""

from __future__ import annotations

import collections
import os
import socket

import pytest

from mq.broker.config import BrokerConfig
from mq.broker.kafka import tls
from mq.broker.kafka.configs import describe_broker
from mq.broker.kafka.conn import KafkaConn
from mq.errors import ConfigError
from mq.log.config import LogConfig
from mq.protocol.kafka.codec import FileRegion


def test_principal_is_the_subject_most_specific_first_as_kafka_writes_it():
    subject = ((("countryName", "DE"),), (("organizationName", "acme"),),
               (("organizationalUnitName", "eng"),), (("commonName", "alice"),))
    assert tls.principal({"subject": subject}) == "User:CN=alice,OU=eng,O=acme,C=DE"
    assert tls.principal(None) == tls.principal({}) == "User:ANONYMOUS"
    email = ((("commonName", "bob"),), (("emailAddress", "b@x.io"),))
    assert tls.principal({"subject": email}) == \
        "User:1.2.840.113549.1.9.1=#16066240782e696f,CN=bob"


def test_principal_escapes_as_rfc_2253_says():
    subject = ((("organizationName", "Acme, Inc."),),
               (("commonName", " #bob+1 "), ("userId", 'a"b;c<d>=')),)
    assert tls.principal({"subject": subject}) == \
        'User:CN=\\ \\#bob\\+1\\ +UID=a\\"b\\;c\\<d\\>\\=,O=Acme\\, Inc.'


def _region(tmp_path, data: bytes, offset: int = 0) -> FileRegion:
    path = tmp_path / "seg.log"
    path.write_bytes(data)
    return FileRegion(os.open(path, os.O_RDONLY), offset, len(data) - offset)


def test_copy_head_region_reads_copy_bytes_at_a_time_and_closes_at_the_end(tmp_path):
    data = os.urandom(tls.COPY_BYTES * 2 + 100)
    region = _region(tmp_path, data, 50)
    parts = collections.deque([region, b"next"])
    assert not tls.copy_head_region(parts)
    assert bytes(parts[0]) == data[50:50 + tls.COPY_BYTES]
    assert parts[1] == FileRegion(region.fd, 50 + tls.COPY_BYTES, len(data) - 50 - tls.COPY_BYTES)
    parts.popleft()
    assert not tls.copy_head_region(parts)
    parts.popleft()
    assert tls.copy_head_region(parts)
    assert bytes(parts[0]) == data[50 + 2 * tls.COPY_BYTES:] and parts[1] == b"next"
    with pytest.raises(OSError):
        os.fstat(region.fd)                  # closed once read in full


def test_copy_head_region_raises_when_the_file_ends_early(tmp_path):
    region = _region(tmp_path, b"x" * 10)
    parts = collections.deque([FileRegion(region.fd, 10, 5)])
    with pytest.raises(OSError, match="ended 5 bytes early"):
        tls.copy_head_region(parts)
    os.close(region.fd)


class _Session:
    """A TLS session that takes at most ``limit`` bytes a call (a full socket buffer)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent = bytearray()

    def send(self, data) -> int:
        n = min(self.limit, len(data))
        if n == 0:
            raise BlockingIOError
        self.sent += bytes(data[:n])
        return n


def test_a_tls_connection_copies_regions_through_its_session(tmp_path, monkeypatch):
    data = os.urandom(tls.COPY_BYTES + 12_345)
    a, b = socket.socketpair()
    with a, b:
        monkeypatch.setattr(os, "sendfile", _no_sendfile)
        conn = KafkaConn(a, 1, 1 << 20, "127.0.0.1:1")
        conn.tls = _Session(70_000)
        conn.parts.extend([b"head", _region(tmp_path, data), b"tail"])
        conn.regions = 1
        conn.pending_out = 8 + len(data)
        conn.send_some()
        assert bytes(conn.tls.sent) == b"head" + data + b"tail"
        assert conn.regions == 0 and conn.pending_out == 0


def _no_sendfile(*args):
    raise AssertionError("sendfile on a TLS connection")


def test_describe_configs_names_an_ssl_listener_as_kafka_does():
    config = BrokerConfig(kafka_listeners=("127.0.0.1:9092", "SSL://[::1]:9093"))
    defaults = LogConfig().to_properties()
    entries = {e["name"]: e for e in describe_broker(config, defaults, ("127.0.0.1", 9092))}
    assert entries["listeners"]["value"] == "PLAINTEXT://127.0.0.1:9092,SSL://[::1]:9093"


def test_the_config_takes_ssl_listeners_and_the_tls_files(tmp_path):
    conf = tmp_path / "mq.toml"
    conf.write_text('kafka_listeners = ["SSL://127.0.0.1:0"]\nkafka_ssl_certfile = "b.pem"\n'
                    'kafka_ssl_keyfile = "b.key"\nkafka_ssl_cafile = ""\n')
    config = BrokerConfig.load(str(conf), data_dir=str(tmp_path))
    assert config.kafka_listeners == ("SSL://127.0.0.1:0",)
    assert config.kafka_ssl_certfile == os.path.abspath("b.pem") and config.kafka_ssl_cafile == ""
    conf.write_text('kafka_listeners = ["HTTP://127.0.0.1:0"]\n')
    with pytest.raises(ConfigError, match="the protocol must be one of PLAINTEXT, "
                                          "SASL_PLAINTEXT, SSL, SASL_SSL, got 'HTTP'"):
        BrokerConfig.load(str(conf), data_dir=str(tmp_path))
    conf.write_text('kafka_ssl_keyfile = 1\n')
    with pytest.raises(ConfigError, match="kafka_ssl_keyfile must be a path"):
        BrokerConfig.load(str(conf), data_dir=str(tmp_path))
