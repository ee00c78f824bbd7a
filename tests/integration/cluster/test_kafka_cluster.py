"""The three-node Kafka cluster of the suite (``kafka_cluster``; ``kafkacluster``), the ground that
issue 24's tests stand on: topics are replicated three times with two in sync, and a node killed
with SIGKILL under load (a librdkafka producer, acks=all and idempotent, producing while the node
dies) loses nothing acknowledged: every partition gets a new leader and is read back whole, and
the node comes back in sync. The topics are the test's own (the cluster is the run's)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter

from confluent_kafka import KafkaError
from confluent_kafka.admin import ConfigResource
from kclients import WAIT, admin, consumer, create_topic, producer, read, read_to_end

from mq.testing import wait_for

PARTITIONS = 3


def _topic(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


class Load:
    """A producer (acks=all, idempotent) sending to every partition in turn from a thread until
    ``stop``: ``acked`` holds each acknowledged value, ``errors`` each failed delivery."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.acked: list[bytes] = []
        self.errors: list[KafkaError] = []
        self._stop = threading.Event()
        self._producer = producer(bootstrap, {"acks": "all", "enable.idempotence": True})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self._producer.produce(self.topic, b"r%06d" % i, partition=i % PARTITIONS,
                                   on_delivery=self._report)
            self._producer.poll(0.001)
            i += 1

    def _report(self, err, msg) -> None:
        if err is None:
            self.acked.append(msg.value())
        else:
            self.errors.append(err)

    def wait_acked(self, count: int) -> None:
        wait_for(lambda: len(self.acked) >= count, WAIT, 0.01, f"{count} records acknowledged")

    def stop(self) -> None:
        """Stop producing and wait for every record's delivery report."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            assert self._producer.flush(WAIT) == 0, f"not all delivered within {WAIT}s"


def test_a_node_killed_under_load_loses_nothing_acknowledged(kafka_cluster):
    topic = _topic("killed")
    create_topic(kafka_cluster.bootstrap, topic, PARTITIONS, replication_factor=3)
    assert all(len(p.replicas) == 3 for p in kafka_cluster.partitions(topic))
    with Load(kafka_cluster.bootstrap, topic) as load:
        load.wait_acked(500)
        victim = kafka_cluster.partitions(topic)[0].leader     # a leader: the harder case
        with kafka_cluster.node_down(victim - 1):
            before = len(load.acked)
            load.wait_acked(before + 1000)     # producing again: new leaders, ISRs of two
            load.stop()
            wait_for(lambda: all(p.leader not in (-1, victim)
                                 for p in kafka_cluster.partitions(topic)),
                     WAIT, 0.1, f"a leader other than node {victim} for every partition")
            read = Counter(m.value() for part in range(PARTITIONS)
                           for m in read_to_end(kafka_cluster.bootstrap, topic, part))
        assert not load.errors
        assert read == Counter(load.acked), (
            f"acked {len(load.acked)}, read {sum(read.values())}; "
            f"lost {len(set(load.acked) - set(read))}, duplicated "
            f"{sum(n > 1 for n in read.values())}:\n"
            + "\n".join(map(str, kafka_cluster.partitions(topic))))
    # Under down.lock: another test may kill a node as soon as node_down lets it go.
    with kafka_cluster.all_up():
        assert kafka_cluster.nodes[victim - 1].running
        assert all(p.in_sync for p in kafka_cluster.partitions(topic))


def test_topics_are_replicated_three_times_with_two_in_sync(kafka_cluster):
    topic = _topic("defaults")
    with kafka_cluster.all_up():             # no other test's node down meanwhile
        create_topic(kafka_cluster.bootstrap, topic, PARTITIONS, replication_factor=-1)
        states = kafka_cluster.partitions(topic)
    assert [len(p.replicas) for p in states] == [3] * PARTITIONS
    assert {p.leader for p in states} == {1, 2, 3}            # leaders spread over the nodes
    client = admin(kafka_cluster.bootstrap)
    [described] = client.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    assert described.result(WAIT)["min.insync.replicas"].value == "2"
    with Load(kafka_cluster.bootstrap, topic) as load:
        load.wait_acked(300)
    c = consumer(kafka_cluster.bootstrap, _topic("group"), {"auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        assert Counter(m.value() for m in read(c, len(load.acked))) == Counter(load.acked)
    finally:
        c.close()
