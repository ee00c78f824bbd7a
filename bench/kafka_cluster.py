"""A three-node Apache Kafka cluster for the benchmarks: three KRaft nodes of
``bench.kafka_peer`` (each a broker and a controller in one JVM) with a static quorum,
topics replicated three times with two in sync (``default.replication.factor=3``,
``min.insync.replicas=2``, the internal topics too), as a production cluster keeps them.

::

    with KafkaCluster(workdir) as cluster:      # formats the three, launches, waits
        cluster.bootstrap                       # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
        cluster.kill(1)                         # SIGKILL node 1 (index into cluster.nodes)
        cluster.restart(1)                      # the same node on its directories

Heaps are small (``HEAP_MB``): three JVMs share the box with what is measured. Failure
detection is Kafka's production defaults (``broker.session.timeout.ms`` 9 s...) unless
``fast_failover``, which is what the tests use (see ``FAST_FAILOVER``), so a failover figure
says which it was measured with.
"""

from __future__ import annotations

import os
import signal
import subprocess

from bench.kafka_peer import KafkaNode, random_cluster_id

__all__ = ["FAST_FAILOVER", "KafkaCluster"]

SIZE = 3
HEAP_MB = 384
# A dead node noticed in seconds: heartbeats every 500 ms, fenced after 3 s without one.
FAST_FAILOVER = ["broker.heartbeat.interval.ms=500", "broker.session.timeout.ms=3000"]


class KafkaCluster:
    def __init__(self, workdir: str, size: int = SIZE, fast_failover: bool = False) -> None:
        self.nodes = [KafkaNode(os.path.join(workdir, f"node-{i + 1}"), heap_mb=HEAP_MB,
                                node_id=i + 1) for i in range(size)]
        self.fast_failover = fast_failover
        self.bootstrap = ",".join(n.bootstrap for n in self.nodes)

    def start(self, timeout: float = 180.0) -> KafkaCluster:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        cluster_id = random_cluster_id()
        try:
            for node in self.nodes:
                node.join(voters, cluster_id)
                node.prepare()
                if self.fast_failover:
                    with open(os.path.join(node.workdir, "server.properties"), "a") as f:
                        f.write("\n".join(FAST_FAILOVER) + "\n")
            for node in self.nodes:            # none is ready before a quorum is up
                node.launch()
            for node in self.nodes:
                node.wait(timeout, brokers=len(self.nodes))
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, index: int) -> None:
        """SIGKILL one node, and wait for it to be gone."""
        proc = self.nodes[index].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def restart(self, index: int, timeout: float = 120.0) -> None:
        node = self.nodes[index]
        node.launch()
        node.wait(timeout, brokers=len(self.nodes))

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to every node at once (one by one, the last waits for a quorum that is
        gone), SIGKILL for any still running after ``timeout``."""
        running = [n.proc for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
