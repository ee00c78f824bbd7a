"""``python3 -m bench.aio_clients --quick`` end to end: one broker with a Kafka listener; mq's
threaded clients, mq's asyncio clients and aiokafka producing, consuming and timing records
through it. Only that it ran and what its report holds are checked, never a timing:
``bench/RESULTS.md`` has the figures.

The temp dir (the broker's data dir and socket) is under the test's own ``tmp_path``, so
``-n auto`` is safe.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench import aio_clients


def test_quick_run_reports_every_family(tmp_path, capsys):
    out = tmp_path / "aio_clients.json"
    assert aio_clients.main(["--quick", "--out", str(out), "--dir", str(tmp_path)]) == 0

    res = json.loads(out.read_text())
    assert res["params"]["sections"] == aio_clients.SECTIONS
    assert [p.name for p in tmp_path.iterdir()] == [out.name]   # the temp dir is gone
    families = set(aio_clients.FAMILIES)
    for section in ("produce", "consume"):
        cases = res[section]["cases"]
        assert set(cases) == {label for label, _ in aio_clients.SIZES}
        for case in cases.values():
            assert set(case["runs"]) == families
            assert all(len(runs) == 1 and runs[0]["rate"] > 0 and runs[0]["cpu_us_per_record"] > 0
                       for runs in case["runs"].values())
            assert set(case["ratio"]) == {"aio/threaded", "aio/aiokafka"}
            assert all(r["median"] > 0 for r in case["ratio"].values())
    for family in families:
        merged = res["latency"][family]["merged"]
        assert merged["count"] > 0 and merged["p50_us"] > 0
    assert res["latency"]["aio/aiokafka"]["p50_us"]["median"] > 0
    printed = capsys.readouterr().out
    assert "mq.aio.Producer" in printed and "aiokafka via the Kafka listener" in printed
    assert f"JSON: {out}" in printed
