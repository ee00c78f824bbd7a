"""Hypothesis: ``txnindex.is_visible`` over a walk of batches in offset order shows exactly what a
model of the transactions says — the one rule the consumer, Spark's reader and the cleaner's
offset map skip by.

A walk is drawn as steps of producers 1..3: a plain batch, a transactional batch (opening the
producer's transaction if none is open), a COMMIT or an ABORT marker (of the producer's open
transaction, or a marker with no data before it, as a coordinator may write). Every
transaction is decided by the end (readers only walk below the last stable offset). The
``.txnindex`` entries come from the model: first data offset to the ABORT marker's offset.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mq.log.batch import RecordBatch
from mq.log.builder import BatchBuilder, control_batch
from mq.log.layout import CONTROL_ABORT, CONTROL_COMMIT
from mq.log.txnindex import AbortedTxn, AbortedTxnFilter, is_visible

STEPS = st.lists(st.tuples(st.integers(1, 3), st.sampled_from(["plain", "txn", "commit", "abort"]),
                           st.integers(1, 3)), max_size=40)


def _data(offset: int, pid: int, count: int, transactional: bool) -> RecordBatch:
    builder = BatchBuilder(base_offset=offset, producer_id=pid, producer_epoch=0,
                           base_sequence=0, is_transactional=transactional)
    for i in range(count):
        builder.append(1_000, None, b"%d" % (offset + i))
    return RecordBatch(memoryview(bytes(builder.build())))


def _marker(offset: int, pid: int, kind: int) -> RecordBatch:
    return RecordBatch(memoryview(bytes(control_batch(kind, producer_id=pid, producer_epoch=0,
                                                      base_offset=offset))))


def _walk(steps) -> tuple[list[RecordBatch], list[bool], list[AbortedTxn]]:
    """The batches, whether a read_committed reader sees each, and the aborted transactions."""
    batches: list[RecordBatch] = []
    visible: list[bool] = []
    aborted: list[AbortedTxn] = []
    open_txn: dict[int, list[int]] = {}      # producer -> indexes of its undecided data batches
    offset = 0

    def end(pid: int, kind: int) -> None:
        nonlocal offset
        members = open_txn.pop(pid, [])
        if kind == CONTROL_ABORT and members:
            aborted.append(AbortedTxn(pid, batches[members[0]].base_offset, offset, offset + 1))
        for i in members:
            visible[i] = kind == CONTROL_COMMIT
        batches.append(_marker(offset, pid, kind))
        visible.append(False)
        offset += 1

    for pid, what, count in steps:
        if what in ("plain", "txn"):
            transactional = what == "txn"
            batches.append(_data(offset, pid, count, transactional))
            visible.append(not transactional)
            if transactional:
                open_txn.setdefault(pid, []).append(len(batches) - 1)
            offset += count
        else:
            end(pid, CONTROL_COMMIT if what == "commit" else CONTROL_ABORT)
    for pid in sorted(open_txn):
        end(pid, CONTROL_ABORT)
    return batches, visible, aborted


@settings(max_examples=150)
@given(STEPS)
def test_read_committed_sees_exactly_the_committed_and_plain_data(steps):
    batches, visible, aborted = _walk(steps)
    txns = AbortedTxnFilter(aborted)
    assert [is_visible(b, txns) for b in batches] == visible


@settings(max_examples=50)
@given(STEPS)
def test_read_uncommitted_sees_every_data_batch_and_no_marker(steps):
    batches, _, _ = _walk(steps)
    assert [is_visible(b, None) for b in batches] == [not b.is_control for b in batches]


def test_a_producer_commits_after_its_abort():
    """The ABORT marker ends the aborted transaction: the producer's next one is seen."""
    batches, visible, aborted = _walk([(1, "txn", 2), (2, "plain", 1), (1, "abort", 1),
                                       (1, "txn", 1), (1, "commit", 1)])
    assert visible == [False, True, False, True, False]
    assert aborted == [AbortedTxn(1, 0, 3, 4)]
    txns = AbortedTxnFilter(aborted)
    assert [is_visible(b, txns) for b in batches] == visible


@settings(max_examples=150)
@given(STEPS, st.integers(0, 80))
def test_a_walk_that_starts_later_sees_the_same(steps, start):
    """A walk from any batch on (the cleaner's later group of segments, a consumer that
    seeked) with every aborted transaction of the log sees what the whole walk sees there: a
    transaction whose ABORT marker lies behind the start takes none of the producer's later
    batches with it."""
    batches, visible, aborted = _walk(steps)
    start = min(start, len(batches))
    txns = AbortedTxnFilter(aborted)
    assert [is_visible(b, txns) for b in batches[start:]] == visible[start:]


def test_an_abort_before_the_walk_does_not_hide_a_later_commit():
    batches, visible, aborted = _walk([(1, "txn", 1), (1, "abort", 1), (2, "plain", 1),
                                       (1, "txn", 1), (1, "commit", 1)])
    txns = AbortedTxnFilter(aborted)
    assert [is_visible(b, txns) for b in batches[2:]] == visible[2:] == [True, True, False]
