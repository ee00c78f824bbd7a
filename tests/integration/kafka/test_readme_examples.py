"""The README's "Kafka clients" examples run as written, with the test broker's address for
127.0.0.1:9092, and print what the README says they print. The code blocks are read from
README.md: the section's first ``sh`` block starts the broker (the test's stands in for it),
then come kcat's ``sh`` block and the confluent-kafka, kafka-python and aiokafka ``python``
blocks, in that order."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from kclients import WAIT

README = Path(__file__).resolve().parents[3] / "README.md"
ADDRESS = "127.0.0.1:9092"


def _examples() -> dict[str, str]:
    section = README.read_text().split("\n## Kafka clients", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL)
    assert [lang for lang, _ in blocks] == ["sh", "sh", "python", "python", "python"], blocks
    assert blocks[0][1].startswith(f"mq broker --kafka-listener {ADDRESS}")
    names = ["kcat", "confluent-kafka", "kafka-python", "aiokafka"]
    return dict(zip(names, (code for _, code in blocks[1:]), strict=True))


def _run(argv: list[str], bootstrap: str) -> str:
    done = subprocess.run([arg.replace(ADDRESS, bootstrap) for arg in argv],
                          capture_output=True, timeout=2 * WAIT, check=False)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    return done.stdout.decode()


def test_kcat_example(kafka_mq, kcat):
    script = _examples()["kcat"]
    assert script.count(ADDRESS) == 3
    out = _run(["bash", "-e", "-o", "pipefail", "-c", script], kafka_mq.bootstrap)
    lines = out.splitlines()
    assert lines[:2] == ['0 order-1 {"qty": 2}', '1 order-2 {"qty": 5}']
    assert " 1 brokers:" in lines and '  topic "orders" with 1 partitions:' in lines


PRINTED = {"confluent-kafka": "payments 0 0 b'order-1' b'{\"amount\": 12}' [('source', b'web')]\n",
           "kafka-python": "invoices 0 0 b'order-1' b'paid'\n",
           "aiokafka": "shipments 0 0 b'order-1' b'packed'\n"}


@pytest.mark.parametrize("client", PRINTED)
def test_python_example(kafka_mq, client):
    printed = PRINTED[client]
    source = _examples()[client]
    assert ADDRESS in source
    assert _run([sys.executable, "-c", source], kafka_mq.bootstrap) == printed
