"""The ``kafka_cluster`` fixture, for any test of the suite (``tests/conftest.py`` loads this
plugin): the three-node Apache Kafka cluster of ``kafkacluster``, one per pytest run, shared by
the xdist workers.

The first test that asks for it starts it (about 15 s), under a lock in the run's shared base
temp (the xdist controller's, whose subdirectories are the workers'); the other workers attach
to it through its ``cluster.json``. The process that is no xdist worker (the controller, or
pytest alone) kills it in ``pytest_unconfigure``, whether the tests passed, failed or were
interrupted; if that process itself is killed, the cluster's watchdog kills the nodes within a
second. A test that takes a node down does it with ``kafka_cluster.node_down(i)``: one node at
a time across the workers, back and in sync when the block ends. It fails, never skips, without
Java or Maven (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
from pathlib import Path

import kafkacluster
import pytest
from javakafka import JavaUnavailable

DIR = "kafka-cluster"
USED = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory, request) -> kafkacluster.KafkaCluster:
    """The run's three-node Kafka cluster (``kafkacluster.KafkaCluster``): ``bootstrap``,
    ``nodes``, ``node_down(i)``, ``partitions(*topics)``."""
    config = request.config
    worker = hasattr(config, "workerinput")
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker else base) / DIR
    owner = os.getppid() if worker else os.getpid()     # the process that outlives the others
    if not worker:
        config.stash[USED] = root
    try:
        return kafkacluster.shared(root, owner)
    except JavaUnavailable as err:
        pytest.fail(str(err))


def pytest_unconfigure(config) -> None:
    """Kill the run's cluster, if one was started: in pytest alone, or in the xdist
    controller once every worker is done."""
    if hasattr(config, "workerinput"):
        return
    root = config.stash.get(USED, None)
    if root is None and config.pluginmanager.has_plugin("dsession"):
        # xdist's controller: its base temp is the workers' shared one (xdist made it).
        root = config._tmp_path_factory.getbasetemp() / DIR
    if root is not None:
        kafkacluster.stop(root)
