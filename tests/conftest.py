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


def pytest_terminal_summary(terminalreporter):
    """One line CI can be held to: the skip count, printed even when it is zero (a test that
    skips in CI is a hole; every tool a test needs is installed by .ci/run or its fixture)."""
    skipped = terminalreporter.stats.get("skipped", [])
    terminalreporter.write_line(f"skipped tests: {len(skipped)}")
    for report in skipped:
        terminalreporter.write_line(f"  skipped: {report.nodeid}")
