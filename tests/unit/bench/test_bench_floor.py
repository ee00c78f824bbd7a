"""The 4->4 section's floor (``harness.persisting_floor``: the copies and CRC passes a
persisting queue cannot avoid, timed in one process) and mq's CPU per MiB beside it
(``e2e._multi_cpu``), with the table row that sets one against the other."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench import e2e, harness

MIB = 1 << 20


def test_the_floor_times_each_step_and_leaves_no_file(tmp_path):
    floor = harness.persisting_floor(str(tmp_path), 64 * 1024, total=4 * MIB)
    steps = [floor[k] for k in ("producer", "broker", "consumer")]
    assert all(us > 0 for us in steps) and floor["sum"] == sum(steps)
    assert floor["mb_s"] > 0
    assert list(tmp_path.iterdir()) == []


def test_mq_cpu_per_mib_by_role_is_the_median_over_runs():
    runs = [{"n": 64, "producer_cpu_s_loop": [0.001, 0.002], "consumer_cpu_s_loop": [0.001] * 2,
             "broker_cpu_s": 0.004, "producer_cpu_s": [9.0, 9.0]},
            {"n": 64, "producer_cpu_s_loop": [0.003, 0.003], "consumer_cpu_s_loop": [0.002] * 2,
             "broker_cpu_s": 0.002, "producer_cpu_s": [9.0, 9.0]}]
    cpu = e2e._multi_cpu(runs, 64 * 1024)                  # 64 records of 64 KiB: 4 MiB
    assert cpu == {"producer": 1125.0, "broker": 750.0, "consumer": 750.0, "sum": 2625.0}
    assert e2e._multi_cpu([], 64 * 1024) is None
    del runs[0]["broker_cpu_s"]
    assert e2e._multi_cpu(runs, 64 * 1024) is None


def test_the_floor_row_sets_mq_and_mp_queue_against_it():
    rate = {"median": 1.0, "min": 1.0, "max": 1.0}
    entry = {"rate": {s: rate for s in e2e.MULTI_SIDES},
             "mb_s": {"mq": {"median": 1000.0}, "mq-all": {"median": 700.0},
                      "mp.Queue": {"median": 2000.0}},
             "ratio": {k: {"median": 0.5, "min": 0.4, "max": 0.6}
                       for k in ("mq_vs_mpq", "mq_all_vs_mpq", "all_vs_1")},
             "floor": {"producer": 130.0, "broker": 300.0, "consumer": 110.0, "sum": 540.0,
                       "mb_s": 4000.0},
             "cpu_us_per_mib": {"producer": 600.0, "broker": 800.0, "consumer": 400.0,
                                "sum": 1800.0}}
    rows = e2e.build_table({"multi": {"sizes": {"64KiB": entry}}})
    (floor,) = [r for r in rows if "persisting floor" in r["benchmark"]]
    assert floor["figure"].startswith("4000 MB/s = 540 us CPU/MiB")
    assert floor["ratio"] == ("0.25x (mq/this); 4 x mp.Queue 0.50x; mq used 1800 "
                              "(producers 600, broker 800, consumers 400)")
