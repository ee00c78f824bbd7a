"""mq's Kafka clients through a group coordinator that moves: a group's committed offsets are
asked again while the cluster answers COORDINATOR_LOAD_IN_PROGRESS (14),
COORDINATOR_NOT_AVAILABLE (15) or NOT_COORDINATOR (16), as Kafka's own tools do, and a
coordinator that never settles ends in one clear error, never in a crash.

The cluster is a fake one-node Kafka broker on a thread (``MovingCoordinator``), speaking
the wire protocol through mq's codec: ApiVersions, Metadata (topic ``t``, two partitions),
FindCoordinator (itself) and OffsetFetch, whose first answers are the error codes it is
given, then the group's offsets. A real cluster gives these answers only in a moment of a
node's restart (CI saw ``mq workers redrive`` fail with NOT_COORDINATOR, and a pytest worker
die asking a new cluster for a group's offsets).

librdkafka's admin ListConsumerGroupOffsets crashes the process (SIGSEGV) on such an answer
(librdkafka#5040): ``mq.Admin.list_group_offsets`` is run in a child process here, so that
a crash fails the test instead of ending the run.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

import mq
from mq.protocol.kafka.codec import decode_request, encode_response
from wire_calls import read_frame

API_VERSIONS, METADATA, FIND_COORDINATOR, OFFSET_FETCH = 18, 3, 10, 9
# What the fake broker answers: below the versions with topic ids and batched lookups.
VERSIONS = {API_VERSIONS: (0, 3), METADATA: (1, 9), FIND_COORDINATOR: (0, 3),
            OFFSET_FETCH: (1, 7)}
TOPIC, PARTITIONS, OFFSET = "t", 2, 42
# As confluent-kafka commits it, with its C terminator: librdkafka hands a committed offset's
# metadata over without one, which confluent-kafka reads up to a NUL.
COMMITTED_METADATA = "m\0"


class MovingCoordinator:
    """The fake broker (see the module doc); ``fetches`` counts the OffsetFetch requests."""

    def __init__(self, errors: list[int]) -> None:
        self.errors = list(errors)
        self.fetches = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()
        for conn in self._conns:
            conn.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                header, body = decode_request(read_frame(conn))
                reply = self._answer(header.api_key, header.api_version, body)
                conn.sendall(b"".join(bytes(p) for p in encode_response(
                    header.api_key, header.api_version, header.correlation_id, reply)))
        except OSError:                  # ConnectionError: the client closed
            conn.close()

    def _answer(self, api: int, version: int, body: dict) -> dict:
        if api == API_VERSIONS:
            return {"error_code": 0, "api_keys": [
                {"api_key": k, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in VERSIONS.items()]}
        if api == METADATA:
            return {"brokers": [{"node_id": 1, "host": "127.0.0.1", "port": self.port}],
                    "cluster_id": "fake", "controller_id": 1, "topics": [
                        {"name": TOPIC, "partitions": [
                            {"partition_index": p, "leader_id": 1, "leader_epoch": 0,
                             "replica_nodes": [1], "isr_nodes": [1]}
                            for p in range(PARTITIONS)]}]}
        if api == FIND_COORDINATOR:
            return {"node_id": 1, "host": "127.0.0.1", "port": self.port}
        if api == OFFSET_FETCH:
            with self._lock:
                self.fetches += 1
                error = self.errors.pop(0) if self.errors else 0
            if error:
                return {"error_code": error}
            asked = body["topics"] or [{"name": TOPIC,             # None: every topic
                                        "partition_indexes": list(range(PARTITIONS))}]
            return {"topics": [{"name": t["name"], "partitions": [
                {"partition_index": p, "committed_offset": OFFSET,
                 "metadata": COMMITTED_METADATA}
                for p in t["partition_indexes"]]} for t in asked]}
        raise AssertionError(f"the fake broker was sent api {api} v{version}")


@pytest.fixture
def moving():
    """``moving(errors)``: a fake broker whose OffsetFetch answers are ``errors``, then the
    offsets."""
    made = []

    def make(errors: list[int]) -> MovingCoordinator:
        made.append(MovingCoordinator(errors))
        return made[-1]
    yield make
    for broker in made:
        broker.close()


MOVES = [14, 15, 16] * 3          # more than librdkafka retries by itself (twice)


def test_a_consumer_asks_for_its_committed_offset_again_while_the_coordinator_moves(moving):
    broker = moving(MOVES)
    with mq.Consumer(bootstrap_servers=broker.bootstrap, group_id="g",
                     enable_auto_commit=False) as consumer:
        consumer.assign([mq.TopicPartition(TOPIC, 0)])
        assert consumer.committed(mq.TopicPartition(TOPIC, 0)) == OFFSET
    assert broker.fetches > len(MOVES)


def test_a_coordinator_that_never_settles_ends_in_one_error_naming_the_wait(moving):
    broker = moving([16] * 10_000)
    with mq.Consumer(bootstrap_servers=broker.bootstrap, group_id="g", enable_auto_commit=False,
                     request_timeout_ms=1000) as consumer:
        consumer.assign([mq.TopicPartition(TOPIC, 0)])
        with pytest.raises(mq.errors.NotCoordinatorError,
                           match=r"^committed offset of group g \(the group's coordinator was "
                                 r"still moving after 1 s\): .*Not coordinator$"):
            consumer.committed(mq.TopicPartition(TOPIC, 0))


ADMIN = """
import json, sys
import mq
with mq.Admin(bootstrap_servers=sys.argv[1], timeout=float(sys.argv[2])) as admin:
    try:
        found = admin.list_group_offsets("g", with_metadata=True)
    except mq.errors.MQError as err:
        print(json.dumps({"error": type(err).__name__, "message": str(err)}))
    else:
        print(json.dumps({"offsets": sorted([tp.topic, tp.partition, o, m]
                                            for tp, (o, m) in found.items())}))
"""


def admin_offsets(broker: MovingCoordinator, timeout: float) -> dict:
    """``mq.Admin.list_group_offsets("g")`` in a child process: what it printed."""
    child = subprocess.run([sys.executable, "-c", ADMIN, broker.bootstrap, str(timeout)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == 0, f"the admin's process died ({child.returncode}): " \
                                  f"{child.stderr[-2000:]}"
    return json.loads(child.stdout)


def test_the_admin_lists_a_group_s_offsets_through_a_moving_coordinator_without_crashing(
        moving):
    broker = moving(MOVES)
    assert admin_offsets(broker, 30.0) == {
        "offsets": [[TOPIC, p, OFFSET, "m"] for p in range(PARTITIONS)]}


def test_the_admin_ends_in_one_error_when_the_coordinator_never_settles(moving):
    found = admin_offsets(moving([15] * 10_000), 1.0)
    assert found["error"] == "CoordinatorNotAvailableError"
    assert found["message"].startswith("committed offsets of group g (the group's coordinator "
                                       "was still moving after 1 s): "), found
