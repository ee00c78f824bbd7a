"""``PartitionLog.append(shared_head=)``: a batch in memory its producer can still write (the
producer's arena) is appended from there, and the log holds only what was checked: the header
from the private copy, the CRC verified on the bytes that reached the file."""

from __future__ import annotations

import os

import pytest
from builders import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from mq.errors import CorruptRecordError
from mq.log import diskio
from mq.log.builder import BatchBuilder
from mq.log.config import LogConfig
from mq.log.layout import ATTRIBUTES_OFFSET, RECORD_BATCH_OVERHEAD
from mq.log.log import PartitionLog


@pytest.fixture
def plog(tmp_path):
    log = PartitionLog.open(str(tmp_path / "t-0"), LogConfig())
    yield log
    log.close()


def shared_append(plog, batch: bytearray, **kwargs):
    """Append ``batch`` as the broker appends an arena's: a view, and its header's copy."""
    with memoryview(batch) as view:
        return plog.append(view, shared_head=bytes(view[:RECORD_BATCH_OVERHEAD]), **kwargs)


def stored(plog) -> list[tuple[int, bytes]]:
    return [(r.offset, bytes(r.value)) for b in plog.batches() for r in b.records()]


def file_size(plog) -> int:
    return os.path.getsize(plog.active_segment.log_path)


def test_a_shared_batch_is_stamped_in_the_file_not_in_the_producer_memory(plog):
    plog.append(make_batch(2))
    batch = make_batch(3, value=b"shared", base_offset=0)
    before = bytes(batch)
    info = shared_append(plog, batch, leader_epoch=7)
    assert (info.first_offset, info.last_offset) == (2, 4)
    assert bytes(batch) == before                         # the arena is never written
    written = [b for b in plog.batches()][-1]
    assert (written.base_offset, written.partition_leader_epoch) == (2, 7)
    written.validate()
    assert stored(plog)[2:] == [(2, b"shared"), (3, b"shared"), (4, b"shared")]


def test_a_bad_crc_in_a_shared_batch_leaves_nothing(plog):
    plog.append(make_batch(1))
    size = file_size(plog)
    bad = make_batch(2)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="changed in the producer's shared memory"):
        shared_append(plog, bad)
    assert (plog.log_end_offset, file_size(plog)) == (1, size)
    assert plog.append(make_batch(1)).first_offset == 1  # and the log goes on


def test_the_private_header_wins_over_one_changed_after_it_was_read(plog):
    """The producer rewrites the header (record count) after the broker copied it: the log
    appends the copy's header, which the CRC still matches, with the copy's offsets."""
    batch = make_batch(3, value=b"v")
    head = bytes(batch[:RECORD_BATCH_OVERHEAD])
    batch[57:61] = (1000).to_bytes(4, "big")             # recordsCount, in the arena only
    with memoryview(batch) as view:
        info = plog.append(view, shared_head=head)
    assert (info.first_offset, info.last_offset, plog.log_end_offset) == (0, 2, 3)
    assert stored(plog) == [(0, b"v"), (1, b"v"), (2, b"v")]


class RewritingDiskIO(diskio.DiskIO):
    """Changes the source bytes of the ``nth`` pwrite just before it runs, as a producer
    rewriting its arena slot during the broker's write would."""

    def __init__(self, source: bytearray, nth: int, at: int) -> None:
        super().__init__()
        self.source, self.nth, self.at, self.calls = source, nth, at, 0

    def pwrite(self, fd: int, data, position: int) -> int:
        self.calls += 1
        if self.calls == self.nth:
            self.source[self.at] ^= 0x55
        return super().pwrite(fd, data, position)


@pytest.mark.parametrize("at", [RECORD_BATCH_OVERHEAD, -1])
def test_a_batch_changed_while_written_is_cut_off_and_refused(plog, at):
    plog.append(make_batch(1))
    size = file_size(plog)
    batch = make_batch(4, value=b"x" * 300)
    with diskio.installed(RewritingDiskIO(batch, nth=2, at=at)):     # 1: header, 2: body
        with pytest.raises(CorruptRecordError):
            shared_append(plog, batch)
    assert (plog.log_end_offset, plog.high_watermark, file_size(plog)) == (1, 1, size)
    assert plog.append(make_batch(1)).first_offset == 1
    assert [o for o, _ in stored(plog)] == [0, 1]


def test_log_append_time_topics_copy_the_shared_batch(tmp_path):
    with PartitionLog.open(str(tmp_path / "t-0"),
                           LogConfig(message_timestamp_type="LogAppendTime")) as plog:
        batch = make_batch(2)
        before = bytes(batch)
        info = shared_append(plog, batch, now_ms=123_456)
        assert info.log_append_time == 123_456 and bytes(batch) == before
        [written] = plog.batches()
        written.validate()
        assert written.max_timestamp == 123_456


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.binary(max_size=2000), min_size=1, max_size=8),
       flip=st.one_of(st.none(), st.integers(min_value=0)))
def test_shared_appends_store_exactly_the_valid_batches(tmp_path_factory, values, flip):
    """Any batch, intact or with one byte from its attributes on flipped in the arena after
    the header was copied: a flip in the header changes nothing (the copy is written), one
    in the records fails the CRC of the written bytes and leaves nothing."""
    builder = BatchBuilder()
    for v in values:
        builder.append(1000, None, v)
    batch = builder.build()
    head = bytes(batch[:RECORD_BATCH_OVERHEAD])
    valid = True
    if flip is not None:
        at = ATTRIBUTES_OFFSET + flip % (len(batch) - ATTRIBUTES_OFFSET)
        batch[at] ^= 0x01
        valid = at < RECORD_BATCH_OVERHEAD
    with PartitionLog.open(str(tmp_path_factory.mktemp("shared") / "t-0"),
                           LogConfig()) as plog:
        with memoryview(batch) as view:
            if valid:
                plog.append(view, shared_head=head)
            else:
                with pytest.raises(CorruptRecordError):
                    plog.append(view, shared_head=head)
        assert plog.log_end_offset == (len(values) if valid else 0)
        assert [bytes(r.value) for b in plog.batches() for r in b.records()] == \
            (values if valid else [])
