"""What the log cleaner needs to know about transactions (Kafka's CleanedTransactionMetadata).

The cleaner walks batches in offset order. ``TxnTracker`` is told the aborted transactions
that overlap the walk (from the segments' ``.txnindex``: ``collect_aborted``) and says, batch by
batch:

- ``is_aborted(batch)``: a transactional data batch of a producer inside an aborted transaction
  (from its first offset to its ABORT marker). Its records are dropped whatever their keys,
  and they never enter the offset map (an aborted record must not shadow a committed one);
- ``on_marker(batch)``: whether a COMMIT/ABORT marker may go — only once no data batch of its
  transaction was seen in this walk (the data is gone: compacted away, or aborted and dropped
  by an earlier walk). A marker that may go first gets a delete horizon (``now +
  delete.retention.ms``, as tombstones do) and goes in a later pass, so a reader that fetched
  the transaction's data before the clean still meets its marker.

Only data below the last stable offset is ever cleaned, so every transaction with data in the
walk is decided: its marker is in the log, and an abort is in a ``.txnindex``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from mq.log import files
from mq.log.records import CONTROL_ABORT, CONTROL_COMMIT, RecordBatch
from mq.log.txnindex import AbortedTxn, read_entries

__all__ = ["TxnTracker", "collect_aborted"]


def collect_aborted(segments: Sequence, start: int, end: int) -> list[AbortedTxn]:
    """Aborted transactions overlapping ``[start, end)``, from every segment's ``.txnindex``
    (a marker may lie in a later segment than its data, even the active one). Files are read,
    not the segments' index objects: the cleaner runs off the thread that appends."""
    out: list[AbortedTxn] = []
    for seg in segments:
        path = os.path.join(seg.dir, files.segment_name(seg.base_offset, files.TXNINDEX_SUFFIX)
                            + seg.suffix)
        out += [t for t in read_entries(path) if t.last_offset >= start and t.first_offset < end]
    return sorted(out, key=lambda t: t.first_offset)


class TxnTracker:
    """The transactions a walk over batches is inside of (see the module doc)."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda t: t.first_offset)
        self._next = 0
        self._aborted: dict[int, list] = {}       # producer id -> [AbortedTxn, data seen]
        self._committed: set[int] = set()          # producers with committed data seen
        self.by_marker = {t.last_offset: t for t in self._pending}

    def _advance(self, offset: int) -> None:
        pending = self._pending
        while self._next < len(pending) and pending[self._next].first_offset <= offset:
            txn = pending[self._next]
            self._aborted[txn.producer_id] = [txn, False]
            self._next += 1

    def is_aborted(self, batch: RecordBatch) -> bool:
        """A data batch: True if it belongs to an aborted transaction."""
        self._advance(batch.last_offset)
        if not batch.is_transactional or batch.producer_id < 0:
            return False
        entry = self._aborted.get(batch.producer_id)
        if entry is not None:
            entry[1] = True
            return True
        self._committed.add(batch.producer_id)
        return False

    def on_marker(self, batch: RecordBatch) -> bool:
        """A control batch: True if it may go (no data of its transaction seen)."""
        self._advance(batch.last_offset)
        ctype = batch.control_type()
        pid = batch.producer_id
        if ctype == CONTROL_ABORT:
            entry = self._aborted.pop(pid, None)
            return entry is None or not entry[1]
        if ctype == CONTROL_COMMIT:
            seen = pid in self._committed
            self._committed.discard(pid)
            return not seen
        return False
