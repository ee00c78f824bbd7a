"""A short chaos run (``bench/chaos.py``) as a test: a real broker, producer processes with
acks="all" and consumer-group members, through a fixed schedule of kill -9 of each, a clean
broker restart and, as root, full-disk episodes on a tmpfs of the test's own. After every cycle
every acknowledged record must read back from disk at its offset, no offset may be acknowledged
twice, no acknowledged commit may be lost, the broker must stay up and ``mq log check`` must
pass after each clean stop. ``python3 -m bench.chaos`` is the long version.

Each test's work dir, data dir (the tmpfs mount point), socket and shared-memory names derive
from its own ``tmp_path``, so ``-n auto`` is safe.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench import chaos
from bench.chaos_checks import CommitLedger, PartitionScan, Violations, make_value, value_code
from mq.log.builder import build_batch

# --- the bookkeeping alone ----------------------------------------------------------------------

def test_values_map_back_to_producer_and_sequence():
    assert value_code(make_value(3, 17)) == 3 << 32 | 17
    assert value_code(memoryview(make_value(12, 0))) == 12 << 32
    for bad in (None, b"", b"garbage", make_value(1, 2) + b".", b"p1-2", b"p1-x|"):
        assert value_code(bad) == -1


def batch(base: int, producer: int, seqs) -> bytes:
    buf = build_batch([(1_700_000_000_000, None, make_value(producer, s)) for s in seqs],
                      base_offset=base)
    return bytes(buf)


def test_the_disk_reader_follows_appends_and_stops_at_torn_or_zero_tails(tmp_path):
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(batch(0, 1, [0, 1, 2]))
    scan = PartitionScan(str(tmp_path))
    scan.advance()
    assert list(scan.codes) == [1 << 32 | s for s in range(3)]
    nxt = batch(3, 2, [0, 1])
    with open(log, "ab") as f:
        f.write(nxt[:30])                            # half written: wait for the rest
    scan.advance()
    assert len(scan.codes) == 3 and not scan.blocked
    assert "claims" in scan.end()
    with open(log, "ab") as f:
        f.write(nxt[30:] + bytes(200))              # the rest, then a preallocated zero tail
    scan.advance()
    assert scan.get(4) == 2 << 32 | 1 and scan.get(5) is None and not scan.blocked
    assert scan.unchanged()
    # Rolled: the next segment continues the offsets.
    log.write_bytes(log.read_bytes()[:-200])
    (tmp_path / "00000000000000000005.log").write_bytes(batch(5, 3, [7]))
    scan.advance()
    assert scan.get(5) == 3 << 32 | 7 and scan.segments == [0, 5]


def test_the_disk_reader_blocks_at_a_torn_batch_followed_by_more(tmp_path):
    """The bug this run was built for: a failed append leaves part of a batch behind and the
    next append lands after it. Nothing from there on is readable."""
    torn = batch(2, 1, [2, 3, 4])
    (tmp_path / "00000000000000000000.log").write_bytes(
        batch(0, 1, [0, 1]) + torn[:40] + batch(2, 1, [5, 6, 7, 8, 9, 10]))
    scan = PartitionScan(str(tmp_path))
    scan.advance()
    assert len(scan.codes) == 2 and scan.blocked_at == 2
    assert "CRC mismatch" in scan.blocked
    assert not scan.unchanged()                      # a restart rereads it from scratch


def test_the_disk_reader_flags_an_offset_gap_and_a_reused_place(tmp_path):
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(batch(0, 1, [0]) + batch(5, 1, [1]))
    scan = PartitionScan(str(tmp_path))
    scan.advance()
    assert "offset 1 comes next" in scan.blocked
    log.write_bytes(batch(0, 1, [0, 1]))
    scan = PartitionScan(str(tmp_path))
    scan.advance()
    log.write_bytes(batch(0, 1, [0]) + batch(1, 2, [9]))   # truncated and rewritten
    assert not scan.unchanged()


def commit_ledger(tmp_path, lines: list[dict]) -> CommitLedger:
    path = tmp_path / "m1.commits"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    ledger = CommitLedger()
    ledger.read({1: str(path)})
    return ledger


def commits_violations(ledger, answer: int | None, asked: float, answered: float) -> list:
    v = Violations(lambda _msg: None)
    ledger.check({} if answer is None else {0: answer}, asked, answered, v, lambda t: f"t={t}")
    return v.examples["commit-lost"]


def test_the_commit_check_allows_only_the_last_acknowledged_commit_or_a_later_one(tmp_path):
    lines = [{"n": 1, "t0": 1.0, "offsets": [[0, 10]]}, {"n": 1, "t1": 2.0, "ok": True},
             {"n": 2, "t0": 3.0, "offsets": [[0, 20]]}, {"n": 2, "t1": 4.0, "ok": True},
             {"n": 3, "t0": 5.0, "offsets": [[0, 30]]}]          # killed: no outcome
    assert commits_violations(commit_ledger(tmp_path, lines), 20, 6.0, 6.1) == []
    assert commits_violations(commit_ledger(tmp_path, lines), 30, 6.0, 6.1) == []
    went_back = commits_violations(commit_ledger(tmp_path, lines), 10, 6.0, 6.1)
    assert "committed offset 10; acknowledged commit of 20" in went_back[0]
    assert "has no committed offset" in commits_violations(commit_ledger(tmp_path, lines),
                                                           None, 6.0, 6.1)[0]
    # A commit acknowledged after the question was sent may or may not be in the answer.
    assert commits_violations(commit_ledger(tmp_path, lines), 10, 3.5, 3.6) == []
    # A commit started after the answer cannot be in it.
    assert commits_violations(commit_ledger(tmp_path, lines), 30, 4.5, 4.8) != []


# --- short runs ---------------------------------------------------------------------------------

def run(tmp_path, schedule: list[str], disk_full: bool) -> dict:
    messages: list[str] = []
    report = chaos.run(chaos.Options(cycles=len(schedule), seed=1, schedule=schedule,
                                     disk_full=disk_full, dir=str(tmp_path), full_every=3,
                                     stall_timeout=15.0), progress=messages.append)
    assert report["cycles"] == len(schedule)
    assert report["records_acked"] > 0 and report["commits_acked"] > 0
    assert report["violations"] == {}, "\n".join(messages)
    assert report["records_lost"] == 0
    assert report["log_checks"] >= 2               # the clean restart and the end
    return report


def test_kill_9_cycles_lose_nothing(tmp_path):
    report = run(tmp_path, ["kill-broker", "kill-producer", "kill-member", "term-broker",
                            "kill-broker", "kill-member"], disk_full=False)
    assert report["actions"]["kill-broker"] == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="full-disk episodes mount a tmpfs: root only")
def test_full_disk_cycles_lose_nothing(tmp_path):
    schedule = ["disk-full", "kill-broker", "disk-full", "term-broker", "disk-full",
                "kill-producer"]
    report = run(tmp_path, schedule, disk_full=True)
    if report["disk_full"] != "tmpfs":
        pytest.skip(f"no full-disk episodes: {report['disk_full']}")
    assert len(report["episodes"]) == 3
    assert all(e["free_bytes"] < (chaos.FLOOR_BYTES // 2 if e["mode"] == "floor" else 64 << 10)
               for e in report["episodes"])
