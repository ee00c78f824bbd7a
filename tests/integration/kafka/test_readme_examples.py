"""The README's "Kafka clients" examples (readme_snippets.py, kept identical to the README) run
as written, with the test broker's address for 127.0.0.1:9092, and print what the README
promises."""

from __future__ import annotations

import subprocess
import sys

import pytest
import readme_snippets as snippets
from kclients import WAIT

ADDRESS = "127.0.0.1:9092"


def _run(argv: list[str], bootstrap: str) -> str:
    done = subprocess.run([arg.replace(ADDRESS, bootstrap) for arg in argv],
                          capture_output=True, timeout=2 * WAIT, check=False)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    return done.stdout.decode()


def test_kcat_example(kafka_mq, kcat):
    assert snippets.KCAT.count(ADDRESS) == 3
    out = _run(["bash", "-e", "-o", "pipefail", "-c", snippets.KCAT], kafka_mq.bootstrap)
    lines = out.splitlines()
    assert lines[:2] == ['0 order-1 {"qty": 2}', '1 order-2 {"qty": 5}']
    assert " 1 brokers:" in lines and '  topic "orders" with 1 partitions:' in lines


@pytest.mark.parametrize("source, printed", [
    (snippets.CONFLUENT_KAFKA,
     "payments 0 0 b'order-1' b'{\"amount\": 12}' [('source', b'web')]\n"),
    (snippets.KAFKA_PYTHON, "invoices 0 0 b'order-1' b'paid'\n"),
    (snippets.AIOKAFKA, "shipments 0 0 b'order-1' b'packed'\n"),
], ids=["confluent-kafka", "kafka-python", "aiokafka"])
def test_python_example(kafka_mq, source, printed):
    assert ADDRESS in source
    assert _run([sys.executable, "-c", source], kafka_mq.bootstrap) == printed
