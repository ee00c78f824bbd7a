"""Sparse offset and time indexes (``.index``, ``.timeindex``): Kafka's files, one descriptor each.

On disk (big-endian, no header, no checksum — both files are rebuilt from the ``.log``)::

    .index      entry = relativeOffset int32 | position int32          (8 bytes)
    .timeindex  entry = timestamp int64      | relativeOffset int32    (12 bytes)

``relativeOffset`` = offset - segment base offset. ``position`` is the byte offset of a batch
start in the ``.log``; an offset-index entry's offset is the *last* offset of the batch at that
position. A time-index entry says "the largest timestamp seen up to here is T, first carried by
the batch ending at offset O".

A new file is preallocated to ``floor(max_index_size / entry) * entry`` zero bytes (sparse on
disk); an existing file is assumed full of entries (entries = length / entry), which
is why indexes are trimmed to their entries when a segment rolls or closes. The time index keeps
its last slot for the final entry written at roll/close, so it is "full" one entry early.

Entries are written with ``pwrite`` (through ``diskio``), never through a map: on a full disk,
a store into a sparse page of a shared map is a ``SIGBUS`` that kills the process, while
``pwrite`` fails with ``ENOSPC``. An entry counts (``entries`` grows) only once its bytes are
written; a failed write leaves the count, and the stale bytes past it are overwritten by the
next entry or trimmed at close.

A writable index (the broker's) reads entries with ``pread`` too, not through a map: Python's
``mmap`` (before 3.13's ``trackfd``) keeps a duplicate of the file's descriptor, which made two
descriptors an index, and the broker looks entries up rarely (a lookup is ~21 probes, the last
entry is cached for appends; clients map the files themselves, ``mq.log.reader``). A read-only
index (the ``mq log`` tools) reads its file once when opened and holds no descriptor.

Invariants: offsets strictly increase in ``.index``; offsets and timestamps never decrease in
``.timeindex``. Lookups return the largest entry whose key is <= the target (``floor``).
"""

from __future__ import annotations

import os
import struct
from typing import Final

from mq.errors import CorruptIndexError, IndexFullError, InvalidOffsetError
from mq.log import diskio

__all__ = ["OffsetIndex", "TimeIndex", "floor_slot", "DEFAULT_MAX_INDEX_SIZE", "OFFSET_ENTRY",
           "TIME_ENTRY"]

DEFAULT_MAX_INDEX_SIZE: Final = 10 * 1024 * 1024
# The entry layouts (module doc); ``mq.log.reader`` reads ``.index`` files with the same one.
OFFSET_ENTRY: Final = struct.Struct(">ii")
TIME_ENTRY: Final = struct.Struct(">qi")
_INT32_MAX: Final = (1 << 31) - 1


def floor_slot(key_at, entries: int, target: int) -> int:
    """Largest slot whose key is <= ``target`` among ``entries`` sorted keys, or -1.

    ``key_at(slot)`` reads the key of one slot. Pure binary search: lookups over a 1.3 M-entry
    index take 21 probes.
    """
    if entries == 0 or key_at(0) > target:
        return -1
    lo, hi = 0, entries - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if key_at(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _smallest_upper_slot(key_at, entries: int, target: int) -> int:
    """Smallest slot whose key is >= ``target``, or -1."""
    if entries == 0 or key_at(entries - 1) < target:
        return -1
    lo, hi = 0, entries - 1
    while lo < hi:
        mid = (lo + hi) >> 1
        if key_at(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


class _Index:
    """A memory-mapped array of fixed-size entries; the shared part of both index kinds."""

    ENTRY: struct.Struct

    def __init__(self, path: str, base_offset: int, max_index_size: int = DEFAULT_MAX_INDEX_SIZE,
                 writable: bool = True) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        self.writable = writable
        self._entry_size = self.ENTRY.size
        self._fd = -1
        self._data: bytes | None = None       # a read-only index's contents
        self._last: tuple[int, tuple] | None = None   # (entries, last entry) once written
        self._length = 0
        self.entries = 0
        self._open()

    # --- the file -----------------------------------------------------------------------------
    def _open(self) -> None:
        if not self.writable:
            with open(self.path, "rb") as f:
                self._data = f.read()
            self._length = len(self._data)
            self.entries = self._length // self._entry_size
            return
        # Only a file created here is preallocated (Kafka's AbstractIndex): an existing empty
        # file is a trimmed index without entries. Growing it would leave an inactive segment
        # with a mapped run of zero "entries" that a crash turns into a corrupt index.
        new = not os.path.exists(self.path)
        self._fd = diskio.ops.open(self.path, os.O_RDWR | os.O_CREAT)
        try:
            if new:
                length = self._round(self.max_index_size)
                diskio.ops.ftruncate(self._fd, length)
                self.entries = 0
            else:
                length = os.fstat(self._fd).st_size
                self.entries = length // self._entry_size
            self._length = length
        except BaseException:
            # A created file left empty would read as a trimmed index with no room.
            diskio.ops.close(self._fd)
            self._fd = -1
            if new:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            raise

    def _round(self, size: int) -> int:
        return size - size % self._entry_size

    def _unpack(self, slot: int) -> tuple:
        """The fields of entry ``slot`` (< ``entries``): the cached last entry, else read.
        Raises ``CorruptIndexError`` when the file ends before it (cut by someone else)."""
        last = self._last
        if last is not None and last[0] == slot + 1 == self.entries:
            return last[1]
        size = self._entry_size
        if self._data is not None:
            raw = self._data[slot * size:(slot + 1) * size]
        else:
            raw = os.pread(self._fd, size, slot * size)
        if len(raw) < size:
            raise CorruptIndexError(self.path, f"entry {slot} lies past the end of the file")
        return self.ENTRY.unpack(raw)

    def _used_bytes(self) -> bytes:
        """Every entry's bytes, read at once (a full check reads them all)."""
        used = self.entries * self._entry_size
        if self._data is not None:
            return self._data[:used]
        return os.pread(self._fd, used, 0) if used else b""

    @property
    def max_entries(self) -> int:
        return self._length // self._entry_size

    @property
    def size_in_bytes(self) -> int:
        """Bytes actually used by entries (what the file is trimmed to)."""
        return self.entries * self._entry_size

    @property
    def file_length(self) -> int:
        return self._length

    def resize(self, new_size: int) -> bool:
        """Set the file length (rounded down to whole entries); False when it is unchanged."""
        new_length = self._round(new_size)
        if new_length == self._length:
            return False
        diskio.ops.ftruncate(self._fd, new_length)
        self._length = new_length
        self.entries = min(self.entries, self.max_entries)
        return True

    def trim_to_valid_size(self) -> None:
        if self.writable:
            self.resize(self.size_in_bytes)

    def flush(self) -> None:
        if self._fd >= 0 and self.writable:
            diskio.ops.fdatasync(self._fd)

    @property
    def trimmed(self) -> bool:
        """The file holds exactly the entries: it can be closed and opened again (an untrimmed
        one, opened again, would count its zero tail as entries)."""
        return self._length == self.size_in_bytes

    def close(self) -> None:
        """Trim to the entries and close. Idempotent."""
        if self._fd < 0:
            self._data = None
            return
        try:
            self.trim_to_valid_size()
        finally:
            self.close_without_trim()

    def close_without_trim(self) -> None:
        self._data = None
        if self._fd >= 0:
            diskio.ops.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close_without_trim()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def rename(self, new_path: str) -> None:
        if os.path.exists(self.path):
            diskio.ops.rename(self.path, new_path)
        self.path = new_path

    def _write_slot(self, slot: int, *fields: int) -> None:
        """Write one entry; raises ``OSError`` with ``entries`` unchanged."""
        diskio.write_fully(self._fd, self.ENTRY.pack(*fields), slot * self._entry_size)
        self._last = (slot + 1, fields)

    def reset(self) -> None:
        """Drop every entry and grow back to the maximum size (used before a rebuild)."""
        self.entries = 0
        # Truncating to 0 and growing again yields zeros without touching the pages: writing
        # 10 MiB of zeros through the map cost ~65 ms and 10 MiB of dirty pages per index.
        self.resize(0)
        self.resize(self.max_index_size)

    def _rel_at(self, slot: int) -> int:
        raise NotImplementedError

    def written_slots(self) -> int:
        """How many leading slots of a crashed index hold entries: an open reads a file that
        was still preallocated as all entries, and its unwritten slots are zeros (created
        sparse, grown back with zeros after a trim or truncation). Binary search for the
        zero-filled tail, so a 10 MiB file costs ~20 probes, each a ``pread`` (0.06 ms for
        the search; through a map, each fault on a hole zero-filled the pages around it too:
        3 ms). Slot 0 is not probed (a lone all-zero time entry is possible: it
        then reads as none, and the segment's recovery sees the entry missing)."""
        size = self._entry_size
        zero = bytes(size)
        lo, hi = 1, self.max_entries
        if hi == 0:
            return 0
        while lo < hi:
            mid = (lo + hi) >> 1
            if os.pread(self._fd, size, mid * size) == zero:
                hi = mid
            else:
                lo = mid + 1
        if lo == 1 and os.pread(self._fd, size, 0) == zero:
            return 0
        return lo

    def _has_hole(self, count: int, skip: int = 0) -> bool:
        """Whether an all-zero entry lies among the first ``count`` slots (past the first
        ``skip``): a page a power loss left unwritten. No run of entry-size zero bytes fits
        in real entries (every window of that size spans a whole field that cannot be zero),
        so one ``find`` over the bytes answers at C speed (~1 ms for the 2 MiB of a full
        1 GiB segment's offset index, where decoding and comparing its entries took ~90)."""
        size = self._entry_size
        return count > skip and \
            os.pread(self._fd, count * size, 0).find(bytes(size), skip * size) >= 0

    def _written_below(self, offset: int) -> int:
        """How many written slots (``written_slots``) hold offsets below ``offset``."""
        return floor_slot(self._rel_at, self.written_slots(),
                          offset - 1 - self.base_offset) + 1

    def truncate_to(self, offset: int) -> None:
        """Remove entries with offset >= ``offset``."""
        rel = offset - self.base_offset
        slot = floor_slot(self._rel_at, self.entries, rel)
        if slot >= 0 and self._rel_at(slot) == rel:
            # Offsets may repeat in a time index: drop every entry at this offset.
            while slot > 0 and self._rel_at(slot - 1) == rel:
                slot -= 1
            self.entries = slot
        else:
            self.entries = slot + 1         # -1 (nothing at or below): no entry left

    def _relative(self, offset: int) -> int:
        """``offset - base_offset``; raises ``InvalidOffsetError`` if it does not fit int32."""
        rel = offset - self.base_offset
        if not 0 <= rel <= _INT32_MAX:
            raise InvalidOffsetError(f"{self.path}: offset {offset} does not fit relative to "
                                     f"base {self.base_offset}")
        return rel

    def _check_writable(self) -> None:
        if not self.writable:
            raise InvalidOffsetError(f"{self.path}: index is read-only")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, entries={self.entries})"


class OffsetIndex(_Index):
    """``.index``: relative offset -> position of the batch that ends at that offset."""

    ENTRY = OFFSET_ENTRY

    def entry(self, slot: int) -> tuple[int, int]:
        """(absolute offset, position) of ``slot``."""
        rel, pos = self._unpack(slot)
        return self.base_offset + rel, pos

    def _rel_at(self, slot: int) -> int:
        return self._unpack(slot)[0]

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def last_offset(self) -> int:
        return self.entry(self.entries - 1)[0] if self.entries else self.base_offset

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """Largest entry with offset <= target, or ``(base_offset, 0)`` (Kafka's lookup)."""
        slot = floor_slot(self._rel_at, self.entries, target_offset - self.base_offset)
        if slot < 0:
            return self.base_offset, 0
        return self.entry(slot)

    def fetch_upper_bound_offset(self, start_position: int, fetch_size: int
                                 ) -> tuple[int, int] | None:
        """First entry whose position is >= start_position + fetch_size, or None."""
        target = start_position + fetch_size

        def pos_at(slot: int) -> int:
            return self._unpack(slot)[1]
        slot = _smallest_upper_slot(pos_at, self.entries, target)
        return None if slot < 0 else self.entry(slot)

    def append(self, offset: int, position: int) -> None:
        """Add an entry. Raises ``IndexFullError`` or ``InvalidOffsetError``."""
        self._check_writable()
        if self.is_full:
            raise IndexFullError(f"{self.path}: offset index is full at {self.entries} entries")
        if self.entries and offset <= self.last_offset:
            raise InvalidOffsetError(f"{self.path}: offset {offset} is not larger than the "
                                     f"last indexed offset {self.last_offset}")
        rel = self._relative(offset)
        self._write_slot(self.entries, rel, position)
        self.entries += 1

    def sanity_check(self) -> None:
        """Raise ``CorruptIndexError`` if the file cannot be this segment's offset index."""
        if self._length % 8:
            raise CorruptIndexError(self.path, f"length {self._length} is not a multiple of 8")
        if self.entries:
            last_rel, last_pos = self._unpack(self.entries - 1)
            if last_rel < 0:
                raise CorruptIndexError(self.path, f"last offset {self.base_offset + last_rel} "
                                        f"is below the base offset {self.base_offset}")
            if self.entries > 1:
                prev_rel, prev_pos = self._unpack(self.entries - 2)
                if prev_rel >= last_rel or prev_pos >= last_pos:
                    raise CorruptIndexError(self.path, "last entries are not increasing")

    def keep_below(self, offset: int, log_size: int) -> None:
        """After a crash, keep the written entries for offsets below ``offset`` (recovery from
        the recovery point trusts them) and drop the rest: raises ``CorruptIndexError``
        unless their offsets and positions strictly increase and stay inside the log."""
        count = self._written_below(offset)
        if count:
            (rel, pos), (prev_rel, prev_pos), (last_rel, last_pos) = (
                self._unpack(slot) for slot in (0, max(count - 2, 0), count - 1))
            if rel < 0 or pos <= 0 or last_pos >= log_size or self._has_hole(count) or \
                    (count > 1 and (prev_rel >= last_rel or prev_pos >= last_pos)):
                raise CorruptIndexError(self.path, f"its first {count} entries have a hole, "
                                        "are out of order or point beyond the log")
        self.entries = count

    def validate_entries(self, log_size: int) -> None:
        """Full check (``mq log check``): offsets and positions strictly increase and every
        position lies inside the log."""
        self.sanity_check()
        prev_rel = prev_pos = -1
        for slot, (rel, pos) in enumerate(OFFSET_ENTRY.iter_unpack(self._used_bytes())):
            if rel <= prev_rel or pos <= prev_pos or pos >= log_size:
                raise CorruptIndexError(self.path, f"entry {slot} (offset "
                                        f"{self.base_offset + rel}, position {pos}) is out of "
                                        "order or beyond the log")
            prev_rel, prev_pos = rel, pos


class TimeIndex(_Index):
    """``.timeindex``: max timestamp so far -> offset of the batch that carried it."""

    ENTRY = TIME_ENTRY

    def entry(self, slot: int) -> tuple[int, int]:
        """(timestamp, absolute offset) of ``slot``."""
        ts, rel = self._unpack(slot)
        return ts, self.base_offset + rel

    def _ts_at(self, slot: int) -> int:
        return self._unpack(slot)[0]

    def _rel_at(self, slot: int) -> int:
        return self._unpack(slot)[1]

    @property
    def is_full(self) -> bool:
        # The last slot is reserved for the entry written at roll/close (skip_full_check).
        return self.entries >= self.max_entries - 1

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or ``(-1, base_offset)`` when empty."""
        return self.entry(self.entries - 1) if self.entries else (-1, self.base_offset)

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """Largest entry with timestamp <= target, or ``(-1, base_offset)``."""
        slot = floor_slot(self._ts_at, self.entries, target_timestamp)
        if slot < 0:
            return -1, self.base_offset
        return self.entry(slot)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Append unless the timestamp does not exceed the last entry's (then skip silently).

        Raises ``IndexFullError``, or ``InvalidOffsetError`` for an offset or timestamp that
        goes backwards.
        """
        self._check_writable()
        if not skip_full_check and self.is_full:
            raise IndexFullError(f"{self.path}: time index is full at {self.entries} entries")
        last_ts, last_offset = self.last_entry
        if self.entries and offset < last_offset:
            raise InvalidOffsetError(f"{self.path}: offset {offset} is below the last indexed "
                                     f"offset {last_offset}")
        if self.entries and timestamp < last_ts:
            raise InvalidOffsetError(f"{self.path}: timestamp {timestamp} is below the last "
                                     f"indexed timestamp {last_ts}")
        if timestamp <= last_ts:
            # Equal to the last entry: skip. Empty index: last_ts is -1 (NO_TIMESTAMP), so
            # batches without timestamps never create an entry (Kafka: append only when
            # timestamp > lastEntry.timestamp).
            return
        if self.entries >= self.max_entries:
            raise IndexFullError(f"{self.path}: time index has no slot left")
        rel = self._relative(offset)
        self._write_slot(self.entries, timestamp, rel)
        self.entries += 1

    def sanity_check(self) -> None:
        """Raise ``CorruptIndexError`` if the file cannot be this segment's time index."""
        if self._length % 12:
            raise CorruptIndexError(self.path, f"length {self._length} is not a multiple of 12")
        if self.entries:
            first_ts = self._ts_at(0)
            last_ts, last_offset = self.entry(self.entries - 1)
            if last_ts < first_ts:
                raise CorruptIndexError(self.path, f"last timestamp {last_ts} is below the "
                                        f"first timestamp {first_ts}")
            if last_offset < self.base_offset:
                raise CorruptIndexError(self.path, f"last offset {last_offset} is below the "
                                        f"base offset {self.base_offset}")

    def keep_below(self, offset: int) -> None:
        """After a crash, keep the written entries for offsets below ``offset`` (recovery from
        the recovery point trusts them) and drop the rest: raises ``CorruptIndexError``
        unless they have no hole and their last timestamps and offsets increase (an entry
        only goes in for a larger timestamp). Slot 0 may hold a real all-zero entry (timestamp
        0 at the base offset): the hole search starts past it."""
        count = self._written_below(offset)
        if count:
            (first_ts, first_rel), (prev_ts, prev_rel), (last_ts, last_rel) = (
                self._unpack(slot) for slot in (0, max(count - 2, 0), count - 1))
            if first_rel < 0 or last_ts < first_ts or self._has_hole(count, skip=1) or \
                    (count > 1 and (prev_ts >= last_ts or prev_rel > last_rel)):
                raise CorruptIndexError(self.path, f"its first {count} entries have a hole or "
                                        "are out of order")
        self.entries = count

    def validate_entries(self, next_offset: int) -> None:
        """Full check: timestamps and offsets never decrease and offsets stay in the segment."""
        self.sanity_check()
        prev_ts = prev_off = -1
        for slot, (ts, rel) in enumerate(TIME_ENTRY.iter_unpack(self._used_bytes())):
            off = self.base_offset + rel
            if ts < prev_ts or off < prev_off or off >= max(next_offset, self.base_offset + 1):
                raise CorruptIndexError(self.path, f"entry {slot} (timestamp {ts}, offset "
                                        f"{off}) is out of order or beyond the log")
            prev_ts, prev_off = ts, off
