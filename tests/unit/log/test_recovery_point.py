"""Recovery bounded by what was not flushed (issue 19): after a crash, open validates only the
batches from the one holding the recovery point on, takes the state below it from the
indexes and the producer snapshot at or below it, and still cuts a torn or invalid batch
after it; a broken index makes it validate everything, as before."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import make_batch
from mq.log import files
from mq.log.builder import BatchBuilder
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.log.manager import LogManager
from mq.log.producer_state import encode_snapshot, snapshot_offsets
from mq.log.txnindex import read_entries

T0 = 1_700_000_000_000
CFG = LogConfig(index_interval_bytes=200)


def crash_copy(plog: PartitionLog, dest) -> str:
    """What a restart after kill -9 finds: every written byte (the page cache), nothing
    closed — the preallocated index files as they are."""
    shutil.copytree(plog.dir, dest)
    return str(dest)


def records(plog) -> list[tuple]:
    return [(r.offset, r.timestamp, bytes(r.value)) for b in plog.batches() for r in b.records()]


def flip(path: str, position: int) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[position] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)


def written_log(tmp_path, flushed: int = 60, unflushed: int = 20, cfg=CFG):
    """A log of ``flushed`` flushed and ``unflushed`` unflushed one-record batches (a spike
    of a timestamp at offset 5, below the recovery point), left open."""
    plog = PartitionLog.open(str(tmp_path / "live" / "t-0"), cfg, now_ms=T0)
    for i in range(flushed + unflushed):
        ts = T0 + 10 * i + (100_000 if i == 5 else 0)
        plog.append(make_batch(timestamp=ts, value=b"v%03d" % i), now_ms=T0)
        if i + 1 == flushed:
            plog.flush()
    return plog


def positions(plog) -> list[int]:
    return [b.position for b in plog.active_segment.batches()]


def test_only_the_batches_after_the_recovery_point_are_validated(tmp_path):
    plog = written_log(tmp_path)
    rp, pos = plog.recovery_point, positions(plog)
    expected, seg_size = records(plog), plog.active_segment.size
    crashed = crash_copy(plog, tmp_path / "crashed" / "t-0")
    full = crash_copy(plog, tmp_path / "full" / "t-0")
    plog.close()
    # Damage a flushed batch (the second: no index entry points at it) that full validation
    # catches — and cuts the log there.
    for d in (crashed, full):
        flip(os.path.join(d, files.segment_name(0, files.LOG_SUFFIX)), pos[1] + 30)
    with PartitionLog.open(full, CFG, recovery_point=0) as again:
        assert again.log_end_offset == 1
    with PartitionLog.open(crashed, CFG, recovery_point=rp) as log:
        report = log.recovery_report
        assert report.bytes_truncated == 0 and report.indexes_rebuilt == 0, report
        assert report.bytes_validated == seg_size - pos[rp]
        assert log.log_end_offset == 80
        assert [r[0] for r in records(log)] == [r[0] for r in expected]
        # What the indexes said below the recovery point still holds: the spike at 5.
        assert log.active_segment.max_timestamp_so_far == T0 + 100_050
        assert log.active_segment.offset_of_max_timestamp_so_far == 5
        assert log.offset_for_timestamp(T0 + 60_000) == (5, T0 + 100_050)


def test_indexes_after_a_partial_recovery_equal_a_full_rebuild(tmp_path):
    plog = written_log(tmp_path)
    rp = plog.recovery_point
    a = crash_copy(plog, tmp_path / "a" / "t-0")
    b = crash_copy(plog, tmp_path / "b" / "t-0")
    plog.close()

    def state(d, point):
        with PartitionLog.open(d, CFG, recovery_point=point) as log:
            seg = log.active_segment
            oi, ti = seg.offset_index, seg.time_index
            return ([oi.entry(i) for i in range(oi.entries)],
                    [ti.entry(i) for i in range(ti.entries)], seg.max_timestamp_so_far,
                    seg.offset_of_max_timestamp_so_far, seg.first_batch_timestamp,
                    seg.bytes_since_last_index_entry, records(log))
    assert state(a, rp) == state(b, 0)


@pytest.mark.parametrize("how", ["torn", "flipped"])
def test_a_damaged_batch_after_the_recovery_point_is_still_cut_off(tmp_path, how):
    plog = written_log(tmp_path)
    rp, pos = plog.recovery_point, positions(plog)
    expected = records(plog)
    crashed = crash_copy(plog, tmp_path / "crashed" / "t-0")
    plog.close()
    path = os.path.join(crashed, files.segment_name(0, files.LOG_SUFFIX))
    bad = rp + 7
    if how == "torn":
        os.truncate(path, pos[bad] + 20)
    else:
        flip(path, pos[bad] + 40)
    with PartitionLog.open(crashed, CFG, recovery_point=rp) as log:
        assert log.recovery_report.bytes_truncated > 0
        assert log.log_end_offset == bad
        assert records(log) == expected[:bad]
        assert log.append(make_batch(timestamp=T0 + 5_000)).first_offset == bad


@pytest.mark.parametrize("how", ["missing", "hole", "entry pointing elsewhere",
                                 "missing time index", "empty time index"])
def test_a_broken_index_makes_recovery_validate_everything(tmp_path, how):
    plog = written_log(tmp_path)
    rp, seg_size = plog.recovery_point, plog.active_segment.size
    oi = plog.active_segment.offset_index
    floor = max(i for i in range(oi.entries) if oi.entry(i)[0] < rp)     # the kept last
    expected = records(plog)
    crashed = crash_copy(plog, tmp_path / "crashed" / "t-0")
    plog.close()
    index = os.path.join(crashed, files.segment_name(0, files.INDEX_SUFFIX))
    timeindex = os.path.join(crashed, files.segment_name(0, files.TIMEINDEX_SUFFIX))
    assert floor >= 3
    if how == "missing":
        os.unlink(index)
    elif how == "hole":                   # a page a power loss left unwritten
        with open(index, "r+b") as f:
            f.seek(8)
            f.write(bytes(8))
    elif how == "entry pointing elsewhere":
        with open(index, "r+b") as f:
            f.seek(floor * 8 + 4)
            pos = int.from_bytes(f.read(4), "big")
            f.seek(floor * 8 + 4)
            f.write((pos + 1).to_bytes(4, "big"))
    elif how == "missing time index":
        os.unlink(timeindex)
    else:
        os.truncate(timeindex, 0)
        os.truncate(timeindex, 4092)
    with PartitionLog.open(crashed, CFG, recovery_point=rp) as log:
        report = log.recovery_report
        assert report.bytes_validated == seg_size, report
        assert report.indexes_rebuilt == 1
        assert records(log) == expected
        assert log.active_segment.max_timestamp_so_far == T0 + 100_050
        for offset in (0, 5, 33, 79):
            assert next(iter(log.batches(offset))).last_offset == offset
        assert log.offset_for_timestamp(T0 + 60_000) == (5, T0 + 100_050)


def test_a_recovery_point_in_an_earlier_segment_keeps_its_flushed_prefix(tmp_path):
    cfg = LogConfig(segment_bytes=1800, index_interval_bytes=200)
    plog = written_log(tmp_path, cfg=cfg)
    assert len(plog.segments) >= 3
    rp = plog.recovery_point
    holding = plog.segments[plog.segment_for(rp)]
    later = sum(s.size for s in plog.segments if s.base_offset > holding.base_offset)
    skipped = next(b.position for b in holding.batches() if b.last_offset >= rp)
    expected = records(plog)
    crashed = crash_copy(plog, tmp_path / "crashed" / "t-0")
    plog.close()
    with PartitionLog.open(crashed, cfg, recovery_point=rp) as log:
        report = log.recovery_report
        assert report.bytes_validated == holding.size - skipped + later, report
        assert report.indexes_rebuilt == 0 and records(log) == expected


# --- producer state: a snapshot near the recovery point, a replay equal to a full one ---------

def producer_batch(pid: int, seq: int, n: int, *, txn: bool) -> bytearray:
    b = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq, is_transactional=txn)
    for i in range(n):
        b.append(T0 + seq + i, None, b"p%d-%d" % (pid, seq + i))
    return b.build()


def producer_facts(plog: PartitionLog) -> tuple:
    """What survives a restart of the producer state (snapshots keep each producer's last
    batch), the open transactions and every segment's .txnindex."""
    txn = [read_entries(os.path.join(plog.dir, files.segment_name(s.base_offset,
                                                                    files.TXNINDEX_SUFFIX)))
           for s in plog.segments]
    return (encode_snapshot(plog.producers.producers.values()),
            plog.producers.open_transactions(), plog.last_stable_offset, txn)


steps = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("marker"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("plain"), st.integers(1, 3))), min_size=5, max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(script=steps, damage_snapshot=st.booleans())
def test_producer_state_after_recovery_equals_a_full_replay(tmp_path_factory, monkeypatch,
                                                             script, damage_snapshot):
    monkeypatch.setattr(PartitionLog, "RECOVERY_SNAPSHOT_OFFSETS", 5)
    root = tmp_path_factory.mktemp("producers")
    cfg = LogConfig(segment_bytes=1500, index_interval_bytes=150)
    mgr = LogManager.open(str(root / "live"), lambda topic: cfg)
    plog = mgr.create("t", 0)
    seqs: dict[int, int] = {}
    in_txn: set[int] = set()
    for step in script:
        if step[0] == "append":
            _, pid, n, txn = step
            txn = txn or pid in in_txn
            plog.append(producer_batch(pid, seqs.get(pid, 0), n, txn=txn), now_ms=T0)
            seqs[pid] = seqs.get(pid, 0) + n
            if txn:
                in_txn.add(pid)
        elif step[0] == "marker" and step[1] in in_txn:
            plog.append_marker(step[1], 0, commit=step[2], now_ms=T0)
            in_txn.discard(step[1])
        elif step[0] == "checkpoint":
            mgr.flush_all()                     # the broker's 1 s flush, then its checkpoint
        elif step[0] == "plain":
            for _ in range(step[1]):
                plog.append(make_batch(timestamp=T0), now_ms=T0)
    rp = plog.recovery_point
    live = producer_facts(plog)
    partial = crash_copy(plog, root / "partial" / "t-0")
    full = crash_copy(plog, root / "full" / "t-0")
    plog.closed = True                          # the crash: nothing more is written
    mgr.closed = True
    os.close(mgr._lock_fd)
    for name in os.listdir(full):               # full: no snapshot, replay from offset 0
        if name.endswith(files.SNAPSHOT_SUFFIX):
            os.unlink(os.path.join(full, name))
    anchors = [o for o in snapshot_offsets(partial) if o <= rp]
    if damage_snapshot and anchors:
        os.truncate(os.path.join(partial, files.segment_name(anchors[-1],
                                                             files.SNAPSHOT_SUFFIX)), 7)
    with PartitionLog.open(full, cfg, recovery_point=0) as a, \
            PartitionLog.open(partial, cfg, recovery_point=rp) as b:
        assert producer_facts(a)[1:] == producer_facts(b)[1:] == live[1:]
        assert producer_facts(a)[0] == producer_facts(b)[0] == live[0]
        assert b.recovery_report.batches_replayed <= a.recovery_report.batches_replayed
        if anchors and not damage_snapshot:
            # The replay started at the newest snapshot at or below the recovery point.
            skipped = sum(1 for batch in a.batches() if batch.last_offset < anchors[-1])
            assert b.recovery_report.batches_replayed == \
                a.recovery_report.batches_replayed - skipped


def test_checkpoints_snapshot_the_producer_state_and_prune_old_snapshots(tmp_path, monkeypatch):
    monkeypatch.setattr(PartitionLog, "RECOVERY_SNAPSHOT_OFFSETS", 10)
    mgr = LogManager.open(str(tmp_path / "data"), lambda topic: CFG)
    plog = mgr.create("t", 0)
    ends = []
    for _ in range(4):
        for i in range(12):
            plog.append(producer_batch(7, plog.log_end_offset, 1, txn=False), now_ms=T0)
        mgr.flush_all()
        ends.append(plog.log_end_offset)
    # Each checkpoint wrote one at the log end; those below the newest at or below the
    # checkpointed recovery point went.
    assert snapshot_offsets(plog.dir) == [ends[-1]]
    plog.append(producer_batch(7, plog.log_end_offset, 1, txn=False), now_ms=T0)
    mgr.checkpoint()                            # too few offsets since: no snapshot
    assert snapshot_offsets(plog.dir) == [ends[-1]]
    mgr.close()


@pytest.mark.parametrize("recovery_point", [1, 2, 60])
def test_a_torn_first_batch_is_cut_whatever_the_recovery_point(tmp_path, recovery_point):
    plog = written_log(tmp_path)
    crashed = crash_copy(plog, tmp_path / "crashed" / "t-0")
    plog.close()
    os.truncate(os.path.join(crashed, files.segment_name(0, files.LOG_SUFFIX)), 20)
    with PartitionLog.open(crashed, CFG, recovery_point=recovery_point) as log:
        assert log.log_end_offset == 0 and log.recovery_report.bytes_truncated == 20
        assert log.append(make_batch(timestamp=T0)).first_offset == 0


def test_a_snapshot_past_a_torn_tail_is_dropped_and_the_state_replayed(tmp_path, monkeypatch):
    """A checkpoint snapshots the log end before its flush is done; a crash that then loses
    part of that unflushed data must not take the state from the snapshot past the cut."""
    monkeypatch.setattr(PartitionLog, "RECOVERY_SNAPSHOT_OFFSETS", 5)
    mgr = LogManager.open(str(tmp_path / "live"), lambda topic: CFG)
    plog = mgr.create("t", 0)
    for seq in range(10):
        plog.append(producer_batch(7, seq, 1, txn=False), now_ms=T0)
    mgr.flush_all()                              # snapshot and recovery point at 10
    cut_at = plog.active_segment.size
    for seq in range(10, 20):
        plog.append(producer_batch(7, seq, 1, txn=False), now_ms=T0)
    mgr.checkpoint()                             # snapshot at 20, recovery point still 10
    assert snapshot_offsets(plog.dir) == [10, 20] and plog.recovery_point == 10
    crashed = crash_copy(plog, tmp_path / "crashed" / "t-0")
    plog.closed = mgr.closed = True
    os.close(mgr._lock_fd)
    os.truncate(os.path.join(crashed, files.segment_name(0, files.LOG_SUFFIX)), cut_at + 100)
    with PartitionLog.open(crashed, CFG, recovery_point=10) as log:
        assert log.log_end_offset == 11
        assert snapshot_offsets(crashed) == [10]
        assert log.producers.producers[7].last_seq == 10
        assert log.append(producer_batch(7, 10, 1, txn=False)).duplicate


def test_pruning_keeps_roll_snapshots_and_the_recovery_points_own(tmp_path, monkeypatch):
    monkeypatch.setattr(PartitionLog, "RECOVERY_SNAPSHOT_OFFSETS", 10)
    cfg = LogConfig(segment_bytes=4000, index_interval_bytes=200)
    mgr = LogManager.open(str(tmp_path / "data"), lambda topic: cfg)
    plog = mgr.create("t", 0)
    for _ in range(12):
        for _ in range(15):
            plog.append(producer_batch(7, plog.log_end_offset, 1, txn=False), now_ms=T0)
        mgr.flush_all()
    for _ in range(15):
        plog.append(producer_batch(7, plog.log_end_offset, 1, txn=False), now_ms=T0)
    mgr.checkpoint()                         # a snapshot above the recovery point
    bases = [s.base_offset for s in plog.segments]
    assert len(bases) > 3
    rp, leo = plog.recovery_point, plog.log_end_offset
    # Every roll's snapshot, the one at the recovery point and the one above it: no other.
    assert snapshot_offsets(plog.dir) == sorted(set(bases[1:]) | {rp, leo})
    mgr.close()


def test_a_time_index_shorter_than_the_offset_index_understates_no_timestamp(tmp_path):
    """After a power loss a time-index page not yet written back reads as zeros: the time
    index ends earlier than the offset index. The batches between its last entry and the
    offset index's still count toward the segment's largest timestamp (retention reads it)."""
    plog = PartitionLog.open(str(tmp_path / "live" / "t-0"), CFG, now_ms=T0)
    for i in range(80):
        ts = T0 + 10 * i + (100_000 if i == 45 else 0)      # the largest, at offset 45
        plog.append(make_batch(timestamp=ts, value=b"v%03d" % i), now_ms=T0)
        if i == 59:
            plog.flush()
    rp = plog.recovery_point
    crashed = crash_copy(plog, tmp_path / "crashed" / "t-0")
    full = crash_copy(plog, tmp_path / "full" / "t-0")
    plog.close()
    timeindex = os.path.join(crashed, files.segment_name(0, files.TIMEINDEX_SUFFIX))
    with PartitionLog.open(full, CFG, recovery_point=0) as log:
        entries = [log.active_segment.time_index.entry(i)
                   for i in range(log.active_segment.time_index.entries)]
        expected = (log.active_segment.max_timestamp_so_far,
                    log.active_segment.offset_of_max_timestamp_so_far)
    assert expected == (T0 + 450 + 100_000, 45)
    kept = next(i for i, (_, offset) in enumerate(entries) if offset >= 40)
    with open(timeindex, "r+b") as f:                   # entries from offset 40 on: zeros
        f.seek(kept * 12)
        f.write(bytes(12 * (len(entries) - kept)))
    with PartitionLog.open(crashed, CFG, recovery_point=rp) as log:
        assert log.recovery_report.indexes_rebuilt == 0      # kept, not validated whole
        seg = log.active_segment
        assert (seg.max_timestamp_so_far, seg.offset_of_max_timestamp_so_far) == expected
