"""A partition log with idempotent and transactional producers: duplicates answered with
their first offsets, sequence and epoch checks, transaction markers, the last stable offset,
``.txnindex``, producer snapshots across clean and unclean restarts, truncation and retention,
and ``leader-epoch-checkpoint``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mq import errors
from mq.log import files
from mq.log.builder import BatchBuilder
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.log.producer_state import snapshot_offsets
from mq.log.txnindex import AbortedTxn, read_entries

CFG = LogConfig(segment_bytes=400, index_interval_bytes=100, file_delete_delay_ms=0)
T0 = 1_700_000_000_000


def batch(pid, seq, n=1, *, epoch=0, txn=False, value=b"v"):
    b = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                     is_transactional=txn)
    for i in range(n):
        b.append(T0 + seq + i, None, value + b"%d" % (seq + i))
    return b.build()


def values(plog, start=0):
    return [(r.offset, bytes(r.value)) for b in plog.batches(start) if not b.is_control
            for r in b.records()]


@pytest.fixture
def open_log(tmp_path):
    opened = []

    def factory(**kw) -> PartitionLog:
        plog = PartitionLog.open(str(tmp_path / "t-0"), CFG, now_ms=T0, **kw)
        opened.append(plog)
        return plog
    yield factory
    for plog in opened:
        plog.close()


def test_a_retried_batch_is_answered_with_its_first_offsets_and_not_appended(open_log):
    plog = open_log()
    first = plog.append(batch(7, 0, 3))
    second = plog.append(batch(7, 3, 2))
    again = plog.append(batch(7, 0, 3))
    assert again.duplicate and (again.first_offset, again.last_offset) == (0, 2)
    assert not first.duplicate and second.first_offset == 3
    assert plog.log_end_offset == 5 and len(values(plog)) == 5
    with pytest.raises(errors.OutOfOrderSequenceError):
        plog.append(batch(7, 9))
    with pytest.raises(errors.InvalidRecordError):
        plog.append(batch(7, -1))
    assert plog.log_end_offset == 5


def test_transactions_hold_the_last_stable_offset_and_aborts_go_to_the_txnindex(open_log):
    plog = open_log()
    plog.append(batch(1, 0, 2, txn=True))                 # offsets 0-1, txn of 1 opens at 0
    plog.append(batch(2, 0, 1, txn=True))                 # 2, txn of 2 opens at 2
    plog.append(batch(3, 0, 1))                           # 3, not transactional
    assert plog.last_stable_offset == 0 and plog.high_watermark == 4
    aborted = plog.append_marker(1, 0, commit=False, coordinator_epoch=5)   # 4
    assert plog.last_stable_offset == 2
    committed = plog.append_marker(2, 0, commit=True, coordinator_epoch=5)  # 5
    assert (aborted.first_offset, committed.first_offset) == (4, 5)
    assert plog.last_stable_offset == plog.log_end_offset == 6
    assert plog.active_segment.txn_index.entries == [AbortedTxn(1, 0, 4, 2)]
    with pytest.raises(errors.TransactionCoordinatorFencedError):
        plog.append_marker(2, 0, commit=True, coordinator_epoch=4)
    with pytest.raises(errors.InvalidTxnStateError):
        plog.append(batch(1, 2, 1, txn=True))             # sequences go on: opens a new txn
        plog.append(batch(1, 3, 1))                       # ...then a plain batch inside it


def test_producer_state_survives_a_clean_restart_through_the_snapshot(open_log, tmp_path):
    plog = open_log()
    plog.append(batch(7, 0, 2))
    plog.append(batch(8, 0, 1, txn=True))
    plog.close()
    assert snapshot_offsets(plog.dir) == [3]
    plog = open_log(clean_shutdown=True, recovery_point=3)
    assert plog.append(batch(7, 0, 2)).duplicate           # the last batch is remembered
    assert plog.last_stable_offset == 2                   # producer 8's txn is still open
    with pytest.raises(errors.OutOfOrderSequenceError):
        plog.append(batch(7, 5))


def test_an_unclean_restart_replays_the_log_and_rebuilds_the_txnindex(open_log, tmp_path):
    plog = open_log()
    for i in range(6):                                   # several segments, snapshots at rolls
        plog.append(batch(1, i * 2, 2, txn=True, value=b"x" * 40))
    plog.append_marker(1, 0, commit=False)
    plog.append(batch(2, 0, 1, txn=True))
    end = plog.log_end_offset
    txn_files = [n for n in os.listdir(plog.dir) if n.endswith(".txnindex")]
    assert len(plog.segments) > 2 and len(txn_files) == 1
    expected = read_entries(os.path.join(plog.dir, txn_files[0]))
    # A crash: nothing closed; then the .txnindex and the snapshots are lost too.
    plog.closed = True
    for name in os.listdir(plog.dir):
        if name.endswith((".txnindex", ".snapshot")):
            os.unlink(os.path.join(plog.dir, name))
    plog = open_log(recovery_point=0)
    assert plog.log_end_offset == end
    assert read_entries(os.path.join(plog.dir, txn_files[0])) == expected
    assert plog.producers.open_transactions() == [(2, end - 1)]
    assert plog.append(batch(2, 0, 1, txn=True)).duplicate


def test_truncation_rewinds_the_producer_state(open_log):
    plog = open_log()
    plog.append(batch(7, 0, 1))
    plog.append(batch(7, 1, 1))
    plog.truncate_to(1)
    assert not plog.append(batch(7, 1, 1)).duplicate      # it was cut: appended again
    assert values(plog) == [(0, b"v0"), (1, b"v1")]


def test_retention_takes_the_snapshots_of_deleted_segments(open_log):
    plog = open_log()
    for i in range(8):
        plog.append(batch(1, i, 1, value=b"y" * 80))
    before = snapshot_offsets(plog.dir)
    assert len(before) >= 2
    plog.delete_records_before(plog.segments[-1].base_offset)
    plog.apply_retention(now_ms=T0)
    assert snapshot_offsets(plog.dir) == [o for o in before if o >= plog.segments[0].base_offset]


def test_leader_epoch_checkpoint_records_where_each_epoch_began(open_log):
    plog = open_log()
    plog.append(batch(1, 0, 2), leader_epoch=3)
    plog.append(batch(1, 2, 1), leader_epoch=3)
    plog.append(batch(1, 3, 1), leader_epoch=5)
    path = Path(plog.dir) / "leader-epoch-checkpoint"
    assert path.read_text() == "0\n2\n3 0\n5 3\n"
    plog.truncate_to(3)
    assert path.read_text() == "0\n1\n3 0\n"
    assert files.parse_segment_name("leader-epoch-checkpoint") is None
