"""The Kafka listener over TLS (mq/broker/kafka/tls.py): real clients, mutual TLS, attacks.

Each test has its own broker with a plain listener and an ``SSL://`` one, its certificates
made by ``tlscerts`` under its ``tmp_path``; attacks are judged by what the attacker sees (a
closed connection), by the broker's log (one line naming the peer) and by another client
served meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import ssl
import subprocess
import sys
import time

import pytest
from confluent_kafka import KafkaException
from kafka import KafkaConsumer, KafkaProducer
from kclients import WAIT, consumer, produce, read_partitions
from tlscerts import Pair, issue, make_ca

import mq.testing
from mq.broker.kafka.tls import server_context
from mq.client.admin import Admin
from mq.errors import ConfigError
from mq.protocol.kafka.codec import encode_request

ALICE = {"C": "DE", "O": "acme", "OU": "eng", "CN": "alice"}
ALICE_PRINCIPAL = "User:CN=alice,OU=eng,O=acme,C=DE"


@dataclasses.dataclass(frozen=True)
class Tls:
    plain: str              # 127.0.0.1:PORT of the plain listener
    bootstrap: str          # 127.0.0.1:PORT of the SSL:// listener
    ca: Pair
    broker: mq.testing.BrokerProcess
    dir: object

    def ssl_conf(self, client: Pair | None = None) -> dict:
        conf = {"security.protocol": "ssl", "ssl.ca.location": self.ca.cert}
        if client is not None:
            conf |= {"ssl.certificate.location": client.cert, "ssl.key.location": client.key}
        return conf

    def log_lines(self, pattern: str) -> list[str]:
        return [line for line in self.broker.stderr().splitlines()
                if re.search(pattern, line, re.IGNORECASE)]


@contextlib.contextmanager
def tls_broker(tmp_path, *, client_ca: bool):
    ca = make_ca(tmp_path / "certs", "test-ca")
    server = issue(ca, tmp_path / "certs", "broker", {"CN": "localhost"}, server=True)
    conf = tmp_path / "kafka.toml"
    conf.write_text(
        'kafka_listeners = ["127.0.0.1:0", "SSL://127.0.0.1:0"]\n'
        f'kafka_ssl_certfile = "{server.cert}"\nkafka_ssl_keyfile = "{server.key}"\n'
        + (f'kafka_ssl_cafile = "{ca.cert}"\n'
           # alice may do anything; any other certificate's subject needs ACLs
           f'kafka_super_users = ["{ALICE_PRINCIPAL.removeprefix("User:")}"]\n'
           if client_ca else ""))
    with mq.testing.broker(tmp_path / "data", config_file=str(conf), log_level="INFO") as b:
        with Admin(b.socket) as admin:
            plain, secure = admin.broker_stats()["broker"]["kafka_listeners"]
        assert secure.startswith("SSL://"), secure        # its protocol shown, not PLAINTEXT's
        secure = secure.removeprefix("SSL://")
        yield Tls(plain, secure, ca, b, tmp_path / "certs")


@pytest.fixture
def tls(tmp_path):
    with tls_broker(tmp_path, client_ca=False) as t:
        yield t


@pytest.fixture
def mtls(tmp_path):
    with tls_broker(tmp_path, client_ca=True) as t:
        yield t


def _records(n: int, size: int = 100) -> list[dict]:
    return [{"key": b"k%d" % i, "value": bytes([i % 251]) * size, "headers": [("n", b"%d" % i)],
             "timestamp": 1_000 + i} for i in range(n)]


def _seen(msgs) -> list:
    return [(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in msgs]


# --- clients ---------------------------------------------------------------------------------
def test_confluent_produces_and_consumes_over_tls(tls):
    records = _records(300, 10_000)          # 3 MB: Fetch regions above 256 KiB, copied in parts
    produce(tls.bootstrap, "t", records, tls.ssl_conf())
    got = read_partitions(tls.bootstrap, "t", 300, conf=tls.ssl_conf())
    assert [(m.key(), m.value(), m.headers()) for m in got] == \
        [(r["key"], r["value"], r["headers"]) for r in records]
    assert tls.log_lines(r"Kafka connection from 127\.0\.0\.1:\d+: TLSv1\.3, "
                         r"principal User:ANONYMOUS")
    _assert_still_serves(tls)   # its client drops a connection mid-handshake: no log line
    assert not tls.log_lines("closing Kafka connection")


def test_kafka_python_over_tls(tls):
    producer = KafkaProducer(bootstrap_servers=tls.bootstrap, security_protocol="SSL",
                             ssl_cafile=tls.ca.cert)
    try:
        for i in range(20):
            producer.send("kp", value=b"v%d" % i, key=b"k%d" % i, partition=0).get(WAIT)
    finally:
        producer.close()
    c = KafkaConsumer(bootstrap_servers=tls.bootstrap, security_protocol="SSL",
                      ssl_cafile=tls.ca.cert, enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        from kafka import TopicPartition as KTP
        c.assign([KTP("kp", 0)])
        c.seek_to_beginning()
        got: list = []
        deadline = time.monotonic() + WAIT
        while len(got) < 20 and time.monotonic() < deadline:
            for batch in c.poll(200).values():
                got += batch
    finally:
        c.close()
    assert [(r.offset, r.key, r.value) for r in got] == \
        [(i, b"k%d" % i, b"v%d" % i) for i in range(20)]


def test_kcat_over_tls(tls):
    def kcat(*args, data=None):
        return subprocess.run(["kcat", "-b", tls.bootstrap, "-m", "10",
                               "-X", "security.protocol=ssl",
                               "-X", f"ssl.ca.location={tls.ca.cert}", *args],
                              input=data, capture_output=True, timeout=WAIT, check=True)
    kcat("-P", "-t", "kc", "-p", "0", data=b"one\ntwo\nthree\n")
    out = kcat("-C", "-t", "kc", "-p", "0", "-o", "beginning", "-e", "-q")
    assert out.stdout.splitlines() == [b"one", b"two", b"three"]


def test_mutual_tls_sets_the_principal_from_the_subject(mtls):
    alice = issue(mtls.ca, mtls.dir, "alice", ALICE)
    produce(mtls.bootstrap, "m", _records(5), mtls.ssl_conf(alice))
    assert _seen(read_partitions(mtls.bootstrap, "m", 5, conf=mtls.ssl_conf(alice))) == \
        _seen(read_partitions(mtls.plain, "m", 5))
    assert mtls.log_lines(rf"Kafka connection from 127\.0\.0\.1:\d+: TLSv1\.\d, "
                          rf"principal {re.escape(ALICE_PRINCIPAL)}$")


def test_a_certificate_subject_without_acls_is_refused_the_topic(mtls):
    """An authenticated principal gets nothing without a matching ACL (Kafka's default): the
    ACL check sees the subject of the client certificate."""
    bob = issue(mtls.ca, mtls.dir, "bob", {"CN": "bob"})
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED|Topic authorization"):
        produce(mtls.bootstrap, "bobs", _records(1), {**mtls.ssl_conf(bob),
                                                      "message.timeout.ms": 5000})


def test_fetched_records_are_byte_identical_over_tls_and_plaintext(tls):
    produce(tls.plain, "same", _records(200, 3_000))        # 600 kB: regions copied in parts
    fetch = encode_request(1, 4, 7, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 64 << 20,
        "isolation_level": 0, "topics": [{"topic": "same", "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 64 << 20}]}]})
    with _raw(tls.plain) as plain, _raw(tls.bootstrap, _client_context(tls.ca)) as secure:
        plain.sendall(fetch)
        secure.sendall(fetch)
        over_plain, over_tls = _response(plain), _response(secure)
    assert len(over_plain) > 600_000
    assert over_tls == over_plain


# --- refusals and attacks --------------------------------------------------------------------
def test_a_client_certificate_of_another_ca_is_refused(mtls):
    other = make_ca(mtls.dir / "other", "other-ca")
    mallory = issue(other, mtls.dir / "other", "mallory", {"CN": "mallory"})
    _assert_refused(mtls, _client_context(mtls.ca, mallory),
                    r"CERTIFICATE_VERIFY_FAILED \(unable to get local issuer")


def test_an_expired_client_certificate_is_refused(mtls):
    old = issue(mtls.ca, mtls.dir, "old", {"CN": "old"}, expired=True)
    _assert_refused(mtls, _client_context(mtls.ca, old),
                    r"CERTIFICATE_VERIFY_FAILED \(certificate has expired")


def test_no_client_certificate_is_refused_when_a_ca_is_set(mtls):
    _assert_refused(mtls, _client_context(mtls.ca), "certificate")


def test_garbage_instead_of_a_client_hello_is_closed(tls):
    with _raw(tls.bootstrap) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
        assert _closed(sock)
    _assert_logged_once(tls, r"TLS handshake failed")
    _assert_still_serves(tls)


def test_a_client_leaving_mid_handshake_is_no_attack(tls):
    for first in (b"", bytes.fromhex("160301020001")):     # nothing, a ClientHello's start
        with _raw(tls.bootstrap) as sock:
            sock.sendall(first)
    _assert_still_serves(tls)       # after the two closes, in the broker's loop order
    assert not tls.log_lines("closing Kafka connection")


def test_a_handshake_that_never_finishes_is_closed_while_others_are_served(tls):
    with _raw(tls.bootstrap) as stalled, _raw(tls.bootstrap) as half:
        # ``half`` sends the first bytes of a ClientHello, ``stalled`` nothing at all.
        half.sendall(bytes.fromhex("160301020001"))
        _assert_still_serves(tls)
        stalled.settimeout(WAIT)
        half.settimeout(WAIT)
        assert _closed(stalled) and _closed(half)
    lines = tls.log_lines(r"no TLS handshake within 10 s")
    assert len(lines) == 2, lines


def test_renegotiation_is_refused(tls):
    # TLS 1.3 has none: the attempt needs TLS 1.2, where s_client's "R" line starts one
    # (its commands are read while standard input stays open).
    proc = subprocess.Popen(["openssl", "s_client", "-tls1_2", "-connect", tls.bootstrap,
                             "-CAfile", tls.ca.cert], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        mq.testing.wait_for(lambda: tls.log_lines(r"TLSv1\.2, principal"), WAIT, 0.05,
                            "the TLS 1.2 session")
        proc.stdin.write(b"R\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=WAIT)     # the broker closes the connection
    finally:
        proc.kill()
        proc.wait()
    assert b"RENEGOTIATING" in out and b"no renegotiation" in out, out[-2000:]
    _assert_logged_once(tls, r"TLS: ")
    _assert_still_serves(tls)


def test_a_bad_key_or_missing_file_stops_the_broker_with_one_line(tmp_path):
    ca = make_ca(tmp_path, "ca")
    one = issue(ca, tmp_path, "one", {"CN": "one"}, server=True)
    two = issue(ca, tmp_path, "two", {"CN": "two"}, server=True)
    cases = [(one.cert, two.key, "does not match"), (one.cert, str(tmp_path / "nope.key"),
                                                      "cannot read it"),
             ("", one.key, "needs kafka_ssl_certfile")]
    for certfile, keyfile, message in cases:
        with pytest.raises(ConfigError, match=message):
            server_context(certfile, keyfile)
        conf = tmp_path / "bad.toml"
        conf.write_text(f'kafka_listeners = ["SSL://127.0.0.1:0"]\n'
                        f'kafka_ssl_certfile = "{certfile}"\nkafka_ssl_keyfile = "{keyfile}"\n')
        done = subprocess.run([sys.executable, "-m", "mq.broker", "--config", str(conf),
                               "--data-dir", str(tmp_path / "data")],
                              check=False, capture_output=True, text=True, timeout=WAIT)
        assert done.returncode == 1
        assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr


# --- helpers ---------------------------------------------------------------------------------
def _client_context(ca: Pair, client: Pair | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca.cert)
    if client is not None:
        ctx.load_cert_chain(client.cert, client.key)
    return ctx


@contextlib.contextmanager
def _raw(address: str, context: ssl.SSLContext | None = None):
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=WAIT)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname=host)
    with sock:
        yield sock


def _response(sock) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(1 << 20)
        assert chunk, "the broker closed the connection"
        data += chunk
    return data


def _closed(sock) -> bool:
    """True once the broker closed ``sock`` (EOF, a reset, or a TLS alert)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, ssl.SSLError):
        return True


def _assert_refused(t: Tls, context: ssl.SSLContext, reason: str) -> None:
    api_versions = encode_request(18, 0, 1, {})
    # TLS 1.3 finishes the client's side of the handshake before the broker checks the
    # client's certificate: the refusal arrives on the first read.
    with pytest.raises((ssl.SSLError, ConnectionResetError, AssertionError)), \
            _raw(t.bootstrap, context) as sock:
        sock.sendall(api_versions)
        _response(sock)
    _assert_logged_once(t, rf"TLS handshake failed: .*({reason})")
    _assert_still_serves(t)


def _assert_logged_once(t: Tls, pattern: str) -> None:
    mq.testing.wait_for(lambda: t.log_lines(pattern), WAIT, 0.05, f"a log line {pattern!r}")
    lines = t.log_lines(r"closing Kafka connection from 127\.0\.0\.1:\d+: .*" + pattern)
    assert len(lines) == 1, lines


def _assert_still_serves(t: Tls) -> None:
    c = consumer(t.bootstrap, conf=t.ssl_conf(_any_client(t)))
    try:
        meta = c.list_topics(timeout=WAIT)
        assert meta.brokers
    finally:
        c.close()


def _any_client(t: Tls) -> Pair:
    """A good client certificate (sent only when the broker asks for one)."""
    path = t.dir / "good.pem"
    if not path.exists():
        return issue(t.ca, t.dir, "good", {"CN": "good"})
    return Pair(str(path), str(t.dir / "good.key"))
