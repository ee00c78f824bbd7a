"""mq's clients on the three-node Kafka cluster while a node is killed with SIGKILL under load
(replication factor 3, ``min.insync.replicas=2``, ``acks="all"``): nothing acknowledged is
lost, and a consumer group keeps going."""

from __future__ import annotations

import threading
import time

import mq
import mq.aio

WAIT_S = 60.0


def _produce_until(stop: threading.Event, producer, topic: str, acked: set,
                   failed: list) -> None:
    """Send numbered records until ``stop``; the acknowledged ones go into ``acked``."""
    i = 0
    while not stop.is_set():
        fut = producer.send(topic, b"%d" % i, key=b"%d" % i)
        fut.add_callback(lambda md, v=i: acked.add(v))
        fut.add_errback(failed.append)
        i += 1
        time.sleep(0.002)


def test_a_killed_node_loses_nothing_acknowledged_and_the_group_goes_on(kafka_cluster):
    name = f"failover-{time.monotonic_ns()}"
    with mq.Admin(bootstrap_servers=kafka_cluster.bootstrap) as admin:
        admin.create_topic(name, 3, {"min.insync.replicas": "2"}, replication_factor=3)
    acked: set = set()
    failed: list = []
    seen: set = set()
    stop = threading.Event()
    consumer = mq.Consumer(name, group_id=f"g-{name}", bootstrap_servers=kafka_cluster.bootstrap,
                           enable_auto_commit=False)
    with mq.Producer(bootstrap_servers=kafka_cluster.bootstrap, acks="all",
                     linger_ms=2) as producer:
        sender = threading.Thread(target=_produce_until,
                                  args=(stop, producer, name, acked, failed))
        sender.start()
        try:
            def consume_until(condition) -> None:
                deadline = time.monotonic() + WAIT_S
                while not condition() and time.monotonic() < deadline:
                    for records in consumer.poll(100).values():
                        seen.update(int(r.value) for r in records)
                assert condition(), f"acked {len(acked)}, seen {len(seen)}"

            consume_until(lambda: len(seen) > 200)
            with kafka_cluster.node_down(1):
                before = len(acked)
                consume_until(lambda: len(acked) > before + 300 and len(seen) > before + 300)
            before = len(acked)
            consume_until(lambda: len(acked) > before + 200)
        finally:
            stop.set()
            sender.join()
        producer.flush(WAIT_S)
    consume_until(lambda: acked <= seen)
    consumer.commit()
    consumer.close()
    assert not failed, failed[:3]
    # read back from the start by a fresh consumer: every acknowledged record is there
    with mq.Consumer(name, bootstrap_servers=kafka_cluster.bootstrap) as fresh:
        stored: set = set()
        deadline = time.monotonic() + WAIT_S
        while not acked <= stored and time.monotonic() < deadline:
            for records in fresh.poll(200).values():
                stored.update(int(r.value) for r in records)
    assert acked <= stored, f"lost {len(acked - stored)} acknowledged records"
