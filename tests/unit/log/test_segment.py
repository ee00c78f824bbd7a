"""One log segment (``mq.log.segment``), modelled on Kafka's LogSegmentTest."""

from __future__ import annotations

import os
import random
import time

import pytest

from builders import (append_single_records, append_to_segment, batch_bases, make_batch,
                      offsets_of)
from mq.errors import InvalidOffsetError
from mq.log.batch import RecordBatch
from mq.log.config import LogConfig
from mq.log.policy import roll_reason
from mq.log.segment import LogSegment

INT32_MAX = (1 << 31) - 1


@pytest.fixture
def new_segment(tmp_path):
    opened: list[LogSegment] = []

    def factory(base=0, **config) -> LogSegment:
        cfg = LogConfig(**{"index_interval_bytes": 10, "segment_index_bytes": 4096, **config})
        seg = LogSegment(str(tmp_path), base, cfg, now_ms=0)
        opened.append(seg)
        return seg
    yield factory
    for seg in opened:
        if not seg.closed:
            seg.close()


def single_size() -> int:
    return len(make_batch(base_offset=0, timestamp=0, value=b"msg0"))


def read_offsets(seg, offset, max_bytes=100_000, **kw):
    got = seg.read(offset, max_bytes, **kw)
    return None if got is None else offsets_of(got.data)


# --- item 1: reads at the edges and the next offset ---------------------------------------------

def test_read_on_empty_segment_is_none(new_segment):
    seg = new_segment(40)
    assert seg.read(40, 300) is None
    assert seg.next_offset == 40
    assert seg.size == 0


def test_read_beyond_last_offset_is_none(new_segment):
    seg = new_segment(40)
    append_to_segment(seg, make_batch(2, base_offset=50))            # offsets 50, 51
    assert seg.read(52, 200) is None
    assert seg.read(53, 200) is None
    assert read_offsets(seg, 51) == [50, 51]


def test_next_offset_calculation(new_segment):
    seg = new_segment(40)
    assert seg.next_offset == 40
    append_to_segment(seg, make_batch(3, base_offset=50))            # 50, 51, 52
    assert seg.next_offset == 53


# --- items 2-4: reads below the first offset, inside a gap, with limits -------------------------

def test_read_before_first_offset_returns_first_batch(new_segment):
    seg = new_segment(40)
    append_to_segment(seg, make_batch(3, base_offset=50))
    got = seg.read(41, 300)
    assert got.position == 0 and got.segment_base_offset == 40 and got.offset == 41
    assert offsets_of(got.data) == [50, 51, 52]


def test_read_from_gap_returns_next_batch(new_segment):
    seg = new_segment(40)
    append_to_segment(seg, make_batch(2, base_offset=50))            # 50, 51
    append_to_segment(seg, make_batch(2, base_offset=60))            # 60, 61
    assert read_offsets(seg, 55, 200) == [60, 61]
    assert read_offsets(seg, 52, 200) == [60, 61]


def test_read_with_max_bytes_and_no_room(new_segment):
    seg = new_segment(40)
    append_to_segment(seg, make_batch(2, base_offset=50))
    size = seg.size
    append_to_segment(seg, make_batch(2, base_offset=52))
    # max_bytes too small: at least one whole batch unless min_one_batch is off
    got = seg.read(48, 1, min_one_batch=False)
    assert (got.offset, got.segment_base_offset, got.position, got.data) == (48, 40, 0, b"")
    got = seg.read(50, 1)
    assert batch_bases(got.data) == [50] and len(got.data) == size
    got = seg.read(51, 1, min_one_batch=False)
    assert (got.offset, got.position, got.data) == (51, 0, b"")
    # whole batches only: size + 1 bytes still gives one batch
    assert batch_bases(seg.read(50, size + 1).data) == [50]
    assert batch_bases(seg.read(50, 2 * size).data) == [50, 52]
    # max_position at the second batch: only the first; at the first: empty but positioned
    assert batch_bases(seg.read(50, 10_000, max_position=size).data) == [50]
    got = seg.read(52, 10_000, max_position=size)
    assert (got.position, got.data) == (size, b"")
    assert seg.read(54, 10_000) is None
    with pytest.raises(ValueError):
        seg.read(50, -1)


# --- items 5, 6, 8, 9: truncation ---------------------------------------------------------------

def test_truncate_repeatedly(new_segment):
    seg = new_segment(40)
    offset = 40
    for _ in range(30):
        ms1 = make_batch(base_offset=offset, value=b"hello")
        ms2 = make_batch(base_offset=offset + 1, value=b"hello")
        append_to_segment(seg, ms1)
        append_to_segment(seg, ms2)
        assert read_offsets(seg, offset, 10_000) == [offset, offset + 1]
        seg.truncate_to(offset + 1)
        got = seg.read(offset, 10_000)
        assert bytes(got.data) == bytes(ms1)
        assert seg.next_offset == offset + 1
        offset += 1
    assert read_offsets(seg, 40) == list(range(40, 70))


def test_truncate_in_gap_removes_later_batch(new_segment):
    seg = new_segment(40)
    append_to_segment(seg, make_batch(2, base_offset=50))            # 50, 51
    first_size = seg.size
    append_to_segment(seg, make_batch(2, base_offset=60))            # 60, 61
    total = seg.size
    assert seg.truncate_to(55) == total - first_size
    assert seg.size == first_size
    assert seg.next_offset == 52
    assert read_offsets(seg, 50) == [50, 51]
    assert seg.read(52, 1000) is None


def test_truncate_inside_a_batch_removes_the_whole_batch(new_segment):
    seg = new_segment(0)
    append_to_segment(seg, make_batch(5, base_offset=0))
    append_to_segment(seg, make_batch(5, base_offset=5))
    seg.truncate_to(7)
    assert seg.next_offset == 5
    assert read_offsets(seg, 0) == [0, 1, 2, 3, 4]


def test_truncate_empty_segment_resizes_indexes(tmp_path):
    cfg = LogConfig(index_interval_bytes=10, segment_index_bytes=4096, segment_ms=300_000)
    seg = LogSegment(str(tmp_path), 0, cfg, now_ms=0)
    seg.offset_index, seg.time_index                                 # materialise, then close
    seg.close()
    assert os.path.getsize(tmp_path / "00000000000000000000.index") == 0
    reopened = LogSegment(str(tmp_path), 0, cfg, now_ms=0)
    try:
        assert reopened.truncate_to(57) == 0
        assert reopened.offset_index.file_length == 4096
        assert not reopened.offset_index.is_full and not reopened.time_index.is_full
        m = reopened.meta()
        assert not m.offset_index_full and not m.time_index_full
        kw = dict(batch_size=1024, batch_max_timestamp=-1, config=cfg)
        # an empty segment never time-rolls, even long after its creation ...
        assert roll_reason(m, batch_last_offset=100, now_ms=300_001, **kw) is None
        # ... but still rolls when the next offset cannot be stored relative to its base
        assert roll_reason(m, batch_last_offset=INT32_MAX + 200, now_ms=300_001,
                           **kw) == "offset overflow"
    finally:
        reopened.close()


def test_truncate_full_allows_reappending_same_offsets(new_segment):
    seg = new_segment(40)
    batch = make_batch(2, base_offset=40, timestamp=500)
    append_to_segment(seg, batch)
    assert seg.first_batch_timestamp == 500
    before = int(time.time() * 1000)
    removed = seg.truncate_to(0)
    assert removed == len(batch)
    assert seg.size == 0 and seg.next_offset == 40
    assert seg.created_ms >= before                                   # creation time reset
    assert seg.first_batch_timestamp == -1
    assert not seg.offset_index.is_full and not seg.time_index.is_full
    assert seg.read(0, 1024) is None
    append_to_segment(seg, make_batch(2, base_offset=40, timestamp=700))
    assert read_offsets(seg, 40) == [40, 41]
    assert seg.first_batch_timestamp == 700


def test_largest_timestamp_and_next_offset_reloaded_after_truncation(new_segment):
    interval = 2 * single_size() - 1
    seg = new_segment(40, index_interval_bytes=interval)
    append_single_records(seg, range(40, 70))                        # ts = 10 * offset
    assert seg.next_offset == 70
    assert seg.time_index.entries == 30 // 2 - 1
    assert seg.offset_index.entries == 30 // 2 - 1
    seg.truncate_to(41)
    assert seg.time_index.entries == 0 and seg.offset_index.entries == 0
    assert seg.largest_timestamp == 400
    assert seg.next_offset == 41


def test_truncate_keeps_index_entries_below(new_segment):
    interval = 2 * single_size() - 1
    seg = new_segment(40, index_interval_bytes=interval)
    append_single_records(seg, range(40, 70))
    seg.truncate_to(55)
    assert seg.next_offset == 55
    assert seg.offset_index.last_offset < 55
    assert seg.time_index.last_entry[1] < 55
    assert seg.largest_timestamp == 540
    for o in range(40, 55):
        assert read_offsets(seg, o, 1)[0] == o


# --- item 10: timestamp lookup ------------------------------------------------------------------

def test_find_offset_by_timestamp(new_segment):
    seg = new_segment(40, index_interval_bytes=2 * single_size() - 1)
    append_single_records(seg, range(40, 50))                        # ts = 10 * offset
    assert seg.max_timestamp_so_far == 490
    found = {t: seg.find_offset_by_timestamp(t) for t in (420, 421, 430, 431, 491, 401, 399)}
    assert found[420] == (42, 420)                                   # indexed timestamp
    assert found[421] == (43, 430)
    assert found[430] == (43, 430)                                   # un-indexed timestamp
    assert found[431] == (44, 440)
    assert found[491] is None                                        # beyond the last
    assert found[401] == (41, 410)                                   # before the first entry
    assert found[399] == (40, 400)                                   # before the first ts


def test_find_offset_by_timestamp_with_starting_offset_and_unordered_ts(new_segment):
    seg = new_segment(0, index_interval_bytes=1)
    append_to_segment(seg, make_batch(3, base_offset=0, timestamps=[100, 300, 200]))
    append_to_segment(seg, make_batch(2, base_offset=3, timestamps=[150, 400]))
    assert seg.find_offset_by_timestamp(0) == (0, 100)
    assert seg.find_offset_by_timestamp(150) == (1, 300)
    assert seg.find_offset_by_timestamp(250) == (1, 300)
    assert seg.find_offset_by_timestamp(150, starting_offset=2) == (2, 200)
    assert seg.find_offset_by_timestamp(250, starting_offset=2) == (4, 400)
    assert seg.find_offset_by_timestamp(401) is None


# --- item 11: renaming never materialises indexes ------------------------------------------------

def test_change_file_suffixes_creates_no_index_files(new_segment, tmp_path):
    seg = new_segment(40)
    append_to_segment(seg, make_batch(base_offset=40))    # the first append adds no entry
    name = "00000000000000000040"
    assert sorted(os.listdir(tmp_path)) == [f"{name}.log"]
    seg.rename_suffix(".deleted")
    assert sorted(os.listdir(tmp_path)) == [f"{name}.log.deleted"]
    assert seg.log_path == str(tmp_path / f"{name}.log.deleted")
    assert read_offsets(seg, 40) == [40]                   # the open fd still reads
    seg.offset_index, seg.time_index                       # lazy creation under the new suffix
    assert sorted(os.listdir(tmp_path)) == [f"{name}.index.deleted", f"{name}.log.deleted",
                                            f"{name}.timeindex.deleted"]
    seg.rename_suffix("")
    assert sorted(os.listdir(tmp_path)) == [f"{name}.index", f"{name}.log",
                                            f"{name}.timeindex"]
    seg.delete()
    assert os.listdir(tmp_path) == []


# --- items 12, 13: recovery ---------------------------------------------------------------------

def _write_nonsense(path, position, size, rng):
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(rng.randbytes(size))


def test_recovery_fixes_corrupt_offset_index(new_segment):
    seg = new_segment(0)
    append_single_records(seg, range(100))
    before = seg.offset_index.entries
    assert before == 99
    _write_nonsense(seg.offset_index.path, 5, seg.offset_index.file_length - 5,
                    random.Random(1))
    assert seg.recover().bytes_truncated == 0
    assert seg.offset_index.entries == before
    for i in range(100):
        assert read_offsets(seg, i, 1)[0] == i


def test_recovery_fixes_corrupt_time_index(new_segment):
    seg = new_segment(0)
    append_single_records(seg, range(100))
    _write_nonsense(seg.time_index.path, 5, seg.time_index.file_length - 5, random.Random(2))
    seg.recover()
    for i in range(100):
        assert seg.find_offset_by_timestamp(i * 10)[0] == i
        if i < 99:
            assert seg.find_offset_by_timestamp(i * 10 + 1)[0] == i + 1


@pytest.mark.parametrize("seed", range(10))
def test_recovery_with_corrupt_message(tmp_path, seed):
    rng = random.Random(seed)
    seg = LogSegment(str(tmp_path), 0, LogConfig(index_interval_bytes=10,
                                                 segment_index_bytes=4096), now_ms=0)
    try:
        positions = append_single_records(seg, range(20))
        first_bad = rng.randrange(20)
        position = positions[first_bad] + rng.randrange(15)
        original = seg.size
        _write_nonsense(seg.log_path, position, original - position, rng)
        assert seg.recover().bytes_truncated == original - positions[first_bad]
        assert seg.size == positions[first_bad]
        assert seg.next_offset == first_bad
        got = seg.read(0, 1 << 20)
        assert (offsets_of(got.data) if got else []) == list(range(first_bad))
    finally:
        seg.delete()


def test_recover_truncates_torn_tail_and_rebuilds_state(new_segment):
    seg = new_segment(0)
    append_single_records(seg, range(10))
    good = seg.size
    seg.close()
    tail = make_batch(base_offset=10, timestamp=100)
    with open(seg.log_path, "ab") as f:
        f.write(tail[: len(tail) // 2])
    seg = new_segment(0)                                              # reopened after a crash
    assert seg.size == good + len(tail) // 2
    assert seg.recover().bytes_truncated == len(tail) // 2
    assert seg.size == good == os.path.getsize(seg.log_path)
    assert seg.next_offset == 10
    assert seg.max_timestamp_so_far == 90 and seg.offset_of_max_timestamp_so_far == 9
    assert seg.first_batch_timestamp == 0
    # Like Kafka's recover, indexes end trimmed; the log grows the active segment's back.
    assert seg.offset_index.file_length == seg.offset_index.entries * 8
    assert seg.time_index.file_length == seg.time_index.entries * 12
    seg.resize_indexes(seg.config.segment_index_bytes)
    append_to_segment(seg, make_batch(base_offset=10, timestamp=100))
    assert read_offsets(seg, 10) == [10]


def test_recover_rejects_offsets_going_backwards(new_segment):
    seg = new_segment(0)
    append_to_segment(seg, make_batch(2, base_offset=0))
    good = seg.size
    append_to_segment(seg, make_batch(2, base_offset=1))             # overlaps: invalid
    assert seg.recover().bytes_truncated > 0
    assert seg.size == good and seg.next_offset == 2


def test_verify_reports_problems_without_changing_anything(new_segment):
    seg = new_segment(0)
    append_single_records(seg, range(5))
    assert seg.verify() == []
    size = seg.size
    with open(seg.log_path, "r+b") as f:
        f.seek(size - 3)
        f.write(b"\xff\xff\xff")
    problems = seg.verify()
    assert len(problems) == 1 and "CRC" in problems[0]
    assert os.path.getsize(seg.log_path) == size


# --- item 15 and lifecycle: trimming, reopen, indexes -------------------------------------------

def test_indexes_trimmed_on_close_and_reopen_identical(tmp_path):
    cfg = LogConfig(index_interval_bytes=10, segment_index_bytes=4096)
    seg = LogSegment(str(tmp_path), 0, cfg, now_ms=0)
    append_single_records(seg, range(30))
    entries = seg.offset_index.entries
    assert os.path.getsize(seg.offset_index.path) == 4096                # preallocated
    assert os.path.getsize(seg.time_index.path) == 4092                  # 341 * 12
    size, next_offset = seg.size, seg.next_offset
    seg.close()
    seg.close()                                                          # idempotent
    assert os.path.getsize(tmp_path / "00000000000000000000.index") == entries * 8
    assert os.path.getsize(tmp_path / "00000000000000000000.timeindex") == entries * 12
    assert os.path.getsize(tmp_path / "00000000000000000000.log") == size

    again = LogSegment(str(tmp_path), 0, cfg, now_ms=0)
    try:
        again.load_index_state()
        assert again.size == size and again.next_offset == next_offset
        assert again.offset_index.entries == entries
        assert again.time_index.entries == entries
        assert again.time_index.last_entry == (290, 29)
        assert again.max_timestamp_so_far == 290
        assert again.first_batch_timestamp == 0
        for i in range(30):
            assert read_offsets(again, i, 1)[0] == i
            assert again.find_offset_by_timestamp(10 * i) == (i, 10 * i)
    finally:
        again.close()
    assert os.path.getsize(tmp_path / "00000000000000000000.index") == entries * 8


def test_sparse_index_rule(new_segment):
    # First append never gets an entry; an entry's offset is the last offset of its batch and its
    # position the batch start, written when more than index.interval.bytes came before.
    size = len(make_batch(3, base_offset=0, timestamp=0))
    seg = new_segment(0, index_interval_bytes=size)          # entry when > size bytes pending
    positions = [append_to_segment(seg, make_batch(3, base_offset=3 * i, timestamp=10 * i))
                 for i in range(6)]
    # bytes before append k: k*size, reset after each entry -> entries at appends 2 and 4
    assert [seg.offset_index.entry(s) for s in range(seg.offset_index.entries)] == \
        [(8, positions[2]), (14, positions[4])]
    assert [seg.time_index.entry(s) for s in range(seg.time_index.entries)] == \
        [(20, 8), (40, 14)]


def test_segment_without_timestamps_has_empty_time_index(new_segment):
    seg = new_segment(0)
    for o in range(10):
        append_to_segment(seg, make_batch(base_offset=o, timestamp=-1))
    assert seg.offset_index.entries == 9
    assert seg.time_index.entries == 0
    assert seg.max_timestamp_so_far == -1
    seg.close()
    assert os.path.getsize(seg.time_index.path) == 0


def test_append_rejects_offset_that_does_not_fit(new_segment):
    seg = new_segment(100)
    with pytest.raises(InvalidOffsetError):
        append_to_segment(seg, make_batch(base_offset=99))
    with pytest.raises(InvalidOffsetError):
        append_to_segment(seg, make_batch(base_offset=100 + INT32_MAX + 1))
    assert seg.size == 0
    append_to_segment(seg, make_batch(base_offset=100 + INT32_MAX))
    assert seg.next_offset == 100 + INT32_MAX + 1


def test_meta_reflects_segment(new_segment):
    seg = new_segment(10)
    append_to_segment(seg, make_batch(3, base_offset=10, timestamp=700, ts_step=-100))
    m = seg.meta()
    assert (m.base_offset, m.next_offset, m.size_bytes) == (10, 13, seg.size)
    assert m.largest_timestamp == 700 and m.first_batch_timestamp == 700
    assert m.created_ms == 0
    assert not m.offset_index_full and not m.time_index_full


def test_largest_timestamp_falls_back_to_mtime(new_segment):
    seg = new_segment(0)
    append_to_segment(seg, make_batch(base_offset=0, timestamp=-1))
    assert seg.largest_timestamp == int(os.stat(seg.log_path).st_mtime * 1000)


def test_batches_iterates_whole_batches(new_segment):
    seg = new_segment(0)
    append_to_segment(seg, make_batch(2, base_offset=0))
    big = make_batch(base_offset=2, value=os.urandom(3 << 20))       # larger than a read chunk
    append_to_segment(seg, big)
    append_to_segment(seg, make_batch(2, base_offset=3))
    got = list(seg.batches())
    assert [b.base_offset for b in got] == [0, 2, 3]
    assert isinstance(got[1], RecordBatch) and got[1].size == len(big)
    got[1].validate()
    assert [b.base_offset for b in seg.batches(got[1].position)] == [2, 3]
