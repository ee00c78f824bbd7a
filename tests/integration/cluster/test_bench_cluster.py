"""``bench.cluster`` runs (a smoke run of its clients section on the tests' Kafka cluster):
its figures are for bench/RESULTS.md, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_bench_cluster_quick(kafka_cluster, tmp_path):
    out = tmp_path / "cluster.json"
    done = subprocess.run([sys.executable, "-m", "bench.cluster", "--quick", "--only", "clients",
                           "--records", "2000", "--bootstrap-server", kafka_cluster.bootstrap,
                           "--out", str(out), "--dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    [run] = results["clients"]["runs"]
    assert set(run) == {"mq", "mq-listener", "kafka"}
    assert all(run[t][side]["n"] == 2000 for t in run for side in ("produce", "consume"))
    assert "mq-listener" in done.stdout
