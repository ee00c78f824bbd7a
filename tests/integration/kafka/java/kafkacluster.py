"""A three-node Apache Kafka cluster for the tests, shared by the processes of a pytest run: three
KRaft nodes, each a broker and a controller in one JVM (``kafkanode.KafkaNode``), a static quorum
of the three controllers, topics replicated three times with ``min.insync.replicas=2``
(``tests/java/kafka-broker/cluster.properties``, which says why each timeout is what it is).

::

    cluster = shared(root, owner_pid)      # started by the first caller, attached by the others
    cluster.bootstrap                      # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
    with cluster.node_down(1):             # SIGKILL node 2; restarted and in sync after the block
        ...
    cluster.partitions("topic")            # [PartitionState(topic, partition, leader, isr, ...)]
    stop(root)                             # SIGKILL every node (the data is the run's, thrown away)

On disk, in ``root``:

    cluster.json    bootstrap, and each node's directory, ports and pid (rewritten, whole, when
                    a node is restarted); it exists while the cluster may run
    failed          why the cluster did not start (the next callers fail at once with it)
    start.lock      held while the cluster starts
    down.lock       held while a node is down: one node at a time, whichever process kills it,
                    so the other tests keep two of three replicas in sync
    node-N/         node N's KafkaNode directory (server.properties, data, meta, logs)

A watchdog process (this file run as a script) kills the nodes when ``owner_pid`` (the pytest
process that outlives the others) dies before it stopped them: killed, or timed out by CI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

import mq.testing
from kafkanode import CONFIG_DIR, KafkaNode, alive, random_cluster_id

SIZE = 3
STATE = "cluster.json"
# librdkafka's complaints about the killed node go to Python's logging (shown with a failure).
LIBRDKAFKA = logging.getLogger("librdkafka")
WAIT = 120.0                  # seconds: start, or rejoin, on a loaded 2-core box
# Three JVMs on two cores beside the test suite: C1 only (a test session is too short for C2 to
# pay back its compile time), one compiler thread, the serial collector (no GC threads) and
# heaps that hold a test's topics. With cluster.properties' threads and intervals, measured on
# the 2-core box: the cluster starts in 8-9 s when the box is quiet (12-24 s at load 10-17);
# idle, the three JVMs take 3.7 % of one core together when fresh on a quiet box, 6 % after a
# test's topic and at load 13 (9 % and 10 % with the JVM's defaults and Kafka's threads).
JVM = ["-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
       "-XX:CICompilerCount=1", "-XX:-UsePerfData", "-XX:ReservedCodeCacheSize=64m"]


@dataclasses.dataclass(frozen=True)
class PartitionState:
    """One partition as DescribeTopics shows it (leader -1: none)."""
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def in_sync(self) -> bool:
        return self.leader != -1 and set(self.isr) == set(self.replicas)

    def __str__(self) -> str:
        return (f"{self.topic}-{self.partition} leader {self.leader} "
                f"isr {list(self.isr)} replicas {list(self.replicas)}")


class KafkaCluster:
    """The nodes of a cluster in ``root`` (``nodes[i]`` is node id ``i + 1``)."""

    def __init__(self, root: Path, nodes: list[KafkaNode]) -> None:
        self.root = Path(root)
        self.nodes = nodes
        self.bootstrap = ",".join(n.bootstrap for n in nodes)

    @classmethod
    def create(cls, root: Path, size: int = SIZE) -> KafkaCluster:
        """A cluster of ``size`` new nodes in ``root`` (formatted on ``start``)."""
        root = Path(root)
        nodes = [KafkaNode(root / f"node-{i + 1}", template=CONFIG_DIR / "cluster.properties",
                           format_args=(), jvm=JVM) for i in range(size)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{n.controller_port}" for i, n in enumerate(nodes))
        cluster_id = random_cluster_id()
        for i, node in enumerate(nodes):
            node.set_cluster(cluster_id, {"node_id": i + 1, "voters": voters})
        return cls(root, nodes)

    @classmethod
    def attach(cls, root: Path) -> KafkaCluster:
        """The cluster that another process started in ``root`` (from its ``cluster.json``)."""
        state = json.loads((Path(root) / STATE).read_text())
        return cls(root, [KafkaNode(n["workdir"], template=CONFIG_DIR / "cluster.properties",
                                    format_args=(), jvm=JVM, ports=tuple(n["ports"]),
                                    pid=n["pid"]) for n in state["nodes"]])

    def start(self, timeout: float = WAIT) -> KafkaCluster:
        """Launch every node (none is ready before a quorum is up), write ``cluster.json``, and
        wait until each node names all of them as brokers; raises ``RuntimeError`` with a
        node's log tail (every node killed) if one exits or is not ready in ``timeout``
        seconds."""
        try:
            for node in self.nodes:
                node.launch()
            self._save()
            for node in self.nodes:
                node.wait_ready(timeout, brokers=len(self.nodes))
        except BaseException:
            for node in self.nodes:
                node.kill()
            (self.root / STATE).unlink(missing_ok=True)
            raise
        return self

    def _save(self) -> None:
        nodes = [{"workdir": str(n.workdir), "ports": [n.port, n.controller_port],
                  "pid": n.pid} for n in self.nodes]
        tmp = self.root / (STATE + ".tmp")
        tmp.write_text(json.dumps({"bootstrap": self.bootstrap, "nodes": nodes}))
        tmp.rename(self.root / STATE)

    def _reload(self) -> None:
        """The nodes' pids as ``cluster.json`` has them (another process may have restarted
        one)."""
        state = json.loads((self.root / STATE).read_text())
        for node, saved in zip(self.nodes, state["nodes"], strict=True):
            node.pid = saved["pid"]

    @contextlib.contextmanager
    def node_down(self, index: int, timeout: float = WAIT) -> Iterator[KafkaNode]:
        """``nodes[index]`` killed with SIGKILL for the block, at most one node of the cluster
        at a time across processes (others wait here); before the kill every partition is in
        sync, after the block the node is restarted and every partition in sync again."""
        with _locked(self.root / "down.lock"):
            self._reload()
            self.wait_in_sync(timeout)
            node = self.nodes[index]
            node.kill()
            try:
                yield node
            finally:
                node.launch()
                self._save()
                node.wait_ready(timeout, brokers=len(self.nodes))
                self.wait_in_sync(timeout)

    @contextlib.contextmanager
    def all_up(self, timeout: float = WAIT) -> Iterator[None]:
        """Every node up and every partition in sync for the block (``node_down`` waits)."""
        with _locked(self.root / "down.lock"):
            self._reload()
            self.wait_in_sync(timeout)
            yield

    def partitions(self, *topics: str, timeout: float = 30.0) -> list[PartitionState]:
        """Every partition of ``topics`` (all topics, internal ones included, when none are
        given) with its leader, replicas and ISR. A topic that the node asked does not know
        yet (created through another node a moment ago: each learns it from the metadata log
        in its own time) is asked for again for up to ``timeout`` seconds, and so is a
        request that timed out (the node it went to was killed meanwhile by another test:
        "Timed out waiting for controller"), through a client of the nodes running then;
        raises ``KafkaException`` when that does not answer either."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._describe(topics)
            except KafkaException as err:
                if (err.args[0].code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                               KafkaError._TIMED_OUT)
                        or time.monotonic() > deadline):
                    raise
            time.sleep(0.1)

    def _describe(self, topics: tuple[str, ...]) -> list[PartitionState]:
        client = self._admin()
        names = list(topics) or list(client.list_topics(timeout=10).topics)
        if not names:
            return []
        described = client.describe_topics(TopicCollection(names), request_timeout=10)
        return [PartitionState(name, p.id, p.leader.id if p.leader is not None else -1,
                               tuple(r.id for r in p.replicas), tuple(r.id for r in p.isr))
                for name, future in sorted(described.items())
                for p in future.result().partitions]

    def _admin(self) -> AdminClient:
        """A client of the running nodes only: librdkafka's admin requests may wait on a dead
        bootstrap broker rather than try the next."""
        self._reload()
        running = ",".join(n.bootstrap for n in self.nodes if n.running) or self.bootstrap
        return AdminClient({"bootstrap.servers": running, "logger": LIBRDKAFKA})

    def wait_in_sync(self, timeout: float = WAIT) -> None:
        """Until every partition has a leader and all its replicas in sync; ``TimeoutError``
        lists those that have not."""
        seen: list[PartitionState] = []

        def in_sync() -> bool:
            try:
                seen[:] = self.partitions()
            except KafkaException:
                return False
            return all(p.in_sync for p in seen)

        try:
            mq.testing.wait_for(in_sync, timeout, 0.2, "every partition in sync")
        except TimeoutError as err:
            lagging = "\n".join(str(p) for p in seen if not p.in_sync)
            raise TimeoutError(f"{err}:\n{lagging}") from None


def shared(root: Path, owner: int) -> KafkaCluster:
    """The cluster of ``root``: started by the first process that asks (which also starts the
    watchdog of ``owner``), attached by the others; raises ``RuntimeError`` if it could not
    start (once: the next callers get the first one's error)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / "start.lock"):
        if (root / "failed").exists():
            raise RuntimeError((root / "failed").read_text())
        if (root / STATE).exists():
            return KafkaCluster.attach(root)
        cluster = KafkaCluster.create(root)
        _watchdog(owner, root)
        try:
            return cluster.start()
        except BaseException as err:
            (root / "failed").write_text(f"the Kafka cluster in {root} did not start: {err}")
            raise


def stop(root: Path) -> None:
    """SIGKILL every node of ``cluster.json`` that still runs, then remove the file (the
    watchdog then exits). Nothing is kept: the cluster's data lives as long as the run."""
    state = Path(root) / STATE
    if state.exists():
        for node in KafkaCluster.attach(root).nodes:
            node.kill()
        state.unlink()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _watchdog(owner: int, root: Path) -> None:
    """This file as a script in a session of its own (a Ctrl-C to pytest's process group
    must not kill it before it has killed the nodes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    os.posix_spawn(sys.executable, [sys.executable, __file__, str(owner), str(root)], env,
                   setsid=True, file_actions=[(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0)
                                              for fd in (0, 1, 2)])


def _watch(owner: int, root: Path) -> None:
    """Once a second, until the cluster is stopped (``cluster.json`` gone after it was there)
    or failed to start: if ``owner`` is gone, stop the cluster."""
    started = False
    while alive(owner):
        started = started or (root / STATE).exists()
        if (started and not (root / STATE).exists()) or (root / "failed").exists():
            return
        time.sleep(1.0)
    stop(root)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), Path(sys.argv[2]))
