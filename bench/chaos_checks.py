"""The bookkeeping of the chaos run (``bench/chaos.py``): what the clients were told, what is
on disk, and the violations found between the two. No processes here, so it is tested alone.

- Values: producer ``n`` sends ``make_value(n, seq)``; ``value_code`` maps a value back to
  ``n << 32 | seq`` (-1 for anything else), so a partition's contents are one ``array("q")``.
- ``AckLedger``: the producers' ack files, ``A partition offset seq time`` per acknowledged
  record (``F seq error time`` per failed send); flags an offset acknowledged for two values.
- ``CommitLedger``: the members' commit files (a JSON line before ``commit()``, one after);
  checks a committed offset against the acknowledged commits.
- ``PartitionScan``: one partition's ``.log`` files read with ``pread`` (no maps: a file
  truncated under a map would SIGBUS the harness), every batch's CRC and offsets checked.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from array import array
from collections.abc import Callable

from mq.errors import CorruptRecordError
from mq.log.batch import RecordBatch
from mq.log.layout import FRAME, LOG_OVERHEAD, MAGIC, MIN_BATCH_LENGTH, RECORD_BATCH_OVERHEAD


def make_value(producer: int, seq: int) -> bytes:
    """The value of record ``seq`` of producer ``producer``: unique, 0-40 bytes of filler so
    that batches straddle pages at every alignment."""
    return b"p%d-%d|" % (producer, seq) + b"." * ((seq * 37 + producer * 11) % 41)


def value_code(value) -> int:
    """``producer << 32 | seq`` of a value made by ``make_value``; -1 for anything else."""
    if value is None:
        return -1
    v = bytes(value)
    head, bar, _ = v.partition(b"|")
    p, dash, s = head[1:].partition(b"-")
    if not (bar and dash and head[:1] == b"p" and p.isdigit() and s.isdigit()):
        return -1
    producer, seq = int(p), int(s)
    return producer << 32 | seq if make_value(producer, seq) == v else -1


def describe_code(code: int) -> str:
    return "nothing" if code < 0 else f"p{code >> 32}-{code & 0xFFFFFFFF}"


# --- ledgers (what the clients were told) -------------------------------------------------------

class LineFiles:
    """New complete lines of the files a set of processes append to (a line not yet ended
    with ``\\n`` waits for the next read)."""

    def __init__(self) -> None:
        self.pos: dict[str, int] = {}

    def read(self, path: str) -> list[bytes]:
        try:
            with open(path, "rb") as f:
                f.seek(self.pos.get(path, 0))
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.pos[path] = self.pos.get(path, 0) + end
        return data[:end].splitlines()


class AckLedger:
    """Acknowledged records per partition: ``codes[p][offset]`` (-1: none acknowledged) and the
    time of the ack; ``pending[p]``: offsets acknowledged since the last check."""

    def __init__(self, partitions: int, violations: Violations, where: Callable) -> None:
        self.codes = [array("q") for _ in range(partitions)]
        self.times = [array("d") for _ in range(partitions)]
        self.pending: list[list[int]] = [[] for _ in range(partitions)]
        self.count = 0
        self.failed: collections.Counter = collections.Counter()
        self.last_ack_t = 0.0
        self.files = LineFiles()
        self.violations, self.where = violations, where

    def read(self, producers: dict[int, str]) -> None:
        for n, path in producers.items():
            for line in self.files.read(path):
                f = line.split()
                if f[0] == b"F":
                    self.failed[f[2].decode()] += 1
                    continue
                p, offset, seq, t = int(f[1]), int(f[2]), int(f[3]), float(f[4])
                self._add(p, offset, n << 32 | seq, t)

    def _add(self, p: int, offset: int, code: int, t: float) -> None:
        codes, times = self.codes[p], self.times[p]
        if offset >= len(codes):
            grow = offset + 1 - len(codes)
            codes.extend([-1] * grow)
            times.extend([0.0] * grow)
        if codes[offset] >= 0:
            if codes[offset] != code:
                self.violations.add(
                    "offset-reused", f"partition {p} offset {offset}",
                    f"acknowledged for {describe_code(codes[offset])} "
                    f"({self.where(times[offset])}) and again for {describe_code(code)} "
                    f"({self.where(t)})")
            return
        codes[offset], times[offset] = code, t
        self.pending[p].append(offset)
        self.count += 1
        self.last_ack_t = max(self.last_ack_t, t)


class CommitLedger:
    """The members' commits per partition: the acknowledged ones and those that may have been
    applied (failed, or cut short by a kill)."""

    @dataclasses.dataclass
    class Commit:
        member: int
        n: int
        t0: float
        offset: int
        t1: float | None = None
        ok: bool = False

    def __init__(self) -> None:
        self.files = LineFiles()
        self.by_partition: dict[int, list[CommitLedger.Commit]] = collections.defaultdict(list)
        self.open: dict[tuple[int, int], list[CommitLedger.Commit]] = {}
        self.acked = 0
        self.failed = 0
        self.errors: collections.Counter = collections.Counter()
        self.last_ack_t = 0.0

    def read(self, members: dict[int, str]) -> None:
        for m, path in members.items():
            for line in self.files.read(path):
                e = json.loads(line)
                if "t0" in e:
                    cs = [self.Commit(m, e["n"], e["t0"], o) for _, o in e["offsets"]]
                    for (p, _), c in zip(e["offsets"], cs, strict=True):
                        self.by_partition[p].append(c)
                    self.open[m, e["n"]] = cs
                elif "t1" in e:
                    for c in self.open.pop((m, e["n"]), []):
                        c.t1, c.ok = e["t1"], e["ok"]
                    if e["ok"]:
                        self.acked += 1
                        self.last_ack_t = max(self.last_ack_t, e["t1"])
                    else:
                        self.failed += 1
                        self.errors[e.get("error", "?").split("(")[0]] += 1
                else:
                    self.errors[e.get("error", "?").split("(")[0]] += 1

    def check(self, committed: dict[int, int], asked_at: float, answered_at: float,
              violations: Violations, where: Callable) -> None:
        """``committed``: the broker's answer to a question sent at ``asked_at`` and answered
        at ``answered_at``. The last acknowledged commit L (latest start among those
        acknowledged before the question) must be the answer, or a commit that may have been
        applied after L: one whose outcome came after L started, or never came (its member
        was killed). A commit that ended, either way, before L started was superseded by L
        (a failed one ended with its connection, so the broker never applies it later); a
        commit started after the answer cannot be it."""
        for p, commits in self.by_partition.items():
            done = [c for c in commits if c.ok and c.t1 is not None and c.t1 < asked_at]
            if not done:
                continue
            last = max(done, key=lambda c: c.t0)
            valid = {last.offset} | {c.offset for c in commits if c.t0 < answered_at and (
                c.t1 is None or c.t1 >= last.t0)}
            got = committed.get(p)
            if got not in valid:
                what = "has no committed offset" if got is None else f"committed offset {got}"
                violations.add("commit-lost", f"partition {p}",
                               f"{what}; acknowledged commit of {last.offset} by member "
                               f"m{last.member} ({where(last.t1)}); possible values "
                               f"{sorted(valid)}")
            # Commits that ended before L started can never be the answer again.
            self.by_partition[p] = [c for c in commits if c.t1 is None or c.t1 >= last.t0]


# --- the log on disk ----------------------------------------------------------------------------

class PartitionScan:
    """One partition directory read from disk with ``pread``, incrementally: ``codes[offset]``
    is ``value_code`` of the record at each offset read so far (the log starts at offset 0:
    this topic has no retention). Every batch must be whole, pass its CRC and continue the
    offsets; the first place where that fails is ``blocked`` (nothing after it is read: a
    consumer stops there, and recovery truncates there). An all-zero header is the end of the
    data (a preallocated tail). No maps: a file truncated under a map would SIGBUS."""

    def __init__(self, path: str) -> None:
        self.dir = path
        self.codes = array("q")
        self.segments: list[int] = []         # bases of the segments read (the last: current)
        self.pos = 0                          # next byte to read in the current segment
        self.last_header: tuple[int, int, bytes] | None = None  # (segment, position, header)
        self.blocked: str | None = None
        self.blocked_at: int | None = None    # offset the log is unreadable from

    def _bases(self) -> list[int]:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit())

    def _path(self, base: int) -> str:
        return os.path.join(self.dir, f"{base:020d}.log")

    def _block(self, base: int, position: int, why: str) -> None:
        self.blocked = (f"{os.path.basename(self.dir)}/{base:020d}.log byte {position}: {why}")
        self.blocked_at = len(self.codes)

    def advance(self) -> None:
        """Read whatever was appended since the last call."""
        if self.blocked:
            return
        bases = self._bases()
        if not self.segments:
            if not bases:
                return
            if bases[0] != 0:
                self._block(bases[0], 0, f"the first segment starts at offset {bases[0]}")
                return
            self.segments = [bases[0]]
        while True:
            base = self.segments[-1]
            try:
                with open(self._path(base), "rb") as f:
                    data = os.pread(f.fileno(), max(0, os.fstat(f.fileno()).st_size - self.pos),
                                    self.pos)
            except FileNotFoundError:
                self._block(base, self.pos, "segment file disappeared")
                return
            used = self._parse(base, data)
            self.pos += used
            if self.blocked:
                return
            later = [b for b in bases if b > base]
            if not later:
                return
            rest = data[used:]                 # a later segment exists: this one is final
            if rest.strip(b"\0"):
                self._block(base, self.pos, f"{len(rest)} bytes after the last whole batch "
                                            "of a rolled segment")
                return
            if later[0] != len(self.codes):
                self._block(later[0], 0, f"segment starts at offset {later[0]}, the one "
                                         f"before ends at {len(self.codes)}")
                return
            self.segments.append(later[0])
            self.pos = 0

    def _parse(self, base: int, data: bytes) -> int:
        """Take the whole valid batches at the start of ``data``; returns the bytes taken."""
        mv = memoryview(data)
        pos, end = 0, len(data)
        codes = self.codes
        while end - pos >= FRAME.size:
            offset, length, _, magic = FRAME.unpack_from(mv, pos)
            at = self.pos + pos
            if offset == 0 and length == 0 and magic == 0:
                break                         # zeros: a preallocated tail, the end of data
            if length < MIN_BATCH_LENGTH or magic != MAGIC:
                self._block(base, at, f"no batch can start here (length {length}, "
                                      f"magic {magic})")
                break
            size = LOG_OVERHEAD + length
            if pos + size > end:
                break                         # still being written (or a torn tail)
            try:
                batch = RecordBatch(mv[pos:pos + size], at, self._path(base))
                batch.validate()
                records = batch.records()
            except CorruptRecordError as err:
                self._block(base, at, f"invalid batch (base offset {offset}, {size} bytes): "
                                      f"{err.reason}")
                break
            if offset != len(codes) or [r.offset for r in records] != list(
                    range(offset, offset + len(records))):
                self._block(base, at, f"batch of offsets {offset}..{batch.last_offset} where "
                                      f"offset {len(codes)} comes next")
                break
            codes.extend(value_code(r.value) for r in records)
            self.last_header = (base, at, bytes(mv[pos:pos + RECORD_BATCH_OVERHEAD]))
            pos += size
        return pos

    def end(self) -> str:
        """Where and why reading stops (for a report)."""
        if self.blocked:
            return f"the log breaks at offset {self.blocked_at}: {self.blocked}"
        if not self.segments:
            return "the partition has no segment on disk"
        base = self.segments[-1]
        where = f"{os.path.basename(self.dir)}/{base:020d}.log byte {self.pos}"
        try:
            with open(self._path(base), "rb") as f:
                rest = os.fstat(f.fileno()).st_size - self.pos
                head = os.pread(f.fileno(), FRAME.size, self.pos)
        except FileNotFoundError:
            return f"the log ends at offset {len(self.codes)}: {where}: the file is gone"
        if rest <= 0:
            return f"the log ends at offset {len(self.codes)}, {where} (end of file)"
        if len(head) < FRAME.size:
            return f"the log ends at offset {len(self.codes)}, {where}: {rest} bytes follow"
        offset, length, _, magic = FRAME.unpack(head)
        return (f"the log ends at offset {len(self.codes)}, {where}: a batch header there "
                f"(base offset {offset}, magic {magic}) claims {LOG_OVERHEAD + length} bytes, "
                f"{rest} follow")

    def unchanged(self) -> bool:
        """After a broker restart: are the bytes read so far still there? (Recovery may have
        truncated them and new appends may have filled the place.) Checks the segment list
        up to the current one, its size, and the last batch header read."""
        if self.blocked:
            return False
        if not self.segments:
            return True
        bases = self._bases()
        if [b for b in bases if b <= self.segments[-1]] != self.segments:
            return False
        try:
            if os.path.getsize(self._path(self.segments[-1])) < self.pos:
                return False
            if self.last_header is not None:
                base, at, header = self.last_header
                with open(self._path(base), "rb") as f:
                    return os.pread(f.fileno(), len(header), at) == header
        except FileNotFoundError:
            return False
        return True

    def get(self, offset: int) -> int | None:
        """``value_code`` of the record at ``offset``; None if not read (yet)."""
        return self.codes[offset] if offset < len(self.codes) else None


# --- violations ---------------------------------------------------------------------------------

class Violations:
    """Counts per kind, and the first few descriptions of each."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.count: collections.Counter = collections.Counter()
        self.examples: dict[str, list[str]] = collections.defaultdict(list)
        self.cycle = "setup"
        self.progress = progress

    def add(self, kind: str, where: str, what: str) -> None:
        self.count[kind] += 1
        if len(self.examples[kind]) < 5:
            text = f"{where}: {what} [found after {self.cycle}]"
            self.examples[kind].append(text)
            if len(self.examples[kind]) == 1:
                self.progress(f"VIOLATION {kind}: {text}")

    def summary(self) -> dict:
        return {k: {"count": self.count[k], "first": self.examples[k]} for k in self.count}
