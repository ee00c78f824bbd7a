"""``python3 -m bench.latency_hops`` end to end, blocking and spinning (a short run): every hop
is printed and the broker stops cleanly, leaving no temp dir. Never a timing:
``bench/RESULTS.md`` has the figures.

The temp dir (``TMPDIR``) is the test's own ``tmp_path``, so ``-n auto`` is safe.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench.latency_hops import BROKER_STEPS, HOPS


@pytest.mark.parametrize("spin", [[], ["--broker-spin-us", "100", "--consumer-spin-us", "500"],
                                  ["--broker-steps"], ["--group"]])
def test_a_short_run_prints_every_hop_and_leaves_nothing(tmp_path, spin):
    run = subprocess.run([sys.executable, "-m", "bench.latency_hops", "--n", "300",
                          "--rate", "2000", *spin], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("300 records at 2000/s")
    steps = BROKER_STEPS if "--broker-steps" in spin else []
    assert [line[:34].rstrip() for line in lines[1:]] == HOPS + [s.rstrip() for s in steps]
    assert list(tmp_path.iterdir()) == []
