"""The consumer's fetcher: where each assigned partition's reading stands, and records decoded
out of the segment maps (``mq.log.reader.PartitionReader``), one batch at a time as they are
taken.

``Fetcher`` holds a ``PartitionCursor`` per assigned partition and the records handed to the
consumer's iterator but not yet yielded. It asks the ``ConsumerDriver`` (its sibling part) for
the partition's slot snapshot (high watermark, last stable offset, readable end) and never
talks to the broker.

Invariants:

- A partition's position (the next offset ``poll`` returns) is the first record handed out but
  not yielded, else the first decoded record not returned, else ``cursor.offset``; every batch
  decoded moves ``cursor.offset`` past it.
- Never returned: records at or past the bound (the high watermark; the last stable offset with
  ``read_committed``), control batches and (``read_committed``) aborted transactions' batches
  (``txnindex.is_visible``), which only move the position.
- A cursor without a position is given one by ``auto_offset_reset`` at its first read, unless
  it is *held*: in a group, a ``read_committed`` consumer waits for the transaction holding its
  committed offset (``ConsumerGroup``) and then starts it with ``start``.
- One read from the map per partition and poll: records already taken are returned before
  anything (an error included) can come of reading again.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable
from typing import Any, NamedTuple

from mq.client.types import TopicPartition
from mq.errors import NoOffsetForPartitionError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from mq.log import native
from mq.log.reader import PartitionReader
from mq.log.txnindex import AbortedTxnFilter, is_visible

__all__ = ["Fetcher", "PartitionCursor", "Record", "TAIL_EMPTY", "TAIL_TOOK", "TAIL_PYTHON"]

# ``Fetcher.take_tail``'s outcomes (``_crecords.tail_take``'s status).
TAIL_EMPTY, TAIL_TOOK, TAIL_PYTHON = range(3)
# ``PartitionReader.tail_state`` of a reader with no segment to go on in: matches none.
_NO_TAIL = (-1, -1, None, 0, -1, 0, 0)


class Record(NamedTuple):
    """One consumed record. ``timestamp_type``: 0 CreateTime, 1 LogAppendTime."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: int
    key: Any
    value: Any
    headers: list

    def __repr__(self) -> str:
        def show(b):
            return b if b is None or not isinstance(b, memoryview) else bytes(b)
        return (f"Record(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
                f"timestamp_ms={self.timestamp_ms}, timestamp_type={self.timestamp_type}, "
                f"key={show(self.key)!r}, value={show(self.value)!r}, "
                f"headers={[(k, show(v)) for k, v in self.headers]!r})")

    def __reduce__(self):
        # Pickling (to a worker process) copies the views into bytes: a memoryview cannot
        # be pickled, and the receiver has no map to point into.
        def b(v):
            return bytes(v) if isinstance(v, memoryview) else v
        return (Record, (self.topic, self.partition, self.offset, self.timestamp_ms,
                         self.timestamp_type, b(self.key), b(self.value),
                         [(k, b(v)) for k, v in self.headers]))


_new_record = tuple.__new__


class PartitionCursor:
    """One assigned partition: where reading stands and what was read but not yet returned.

    ``offset`` is the next offset to decode (None: no position yet). ``batches`` are batches
    read from the map but not decoded (oldest last); ``raw``/``index`` decoded records not yet
    returned, all at offsets >= the position. position = raw[index].offset if any, else
    ``offset``. ``held``: no position until the group starts it (module doc).
    """

    __slots__ = ("tp", "topic_id", "reader", "offset", "paused", "held", "batches", "bound",
                 "raw", "index", "timestamp_type", "aborted", "ready")

    def __init__(self, tp: TopicPartition, reader: PartitionReader) -> None:
        self.tp = tp
        self.topic_id: str | None = None
        self.reader = reader
        self.offset: int | None = None
        self.paused = False
        self.held = False
        self.batches: list = []
        self.bound = 0
        self.raw: list = []
        self.index = 0
        self.timestamp_type = 0
        self.aborted: AbortedTxnFilter | None = None    # read_committed: what to skip
        self.ready = False                # ``raw`` holds public records (the tail take)

    def clear(self) -> None:
        self.aborted = None
        self.batches = []
        self.raw = []
        self.index = 0
        self.ready = False

    def seek(self, offset: int) -> None:
        self.offset = offset
        self.clear()

    @property
    def position(self) -> int | None:
        if self.index < len(self.raw):
            return self.raw[self.index].offset
        return self.offset


class Fetcher:
    """Cursors over the assigned partitions' readers (module doc). ``driver`` gives slot
    snapshots (``driver.state``), the broker generation and the topic metadata."""

    def __init__(self, driver, *, read_committed: bool, auto_offset_reset: str,
                 max_partition_fetch_bytes: int, check_crcs: bool, value_bytes: bool,
                 key_deserializer, value_deserializer) -> None:
        self._driver = driver
        self.read_committed = read_committed
        self.auto_offset_reset = auto_offset_reset
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.check_crcs = check_crcs
        self.value_bytes = value_bytes
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer
        self.cursors: dict[TopicPartition, PartitionCursor] = {}
        self.order: list[PartitionCursor] = []
        self._next_start = 0
        self.tail_python = False          # ``take_tails`` left a partition to ``take``
        self._generation = driver.generation
        self._topics: dict | None = None          # the metadata the cursors' topic ids match
        self._handed: list[Record] = []           # handed to the iterator (``hand_out``)
        self._handed_iter = iter(self._handed)

    # --- assignment -----------------------------------------------------------------------------
    def assign(self, tps: Iterable[TopicPartition]) -> None:
        """Read exactly ``tps`` (known topics), keeping the cursors of those that stay."""
        data_dir, topics = self._driver.data_dir, self._driver.topics
        cursors = {}
        for tp in dict.fromkeys(tps):
            c = self.cursors.get(tp)
            if c is None:
                c = PartitionCursor(tp, PartitionReader(os.path.join(
                    data_dir, f"{tp.topic}-{tp.partition}")))
                c.topic_id = topics[tp.topic]["id"]
            cursors[tp] = c
        for tp, c in self.cursors.items():
            if tp not in cursors:
                c.reader.close()
        self.cursors = cursors
        self.order = list(cursors.values())
        self._next_start = 0

    def cursor(self, tp: TopicPartition) -> PartitionCursor:
        """Raises ``ValueError`` for a partition not assigned."""
        c = self.cursors.get(TopicPartition(*tp))
        if c is None:
            raise ValueError(f"{tp} is not assigned to this consumer")
        return c

    def _sync(self) -> None:
        """Follow the driver: a restarted broker (re-list segments), topics deleted and
        created again under the same name (other files)."""
        driver = self._driver
        if driver.generation != self._generation:
            self._generation = driver.generation
            for c in self.order:
                c.reader.reset()
                c.batches = []
        topics = driver.topics
        if topics is self._topics:
            return
        self._topics = topics
        for c in self.order:
            info = topics.get(c.tp.topic)
            if info is None or c.tp.partition >= info["partitions"]:
                continue                      # the next read raises UnknownTopicOrPartitionError
            if c.topic_id is not None and c.topic_id != info["id"]:
                c.reader.reset()
                c.clear()
            c.topic_id = info["id"]

    # --- positions ------------------------------------------------------------------------------
    def bound(self, st) -> int:
        """The end of what may be returned: the high watermark, or the last stable offset."""
        return st.last_stable_offset if self.read_committed else st.high_watermark

    def reset(self, c: PartitionCursor, st, bad_offset: int | None) -> None:
        """Choose a position by ``auto_offset_reset``, or raise when it is "none"
        (``NoOffsetForPartitionError``, or ``OffsetOutOfRangeError`` for ``bad_offset``)."""
        if self.auto_offset_reset == "earliest":
            c.seek(st.log_start_offset)
        elif self.auto_offset_reset == "latest":
            c.seek(self.bound(st))
        elif bad_offset is None:
            raise NoOffsetForPartitionError(-1, st.log_start_offset, st.high_watermark,
                                            f"{c.tp.topic}-{c.tp.partition}")
        else:
            raise OffsetOutOfRangeError(bad_offset, st.log_start_offset, st.log_end_offset,
                                        f"{c.tp.topic}-{c.tp.partition}")

    def start(self, tp: TopicPartition, committed: int | None) -> None:
        """Position a newly assigned (or held) partition at ``committed`` or, without one, by
        ``auto_offset_reset`` now (Kafka: "latest" is the end at assignment time)."""
        c = self.cursors[tp]
        c.held = False
        if committed is not None:
            c.seek(committed)
        else:
            self.reset(c, self._driver.state(tp), None)

    def hold(self, tp: TopicPartition) -> None:
        """Leave ``tp`` without a position, not read, until ``start``."""
        self.cursors[tp].held = True

    def held(self) -> set[TopicPartition]:
        """Held partitions still without a position."""
        return {c.tp for c in self.order if c.held and c.offset is None}

    def positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Positions (next offset to return) of these partitions, where known."""
        unyielded: dict[TopicPartition, int] = {}
        for rec in self._unyielded():
            unyielded.setdefault(TopicPartition(rec.topic, rec.partition), rec.offset)
        out = {}
        for tp in tps:
            c = self.cursors.get(tp)
            pos = unyielded.get(tp, None if c is None else c.position)
            if pos is not None:
                out[tp] = pos
        return out

    # --- flow control ---------------------------------------------------------------------------
    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Take no records of ``tps`` until ``resume``. Raises ``ValueError`` for a partition
        not assigned."""
        for tp in tps:
            self.cursor(tp).paused = True

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self.cursor(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        return {c.tp for c in self.order if c.paused}

    def watched(self) -> list[tuple[TopicPartition, int]]:
        """``(tp, offset)`` of the partitions a wait is for: unpaused, with a position."""
        return [(c.tp, c.offset) for c in self.order if not c.paused and c.offset is not None]

    # --- records handed to the iterator ---------------------------------------------------------
    def hand_out(self, records: list[Record]) -> Iterable[Record]:
        """Give ``records`` to the iterator; until yielded they still count as unread (their
        partitions' positions are the first of them)."""
        self._handed, self._handed_iter = records, iter(records)
        return self._handed_iter

    def _unyielded(self) -> list[Record]:
        """Records handed out but not yielded yet (a list iterator knows how many are left)."""
        left = self._handed_iter.__length_hint__()
        return self._handed[len(self._handed) - left:] if left else []

    def rewind(self, tps: Iterable[TopicPartition] | None = None) -> None:
        """Take back records handed out but not yielded (all, or of ``tps``): their
        partitions are read again from the first of them. The iterator of the rest is handed
        out afresh (``handed``)."""
        rest = self._unyielded()
        if not rest:
            return
        tps = None if tps is None else set(tps)
        first: dict[TopicPartition, int] = {}
        keep = []
        for r in rest:
            tp = TopicPartition(r.topic, r.partition)
            if tps is None or tp in tps:
                first.setdefault(tp, r.offset)
            else:
                keep.append(r)
        for tp, offset in first.items():
            c = self.cursors.get(tp)
            if c is not None:
                c.seek(offset)
        self._handed_iter.__setstate__(len(self._handed))     # ends a running `yield from`
        self.hand_out(keep)

    @property
    def handed(self):
        """The iterator of the records handed out."""
        return self._handed_iter

    # --- reading --------------------------------------------------------------------------------
    def take(self, session, max_records: int, in_group: bool
             ) -> dict[TopicPartition, list[Record]]:
        """Up to ``max_records`` records of the unpaused partitions, starting with the one
        after the partition that filled the last take (fairness). A deleted partition raises
        ``UnknownTopicOrPartitionError`` (skipped ``in_group``: the group takes it away);
        errors come after the records taken before them."""
        # Decoding creates ~3 GC-tracked objects per record (record, value view, headers list)
        # that all survive the call, so every collection the cyclic GC runs meanwhile finds
        # nothing to free: pausing it for the call doubles throughput (1.3 -> 2.9 M records/s
        # of CPU for 100-byte values); one collection over the survivors follows.
        if not gc.isenabled():
            return self._take_all(session, max_records, in_group)
        gc.disable()
        try:
            return self._take_all(session, max_records, in_group)
        finally:
            gc.enable()

    def _take_all(self, session, max_records: int, in_group: bool
                  ) -> dict[TopicPartition, list[Record]]:
        self._driver.check_metadata(session)
        self._sync()
        out: dict[TopicPartition, list[Record]] = {}
        order = self.order
        n = len(order)
        if not n:
            return out
        start = self._next_start % n
        want = max_records
        for i in range(n):
            c = order[(start + i) % n]
            if c.paused:
                continue
            try:
                records = self._take(session, c, want)
            except UnknownTopicOrPartitionError:
                if in_group:
                    continue              # deleted: the group takes it away at once
                if out:
                    return out
                raise
            except Exception:
                if out:
                    return out            # positions moved past these: return them first;
                raise                     # the error comes from the state and recurs
            if records:
                out[c.tp] = records
                want -= len(records)
                if want <= 0:
                    self._next_start = (start + i + 1) % n     # fairness: next one first
                    break
        return out

    def _take(self, session, c: PartitionCursor, limit: int) -> list[Record]:
        """Up to ``limit`` records of one partition, decoding only what is returned."""
        out: list[Record] = []
        topic, partition = c.tp
        convert = self.value_bytes or self.key_deserializer or self.value_deserializer
        while limit > 0:
            while c.index >= len(c.raw):
                if not c.batches:
                    if out or not self._read_more(session, c):
                        return out
                    if c.index < len(c.raw):
                        break             # the tail take decoded them (``c.ready``)
                try:
                    self._decode_next(c)  # every batch decoded advances the position
                except Exception:
                    if out:
                        return out        # the damaged batch raises again at the next poll
                    raise
            raw, i = c.raw, c.index
            chunk = raw[i:i + limit] if i or len(raw) > limit else raw
            c.index = i + len(chunk)
            limit -= len(chunk)
            tt = c.timestamp_type
            if c.ready:
                out += chunk
            elif convert:
                out += [self._convert(topic, partition, tt, r) for r in chunk]
            else:
                out += [_new_record(Record, (topic, partition, r.offset, r.timestamp, tt, r.key,
                                             r.value, r.headers)) for r in chunk]
        return out

    def _convert(self, topic: str, partition: int, tt: int, r) -> Record:
        key, value, headers = r.key, r.value, r.headers
        if self.value_bytes:
            key = None if key is None else bytes(key)
            value = None if value is None else bytes(value)
            headers = [(k, None if v is None else bytes(v)) for k, v in headers]
        if self.key_deserializer is not None and key is not None:
            key = self.key_deserializer(key)
        if self.value_deserializer is not None and value is not None:
            value = self.value_deserializer(value)
        return _new_record(Record, (topic, partition, r.offset, r.timestamp, tt, key, value,
                                    headers))

    @property
    def _plain(self) -> bool:
        """Records are returned as decoded, every one below the high watermark (no
        ``read_committed`` filter, no conversion): what the C tail takes serve."""
        return not (self.read_committed or self.value_bytes or self.key_deserializer or
                    self.value_deserializer)

    def _take_tail(self, c: PartitionCursor, st, bound: int) -> bool:
        """The tail take: a cursor that goes on where its last read ended, in the segment
        holding the readable end (a consumer caught up, or nearly), reads the plain batches
        there in one C call (``_crecords.take_batches``) into public records in ``c.raw``
        (``c.ready``). False when it does not apply or took no record: then ``reader.read``
        goes on from the position, and the Python path (the reference) skips or raises at
        whatever the C call left to it."""
        take = native.take_batches
        if take is None or not self._plain:
            return False
        window = c.reader.tail_window(c.offset, st.active_segment_base, st.hw_position,
                                      self.max_partition_fetch_bytes,
                                      log_start_offset=st.log_start_offset,
                                      generation=st.segment_generation)
        if window is None:
            return False
        buf, start, end, shift = window
        records, pos, offset, _ = take(buf, start, end, c.offset, bound,
                                       self.max_partition_fetch_bytes, self.check_crcs,
                                       c.tp.topic, c.tp.partition, Record)
        if pos == start:
            return False
        c.reader.advance(offset, shift + pos)
        c.offset = offset
        if not records:
            return False
        c.raw, c.index, c.ready = records, 0, True
        return True

    def tail_cursors(self) -> list[PartitionCursor] | None:
        """The cursors of a fast tail poll (``Consumer._poll_tail``, ``take_tails``): the
        unpaused ones, in this poll's order (``take``'s fairness), when each has a position
        and nothing decoded left to return, on a consumer the C tail take serves (as
        ``_take_tail``), following the driver's topics and broker already (``_sync`` has
        nothing to do); else None. None once after a fast take left a partition to the
        Python path with records of others to return (``tail_python``)."""
        if self.tail_python:
            self.tail_python = False      # that partition's turn: ``take`` reads it
            return None
        if native.tail_take is None or not self._plain:
            return None
        driver = self._driver
        if driver.generation != self._generation or driver.topics is not self._topics:
            return None
        order = self.order
        start = self._next_start % len(order) if order else 0
        out = []
        for c in order[start:] + order[:start]:
            if c.paused:
                continue
            if c.offset is None or c.index < len(c.raw) or c.batches:
                return None
            out.append(c)
        return out or None

    def take_tails(self, session, cursors: list[PartitionCursor], slot_bases: list[int],
                   seqs: list[int], takes: list, max_records: int
                   ) -> tuple[int, dict[TopicPartition, list[Record]]]:
        """One fast take over ``cursors`` (``tail_cursors``), as ``take`` takes: each
        partition's new records in turn, up to ``max_records`` in all (the next poll then
        starts after the partition that filled this one). ``(status, records by
        partition)``: ``TAIL_EMPTY`` nothing readable (``seqs`` holds each slot's sequence to
        sleep on, ``takes`` each partition's ``tail_take`` arguments for the take after the
        wake-up, ``took_tail``), ``TAIL_TOOK`` batches taken, maybe without records (look
        again), ``TAIL_PYTHON`` a partition must be read by ``take``: with records of others,
        they are returned and the next poll starts with ``take`` (``tail_python``)."""
        out: dict[TopicPartition, list[Record]] = {}
        took = False
        for i, c in enumerate(cursors):
            args = self.tail_args(session, c, slot_bases[i])
            takes[i] = args
            enabled = gc.isenabled()      # as ``take``: a large take creates many objects
            if enabled:
                gc.disable()
            try:
                taken = native.tail_take(*args)
            finally:
                if enabled:
                    gc.enable()
            seqs[i] = taken[1]
            status, records = self.took_tail(c, taken, max_records)
            if status == TAIL_PYTHON:
                self.tail_python = bool(out)
                return status, out
            if records:
                out[c.tp] = records
                max_records -= len(records)
                if max_records <= 0:
                    break
            elif status == TAIL_TOOK:
                took = True
        return TAIL_TOOK if out or took else TAIL_EMPTY, out

    def tail_args(self, session, c: PartitionCursor, slot_base: int) -> tuple:
        """The fast tail poll's take of ``c`` (``_crecords.tail_take``), its arguments: the
        slot at ``slot_base`` read, then the new batches after the position, in one C
        call."""
        # No segment to go on in (nothing read yet): the call can still say nothing is there.
        base, generation, view, mapped, fd, position, remap_at = \
            c.reader.tail_state(c.offset) or _NO_TAIL
        topic, partition = c.tp
        return (session.state.region, slot_base, self._driver.meta_version, generation, base,
                view, mapped, fd, position, c.offset, remap_at, self.max_partition_fetch_bytes,
                self.check_crcs, topic, partition, Record)

    def took_tail(self, c: PartitionCursor, taken: tuple, max_records: int
                  ) -> tuple[int, list[Record]]:
        """What ``tail_take`` returned for ``c`` (``taken``: ``(status, seq, records,
        position, offset)``), applied: ``(status, records)``, ``TAIL_EMPTY`` nothing readable
        yet, ``TAIL_TOOK`` records taken (at most ``max_records`` returned, the rest kept for
        the next poll, which then starts after ``c``: ``take``'s fairness), ``TAIL_PYTHON``
        ``take`` must read."""
        status, _, records, position, offset = taken
        if status != TAIL_TOOK:
            return status, []
        c.reader.advance(offset, position)
        c.offset = offset
        if len(records) >= max_records:
            self._next_start = self.order.index(c) + 1
            if len(records) > max_records:
                c.raw, c.index, c.ready = records, max_records, True
                records = records[:max_records]
        return status, records

    def _read_more(self, session, c: PartitionCursor) -> bool:
        """Read batches at the position from the map; False when nothing is readable."""
        st = self._driver.state(c.tp, session)
        self._sync()
        if c.offset is None:
            if c.held:
                return False              # a transaction holds its offsets: not yet
            self.reset(c, st, None)
        elif c.offset < st.log_start_offset or c.offset > st.log_end_offset:
            self.reset(c, st, c.offset)
        bound = self.bound(st)
        if c.offset >= bound:
            return False
        if self._take_tail(c, st, bound):
            return True
        try:
            batches = c.reader.read(c.offset, st.active_segment_base, st.hw_position,
                                    self.max_partition_fetch_bytes,
                                    log_start_offset=st.log_start_offset,
                                    generation=st.segment_generation)
        except OffsetOutOfRangeError:
            # The segment went (retention) between the state snapshot and the read.
            self.reset(c, self._driver.state(c.tp, session), c.offset)
            return False
        while batches and batches[-1].base_offset >= bound:
            batches.pop()
        if self.read_committed and batches:
            c.aborted = AbortedTxnFilter(c.reader.aborted_transactions(batches[0].base_offset,
                                                                       bound))
        batches.reverse()                 # pop() from the end: oldest last
        c.batches, c.bound = batches, bound
        return bool(batches)

    def _decode_next(self, c: PartitionCursor) -> None:
        """Decode pending batches until one yields records at or past the position."""
        batches, bound = c.batches, c.bound
        c.raw, c.index, c.ready = [], 0, False
        while batches:
            batch = batches.pop()
            offset = c.offset
            if not is_visible(batch, c.aborted):
                c.offset = max(offset, min(batch.next_offset, bound))
                continue
            try:
                if self.check_crcs:
                    batch.validate()      # CRC-32C: ~1% of the decode time (Kafka's default)
                records = batch.records()
            except Exception:
                c.batches = []            # read again from the position: raise again
                raise
            if batch.base_offset < offset or batch.last_offset >= bound:
                records = [r for r in records if offset <= r.offset < bound]
            c.offset = max(offset, min(batch.next_offset, bound))
            if records:
                c.raw, c.timestamp_type = records, batch.timestamp_type
                return

    def close(self) -> None:
        """Close the readers (maps under live records stay until those go) and end a running
        iteration. Idempotent."""
        for c in self.order:
            c.reader.close()
            c.clear()
        self.cursors, self.order = {}, []
        self._handed_iter.__setstate__(len(self._handed))     # a suspended loop ends
        self.hand_out([])
