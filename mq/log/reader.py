"""Read-only view of one partition directory for client processes: consumers, the CLI, Spark.

The broker owns every file; a reader only opens them ``O_RDONLY`` and never writes, locks or
renames. What may be read is decided by the caller, from the state the broker publishes in
shared memory: the *readable end* is a segment base offset and a byte position in that segment
(where the high watermark's batch starts). Nothing at or past it is ever returned. Without a
broker (``mq dump-log``-style use) the readable end is the end of the last whole batch on disk.

::

    <topic>-<partition>/
      00000000000000000000.log     mapped read-only (ACCESS_READ), sliced, never copied
      00000000000000000000.index   read with pread, only to find where a scan starts
      00000000000000001234.log     ...  (the active segment grows while it is mapped)

Invariants and policies:

- ``read`` returns whole batches (``RecordBatch`` views over memoryview slices), starting with
  the batch that holds the wanted offset (or, across a gap left by compaction, the first batch
  whose last offset is >= it), and never a byte at or past the readable end.
- The scan of batch headers decides; the ``.index`` only gives a starting position. An entry is
  used only if it lies before the readable end and a batch header found there ends at the
  offset the entry names; otherwise (bytes that are no batch header included: mid-swap the
  ``.index`` found can be another file's) the scan starts at byte 0. An active segment's index is
  preallocated with zeros and is trimmed (shrunk) by the broker at roll, so it is read with
  ``pread`` — a mapped index could raise SIGBUS once the broker shrinks the file under it —
  and zero entries count as "past the end" in the floor search.
- Maps: a segment is mapped at its size when first read. A segment that is no longer the one
  holding the readable end has its final size, so it is remapped at most once more. The segment
  holding the readable end grows: data past its map is read with ``pread`` (a copy of at most
  ``max_bytes``) until the unmapped part reaches ``max(remap_bytes, mapped length / 8)``, then
  the file is remapped at its current size. So a reader that keeps every record it ever read
  pins O(log size) maps per segment, not one per poll (each map also holds a file descriptor).
- Lifetime: maps are never closed while views of them exist. Dropping a map only drops this
  reader's reference: the ``memoryview`` slices handed out (batches, record keys and values)
  keep the ``mmap`` object alive, and CPython unmaps it when the last slice is released. On
  Linux a mapping stays valid after its file is renamed or unlinked, so records of a segment
  that retention deleted stay readable for as long as they are referenced. (A segment file
  truncated under the map — only an unclean broker restart that cuts a torn tail does that —
  would raise SIGBUS on pages past the new end; the broker publishes readable ends below it.)
- Re-listing: the segment list is read with ``os.listdir`` at open, when the broker's
  segment-set generation changes, and when the readable end names a segment not yet listed.
  Segments that disappeared or whose file was replaced (another inode) are dropped (maps as
  above); a file that vanished between the listing and the open is looked for under its
  ``.deleted`` name (Kafka renames before it deletes), else the read raises
  ``OffsetOutOfRangeError``.
- Compaction swaps (``PartitionLog.replace_segments``) rename ``.cleaned`` -> ``.swap``, the
  replaced segments -> ``.deleted``, then ``.swap`` -> final names. Between the second and the
  third step no ``.log`` holds the group's offsets: a listing that took only ``.log`` files
  would have a hole there, and a read would go on to the next segment's first batch, past
  every record of the group — latest values included. So a ``<base>.log.swap`` is listed as
  the segment of ``<base>``, ahead of a ``<base>.log`` (the one it replaces): its offsets run
  to the end of the group, so every listing covers every offset. The segment's files are
  then opened under their ``.swap`` names, else under the final names the swap renames them
  to. Replaced segments still listed overlap it: a read goes on by offset, so they only add
  a scan that finds nothing new, or serve pre-clean bytes (which hold every latest record).
- Positions are per file: the sequential-read hint and a rolled segment's final size are
  dropped when the segment's file turns out to be another inode (a swap at the same base),
  also when a segment closed by the map limit is opened again.
"""

from __future__ import annotations

import bisect
import collections
import mmap
import os
import struct
from typing import Final

from mq.errors import ClosedError, CorruptRecordError, OffsetOutOfRangeError
from mq.log import files
from mq.log.batch import RecordBatch
from mq.log.index import OFFSET_ENTRY, floor_slot
from mq.log.layout import (
    BASE_TIMESTAMP_OFFSET,
    FRAME,
    HEADER,
    HEADER_SIZE_UP_TO_MAGIC,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    RECORD_BATCH_OVERHEAD,
)
from mq.log.txnindex import AbortedTxn, read_entries

__all__ = ["PartitionReader", "DEFAULT_REMAP_BYTES", "DEFAULT_MAX_MAPPED_SEGMENTS"]

DEFAULT_REMAP_BYTES: Final = 1 << 20
DEFAULT_MAX_MAPPED_SEGMENTS: Final = 16

# Leading fields of ``layout.HEADER`` (the one definition of the batch header). A scan needs
# the first seven, 27 bytes: baseOffset, batchLength, partitionLeaderEpoch, magic, crc,
# attributes, lastOffsetDelta; a tail too short for a header only the frame (17 bytes).
_SCAN: Final = struct.Struct(HEADER.format[:8])
assert _SCAN.size == BASE_TIMESTAMP_OFFSET
# ``.index`` slots that cannot be used sort after every offset: the entries are a prefix of
# increasing (offset, position) pairs followed by preallocated zeros.
_PAST_END: Final = 1 << 63


class _Segment:
    """One ``.log`` file: its descriptor, its current map and whether its size is final."""

    __slots__ = ("base", "path", "swapping", "fd", "ino", "map", "view", "mapped", "final_size",
                 "txns")

    def __init__(self, base: int, path: str, swapping: bool = False) -> None:
        self.base = base
        self.path = path
        self.swapping = swapping      # listed by its ``.swap`` file (module doc)
        self.fd = -1
        self.ino = -1
        self.map: mmap.mmap | None = None
        self.view: memoryview | None = None
        self.mapped = 0               # bytes covered by ``view``
        self.final_size = -1          # >= 0 once the segment is known to be rolled
        # ((inode, size) of the ``.txnindex`` read, its entries): read again when it changed
        self.txns: tuple[tuple[int, int], list[AbortedTxn]] | None = None

    def __del__(self) -> None:
        if self.fd >= 0:                  # a reader dropped without close()
            os.close(self.fd)

    def names(self, kind: str) -> tuple[str, str]:
        """Where this segment's ``kind`` file (``.log``, ``.index``...) is, in the order to
        look: mid-swap its ``.swap`` name, then the final name the swap renames it to;
        otherwise the final name, then the ``.deleted`` name it carries before its unlink."""
        path = self.path[:-len(files.LOG_SUFFIX)] + kind
        return (path + files.SWAP_SUFFIX, path) if self.swapping else \
            (path, path + files.DELETED_SUFFIX)

    def open(self) -> None:
        """Open the ``.log`` (under ``names``). Raises ``FileNotFoundError``."""
        if self.fd >= 0:
            return
        fd = _open_first(self.names(files.LOG_SUFFIX))
        ino = os.fstat(fd).st_ino
        if ino != self.ino:
            self.final_size = -1          # not the file measured before (replaced by a swap)
        self.fd, self.ino = fd, ino

    def file_ino(self) -> int | None:
        """Inode of the ``.log`` this segment would open now; None when there is none."""
        for path in self.names(files.LOG_SUFFIX):
            ino = _inode(path)
            if ino is not None:
                return ino
        return None

    def size(self) -> int:
        self.open()                       # first: a reopened file may be another one
        if self.final_size >= 0:
            return self.final_size
        return os.fstat(self.fd).st_size

    def remap(self) -> None:
        """Map the file at its current size, dropping (not closing) the previous map."""
        self.open()
        size = os.fstat(self.fd).st_size
        if size <= self.mapped:
            return
        new_map = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
        self.unmap()
        self.map, self.view, self.mapped = new_map, memoryview(new_map), size

    def pread(self, position: int, size: int) -> bytes:
        self.open()
        return os.pread(self.fd, size, position)

    def unmap(self) -> None:
        """Drop this reader's map. Closed now if no slice of it is alive, else when the last
        one is released (CPython refcounting); never ``BufferError``."""
        view, m = self.view, self.map
        self.view, self.map, self.mapped = None, None, 0
        if view is not None:
            view.release()
        if m is not None:
            try:
                m.close()
            except BufferError:
                pass                      # slices handed out keep it alive; GC unmaps it

    def close(self) -> None:
        self.unmap()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def index_floor(self, offset: int, limit: int) -> int:
        """Start position for a scan towards ``offset``: the largest usable ``.index`` entry
        at or below it, else 0. Entries at or past ``limit``, zero (preallocated) entries and
        entries whose batch header disagrees are not usable."""
        try:
            fd = _open_first(self.names(files.INDEX_SUFFIX))
        except OSError:
            return 0
        usable: dict[int, tuple[int, int]] = {}

        def key_at(slot: int) -> int:
            raw = os.pread(fd, OFFSET_ENTRY.size, slot * OFFSET_ENTRY.size)
            if len(raw) < OFFSET_ENTRY.size:      # shrunk under us (roll): past the end
                return _PAST_END
            rel, pos = OFFSET_ENTRY.unpack(raw)
            if pos <= 0 or pos >= limit:
                return _PAST_END
            usable[slot] = (rel, pos)
            return rel
        try:
            slot = floor_slot(key_at, os.fstat(fd).st_size // OFFSET_ENTRY.size,
                              offset - self.base)
        finally:
            os.close(fd)
        if slot < 0:
            return 0
        rel, pos = usable[slot]                   # floor_slot probed it: usable and <= target
        try:
            head = self.header(pos, limit)
        except CorruptRecordError:
            return 0                      # no batch there: the index of another file (a swap)
        if head is None or head[0] + head[2] != self.base + rel:
            return 0                      # a stale or damaged entry: the scan from 0 decides
        return pos

    def aborted_transactions(self) -> list[AbortedTxn]:
        """The entries of this segment's ``.txnindex`` (none without one)."""
        for path in self.names(files.TXNINDEX_SUFFIX):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if self.txns is None or self.txns[0] != (st.st_ino, st.st_size):
                self.txns = ((st.st_ino, st.st_size), read_entries(path))
            return self.txns[1]
        return []

    def header(self, pos: int, limit: int) -> tuple[int, int, int] | None:
        """``(base offset, size, last offset delta)`` of the whole batch at ``pos`` ending at or
        before ``limit``, or None at the end (nothing, or a torn tail, before ``limit``).
        Raises ``CorruptRecordError`` for bytes that cannot start a batch."""
        # Fewer bytes left than a header: only the frame (its first 17 bytes) can be checked.
        need = _SCAN.size if limit - pos >= RECORD_BATCH_OVERHEAD else HEADER_SIZE_UP_TO_MAGIC
        if limit - pos < need:
            return None
        if pos + need <= self.mapped:
            buf, at = self.view, pos
        else:
            buf, at = self.pread(pos, need), 0
            if len(buf) < need:
                return None
        if need < _SCAN.size:
            _, length, _, magic = FRAME.unpack_from(buf, at)
            if length < MIN_BATCH_LENGTH or magic != MAGIC:
                raise _bad_frame(self.path, pos, length, magic)
            return None
        return _header_in(buf, at, at + limit - pos, self.path, pos)


class PartitionReader:
    """Read-only, memory-mapped access to one ``<topic>-<partition>`` directory.

    Not thread-safe (one reader per thread or per consumer). ``close()`` is idempotent; see the
    module docstring for what happens to maps whose slices are still referenced.
    """

    def __init__(self, partition_dir: str | os.PathLike[str], *,
                 remap_bytes: int = DEFAULT_REMAP_BYTES,
                 max_mapped_segments: int = DEFAULT_MAX_MAPPED_SEGMENTS) -> None:
        self.dir = os.fspath(partition_dir)
        self.remap_bytes = remap_bytes
        self.max_mapped_segments = max(1, max_mapped_segments)
        self._bases: list[int] = []
        self._segments: dict[int, _Segment] = {}
        self._mapped: collections.OrderedDict[int, _Segment] = collections.OrderedDict()
        self._generation: int | None = None
        # Where the last read ended: (segment base, its inode, next offset, byte position).
        # Sequential reads start there without an index lookup or a scan.
        self._hint: tuple[int, int, int, int] | None = None
        self.closed = False
        self.refresh()

    # --- segment list -------------------------------------------------------------------------
    @property
    def base_offsets(self) -> list[int]:
        """Base offsets of the listed segments, ascending."""
        return list(self._bases)

    def refresh(self) -> None:
        """Re-list the directory: pick up new segments, drop deleted or replaced ones. A
        compaction swap's ``.swap`` segment is listed in place of the segment at its base
        (module doc)."""
        self._check_open()
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            names = []                    # the partition (or its topic) was deleted
        listed: dict[int, bool] = {}      # base -> listed by its .swap file
        for name in names:
            parsed = files.parse_segment_name(name)
            if parsed is not None and parsed[1] == files.LOG_SUFFIX:
                if parsed[2] == files.SWAP_SUFFIX:
                    listed[parsed[0]] = True
                elif not parsed[2]:
                    listed.setdefault(parsed[0], False)
        for base in list(self._segments):
            seg = self._segments[base]
            if listed.get(base) is not seg.swapping or \
                    (seg.fd >= 0 and seg.file_ino() not in (seg.ino, None)):
                self._drop(base)          # deleted, or swapped for a new file (compaction)
        for base, swapping in listed.items():
            if base not in self._segments:
                self._segments[base] = _Segment(
                    base, os.path.join(self.dir, files.segment_name(base, files.LOG_SUFFIX)),
                    swapping)
        self._bases = sorted(listed)
        if self._hint is not None and self._hint[0] not in self._segments:
            self._hint = None

    def _drop(self, base: int) -> None:
        seg = self._segments.pop(base)
        self._mapped.pop(base, None)
        seg.close()

    def reset(self) -> None:
        """Forget every map, descriptor and position hint, then re-list (after a broker
        restart, when files may have been recovered)."""
        for base in list(self._segments):
            self._drop(base)
        self._hint = None
        self._generation = None
        self.refresh()

    # --- transactions -------------------------------------------------------------------------
    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping offsets ``[start, end)``, oldest first, from the
        ``.txnindex`` files of the segment holding ``start`` and every later one (a marker
        may come in a later segment than its data) — what a ``read_committed`` reader of
        that range must skip (``txnindex.AbortedTxnFilter``). A file is read again only when
        it changed (the active segment's grows; a swap replaces one)."""
        self._check_open()
        bases = self._bases
        first = max(bisect.bisect_right(bases, start) - 1, 0)
        out: list[AbortedTxn] = []
        for base in bases[first:]:
            out += [t for t in self._segments[base].aborted_transactions()
                    if t.last_offset >= start and t.first_offset < end]
        return sorted(out, key=lambda t: t.first_offset)

    # --- reading ------------------------------------------------------------------------------
    def read(self, offset: int, end_segment_base: int | None = None,
             end_position: int | None = None, max_bytes: int = 1 << 20, *,
             log_start_offset: int | None = None,
             generation: int | None = None) -> list[RecordBatch]:
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` of them (but at
        least one), never at or past the readable end ``(end_segment_base, end_position)``.

        ``end_segment_base=None`` reads to the last whole batch on disk. ``generation`` is the
        broker's segment-set generation: a change re-lists the directory. Returns ``[]`` when
        nothing is readable at ``offset`` yet. Raises ``OffsetOutOfRangeError`` when ``offset``
        is below ``log_start_offset`` or below every segment still on disk, and
        ``CorruptRecordError`` for bytes before the readable end that cannot be a batch.
        """
        self._check_open()
        self._follow(generation, end_segment_base)
        if log_start_offset is not None and offset < log_start_offset:
            raise OffsetOutOfRangeError(offset, log_start_offset, -1, self._name())
        for attempt in (0, 1):
            try:
                return self._read(offset, end_segment_base, end_position, max_bytes)
            except FileNotFoundError as err:
                if attempt:
                    raise OffsetOutOfRangeError(offset, self._bases[0] if self._bases else -1,
                                                -1, self._name()) from err
                self.refresh()            # deleted between the listing and the open
        raise AssertionError("unreachable")

    def _follow(self, generation: int | None, end_base: int | None) -> None:
        """Re-list when the broker's segment set changed or the readable end is in a segment
        not listed yet."""
        if generation is not None and generation != self._generation:
            self.refresh()
            self._generation = generation
        elif end_base is not None and (not self._bases or end_base > self._bases[-1]):
            self.refresh()

    def tail_window(self, offset: int, end_segment_base: int, end_position: int,
                    max_bytes: int, *, log_start_offset: int, generation: int
                    ) -> tuple[memoryview, int, int, int] | None:
        """Where a sequential read goes on in the segment holding the readable end (the
        consumer's tail take, ``_crecords.take_batches``): ``(buf, start, end, shift)``,
        whose bytes ``[start, end)`` start with the batch holding ``offset`` and lie below the
        readable end; byte ``i`` of ``buf`` is byte ``shift + i`` of the file. A slice of the
        map, or one ``pread`` of at most ``max_bytes`` past it. None unless the last read
        ended at ``offset`` in that segment: then ``read`` decides. ``advance`` records how
        far the caller took."""
        self._check_open()
        self._follow(generation, end_segment_base)
        hint, seg = self._hint, self._segments.get(end_segment_base)
        if hint is None or seg is None or hint[0] != end_segment_base or hint[2] != offset or \
                offset < log_start_offset or hint[3] >= end_position:
            return None
        try:
            self._ensure_mapped(seg, end_position)
        except OSError:
            return None                   # gone: ``read`` says how
        if seg.ino != hint[1]:
            return None
        pos = hint[3]
        if pos < seg.mapped:
            return seg.view, pos, min(end_position, seg.mapped), 0
        buf = memoryview(seg.pread(pos, min(end_position - pos, max_bytes)))
        return buf, 0, len(buf), pos

    def tail_state(self, offset: int) -> tuple | None:
        """What a read going on at ``offset`` in the segment its last read ended in needs
        without this reader's help (``_crecords.tail_take``): ``(segment base, segment-set
        generation, map view, mapped bytes, descriptor, byte position, remap_at)``, where
        ``remap_at`` is the readable end from which ``tail_window`` would map the file again.
        None unless that segment is mapped and open, and not known to be rolled."""
        hint = self._hint
        if self.closed or hint is None or hint[2] != offset:
            return None
        seg = self._segments.get(hint[0])
        if seg is None or seg.map is None or seg.fd < 0 or seg.ino != hint[1] or \
                seg.final_size >= 0:
            return None
        mapped = seg.mapped
        return (hint[0], -1 if self._generation is None else self._generation, seg.view,
                mapped, seg.fd, hint[3], mapped + max(self.remap_bytes, mapped >> 3))

    def advance(self, offset: int, position: int) -> None:
        """The caller of ``tail_window`` took the batches before file position ``position``
        of that segment; ``offset`` is the next one to read."""
        hint = self._hint
        if hint is not None:
            self._hint = (hint[0], hint[1], offset, position)

    def _read(self, offset: int, end_base: int | None, end_position: int | None,
              max_bytes: int) -> list[RecordBatch]:
        bases = self._bases
        if not bases or (end_base is not None and end_base < bases[0]):
            return []
        i = bisect.bisect_right(bases, offset) - 1
        if i < 0:
            raise OffsetOutOfRangeError(offset, bases[0], -1, self._name())
        out: list[RecordBatch] = []
        budget = max_bytes
        while i < len(bases):
            base = bases[i]
            if end_base is not None and base > end_base:
                break
            seg = self._segments[base]
            at_end = end_base is None and i == len(bases) - 1
            if end_base is not None and base == end_base:
                limit = end_position if end_position is not None else seg.size()
            else:
                if not at_end and seg.final_size < 0:
                    seg.final_size = seg.size()   # rolled: this size never changes again
                limit = seg.size()
            got, more = self._read_segment(seg, offset, limit, budget, not out)
            for batch in got:
                budget -= batch.size
            out += got
            # ``more``: the budget stopped the read before the segment's end. The next
            # segment comes only after the rest of this one, or the batches returned would
            # skip the offsets between them.
            if more or budget <= 0 or (end_base is not None and base >= end_base):
                break
            if got:
                offset = got[-1].next_offset
            i += 1
        return out

    def _read_segment(self, seg: _Segment, offset: int, limit: int, max_bytes: int,
                      need_one: bool) -> tuple[list[RecordBatch], bool]:
        """Whole batches of ``seg`` from the one reaching ``offset``, below ``limit``, at most
        ``max_bytes`` (at least one if ``need_one``); and whether readable bytes of the segment
        were left for lack of budget (then the caller must not go on to the next segment)."""
        if limit <= 0:
            return [], False
        self._ensure_mapped(seg, limit)
        hint = self._hint
        if hint is not None and (hint[0] != seg.base or hint[1] != seg.ino or hint[2] > offset
                                 or hint[3] > limit):
            hint = None                   # another segment, or another file at its base
        if hint is not None and hint[2] == offset:
            pos = hint[3]                 # sequential read: no lookup, no scan
        else:
            pos = seg.index_floor(offset, limit) if offset > seg.base else 0
            if hint is not None and hint[3] > pos:
                pos = hint[3]             # closer than the index entry
        # Scan batch headers to the first batch whose last offset reaches ``offset``.
        while True:
            head = seg.header(pos, limit)
            if head is None:
                self._hint = (seg.base, seg.ino, offset, pos)
                return [], False
            base, size, last_delta = head
            if base + last_delta >= offset:
                break
            pos += size
        start = pos
        if start + size <= seg.mapped:
            # Zero-copy: slices of the map, whole batches up to the map's end.
            end = min(limit, seg.mapped)
            buf, shift = seg.view, 0
        else:
            # The unmapped tail of a growing segment: one pread of at most max_bytes (or the
            # one batch, if it is larger).
            end = min(limit, start + max(max_bytes, size))
            buf, shift = memoryview(seg.pread(start, end - start)), start
        out: list[RecordBatch] = []
        taken = 0
        pos = start
        more = False
        while True:
            if out:
                head = seg.header(pos, end) if shift == 0 else _header_in(buf, pos - shift,
                                                                           end - shift, seg.path,
                                                                           pos)
                if head is None:
                    more = end < limit            # a pread window ended before the limit
                    break
                base, size, last_delta = head
            if out and taken + size > max_bytes:
                more = True
                break
            if not out and size > max_bytes and not need_one:
                more = True
                break
            out.append(RecordBatch(buf[pos - shift:pos - shift + size], pos, seg.path))
            taken += size
            pos += size
            if taken >= max_bytes:
                more = pos < limit
                break
        if out:
            self._hint = (seg.base, seg.ino, out[-1].next_offset, pos)
        return out, more

    def _ensure_mapped(self, seg: _Segment, limit: int) -> None:
        """Map or remap ``seg`` when the readable part passes its map (policy: module doc)."""
        if limit <= seg.mapped:
            if seg.base in self._mapped:
                self._mapped.move_to_end(seg.base)
            return
        if seg.map is None or seg.final_size >= 0 or \
                limit - seg.mapped >= max(self.remap_bytes, seg.mapped >> 3):
            seg.remap()
            if seg.map is None:           # still empty: nothing to map
                return
            self._mapped[seg.base] = seg
            self._mapped.move_to_end(seg.base)
            while len(self._mapped) > self.max_mapped_segments:
                _, old = self._mapped.popitem(last=False)
                old.close()               # reopened (and remapped) if read again

    # --- facts --------------------------------------------------------------------------------
    def log_end_position(self) -> tuple[int, int] | None:
        """``(segment base, size)`` of the last segment on disk, or None when there is none."""
        if not self._bases:
            return None
        seg = self._segments[self._bases[-1]]
        return seg.base, seg.size()

    def _name(self) -> str:
        return os.path.basename(os.path.normpath(self.dir))

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"{self.dir}: reader is closed")

    # --- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close descriptors and drop maps (each map is unmapped now, or when the last batch,
        key or value slice of it is released). Idempotent."""
        if self.closed:
            return
        for base in list(self._segments):
            self._drop(base)
        self._bases = []
        self._hint = None
        self.closed = True

    def __enter__(self) -> PartitionReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PartitionReader({self.dir!r}, segments={len(self._bases)})"


def _header_in(buf, pos: int, limit: int, path: str, file_pos: int
               ) -> tuple[int, int, int] | None:
    """``_Segment.header`` over bytes in memory (a map, the pread tail): ``buf[pos]`` is byte
    ``file_pos`` of the file."""
    if limit - pos < RECORD_BATCH_OVERHEAD:
        return None
    base, length, _, magic, _, _, last_delta = _SCAN.unpack_from(buf, pos)
    if length < MIN_BATCH_LENGTH or magic != MAGIC:
        raise _bad_frame(path, file_pos, length, magic)
    size = LOG_OVERHEAD + length
    if pos + size > limit:
        return None
    return base, size, last_delta


def _bad_frame(path: str, pos: int, length: int, magic: int) -> CorruptRecordError:
    return CorruptRecordError(path, pos, f"batch length {length} / magic {magic} cannot start "
                              "a RecordBatch v2")


def _open_first(paths: tuple[str, ...]) -> int:
    """A read-only descriptor of the first of ``paths`` that exists. Raises
    ``FileNotFoundError`` (for the last) when none does."""
    for path in paths[:-1]:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
    return os.open(paths[-1], os.O_RDONLY | os.O_CLOEXEC)


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
