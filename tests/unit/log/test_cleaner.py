"""The log cleaner (``mq.log.cleaner``): Kafka's LogCleanerTest behaviours that apply without
transactions (checklist items 45 and 47), the pure selection rules, batch layout after
cleaning, and a crash at every file operation of the swap (item 44) followed by an unclean
open — which must give the log as it was before the pass or as it is after it.

Every test owns its ``tmp_path``; time is passed as ``now_ms``, nothing sleeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil

import pytest

from mq.log import cleaner, files
from mq.log.batch import iter_batches
from mq.log.builder import BatchBuilder, control_batch
from mq.log.check import check_partition
from mq.log.cleaner import (
    CleanableRange,
    CleanerConfig,
    clean,
    cleanable_range,
    dirty_ratio,
    filthiest,
    group_segments,
    max_compaction_delay_ms,
    read_cleaner_checkpoint,
    resolve_first_dirty_offset,
    should_clean,
    update_cleaner_checkpoint,
    write_cleaner_checkpoint,
)
from mq.log.compression import NONE, available_codecs, codec_from_name
from mq.log.config import LogConfig
from mq.log.layout import CONTROL_COMMIT, LOG_APPEND_TIME, RECORD_BATCH_OVERHEAD
from mq.log.log import PartitionLog
from mq.log.policy import SegmentMeta
from mq.log.producer_state import ProducerStateManager, replay
from mq.log.reader import PartitionReader

T0 = 1_000_000
# ~8 single-record batches a segment; an index entry every other batch.
CFG = LogConfig(segment_bytes=700, index_interval_bytes=100, segment_index_bytes=4096,
                cleanup_policy="compact", file_delete_delay_ms=0, delete_retention_ms=1000)


@pytest.fixture
def open_log(tmp_path):
    opened: list[PartitionLog] = []

    def factory(config: LogConfig = CFG, name: str = "t-0", **kw) -> PartitionLog:
        plog = PartitionLog.open(str(tmp_path / name), config, now_ms=0, **kw)
        opened.append(plog)
        return plog
    yield factory
    for plog in opened:
        if not plog.closed:
            plog.close()


def _b(x):
    return None if x is None else bytes(x)


def put(plog: PartitionLog, *records, ts: int = T0, compression: int = NONE, **builder):
    """Append one batch of ``(key, value)`` records (``str`` keys/values are encoded)."""
    b = BatchBuilder(compression=compression, **builder)
    for i, (key, value) in enumerate(records):
        b.append(ts + i, key.encode() if isinstance(key, str) else key,
                 value.encode() if isinstance(value, str) else value)
    return plog.append(b.build(), now_ms=ts)


def put_each(plog: PartitionLog, records, ts: int = T0) -> None:
    """One single-record batch per ``(key, value)``, timestamps ts, ts+1, ..."""
    for i, (key, value) in enumerate(records):
        put(plog, (key, value), ts=ts + i)


def rows(plog: PartitionLog) -> list[tuple]:
    """Every record: (offset, timestamp, key, value, headers)."""
    return [(r.offset, r.timestamp, _b(r.key), _b(r.value), [(k, _b(v)) for k, v in r.headers])
            for batch in plog.batches() for r in batch.records()]


def kv(plog: PartitionLog) -> list[tuple]:
    return [(o, k, v) for o, _, k, v, _ in rows(plog)]


def latest(records) -> dict:
    """key -> (offset, value) of the last record of each key among ``(offset, key, value)``."""
    out = {}
    for offset, key, value in records:
        if key is not None:
            out[key] = (offset, value)
    return out


# --- pure selection -------------------------------------------------------------------------------

def meta(base, size, nxt, largest=T0, first=T0):
    return SegmentMeta(base_offset=base, size_bytes=size, next_offset=nxt,
                       largest_timestamp=largest, first_batch_timestamp=first)


SEGS = [meta(0, 100, 10, largest=T0 + 10), meta(10, 200, 20, largest=T0 + 20),
        meta(20, 300, 30, largest=T0 + 30), meta(30, 50, 35, largest=T0 + 40)]   # active: 30


def test_resolve_first_dirty_offset():
    assert resolve_first_dirty_offset(None, 5, 50) == (5, False)
    assert resolve_first_dirty_offset(20, 5, 50) == (20, False)
    assert resolve_first_dirty_offset(50, 5, 50) == (50, False)
    assert resolve_first_dirty_offset(3, 5, 50) == (5, True)        # below the log start
    assert resolve_first_dirty_offset(51, 5, 50) == (5, True)       # past the log end


def test_cleanable_range_ends_at_the_active_segment_and_counts_bytes():
    rng = cleanable_range(SEGS, 10, 30, 35, T0, 0)
    assert (rng.first_dirty_offset, rng.first_uncleanable_offset) == (10, 30)
    assert (rng.clean_bytes, rng.cleanable_bytes) == (100, 500)
    assert rng.dirty_ratio == pytest.approx(500 / 600)
    assert dirty_ratio(0, 0) == 0.0


def test_cleanable_range_last_stable_offset_is_rounded_down_to_its_segment():
    assert cleanable_range(SEGS, 0, 30, 25, T0, 0).first_uncleanable_offset == 20
    assert cleanable_range(SEGS, 0, 30, 20, T0, 0).first_uncleanable_offset == 20
    # Nothing cleanable when the stable offset is in the first dirty segment.
    rng = cleanable_range(SEGS, 20, 30, 22, T0, 0)
    assert (rng.first_uncleanable_offset, rng.cleanable_bytes) == (20, 0)


def test_cleanable_range_min_compaction_lag():
    # now - lag = T0 + 15: segment 10 (largest T0+20) is the first too young to clean.
    assert cleanable_range(SEGS, 0, 30, 35, T0 + 25, 10).first_uncleanable_offset == 10
    assert cleanable_range(SEGS, 0, 30, 35, T0 + 45, 10).first_uncleanable_offset == 30
    # The search starts at the first dirty segment.
    assert cleanable_range(SEGS, 20, 30, 35, T0 + 25, 10).first_uncleanable_offset == 20


def test_cleanable_range_first_dirty_mid_segment_counts_that_segment_as_dirty():
    rng = cleanable_range(SEGS, 15, 30, 35, T0, 0)
    assert (rng.clean_bytes, rng.cleanable_bytes) == (300, 500)


def test_should_clean_by_dirty_ratio_and_max_lag():
    cfg = LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.5)
    assert should_clean(CleanableRange(0, 10, 100, 101), cfg)
    assert not should_clean(CleanableRange(0, 10, 100, 100), cfg)          # ratio 0.5, not >
    assert should_clean(CleanableRange(0, 10, 100, 1), cfg, compaction_delay_ms=5)
    assert not should_clean(CleanableRange(0, 10, 100, 0), cfg, compaction_delay_ms=5)
    assert not should_clean(CleanableRange(0, 10, 0, 100), LogConfig(cleanup_policy="delete"))


def test_max_compaction_delay():
    segs = [meta(0, 1, 10, first=T0), meta(10, 1, 20, first=T0 + 100), meta(20, 1, 30, first=0)]
    assert max_compaction_delay_ms(segs, 0, 20, T0 + 50, 100) == 0
    assert max_compaction_delay_ms(segs, 0, 20, T0 + 150, 100) == 50
    assert max_compaction_delay_ms(segs, 10, 20, T0 + 250, 100) == 50     # from the dirty one
    assert max_compaction_delay_ms(segs, 20, 20, T0 + 250, 100) == 0      # active excluded


def test_filthiest_prefers_overdue_then_dirtiest():
    a, b, c = CleanableRange(0, 1, 10, 90), CleanableRange(0, 1, 50, 50), CleanableRange(0, 1, 1, 0)
    assert filthiest([("a", a, 0), ("b", b, 0), ("c", c, 99)]) == "a"
    assert filthiest([("a", a, 0), ("b", b, 7)]) == "b"
    assert filthiest([("c", c, 0)]) is None


def test_group_segments_by_size_span_and_index():
    segs = [meta(0, 300, 10), meta(10, 300, 20), meta(20, 300, 30), meta(30, 100, 40)]
    grp = {"max_index_bytes": 1 << 20, "index_interval_bytes": 4096}
    assert group_segments(segs, end_offset=40, max_bytes=700, **grp) == [(0, 2), (2, 4)]
    assert group_segments(segs, end_offset=25, max_bytes=700, **grp) == [(0, 2), (2, 3)]
    assert group_segments(segs, end_offset=40, max_bytes=10_000, **grp) == [(0, 4)]
    # Offsets beyond int32 of the group's base start a new group.
    far = [meta(0, 1, 10), meta(10, 1, 1 << 31), meta(1 << 31, 1, (1 << 31) + 5)]
    assert group_segments(far, end_offset=1 << 40, max_bytes=100, **grp) == [(0, 2), (2, 3)]
    # The index must fit: ~1 entry per 61 bytes with index.interval.bytes 0.
    assert group_segments(segs, end_offset=40, max_bytes=10_000, max_index_bytes=100,
                          index_interval_bytes=0) == [(0, 1), (1, 2), (2, 4)]


def test_group_never_ends_with_or_is_only_an_empty_segment():
    segs = [meta(0, 100, 10), meta(10, 0, 10), meta(20, 100, 30), meta(30, 0, 30)]
    assert group_segments(segs, end_offset=40, max_bytes=150, max_index_bytes=1 << 20,
                          index_interval_bytes=4096) == [(0, 1), (1, 3)]
    assert group_segments(segs, end_offset=40, max_bytes=10_000, max_index_bytes=1 << 20,
                          index_interval_bytes=4096) == [(0, 3)]


def test_map_capacity():
    assert CleanerConfig(dedupe_buffer_bytes=1).map_capacity == 1
    assert CleanerConfig(dedupe_buffer_bytes=136_000, dedupe_buffer_load_factor=1.0
                         ).map_capacity == 1000


# --- LogCleanerTest ---------------------------------------------------------------------------

def test_clean_keeps_latest_per_key_and_counts_bytes_read(open_log):
    """Item 45: records whose key has a later offset in the map go, the others stay;
    bytesRead is the sum of the sizes of the segments recopied."""
    plog = open_log()
    written = [(f"k{i % 5}", f"v{i}") for i in range(40)]
    put_each(plog, written)
    plog.roll()
    before = kv(plog)
    sizes = sum(s.size for s in plog.segments[:-1])
    leo = plog.log_end_offset
    stats = clean(plog, T0 + 100)
    assert stats.completed and stats.first_dirty_offset == 0
    assert stats.map_end_offset == 39 and stats.next_dirty_offset == 40
    assert stats.bytes_read == sizes
    assert stats.records_read == 40 and stats.records_kept == 5
    assert stats.bytes_written == sum(s.size for s in plog.segments[:-1])
    assert stats.throughput_mb_s > 0 and stats.elapsed > 0
    after = kv(plog)
    want = latest(before)
    assert after == sorted((o, k, v) for k, (o, v) in want.items())
    assert plog.log_end_offset == leo and plog.log_start_offset == 0
    plog.close()
    assert check_partition(plog.dir).clean


def test_a_one_key_map_still_makes_progress(open_log):
    """A map too small for the dirty section cleans up to where it filled; every pass takes
    at least one batch, so repeated passes compact the whole log."""
    plog = open_log()
    put_each(plog, [(f"k{i % 10}", f"v{i}") for i in range(30)])
    plog.roll()
    one_key = CleanerConfig(dedupe_buffer_bytes=cleaner.BYTES_PER_MAP_ENTRY,
                            dedupe_buffer_load_factor=1.0)
    assert one_key.map_capacity == 1
    stats = clean(plog, T0, one_key)
    # Single-record batches: the first batch is always taken, the second key does not fit.
    assert stats.map_end_offset == 0 and stats.map_entries == 1
    assert [o for o, _, _ in kv(plog)] == list(range(30))     # k0@0 is k0's latest so far
    first_dirty, passes = stats.next_dirty_offset, 1
    while first_dirty < 30:
        stats = clean(plog, T0, one_key, first_dirty_offset=first_dirty)
        assert stats.next_dirty_offset > first_dirty          # progress every pass
        first_dirty, passes = stats.next_dirty_offset, passes + 1
    assert [o for o, _, _ in kv(plog)] == list(range(20, 30))
    assert passes == 30


def test_map_fills_mid_batch(open_log):
    """Keys of the batch that overflowed the map point past the map's end: older records of
    those keys go, the overflowing batch itself stays whole."""
    plog = open_log(LogConfig(cleanup_policy="compact", segment_bytes=10_000,
                              file_delete_delay_ms=0))
    put(plog, ("a", "1"), ("b", "1"))
    put(plog, ("a", "2"), ("c", "2"), ("d", "2"))
    put(plog, ("x", "3"))
    plog.roll()
    three = CleanerConfig(dedupe_buffer_bytes=3 * cleaner.BYTES_PER_MAP_ENTRY,
                          dedupe_buffer_load_factor=1.0)
    stats = clean(plog, T0, three)
    assert stats.map_end_offset == 1 and stats.next_dirty_offset == 2
    assert kv(plog) == [(1, b"b", b"1"), (2, b"a", b"2"), (3, b"c", b"2"), (4, b"d", b"2"),
                        (5, b"x", b"3")]


def test_tombstone_survives_until_its_horizon_then_vanishes(open_log):
    """Item 47: the first pass keeping a tombstone sets the delete horizon (now +
    delete.retention.ms); passes before it keep the tombstone, a pass at/after drops it."""
    plog = open_log()
    put_each(plog, [("a", "1"), ("b", "1"), ("a", None), ("c", "1")] + [("z", "z")] * 6)
    plog.roll()
    now = T0 + 500
    stats = clean(plog, now)
    assert stats.next_delete_horizon_ms == now + CFG.delete_retention_ms
    tomb = [b for b in plog.batches() for r in b.records() if r.value is None]
    assert len(tomb) == 1 and tomb[0].has_delete_horizon
    assert tomb[0].delete_horizon_ms == now + CFG.delete_retention_ms
    assert tomb[0].records()[0].timestamp == T0 + 2 and tomb[0].records()[0].offset == 2
    assert (2, b"a", None) in kv(plog) and (0, b"a", b"1") not in kv(plog)

    first_dirty = stats.next_dirty_offset
    stats = clean(plog, now + CFG.delete_retention_ms - 1, first_dirty_offset=first_dirty)
    assert (2, b"a", None) in kv(plog)                        # horizon not reached
    assert stats.next_delete_horizon_ms == now + CFG.delete_retention_ms
    clean(plog, now + CFG.delete_retention_ms, first_dirty_offset=first_dirty)
    assert [k for _, k, _ in kv(plog)] == [b"b", b"c", b"z"]


def test_tombstone_is_not_dropped_in_the_pass_that_first_sees_it(open_log):
    plog = open_log(LogConfig(cleanup_policy="compact", segment_bytes=700,
                              file_delete_delay_ms=0, delete_retention_ms=0))
    put_each(plog, [("a", "1"), ("a", None)] + [("z", "z")] * 8)
    plog.roll()
    stats = clean(plog, T0 + 10)
    assert (1, b"a", None) in kv(plog)                        # horizon = now, set now
    clean(plog, T0 + 10, first_dirty_offset=stats.next_dirty_offset)
    assert all(k != b"a" for _, k, _ in kv(plog))


def test_unkeyed_records_are_dropped(open_log):
    plog = open_log()
    put_each(plog, [(None, "x"), ("a", "1"), (None, "y")] + [("z", "z")] * 8)
    put(plog, (None, "in active"))
    clean(plog, T0)
    assert [k for _, k, _ in kv(plog)][:2] == [b"a", b"z"]
    assert kv(plog)[-1] == (11, None, b"in active")           # the active segment is untouched


def test_active_segment_is_never_cleaned(open_log):
    plog = open_log(LogConfig(cleanup_policy="compact", file_delete_delay_ms=0))
    put_each(plog, [("a", str(i)) for i in range(20)])
    with open(plog.active_segment.log_path, "rb") as f:
        before = f.read()
    stats = clean(plog, T0)
    assert stats.segments == 0 and stats.first_uncleanable_offset == 0
    with open(plog.active_segment.log_path, "rb") as f:
        assert f.read() == before
    assert len(kv(plog)) == 20


def test_min_compaction_lag_is_respected(open_log):
    cfg = LogConfig(cleanup_policy="compact", segment_bytes=700, file_delete_delay_ms=0,
                    min_compaction_lag_ms=1000)
    plog = open_log(cfg)
    put_each(plog, [("a", str(i)) for i in range(10)], ts=T0)          # old
    plog.roll()
    put_each(plog, [("a", str(i)) for i in range(10, 20)], ts=T0 + 5000)  # young
    plog.roll()
    young_base = plog.segments[_seg_holding(plog, 10)].base_offset
    stats = clean(plog, T0 + 5500)
    assert stats.first_uncleanable_offset == young_base
    offsets = [o for o, _, _ in kv(plog)]
    assert offsets == [young_base - 1] + list(range(young_base, 20))
    stats = clean(plog, T0 + 7000, first_dirty_offset=stats.next_dirty_offset)
    assert [o for o, _, _ in kv(plog)] == [19]


def _seg_holding(plog: PartitionLog, offset: int) -> int:
    return max(i for i, s in enumerate(plog.segments) if s.base_offset <= offset)


def test_dirty_ratio_selection_on_a_real_log(open_log):
    plog = open_log()
    put_each(plog, [(f"k{i % 3}", str(i)) for i in range(30)])
    plog.roll()
    metas = [s.meta() for s in plog.segments]
    rng = cleanable_range(metas, 0, plog.active_segment.base_offset, plog.high_watermark, T0, 0)
    assert rng.dirty_ratio == 1.0 and should_clean(rng, plog.config)
    stats = clean(plog, T0)
    metas = [s.meta() for s in plog.segments]
    rng = cleanable_range(metas, stats.next_dirty_offset, plog.active_segment.base_offset,
                          plog.high_watermark, T0, 0)
    assert rng.cleanable_bytes == 0 and not should_clean(rng, plog.config)
    put_each(plog, [(f"k{i % 3}", str(i)) for i in range(30)], ts=T0 + 100)
    plog.roll()
    metas = [s.meta() for s in plog.segments]
    rng = cleanable_range(metas, stats.next_dirty_offset, plog.active_segment.base_offset,
                          plog.high_watermark, T0, 0)
    assert rng.dirty_ratio > 0.8 and should_clean(rng, plog.config)


def test_offsets_are_preserved_and_gaps_skipped_by_every_reader(open_log):
    plog = open_log()
    put(plog, ("a", "0"), ("b", "1"), ("a", "2"), ("c", "3"))        # one batch, 0..3
    put_each(plog, [("b", "4"), ("d", "5"), ("d", "6")] + [("z", "z")] * 8, ts=T0 + 10)
    plog.roll()
    clean(plog, T0 + 100)
    got = kv(plog)
    assert [o for o, _, _ in got] == [2, 3, 4, 6, 14]
    first = next(plog.batches())
    assert (first.base_offset, first.last_offset, first.records_count) == (0, 3, 2)
    assert [r.offset for r in first.records()] == [2, 3]
    # A fetch from any offset, gap or not, goes on with the next surviving record.
    offsets = [o for o, _, _ in got]
    for offset in range(plog.log_end_offset + 1):
        assert consume(plog, offset) == [o for o in offsets if o >= offset]
    reader = PartitionReader(plog.dir)
    try:
        seen = []
        offset = 0
        while True:
            batches = reader.read(offset)
            if not batches:
                break
            seen += [r.offset for b in batches for r in b.records() if r.offset >= offset]
            offset = batches[-1].next_offset
        assert seen == [o for o, _, _ in got]
    finally:
        reader.close()
    plog.close()
    assert check_partition(plog.dir).clean


def consume(plog: PartitionLog, offset: int) -> list[int]:
    """Offsets a consumer fetching from ``offset`` with ``PartitionLog.read`` sees."""
    out = []
    while offset < plog.log_end_offset:
        batches = list(iter_batches(plog.read(offset, max_bytes=200).data))
        out += [r.offset for b in batches for r in b.records() if r.offset >= offset]
        offset = batches[-1].next_offset
    return out


@pytest.mark.parametrize("codec", [c for c, ok in available_codecs().items() if ok])
def test_compression_and_batch_attributes_are_preserved(open_log, codec):
    code = codec_from_name(codec)
    plog = open_log(LogConfig(cleanup_policy="compact", segment_bytes=2000,
                              file_delete_delay_ms=0))
    put(plog, ("a", "x" * 50), ("b", "y" * 50), ("a", "z" * 50), compression=code,
        producer_id=7, producer_epoch=3, base_sequence=100)
    b = BatchBuilder(compression=code)
    b.append(T0, b"h", b"v", [("hk", b"hv"), ("none", None)])
    plog.append(b.build(), leader_epoch=5)
    put(plog, ("b", "new"))
    plog.roll()
    clean(plog, T0)
    batches = list(plog.batches())
    first = batches[0]
    assert first.compression == code and first.base_offset == 0 and first.last_offset == 2
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (7, 3, 100)
    assert [(_b(r.key), _b(r.value)) for r in first.records()] == [(b"a", b"z" * 50)]
    first.validate()
    # A batch kept whole is copied byte for byte (headers included).
    assert batches[1].compression == code and batches[1].partition_leader_epoch == 5
    assert [(k, _b(v)) for k, v in batches[1].records()[0].headers] == [("hk", b"hv"),
                                                                        ("none", None)]


def test_log_append_time_batches_keep_their_timestamps(open_log):
    cfg = LogConfig(cleanup_policy="compact", segment_bytes=2000, file_delete_delay_ms=0,
                    message_timestamp_type="LogAppendTime")
    plog = open_log(cfg)
    b = BatchBuilder()
    for key in (b"a", b"b", b"a"):
        b.append(5, key, b"v")
    plog.append(b.build(), now_ms=T0 + 77)
    plog.roll()
    clean(plog, T0 + 100)
    batch = next(plog.batches())
    assert batch.timestamp_type == LOG_APPEND_TIME and batch.max_timestamp == T0 + 77
    assert [(r.offset, r.timestamp) for r in batch.records()] == [(1, T0 + 77), (2, T0 + 77)]


def test_a_marker_stays_while_its_data_may_remain_then_gets_a_horizon_then_goes(open_log):
    plog = open_log()
    put(plog, ("a", "1"), producer_id=9, producer_epoch=0, base_sequence=0,
        is_transactional=True)
    plog.append(control_batch(CONTROL_COMMIT, producer_id=9, producer_epoch=0,
                              timestamp_ms=T0))
    put_each(plog, [("a", "2")] + [("z", "z")] * 8)
    plog.roll()
    clean(plog, T0)              # drops the committed record (superseded); its data was seen
    header, marker = list(plog.batches())[:2]
    # The batch stays as a header while producer 9 is known (its sequence survives a replay).
    assert (header.producer_id, header.records_count) == (9, 0)
    assert marker.is_control and marker.base_offset == 1
    assert marker.control_type() == CONTROL_COMMIT and marker.delete_horizon_ms < 0
    plog.producers.expire(now_ms=T0 + 10**9, expiration_ms=1)    # producer 9 expires
    clean(plog, T0 + 1, first_dirty_offset=0)    # the header goes; the marker saw it: stays
    assert next(plog.batches()).is_control
    clean(plog, T0 + 1, first_dirty_offset=0)    # no data of it left: a delete horizon
    marker = next(plog.batches())
    assert marker.is_control and marker.delete_horizon_ms == T0 + 1 + CFG.delete_retention_ms
    clean(plog, T0 + 1 + CFG.delete_retention_ms, first_dirty_offset=0)
    assert not any(b.is_control for b in plog.batches())          # gone after the horizon
    assert latest(kv(plog))[b"a"][1] == b"2"


def _txn(plog, pid, seq, *records, ts=T0):
    return put(plog, *records, ts=ts, producer_id=pid, producer_epoch=0, base_sequence=seq,
               is_transactional=True)


def test_aborted_records_are_dropped_and_never_shadow_committed_ones(open_log):
    plog = open_log()
    put_each(plog, [("a", "committed-a"), ("b", "committed-b")])
    _txn(plog, 7, 0, ("a", "aborted-a"), ("c", "aborted-c"))
    plog.append_marker(7, 0, commit=False, now_ms=T0)
    _txn(plog, 8, 0, ("b", "txn-b"))
    plog.append_marker(8, 0, commit=True, now_ms=T0)
    put_each(plog, [("z", "z")] * 8)
    plog.roll()
    clean(plog, T0)
    values = {k: v for _, k, v in kv(plog)}
    assert values[b"a"] == b"committed-a"        # the aborted "a" did not shadow it
    assert values[b"b"] == b"txn-b" and b"c" not in values
    # The ABORT marker stays (its data was seen this pass) with its .txnindex entry.
    entries = [t for seg in plog.segments for t in seg.txn_index.entries]
    assert [(t.producer_id, t.first_offset) for t in entries] == [(7, 2)]


def test_a_commit_in_a_later_group_survives_the_producers_earlier_abort(open_log):
    """Each group of segments walks with its own transaction filter: a transaction aborted
    in an earlier group must not take the producer's later, committed data with it."""
    plog = open_log()
    _txn(plog, 7, 0, ("a", "aborted-a"))
    plog.append_marker(7, 0, commit=False, now_ms=T0)
    put_each(plog, [(f"x{i}", "x") for i in range(30)])      # several segments, groups
    _txn(plog, 7, 1, ("k", "committed-k"))
    plog.append_marker(7, 0, commit=True, now_ms=T0)
    put_each(plog, [("z", "z")] * 8)
    plog.roll()
    clean(plog, T0)
    values = {k: v for _, k, v in kv(plog)}
    assert values[b"k"] == b"committed-k" and b"a" not in values


def test_nothing_at_or_past_the_last_stable_offset_is_cleaned(open_log):
    plog = open_log()
    _txn(plog, 5, 0, ("k", "open-1"))                 # a transaction left open
    put_each(plog, [("k", str(i)) for i in range(20)])
    plog.roll()
    assert plog.last_stable_offset == 0
    stats = clean(plog, T0)
    assert stats.first_uncleanable_offset == 0 and kv(plog)[0] == (0, b"k", b"open-1")


def test_a_producers_last_batch_stays_as_a_header_for_its_sequence(open_log):
    plog = open_log()
    put(plog, ("a", "1"), producer_id=4, producer_epoch=0, base_sequence=0)
    put_each(plog, [("a", "2")] + [("z", "z")] * 8)
    plog.roll()
    clean(plog, T0)
    first = next(plog.batches())
    assert (first.producer_id, first.base_sequence, first.records_count) == (4, 0, 0)
    reopened = PartitionLog.open(plog.dir, CFG, now_ms=0)   # a replay from the log
    plog.close()
    state = ProducerStateManager()
    replay(state, reopened.segments, 0)
    assert state.producers[4].last_seq == 0
    reopened.close()


def test_emptied_batches_are_dropped_except_the_last_of_a_group(open_log):
    plog = open_log()
    put_each(plog, [("a", str(i)) for i in range(30)])
    plog.roll()
    stats = clean(plog, T0)
    segs = plog.segments[:-1]
    # Each swapped segment ends with the header of its last (emptied) batch.
    for seg in segs[:-1]:
        tail = list(seg.batches())[-1]
        assert tail.records_count == 0 and tail.size == RECORD_BATCH_OVERHEAD
        assert tail.next_offset == plog.segments[plog.segments.index(seg) + 1].base_offset
        tail.validate()
        assert tail.max_timestamp == T0 + tail.last_offset
    # A later pass merges the groups: the inner headers go, the last one stays.
    clean(plog, T0, first_dirty_offset=stats.next_dirty_offset)
    assert len(plog.segments) == 2
    assert [(b.base_offset, b.records_count) for b in plog.batches()] == [(29, 1)]
    plog.close()
    assert check_partition(plog.dir).clean


def test_long_keys_are_mapped_by_digest(open_log):
    plog = open_log()
    long_a, long_b = b"A" * 40, b"A" * 39 + b"B"
    put_each(plog, [(long_a, "1"), (long_b, "1"), (long_a, "2")] + [("z", "z")] * 8)
    plog.roll()
    clean(plog, T0)
    assert kv(plog)[:2] == [(1, long_b, b"1"), (2, long_a, b"2")]


def test_a_clean_log_is_left_byte_identical(open_log):
    plog = open_log()
    put_each(plog, [(f"k{i}", "v") for i in range(8)])
    plog.roll()
    stats = clean(plog, T0)
    assert stats.groups_swapped == 0 and stats.completed
    assert not any(n.endswith(files.CLEANED_SUFFIX) for n in os.listdir(plog.dir))


def test_clean_refuses_a_topic_without_compact(open_log):
    plog = open_log(LogConfig(cleanup_policy="delete"))
    with pytest.raises(ValueError, match="compact"):
        clean(plog, T0)


def test_should_stop_leaves_no_cleaned_files_and_keeps_the_checkpoint(open_log):
    plog = open_log()
    put_each(plog, [("a", str(i)) for i in range(30)])
    plog.roll()
    before = kv(plog)
    calls = iter(range(1000))
    stats = clean(plog, T0, should_stop=lambda: next(calls) > 35)   # inside the recopy
    assert not stats.completed and stats.stopped_reason == "stopped"
    assert stats.next_dirty_offset == stats.first_dirty_offset == 0
    assert not any(n.endswith(files.CLEANED_SUFFIX) for n in os.listdir(plog.dir))
    assert latest(kv(plog)) == latest(before)
    assert clean(plog, T0, should_stop=lambda: True).stopped_reason == "stopped"


def test_swap_refused_when_retention_removed_the_segments(open_log):
    plog = open_log(dataclasses.replace(CFG, cleanup_policy="compact,delete"))
    put_each(plog, [("a", str(i)) for i in range(30)])
    plog.roll()

    def swap(new, old, now_ms):
        plog.delete_records_before(plog.segments[1].base_offset)
        plog.apply_retention(now_ms)             # the first segment goes meanwhile
        plog.replace_segments(new, old, now_ms)
    stats = clean(plog, T0, swap=swap)
    assert not stats.completed and "no longer" in stats.stopped_reason
    assert not any(n.endswith((files.CLEANED_SUFFIX, files.SWAP_SUFFIX))
                   for n in os.listdir(plog.dir))


def test_replace_segments_validates_before_touching_files(open_log):
    plog = open_log()
    put_each(plog, [("a", str(i)) for i in range(20)])
    with pytest.raises(ValueError):
        plog.replace_segments(plog.segments[0], [plog.active_segment])
    with pytest.raises(ValueError):
        plog.replace_segments(plog.segments[1], [plog.segments[0]])   # not a .cleaned one


def test_deleted_files_wait_for_file_delete_delay(open_log):
    cfg = dataclasses.replace(CFG, file_delete_delay_ms=60_000)
    plog = open_log(cfg)
    put_each(plog, [("a", str(i)) for i in range(20)])
    plog.roll()
    stats = clean(plog, T0)
    deleted = sorted(n for n in os.listdir(plog.dir) if n.endswith(files.DELETED_SUFFIX))
    assert deleted and plog.swap_count == stats.groups_swapped
    # The next pass replaces the same base offsets: their older .deleted files go first.
    clean(plog, T0 + 1, first_dirty_offset=stats.next_dirty_offset)
    plog.delete_expired_files(T0 + 1 + 60_000)
    assert not any(n.endswith(files.DELETED_SUFFIX) for n in os.listdir(plog.dir))
    assert [o for o, _, _ in kv(plog)] == [19]


def test_a_reader_mapped_during_the_swap_keeps_consistent_data(open_log):
    plog = open_log()
    put_each(plog, [(f"k{i % 4}", f"v{i}") for i in range(30)])
    plog.roll()
    before = kv(plog)
    reader = PartitionReader(plog.dir)
    try:
        held = reader.read(0, max_bytes=1 << 20)
        held_rows = [(r.offset, _b(r.key), _b(r.value)) for b in held for r in b.records()]
        assert held_rows[:len(before)] == before[:len(held_rows)]
        clean(plog, T0)
        # The swapped files were renamed and unlinked; the maps still hold the old bytes.
        assert [(r.offset, _b(r.key), _b(r.value)) for b in held for r in b.records()] == \
            held_rows
        reader.refresh()                # what a segment-set generation change triggers
        fresh = [(r.offset, _b(r.key), _b(r.value)) for b in reader.read(0) for r in b.records()]
        assert fresh == kv(plog)[:len(fresh)] and len(fresh) < len(held_rows)
    finally:
        reader.close()


# --- cleaner-offset-checkpoint ----------------------------------------------------------------

def test_cleaner_checkpoint_round_trip(tmp_path):
    d = str(tmp_path)
    assert read_cleaner_checkpoint(d) == {}
    write_cleaner_checkpoint(d, {("t", 0): 5, ("u", 3): 9})
    with open(os.path.join(d, cleaner.CLEANER_OFFSET_CHECKPOINT)) as f:
        assert f.read() == "0\n2\nt 0 5\nu 3 9\n"
    assert update_cleaner_checkpoint(d, {("t", 0): 7}, remove=[("u", 3)]) == {("t", 0): 7}
    assert read_cleaner_checkpoint(d) == {("t", 0): 7}
    with open(os.path.join(d, cleaner.CLEANER_OFFSET_CHECKPOINT), "w") as f:
        f.write("1\n0\n")
    assert read_cleaner_checkpoint(d) == {}              # damaged: start from the log start


# --- crash at every file operation of a pass (item 44) -----------------------------------------

class Crash(BaseException):
    """A simulated power cut: not an Exception, so no handler tidies up."""


_CRASH_POINTS = ("rename", "fsync", "fdatasync", "unlink")


@contextlib.contextmanager
def crash_after(n: int | None):
    """Count calls of ``os.rename/fsync/fdatasync/unlink``; raise ``Crash`` instead of the
    call after ``n`` of them (None: count only). Yields the list of calls made."""
    calls: list[str] = []
    saved = {name: getattr(os, name) for name in _CRASH_POINTS}

    def wrap(name):
        real = saved[name]

        def op(*args, **kwargs):
            if n is not None and len(calls) >= n:
                raise Crash(f"crash before {name} #{len(calls)}")
            calls.append(name)
            return real(*args, **kwargs)
        return op
    for name in _CRASH_POINTS:
        setattr(os, name, wrap(name))
    try:
        yield calls
    finally:
        for name, real in saved.items():
            setattr(os, name, real)


def abandon(plog: PartitionLog) -> None:
    """Drop a log as a dead process would: close descriptors, change no file."""
    for seg in plog.segments + [s for _, s in plog._pending_deletes]:
        seg.close_without_index_changes()
    plog.closed = True


def _build(path: str, groups: int) -> None:
    plog = PartitionLog.open(path, CFG, now_ms=0)
    n = 8 * groups + 4
    put_each(plog, [(f"k{i % 6}", None if i % 11 == 5 else f"v{i}") for i in range(n)])
    plog.roll()
    plog.close()


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("recovery_point", ["zero", "end"])
def test_crash_at_every_step_of_a_pass_gives_the_old_or_the_new_log(tmp_path, groups,
                                                                     recovery_point):
    template = str(tmp_path / "template" / "t-0")
    _build(template, groups)
    ref = str(tmp_path / "ref" / "t-0")
    shutil.copytree(template, ref)
    plog = PartitionLog.open(ref, CFG, now_ms=0)
    pre = rows(plog)
    pre_bases = [s.base_offset for s in plog.segments]
    leo = plog.log_end_offset
    with crash_after(None) as calls:
        stats = clean(plog, T0 + 100)
    post = rows(plog)
    post_bases = [s.base_offset for s in plog.segments]
    plog.close()
    assert (stats.groups_swapped == 1 if groups == 1 else stats.groups_swapped > 2)
    assert pre != post
    assert calls.count("rename") >= 3 * 3 * groups      # 3 files x 3 renames per group
    switch = [i for i, name in enumerate(calls) if name == "rename"][2]   # 3 files
    seen = set()
    for k in range(len(calls) + 1):
        work = str(tmp_path / f"crash{k}" / "t-0")
        shutil.copytree(template, work)
        plog = PartitionLog.open(work, CFG, now_ms=0)
        with crash_after(k), contextlib.suppress(Crash):
            clean(plog, T0 + 100)
        abandon(plog)
        plog = PartitionLog.open(work, CFG, clean_shutdown=False, now_ms=0,
                                 recovery_point=0 if recovery_point == "zero" else leo)
        try:
            got = rows(plog)
            assert plog.log_end_offset == leo and plog.log_start_offset == 0
            if groups == 1:
                # Until the last .cleaned -> .swap rename the pass never happened; after it,
                # open finishes it.
                assert got == (pre if k <= switch else post), f"crash after {k} of {calls}"
                seen.add("pre" if got == pre else "post")
            else:
                # Groups are swapped lowest first: a prefix of the log is cleaned.
                bound = _prefix_bound(got, pre, post)
                assert bound is not None, f"crash after {k} of {calls}"
                seen.add(bound)
            assert latest_values(got) == latest_values(pre)
            assert not [n for n in os.listdir(work)
                        if n.endswith((files.CLEANED_SUFFIX, files.SWAP_SUFFIX,
                                       files.DELETED_SUFFIX))]
            assert [s.base_offset for s in plog.segments] in _bases_between(pre_bases,
                                                                           post_bases)
            put(plog, ("new", "record"), ts=T0 + 200)             # appends continue
            assert rows(plog)[-1][0] == leo
        finally:
            plog.close()
        assert check_partition(work).clean, check_partition(work).problems
        shutil.rmtree(os.path.dirname(work))
    assert len(seen) >= 2                      # both outcomes happen


def latest_values(got) -> dict:
    """key -> latest value, keys whose latest record is a tombstone left out (the tombstone
    may be there or, once expired, not)."""
    out = {}
    for _, _, key, value, _ in got:
        if key is not None:
            out[key] = value
    return {k: v for k, v in out.items() if v is not None}


def _prefix_bound(got, pre, post):
    """The offset b such that ``got`` is ``post`` below b and ``pre`` from b, or None."""
    for b in sorted({r[0] for r in pre} | {0, 1 << 62}):
        if got == [r for r in post if r[0] < b] + [r for r in pre if r[0] >= b]:
            return b
    return None


def _bases_between(pre_bases, post_bases):
    """Segment lists a log cleaned up to a group boundary may have."""
    return [sorted({b for b in post_bases if b < cut} | {b for b in pre_bases if b >= cut})
            for cut in [*pre_bases, 1 << 62]]
