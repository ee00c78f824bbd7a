"""The client-side read-only view (``mq.log.reader.PartitionReader``) over logs written by
``PartitionLog`` into each test's ``tmp_path``: reads from every offset, segment rolls, the
readable end, remapping a growing segment, segments deleted under a map, a preallocated index
with a zero tail, offset gaps, and map lifetimes."""

from __future__ import annotations

import os

import pytest
from builders import make_batch

from mq.errors import ClosedError, CorruptRecordError, OffsetOutOfRangeError
from mq.log import files
from mq.log.builder import BatchBuilder
from mq.log.compression import GZIP
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.log.reader import PartitionReader
from mq.log.txnindex import AbortedTxnFilter

# Rolls every ~6 batches; an index entry after every batch but a segment's first.
SMALL = LogConfig(segment_bytes=600, index_interval_bytes=0, file_delete_delay_ms=0)


@pytest.fixture
def open_log(tmp_path):
    opened = []

    def factory(config: LogConfig = SMALL, name: str = "t-0") -> PartitionLog:
        plog = PartitionLog.open(str(tmp_path / name), config, now_ms=0)
        opened.append(plog)
        return plog
    yield factory
    for plog in opened:
        plog.close()


@pytest.fixture
def open_reader():
    opened = []

    def factory(path, **kwargs) -> PartitionReader:
        reader = PartitionReader(path, **kwargs)
        opened.append(reader)
        return reader
    yield factory
    for reader in opened:
        reader.close()


def fill(plog: PartitionLog, batches: int, start: int = 0) -> None:
    """``batches`` batches of 1-3 records; record at offset o has value b"v<o>"."""
    for i in range(start, start + batches):
        builder = BatchBuilder()
        for _ in range(i % 3 + 1):
            builder.append(1_000 + plog.log_end_offset, b"k", b"v%d" % (plog.log_end_offset
                                                                         + len(builder)))
        plog.append(builder.build(), now_ms=0)


def end_of(plog: PartitionLog) -> tuple[int, int]:
    """The readable end the broker publishes when the high watermark is the log end."""
    return plog.active_segment.base_offset, plog.active_segment.size


def read_all(reader: PartitionReader, offset: int, end: tuple[int, int] | None,
             max_bytes: int = 1 << 20, **kwargs) -> list[tuple[int, bytes]]:
    """Every record from ``offset`` to the readable end, as the consumer walks it."""
    out = []
    base, position = end if end is not None else (None, None)
    while True:
        batches = reader.read(offset, base, position, max_bytes, **kwargs)
        if not batches:
            return out
        for batch in batches:
            out += [(r.offset, bytes(r.value)) for r in batch.records() if r.offset >= offset]
        offset = batches[-1].next_offset


def expected(start: int, end: int) -> list[tuple[int, bytes]]:
    return [(o, b"v%d" % o) for o in range(start, end)]


# --- reading ------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_bytes", [1, 200, 1 << 20])
def test_reads_from_every_offset_across_segments(open_log, open_reader, max_bytes):
    plog = open_log()
    fill(plog, 40)
    assert len(plog.segments) > 4
    end = end_of(plog)
    leo = plog.log_end_offset
    for offset in range(leo):
        reader = open_reader(plog.dir)           # cold: index lookup + scan
        batches = reader.read(offset, *end, max_bytes)
        assert batches[0].base_offset <= offset <= batches[0].last_offset
        assert read_all(reader, offset, end, max_bytes) == expected(offset, leo)
        reader.close()
    warm = open_reader(plog.dir)                 # warm: one reader, offsets in any order
    for offset in list(range(leo))[::-3] + list(range(leo)):
        batches = warm.read(offset, *end, max_bytes)
        assert batches[0].base_offset <= offset <= batches[0].last_offset
        assert warm.read(leo, *end, max_bytes) == []


def test_batches_are_whole_and_bounded_by_max_bytes(open_log, open_reader):
    plog = open_log(LogConfig(index_interval_bytes=0))
    fill(plog, 10)
    reader = open_reader(plog.dir)
    sizes = [b.size for b in reader.read(0, *end_of(plog))]
    assert sum(sizes) == plog.active_segment.size
    got = reader.read(0, *end_of(plog), sizes[0] + sizes[1] + sizes[2] - 1)
    assert [b.size for b in got] == sizes[:2]
    got = reader.read(0, *end_of(plog), 1)       # a batch larger than max_bytes: still one
    assert len(got) == 1 and got[0].size == sizes[0]
    for batch in reader.read(0, *end_of(plog)):
        batch.validate()                          # CRC of a zero-copy slice of the map
        assert isinstance(batch.buffer, memoryview)


def test_a_read_cut_by_max_bytes_never_skips_the_rest_of_a_segment(open_log, open_reader):
    """A small batch, a big one, a roll, a small one: a budget that takes the first small
    batch but not the big one returns the small batch alone, not the next segment's batch
    (that skipped the big batch: a consumer crossing a roll lost the rest of the segment)."""
    plog = open_log(LogConfig(segment_bytes=700, index_interval_bytes=0))
    for value in (b"a" * 10, b"b" * 500, b"c" * 10):
        builder = BatchBuilder()
        builder.append(1_000, None, value)
        plog.append(builder.build(), now_ms=0)
    assert [s.base_offset for s in plog.segments] == [0, 2]
    reader = open_reader(plog.dir)
    sizes = [b.size for b in reader.read(0, *end_of(plog), 1 << 20)]
    assert len(sizes) == 3
    budget = sizes[0] + sizes[2]                 # room for the small ones, not the big one
    assert [b.base_offset for b in reader.read(0, *end_of(plog), budget)] == [0]
    assert [b.base_offset for b in reader.read(0, None, None, budget)] == [0]
    got = []
    offset = 0
    while batches := reader.read(offset, *end_of(plog), budget):
        got += [b.base_offset for b in batches]
        offset = batches[-1].next_offset
    assert got == [0, 1, 2]


def test_compressed_batches(open_log, open_reader):
    plog = open_log()
    for i in range(5):
        builder = BatchBuilder(compression=GZIP)
        for j in range(4):
            builder.append(1000, None, b"v%d" % (i * 4 + j))
        plog.append(builder.build(), now_ms=0)
    reader = open_reader(plog.dir)
    assert read_all(reader, 6, end_of(plog)) == expected(6, 20)


# --- the readable end ---------------------------------------------------------------------------

def test_never_reads_at_or_past_the_readable_end(open_log, open_reader):
    plog = open_log(LogConfig(index_interval_bytes=0))
    fill(plog, 12)
    reader = open_reader(plog.dir)
    positions = [(b.position, b.base_offset) for b in reader.read(0, *end_of(plog))]
    base = plog.active_segment.base_offset
    for position, first_offset in positions:
        got = read_all(reader, 0, (base, position))
        assert got == expected(0, first_offset)
        assert reader.read(first_offset, base, position) == []
    # A readable end inside a batch (never published, but safe): that batch is not returned.
    position, first_offset = positions[3]
    assert read_all(reader, 0, (base, position + 30)) == expected(0, first_offset)


def test_readable_end_in_an_older_segment(open_log, open_reader):
    """Durable high watermark mode: the end can lie in a rolled segment; later segments are
    not read even though they are on disk."""
    plog = open_log()
    fill(plog, 30)
    second = plog.segments[1]
    reader = open_reader(plog.dir)
    batches = reader.read(second.base_offset, second.base_offset, second.size)
    hw = batches[-1].next_offset
    assert hw == plog.segments[2].base_offset
    assert read_all(reader, 0, (second.base_offset, second.size)) == expected(0, hw)
    assert reader.read(hw, second.base_offset, second.size) == []
    assert read_all(reader, 0, (second.base_offset, 0)) == expected(0, second.base_offset)
    assert read_all(reader, 0, (0, 0)) == []


def test_without_a_broker_reads_to_the_last_whole_batch(open_log, open_reader):
    plog = open_log()
    fill(plog, 20)
    leo = plog.log_end_offset
    with open(plog.active_segment.log_path, "ab") as f:
        f.write(bytes(make_batch(2))[:40])           # a torn tail: ignored
    reader = open_reader(plog.dir)
    assert read_all(reader, 0, None) == expected(0, leo)


def test_corrupt_framing_before_the_readable_end_raises(open_log, open_reader):
    plog = open_log(LogConfig(index_interval_bytes=0))
    fill(plog, 4)
    size = plog.active_segment.size
    with open(plog.active_segment.log_path, "ab") as f:
        f.write(bytes(100))                           # zeros where a batch should be
    reader = open_reader(plog.dir)
    assert read_all(reader, 0, (0, size)) == expected(0, plog.log_end_offset)
    with pytest.raises(CorruptRecordError) as info:
        reader.read(plog.log_end_offset, 0, size + 100)
    assert info.value.position == size and info.value.path.endswith(".log")


# --- growth, rolls and re-listing ---------------------------------------------------------------

def test_growth_and_rolls_seen_by_an_open_reader(open_log, open_reader):
    plog = open_log()
    fill(plog, 3)
    reader = open_reader(plog.dir)
    assert read_all(reader, 0, end_of(plog), generation=0) == expected(0, plog.log_end_offset)
    first_leo = plog.log_end_offset
    fill(plog, 40, start=3)                           # grows, then rolls several times
    assert len(plog.segments) > 3
    # A readable end in a segment the reader has not listed yet makes it re-list.
    assert read_all(reader, first_leo, end_of(plog)) == expected(first_leo,
                                                                  plog.log_end_offset)
    assert reader.base_offsets == [s.base_offset for s in plog.segments]


@pytest.mark.parametrize("remap_bytes", [0, 1 << 20])
def test_growing_segment_is_remapped_only_when_needed(open_log, open_reader, remap_bytes):
    plog = open_log(LogConfig(index_interval_bytes=0))
    fill(plog, 5)
    reader = open_reader(plog.dir, remap_bytes=remap_bytes)
    held = reader.read(0, *end_of(plog))              # maps the segment at its size
    seg = reader._segments[0]
    first_map, first_len = seg.map, seg.mapped
    assert first_len == plog.active_segment.size
    start = plog.log_end_offset
    fill(plog, 5, start=5)
    assert read_all(reader, start, end_of(plog)) == expected(start, plog.log_end_offset)
    if remap_bytes:
        assert seg.map is first_map and seg.mapped == first_len     # small growth: pread
    else:
        assert seg.map is not first_map and seg.mapped == plog.active_segment.size
    # Growth past the threshold remaps; batches taken from the old map stay valid.
    big = b"x" * 4096
    while plog.active_segment.size - first_len < max(remap_bytes, first_len // 8) + 1:
        plog.append(make_batch(8, value=big), now_ms=0)
    reader.read(0, *end_of(plog))
    assert seg.mapped == plog.active_segment.size and seg.map is not first_map
    assert [(r.offset, bytes(r.value)) for b in held for r in b.records()] == expected(0, start)


def test_segment_deleted_by_retention_stays_readable_through_its_map(open_log, open_reader):
    plog = open_log()
    fill(plog, 30)
    reader = open_reader(plog.dir)
    end = end_of(plog)
    held = reader.read(0, *end, generation=1)         # segment 0 is mapped
    first_next = plog.segments[1].base_offset
    plog.delete_records_before(plog.segments[2].base_offset)
    assert plog.apply_retention(now_ms=0) == 2
    assert not os.path.exists(os.path.join(plog.dir, files.segment_name(0, ".log")))
    # Same generation: not re-listed yet, segment 0 is read through its map.
    assert read_all(reader, 0, end, generation=1)[:first_next] == expected(0, first_next)
    assert [bytes(r.value) for b in held for r in b.records()] == [
        v for _, v in expected(0, held[-1].next_offset)]
    # The broker's generation changed: re-listed, the deleted segments are gone.
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(0, *end, generation=2)
    assert reader.base_offsets == [s.base_offset for s in plog.segments]
    start = plog.log_start_offset
    assert read_all(reader, start, end, generation=2) == expected(start, plog.log_end_offset)
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(start - 1, *end, log_start_offset=start)


def test_segment_deleted_before_it_was_opened(open_log, open_reader):
    """Listed but never opened, then deleted: re-list and report the offset out of range;
    a ``.deleted`` rename is still readable (Kafka deletes after file.delete.delay.ms)."""
    plog = open_log(LogConfig(segment_bytes=600, index_interval_bytes=0))
    fill(plog, 30)
    end = end_of(plog)
    reader = open_reader(plog.dir)
    plog.delete_records_before(plog.segments[1].base_offset)
    os.rename(plog.segments[0].log_path, plog.segments[0].log_path + files.DELETED_SUFFIX)
    assert read_all(reader, 0, end)[:3] == expected(0, 3)
    reader2 = open_reader(plog.dir)
    os.unlink(plog.segments[0].log_path + files.DELETED_SUFFIX)
    with pytest.raises(OffsetOutOfRangeError):
        reader2.read(0, *end)


# --- the index is a hint ------------------------------------------------------------------------

def test_active_index_with_preallocated_zero_tail(open_log, open_reader):
    plog = open_log(LogConfig(index_interval_bytes=0))
    fill(plog, 30)
    index_path = plog.active_segment.offset_index.path
    assert os.path.getsize(index_path) == LogConfig().segment_index_bytes   # zeros past entries
    reader = open_reader(plog.dir)
    seg = reader._segments[0]
    size = plog.active_segment.size
    positions = {b.base_offset: (b.position, b.last_offset) for b in reader.read(0, 0, size)}
    used = 0
    for first, (position, last) in positions.items():
        for offset in range(first, last + 1):
            start = seg.index_floor(offset, size)
            assert start <= position
            assert start == 0 or start in {p for p, _ in positions.values()}
            used += start > 0
            # Entries at or past the readable end are not used.
            assert seg.index_floor(offset, position) < position or position == 0
    assert used > len(positions)              # the index did shorten the scans


def test_garbage_index_does_not_change_results(open_log, open_reader):
    plog = open_log()
    fill(plog, 30)
    rolled = plog.segments[0]
    leo = plog.log_end_offset
    with open(rolled.offset_index.path, "r+b") as f:
        size = os.path.getsize(rolled.offset_index.path)
        f.write(os.urandom(size))
    for offset in range(leo):
        reader = open_reader(plog.dir)
        assert read_all(reader, offset, end_of(plog)) == expected(offset, leo)
        reader.close()


def test_gaps_skip_to_the_next_batch(open_log, open_reader):
    """Compaction leaves gaps: reading a missing offset starts at the next batch after it."""
    plog = open_log(LogConfig(index_interval_bytes=0))
    for base in (0, 10, 13, 20, 40):
        plog.append(make_batch(3, base_offset=base, value=b"v"), assign_offsets=False)
    reader = open_reader(plog.dir)
    end = end_of(plog)
    firsts = {}
    for offset in range(0, 43):
        reader2 = open_reader(plog.dir)
        batches = reader2.read(offset, *end, 1)
        firsts[offset] = batches[0].base_offset
        assert firsts[offset] == reader.read(offset, *end, 1)[0].base_offset
        reader2.close()
    assert firsts[3] == 10 and firsts[9] == 10 and firsts[13] == 13 and firsts[16] == 20
    assert firsts[23] == 40 and firsts[42] == 40
    assert reader.read(43, *end) == []


# --- out of range, lifetimes --------------------------------------------------------------------

def test_offset_below_the_log_start_is_out_of_range(open_log, open_reader):
    plog = open_log()
    fill(plog, 10)
    reader = open_reader(plog.dir)
    with pytest.raises(OffsetOutOfRangeError) as info:
        reader.read(2, *end_of(plog), log_start_offset=3)
    assert info.value.offset == 2 and info.value.log_start_offset == 3


def test_empty_partition(open_log, open_reader):
    plog = open_log()
    reader = open_reader(plog.dir)
    assert reader.read(0, 0, 0) == []
    assert reader.read(0, None, None) == []
    fill(plog, 1)
    assert read_all(reader, 0, end_of(plog)) == expected(0, plog.log_end_offset)


def test_missing_directory_reads_nothing(tmp_path, open_reader):
    reader = open_reader(tmp_path / "gone-0")
    assert reader.read(0, None, None) == [] and reader.base_offsets == []


def test_close_with_live_views_and_map_eviction(open_log, open_reader):
    """Maps are dropped, never closed under a live slice: no BufferError, and every batch and
    value handed out stays readable after eviction (one mapped segment at a time) and close."""
    plog = open_log()
    fill(plog, 40)
    reader = open_reader(plog.dir, max_mapped_segments=1)
    held = []
    offset = 0
    while True:
        batches = reader.read(offset, *end_of(plog))
        if not batches:
            break
        held += batches
        offset = batches[-1].next_offset
    values = [r.value for b in held for r in b.records()]
    assert sum(1 for s in reader._segments.values() if s.map is not None) <= 1
    reader.close()
    reader.close()                                    # idempotent
    assert [bytes(v) for v in values] == [v for _, v in expected(0, plog.log_end_offset)]
    with pytest.raises(ClosedError):
        reader.read(0, None, None)
    del held, values                                  # the last slices go: maps unmap


def test_reader_never_writes(open_log, open_reader):
    plog = open_log()
    fill(plog, 20)
    before = {p: (os.path.getsize(os.path.join(plog.dir, p)),
                  os.stat(os.path.join(plog.dir, p)).st_mtime_ns)
              for p in os.listdir(plog.dir)}
    reader = open_reader(plog.dir)
    read_all(reader, 0, end_of(plog))
    reader.close()
    after = {p: (os.path.getsize(os.path.join(plog.dir, p)),
                 os.stat(os.path.join(plog.dir, p)).st_mtime_ns)
             for p in os.listdir(plog.dir)}
    assert before == after


def test_aborted_transactions_of_a_range_come_from_every_later_txnindex(tmp_path):
    cfg = LogConfig(segment_bytes=300, index_interval_bytes=100)
    plog = PartitionLog.open(str(tmp_path / "t-0"), cfg)

    def txn(pid, seq, value):
        b = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq,
                         is_transactional=True)
        b.append(1000, None, value)
        return plog.append(b.build())

    txn(1, 0, b"a" * 60)                                    # 0: aborted below
    txn(2, 0, b"b" * 60)                                    # 1: committed below
    for i in range(1, 6):
        txn(1, i, b"a" * 60)                                # 2-6, segments roll meanwhile
    plog.append_marker(1, 0, commit=False)                  # 7
    plog.append_marker(2, 0, commit=True)                   # 8
    assert len(plog.segments) > 2
    with PartitionReader(plog.dir) as reader:
        aborted = reader.aborted_transactions(0, plog.log_end_offset)
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in aborted] == [(1, 0, 7)]
        assert reader.aborted_transactions(8, 9) == []
        keep = AbortedTxnFilter(aborted)
        kept = [b.base_offset for b in plog.batches()
                if not b.is_control and not keep.is_aborted(b)]
    assert kept == [1]
    plog.close()
