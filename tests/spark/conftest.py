"""Local-mode Spark for the ``mq.spark`` tests: one SparkSession per xdist worker (a JVM
takes about 10 s to start), ``local[2]``, no UI, two shuffle partitions, the ``mq`` format
registered; a fresh broker per test (``broker``). The tests are skipped when pyspark or Java
is missing.

It is started by ``javakafka.spark_session``, as every in-process session of the suite is: with
Spark's Kafka connector on the class path, which the first session of a process fixes for all
later ones (the connector's tests in ``tests/integration/kafka/java`` may run after this one in
the same worker)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import mq.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "kafka" / "java"))
from javakafka import spark_session  # noqa: E402  (the suite's sessions: javakafka.py)

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install openjdk-17-jre-headless)",
                allow_module_level=True)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    import mq.spark

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = spark_session("mq-tests", "local[2]", **{
        "spark.sql.shuffle.partitions": "2", "spark.sql.warehouse.dir": str(warehouse)})
    mq.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def broker(tmp_path):
    with mq.testing.broker(tmp_path / "data") as b:
        yield b
