"""``python3 -m bench.kafka_wire --quick`` end to end: a broker with a Kafka listener,
librdkafka (confluent-kafka) and mq's own clients producing and consuming through it, the
fan-out and the latency points, and the same against a real Apache Kafka node (Java and Maven
from .ci/run; the jars from Maven Central). Only that it ran and what its report holds are checked, never
a timing: ``bench/RESULTS.md`` has the figures.

The temp dir (the broker's data dir and socket) is under the test's own ``tmp_path``, so
``-n auto`` is safe.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench import kafka_vs, kafka_wire


def test_quick_run_reports_every_section(tmp_path, capsys):
    out = tmp_path / "kafka_wire.json"
    args = kafka_wire.parse_args(["--quick", "--out", str(out), "--dir", str(tmp_path)])
    res = kafka_wire.run(args)

    assert json.loads(out.read_text())["params"]["sections"] == kafka_wire.SECTIONS
    assert list(tmp_path.glob("mq-kafka-*")) == []             # the temp dir is gone
    produce = res["produce"]["cases"]
    assert set(produce) == {f"{label} acks={a}" for label, _ in kafka_wire.SIZES
                            for a in kafka_wire.ACKS}
    for section in (produce, res["consume"]["cases"]):
        for case in section.values():
            assert set(case["runs"]) == set(kafka_wire.SIDES)
            assert all(len(runs) == 1 and runs[0]["rate"] > 0 for runs in case["runs"].values())
            assert case["ratio"]["median"] > 0
    for case in res["fanout"]["cases"].values():
        assert [x["consumers"] for k in kafka_wire.FANOUT for x in case["runs"][k]] == \
            kafka_wire.FANOUT
        assert all(x["bytes_fetched"] == x["consumers"] * case["log_bytes"]
                   for runs in case["runs"].values() for x in runs)
    for side in kafka_wire.LAT_SIDES:
        assert res["latency"][side]["merged"]["count"] > 0
    vs = res["kafka"]                                          # against Apache Kafka
    assert {e["ratio"]["median"] > 0 for e in vs["produce"].values()} == {True}
    assert [set(vs[k]) for k in ("produce", "ingest", "consume", "latency")] == [
        set(kafka_vs.QUICK_PRODUCE), set(kafka_vs.QUICK_INGEST), set(kafka_vs.QUICK_CONSUME),
        {str(r) for r in kafka_vs.QUICK_LAT_RATES}]
    assert vs["at_rest"]["kafka"]["rss_mib"] > 0 and vs["at_rest"]["mq"]["start_s"] > 0
    assert {r["benchmark"].split(",")[0].split(" ")[0] for r in res["table"]} == \
        {"produce", "consume", "broker", "e2e", "vs"}
    printed = capsys.readouterr().out
    assert "Fetch + sendfile" in printed and f"JSON: {out}" in printed


def test_quick_cases_of_the_kafka_section_cover_every_setting():
    """``--quick`` runs half of the section's cases: still every size, acks, producer and
    consumer count, and every pair of produce settings (size, acks, producers)."""
    produce = [case.split() for case in kafka_vs.QUICK_PRODUCE]
    for i, j in itertools.combinations(range(3), 2):
        assert len({(c[i], c[j]) for c in produce}) == 4
    assert {c[0] for c in produce} == {label for label, _ in kafka_vs.SIZES}
    assert {c[2] for c in produce} == {f"x{k}" for k in kafka_vs.PRODUCERS}
    ingest = [case.split() for case in kafka_vs.QUICK_INGEST]
    assert {c[0] for c in ingest} == {label for label, _, _ in kafka_vs.INGEST}
    assert {c[2] for c in ingest} == {f"x{k}" for k in kafka_vs.PRODUCERS}
    consume = [case.split() for case in kafka_vs.QUICK_CONSUME]
    assert {c[0] for c in consume} == {label for label, _ in kafka_vs.SIZES}
    assert {c[1] for c in consume} == {f"x{k}" for k in kafka_vs.CONSUMERS}
    assert set(kafka_vs.QUICK_LAT_RATES) <= set(kafka_vs.LAT_RATES)
