"""Offline verification and repair of a partition directory (``mq log check``, ``mq dump-log
--verify-index-only``), without a broker.

Checking changes nothing: segments are opened ``read_only`` (``O_RDONLY`` files, ``ACCESS_READ``
maps), nothing is created, truncated, trimmed or renamed. One streaming pass per segment reads
the ``.log`` in 1 MiB chunks (``LogSegment.batches``) and walks both indexes alongside it, so a
1 GiB segment costs one read of the file and O(1) memory.

What a clean partition directory satisfies (what the broker relies on after a clean shutdown):

- every batch frames correctly, has a valid CRC and decodes; its records' offsets increase
  inside ``[baseOffset, lastOffset]``;
- batch offsets increase within a segment, stay in ``[base, base + 2^31 - 1]`` and below the
  next segment's base offset; no bytes follow the last whole batch (a torn tail);
- ``.index`` entry i is ``(last offset of the batch at position p, p)``, both strictly
  increasing; ``.timeindex`` entry i is ``(T, O)`` with O the last offset of a batch and T
  the largest batch timestamp of the segment up to O, both non-decreasing;
- indexes are trimmed to their entries (an untrimmed index, zero-filled to
  ``segment.index.bytes``, is what an unclean shutdown leaves);
- every segment with data has both indexes, as ``PartitionLog.open`` expects (it rebuilds a
  segment missing either). Indexes may be created lazily, so one case is clean without them: the
  last segment holding a single batch (rolled into, appended to once, closed) has no
  ``.index``, and no ``.timeindex`` either when that batch carries no timestamp;
- no leftovers of interrupted multi-file changes (``.cleaned``, ``.swap``, ``.tmp``) and no
  index file without its ``.log``. A ``.deleted`` file is no fault: it is a segment already out
  of the log whose unlink waits ``file.delete.delay.ms`` (60 s), which Kafka leaves behind at a
  clean shutdown (mq unlinks its own at close) and both brokers remove at open.

Every file named as a segment file must be a regular file: a FIFO would block ``open``, and a
directory or device is no segment. Such a directory is refused (``StorageError``), as is such a
file given to ``mq dump-log``; nothing is opened before that is known.

A live broker (one holding the data directory's ``.lock``, probed with a non-blocking
``flock`` that is released at once) owns the partition while it is checked. Its active
segment is being written: its indexes are preallocated (untrimmed) or not created yet, and its
tail and last index entries may be mid-append; leftovers are its work in progress (pending
deletes, a cleaning). None of that is reported then; ``--repair`` refuses to run.

Repair is exactly the broker's unclean start: ``PartitionLog.open(recovery_point=0,
clean_shutdown=False)`` then ``close()``. It truncates each segment at its first torn or invalid
batch (dropping every later segment), rebuilds every index and finishes or removes leftovers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import stat
from collections.abc import Callable, Iterator

from mq.errors import (
    CorruptIndexError,
    CorruptRecordError,
    LogDirLockedError,
    StorageError,
    UnsupportedCodecError,
)
from mq.log import datadir, files
from mq.log.batch import RecordBatch
from mq.log.config import LogConfig
from mq.log.index import OffsetIndex, TimeIndex
from mq.log.log import PartitionLog, RecoveryReport
from mq.log.producer_state import decode_snapshot
from mq.log.segment import LogSegment
from mq.log.txnindex import ENTRY_SIZE as TXN_ENTRY_SIZE
from mq.log.txnindex import TransactionIndex

__all__ = [
    "CheckResult",
    "FileChange",
    "Problem",
    "RepairResult",
    "SegmentScan",
    "check_partition",
    "index_entries",
    "live_broker_owns",
    "repair_partition",
    "require_partition_dir",
    "require_regular_file",
    "scan_segment",
]

_INT32_MAX = (1 << 31) - 1
_CONFIG = LogConfig()
_HASH_LIMIT = 64 * 1024 * 1024      # files up to this size are compared by content on repair

Report = Callable[["Problem"], None]


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a partition directory.

    ``path`` is the file at fault (the directory for directory-level problems), ``position`` a
    byte offset in that file when one applies, ``kind`` a stable identifier for scripts:
    ``corrupt-batch``, ``torn-tail``, ``offset-order``, ``unsupported-codec``,
    ``index-mismatch``, ``index-corrupt``, ``index-untrimmed``, ``index-missing``,
    ``orphan-index``, ``leftover``, ``txnindex-corrupt``, ``snapshot-corrupt``. ``message`` is
    one line naming the file and position.
    """

    path: str
    kind: str
    message: str
    position: int | None = None

    def __str__(self) -> str:
        return self.message

    def as_dict(self) -> dict:
        return {"file": self.path, "kind": self.kind, "position": self.position,
                "message": self.message}


@dataclasses.dataclass(slots=True)
class SegmentScan:
    """What one pass over a segment found."""

    path: str
    base_offset: int
    size: int
    valid_bytes: int = 0
    batches: int = 0
    records: int = 0
    first_offset: int | None = None
    next_offset: int = 0
    max_timestamp: int = -1
    problems: list[Problem] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class CheckResult:
    """The verdict on one partition directory; clean when ``problems`` is empty.
    ``live_broker``: a running broker owned the directory's data dir during the check."""

    directory: str
    segments: list[SegmentScan] = dataclasses.field(default_factory=list)
    problems: list[Problem] = dataclasses.field(default_factory=list)
    live_broker: bool = False

    @property
    def clean(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """``"3 segments, 120 batches, 6000 records, offsets 0..5999, 245760 bytes"``."""
        batches = sum(s.batches for s in self.segments)
        records = sum(s.records for s in self.segments)
        size = sum(s.size for s in self.segments)
        firsts = [s.first_offset for s in self.segments if s.first_offset is not None]
        n = len(self.segments)
        offsets = (f"offsets {firsts[0]}..{self.segments[-1].next_offset - 1}" if firsts
                   else "no offsets")
        return (f"{n} segment{'s' * (n != 1)}, {batches} batch{'es' * (batches != 1)}, "
                f"{records} record{'s' * (records != 1)}, {offsets}, {size} bytes")


# --- index walking ----------------------------------------------------------------------------

def _trailing_zero_slots(path: str, entry_size: int) -> tuple[int, int]:
    """(slots in the file, how many of the last ones are all zero bytes).

    Indexes are preallocated with zeros and trimmed at roll/close, so zero slots at the end are
    unused space (Kafka's DumpLogSegments stops at the same sentinel). A trimmed index of one
    all-zero entry keeps it: ``(offset base, position 0)`` can be a real entry.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        slots = os.fstat(fd).st_size // entry_size
        chunk = (1 << 16) - (1 << 16) % entry_size
        pos = slots * entry_size
        while pos > 0:
            start = max(0, pos - chunk)
            data = os.pread(fd, pos - start, start)
            used = len(data.rstrip(b"\0"))
            if used:
                return slots, slots - -(-(start + used) // entry_size)
            pos = start
    finally:
        os.close(fd)
    return slots, (0 if slots == 1 else slots)


def index_entries(index: OffsetIndex | TimeIndex) -> int:
    """How many leading entries of ``index`` are in use (its trailing zero slots excluded)."""
    if index.file_length == 0:
        return 0
    slots, zeros = _trailing_zero_slots(index.path, index.ENTRY.size)
    return min(index.entries, slots - zeros)


class _OffsetIndexCheck:
    """Walks ``.index`` entries alongside the batches of its ``.log`` (both sorted by position).

    Entry ``(offset, position)`` must name a batch start and that batch's last offset.
    """

    def __init__(self, index: OffsetIndex, entries: int, report: Report) -> None:
        self.index = index
        self.entries = entries
        self.report = report
        self.slot = 0
        self.prev_offset = self.prev_position = -1

    def _bad(self, offset: int, position: int, why: str) -> None:
        self.report(Problem(self.index.path, "index-mismatch",
                            f"{self.index.path}: entry {self.slot} (offset {offset}, position "
                            f"{position}) {why}", self.slot * 8))

    def batch(self, position: int, last_offset: int) -> None:
        while self.slot < self.entries:
            offset, pos = self.index.entry(self.slot)
            if pos > position:
                return
            if offset < self.index.base_offset or pos < 0:
                self._bad(offset, pos, f"is not an entry of this segment (offsets start at "
                                       f"{self.index.base_offset}, positions at 0)")
            elif self.slot and (offset <= self.prev_offset or pos <= self.prev_position):
                self._bad(offset, pos, f"is out of order after offset {self.prev_offset}, "
                                       f"position {self.prev_position}")
            else:
                if pos < position:
                    self._bad(offset, pos, "does not point at the start of a batch")
                elif offset != last_offset:
                    self._bad(offset, pos, f"does not match the log: the batch at byte {pos} "
                                           f"ends at offset {last_offset}")
                self.prev_offset, self.prev_position = offset, pos
            self.slot += 1

    def finish(self, valid_bytes: int, next_offset: int) -> None:
        """Entries left after the last batch; call only when the whole log was readable
        (past a corrupt batch the log, not the index, is at fault)."""
        while self.slot < self.entries:
            offset, pos = self.index.entry(self.slot)
            if 0 <= pos < valid_bytes:
                self._bad(offset, pos, "does not point at the start of a batch")
            else:
                self._bad(offset, pos, f"points past the last whole batch of the log (valid "
                                       f"bytes end at {valid_bytes})")
            self.slot += 1


class _TimeIndexCheck:
    """Walks ``.timeindex`` entries alongside the batches of its ``.log`` (sorted by offset).

    Entry ``(T, O)``: O is the last offset of a batch and T is the largest batch timestamp of
    the segment up to O. ``(-1, base)`` is the entry of a segment whose batches carry no
    timestamps.
    """

    def __init__(self, index: TimeIndex, entries: int, report: Report) -> None:
        self.index = index
        self.entries = entries
        self.report = report
        self.slot = 0
        self.prev_ts: int | None = None
        self.prev_offset = -1
        self.max_ts = -1

    def _bad(self, ts: int, offset: int, why: str) -> None:
        self.report(Problem(self.index.path, "index-mismatch",
                            f"{self.index.path}: entry {self.slot} (timestamp {ts}, offset "
                            f"{offset}) {why}", self.slot * 12))

    def batch(self, batch: RecordBatch) -> None:
        self.max_ts = max(self.max_ts, batch.max_timestamp)
        last = batch.last_offset
        while self.slot < self.entries:
            ts, offset = self.index.entry(self.slot)
            if offset > last:
                return
            if offset < self.index.base_offset:
                self._bad(ts, offset, f"is not an entry of this segment (offsets start at "
                                      f"{self.index.base_offset})")
            elif self.prev_ts is not None and (ts < self.prev_ts or offset < self.prev_offset):
                self._bad(ts, offset, f"is out of order after timestamp {self.prev_ts}, "
                                      f"offset {self.prev_offset}")
            else:
                if offset != last and not (ts < 0 and offset == self.index.base_offset):
                    self._bad(ts, offset, f"is not the last offset of a batch (the batch at "
                                          f"byte {batch.position} holds offsets "
                                          f"{batch.base_offset}..{last})")
                elif ts != self.max_ts:
                    # Kafka's DumpLogSegments check. A later T names a timestamp the log does
                    # not hold yet; an earlier one makes lookups skip batches before O.
                    self._bad(ts, offset, f"does not match the log: the largest timestamp up "
                                          f"to offset {offset} is {self.max_ts}")
                self.prev_ts, self.prev_offset = ts, offset
            self.slot += 1

    def finish(self, valid_bytes: int, next_offset: int) -> None:
        """As ``_OffsetIndexCheck.finish``."""
        while self.slot < self.entries:
            ts, offset = self.index.entry(self.slot)
            self._bad(ts, offset, f"points past the last whole batch of the log (next offset "
                                  f"{next_offset})")
            self.slot += 1


class _Summarize:
    """Collects index mismatches as one problem per index file: the first and a count."""

    def __init__(self) -> None:
        self.first: dict[str, Problem] = {}
        self.count: dict[str, int] = {}

    def __call__(self, problem: Problem) -> None:
        self.first.setdefault(problem.path, problem)
        self.count[problem.path] = self.count.get(problem.path, 0) + 1

    def problems(self) -> Iterator[Problem]:
        for path, first in self.first.items():
            more = self.count[path] - 1
            if more:
                entries = "entry" if more == 1 else "entries"
                first = dataclasses.replace(
                    first, message=f"{first.message} (and {more} more {entries} wrong)")
            yield first


def _open_index_check(seg: LogSegment, kind: str, report: Report, scan: SegmentScan,
                      untrimmed_is_problem: bool):
    """The checker for one of the segment's indexes, or None (no such file, or a length that
    is not whole entries); problems with the file itself go to ``scan.problems``."""
    if not seg.index_file_exists(kind):
        # Not a problem: segments create their indexes lazily (a segment whose single batch
        # never earned an entry has no .index), and the broker rebuilds a missing one.
        return None
    require_regular_file(os.path.join(seg.dir, files.segment_name(seg.base_offset, kind)
                                      + seg.suffix))    # never open a FIFO
    index = seg.offset_index if kind == files.INDEX_SUFFIX else seg.time_index
    path = index.path
    size = index.ENTRY.size
    if index.file_length % size:
        scan.problems.append(Problem(path, "index-corrupt", f"{path}: length "
                                     f"{index.file_length} is not a multiple of the {size}-byte "
                                     "entry size", index.file_length - index.file_length % size))
        return None
    used = index_entries(index)
    if untrimmed_is_problem and used < index.entries:
        scan.problems.append(Problem(
            path, "index-untrimmed", f"{path}: {index.entries - used} zero-filled slots after "
            f"entry {used} (an index left untrimmed by an unclean shutdown)", used * size))
    if kind == files.INDEX_SUFFIX:
        return _OffsetIndexCheck(index, used, report)
    return _TimeIndexCheck(index, used, report)


# --- one segment ------------------------------------------------------------------------------

def _check_records(batch: RecordBatch) -> None:
    """Decode every record; offsets must increase inside the batch's offset range."""
    prev = batch.base_offset - 1
    for record in batch.records():
        if not prev < record.offset <= batch.last_offset:
            raise CorruptRecordError(batch.path, batch.position, f"record offset "
                                     f"{record.offset} is out of order or outside the batch's "
                                     f"offsets {batch.base_offset}..{batch.last_offset}")
        prev = record.offset


def scan_segment(seg: LogSegment, *, validate: bool = True, decode_records: bool = True,
                 offset_index: bool = True, time_index: bool = True,
                 on_index_problem: Report | None = None,
                 untrimmed_is_problem: bool = True, growing: bool = False) -> SegmentScan:
    """One streaming pass over ``seg`` (opened ``read_only``): the log, then both indexes
    against it. Index mismatches go to ``on_index_problem`` one by one when given, else into
    the result as one problem per index file. ``growing``: a live broker appends to the
    segment meanwhile (its active segment), so a partial batch at the end and index entries
    past the bytes read are expected, and its indexes are preallocated. Raises ``OSError``
    for unreadable files, ``StorageError`` for an index that is not a regular file.
    """
    if growing:
        untrimmed_is_problem = False
    scan = SegmentScan(seg.log_path, seg.base_offset, seg.size, next_offset=seg.base_offset)
    summarize = _Summarize() if on_index_problem is None else None
    report: Report = on_index_problem or summarize  # type: ignore[assignment]
    offset_check = time_check = None
    if offset_index:
        offset_check = _open_index_check(seg, files.INDEX_SUFFIX, report, scan,
                                         untrimmed_is_problem)
    if time_index:
        time_check = _open_index_check(seg, files.TIMEINDEX_SUFFIX, report, scan,
                                       untrimmed_is_problem)
    next_offset = seg.base_offset
    valid = 0
    codec_problem = False
    try:
        for batch in seg.batches():
            if validate:
                batch.validate()
            if batch.base_offset < next_offset or batch.last_offset - seg.base_offset > _INT32_MAX:
                scan.problems.append(Problem(
                    seg.log_path, "offset-order", f"{seg.log_path} at byte {batch.position}: "
                    f"batch offsets {batch.base_offset}..{batch.last_offset} do not follow "
                    f"offset {next_offset - 1} in the segment with base offset "
                    f"{seg.base_offset}", batch.position))
                break
            if decode_records:
                try:
                    _check_records(batch)
                except UnsupportedCodecError as err:
                    if not codec_problem:
                        codec_problem = True
                        scan.problems.append(Problem(seg.log_path, "unsupported-codec",
                                                     f"cannot verify records: {err}",
                                                     batch.position))
            if offset_check is not None:
                offset_check.batch(batch.position, batch.last_offset)
            if time_check is not None:
                time_check.batch(batch)
            if scan.first_offset is None:
                scan.first_offset = batch.base_offset
            scan.max_timestamp = max(scan.max_timestamp, batch.max_timestamp)
            scan.batches += 1
            scan.records += batch.records_count
            valid = batch.position + batch.size
            next_offset = batch.next_offset
        else:
            if valid != seg.size and not growing:
                scan.problems.append(Problem(
                    seg.log_path, "torn-tail", f"{seg.log_path} at byte {valid}: torn batch, "
                    f"{seg.size - valid} bytes after the last whole batch", valid))
    except CorruptRecordError as err:
        scan.problems.append(Problem(seg.log_path, "corrupt-batch",
                                     f"{seg.log_path} at byte {err.position}: {err.reason}",
                                     err.position))
    scan.valid_bytes = valid
    scan.next_offset = next_offset
    log_readable = not any(p.path == seg.log_path and p.kind != "unsupported-codec"
                           for p in scan.problems)
    for check in (offset_check, time_check):
        if check is not None and log_readable and not growing:
            check.finish(valid, next_offset)
    if summarize is not None:
        scan.problems.extend(summarize.problems())
    return scan


# --- a partition directory --------------------------------------------------------------------

def require_partition_dir(directory: str) -> None:
    """Raise ``StorageError`` unless ``directory`` is an existing partition directory: named
    ``<topic>-<partition>`` or holding segment files."""
    if not os.path.exists(directory):
        raise StorageError(f"{directory}: no such directory")
    if not os.path.isdir(directory):
        raise StorageError(f"{directory}: not a directory (pass a partition directory such as "
                           "<data-dir>/orders-0)")
    name = os.path.basename(os.path.normpath(os.path.abspath(directory)))
    names = os.listdir(directory)
    if files.parse_partition_dir(name) is not None or any(
            files.parse_segment_name(n) for n in names):
        return
    partitions = sorted(n for n in names if files.parse_partition_dir(n)
                        and os.path.isdir(os.path.join(directory, n)))
    hint = (f"; it looks like a data directory: pass its partition directories, e.g. "
            f"{os.path.join(directory, partitions[0])}" if partitions else "")
    raise StorageError(f"{directory}: not a partition directory (expected <topic>-<partition> "
                       f"holding <base offset>.log segments){hint}")


def require_regular_file(path: str) -> None:
    """Raise ``StorageError`` unless ``path`` is a regular file (symlinks followed), looking
    with ``stat`` only: opening a FIFO would block. Raises ``OSError`` when it cannot be
    stat'ed (``FileNotFoundError``, ``PermissionError``)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise StorageError(f"{path}: not a regular file (it is {files.file_type(mode)})")


def live_broker_owns(directory: str) -> bool:
    """Whether a running broker holds the ``.lock`` of ``directory``'s data directory (its
    parent). Probed with a non-blocking shared ``flock`` on a descriptor of our own, released
    at once by closing it (a broker starting in that instant would find the dir in use)."""
    parent = os.path.dirname(os.path.normpath(os.path.abspath(directory)))
    try:
        fd = os.open(os.path.join(parent, files.LOCK_FILE), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False                    # no lock file: no broker ever ran on it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True                     # a broker holds it exclusively
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def _listing(directory: str, result: CheckResult, live: bool) -> tuple[list[int], set[str]]:
    """Segment base offsets (sorted) and every name in the directory; leftovers and orphan
    indexes go to ``result``. Raises ``StorageError`` for a segment-named entry that is not a
    regular file (a FIFO would hang the check, and the broker could not open it either)."""
    names = sorted(os.listdir(directory))
    bases: list[int] = []
    indexes: list[tuple[int, str]] = []
    for name in names:
        path = os.path.join(directory, name)
        parsed = files.parse_segment_name(name)
        leftover = (name.endswith((files.TMP_SUFFIX, files.DELETED_SUFFIX))
                    and datadir.is_partition_file(name)) or bool(parsed and parsed[2])
        if parsed is None and not leftover:
            continue                    # not the storage engine's: never opened
        try:
            require_regular_file(path)
        except FileNotFoundError:
            if live:
                continue                # deleted by the broker since the listing
            raise
        except StorageError as err:
            raise StorageError(f"{err}: {directory} is not a partition directory the broker "
                               "could open") from err
        if leftover:
            if not live and not name.endswith(files.DELETED_SUFFIX):   # live: work in progress
                result.problems.append(Problem(path, "leftover", f"{path}: leftover of an "
                                               "interrupted change (the broker removes or "
                                               "finishes it at open)"))
        elif parsed[1] == files.LOG_SUFFIX:
            bases.append(parsed[0])
        elif parsed[1] in (files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX, files.TXNINDEX_SUFFIX):
            indexes.append((parsed[0], path))
    known = set(bases)
    for base, path in indexes:
        if base not in known and not live:      # live: a segment mid-rename
            result.problems.append(Problem(path, "orphan-index", f"{path}: index without its "
                                           f"{files.segment_name(base, files.LOG_SUFFIX)}"))
    return bases, set(names)


def _missing_indexes(directory: str, scan: SegmentScan, names: set[str], last: bool
                     ) -> list[Problem]:
    """Indexes missing from a segment with data (see the module docstring for the one case
    where that is clean)."""
    if not scan.batches:
        return []
    out = []
    for kind in (files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX):
        name = files.segment_name(scan.base_offset, kind)
        if name in names:
            continue
        if last and scan.batches == 1 and (kind == files.INDEX_SUFFIX or scan.max_timestamp < 0):
            continue                    # created lazily: a one-batch last segment has none
        path = os.path.join(directory, name)
        batches = f"{scan.batches} batch{'es' * (scan.batches != 1)}"
        out.append(Problem(path, "index-missing", f"{path}: missing, but its segment holds "
                           f"{batches} (offsets {scan.first_offset}..{scan.next_offset - 1}); "
                           "the broker rebuilds it at open"))
    return out


def check_partition(directory: str, *, live_broker: bool | None = None) -> CheckResult:
    """Verify a partition directory without changing anything (see the module docstring).
    ``live_broker``: whether a running broker owns the data dir; None: find out
    (``live_broker_owns``).

    Raises ``StorageError`` when ``directory`` is not a partition directory (including one with
    a segment-named entry that is not a regular file) and ``OSError`` when a file cannot be
    read; everything wrong with the data is a ``Problem`` in the result.
    """
    require_partition_dir(directory)
    live = live_broker_owns(directory) if live_broker is None else live_broker
    result = CheckResult(directory, live_broker=live)
    bases, names = _listing(directory, result, live)
    for i, base in enumerate(bases):
        last = i + 1 == len(bases)
        try:
            seg = LogSegment(directory, base, _CONFIG, read_only=True)
        except FileNotFoundError:
            if live:
                continue                # retention removed it since the listing
            raise
        try:
            scan = scan_segment(seg, growing=live and last)
        finally:
            seg.close()
        result.segments.append(scan)
        result.problems.extend(scan.problems)
        if not (live and last):         # the active segment creates its indexes lazily
            result.problems.extend(_missing_indexes(directory, scan, names, last))
        if i + 1 < len(bases) and scan.next_offset > bases[i + 1]:
            result.problems.append(Problem(
                scan.path, "offset-order", f"{scan.path}: offsets up to {scan.next_offset - 1} "
                f"reach into the next segment, which starts at offset {bases[i + 1]}"))
        result.problems.extend(_check_txnindex(directory, base, scan.next_offset, names))
    result.problems.extend(_check_snapshots(directory, names))
    return result


def _check_txnindex(directory: str, base: int, next_offset: int, names) -> list[Problem]:
    """A segment's ``.txnindex``: whole entries, markers inside the segment, in order."""
    name = files.segment_name(base, files.TXNINDEX_SUFFIX)
    if name not in names:
        return []
    path = os.path.join(directory, name)
    try:
        index = TransactionIndex(path)
        index.validate(base, next_offset)
        if os.path.getsize(path) % TXN_ENTRY_SIZE:
            raise CorruptIndexError(path, f"length {os.path.getsize(path)} is not a multiple "
                                    f"of the {TXN_ENTRY_SIZE}-byte entry size")
    except CorruptIndexError as err:
        return [Problem(path, "txnindex-corrupt", str(err))]
    return []


def _check_snapshots(directory: str, names) -> list[Problem]:
    """Producer snapshots: version, length and CRC (a damaged one is ignored by the broker,
    which replays from an older one; ``--repair`` removes it)."""
    problems = []
    for name in sorted(names):
        parsed = files.parse_segment_name(name)
        if parsed is None or parsed[1] != files.SNAPSHOT_SUFFIX or parsed[2]:
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                decode_snapshot(f.read(), path)
        except CorruptRecordError as err:
            problems.append(Problem(path, "snapshot-corrupt", str(err)))
    return problems


# --- repair -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class FileChange:
    """One file a repair changed: ``truncated``, ``rebuilt``, ``removed``, ``created`` or
    ``rewritten``; sizes are None for a file that did not exist before or after."""

    name: str
    action: str
    size_before: int | None
    size_after: int | None

    def describe(self) -> str:
        if self.action == "truncated":
            return (f"truncated {self.name} from {self.size_before} to {self.size_after} bytes "
                    f"({self.size_before - self.size_after} bytes of torn or invalid data)")
        if self.action == "removed":
            return f"removed {self.name}"
        if self.action == "removed leftover":
            return f"removed leftover {self.name}"
        return f"{self.action} {self.name}"

    def as_dict(self) -> dict:
        return {"file": self.name, "action": self.action, "sizeBefore": self.size_before,
                "sizeAfter": self.size_after}


@dataclasses.dataclass(slots=True)
class RepairResult:
    directory: str
    report: RecoveryReport
    changes: list[FileChange]
    after: CheckResult        # a check of the repaired directory


def _snapshot(directory: str) -> dict[str, tuple[int, bytes | None]]:
    """name -> (size, content digest) of each file; ``.log`` files by size only (a repair only
    ever truncates them) and huge files by size and mtime."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if not os.path.isfile(path):
            continue
        digest: bytes | None = None
        if name.endswith(files.LOG_SUFFIX):
            digest = None
        elif st.st_size <= _HASH_LIMIT:
            h = hashlib.blake2b(digest_size=16)
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            digest = h.digest()
        else:
            digest = str(st.st_mtime_ns).encode()
        out[name] = (st.st_size, digest)
    return out


def _diff(before: dict, after: dict, report: RecoveryReport) -> list[FileChange]:
    changes = []
    leftovers = set(report.leftovers_removed)
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        parsed = files.parse_segment_name(name)
        is_index = parsed is not None and parsed[1] != files.LOG_SUFFIX and not parsed[2]
        if new is None:
            action = "removed leftover" if name in leftovers else "removed"
        elif old is None:
            action = "rebuilt" if is_index else "created"
        elif is_index:
            action = "rebuilt"
        elif name.endswith(files.LOG_SUFFIX) and new[0] < old[0]:
            action = "truncated"
        else:
            action = "rewritten"
        changes.append(FileChange(name, action, old and old[0], new and new[0]))
    return changes


@contextlib.contextmanager
def _data_dir_lock(directory: str):
    """Hold the parent data directory's ``.lock`` (if it has one) so that a repair never runs
    under a live broker. Raises ``LogDirLockedError`` when another process holds it."""
    parent = os.path.dirname(os.path.normpath(os.path.abspath(directory)))
    path = os.path.join(parent, files.LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise LogDirLockedError(f"{parent}: a live broker owns this data dir (another "
                                    f"process holds {path}); stop it before --repair: "
                                    "repairing under a live broker would corrupt its log"
                                    ) from err
        yield
    finally:
        os.close(fd)


def _log_start_offset(directory: str) -> int:
    """The partition's log start offset from its data dir's checkpoint, as the broker reads
    it (0 when there is none)."""
    path = os.path.normpath(os.path.abspath(directory))
    parsed = files.parse_partition_dir(os.path.basename(path))
    if parsed is None:
        return 0
    try:
        starts = files.read_checkpoint(os.path.join(os.path.dirname(path),
                                                    files.LOG_START_OFFSET_CHECKPOINT))
    except files.CheckpointError:
        return 0
    return starts.get(parsed, 0)


def repair_partition(directory: str) -> RepairResult:
    """Do what the broker does at an unclean start, then check the result. A directory that
    checks clean is left alone (an unclean start would rebuild its indexes at the default
    ``index.interval.bytes``, changing files that are fine).

    Raises ``StorageError`` when ``directory`` is not a partition directory,
    ``LogDirLockedError`` when a broker holds its data directory, ``OSError`` on I/O errors.
    """
    require_partition_dir(directory)
    foreign = datadir.foreign_entries(directory)
    if foreign or not os.listdir(directory):
        what = f"files mq did not write ({datadir.some(foreign)})" if foreign else "nothing"
        raise StorageError(f"{directory}: holds {what}: --repair changes only a partition "
                           "directory all of whose files mq wrote; move the others out first")
    with _data_dir_lock(directory):             # so no broker runs: no need to probe for one
        first = check_partition(directory, live_broker=False)
        if first.clean:           # nothing to do: do not rebuild indexes that are fine
            return RepairResult(directory, RecoveryReport(), [], first)
        before = _snapshot(directory)
        plog = PartitionLog.open(directory, _CONFIG, recovery_point=0,
                                 log_start_offset=_log_start_offset(directory),
                                 clean_shutdown=False)
        try:
            report = plog.recovery_report
        finally:
            plog.close()
        after = _snapshot(directory)
        again = check_partition(directory, live_broker=False)
    return RepairResult(directory, report, _diff(before, after, report), again)
