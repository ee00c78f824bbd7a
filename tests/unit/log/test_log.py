"""One partition log (``mq.log.log.PartitionLog``): append, roll, read, timestamps, truncation,
log start offset and retention (Kafka's UnifiedLogTest; checklist items 35-37)."""

from __future__ import annotations

import os

import pytest

from builders import batch_bases, empty_batch, make_batch, offsets_of
from mq.errors import (ClosedError, CorruptRecordError, InvalidRequestError, MessageTooLargeError,
                       OffsetOutOfRangeError)
from mq.log import files
from mq.log.batch import RecordBatch
from mq.log.config import LogConfig
from mq.log.layout import LOG_APPEND_TIME
from mq.log.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP, PartitionLog

HOUR = 3_600_000


def segment_files(directory) -> list[str]:
    """The segment files of a partition directory (not its snapshots and checkpoints)."""
    return [n for n in os.listdir(directory)
            if (p := files.parse_segment_name(n)) and p[1] != files.SNAPSHOT_SUFFIX]


@pytest.fixture
def open_log(tmp_path):
    opened: list[PartitionLog] = []

    def factory(now_ms=0, name="topic-0", **config) -> PartitionLog:
        plog = PartitionLog.open(str(tmp_path / name), LogConfig(**config), now_ms=now_ms)
        opened.append(plog)
        return plog
    yield factory
    for plog in opened:
        plog.close()


def records_of(plog, start=None):
    return [(r.offset, r.timestamp, bytes(r.value)) for b in plog.batches(start)
            for r in b.records()]


def fill(plog, n, *, ts0=1_000, step=10, per_batch=1, now_ms=0):
    """n batches of ``per_batch`` records; record k has timestamp ts0 + k*step."""
    for i in range(n):
        plog.append(make_batch(per_batch, timestamp=ts0 + i * per_batch * step, ts_step=step,
                               value=b"v%d" % i), now_ms=now_ms)


# --- append and read ----------------------------------------------------------------------------

def test_append_assigns_offsets_and_reads_back(open_log):
    plog = open_log()
    assert (plog.log_start_offset, plog.log_end_offset, plog.high_watermark) == (0, 0, 0)
    info = plog.append(make_batch(3, timestamp=500, ts_step=5, base_offset=77), leader_epoch=4)
    assert (info.first_offset, info.last_offset, info.records_count) == (0, 2, 3)
    assert info.max_timestamp == 510 and info.log_append_time == -1
    info = plog.append(make_batch(2, timestamp=600))
    assert (info.first_offset, info.last_offset) == (3, 4)
    assert plog.log_end_offset == plog.high_watermark == 5
    got = plog.read(0)
    assert offsets_of(got.data) == [0, 1, 2, 3, 4]
    first = RecordBatch(got.data)
    first.validate()                                  # stamping keeps the CRC valid
    assert first.partition_leader_epoch == 4 and first.base_offset == 0
    assert offsets_of(plog.read(4).data) == [3, 4]    # whole batch holding offset 4
    assert plog.read(5).data == b""                   # at the log end: empty
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(6)


def test_read_is_bounded_by_high_watermark(open_log):
    plog = open_log(segment_bytes=300)
    plog.high_watermark_follows_log_end = False
    fill(plog, 10)
    plog.high_watermark = 6
    assert offsets_of(plog.read(0, 10_000).data) == [0, 1, 2, 3]     # one segment per read
    assert offsets_of(plog.read(4, 10_000).data) == [4, 5]           # stops before offset 6
    assert plog.read(6).data == b"" and plog.read(10).data == b""
    assert offsets_of(plog.read(6, max_offset=8).data) == [6, 7]
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(11)


def test_append_validates(open_log):
    ok = make_batch(value=b"x" * 100)
    plog = open_log(max_message_bytes=len(ok))
    bad = make_batch(2)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        plog.append(bad)
    with pytest.raises(InvalidRequestError, match="exactly one batch"):
        plog.append(make_batch() + make_batch())
    plog.append(ok)                                   # exactly max.message.bytes: accepted
    with pytest.raises(MessageTooLargeError, match="max.message.bytes"):
        plog.append(make_batch(value=b"x" * 101))
    assert plog.log_end_offset == 1


def test_append_without_assigning_offsets(open_log):
    plog = open_log()
    plog.append(make_batch(2, base_offset=0), assign_offsets=False)
    plog.append(make_batch(2, base_offset=10), assign_offsets=False)   # a gap is allowed
    assert plog.log_end_offset == 12
    with pytest.raises(ValueError, match="below the log end offset"):
        plog.append(make_batch(base_offset=11), assign_offsets=False)
    assert batch_bases(plog.read(5).data) == [10]


def test_closed_log_raises(open_log):
    plog = open_log()
    plog.close()
    plog.close()
    with pytest.raises(ClosedError):
        plog.append(make_batch())
    with pytest.raises(ClosedError):
        plog.read(0)


# --- rolling (items 35, 36) ---------------------------------------------------------------------

def test_size_based_roll(open_log):
    size = len(make_batch(value=b"test"))
    plog = open_log(segment_bytes=10 * (size - 1))
    assert len(plog.segments) == 1
    for i in range(1, 12):
        plog.append(make_batch(value=b"test"))
        # size > segment.bytes - incoming first holds before the 10th append (9*size > 9*size-10)
        assert len(plog.segments) == (1 if i < 10 else 2), i
    assert [s.base_offset for s in plog.segments] == [0, 9]
    assert plog.segments[0].size == 9 * size


def test_time_based_roll_during_append(open_log):
    ms = HOUR
    now = 1_000_000
    plog = open_log(now_ms=now, segment_ms=ms)

    def no_ts():
        return make_batch(value=b"test", timestamp=-1)
    now += ms + 1
    plog.append(no_ts(), now_ms=now)
    assert len(plog.segments) == 1, "never roll into an empty segment"
    plog.append(no_ts(), now_ms=now)
    assert len(plog.segments) == 2, "wall clock since creation exceeded segment.ms"
    for n in (3, 4):
        now += ms + 1
        plog.append(no_ts(), now_ms=now)
        assert len(plog.segments) == n
    ts = now + ms + 1
    plog.append(make_batch(timestamp=ts), now_ms=now)
    assert len(plog.segments) == 4, "first batch had no timestamp: the wall clock decides"
    now += ms + 1
    plog.append(make_batch(timestamp=ts), now_ms=now)
    assert len(plog.segments) == 5
    now += ms + 1
    plog.append(make_batch(timestamp=ts), now_ms=now)
    assert len(plog.segments) == 5, "the first batch's timestamp decides, not the clock"
    plog.append(make_batch(timestamp=now), now_ms=now)
    assert len(plog.segments) == 6, "a batch timestamp past segment.ms rolls"
    now += ms + 1
    leo = plog.log_end_offset
    with pytest.raises(CorruptRecordError):
        plog.append(empty_batch(), now_ms=now)
    assert len(plog.segments) == 6 and plog.log_end_offset == leo


def test_roll_never_creates_a_second_empty_segment(open_log):
    plog = open_log()
    first = plog.active_segment
    assert plog.roll() is first
    fill(plog, 2)
    seg = plog.roll(now_ms=5)
    assert seg.base_offset == 2 and seg.created_ms == 5 and len(plog.segments) == 2
    assert plog.roll() is seg and len(plog.segments) == 2
    # a roll at a higher base replaces the empty active segment
    plog.roll(10)
    assert [s.base_offset for s in plog.segments] == [0, 10]
    assert not os.path.exists(os.path.join(plog.dir, "00000000000000000002.log"))


def test_roll_below_log_end_starts_at_log_end(open_log):
    # Kafka's LocalLog.roll: new base = max(requested, log end offset), so segments never overlap.
    plog = open_log()
    fill(plog, 10)
    seg = plog.roll(5)
    assert seg.base_offset == 10
    assert [s.base_offset for s in plog.segments] == [0, 10]
    assert plog.append(make_batch()).first_offset == 10
    assert [r[0] for r in records_of(plog)] == list(range(11))


def test_offset_overflow_rolls(open_log):
    plog = open_log()
    plog.append(make_batch(base_offset=0), assign_offsets=False)
    far = (1 << 31) + 5
    plog.append(make_batch(base_offset=far), assign_offsets=False)
    assert [s.base_offset for s in plog.segments] == [0, far]
    assert offsets_of(plog.read(1).data) == [far]


def test_rolled_segment_gets_final_time_index_entry_and_is_trimmed(open_log):
    plog = open_log(index_interval_bytes=10 ** 6)
    fill(plog, 5)
    seg = plog.active_segment
    assert seg.time_index.entries == 0
    plog.roll()
    assert seg.time_index.entries == 1 and seg.time_index.last_entry == (1_040, 4)
    assert os.path.getsize(seg.time_index.path) == 12
    assert os.path.getsize(seg.offset_index.path) == 0


# --- timestamps ---------------------------------------------------------------------------------

def test_offset_for_timestamp_earliest_with_ts_at_least_target(open_log):
    plog = open_log(segment_bytes=300, index_interval_bytes=1)
    fill(plog, 30, ts0=1_000, step=10)                 # offset k has ts 1000 + 10k
    assert len(plog.segments) > 3
    for k in range(30):
        assert plog.offset_for_timestamp(1_000 + 10 * k) == (k, 1_000 + 10 * k)
        assert plog.offset_for_timestamp(1_000 + 10 * k - 5) == (k, 1_000 + 10 * k)
    assert plog.offset_for_timestamp(0) == (0, 1_000)
    assert plog.offset_for_timestamp(1_291) is None
    with pytest.raises(InvalidRequestError, match="invalid timestamp -7"):
        plog.offset_for_timestamp(-7)


def test_offset_for_timestamp_with_unordered_timestamps(open_log):
    plog = open_log(segment_bytes=200)
    for ts in (100, 500, 300, 900, 200):
        plog.append(make_batch(timestamp=ts))
    assert len(plog.segments) > 1
    assert plog.offset_for_timestamp(250) == (1, 500)   # log order, not timestamp order
    assert plog.offset_for_timestamp(600) == (3, 900)
    assert plog.offset_for_timestamp(150) == (1, 500)
    assert plog.offset_for_timestamp(MAX_TIMESTAMP) == (3, 900)


def test_offset_for_timestamp_specials(open_log):
    plog = open_log(segment_bytes=300)
    fill(plog, 10, ts0=1_000)
    plog.append(make_batch(3, timestamps=[5_000, 9_000, 9_000]))   # offsets 10..12
    fill(plog, 2, ts0=2_000)
    assert plog.offset_for_timestamp(LATEST_TIMESTAMP) == (15, -1)
    assert plog.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    assert plog.offset_for_timestamp(MAX_TIMESTAMP) == (11, 9_000)   # first record with max
    plog.delete_records_before(4)
    assert plog.offset_for_timestamp(EARLIEST_TIMESTAMP) == (4, -1)
    assert plog.offset_for_timestamp(0) == (4, 1_040)                # nothing below the start


def test_offset_for_timestamp_never_beyond_high_watermark(open_log):
    plog = open_log()
    plog.high_watermark_follows_log_end = False
    fill(plog, 5, ts0=100, step=100)                  # ts 100..500
    plog.append(make_batch(timestamp=10_000))           # offset 5: the max timestamp
    plog.high_watermark = 4
    assert plog.offset_for_timestamp(300) == (2, 300)
    assert plog.offset_for_timestamp(450) is None       # hit at offset 4 == HW
    assert plog.offset_for_timestamp(LATEST_TIMESTAMP) == (4, -1)
    assert plog.offset_for_timestamp(MAX_TIMESTAMP) is None
    plog.high_watermark = 6
    assert plog.offset_for_timestamp(MAX_TIMESTAMP) == (5, 10_000)
    assert plog.offset_for_timestamp(450) == (4, 500)


def test_log_append_time(open_log):
    plog = open_log(message_timestamp_type="LogAppendTime")
    info = plog.append(make_batch(3, timestamp=111), now_ms=5_000)
    assert info.log_append_time == 5_000 and info.max_timestamp == 5_000
    batch = RecordBatch(plog.read(0).data)
    batch.validate()
    assert batch.timestamp_type == LOG_APPEND_TIME and batch.max_timestamp == 5_000
    assert [r.timestamp for r in batch.records()] == [5_000] * 3
    assert plog.offset_for_timestamp(200) == (0, 5_000)
    assert plog.offset_for_timestamp(5_001) is None
    # a replicated append keeps the producer's timestamps
    info = plog.append(make_batch(timestamp=222, base_offset=3), assign_offsets=False,
                       now_ms=6_000)
    assert info.log_append_time == -1 and info.max_timestamp == 222


# --- truncation ---------------------------------------------------------------------------------

def test_truncate_to_across_segments(open_log):
    plog = open_log(segment_bytes=300)
    fill(plog, 20)
    bases = [s.base_offset for s in plog.segments]
    assert len(bases) > 3
    cut = bases[2] + 1
    plog.truncate_to(cut)
    assert plog.log_end_offset == cut == plog.high_watermark
    assert [s.base_offset for s in plog.segments] == bases[:3]
    assert [r[0] for r in records_of(plog)] == list(range(cut))
    assert not plog.active_segment.offset_index.is_full
    plog.truncate_to(bases[1])                          # exactly a segment base
    assert [s.base_offset for s in plog.segments] == bases[:1]
    assert plog.log_end_offset == bases[1]
    plog.truncate_to(10_000)                            # past the end: no-op
    assert plog.log_end_offset == bases[1]
    fill(plog, 3)
    assert [r[0] for r in records_of(plog)] == list(range(bases[1] + 3))
    names = [n for n in os.listdir(plog.dir) if files.parse_segment_name(n)]
    assert all(int(n[:20]) in (0, bases[1]) for n in names)


def test_truncate_fully_and_start_at(open_log):
    plog = open_log(segment_bytes=300)
    fill(plog, 10)
    plog.truncate_fully_and_start_at(100)
    assert [s.base_offset for s in plog.segments] == [100]
    assert plog.log_start_offset == plog.log_end_offset == plog.high_watermark == 100
    assert sorted(segment_files(plog.dir)) == [f"00000000000000000100{kind}"
                                               for kind in (".index", ".log", ".timeindex")]
    info = plog.append(make_batch())
    assert info.first_offset == 100


def test_truncate_below_first_segment_starts_over(open_log):
    plog = open_log()
    plog.truncate_fully_and_start_at(50)
    fill(plog, 5)
    plog.roll()
    fill(plog, 5)
    plog.truncate_to(20)
    assert [s.base_offset for s in plog.segments] == [20]
    assert plog.log_end_offset == 20 and plog.log_start_offset == 20


# --- log start offset, retention (item 37) ------------------------------------------------------

def test_delete_records_before_moves_log_start(open_log):
    plog = open_log(segment_bytes=300)
    fill(plog, 20)
    assert plog.delete_records_before(7) == 7
    assert plog.delete_records_before(3) == 7           # never moves backwards
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(6)
    assert 7 in offsets_of(plog.read(7).data)
    with pytest.raises(OffsetOutOfRangeError):
        plog.delete_records_before(21)
    assert plog.delete_records_before(20) == 20        # == HW is allowed
    assert plog.read(20).data == b""


def test_retention_deletes_segments_below_log_start(open_log):
    plog = open_log(segment_bytes=300, file_delete_delay_ms=0, retention_ms=-1)
    fill(plog, 20)
    bases = [s.base_offset for s in plog.segments]
    plog.delete_records_before(bases[2] + 1)
    assert plog.apply_retention(now_ms=0) == 2
    assert [s.base_offset for s in plog.segments] == bases[2:]
    assert plog.log_start_offset == bases[2] + 1         # mid-segment start is kept
    assert not any(int(n[:20]) < bases[2] for n in os.listdir(plog.dir)
                   if files.parse_segment_name(n))
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(bases[2])


def test_retention_advances_log_start_offset(open_log):
    plog = open_log(segment_bytes=300, file_delete_delay_ms=0, retention_bytes=600,
                    retention_ms=-1)
    fill(plog, 30)
    total = plog.size_in_bytes
    sizes = [s.size for s in plog.segments]
    deleted = plog.apply_retention(now_ms=0)
    # Kafka's rule: delete oldest whole segments while (total - 600) still covers each one.
    excess, expected = total - 600, 0
    while excess >= sizes[expected]:
        excess -= sizes[expected]
        expected += 1
    assert deleted == expected > 0
    assert plog.size_in_bytes == total - sum(sizes[:expected])
    assert plog.size_in_bytes - 600 < plog.segments[0].size
    assert plog.log_start_offset == plog.segments[0].base_offset > 0
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(plog.log_start_offset - 1)
    assert plog.apply_retention(now_ms=0) == 0


def test_retention_never_deletes_at_or_above_high_watermark(open_log):
    plog = open_log(segment_bytes=300, file_delete_delay_ms=0, retention_ms=1)
    plog.high_watermark_follows_log_end = False
    fill(plog, 20, ts0=0, step=0)
    bases = [s.base_offset for s in plog.segments]
    plog.high_watermark = bases[2] - 1
    assert plog.apply_retention(now_ms=10**9) == 1
    assert plog.segments[0].base_offset == bases[1]
    plog.high_watermark = bases[2]
    assert plog.apply_retention(now_ms=10**9) == 1
    assert plog.segments[0].base_offset == bases[2]
    assert plog.log_start_offset == bases[2]


def test_retention_of_everything_rolls_a_new_active_segment(open_log):
    plog = open_log(segment_bytes=300, file_delete_delay_ms=0, retention_ms=1000)
    fill(plog, 20, ts0=0, step=0)
    leo = plog.log_end_offset
    count = len(plog.segments)
    assert plog.apply_retention(now_ms=1000) == 0       # 1000 - 0 is not > 1000
    assert plog.apply_retention(now_ms=1001) == count
    assert [s.base_offset for s in plog.segments] == [leo]
    assert plog.log_start_offset == plog.log_end_offset == leo
    assert sorted(segment_files(plog.dir)) == [f"{leo:020d}{kind}"
                                               for kind in (".index", ".log", ".timeindex")]
    assert plog.apply_retention(now_ms=10**9) == 0      # the empty active segment stays
    assert plog.append(make_batch()).first_offset == leo


def test_retention_with_file_delete_delay(open_log):
    plog = open_log(segment_bytes=300, file_delete_delay_ms=60_000, retention_ms=1000)
    fill(plog, 20, ts0=0, step=0)
    plog.roll()
    doomed = [s.base_offset for s in plog.segments[:-1]]
    assert plog.apply_retention(now_ms=5_000) == len(doomed)
    names = os.listdir(plog.dir)
    for base in doomed:
        assert f"{base:020d}.log.deleted" in names
        assert f"{base:020d}.log" not in names
    plog.delete_expired_files(now_ms=64_999)
    assert any(n.endswith(".deleted") for n in os.listdir(plog.dir))
    plog.delete_expired_files(now_ms=65_000)
    assert not any(n.endswith(".deleted") for n in os.listdir(plog.dir))


def test_flush_advances_recovery_point(open_log):
    plog = open_log()
    fill(plog, 5)
    assert plog.recovery_point == 0
    plog.flush(3)
    assert plog.recovery_point == 3
    plog.flush(2)
    assert plog.recovery_point == 3
    plog.flush()
    assert plog.recovery_point == 5
