"""Which descriptors the storage layer keeps open (issue 19: a broker ran out of them).

Only a log's active segment keeps files open: its ``.log``, ``.index`` and ``.timeindex``, one
descriptor each. Older segments open what a call needs and close it after the call; an index
reads with ``pread`` (a Python map held a second descriptor); a ``.txnindex`` is opened per
write. Counted in ``/proc/self/fd``.
"""

from __future__ import annotations

import errno
import os
import threading

import pytest

from builders import append_to_segment, make_batch
from mq.log import files
from mq.log.config import LogConfig
from mq.log.index import OffsetIndex, TimeIndex
from mq.log.log import PartitionLog
from mq.log.segment import LogSegment
from mq.log.txnindex import AbortedTxn, TransactionIndex

CONFIG = dict(segment_bytes=400, index_interval_bytes=1)


def held(directory) -> list[str]:
    """Names of the files under ``directory`` this process has open, one per descriptor."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + os.sep):
            names.append(os.path.basename(target))
    return sorted(names)


def active_files(plog: PartitionLog) -> list[str]:
    base = plog.active_segment.base_offset
    return sorted(files.segment_name(base, kind) for kind in
                  (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX))


@pytest.fixture
def plog(tmp_path):
    log = PartitionLog.open(str(tmp_path / "t-0"), LogConfig(**CONFIG), now_ms=0)
    for i in range(40):
        log.append(make_batch(3, timestamp=1_000 + i))
    assert len(log.segments) >= 5
    yield log
    log.close()


def test_only_the_active_segment_keeps_files_open(plog, tmp_path):
    assert held(tmp_path) == active_files(plog)


def test_reading_older_segments_closes_what_it_opened(plog, tmp_path):
    first = plog.segments[0]
    assert bytes(plog.read(0).data)[:8] == bytes(8)        # the batch at offset 0
    assert plog.offset_for_timestamp(1_003)[0] == 9
    assert sum(1 for _ in plog.batches()) == 40
    partly = plog.batches(0)
    next(partly)
    assert files.segment_name(0, files.LOG_SUFFIX) in held(tmp_path)   # while iterating
    del partly                                                         # dropped half-way
    assert first.translate_offset(1).position == 0
    assert [m.next_offset for m in map(LogSegment.meta, plog.segments)][0] == \
        plog.segments[1].base_offset
    assert held(tmp_path) == active_files(plog)


def test_a_reopened_log_holds_the_active_segment_only(plog, tmp_path):
    directory = plog.dir
    plog.close()
    assert held(tmp_path) == []
    again = PartitionLog.open(directory, LogConfig(**CONFIG), clean_shutdown=True)
    try:
        assert held(tmp_path) == active_files(again)
        assert again.log_end_offset == 120
        # After an unclean shutdown every segment is recovered: still none left open.
        again.take_offline("simulated crash")
        again.close()
        recovered = PartitionLog.open(directory, LogConfig(**CONFIG))
        assert recovered.recovery_report.segments_recovered == len(recovered.segments)
        assert held(tmp_path) == active_files(recovered)
        recovered.close()
    finally:
        again.close()


def test_a_roll_closes_the_segment_it_leaves(plog, tmp_path):
    plog.roll()
    plog.append(make_batch(1, timestamp=5_000))
    plog.flush()
    assert held(tmp_path) == active_files(plog)


def test_an_index_holds_one_descriptor_and_a_read_only_one_none(tmp_path):
    path = tmp_path / "00000000000000000000.index"
    with OffsetIndex(str(path), 0, 4096) as index:
        index.append(5, 100)
        assert held(tmp_path) == [path.name]
        assert index.lookup(7) == (5, 100)
    with TimeIndex(str(tmp_path / "00000000000000000000.timeindex"), 0, 4096) as index:
        index.maybe_append(10, 5)
        assert len(held(tmp_path)) == 1
    with OffsetIndex(str(path), 0, writable=False) as index:
        assert held(tmp_path) == []
        assert index.entries == 1 and index.lookup(9) == (5, 100)


def test_a_txnindex_keeps_no_descriptor_between_writes(tmp_path):
    index = TransactionIndex(str(tmp_path / "00000000000000000000.txnindex"))
    index.append(AbortedTxn(7, 10, 15, 16))
    index.flush()
    index.truncate(15)
    index.append(AbortedTxn(8, 12, 20, 21))
    assert held(tmp_path) == []
    assert TransactionIndex(index.path).entries == [AbortedTxn(8, 12, 20, 21)]


def test_an_untrimmed_index_stays_open_until_trimmed(tmp_path):
    """Opened again, an untrimmed index would count its zero tail as entries: a segment that
    is not pinned keeps it open past a call until the call that trims it."""
    seg = LogSegment(str(tmp_path), 0, LogConfig(**CONFIG))
    assert held(tmp_path) == []
    for offset in range(0, 6, 2):
        append_to_segment(seg, make_batch(2, base_offset=offset))
    entries = seg.offset_index.entries
    assert entries == 2                        # the first append of a segment gets none
    assert seg.translate_offset(3).position > 0
    assert files.segment_name(0, files.INDEX_SUFFIX) in held(tmp_path)
    seg.on_become_inactive()                   # trims
    assert held(tmp_path) == []
    assert seg.offset_index_full and seg.time_index_full
    assert seg.translate_offset(5).last_offset == 5
    assert seg.offset_index.entries == entries
    seg.close()


def test_a_closed_segment_refuses_reads_instead_of_using_a_stale_descriptor(tmp_path):
    seg = LogSegment(str(tmp_path), 0, LogConfig(**CONFIG))
    append_to_segment(seg, make_batch(2))
    seg.close()
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)   # takes the freed number
    try:
        os.write(other, bytes(make_batch(2)))
        with pytest.raises(OSError) as err:
            seg.read(0, 1000)
        assert err.value.errno == errno.EBADF
    finally:
        os.close(other)


def test_two_threads_reading_an_older_segment_share_and_close_its_files(plog, tmp_path):
    """The broker's cleaner thread reads older segments beside the loop thread."""
    seg = plog.segments[1]
    expected = [b.base_offset for b in seg.batches()]
    failures = []

    def reader() -> None:
        try:
            for _ in range(200):
                assert [b.base_offset for b in seg.batches()] == expected
                assert seg.translate_offset(expected[-1]).last_offset == expected[-1] + 2
        except BaseException as err:      # noqa: BLE001 -- reported below
            failures.append(err)
    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures
    assert held(tmp_path) == active_files(plog)
