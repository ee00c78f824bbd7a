"""Offset and time indexes (``mq.log.index``), modelled on Kafka's OffsetIndexTest and
TimeIndexTest: floor lookups, fullness, ordering errors, truncation, reopen, sanity checks,
preallocation and trimming, plus a Hypothesis comparison against a ``bisect`` model."""

from __future__ import annotations

import bisect
import itertools
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mq.errors import CorruptIndexError, IndexFullError, InvalidOffsetError
from mq.log.index import DEFAULT_MAX_INDEX_SIZE, OffsetIndex, TimeIndex, floor_slot

BASE = 45
MAX_ENTRIES = 30


@pytest.fixture
def oidx(tmp_path):
    idx = OffsetIndex(str(tmp_path / "00000000000000000045.index"), BASE, MAX_ENTRIES * 8)
    yield idx
    idx.close()


@pytest.fixture
def tidx(tmp_path):
    idx = TimeIndex(str(tmp_path / "00000000000000000045.timeindex"), BASE, MAX_ENTRIES * 12)
    yield idx
    idx.close()


def _append_time_entries(idx: TimeIndex, n: int) -> None:
    """Kafka's TimeIndexTest.appendEntries: (i*10, base + i*10) for i in 1..n."""
    for i in range(1, n + 1):
        idx.maybe_append(i * 10, i * 10 + BASE)


# --- floor search ------------------------------------------------------------------------------

def test_floor_slot_basics():
    keys = [2, 4, 4, 8]
    assert floor_slot(keys.__getitem__, 0, 5) == -1
    assert floor_slot(keys.__getitem__, 4, 1) == -1
    assert floor_slot(keys.__getitem__, 4, 2) == 0
    assert floor_slot(keys.__getitem__, 4, 3) == 0
    assert floor_slot(keys.__getitem__, 4, 4) == 2      # last of the equal keys
    assert floor_slot(keys.__getitem__, 4, 7) == 2
    assert floor_slot(keys.__getitem__, 4, 100) == 3


# --- offset index ------------------------------------------------------------------------------

def test_offset_lookup_empty_index_returns_base_and_zero(oidx):
    assert oidx.entries == 0
    assert oidx.lookup(BASE) == (BASE, 0)
    assert oidx.lookup(BASE + 1000) == (BASE, 0)
    assert oidx.lookup(0) == (BASE, 0)


def test_offset_lookup_extreme_cases(oidx):
    # Kafka's lookupExtremeCases: fill every slot with (base + i + 1, i).
    for i in range(oidx.max_entries):
        oidx.append(BASE + i + 1, i)
    assert oidx.is_full
    assert oidx.lookup(BASE) == (BASE, 0)                       # below the first entry
    assert oidx.lookup(BASE + MAX_ENTRIES) == (BASE + MAX_ENTRIES, MAX_ENTRIES - 1)
    assert oidx.lookup(BASE + 10_000) == (BASE + MAX_ENTRIES, MAX_ENTRIES - 1)


def test_offset_lookup_is_largest_entry_at_or_below_target(oidx):
    for i in range(10):
        oidx.append(BASE + 2 * i + 1, 100 * i)           # offsets 46, 48, ..., 64
    assert oidx.lookup(BASE) == (BASE, 0)
    assert oidx.lookup(BASE + 1) == (BASE + 1, 0)
    assert oidx.lookup(BASE + 2) == (BASE + 1, 0)
    assert oidx.lookup(BASE + 3) == (BASE + 3, 100)
    assert oidx.lookup(BASE + 18) == (BASE + 17, 800)
    assert oidx.lookup(BASE + 19) == (BASE + 19, 900)
    assert oidx.lookup(BASE + 500) == (BASE + 19, 900)


def test_offset_entry_with_relative_offset_zero_is_valid(oidx):
    oidx.append(BASE, 0)
    assert oidx.entries == 1
    assert oidx.lookup(BASE) == (BASE, 0)
    assert oidx.last_offset == BASE
    oidx.sanity_check()          # Kafka's testSanityLastOffsetEqualToBaseOffset


def test_offset_append_to_full_index_fails(oidx):
    for i in range(MAX_ENTRIES):
        oidx.append(BASE + i, i)
    with pytest.raises(IndexFullError):
        oidx.append(BASE + MAX_ENTRIES, MAX_ENTRIES)
    assert oidx.entries == MAX_ENTRIES


def test_offset_append_out_of_order_fails(oidx):
    oidx.append(51, 0)
    with pytest.raises(InvalidOffsetError):
        oidx.append(50, 1)
    with pytest.raises(InvalidOffsetError):
        oidx.append(51, 1)                                # equal is not larger
    assert oidx.entries == 1
    oidx.append(52, 1)
    assert oidx.last_offset == 52


def test_offset_append_below_base_fails(oidx):
    with pytest.raises(InvalidOffsetError):
        oidx.append(BASE - 1, 0)


def test_fetch_upper_bound_offset(oidx):
    first, second, third, fourth = (BASE, 0), (BASE + 1, 10), (BASE + 2, 23), (BASE + 3, 37)
    assert oidx.fetch_upper_bound_offset(first[1], 5) is None          # empty index
    for offset, position in (first, second, third, fourth):
        oidx.append(offset, position)
    assert oidx.fetch_upper_bound_offset(first[1], 5) == second
    assert oidx.fetch_upper_bound_offset(first[1], 10) == second
    assert oidx.fetch_upper_bound_offset(first[1], 23) == third
    assert oidx.fetch_upper_bound_offset(first[1], 22) == third
    assert oidx.fetch_upper_bound_offset(second[1], 24) == fourth
    assert oidx.fetch_upper_bound_offset(fourth[1], 1) is None
    assert oidx.fetch_upper_bound_offset(first[1], 200) is None
    assert oidx.fetch_upper_bound_offset(second[1], 200) is None


def test_offset_truncate_to(tmp_path):
    # Kafka's OffsetIndexTest.truncate, with base 0 and room for 10 entries.
    with OffsetIndex(str(tmp_path / "0.index"), 0, 10 * 8) as idx:
        for i in range(1, 10):
            idx.append(i, i)
        idx.truncate_to(12)                               # past the end: no-op
        assert idx.lookup(10) == (9, 9)
        assert idx.last_offset == 9 and idx.entries == 9

        idx.append(10, 10)
        idx.truncate_to(10)                               # at an entry: removes it
        assert idx.lookup(10) == (9, 9)
        assert idx.last_offset == 9
        idx.append(10, 10)

        idx.truncate_to(9)                                # removes 9 and everything after
        assert idx.lookup(10) == (8, 8)
        assert idx.last_offset == 8
        idx.append(9, 9)

        idx.truncate_to(5)
        assert idx.lookup(10) == (4, 4)
        assert idx.last_offset == 4
        idx.append(5, 5)

        idx.truncate_to(0)                                # full truncation
        assert idx.entries == 0
        idx.append(0, 0)
        assert idx.entries == 1


def test_offset_truncate_between_entries_keeps_the_lower_one(oidx):
    for i in range(5):
        oidx.append(BASE + 10 * i, 100 * i)              # 45, 55, 65, 75, 85
    oidx.truncate_to(BASE + 25)
    assert oidx.entries == 3
    assert oidx.last_offset == BASE + 20
    oidx.truncate_to(BASE - 5)                            # below the base: nothing left
    assert oidx.entries == 0


def test_offset_reopen_preserves_entries_and_rejects_appends(tmp_path):
    path = str(tmp_path / "00000000000000000045.index")
    idx = OffsetIndex(path, BASE, MAX_ENTRIES * 8)
    idx.append(51, 0)
    idx.append(52, 1)
    idx.close()
    assert os.path.getsize(path) == 16                   # trimmed to its two entries

    # Reopened writable, the trimmed file is full (Kafka's testReopen).
    with OffsetIndex(path, BASE, MAX_ENTRIES * 8) as again:
        assert again.entries == 2
        assert again.lookup(51) == (51, 0)
        assert again.lookup(52) == (52, 1)
        assert again.last_offset == 52
        with pytest.raises(IndexFullError):
            again.append(53, 2)

    ro = OffsetIndex(path, BASE, MAX_ENTRIES * 8, writable=False)
    try:
        assert ro.entries == 2
        assert ro.lookup(100) == (52, 1)
        with pytest.raises(InvalidOffsetError):
            ro.append(53, 2)
    finally:
        ro.close()
    assert os.path.getsize(path) == 16


def test_offset_sanity_check_detects_corruption(tmp_path):
    path = str(tmp_path / "00000000000000000045.index")
    # length not a multiple of 8
    with open(path, "wb") as f:
        f.write(struct.pack(">ii", 1, 0) + b"\x00\x00\x00")
    with OffsetIndex(path, BASE, MAX_ENTRIES * 8) as idx:
        with pytest.raises(CorruptIndexError, match="multiple of 8"):
            idx.sanity_check()
    # last offset below the base offset
    with open(path, "wb") as f:
        f.write(struct.pack(">ii", 1, 0) + struct.pack(">ii", -1, 10))
    with OffsetIndex(path, BASE, MAX_ENTRIES * 8) as idx:
        with pytest.raises(CorruptIndexError, match="below the base offset"):
            idx.sanity_check()
    # a well-formed file passes
    with open(path, "wb") as f:
        f.write(struct.pack(">ii", 1, 0) + struct.pack(">ii", 3, 10))
    with OffsetIndex(path, BASE, MAX_ENTRIES * 8) as idx:
        idx.sanity_check()
        assert idx.lookup(BASE + 3) == (BASE + 3, 10)


def test_offset_preallocation_and_trim_on_close(tmp_path):
    path = str(tmp_path / "0.index")
    idx = OffsetIndex(path, 0, 100)                      # floor(100 / 8) * 8 = 96
    assert os.path.getsize(path) == 96
    assert idx.max_entries == 12 and idx.entries == 0
    for i in range(3):
        idx.append(i + 1, 10 * i)
    idx.close()
    idx.close()                                           # idempotent
    assert os.path.getsize(path) == 24
    with OffsetIndex(path, 0, 100) as again:
        assert again.entries == 3
        assert [again.entry(s) for s in range(3)] == [(1, 0), (2, 10), (3, 20)]
        assert again.resize(100) is True                  # back to the maximum
        assert again.file_length == 96 and again.entries == 3
        again.append(4, 30)
    assert os.path.getsize(path) == 32


def test_default_preallocation_sizes(tmp_path):
    with OffsetIndex(str(tmp_path / "0.index"), 0) as o, \
            TimeIndex(str(tmp_path / "0.timeindex"), 0) as t:
        assert DEFAULT_MAX_INDEX_SIZE == 10 * 1024 * 1024
        assert o.file_length == 10 * 1024 * 1024 and o.max_entries == 1_310_720
        assert t.file_length == 873_813 * 12 and t.max_entries == 873_813
    assert os.path.getsize(tmp_path / "0.index") == 0
    assert os.path.getsize(tmp_path / "0.timeindex") == 0


def test_resize_reports_whether_the_size_changed(oidx, tidx):
    for idx, entry in ((oidx, 8), (tidx, 12)):
        length = idx.file_length
        assert idx.resize(length) is False
        assert idx.resize(length + entry - 1) is False    # rounds down to the same length
        assert idx.resize(length - entry) is True
        assert idx.file_length == length - entry
        assert idx.resize(length) is True
        assert idx.file_length == length


# --- time index --------------------------------------------------------------------------------

def test_time_lookup(tidx):
    assert tidx.lookup(100) == (-1, BASE)                 # empty
    _append_time_entries(tidx, MAX_ENTRIES - 1)
    assert tidx.lookup(9) == (-1, BASE)                   # below the first entry
    assert tidx.lookup(25) == (20, 65)                    # between two entries
    assert tidx.lookup(30) == (30, 75)                    # exactly an entry
    assert tidx.lookup(10**12) == ((MAX_ENTRIES - 1) * 10, (MAX_ENTRIES - 1) * 10 + BASE)


def test_time_entries(tidx):
    _append_time_entries(tidx, MAX_ENTRIES - 1)
    assert [tidx.entry(s) for s in range(4)] == [(10, 55), (20, 65), (30, 75), (40, 85)]


def test_time_index_is_full_one_entry_early(tidx):
    _append_time_entries(tidx, MAX_ENTRIES - 2)
    assert not tidx.is_full
    tidx.maybe_append((MAX_ENTRIES - 1) * 10, (MAX_ENTRIES - 1) * 10 + BASE)
    assert tidx.entries == MAX_ENTRIES - 1 and tidx.is_full
    with pytest.raises(IndexFullError):
        tidx.maybe_append(10_000, 1_000)
    with pytest.raises(InvalidOffsetError):               # backwards offset, even when skipping
        tidx.maybe_append(10_000, (MAX_ENTRIES - 2) * 10, skip_full_check=True)
    tidx.maybe_append(10_000, 1_000, skip_full_check=True)   # the reserved last slot
    assert tidx.entries == MAX_ENTRIES
    assert tidx.last_entry == (10_000, 1_000)
    with pytest.raises(IndexFullError):
        tidx.maybe_append(20_000, 2_000, skip_full_check=True)


def test_time_equal_timestamp_is_skipped_smaller_fails(tidx):
    tidx.maybe_append(100, BASE + 1)
    tidx.maybe_append(100, BASE + 5)                      # equal: silently skipped
    assert tidx.entries == 1 and tidx.last_entry == (100, BASE + 1)
    with pytest.raises(InvalidOffsetError):
        tidx.maybe_append(99, BASE + 6)                   # smaller timestamp
    with pytest.raises(InvalidOffsetError):
        tidx.maybe_append(200, BASE)                      # smaller offset
    tidx.maybe_append(101, BASE + 1)                      # same offset, larger ts: allowed
    assert tidx.entries == 2


def test_time_no_timestamp_never_enters_an_empty_index(tidx):
    # Kafka only appends when the timestamp exceeds the last entry's, which is -1 (NO_TIMESTAMP)
    # for an empty index: "a segment whose records carry no timestamps has an empty time index".
    tidx.maybe_append(-1, BASE + 3)
    assert tidx.entries == 0
    assert tidx.lookup(0) == (-1, BASE)
    tidx.maybe_append(0, BASE + 4)
    assert tidx.entries == 1


def test_time_truncate(tidx):
    _append_time_entries(tidx, MAX_ENTRIES - 1)
    tidx.truncate_to(BASE)
    assert tidx.entries == 0
    _append_time_entries(tidx, MAX_ENTRIES - 1)
    tidx.truncate_to(10 + BASE)                           # at the first entry
    assert tidx.entries == 0
    _append_time_entries(tidx, 5)                         # offsets 55 .. 95
    tidx.truncate_to(80)                                  # between 75 and 85: keep 55, 65, 75
    assert tidx.entries == 3 and tidx.last_entry == (30, 75)
    tidx.truncate_to(10_000)                              # past the end: no-op
    assert tidx.entries == 3


def test_time_truncate_drops_every_entry_at_a_repeated_offset(tidx):
    tidx.maybe_append(10, BASE + 1)
    tidx.maybe_append(20, BASE + 2)
    tidx.maybe_append(30, BASE + 2)
    tidx.truncate_to(BASE + 2)
    assert tidx.entries == 1 and tidx.last_entry == (10, BASE + 1)


def _write_time_entries(path, entries, tail=b""):
    with open(path, "wb") as f:
        for ts, rel in entries:
            f.write(struct.pack(">qi", ts, rel))
        f.write(tail)


@pytest.mark.parametrize("entries, tail, match", [
    ([(10, 1), (20, 2)], b"\x00", "multiple of 12"),
    ([(10, 1), (9, 2)], b"", "below the first timestamp"),
    ([(10, 1), (20, -1)], b"", "below the base offset"),
])
def test_time_sanity_check_detects_corruption(tmp_path, entries, tail, match):
    path = str(tmp_path / "00000000000000000045.timeindex")
    _write_time_entries(path, entries, tail)
    with TimeIndex(path, BASE, MAX_ENTRIES * 12) as idx:
        with pytest.raises(CorruptIndexError, match=match):
            idx.sanity_check()


def test_time_sanity_check_passes_on_good_file(tmp_path, tidx):
    tidx.sanity_check()
    _append_time_entries(tidx, 5)
    tidx.sanity_check()
    path = tidx.path
    tidx.close()
    with TimeIndex(path, BASE, MAX_ENTRIES * 12) as again:
        again.sanity_check()
        assert again.entries == 5
        assert again.lookup(35) == (30, 75)


def test_time_preallocation_and_trim(tmp_path):
    path = str(tmp_path / "0.timeindex")
    idx = TimeIndex(path, 0, 100)                         # floor(100 / 12) * 12 = 96
    assert os.path.getsize(path) == 96 and idx.max_entries == 8
    idx.maybe_append(5, 1)
    idx.maybe_append(7, 3)
    idx.close()
    assert os.path.getsize(path) == 24
    with TimeIndex(path, 0, 100, writable=False) as ro:
        assert ro.entries == 2 and ro.lookup(6) == (5, 1)
        with pytest.raises(InvalidOffsetError):
            ro.maybe_append(9, 4)


# --- Hypothesis: lookups against a bisect model --------------------------------------------------

_counter = itertools.count()

_OFFSET_ENTRIES = st.lists(st.integers(0, 1 << 20), min_size=0, max_size=60, unique=True).map(
    sorted)


@settings(max_examples=100, deadline=None)
@given(rels=_OFFSET_ENTRIES, targets=st.lists(st.integers(-10, (1 << 20) + 10), max_size=30),
       truncate_at=st.integers(-5, (1 << 20) + 5))
def test_offset_index_matches_bisect_model(tmp_path_factory, rels, targets, truncate_at):
    base = 1000
    path = str(tmp_path_factory.getbasetemp() / f"prop-{os.getpid()}-{next(_counter)}.index")
    idx = OffsetIndex(path, base, 64 * 8)
    try:
        positions = [3 * i + 7 for i in range(len(rels))]
        for rel, pos in zip(rels, positions):
            idx.append(base + rel, pos)
        keys = [base + r for r in rels]
        for t in [base + x for x in targets] + keys:
            i = bisect.bisect_right(keys, t) - 1
            expected = (keys[i], positions[i]) if i >= 0 else (base, 0)
            assert idx.lookup(t) == expected
        # fetch_upper_bound_offset: first entry whose position >= start + size
        for start in (0, 7, 50):
            for size in (0, 1, 30):
                j = bisect.bisect_left(positions, start + size)
                want = (keys[j], positions[j]) if j < len(keys) else None
                assert idx.fetch_upper_bound_offset(start, size) == want
        # truncate_to removes entries with offset >= target
        idx.truncate_to(base + truncate_at)
        kept = bisect.bisect_left(keys, base + truncate_at)
        assert idx.entries == kept
        assert [idx.entry(s)[0] for s in range(idx.entries)] == keys[:kept]
    finally:
        idx.delete()


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), max_size=60),
       targets=st.lists(st.integers(-5, 3000), max_size=30))
def test_time_index_matches_bisect_model(tmp_path_factory, steps, targets):
    base = 500
    path = str(tmp_path_factory.getbasetemp() / f"prop-{os.getpid()}-{next(_counter)}.timeidx")
    idx = TimeIndex(path, base, 128 * 12)
    try:
        model: list[tuple[int, int]] = []
        ts = off = 0
        for dts, doff in steps:
            ts, off = ts + dts, off + doff
            idx.maybe_append(ts, base + off)
            if not model or ts > model[-1][0]:
                model.append((ts, base + off))
        assert idx.entries == len(model)
        stamps = [m[0] for m in model]
        for t in targets + stamps:
            i = bisect.bisect_right(stamps, t) - 1
            assert idx.lookup(t) == (model[i] if i >= 0 else (-1, base))
    finally:
        idx.delete()
