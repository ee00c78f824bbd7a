"""``python3 -m bench.kafka_tls`` on a few MB: mq's broker and a real Apache Kafka node (Java
and Maven from .ci/run, the jars from Maven Central), each with a PLAINTEXT and a SASL_SSL
listener (SCRAM-SHA-256 over TLS 1.3), produced to and fetched from over both by librdkafka.
Only that it ran and what its report holds are checked, never a timing: bench/RESULTS.md has
the figures. The temp dir is under the test's own ``tmp_path`` (``-n auto`` safe)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench import kafka_tls


def test_sasl_ssl_against_plaintext_on_mq_and_kafka(tmp_path, capsys):
    out = tmp_path / "tls.json"
    assert kafka_tls.main(["--mb", "4", "--runs", "1", "--consumers", "1", "--dir",
                           str(tmp_path), "--out", str(out)]) == 0

    res = json.loads(out.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["tls.json"]     # the temp dir is gone
    assert set(res["tls"]) == {"mq", "kafka"}
    assert all(v.startswith("TLSv1.3 ") for v in res["tls"].values())
    for part in (res["produce"], res["fetch"]["1"]):
        assert set(part["runs"]) == {f"{b} {lis}" for b in kafka_tls.BROKERS
                                     for lis in kafka_tls.LISTENERS}
        assert all(r["median"] > 0 for r in part["tls_vs_plain"].values())
        assert set(part["mq_vs_kafka"]) == set(kafka_tls.LISTENERS)
    printed = capsys.readouterr().out
    assert "fetch x1 kafka SASL_SSL/PLAINTEXT:" in printed
