"""Local-mode Spark for the ``mq.spark`` tests: one SparkSession per xdist worker (a JVM
takes about 10 s to start), ``local[2]``, no UI, two shuffle partitions, the ``mq`` format
registered; a fresh broker per test (``broker``). The tests are skipped when pyspark or Java
is missing.

A process has one SparkContext, and a later ``getOrCreate`` anywhere in the worker gets this
one whatever it asks for: so it carries Spark's Kafka connector too (``spark.jars``, from
``tests/java/spark/pom.xml`` through ``javakafka``), for the connector's tests
(``tests/integration/kafka/java``) that may run after it in the same worker."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

import mq.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "kafka" / "java"))
from javakafka import SPARK_CONNECTOR, resolve  # noqa: E402  (the connector's jars)

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None:
    pytest.skip("Spark needs Java 17 (apt-get install openjdk-17-jre-headless)",
                allow_module_level=True)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession

    import mq.spark

    # Executors' Python workers must import mq from this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    jars = resolve("spark", SPARK_CONNECTOR)
    session = (SparkSession.builder.master("local[2]")
               .appName("mq-tests")
               .config("spark.jars", ",".join(map(str, jars)))
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.warehouse.dir", str(warehouse))
               .config("spark.driver.memory", "1g")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    mq.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def broker(tmp_path):
    with mq.testing.broker(tmp_path / "data") as b:
        yield b
