"""The producer's record accumulator: a batch's records section that also makes each record's
future, so ``send()`` costs one call a record (in C when the extension is built).

Pure. ``RecordAccumulator`` is ``mq.log.builder.RecordEncoder`` plus ``add``/``extend``, which
append a record and return ``future_type(owner, offset delta, timestamp)``, a ``RecordFuture``:
the batch, the record's offset delta and timestamp — a view into the batch's outcome, no
object of its own beyond those three fields. ``Accumulator`` and ``FutureBase`` are the C twins
``_crecords.RecordAccumulator``/``RecordFuture`` when built (``mq.log.native``; ``add`` then
runs no Python code), else these pure-Python references, which the C code mirrors byte for
byte (tests/unit/log/test_crecords.py). A producer's futures must derive from ``FutureBase``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mq.log import native
from mq.log.builder import BatchBuilder, RecordEncoder
from mq.log.compression import NONE
from mq.log.layout import NO_TIMESTAMP

__all__ = ["RecordFuture", "RecordAccumulator", "Accumulator", "FutureBase",
           "ProducerBatchBuilder"]


class RecordFuture:
    """Base of the producer's per-record future (``producer_batches.FutureRecordMetadata``):
    the batch, the record's offset delta and timestamp. ``_crecords.RecordFuture`` is the same
    in C, which ``RecordAccumulator.add`` fills without running Python code."""

    __slots__ = ("_batch", "_delta", "_ts")

    def __init__(self, batch: Any, delta: int, timestamp_ms: int) -> None:
        self._batch = batch
        self._delta = delta
        self._ts = timestamp_ms


class RecordAccumulator(RecordEncoder):
    """The pure-Python reference of ``_crecords.RecordAccumulator``: ``append`` is
    ``BatchBuilder.append``; ``add(timestamp_ms, key, value, headers)`` appends with the next
    offset delta and returns ``future_type(owner, delta, timestamp)`` — the producer's whole
    per-record step in one call. ``capacity`` (a full batch's bytes, when known) and
    ``buffer`` (a finished batch's bytearray to reuse) only serve the C twin, which builds the
    batch in place."""

    __slots__ = ("_future_type", "_owner")

    def __init__(self, delete_horizon_ms: int = NO_TIMESTAMP, future_type: type | None = None,
                 owner: Any = None, capacity: int = 0, buffer: bytearray | None = None) -> None:
        super().__init__(delete_horizon_ms)
        self._future_type = future_type
        self._owner = owner

    def add(self, timestamp_ms: int | None, key, value, headers: Sequence) -> Any:
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        return self._future(self.append(timestamp_ms, key, value, headers), timestamp_ms)

    def _future(self, delta: int, timestamp_ms: int) -> Any:
        if self._future_type is None:
            raise TypeError("add() needs an accumulator with a future_type")
        fut = object.__new__(self._future_type)
        RecordFuture.__init__(fut, self._owner, delta, timestamp_ms)
        return fut

    def extend(self, timestamp_ms: int | None, values: list, keys: list | None,
               headers: Sequence, start: int, limit: int, out: list) -> int:
        """``add`` for ``values[start:]`` (with ``keys[i]``, or None; one timestamp, None:
        now, and the same headers for all), each future appended to ``out``, while the batch
        stays within ``limit`` bytes (an empty batch takes its first record whatever its
        size); returns the index of the first record left out."""
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        i = start
        while i < len(values):
            mark = self.checkpoint()
            delta = self.append(timestamp_ms, None if keys is None else keys[i], values[i],
                                headers)
            if mark[2] and self.size > limit:          # does not fit: take it back out
                self.rollback(mark)
                break
            out.append(self._future(delta, timestamp_ms))
            i += 1
        return i


# What a producer's batch accumulates into, and the base its futures must derive from.
Accumulator: Any = RecordAccumulator
FutureBase: Any = RecordFuture
if native.RecordAccumulator is not None:
    Accumulator, FutureBase = native.RecordAccumulator, native.RecordFuture


class ProducerBatchBuilder(BatchBuilder):
    """A ``BatchBuilder`` over the producer's ``Accumulator``: ``add`` is the accumulator's,
    one call a record that returns its future. ``future_type``/``owner``: see
    ``RecordAccumulator.add``; ``capacity``: the bytes of a full batch, if known (the C
    accumulator sizes its buffer); ``buffer``: a ``bytearray`` nothing else holds (a finished
    batch's), for the C accumulator to build this batch in."""

    __slots__ = ("add",)

    def __init__(self, *, future_type: type, owner: Any, compression: int = NONE,
                 capacity: int = 0, buffer: bytearray | None = None) -> None:
        acc = Accumulator(NO_TIMESTAMP, future_type, owner, capacity, buffer)
        super().__init__(compression=compression, records=acc)
        self.add = acc.add
