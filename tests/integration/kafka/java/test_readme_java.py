"""The README's Java, Kafka CLI tools and Spark connector examples (``readme_java``) run as
written, in a directory whose ``tests`` is the repository's, with the test broker's address for
127.0.0.1:9092, and print what the README says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import readme_java as readme
from javakafka import (
    SPARK_CONNECTOR,
    JavaUnavailable,
    client_properties,
    require,
    resolve,
    table,
)

TESTS = Path(__file__).resolve().parents[3]


def _run(argv: list[str], cwd: Path, bootstrap: str, timeout: float = 300) -> str:
    done = subprocess.run([arg.replace(readme.ADDRESS, bootstrap) for arg in argv], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.spark
def test_java_tools_and_spark_examples(kafka_mq, java_kafka, tmp_path):
    try:
        require("mvn")
        resolve("spark", SPARK_CONNECTOR)     # under the cache's lock: ~/.m2 is filled once
    except JavaUnavailable as err:
        pytest.fail(str(err))
    (tmp_path / "tests").symlink_to(TESTS)
    bootstrap = kafka_mq.bootstrap
    _run(["bash", "-e", "-c", readme.FETCH], tmp_path, bootstrap)

    assert readme.JAVA.count(readme.ADDRESS) == 2
    (tmp_path / "Deliveries.java").write_text(readme.JAVA.replace(readme.ADDRESS, bootstrap))
    assert _run(["bash", "-e", "-c", readme.JAVA_RUN], tmp_path, bootstrap) == readme.JAVA_PRINTS

    out = _run(["bash", "-e", "-o", "pipefail", "-c", readme.TOOLS], tmp_path, bootstrap)
    for line in readme.TOOLS_PRINTS:
        assert line in out.splitlines(), out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("GROUP "))
    [group] = table("\n".join(lines[header:header + 2]))
    assert (group["CURRENT-OFFSET"], group["LAG"]) == ("1", "0"), out

    assert _run([sys.executable, "-c", readme.SPARK], tmp_path, bootstrap) == readme.SPARK_PRINTS


@pytest.mark.parametrize("security", ["SASL_SSL"])
def test_sasl_ssl_example(kafka_mq, test_ca, java_kafka, tmp_path):
    """The SASL_SSL example: ``mq users`` and ``mq acls`` over the broker's socket, Kafka's
    tools with alice's properties; Spark's options are those properties (with which
    test_spark_kafka_connector runs)."""
    (tmp_path / "libs").symlink_to(resolve("kafka")[0].parent)     # FETCH's libs/, as above
    shutil.copy(test_ca.cert, tmp_path / "ca.pem")
    env = {**os.environ, "MQ_SOCKET": kafka_mq.socket,
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    script = readme.SASL_SSL.replace(readme.SASL_SSL_ADDRESS, kafka_mq.bootstrap)
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert done.stdout.splitlines()[-1] == readme.SASL_SSL_PRINTS, done.stdout

    options: dict = {}
    exec(readme.SPARK_SASL_SSL, options)
    props = client_properties("SASL_SSL", "alice", "alice-secret", "ca.pem")
    assert options["kafka"] == {"kafka.bootstrap.servers": readme.SASL_SSL_ADDRESS,
                                **{f"kafka.{k}": v for k, v in props.items()}}


def test_the_readme_shows_these_examples_as_they_run():
    """The blocks run above are README.md's, word for word (kept in readme_java.py so that
    the run needs no Markdown parsing)."""
    text = (Path(__file__).resolve().parents[4] / "README.md").read_text()
    for name in ("FETCH", "JAVA", "JAVA_RUN", "TOOLS", "SPARK", "SASL_SSL", "SPARK_SASL_SSL"):
        assert getattr(readme, name).strip() in text, f"README.md lacks readme_java.{name}"
