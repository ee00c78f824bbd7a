"""Loading a partition directory after a clean or unclean shutdown (Kafka's LogLoaderTest,
checklist items 39-44) and the data directory around it (``mq.log.manager.LogManager``: lock,
checkpoints, shutdown marker, partition create/delete)."""

from __future__ import annotations

import json
import logging
import os
import random
import threading

import pytest

from builders import make_batch
from mq.errors import LogDirLockedError
from mq.log import files
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.log.manager import LogManager

T0 = 1_700_000_000_000


def reopen(path, cfg, **kw) -> PartitionLog:
    return PartitionLog.open(str(path), cfg, now_ms=0, **kw)


def all_records(plog):
    return [(r.offset, r.timestamp, None if r.key is None else bytes(r.key), bytes(r.value))
            for b in plog.batches() for r in b.records()]


def index_state(plog):
    out = []
    for s in plog.segments:
        oi, ti = s.offset_index, s.time_index
        out.append((s.base_offset, s.size, s.next_offset,
                    [oi.entry(i) for i in range(oi.entries)],
                    [ti.entry(i) for i in range(ti.entries)]))
    return out


def write_log(path, cfg, n, *, value_size=10, seed=0):
    rng = random.Random(seed)
    plog = reopen(path, cfg)
    for i in range(n):
        plog.append(make_batch(value=rng.randbytes(value_size), timestamp=T0 + i * 10),
                    now_ms=0)
    return plog


# --- item 39: recovery reproduces the state of a clean shutdown ----------------------------------

def test_log_recovers_to_correct_offset(tmp_path):
    cfg = LogConfig(segment_bytes=7 * 100, index_interval_bytes=3 * 100, segment_index_bytes=4096)
    d = tmp_path / "t-0"
    plog = write_log(d, cfg, 100, value_size=100)
    active = plog.active_segment
    last_index_offset = active.offset_index.last_offset
    num_index_entries = active.offset_index.entries
    leo = plog.log_end_offset
    last_time_entry = (active.largest_timestamp, leo - 1)     # written at close
    num_time_entries = active.time_index.entries + (
        0 if active.time_index.last_entry[1] == leo - 1 else 1)
    plog.close()

    def verify(log, expected_recovery_point):
        assert log.recovery_point == expected_recovery_point
        assert log.log_end_offset == 100
        seg = log.active_segment
        assert seg.offset_index.last_offset == last_index_offset
        assert seg.offset_index.entries == num_index_entries
        assert seg.time_index.last_entry == last_time_entry
        assert seg.time_index.entries == num_time_entries

    log = reopen(d, cfg, recovery_point=leo)
    verify(log, leo)
    log.close()
    log = reopen(d, cfg, recovery_point=10)
    verify(log, 10)                 # not advanced until the data is flushed
    log.flush()
    verify(log, leo)
    log.close()


@pytest.mark.parametrize("recovery_point", [0, 7, 50])
@pytest.mark.parametrize("segment_bytes", [700, 800])     # last batch indexed / not indexed
def test_unclean_recovery_reproduces_every_index_exactly(tmp_path, recovery_point,
                                                         segment_bytes):
    cfg = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=150,
                    segment_index_bytes=4096)
    d = tmp_path / "t-0"
    write_log(d, cfg, 60, value_size=60).close()
    clean = reopen(d, cfg, clean_shutdown=True)
    expected, records = index_state(clean), all_records(clean)
    assert clean.recovery_report.segments_recovered == 0
    clean.close()
    recovered = reopen(d, cfg, recovery_point=recovery_point)
    assert recovered.recovery_report.segments_recovered >= 1
    assert recovered.recovery_report.bytes_truncated == 0
    assert index_state(recovered) == expected
    assert all_records(recovered) == records
    recovered.close()


# --- item 40: missing or garbage index files are rebuilt -----------------------------------------

def _check_every_lookup(log, n):
    assert log.log_end_offset == n
    assert log.segments[0].offset_index.entries > 0, "the index should have been rebuilt"
    assert log.segments[0].time_index.entries > 0, "the time index should have been rebuilt"
    for i in range(n):
        assert next(iter(log.batches(i))).last_offset == i
        assert log.offset_for_timestamp(T0 + i * 10)[0] == i


@pytest.mark.parametrize("clean", [False, True])
def test_deleted_index_files_are_rebuilt(tmp_path, clean):
    cfg = LogConfig(segment_bytes=200, index_interval_bytes=1, segment_index_bytes=1024)
    d = tmp_path / "t-0"
    plog = write_log(d, cfg, 60)
    assert len(plog.segments) > 20
    plog.close()
    for name in os.listdir(d):
        if name.endswith((".index", ".timeindex")):
            os.unlink(d / name)
    log = reopen(d, cfg, clean_shutdown=clean)
    _check_every_lookup(log, 60)
    assert log.recovery_report.indexes_rebuilt == (len(log.segments) if clean else 0)
    log.close()


@pytest.mark.parametrize("clean", [False, True])
def test_garbage_index_files_are_rebuilt(tmp_path, clean):
    cfg = LogConfig(segment_bytes=200, index_interval_bytes=1, segment_index_bytes=1024)
    d = tmp_path / "t-0"
    write_log(d, cfg, 60).close()
    for name in os.listdir(d):
        if name.endswith((".index", ".timeindex")):
            (d / name).write_bytes(b"  ")
    log = reopen(d, cfg, clean_shutdown=clean)
    _check_every_lookup(log, 60)
    log.close()


@pytest.mark.parametrize("clean", [False, True])
def test_reopen_after_segment_index_bytes_was_lowered(tmp_path, clean):
    # The segment holds more index entries than the new segment.index.bytes allows; recovery
    # must still open it (a sparser index is still correct) instead of failing on a full index.
    d = tmp_path / "t-0"
    write_log(d, LogConfig(index_interval_bytes=1), 50).close()
    cfg = LogConfig(index_interval_bytes=1, segment_index_bytes=120)
    log = reopen(d, cfg, recovery_point=0, clean_shutdown=clean)
    assert log.log_end_offset == 50 and len(log.segments) == 1
    assert log.recovery_report.bytes_truncated == 0
    for i in range(50):
        assert next(iter(log.batches(i))).last_offset == i
        assert log.offset_for_timestamp(T0 + i * 10)[0] == i
    log.append(make_batch(timestamp=T0 + 500), now_ms=0)   # the full index makes it roll
    assert [s.base_offset for s in log.segments] == [0, 50]
    log.close()


# --- item 41: random bytes appended to the active .log and .index --------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_corrupt_log_tail_is_recovered(tmp_path, seed):
    rng = random.Random(seed)
    cfg = LogConfig(segment_bytes=1000, index_interval_bytes=1, max_message_bytes=64 * 1024)
    d = tmp_path / "t-0"
    plog = reopen(d, cfg)
    n = 50 + rng.randrange(50)
    for _ in range(n):
        plog.append(make_batch(value=b"test", timestamp=T0), now_ms=0)
    records = all_records(plog)
    active = plog.active_segment
    log_path, index_path = active.log_path, active.offset_index.path
    plog.close()
    with open(log_path, "ab") as f:
        f.write(rng.randbytes(rng.randrange(1024) + 1))
    with open(index_path, "ab") as f:
        f.write(rng.randbytes(rng.randrange(1024) + 1))
    log = reopen(d, cfg, recovery_point=50)
    assert log.log_end_offset == n
    assert all_records(log) == records
    assert log.recovery_report.bytes_truncated > 0
    log.append(make_batch(value=b"after"), now_ms=0)
    assert all_records(log)[-1][0] == n
    log.close()


def test_invalid_batch_in_the_middle_drops_everything_after(tmp_path):
    cfg = LogConfig(segment_bytes=300)
    d = tmp_path / "t-0"
    plog = write_log(d, cfg, 20)
    segs = [(s.base_offset, s.log_path) for s in plog.segments]
    plog.close()
    assert len(segs) >= 4
    base, path = segs[1]
    size = os.path.getsize(path)
    with open(path, "r+b") as f:                        # flip a byte of the 2nd batch
        f.seek(size - 1)
        last = f.read(1)
        f.seek(size - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    log = reopen(d, cfg, recovery_point=0)
    report = log.recovery_report
    assert report.segments_dropped == len(segs) - 2
    assert [s.base_offset for s in log.segments] == [segs[0][0], base]
    assert log.log_end_offset == segs[2][0] - 1         # the segment's last batch is gone
    assert not any(int(n[:20]) > base for n in os.listdir(d) if n[:20].isdigit())
    log.close()


# --- item 42: leftovers, orphan indexes, the clean-shutdown shortcut -----------------------------

def test_leftover_files_are_removed_on_open(tmp_path):
    cfg = LogConfig(segment_bytes=300)
    d = tmp_path / "t-0"
    write_log(d, cfg, 10).close()
    names_before = sorted(os.listdir(d))
    leftovers = ["00000000000000000100.log.deleted", "00000000000000000100.index.deleted",
                 "00000000000000000100.timeindex.deleted", "00000000000000000004.log.cleaned",
                 "partition.metadata.tmp"]
    orphans = ["00000000000000000200.index", "00000000000000000200.timeindex"]
    for name in leftovers + orphans:
        (d / name).write_bytes(b"junk")
    log = reopen(d, cfg, clean_shutdown=True)
    after = set(os.listdir(d))
    assert set(names_before) <= after
    assert not after & set(leftovers + orphans)
    assert sorted(log.recovery_report.leftovers_removed) == sorted(leftovers + orphans)
    assert log.log_end_offset == 10
    log.close()


def test_clean_shutdown_skips_recovery(tmp_path):
    cfg = LogConfig(segment_bytes=300)
    d = tmp_path / "t-0"
    write_log(d, cfg, 20).close()
    log = reopen(d, cfg, clean_shutdown=True)
    nsegs = len(log.segments)
    assert log.recovery_report.segments_recovered == 0
    assert log.recovery_report.indexes_rebuilt == 0
    assert log.recovery_point == log.log_end_offset == 20
    log.close()
    log = reopen(d, cfg)                                 # unclean, recovery point 0: all
    assert log.recovery_report.segments_recovered == nsegs
    assert log.recovery_point == 0
    log.close()
    log = reopen(d, cfg, recovery_point=20)              # unclean: only the last segment
    assert log.recovery_report.segments_recovered == 1
    log.close()


@pytest.mark.parametrize("clean", [True, False])
def test_time_roll_continues_after_reopen(tmp_path, clean):
    cfg = LogConfig(segment_ms=1000, index_interval_bytes=1)
    d = tmp_path / "t-0"
    plog = reopen(d, cfg)
    for i in range(5):
        plog.append(make_batch(timestamp=T0 + i * 100), now_ms=0)
    plog.close()
    log = reopen(d, cfg, clean_shutdown=clean)
    assert log.active_segment.first_batch_timestamp == T0
    assert log.active_segment.max_timestamp_so_far == T0 + 400
    log.append(make_batch(timestamp=T0 + 1000), now_ms=0)      # elapsed 1000: not > 1000
    assert len(log.segments) == 1
    log.append(make_batch(timestamp=T0 + 1001), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 6]
    log.close()


# --- item 43: log end below the checkpointed log start offset ------------------------------------

def test_log_end_less_than_start_after_reopen(tmp_path):
    cfg = LogConfig()
    d = tmp_path / "t-0"
    plog = reopen(d, cfg)
    for i in range(5):
        plog.append(make_batch(value=str(i).encode(), timestamp=T0), now_ms=0)
        plog.roll()
    assert len(plog.segments) == 6
    start = 4
    plog.delete_records_before(start)
    assert plog.log_end_offset > plog.log_start_offset
    victim = plog.segments[1].log_path
    plog.close()
    with open(victim, "w") as f:                          # overwrite segment 1 with garbage
        f.write("corruptRecord")
    log = reopen(d, cfg, log_start_offset=start)
    assert len(log.segments) == 1
    assert log.log_start_offset == log.log_end_offset == start
    assert log.segments[0].base_offset == start
    assert [n for n in os.listdir(d) if n.endswith(".log")] == [f"{start:020d}.log"]
    assert log.append(make_batch()).first_offset == start
    log.close()


# --- item 44 (files only): .swap and .cleaned leftovers ------------------------------------------

def _segment_bytes(offsets):
    return b"".join(bytes(make_batch(base_offset=o, timestamp=T0 + o, value=b"c%d" % o))
                    for o in offsets)


def _three_segments(d, cfg):
    plog = reopen(d, cfg)
    for bounds in ((0, 5), (5, 10), (10, 15)):
        if bounds[0]:
            plog.roll()
        for o in range(*bounds):
            plog.append(make_batch(base_offset=o, timestamp=T0 + o, value=b"v%d" % o),
                        assign_offsets=False, now_ms=0)
    plog.close()


@pytest.mark.parametrize("clean", [True, False])
def test_swap_replaces_the_segments_it_covers(tmp_path, clean):
    cfg = LogConfig()
    d = tmp_path / "t-0"
    _three_segments(d, cfg)
    (d / "00000000000000000000.log.swap").write_bytes(_segment_bytes([1, 3, 9]))
    log = reopen(d, cfg, clean_shutdown=clean)
    assert log.recovery_report.swaps_completed == ["00000000000000000000.log"]
    assert [s.base_offset for s in log.segments] == [0, 10]
    assert [r[0] for r in all_records(log)] == [1, 3, 9, 10, 11, 12, 13, 14]
    assert [r[3] for r in all_records(log)][:3] == [b"c1", b"c3", b"c9"]
    assert not any(n.startswith("00000000000000000005") or n.endswith(".swap")
                   for n in os.listdir(d))
    log.close()


def test_split_swaps_are_all_installed(tmp_path):
    cfg = LogConfig()
    d = tmp_path / "t-0"
    _three_segments(d, cfg)
    (d / "00000000000000000005.log.swap").write_bytes(_segment_bytes([5, 6, 7]))
    (d / "00000000000000000008.log.swap").write_bytes(_segment_bytes([8, 9]))
    log = reopen(d, cfg, clean_shutdown=True)
    assert sorted(log.recovery_report.swaps_completed) == [
        "00000000000000000005.log", "00000000000000000008.log"]
    assert [s.base_offset for s in log.segments] == [0, 5, 8, 10]
    assert [r[3] for r in all_records(log)][5:10] == [b"c5", b"c6", b"c7", b"c8", b"c9"]
    log.close()


def test_swap_at_or_above_smallest_cleaned_is_an_incomplete_split(tmp_path):
    cfg = LogConfig()
    d = tmp_path / "t-0"
    _three_segments(d, cfg)
    (d / "00000000000000000005.log.cleaned").write_bytes(_segment_bytes([5]))
    (d / "00000000000000000005.log.swap").write_bytes(_segment_bytes([5, 6]))
    (d / "00000000000000000007.log.swap").write_bytes(_segment_bytes([7, 9]))
    log = reopen(d, cfg, clean_shutdown=True)
    assert log.recovery_report.swaps_completed == []
    assert sorted(log.recovery_report.leftovers_removed) == [
        "00000000000000000005.log.cleaned", "00000000000000000005.log.swap",
        "00000000000000000007.log.swap"]
    assert [r[3] for r in all_records(log)] == [b"v%d" % o for o in range(15)]
    assert not any(n.endswith((".swap", ".cleaned")) for n in os.listdir(d))
    log.close()


# --- LogManager ---------------------------------------------------------------------------------

WAIT_S = 30


def small(topic: str) -> LogConfig:
    return LogConfig(segment_bytes=300)


def test_second_open_of_a_locked_dir_fails(tmp_path):
    data = str(tmp_path / "data")
    mgr = LogManager.open(data, small, now_ms=0)
    with pytest.raises(LogDirLockedError, match="in use"):
        LogManager.open(data, small, now_ms=0)
    mgr.close()
    mgr.close()                                              # idempotent
    LogManager.open(data, small, now_ms=0).close()          # the lock was released


def test_open_creates_meta_and_removes_marker(tmp_path):
    data = tmp_path / "data"
    mgr = LogManager.open(str(data), small)
    assert not mgr.clean_shutdown
    assert (data / "meta.properties").read_text().startswith("version=0\ncluster.id=")
    assert files.read_checkpoint(str(data / files.RECOVERY_POINT_CHECKPOINT)) == {}
    mgr.close()
    marker = data / files.CLEAN_SHUTDOWN_FILE
    assert json.loads(marker.read_text()) == {"version": 0, "brokerEpoch": 0}
    mgr = LogManager.open(str(data), small)
    assert mgr.clean_shutdown
    assert not marker.exists()                               # deleted at once
    mgr.close()


def test_a_new_data_dir_is_logged_as_new_even_with_partitions_made_at_start(tmp_path, caplog):
    """The broker makes its internal topics before ``finish_loading``: a first start is still
    a new data directory, not a start "after an unclean shutdown"."""
    caplog.set_level(logging.INFO, logger="mq.log")
    mgr = LogManager.open(str(tmp_path / "data"), small, load_all=False)
    mgr.create("__consumer_offsets", 0)
    mgr.finish_loading()
    mgr.close()
    assert "new data directory" in caplog.text and "unclean" not in caplog.text


def test_crash_during_load_counts_as_unclean(tmp_path):
    data = tmp_path / "data"
    mgr = LogManager.open(str(data), small)
    for topic in ("a", "b"):
        mgr.create(topic, 0).append(make_batch())
    mgr.close()
    assert (data / files.CLEAN_SHUTDOWN_FILE).exists()

    def broken(topic):
        if topic == "b":
            raise RuntimeError("simulated crash while loading")
        return small(topic)
    with pytest.raises(RuntimeError):
        LogManager.open(str(data), broken)
    assert not (data / files.CLEAN_SHUTDOWN_FILE).exists()
    mgr = LogManager.open(str(data), small)                  # lock released, unclean now
    assert not mgr.clean_shutdown
    assert mgr.get("b", 0).recovery_report.segments_recovered == 1
    mgr.close()


def test_checkpoints_written_and_honoured(tmp_path):
    data = tmp_path / "data"
    mgr = LogManager.open(str(data), small)
    plog = mgr.create("orders", 2)
    for _ in range(20):
        plog.append(make_batch())
    mgr.create("other", 0)
    plog.delete_records_before(6)
    mgr.close()
    rp = files.read_checkpoint(str(data / files.RECOVERY_POINT_CHECKPOINT))
    lso = files.read_checkpoint(str(data / files.LOG_START_OFFSET_CHECKPOINT))
    assert rp == {("orders", 2): 20, ("other", 0): 0}
    assert lso == {("orders", 2): 6}                          # only above the first base

    mgr = LogManager.open(str(data), small)
    plog = mgr.get("orders", 2)
    assert plog.log_start_offset == 6 and plog.log_end_offset == 20
    assert plog.recovery_point == 20
    assert plog.recovery_report.segments_recovered == 0
    mgr.close()

    # Crash (no marker) after a checkpoint: recovery starts at the checkpointed point.
    os.unlink(data / files.CLEAN_SHUTDOWN_FILE)
    mgr = LogManager.open(str(data), small)
    plog = mgr.get("orders", 2)
    assert not mgr.clean_shutdown
    assert plog.recovery_report.segments_recovered == 1       # only the segment holding 20
    assert plog.log_start_offset == 6
    mgr.close()
    os.unlink(data / files.CLEAN_SHUTDOWN_FILE)
    files.write_checkpoint(str(data / files.RECOVERY_POINT_CHECKPOINT), {("orders", 2): 0})
    mgr = LogManager.open(str(data), small)
    plog = mgr.get("orders", 2)
    assert plog.recovery_report.segments_recovered == len(plog.segments) > 1
    assert plog.recovery_point == 0
    mgr.close()


def test_the_periodic_checkpoint_is_written_off_the_callers_thread(tmp_path, monkeypatch):
    """The broker's loop hands the checkpoint files to a thread of their own; a call while
    the last one is still being written skips (the next is fresher), and close waits for it."""
    data = tmp_path / "data"
    mgr = LogManager.open(str(data), small)
    plog = mgr.create("orders", 0)
    for _ in range(5):
        plog.append(make_batch())
    plog.flush()
    release, writers = threading.Event(), []
    write = files.write_checkpoint

    def held(path, entries):
        writers.append(threading.current_thread().name)
        assert release.wait(WAIT_S)
        write(path, entries)
    monkeypatch.setattr(files, "write_checkpoint", held)
    mgr.checkpoint_in_background()                  # returns with its write held
    mgr.checkpoint_in_background()                  # still being written: skipped
    release.set()
    mgr.close()                                     # waits for it, then its own
    assert writers[:2] == ["mq-checkpoint_0"] * 2 and len(writers) == 4
    assert files.read_checkpoint(str(data / files.RECOVERY_POINT_CHECKPOINT)) == \
        {("orders", 0): 5}


def test_an_older_checkpoint_is_never_written_over_a_newer_one(tmp_path):
    data = tmp_path / "data"
    mgr = LogManager.open(str(data), small)
    plog = mgr.create("orders", 0)
    plog.append(make_batch())
    plog.flush()
    older = mgr._checkpoint_contents()              # taken, its write late (a slow thread)
    plog.append(make_batch())
    plog.flush()
    assert mgr.checkpoint()
    assert mgr._write_checkpoints(*older[:3])       # nothing to do: newer is on disk
    assert files.read_checkpoint(str(data / files.RECOVERY_POINT_CHECKPOINT)) == \
        {("orders", 0): 2}
    mgr.close()


def test_retention_through_manager_updates_checkpoint(tmp_path):
    data = tmp_path / "data"
    cfg = LogConfig(segment_bytes=300, retention_ms=10, file_delete_delay_ms=0)
    mgr = LogManager.open(str(data), lambda t: cfg)
    plog = mgr.create("t", 0)
    for _ in range(10):
        plog.append(make_batch(timestamp=0))
    plog.roll()
    assert mgr.apply_retention(now_ms=1_000) > 0
    assert files.read_checkpoint(str(data / files.LOG_START_OFFSET_CHECKPOINT)) == {}
    assert plog.log_start_offset == 10 == plog.segments[0].base_offset
    mgr.close()


def test_partition_create_and_delete(tmp_path):
    data = tmp_path / "data"
    mgr = LogManager.open(str(data), small)
    plog = mgr.create("my-topic", 3)
    assert mgr.create("my-topic", 3) is plog
    assert plog.dir == str(data / "my-topic-3")
    assert (plog.topic, plog.partition) == ("my-topic", 3)
    plog.append(make_batch())
    with pytest.raises(ValueError, match="invalid topic name"):
        mgr.create("bad name", 0)
    mgr.delete("my-topic", 3)
    mgr.delete("my-topic", 3)                                  # unknown: no-op
    assert mgr.get("my-topic", 3) is None
    assert not any(n.startswith("my-topic") for n in os.listdir(data))
    mgr.create("my-topic", 3)
    assert mgr.get("my-topic", 3).log_end_offset == 0
    mgr.close()


def test_unfinished_partition_delete_is_finished_at_open(tmp_path):
    data = tmp_path / "data"
    mgr = LogManager.open(str(data), small)
    mgr.create("t", 0).append(make_batch())
    mgr.create("t", 1).append(make_batch())
    mgr.close()
    # a crash between the rename and the removal
    os.rename(data / "t-1", data / "t-1.0123456789abcdef0123456789abcdef-delete")
    mgr = LogManager.open(str(data), small)
    assert sorted(mgr.logs) == [("t", 0)]
    assert not (data / "t-1.0123456789abcdef0123456789abcdef-delete").exists()
    assert [p.topic for p in mgr] == ["t"]
    mgr.close()


def test_damaged_checkpoint_falls_back_to_full_recovery(tmp_path):
    """A garbled checkpoint must not make the data dir unopenable: every segment is validated
    instead (recovery point 0), and nothing is lost."""
    from mq.log.manager import LogManager
    from mq.log.builder import BatchBuilder
    with LogManager.open(str(tmp_path)) as logs:
        plog = logs.create("t", 0)
        b = BatchBuilder()
        b.append(1, None, b"kept")
        plog.append(b.build())
    (tmp_path / "recovery-point-offset-checkpoint").write_text("garbage\n")
    with LogManager.open(str(tmp_path)) as logs:
        plog = logs.get("t", 0)
        assert plog.log_end_offset == 1
        assert [bytes(r.value) for b in plog.batches() for r in b.records()] == [b"kept"]
