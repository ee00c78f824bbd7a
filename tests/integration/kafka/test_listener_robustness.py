"""The Kafka listener under bad input, against a real broker subprocess: a misbehaving peer
loses its own connection and nothing else. After every test the broker is alive, still
serves a Kafka client and an ``mq.Admin``, the partition files of topic ``keep`` hold the
same bytes as before (checksums), and ``mq log check`` passes on every partition."""

from __future__ import annotations

import hashlib
import os
import resource
import select
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mq
import mq.testing
from mq.broker.kafka.conn import MAX_IN_FLIGHT, MAX_REGIONS
from mq.broker.kafka.versions import SERVED
from mq.protocol.kafka import codec
from mq.protocol.kafka.schemas import APIS
from tests.integration.cli_run import ENV, mq_run
from tests.property.kafka_bodies import body
from wire_calls import read_frame

API_VERSIONS, METADATA, FETCH, PRODUCE, CONSUMER_GROUP_HEARTBEAT = 18, 3, 1, 0, 68
MAX_REQUEST_BYTES = 100 * 1024 * 1024
WAIT = 30.0


class Kafka:
    """A broker with one Kafka listener; ``keep`` has records whose files must not change."""

    def __init__(self, tmp_path: Path, nofile: tuple[int, int] | None = None) -> None:
        conf = tmp_path / "mq.toml"
        conf.write_text('kafka_listeners = ["127.0.0.1:0"]\n')
        self.proc = mq.testing.BrokerProcess(str(tmp_path / "data"), config_file=str(conf),
                                             log_level="INFO", nofile=nofile)
        self.proc.start()
        with mq.Admin(self.proc.socket) as admin:
            admin.create_topic("keep", 2)
            admin.create_topic("other", 1)
            host, port = admin.broker_stats()["broker"]["kafka_listeners"][0].rsplit(":", 1)
        self.address = (host, int(port))
        with mq.Producer(self.proc.socket) as producer:      # 80 KB a partition: Fetch
            for i in range(200):                                # sends it with sendfile
                producer.send("keep", b"v%d" % i * 200, partition=i % 2)
            producer.flush()
        self.sums = self.checksums()

    def checksums(self) -> dict[str, str]:
        data = Path(self.proc.data_dir)
        return {str(p.relative_to(data)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(data.glob("keep-*/*.log"))}

    def connect(self) -> socket.socket:
        return socket.create_connection(self.address, timeout=WAIT)

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(line for line in status.splitlines()
                        if line.startswith("VmRSS")).split()[1])

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def check_healthy(self) -> None:
        """Alive, serving Kafka and native clients, ``keep`` untouched."""
        assert self.proc.proc.poll() is None, self.proc.stderr()
        with self.connect() as sock:
            assert api_versions(sock, correlation_id=99)["error_code"] == 0
        with mq.Admin(self.proc.socket) as admin:
            assert "keep" in admin.list_topics()
        assert self.checksums() == self.sums
        assert "Traceback" not in self.proc.stderr()


@pytest.fixture
def kafka(tmp_path):
    broker = Kafka(tmp_path)
    try:
        yield broker
        broker.check_healthy()
    finally:
        broker.proc.close()
    data = Path(broker.proc.data_dir)
    dirs = sorted(str(p) for p in data.iterdir() if (p / "00000000000000000000.log").exists())
    result = mq_run("log", "check", *dirs)
    assert result.code == 0, result


# --- a small client --------------------------------------------------------------------------

def api_versions(sock: socket.socket, correlation_id: int = 1, version: int = 3) -> dict:
    sock.sendall(codec.encode_request(API_VERSIONS, version, correlation_id, {}))
    got_id, body = codec.decode_response(API_VERSIONS, version, read_frame(sock))
    assert got_id == correlation_id
    return body


def assert_closed(sock: socket.socket) -> None:
    """The broker closes the connection: EOF or a reset, not a response."""
    sock.settimeout(WAIT)
    try:
        assert sock.recv(4096) == b""
    except ConnectionResetError:
        pass


# A client id this long makes a request 30 KB, so that the socket buffers between the test and
# the broker (several MB on loopback) hold a few hundred requests, not a hundred thousand.
PADDING = "p" * 30_000


def fetch_request(correlation_id: int, topic: str = "keep", client_id: str = PADDING) -> bytes:
    return codec.encode_request(FETCH, 12, correlation_id, client_id=client_id, body={
        "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})


# --- frames ----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [MAX_REQUEST_BYTES + 1, (1 << 31) - 1, -1, -(1 << 31), 0, 7])
def test_a_size_out_of_bounds_closes_that_connection_only(kafka, size):
    with kafka.connect() as bystander, kafka.connect() as sock:
        api_versions(bystander)
        sock.sendall(struct.pack(">i", size) + b"\x00" * 64)
        assert_closed(sock)
        assert api_versions(bystander, correlation_id=2)["error_code"] == 0


def test_a_size_at_the_limit_is_read(kafka):
    """100 MiB is allowed (Kafka's socket.request.max.bytes): the broker waits for the body;
    the peer sends half of it and goes away."""
    with kafka.connect() as bystander:
        sock = kafka.connect()
        sock.sendall(struct.pack(">i", MAX_REQUEST_BYTES) + struct.pack(">hhi", METADATA, 12, 1)
                     + b"\x00" * (1 << 20))
        api_versions(bystander)              # served meanwhile
        sock.close()
        api_versions(bystander, correlation_id=2)


@pytest.mark.parametrize("cut", [1, 3, 4, 10, 30])
def test_half_a_frame_then_close(kafka, cut):
    frame = codec.encode_request(METADATA, 12, 1, {"topics": None})
    with kafka.connect() as bystander:
        with kafka.connect() as sock:
            sock.sendall(frame[:cut])
        api_versions(bystander)
    # and a half frame left open does not hold anyone up
    with kafka.connect() as sock, kafka.connect() as bystander:
        sock.sendall(frame[:cut])
        api_versions(bystander)


@pytest.mark.parametrize("garbage", [b"\xff" * 16, b"\x00\x00\x00\x7f" + b"\x01" * 40,
                                     bytes(range(256)), b"\x80" * 9])
def test_garbage_after_a_valid_header_is_answered_or_closes_the_connection(kafka, garbage):
    """A body that does not decode closes the connection; one whose start happens to decode
    is answered (bytes after a body are ignored, as Kafka ignores them), or waits as it asks
    (an acks=0 produce is never answered; a fetch parks up to its max_wait_ms, hours for
    some garbage) while other connections are served."""
    for key, version in ((METADATA, 12), (METADATA, 1), (PRODUCE, 9), (FETCH, 12),
                         (API_VERSIONS, 3)):
        frame = codec.encode_request(key, version, 5, {}, client_id="fuzz")[4:]
        header_size = codec.decode_request(frame)[0].header_size
        body = frame[:header_size] + garbage
        with kafka.connect() as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            sock.settimeout(2.0)
            try:
                response = read_frame(sock)
            except TimeoutError:                            # waiting, as it asked
                with kafka.connect() as bystander:
                    api_versions(bystander)
                continue
            except (ConnectionError, OSError):
                continue                                    # closed
            assert response[:4] == struct.pack(">i", 5)
            assert_closed_or_open(sock)


def assert_closed_or_open(sock: socket.socket) -> None:
    """Nothing more arrives for the one request: the connection is closed or idle."""
    sock.setblocking(False)
    try:
        assert sock.recv(4096) == b""
    except BlockingIOError:
        pass
    except ConnectionResetError:
        pass


@pytest.mark.parametrize(("key", "version"), [(999, 0), (-1, 0), (57, 0), (METADATA, 13),
                                              (PRODUCE, 2), (FETCH, 13), (FETCH, -1)])
def test_an_unsupported_api_or_version_closes_the_connection(kafka, key, version):
    with kafka.connect() as bystander, kafka.connect() as sock:
        api_versions(bystander)
        frame = struct.pack(">hhi", key, version, 1) + b"\x00\x02cl" + b"\x00" * 20
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        assert_closed(sock)
        api_versions(bystander, correlation_id=2)


def test_an_unsupported_api_versions_version_is_answered_in_v0(kafka):
    with kafka.connect() as sock:
        frame = struct.pack(">hhi", API_VERSIONS, 9, 7) + b"\x00\x02cl" + b"\xde\xad"
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        got_id, body = codec.decode_response(API_VERSIONS, 0, read_frame(sock))
        assert got_id == 7 and body["error_code"] == 35
        assert {"api_key": FETCH, "min_version": 4, "max_version": 12} in body["api_keys"]
        assert api_versions(sock, correlation_id=8)["error_code"] == 0     # and it stays open


@pytest.mark.parametrize("half", [0, 1])
@settings(max_examples=3, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_requests_with_any_field_values_leave_the_broker_serving(kafka, data, half):
    """Every served api and version, bodies drawn from the schema (any ints, strings, nulls,
    tagged fields): each answered or its connection closed, the broker never stops, and no
    handler raises (``check_healthy``: no traceback in its log). Every other api per run:
    all of them in one example draw more than Hypothesis' entropy limit."""
    for key, (lo, hi) in sorted(SERVED.items())[half::2]:
        for version in range(lo, hi + 1):
            drawn = data.draw(body(APIS[key][0], version), label=f"api {key} v{version}")
            if key == FETCH:
                drawn["max_wait_ms"] = 0          # a parked Fetch is not what is tested
            with kafka.connect() as sock:
                sock.sendall(codec.encode_request(key, version, version, drawn))
            assert kafka.proc.proc.poll() is None, kafka.proc.stderr()
    with kafka.connect() as sock:
        assert api_versions(sock)["error_code"] == 0


def test_consumer_group_heartbeat_answers_an_empty_group_id(kafka):
    with kafka.connect() as sock:
        sock.sendall(codec.encode_request(CONSUMER_GROUP_HEARTBEAT, 0, 3, {
            "group_id": "", "member_id": "m", "member_epoch": 0,
            "rebalance_timeout_ms": 1000, "subscribed_topic_names": ["keep"],
            "topic_partitions": []}))
        _, got = codec.decode_response(CONSUMER_GROUP_HEARTBEAT, 0, read_frame(sock))
    assert got["error_code"] == 42                    # INVALID_REQUEST, as Kafka answers
    assert "Traceback" not in kafka.proc.stderr()


# --- many connections ------------------------------------------------------------------------
def _raise_nofile(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        assert hard == resource.RLIM_INFINITY or hard >= need, \
            f"this test opens {need} sockets; the hard open-file limit is {hard}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _kafka_client_round_trip(address: tuple[str, int], topic: str, n: int) -> None:
    """kafka-python's default (idempotent) producer and an assigned consumer."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    bootstrap = f"{address[0]}:{address[1]}"
    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        for i in range(n):
            producer.send(topic, b"k%d" % i, partition=0)
        producer.flush(timeout=WAIT)
    finally:
        producer.close(timeout=WAIT)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=int(WAIT * 1000))
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        values = [consumer.__next__().value for _ in range(n)]
    finally:
        consumer.close()
    assert values == [b"k%d" % i for i in range(n)]


def test_2000_idle_connections_while_clients_work(kafka):
    _raise_nofile(2200)
    idle = []
    try:
        for _ in range(2000):
            idle.append(kafka.connect())
        mq.testing.wait_for(lambda: kafka.fd_count() >= 2000, WAIT,
                            message="the broker to accept 2,000 connections")
        with mq.Admin(kafka.proc.socket) as admin:
            admin.create_topic("busy", 1)
        with mq.Producer(kafka.proc.socket) as producer:
            for i in range(100):
                producer.send("busy", b"n%d" % i)
            producer.flush()
        with mq.Consumer("busy", socket=kafka.proc.socket, value_bytes=True,
                         consumer_timeout_ms=WAIT * 1000) as consumer:
            got = [record.value for _, record in zip(range(100), consumer)]
        assert got == [b"n%d" % i for i in range(100)]
        _kafka_client_round_trip(kafka.address, "busy-kafka", 50)
        # a few of the idle ones still talk
        for i, sock in enumerate(idle[::400]):
            assert api_versions(sock, correlation_id=i)["error_code"] == 0
    finally:
        for sock in idle:
            sock.close()


def test_out_of_descriptors_the_broker_serves_its_connections_and_accepts_again(tmp_path):
    """More connections than the broker's open-file limit: the ones it has keep working,
    the rest wait in the backlog (accepts pause, not spin), and are taken once some close."""
    broker = Kafka(tmp_path, nofile=(400, 400))
    socks: list[socket.socket] = []
    try:
        with broker.connect() as first:
            for _ in range(500):
                sock = socket.socket()
                sock.setblocking(False)
                try:
                    sock.connect(broker.address)
                except BlockingIOError:
                    pass
                socks.append(sock)
            mq.testing.wait_for(lambda: "accept failed" in broker.proc.stderr(), WAIT,
                                message="the broker to run out of descriptors")
            assert api_versions(first)["error_code"] == 0
            for sock in socks[:300]:
                sock.close()
            with broker.connect() as late:
                assert api_versions(late)["error_code"] == 0
        for sock in socks[300:]:
            sock.close()
        broker.check_healthy()
    finally:
        for sock in socks:
            sock.close()
        broker.proc.close()


# --- a client that never reads ---------------------------------------------------------------
def _stuff(sock: socket.socket, frame_of, limit: int) -> tuple[int, int]:
    """Send frames until the broker stops reading (the socket stays unwritable for 2 s) or
    ``limit`` frames; returns (whole frames sent, bytes sent of the next one)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sock.setblocking(False)
    frames = sent = 0
    pending = frame_of(0)
    while frames < limit:
        try:
            n = sock.send(pending)
        except BlockingIOError:
            if not select.select([], [sock], [], 2.0)[1]:
                break
            continue
        sent += n
        pending = pending[n:]
        if not pending:
            frames += 1
            sent = 0
            pending = frame_of(frames)
    return frames, sent


def _drain(sock: socket.socket, frame_of, frames: int, partial: int, key: int,
           version: int) -> list[int]:
    """Finish the partial frame and read every response: their correlation ids in order."""
    rest = frame_of(frames)[partial:] if partial else b""
    expected = frames + (1 if partial else 0)
    buf = bytearray()
    ids: list[int] = []
    sock.setblocking(False)
    while len(ids) < expected:
        readable, writable, _ = select.select([sock], [sock] if rest else [], [], WAIT)
        assert readable or writable, f"stalled after {len(ids)} of {expected} responses"
        if writable:
            rest = rest[sock.send(rest):]
        if readable:
            chunk = sock.recv(1 << 20)
            assert chunk, f"closed after {len(ids)} of {expected} responses"
            buf += chunk
            while len(buf) >= 4 and len(buf) - 4 >= struct.unpack_from(">i", buf)[0]:
                size = struct.unpack_from(">i", buf)[0]
                ids.append(codec.decode_response(key, version, bytes(buf[4:4 + size]))[0])
                del buf[:4 + size]
    return ids


@pytest.mark.parametrize("api", ["fetch", "metadata"])
def test_a_client_that_never_reads_is_not_read_either(kafka, api):
    """Thousands of pipelined Fetches (each answered with records of ``keep``) or Metadata
    requests, none of the answers read: the broker stops reading that peer with a bounded
    backlog (descriptors, memory), serves everyone else, and answers everything in order
    once the peer reads."""
    if api == "fetch":
        frame_of, key, version = fetch_request, FETCH, 12
    else:
        key, version = METADATA, 12

        def frame_of(i: int) -> bytes:
            return codec.encode_request(METADATA, 12, i, {"topics": None}, client_id=PADDING)
    fds_before = kafka.fd_count()
    with kafka.connect() as sock, kafka.connect() as bystander:
        frames, partial = _stuff(sock, frame_of, 200_000)
        assert frames < 200_000, "the broker read 200,000 requests of a peer that reads none"
        held = kafka.fd_count() - fds_before
        assert held <= MAX_REGIONS + 8, f"the broker holds {held} more descriptors"
        rss_kib = kafka.rss_kib()
        assert rss_kib < 512 * 1024, f"broker RSS {rss_kib} KiB"
        # everyone else is served meanwhile
        assert api_versions(bystander)["error_code"] == 0
        with mq.Producer(kafka.proc.socket) as producer:
            producer.send("other", b"x").get(timeout=WAIT)
        # and when the peer reads, every answer comes, in order
        ids = _drain(sock, frame_of, frames, partial, key, version)
        assert ids == list(range(len(ids)))
    mq.testing.wait_for(lambda: kafka.fd_count() <= fds_before + 2, WAIT,
                        message="the descriptors of the closed connection to be released")


def test_in_flight_requests_are_bounded_behind_a_parked_fetch(kafka):
    """A Fetch that waits for data holds back the responses after it (Kafka answers in
    order); the broker reads at most MAX_IN_FLIGHT requests of that peer meanwhile."""
    with mq.Admin(kafka.proc.socket) as admin:
        admin.create_topic("empty", 1)
    parked = codec.encode_request(FETCH, 12, 0, {
        "max_wait_ms": 60_000, "min_bytes": 1, "max_bytes": 1 << 20,
        "topics": [{"topic": "empty", "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
    with kafka.connect() as sock:
        sock.sendall(parked)

        def frame_of(i: int) -> bytes:
            return fetch_request(i + 1)
        fds_before = kafka.fd_count()
        frames, partial = _stuff(sock, frame_of, 200_000)
        assert frames < 200_000
        assert kafka.fd_count() - fds_before <= MAX_IN_FLIGHT + 8
        # data for the parked Fetch: it answers, then everything behind it
        with mq.Producer(kafka.proc.socket) as producer:
            producer.send("empty", b"wake").get(timeout=WAIT)
        ids = _drain(sock, lambda i: frame_of(i - 1) if i else parked, frames + 1, partial,
                     FETCH, 12)
        assert ids == list(range(len(ids)))


# --- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize("address", ["0.0.0.0:9092", "[::]:9092", ":9092"])
def test_a_non_loopback_listener_refuses_to_start(tmp_path, address):
    proc = subprocess.run(
        [sys.executable, "-m", "mq.broker", "--data-dir", str(tmp_path / "data"),
         "--socket", str(tmp_path / "mq.sock"), "--kafka-listener", address],
        capture_output=True, text=True, env=ENV, timeout=60, check=False)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and address.rsplit(":", 1)[0] in lines[0]
    assert not (tmp_path / "mq.sock").exists()
