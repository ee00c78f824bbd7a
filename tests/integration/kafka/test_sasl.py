"""SASL on the Kafka listener against real clients: confluent-kafka (librdkafka), kafka-python,
aiokafka and kcat over SASL_PLAINTEXT with SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN; wrong
passwords, skipped authentication and truncated exchanges; ``mq users`` and KIP-554's admin
apis; and the refusal of a non-loopback listener that does not authenticate.

Each test starts its own broker (``sasl_mq``) with a SASL_PLAINTEXT listener on a free
loopback port, all three mechanisms enabled, and user ``alice`` (password ``alice-secret``)
added with ``mq users add`` (password on standard input); alice, bob and dave are
``kafka_super_users`` (ACLs are another test file's subject).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import subprocess
import sys

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kclients import LOGGER, WAIT, produce, read_partitions, values

import mq.testing
from mq.client.admin import Admin

PASSWORD = "alice-secret"
_CONFIG = ('kafka_listeners = ["SASL_PLAINTEXT://127.0.0.1:0"]\n'
           'kafka_sasl_mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]\n'
           # ACLs deny an authenticated user without one: these tests' users are super users
           'kafka_super_users = ["alice", "bob", "dave"]\n')
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


class SaslBroker:
    def __init__(self, proc) -> None:
        self.proc = proc
        self.socket = proc.socket
        with Admin(proc.socket) as a:
            [listener] = a.broker_stats()["broker"]["kafka_listeners"]
        assert listener.startswith("SASL_PLAINTEXT://127.0.0.1:"), listener
        self.bootstrap = listener.removeprefix("SASL_PLAINTEXT://")

    def users(self, *args: str, password: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mq", "users", *args, "--socket",
                               self.socket], input=password and password + "\n",
                              capture_output=True, text=True, env=ENV, timeout=60,
                              check=False)

    def conf(self, mechanism: str, user: str = "alice", password: str = PASSWORD) -> dict:
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
                "sasl.username": user, "sasl.password": password}


@pytest.fixture
def sasl_mq(tmp_path):
    conf = tmp_path / "sasl.toml"
    conf.write_text(_CONFIG)
    with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as proc:
        broker = SaslBroker(proc)
        done = broker.users("add", "alice", password=PASSWORD)
        assert done.returncode == 0, done.stderr
        yield broker


def _round_trip(broker: SaslBroker, conf: dict, topic: str) -> None:
    produce(broker.bootstrap, topic, [{"value": b"v%d" % i} for i in range(5)], conf)
    got = read_partitions(broker.bootstrap, topic, 5, conf=conf)
    assert values(got) == [b"v%d" % i for i in range(5)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_confluent_producer_and_consumer(sasl_mq, mechanism):
    _round_trip(sasl_mq, sasl_mq.conf(mechanism), "t-" + mechanism.lower())


def _auth_error(broker: SaslBroker, conf: dict) -> str:
    """The error librdkafka reports for ``conf``: an authentication failure expected."""
    errors: list = []
    a = AdminClient({"bootstrap.servers": broker.bootstrap, **conf, **LOGGER,
                     "error_cb": errors.append})
    with pytest.raises(KafkaException) as info:
        a.list_topics(timeout=2)      # refused at once; librdkafka retries to the end
    mq.testing.wait_for(lambda: a.poll(0.1) is not None and errors, WAIT, 0,
                        "librdkafka's error callback")
    return " ".join(str(e) for e in errors) + str(info.value)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_a_wrong_password_fails_with_an_authentication_error(sasl_mq, mechanism):
    text = _auth_error(sasl_mq, sasl_mq.conf(mechanism, password="guess"))
    assert "Authentication failed" in text or "AUTHENTICATION" in text, text
    text = _auth_error(sasl_mq, sasl_mq.conf(mechanism, user="nobody"))
    assert "Authentication failed" in text or "AUTHENTICATION" in text, text


def test_kafka_python_plain_and_scram(sasl_mq):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}
        topic = "kp-" + mechanism.lower()
        producer = KafkaProducer(bootstrap_servers=sasl_mq.bootstrap, **sasl)
        try:
            for i in range(3):
                producer.send(topic, b"v%d" % i).get(timeout=WAIT)
        finally:
            producer.close(timeout=WAIT)
        consumer = KafkaConsumer(bootstrap_servers=sasl_mq.bootstrap, fetch_max_wait_ms=100,
                                 enable_auto_commit=False, **sasl)
        try:
            consumer.assign([TopicPartition(topic, 0)])
            consumer.seek_to_beginning()
            got: list = []
            mq.testing.wait_for(lambda: got.extend(
                r.value for rs in consumer.poll(timeout_ms=200).values() for r in rs)
                or len(got) >= 3, WAIT, 0, "kafka-python's records")
        finally:
            consumer.close()
        assert got == [b"v0", b"v1", b"v2"]


def test_aiokafka_plain_and_scram(sasl_mq):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def run(mechanism: str) -> list:
        sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}
        topic = "ak-" + mechanism.lower()
        producer = AIOKafkaProducer(bootstrap_servers=sasl_mq.bootstrap, **sasl)
        await producer.start()
        try:
            for i in range(3):
                await producer.send_and_wait(topic, b"v%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=sasl_mq.bootstrap, **sasl,
                                    fetch_max_wait_ms=100, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            await consumer.seek_to_beginning()
            got: list = []
            while len(got) < 3:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=200), WAIT)
                got += [r.value for rs in batch.values() for r in rs]
            return got
        finally:
            await consumer.stop()

    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        assert asyncio.run(run(mechanism)) == [b"v0", b"v1", b"v2"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_kcat(sasl_mq, mechanism):
    kcat = shutil.which("kcat")
    assert kcat, "kcat is not installed (`apt-get install -y kcat`; .ci/run does it)"
    base = [kcat, "-b", sasl_mq.bootstrap, "-m", "10", "-X", "security.protocol=SASL_PLAINTEXT",
            "-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=alice"]
    good = [*base, "-X", f"sasl.password={PASSWORD}"]
    done = subprocess.run([*good, "-P", "-t", "kc"], input=b"one\ntwo\n", capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([*good, "-C", "-t", "kc", "-o", "beginning", "-c", "2", "-e"],
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout.split() == [b"one", b"two"], done.stderr
    done = subprocess.run([*base, "-X", "sasl.password=guess", "-L"], capture_output=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and b"uthentication" in done.stderr, done.stderr


def test_mq_users_round_trip_and_a_deleted_user_cannot_authenticate(sasl_mq):
    done = sasl_mq.users("add", "bob", password="bob-pw")
    assert done.returncode == 0 and done.stdout == "", done.stderr
    listed = sasl_mq.users("list").stdout.split()
    assert listed[:2] == ["User", "Mechanisms"] and "bob" in listed and "alice" in listed
    assert "SCRAM-SHA-256:4096,SCRAM-SHA-512:4096" in listed
    _round_trip(sasl_mq, sasl_mq.conf("SCRAM-SHA-512", "bob", "bob-pw"), "bobs")
    done = sasl_mq.users("delete", "bob")
    assert done.returncode == 0, done.stderr
    assert "bob" not in sasl_mq.users("list").stdout.split()
    for mechanism in ("SCRAM-SHA-256", "PLAIN"):
        text = _auth_error(sasl_mq, sasl_mq.conf(mechanism, "bob", "bob-pw"))
        assert "Authentication failed" in text or "AUTHENTICATION" in text, text
    gone = sasl_mq.users("delete", "bob")
    assert gone.returncode == 1 and len(gone.stderr.splitlines()) == 1, gone.stderr
    empty = sasl_mq.users("add", "carol", password="")
    assert empty.returncode == 2 and "password" in empty.stderr


def test_alter_user_scram_credentials_through_confluent_admin(sasl_mq):
    client = AdminClient({"bootstrap.servers": sasl_mq.bootstrap, **LOGGER,
                          **sasl_mq.conf("SCRAM-SHA-256")})
    futures = client.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"dave-pw")])
    futures["dave"].result(WAIT)
    described = client.describe_user_scram_credentials(["dave"])["dave"].result(WAIT)
    [info] = described.scram_credential_infos
    assert (info.mechanism, info.iterations) == (ScramMechanism.SCRAM_SHA_256, 8192)
    _round_trip(sasl_mq, sasl_mq.conf("SCRAM-SHA-256", "dave", "dave-pw"), "daves")
    # PLAIN checks against the same (SHA-256) verifier
    _round_trip(sasl_mq, sasl_mq.conf("PLAIN", "dave", "dave-pw"), "daves2")
    futures = client.alter_user_scram_credentials([UserScramCredentialDeletion(
        "dave", ScramMechanism.SCRAM_SHA_256)])
    futures["dave"].result(WAIT)
    with Admin(sasl_mq.socket) as a:
        assert "dave" not in a.describe_user_scram_credentials()


def _frame(api_key: int, version: int, body: bytes, correlation_id: int = 1) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    return struct.pack(">i", len(header) + len(body)) + header + body


def _answer(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", _recv(sock, 4))[0]
    return _recv(sock, size)


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_skipping_authentication_closes_the_connection(sasl_mq):
    host, port = sasl_mq.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        sock.sendall(_frame(18, 0, b""))                   # ApiVersions: answered
        assert struct.unpack(">ih", _answer(sock)[:6]) == (1, 0)
        sock.sendall(_frame(3, 1, struct.pack(">i", -1)))  # Metadata before SASL: closed
        assert _closed(sock)
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        # SaslAuthenticate before a handshake: ILLEGAL_SASL_STATE
        sock.sendall(_frame(36, 0, struct.pack(">i", 3) + b"abc"))
        assert struct.unpack(">ih", _answer(sock)[:6]) == (1, 34)
        # an unknown mechanism: UNSUPPORTED_SASL_MECHANISM, with the enabled ones
        sock.sendall(_frame(17, 1, struct.pack(">h", 6) + b"GSSAPI", 2))
        answer = _answer(sock)
        assert struct.unpack(">ih", answer[:6]) == (2, 33) and b"SCRAM-SHA-512" in answer
        # a truncated SCRAM exchange: a client-first message without its nonce fails (58)
        sock.sendall(_frame(17, 1, struct.pack(">h", 13) + b"SCRAM-SHA-256", 3))
        assert struct.unpack(">ih", _answer(sock)[:6]) == (3, 0)
        sock.sendall(_frame(36, 0, struct.pack(">i", 11) + b"n,,n=alice,", 4))
        assert struct.unpack(">ih", _answer(sock)[:6]) == (4, 58)
        sock.sendall(_frame(3, 1, struct.pack(">i", -1), 5))   # still not authenticated
        assert _closed(sock)
    with Admin(sasl_mq.socket) as a:                       # the broker serves on
        assert a.describe_user_scram_credentials(["alice"])
    log = sasl_mq.proc.stderr()                            # one line per failure, with where
    assert log.count("SCRAM-SHA-256 authentication failed from 127.0.0.1:") == 1, log
    assert "Traceback" not in log


def test_before_authentication_a_request_may_hold_512_kib_and_after_it_100_mib(sasl_mq):
    host, port = sasl_mq.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        # Kafka's sasl.server.max.receive.size: closed on the size, the body never awaited
        sock.sendall(struct.pack(">i", 512 * 1024 + 1))
        assert _closed(sock)
    # Authenticated, a Produce of about 900 KiB (one record) is received and stored.
    conf = {**sasl_mq.conf("SCRAM-SHA-256"), "message.max.bytes": 2_000_000}
    big = bytes(range(256)) * 3600
    produce(sasl_mq.bootstrap, "big", [{"value": big}], conf)
    assert values(read_partitions(sasl_mq.bootstrap, "big", 1, conf=conf)) == [big]


def test_a_plaintext_listener_on_every_interface_is_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mq.broker", "--data-dir", str(tmp_path / "data"),
         "--socket", str(tmp_path / "mq.sock"), "--kafka-listener", "0.0.0.0:0"],
        capture_output=True, text=True, env=ENV, timeout=60, check=False)
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert "not a loopback address" in line and "kafka_allow_anonymous" in line


def test_a_sasl_listener_on_every_interface_starts(tmp_path):
    conf = tmp_path / "any.toml"
    conf.write_text('kafka_listeners = ["SASL_PLAINTEXT://0.0.0.0:0"]\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as proc:
        with Admin(proc.socket) as a:
            [listener] = a.broker_stats()["broker"]["kafka_listeners"]
    assert listener.startswith("SASL_PLAINTEXT://0.0.0.0:")


def test_an_anonymous_client_cannot_manage_scram_credentials(kafka_mq):
    """On a PLAINTEXT listener (User:ANONYMOUS) both KIP-554 apis are refused: reaching a
    loopback port must not let anyone create the users of a SASL listener."""
    client = AdminClient({"bootstrap.servers": kafka_mq.bootstrap, **LOGGER})
    futures = client.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "eve", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw")])
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED|ANONYMOUS"):
        futures["eve"].result(WAIT)
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED|ANONYMOUS"):
        client.describe_user_scram_credentials(["eve"])["eve"].result(WAIT)
    with Admin(kafka_mq.socket) as a:
        assert a.describe_user_scram_credentials() == {}


def test_sasl_ssl_authenticates_over_tls_and_the_principal_is_the_sasl_user(tmp_path):
    """SASL_SSL: TLS first (the TLS transport), then SCRAM inside it; the connection's
    principal is the SASL user, so an ACL-less alice (a super user here) reads and writes."""
    from tlscerts import issue, make_ca
    ca = make_ca(tmp_path / "certs", "test-ca")
    server = issue(ca, tmp_path / "certs", "broker", {"CN": "localhost"}, server=True)
    conf = tmp_path / "sasl_ssl.toml"
    conf.write_text('kafka_listeners = ["SASL_SSL://127.0.0.1:0"]\n'
                    f'kafka_ssl_certfile = "{server.cert}"\n'
                    f'kafka_ssl_keyfile = "{server.key}"\n'
                    'kafka_super_users = ["alice"]\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(conf), log_level="INFO") as proc:
        with Admin(proc.socket) as a:
            [listener] = a.broker_stats()["broker"]["kafka_listeners"]
            a.add_user("alice", PASSWORD)
        assert listener.startswith("SASL_SSL://127.0.0.1:")
        bootstrap = listener.removeprefix("SASL_SSL://")
        sasl = {"security.protocol": "SASL_SSL", "ssl.ca.location": ca.cert,
                "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice",
                "sasl.password": PASSWORD}
        produce(bootstrap, "secure", [{"value": b"v%d" % i} for i in range(3)], sasl)
        got = read_partitions(bootstrap, "secure", 3, conf=sasl)
        assert values(got) == [b"v0", b"v1", b"v2"]
        assert "authenticated as User:alice" in proc.stderr()
