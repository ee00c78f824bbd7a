"""Shared pytest setup. Every test owns its data directory (``tmp_path``), so ``-n auto`` is safe.

After each test that used ``tmp_path``, no shared-memory region or semaphore of a data dir under
it may be left in /dev/shm (``mq.protocol.state.leftovers``): names come from the data dir, so
the check sees only this test's, whatever runs beside it.

The Kafka test helpers are importable by name from every directory: ``kclients`` (librdkafka),
and ``javakafka``, ``kafkanode`` and ``kafkacluster`` (Apache Kafka from Maven jars); the
``kafka_cluster`` fixture (a three-node Kafka cluster per run, ``kafkaclusterplugin``) is
every test's.
"""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from mq.log.files import LOCK_FILE
from mq.protocol.state import leftovers

KAFKA = Path(__file__).resolve().parent / "integration" / "kafka"
for helpers in (KAFKA, KAFKA / "java"):
    if str(helpers) not in sys.path:
        sys.path.insert(0, str(helpers))
pytest_plugins = ["kafkaclusterplugin"]

settings.register_profile("ci", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _no_shm_left(request):
    """Fail a test that leaves a broker's region or a client's semaphore in /dev/shm (a
    crashed broker's outlives it; ``mq.testing`` removes those of brokers it started)."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    root = request.getfixturevalue("tmp_path")     # now: torn down after this check
    yield
    left = [name for directory, _, names in os.walk(root) if LOCK_FILE in names
            for name in leftovers(directory)]
    assert not left, f"left in /dev/shm: {left} (a broker killed and not restarted?)"


# Tests of tens of seconds each (JVMs, Spark, benchmark smoke runs, pools killed and
# restarted), longest first: collected before the rest, so that with ``-n`` (and small
# scheduling chunks, tests/run.sh) they start early on every worker and the run does not end
# with one worker on a long test while the others idle.
SLOW_FIRST = (
    "tests/integration/test_bench_kafka_wire.py",
    "tests/spark/test_pipeline.py",
    "tests/integration/kafka/java/judge/",
    "tests/spark/test_sink_restart.py",
    "tests/integration/test_bench_kafka_tls.py",
    "tests/integration/cluster/test_migrate.py",
    "tests/integration/kafka/java/",
    "tests/spark/",
    "tests/integration/test_bench_aio_clients.py",
    "tests/workers/test_pool_kafka.py",
    "tests/integration/test_eos_pipeline.py",
    "tests/integration/cluster/",
    "tests/workers/test_exactly_once.py",
    "tests/integration/test_bench_e2e_kafka_peers.py",
    "tests/integration/kafka/test_sasl.py",
    "tests/integration/kafka/test_tls.py",
    "tests/property/",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(SLOW_FIRST) if item.nodeid.startswith(prefix)),
                    len(SLOW_FIRST))
    items.sort(key=rank)                 # stable: each module's own order is kept


def pytest_terminal_summary(terminalreporter):
    """One line CI can be held to: the skip count, printed even when it is zero (a test that
    skips in CI is a hole; every tool a test needs is installed by .ci/run or its fixture)."""
    skipped = terminalreporter.stats.get("skipped", [])
    terminalreporter.write_line(f"skipped tests: {len(skipped)}")
    for report in skipped:
        terminalreporter.write_line(f"  skipped: {report.nodeid}")
