"""``PartitionLog.first_timestamp_from``: the timestamp of the oldest record a reader at an
offset has not seen (what dates a group's lag), against the records decoded one by one."""

from __future__ import annotations

import tempfile

from builders import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from mq.log.builder import BatchBuilder
from mq.log.config import LogConfig
from mq.log.log import PartitionLog

T0 = 1_700_000_000_000


def reference(plog: PartitionLog, offset: int) -> int | None:
    """The first data record at or after ``offset`` below the high watermark, decoded."""
    start = max(offset, plog.log_start_offset)
    for batch in plog.batches(start):
        if batch.is_control:
            continue
        for record in batch.records():
            if start <= record.offset < plog.high_watermark:
                return record.timestamp
    return None


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=25),
       segment_bytes=st.sampled_from([200, 600, 1 << 20]),
       deleted=st.integers(0, 30))
def test_matches_the_records_at_every_offset(sizes, segment_bytes, deleted):
    with tempfile.TemporaryDirectory() as tmp:
        plog = PartitionLog.open(tmp + "/t-0", LogConfig(segment_bytes=segment_bytes,
                                                         index_interval_bytes=100))
        try:
            ts = T0
            for n in sizes:
                plog.append(make_batch(n, timestamp=ts, ts_step=7))
                ts += 7 * n + 1000
            plog.delete_records_before(min(deleted, plog.high_watermark))
            for offset in range(plog.log_end_offset + 2):
                assert plog.first_timestamp_from(offset) == reference(plog, offset), offset
        finally:
            plog.close()


def test_steps_over_markers_and_stops_at_the_high_watermark(tmp_path):
    plog = PartitionLog.open(str(tmp_path / "t-0"), LogConfig())
    try:
        txn = BatchBuilder(producer_id=7, producer_epoch=0, base_sequence=0,
                           is_transactional=True)
        txn.append(T0, None, b"a")
        plog.append(txn.build())                                       # offset 0
        plog.append_marker(7, 0, commit=True, now_ms=T0 + 5)           # offset 1: a marker
        plog.append(make_batch(2, timestamp=T0 + 100, ts_step=1))      # offsets 2, 3
        assert plog.first_timestamp_from(0) == T0
        assert plog.first_timestamp_from(1) == T0 + 100                # the marker is no record
        assert plog.first_timestamp_from(3) == T0 + 101
        assert plog.first_timestamp_from(4) is None                    # caught up
        plog.high_watermark = 2
        assert plog.first_timestamp_from(1) is None                    # nothing readable yet
    finally:
        plog.close()
