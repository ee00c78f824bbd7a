"""The producer-state table (``mq.log.producer_state``): Kafka's sequence, epoch and
transaction rules, the last stable offset, expiry and the snapshot format."""

from __future__ import annotations

import struct

import pytest

from mq import errors
from mq.log.producer_state import (
    BATCHES_TO_RETAIN,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    read_snapshot,
    snapshot_offsets,
    write_snapshot,
)

PID = 1000


def add(psm, seq, count, offset, *, pid=PID, epoch=0, txn=False, ts=1):
    psm.append(pid, epoch, seq, seq + count - 1, offset, offset + count - 1, ts, txn)


def test_in_sequence_batches_pass_and_a_retry_is_a_duplicate_with_its_offsets():
    psm = ProducerStateManager()
    assert psm.check(PID, 0, 0, 2, False) is None           # unknown producer: any start
    add(psm, 0, 3, 10)
    assert psm.check(PID, 0, 3, 4, False) is None
    add(psm, 3, 2, 13)
    dup = psm.check(PID, 0, 0, 2, False)
    assert (dup.first_offset, dup.last_offset) == (10, 12)
    dup = psm.check(PID, 0, 3, 4, False)
    assert (dup.first_offset, dup.last_offset) == (13, 14)
    assert psm.map_end_offset == 15


def test_only_the_last_five_batches_are_duplicates_older_ones_are_out_of_order():
    psm = ProducerStateManager()
    for i in range(BATCHES_TO_RETAIN + 1):
        add(psm, i, 1, 100 + i)
    with pytest.raises(errors.OutOfOrderSequenceError):
        psm.check(PID, 0, 0, 0, False)
    assert psm.check(PID, 0, 1, 1, False).last_offset == 101


def test_gaps_partial_overlaps_and_old_epochs_are_refused():
    psm = ProducerStateManager()
    add(psm, 0, 3, 0, epoch=2)
    with pytest.raises(errors.OutOfOrderSequenceError, match="does not follow 2"):
        psm.check(PID, 2, 5, 5, False)
    with pytest.raises(errors.OutOfOrderSequenceError):
        psm.check(PID, 2, 1, 3, False)                      # overlaps, not a duplicate
    with pytest.raises(errors.InvalidProducerEpochError, match="newer producer"):
        psm.check(PID, 1, 3, 3, False)
    with pytest.raises(errors.OutOfOrderSequenceError, match="not 0"):
        psm.check(PID, 3, 3, 3, False)                      # a bump starts at 0
    assert psm.check(PID, 3, 0, 0, False) is None


def test_sequence_wraps_after_int32_max():
    psm = ProducerStateManager()
    top = (1 << 31) - 1
    psm.append(PID, 0, top - 1, top, 0, 1, 1, False)
    assert psm.check(PID, 0, 0, 4, False) is None
    with pytest.raises(errors.OutOfOrderSequenceError):
        psm.check(PID, 0, 1, 4, False)


def test_transactions_set_the_last_stable_offset_and_markers_close_them():
    psm = ProducerStateManager()
    assert psm.last_stable_offset(50) == 50
    add(psm, 0, 2, 10, pid=1, txn=True)
    add(psm, 0, 1, 12, pid=2, txn=True)
    add(psm, 2, 1, 13, pid=1, txn=True)
    assert psm.first_unstable_offset == 10 and psm.last_stable_offset(14) == 10
    assert psm.open_transactions() == [(1, 10), (2, 12)]
    with pytest.raises(errors.InvalidTxnStateError):
        psm.check(1, 0, 3, 3, False)                        # plain batch inside a txn
    done = psm.complete_txn(1, 0, 5, marker_offset=14, aborted=True, timestamp=2)
    assert (done.producer_id, done.first_offset, done.last_offset, done.aborted) == \
        (1, 10, 14, True)
    assert psm.first_unstable_offset == 12
    done = psm.complete_txn(2, 0, 5, 15, aborted=False, timestamp=2)
    assert psm.first_unstable_offset is None and psm.last_stable_offset(16) == 16
    # Sequences go on across transactions of one epoch (Kafka's producers keep counting).
    assert psm.check(1, 0, 3, 3, True) is None
    with pytest.raises(errors.OutOfOrderSequenceError):
        psm.check(1, 0, 0, 0, True)
    # A marker of a newer epoch (a fence) starts the window over.
    psm.complete_txn(1, 1, 5, 16, aborted=True, timestamp=3)
    assert psm.check(1, 1, 0, 0, True) is None


def test_markers_from_an_older_coordinator_or_epoch_are_fenced():
    psm = ProducerStateManager()
    add(psm, 0, 1, 0, txn=True, epoch=4)
    psm.complete_txn(PID, 4, 7, 1, aborted=False, timestamp=1)
    with pytest.raises(errors.TransactionCoordinatorFencedError):
        psm.check_marker(PID, 4, 6)
    with pytest.raises(errors.InvalidProducerEpochError):
        psm.check_marker(PID, 3, 7)
    psm.check_marker(PID, 5, 7)
    assert psm.complete_txn(PID, 5, 7, 9, aborted=True, timestamp=1) is None   # none open
    assert psm.producers[PID].epoch == 5


def test_expiry_keeps_producers_with_open_transactions():
    psm = ProducerStateManager()
    add(psm, 0, 1, 0, pid=1, ts=100)
    add(psm, 0, 1, 1, pid=2, ts=100, txn=True)
    add(psm, 0, 1, 2, pid=3, ts=900)
    assert psm.expire(now_ms=1000, expiration_ms=500) == 1
    assert sorted(psm.producers) == [2, 3]


def test_snapshot_round_trip_keeps_the_last_batch_and_the_open_transaction(tmp_path):
    psm = ProducerStateManager()
    for i in range(3):
        add(psm, i * 2, 2, i * 2, pid=7, epoch=3, ts=50 + i)
    add(psm, 0, 1, 6, pid=8, txn=True, ts=70)
    psm.complete_txn(9, 1, 4, 7, aborted=False, timestamp=80)
    write_snapshot(str(tmp_path), 8, psm.producers.values())
    assert snapshot_offsets(str(tmp_path)) == [8]
    data = (tmp_path / "00000000000000000008.snapshot").read_bytes()
    assert len(data) == 10 + 3 * 46 and struct.unpack_from(">h", data)[0] == 1
    loaded = {e.producer_id: e for e in read_snapshot(str(tmp_path), 8)}
    assert [(b.first_seq, b.last_seq, b.first_offset, b.last_offset)
            for b in loaded[7].batches] == [(4, 5, 4, 5)]
    assert (loaded[7].epoch, loaded[7].last_timestamp) == (3, 52)
    assert loaded[8].current_txn_first_offset == 6
    assert (loaded[9].coordinator_epoch, loaded[9].current_txn_first_offset) == (4, -1)
    fresh = ProducerStateManager()
    fresh.truncate_and_reload(loaded.values(), 8)
    assert fresh.first_unstable_offset == 6
    assert fresh.check(7, 3, 4, 5, False).last_offset == 5     # the last batch: a duplicate
    assert fresh.check(7, 3, 6, 6, False) is None


def test_a_damaged_snapshot_is_refused():
    good = encode_snapshot(ProducerStateManager().producers.values())
    assert decode_snapshot(good) == []
    for bad, why in ((good[:5], "too short"), (b"\x00\x02" + good[2:], "version"),
                     (good + b"\x00", "CRC"), (good[:6] + b"\x00\x00\x00\x01", "CRC")):
        with pytest.raises(errors.CorruptRecordError, match=why):
            decode_snapshot(bad)
