"""The pool's shared counter table: one small memory-mapped file per pool, written by the
children and the supervisor, read by the supervisor and by anything else that wants to look
(``read_stats``; the metrics exporter of the observability issue reads it the same way).

Why a file and not a pipe: nothing can block on it. A child never waits for the parent to read,
a dead reader costs nothing, and a child killed with SIGKILL leaves its last values (and the
records it had in flight) where the supervisor finds them.

Where: ``/dev/shm/mq-workers-<group>-<supervisor pid>.stats`` (a tmpfs, so no disk I/O; the
system temp dir where there is no ``/dev/shm``), unless ``stats_path=`` says otherwise. The
supervisor creates it, logs its path and removes it when it exits (a supervisor killed with
SIGKILL cannot: the next pool of the group removes such leftovers, ``remove_stale``);
``find_stats()`` lists the tables of live pools.

Layout (little-endian int64 words; every field is one aligned 8-byte word, so a reader never
sees half a value)::

    header, 8 words
      0  magic b"MQWORK01"        4  attempts_version (bumped after each attempts change)
      1  layout version (1)       5  attempts cursor (next ring entry to write)
      2  slots | inflight << 16 | attempts << 32      6  supervisor pid
      3  names (group + topics)   7  created (ns since the epoch)
    names, 32 words each: the group id, then the pool's topics (UTF-8, NUL-padded, 256 bytes);
      records name their topic by index into this list (0 is the first topic)
    rows, one per slot: ROW_WORDS counters (COUNTERS below; word 13 counts changes of the
      row's retry hints, 14 is their cursor), then ``inflight`` entries of INFLIGHT_WORDS:
      topic index, partition, offset, attempt, started (CLOCK_MONOTONIC ns; 0 = a free
      entry), then RETRY_HINTS entries of HINT_WORDS: topic index (-1 = unused), partition,
      offset, failed attempts, next try not before (CLOCK_MONOTONIC ns) — records the child
      tried and has not finished, so that the next owner of their partition (after a
      rebalance, or the child's death in a backoff) goes on counting and waiting instead of
      starting again
    attempts ring, ``attempts`` entries of ATTEMPT_WORDS: topic index (-1 = unused),
      partition, offset, failed attempts so far (deaths included), kind (KIND_*) and detail
      (exit status or signal) of the last death

Writers: a child writes its own row (counters, in-flight entries, retry hints) and nothing
else; the supervisor writes ``pid``, ``state`` while the slot has no live child, ``hang_kills``,
``deaths`` and ``incarnations``, and the attempts ring. Counters are cumulative per slot: a new
child of a slot starts from what its predecessor left.
"""

from __future__ import annotations

import glob
import mmap
import os
import re
import tempfile
import time

__all__ = ["COUNTERS", "STATES", "StatsTable", "default_stats_path", "find_ended", "find_stats",
           "read_stats", "remove_stale", "stats_dir"]

MAGIC = int.from_bytes(b"MQWORK01", "little")
VERSION = 1
HEADER_WORDS = 8
NAME_WORDS = 32                       # 256 bytes a name
COUNTERS = ("pid", "state", "incarnations", "handled", "retried", "failed", "dead_lettered",
            "skipped", "handler_ns", "hang_kills", "deaths", "committed", "last_active_ns")
ROW_WORDS = 16
RETRY_VERSION, RETRY_CURSOR = 13, 14
INFLIGHT_WORDS = 5
RETRY_HINTS = 32
HINT_WORDS = 5
ATTEMPT_WORDS = 6
ATTEMPTS = 1024                        # ring of records whose attempts a death spent

(PID, STATE, INCARNATIONS, HANDLED, RETRIED, FAILED, DEAD_LETTERED, SKIPPED, HANDLER_NS,
 HANG_KILLS, DEATHS, COMMITTED, LAST_ACTIVE_NS) = range(len(COUNTERS))

# Slot states, as the table shows them.
STATES = ("empty", "starting", "running", "draining", "backoff", "stopped", "crash-loop")
(EMPTY, STARTING, RUNNING, DRAINING, BACKOFF, STOPPED, CRASH_LOOP) = range(len(STATES))

# Why an attempt failed without an exception the child could see.
KIND_TIMEOUT, KIND_DIED = 1, 2


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]


def stats_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else tempfile.gettempdir()


def default_stats_path(group_id: str, pid: int | None = None) -> str:
    return os.path.join(stats_dir(), f"mq-workers-{_sanitize(group_id)}-"
                                     f"{os.getpid() if pid is None else pid}.stats")


class StatsTable:
    """The mapped table. ``create`` (the supervisor) or ``open`` (a child, a reader)."""

    def __init__(self, path: str, mm: mmap.mmap, writable: bool) -> None:
        self.path = path
        self._mm = mm
        size = len(mm)
        if size % 8 or size < HEADER_WORDS * 8:
            mm.close()
            raise ValueError(f"{path}: not a worker pool stats table ({size} bytes)")
        self.words = memoryview(mm).cast("q")
        w = self.words
        if w[0] != MAGIC or w[1] != VERSION:
            self.close()
            raise ValueError(f"{path}: not a worker pool stats table (layout {VERSION})")
        self.slots = w[2] & 0xFFFF
        self.inflight = (w[2] >> 16) & 0xFFFF
        self.attempts = (w[2] >> 32) & 0xFFFF
        self.names = w[3]
        self.writable = writable
        self._rows = HEADER_WORDS + self.names * NAME_WORDS
        self._row_size = ROW_WORDS + self.inflight * INFLIGHT_WORDS + RETRY_HINTS * HINT_WORDS
        self._ring = self._rows + self.slots * self._row_size

    @staticmethod
    def size(slots: int, names: int, inflight: int, attempts: int = ATTEMPTS) -> int:
        words = (HEADER_WORDS + names * NAME_WORDS + slots * _row_words(inflight)
                 + attempts * ATTEMPT_WORDS)
        return words * 8

    @classmethod
    def create(cls, path: str, group_id: str, topics: list[str], slots: int,
               inflight: int) -> StatsTable:
        names = [group_id, *topics]
        size = cls.size(slots, len(names), inflight)
        tmp = f"{path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        w = memoryview(mm).cast("q")
        w[1] = VERSION
        w[2] = slots | inflight << 16 | ATTEMPTS << 32
        w[3] = len(names)
        w[6] = os.getpid()
        w[7] = time.time_ns()
        for i, name in enumerate(names):
            raw = name.encode()[:NAME_WORDS * 8 - 1]
            start = (HEADER_WORDS + i * NAME_WORDS) * 8
            mm[start:start + len(raw)] = raw
        rows = HEADER_WORDS + len(names) * NAME_WORDS
        for slot in range(slots):
            hints = rows + slot * _row_words(inflight) + ROW_WORDS + inflight * INFLIGHT_WORDS
            for i in range(RETRY_HINTS):
                w[hints + i * HINT_WORDS] = -1
        ring = rows + slots * _row_words(inflight)
        for i in range(ATTEMPTS):
            w[ring + i * ATTEMPT_WORDS] = -1
        w[0] = MAGIC                                  # last: a reader sees a whole table
        w.release()
        os.rename(tmp, path)
        return cls(path, mm, writable=True)

    @classmethod
    def open(cls, path: str, writable: bool = False) -> StatsTable:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            mm = mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        finally:
            os.close(fd)
        return cls(path, mm, writable)

    def close(self) -> None:
        try:
            self.words.release()
        except (AttributeError, ValueError):
            pass
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass

    # --- names ------------------------------------------------------------------------------
    def name(self, i: int) -> str:
        start = (HEADER_WORDS + i * NAME_WORDS) * 8
        return bytes(self._mm[start:start + NAME_WORDS * 8]).rstrip(b"\0").decode()

    @property
    def group_id(self) -> str:
        return self.name(0)

    @property
    def topics(self) -> list[str]:
        return [self.name(i) for i in range(1, self.names)]

    # --- rows -------------------------------------------------------------------------------
    def row(self, slot: int) -> int:
        """Word index of ``slot``'s row."""
        return self._rows + slot * self._row_size

    def inflight_entry(self, slot: int, i: int) -> int:
        return self.row(slot) + ROW_WORDS + i * INFLIGHT_WORDS

    def counters(self, slot: int) -> dict[str, int]:
        base = self.row(slot)
        return {name: self.words[base + i] for i, name in enumerate(COUNTERS)}

    def in_flight(self, slot: int) -> list[tuple[int, int, int, int, int]]:
        """``(topic index, partition, offset, attempt, started ns)`` of the slot's busy
        entries."""
        out = []
        for i in range(self.inflight):
            e = self.inflight_entry(slot, i)
            started = self.words[e + 4]
            if started:
                out.append((self.words[e], self.words[e + 1], self.words[e + 2],
                            self.words[e + 3], started))
        return out

    # --- retry hints (each child its own row's; every child reads them all) ------------------
    def hint(self, slot: int, i: int) -> int:
        return self.row(slot) + ROW_WORDS + self.inflight * INFLIGHT_WORDS + i * HINT_WORDS

    def set_hint(self, slot: int, topic: int, partition: int, offset: int, failed: int,
                 not_before_ns: int) -> None:
        """The child of ``slot`` failed ``failed`` attempts of a record it still holds; the
        next is due at ``not_before_ns``."""
        w, row = self.words, self.row(slot)
        for i in range(RETRY_HINTS):
            e = self.hint(slot, i)
            if w[e] == topic and w[e + 1] == partition and w[e + 2] == offset:
                break
        else:
            e = self.hint(slot, w[row + RETRY_CURSOR] % RETRY_HINTS)
            w[row + RETRY_CURSOR] += 1
            w[e] = -1
            w[e + 1], w[e + 2] = partition, offset
        w[e + 3], w[e + 4] = failed, not_before_ns
        w[e] = topic
        w[row + RETRY_VERSION] += 1

    def clear_hint(self, slot: int, topic: int, partition: int, offset: int) -> None:
        w = self.words
        for i in range(RETRY_HINTS):
            e = self.hint(slot, i)
            if w[e] == topic and w[e + 1] == partition and w[e + 2] == offset:
                w[e] = -1
                w[self.row(slot) + RETRY_VERSION] += 1

    def hints_version(self) -> int:
        """Changes of the attempts ring and of every row's hints, summed."""
        w = self.words
        return w[4] + sum(w[self.row(s) + RETRY_VERSION] for s in range(self.slots))

    def hints(self) -> dict[tuple[int, int, int], tuple[int, int]]:
        """``{(topic index, partition, offset): (failed attempts, not before ns)}`` over every
        row (the most attempts where rows disagree)."""
        w, out = self.words, {}
        for s in range(self.slots):
            for i in range(RETRY_HINTS):
                e = self.hint(s, i)
                if w[e] >= 0:
                    key = (w[e], w[e + 1], w[e + 2])
                    if w[e + 3] > out.get(key, (0, 0))[0]:
                        out[key] = (w[e + 3], w[e + 4])
        return out

    def clear_in_flight(self, slot: int) -> None:
        for i in range(self.inflight):
            self.words[self.inflight_entry(slot, i) + 4] = 0

    def set(self, slot: int, counter: int, value: int) -> None:
        self.words[self.row(slot) + counter] = value

    def add(self, slot: int, counter: int, n: int = 1) -> None:
        self.words[self.row(slot) + counter] += n

    # --- attempts (the supervisor writes, children read) -------------------------------------
    @property
    def attempts_version(self) -> int:
        return self.words[4]

    def record_attempt(self, topic: int, partition: int, offset: int, attempt: int, kind: int,
                       detail: int) -> None:
        """Attempt ``attempt`` of a record failed by a death the child could not report (it
        was that attempt's number in the child's in-flight entry: prior attempts included)."""
        w, ring = self.words, self._ring
        for i in range(self.attempts):
            e = ring + i * ATTEMPT_WORDS
            if w[e] == topic and w[e + 1] == partition and w[e + 2] == offset:
                w[e + 3] = max(w[e + 3], attempt)
                w[e + 4], w[e + 5] = kind, detail
                w[4] += 1
                return
        e = ring + (w[5] % self.attempts) * ATTEMPT_WORDS
        w[5] += 1
        w[e] = -1                                     # a reader skips it while it changes
        w[e + 1], w[e + 2], w[e + 3] = partition, offset, attempt
        w[e + 4], w[e + 5] = kind, detail
        w[e] = topic
        w[4] += 1

    def attempt_entries(self) -> dict[tuple[int, int, int], tuple[int, int, int]]:
        """``{(topic index, partition, offset): (failed attempts, kind, detail)}``."""
        w, ring, out = self.words, self._ring, {}
        for i in range(self.attempts):
            e = ring + i * ATTEMPT_WORDS
            if w[e] >= 0:
                out[(w[e], w[e + 1], w[e + 2])] = (w[e + 3], w[e + 4], w[e + 5])
        return out

    def snapshot(self) -> dict:
        """Everything, as plain values (``read_stats``)."""
        topics = self.topics
        slots = []
        for s in range(self.slots):
            c = self.counters(s)
            c["state"] = STATES[c["state"]] if 0 <= c["state"] < len(STATES) else "?"
            c["handler_seconds"] = c.pop("handler_ns") / 1e9
            c.pop("last_active_ns")
            c["slot"] = s
            c["in_flight"] = [{"topic": topics[t] if 0 <= t < len(topics) else None,
                               "partition": p, "offset": o, "attempt": a,
                               "running_s": max(0.0, (time.monotonic_ns() - st) / 1e9)}
                              for t, p, o, a, st in self.in_flight(s)]
            slots.append(c)
        return {"group": self.group_id, "topics": topics, "supervisor_pid": self.words[6],
                "created_ns": self.words[7], "slots": slots}


def _row_words(inflight: int) -> int:
    return ROW_WORDS + inflight * INFLIGHT_WORDS + RETRY_HINTS * HINT_WORDS


def read_stats(path: str) -> dict:
    """A snapshot of a pool's counter table: ``{"group", "topics", "supervisor_pid",
    "created_ns", "slots": [{"slot", "pid", "state", "incarnations", "handled", "retried",
    "failed", "dead_lettered", "skipped", "handler_seconds", "hang_kills", "deaths",
    "committed", "in_flight": [{"topic", "partition", "offset", "attempt", "running_s"}]}]}``.
    Raises ``OSError`` for a missing file, ``ValueError`` for a file that is not a table."""
    table = StatsTable.open(path)
    try:
        return table.snapshot()
    finally:
        table.close()


def find_stats(group_id: str | None = None, directory: str | None = None) -> list[str]:
    """Paths of the tables of live pools (of ``group_id``, or all) in the default place."""
    return [path for path, pid in _tables(group_id, directory) if _alive(pid)]


def find_ended(group_id: str | None = None, directory: str | None = None) -> list[str]:
    """Paths of the tables pools (of ``group_id``, or all) left behind when their supervisor
    was killed: its pid is gone. (A pool that exits removes its own.)"""
    return [path for path, pid in _tables(group_id, directory) if not _alive(pid)]


def remove_stale(group_id: str, directory: str | None = None) -> list[str]:
    """Remove the tables ``group_id``'s pools left behind when their supervisor was killed
    (its pid is gone); returns their paths."""
    gone = []
    for path in find_ended(group_id, directory):
        try:
            os.unlink(path)
            gone.append(path)
        except OSError:
            pass
    return gone


def _tables(group_id: str | None, directory: str | None) -> list[tuple[str, int]]:
    """(path, supervisor pid) of the tables of ``group_id``'s pools (or all), sorted. Group
    ``a``'s are not group ``a-b``'s: what follows the group name must be the pid."""
    prefix = f"mq-workers-{_sanitize(group_id)}-" if group_id else "mq-workers-"
    out = []
    for path in sorted(glob.glob(os.path.join(directory or stats_dir(), prefix + "*.stats"))):
        name = os.path.basename(path).removesuffix(".stats")
        pid = name.rsplit("-", 1)[-1]
        if pid.isdigit() and (not group_id or name == prefix + pid):
            out.append((path, int(pid)))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
