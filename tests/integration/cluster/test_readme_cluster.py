"""The README's "Beyond one host" client example runs as written, on mq's Kafka listener and
on the Kafka cluster, with the backend's address for 127.0.0.1:9092, and prints what the
README says it prints."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"
ADDRESS = "127.0.0.1:9092"


def _section() -> str:
    return README.read_text().split("\n## Beyond one host", 1)[1].split("\n## ", 1)[0]


def test_the_client_example(backend):
    section = _section()
    source = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    printed = re.search(r"^prints `(.*?)`", section, re.MULTILINE).group(1)
    assert ADDRESS in source
    # On the shared cluster, no other test's node down meanwhile: the example creates a topic,
    # which a killed controller would time out ("Timed out waiting for controller").
    with backend.cluster.all_up() if backend.cluster else contextlib.nullcontext():
        done = subprocess.run([sys.executable, "-c", source.replace(ADDRESS, backend.bootstrap)],
                              capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed + "\n"
