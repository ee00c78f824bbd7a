"""The executor side of the ``mq`` source without Spark: ``read_range`` over logs written by
``PartitionLog`` into ``tmp_path`` returns exactly ``[start, end)``, across segment rolls and
from inside batches, split or whole; skips markers, and aborted transactions under
read_committed; and treats data removed under it by ``failOnDataLoss``."""

from __future__ import annotations

import logging
import random
import shutil

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from mq.log.builder import BatchBuilder  # noqa: E402
from mq.log.config import LogConfig  # noqa: E402
from mq.log.log import PartitionLog  # noqa: E402
from mq.spark import arrow  # noqa: E402
from mq.spark.ranges import DataLossError, OffsetRange, split_ranges  # noqa: E402
from mq.spark.reader import read_range  # noqa: E402

# Rolls every ~6 batches of 1-3 records.
SMALL = LogConfig(segment_bytes=600, index_interval_bytes=0, file_delete_delay_ms=0,
                  retention_ms=-1)
T0 = 1_700_000_000_000


@pytest.fixture
def plog(tmp_path):
    log = PartitionLog.open(str(tmp_path / "t-0"), SMALL, now_ms=T0)
    yield log
    log.close()


def fill(log: PartitionLog, batches: int) -> None:
    """Batches of 1-3 records; the record at offset o has value b"v<o>", key b"k<o % 3>"."""
    for i in range(batches):
        b = BatchBuilder()
        for _ in range(i % 3 + 1):
            o = log.log_end_offset + len(b)
            b.append(T0 + o, b"k%d" % (o % 3), b"v%d" % o)
        log.append(b.build(), now_ms=T0)


def rows(r: OffsetRange) -> list[tuple[int, bytes]]:
    return [(row["offset"], row["value"]) for batch in read_range(r)
            for row in batch.to_pylist()]


def rng(log, start, end, **kw) -> OffsetRange:
    return OffsetRange("t", 0, start, end, str(log.dir).rsplit("/", 1)[0], **kw)


def test_exact_ranges_across_rolls_and_inside_batches(plog):
    fill(plog, 40)
    assert len(plog.segments) > 5
    leo = plog.log_end_offset
    pairs = [(s, e) for s in range(leo) for e in range(s, leo + 1)]
    for start, end in random.Random(7).sample(pairs, 300) + [(0, leo), (leo, leo)]:
        assert rows(rng(plog, start, end)) == [(o, b"v%d" % o) for o in range(start, end)]


def test_split_ranges_read_back_to_the_unsplit_read(plog):
    fill(plog, 40)
    leo = plog.log_end_offset
    whole = rows(rng(plog, 3, leo - 2))
    for min_partitions, max_records in ((4, None), (7, None), (None, 5), (3, 4)):
        pieces = split_ranges([(("t", 0), 3, leo - 2)], min_partitions, max_records)
        assert len(pieces) > 1
        got = [row for _, f, u in pieces for row in rows(rng(plog, f, u))]
        assert got == whole


def test_batches_are_cut_at_the_target_size(plog, monkeypatch):
    monkeypatch.setattr("mq.spark.reader.TARGET_ROWS", 10)
    fill(plog, 40)
    sizes = [b.num_rows for b in read_range(rng(plog, 0, plog.log_end_offset))]
    assert sum(sizes) == plog.log_end_offset and max(sizes) <= 10 + 2 and len(sizes) > 5
    assert all(b.schema.equals(arrow.arrow_schema(False))
               for b in read_range(rng(plog, 0, 5)))


def txn_batch(pid: int, seq: int, n: int, txn: bool = True) -> bytearray:
    b = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq, is_transactional=txn)
    for i in range(n):
        b.append(T0, None, b"p%d-%d" % (pid, seq + i))
    return b.build()


def test_markers_skipped_and_aborted_transactions_under_read_committed(plog):
    plog.append(txn_batch(1, 0, 2))                       # 0-1 aborted
    plog.append(txn_batch(2, 0, 2))                       # 2-3 committed
    plog.append(txn_batch(3, 0, 1, txn=False))            # 4 plain
    plog.append_marker(1, 0, commit=False, coordinator_epoch=0)    # 5
    plog.append(txn_batch(1, 2, 1))                       # 6 aborted (a new transaction)
    plog.append_marker(2, 0, commit=True, coordinator_epoch=0)     # 7
    plog.append_marker(1, 0, commit=False, coordinator_epoch=0)    # 8
    plog.append(txn_batch(3, 1, 1, txn=False))            # 9
    end = plog.last_stable_offset
    assert end == 10
    everything = [o for o, _ in rows(rng(plog, 0, end))]
    assert everything == [0, 1, 2, 3, 4, 6, 9]            # markers are never rows
    committed = [o for o, _ in rows(rng(plog, 0, end, read_committed=True))]
    assert committed == [2, 3, 4, 9]
    # From inside an aborted transaction, and a split through the middle.
    assert [o for o, _ in rows(rng(plog, 1, 7, read_committed=True))] == [2, 3, 4]
    assert [o for o, _ in rows(rng(plog, 6, 10, read_committed=True))] == [9]


def test_retention_under_a_range_is_data_loss(plog, caplog):
    fill(plog, 40)
    leo = plog.log_end_offset
    plog.delete_records_before(plog.segments[3].base_offset)
    assert plog.apply_retention(now_ms=T0) == 3
    first = plog.log_start_offset
    with pytest.raises(DataLossError, match=rf"Cannot read offsets \[2, {first}\) of t-0: the "
                       rf"log now starts at {first}.*failOnDataLoss"):
        rows(rng(plog, 2, leo))
    with caplog.at_level(logging.WARNING, logger="mq.spark"):
        got = rows(rng(plog, 2, leo, fail_on_data_loss=False))
    assert got == [(o, b"v%d" % o) for o in range(first, leo)]
    assert "Cannot read offsets" in caplog.text
    # A range wholly gone yields nothing.
    assert rows(rng(plog, 0, 3, fail_on_data_loss=False)) == []


def test_a_deleted_partition_is_data_loss(plog, tmp_path):
    fill(plog, 5)
    end = plog.log_end_offset
    r = rng(plog, 0, end)
    assert len(rows(r)) == end                            # the reader is cached now
    plog.close()
    shutil.rmtree(tmp_path / "t-0")
    with pytest.raises(DataLossError, match=rf"\[0, {end}\) of t-0: the log ends before"):
        rows(r)
    assert rows(rng(plog, 0, end, fail_on_data_loss=False)) == []
