"""bench.e2e's latency section on real processes: a quick run of ``run_latency`` (every rate,
one repetition of 0.4 s points) over mq's blocking and spin wait strategies (the second broker
started with ``spin_us``), ``multiprocessing.Queue`` and ZeroMQ, and the table built from it.
Only the report's structure is checked, never a timing (bench/RESULTS.md has the figures).
Each broker and ZeroMQ socket lives in the test's own ``tmp_path`` (``-n auto`` safe)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

import mq.testing
from bench import e2e, harness
from bench.mq_workers import MQ_SPIN_US

SYSTEMS = ["mq", "mq-spin", "mp.Queue", "zmq"]


@pytest.fixture
def ctx(tmp_path):
    """bench.e2e's run context in quick mode: the shared broker, the spin broker, mp.Queue
    and ZeroMQ (pyzmq is the bench extra's: installed here as bench.e2e would)."""
    harness.pip_install_missing({"zmq": "pyzmq"})
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(mq.testing.broker(tmp_path / "mq-data"))
        c = e2e.Ctx(argparse.Namespace(quick=True, runs=1), str(tmp_path), broker)
        stack.callback(c.admin.close)
        c.open_spin_broker(stack)
        c.open_peers(["mp.Queue", "zmq"], {"latency"}, stack)
        assert c.systems["mq-spin"].pid != broker.pid and not c.left_out
        yield c


def test_quick_latency_section_reports_each_wait_strategy_against_the_peers(ctx):
    res = e2e.run_latency(ctx)
    assert res["systems"] == SYSTEMS              # mq-cspin and mq-acks0: full runs only
    assert str(MQ_SPIN_US) in res["wait_strategies"]["mq-spin"]
    assert list(res["rates"]) == ["1000", "10000", "50000"]
    for e in res["rates"].values():
        for s in SYSTEMS:
            (run,) = e["runs"][s]
            assert run["received"] == run["n"] > run["warm"] > 0
            assert e[s]["merged"]["p50_us"] > 0
            cpu = e[s]["cpu_us_per_msg"]
            assert cpu["producer"]["median"] > 0 and cpu["consumer"]["median"] > 0
            assert (cpu["server"] is None) == (s in ("mp.Queue", "zmq"))
        assert set(e["p50_ratio_vs_mpq"]) == {"mq", "mq-spin"}
        assert set(e["p50_ratio_vs"]) == {"zmq"}

    rows = {r["benchmark"]: r for r in e2e.build_table({"latency": res})}
    for k in ("1", "10", "50"):
        for s in SYSTEMS:
            row = rows[f"e2e {k} k/s 100 B {e2e.LATENCY_NAMES[s]}"]
            assert "; CPU/msg producer " in row["figure"]
        assert f"e2e {k} k/s 100 B mq (acks=1, linger 0, spin) / mp.Queue" in rows \
            or rows[f"e2e {k} k/s 100 B mp.Queue"]["ratio"] == "- (saturated)"
    assert rows["e2e 1 k/s 100 B mp.Queue"]["goal"] == "mq blocking p50 <= 1.5x"
