"""Crash and corruption injection, as Kafka's LogLoaderTest and LogSegmentTest do it.

A template partition (several small segments, mixed codecs, sparse indexes, non-monotonic
timestamps) is built once and cleanly closed; every case copies it, damages the copy — a torn
active ``.log`` at every byte of its last batches, flipped bytes, a zero-filled tail, garbage or
missing ``.index``/``.timeindex`` files, random bytes appended, leftovers of an interrupted
swap — and opens it after an "unclean shutdown" (``recovery_point=0``); the ``*_repaired_by_cli``
cases repair it with ``mq log check --repair`` instead. The rule checked (Kafka's recovery):
exactly the batches entirely before the first damaged byte survive, every later segment is
dropped, every offset and timestamp lookup matches brute force over the survivors, indexes are
rebuilt identically, and appends continue at the right offset.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq.errors import OffsetOutOfRangeError
from mq.log import files
from mq.log.batch import iter_batches
from mq.log.builder import BatchBuilder
from mq.log.compression import GZIP, LZ4, NONE
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.log.segment import LogSegment

CFG = LogConfig(segment_bytes=700, index_interval_bytes=90, segment_index_bytes=4096)
NOW = 1_700_000_000_000
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Scratch copies live on tmpfs when there is one: these tests reopen and close logs hundreds of
# times, and each close fsyncs (durability is not what they test — the damage is made by hand).
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _b(x):
    return None if x is None else bytes(x)


def rows_of(batch) -> list[tuple]:
    return [(r.offset, r.timestamp, _b(r.key), _b(r.value), [(k, _b(v)) for k, v in r.headers])
            for r in batch.records()]


@dataclasses.dataclass(frozen=True)
class Batch:
    seg: int              # index of its segment
    position: int         # byte position in that segment's .log
    size: int
    base_offset: int
    rows: tuple

    @property
    def end(self) -> int:
        return self.position + self.size

    @property
    def next_offset(self) -> int:
        return self.rows[-1][0] + 1


@dataclasses.dataclass(frozen=True)
class Layout:
    dir: str
    bases: tuple[int, ...]
    batches: tuple[Batch, ...]
    files: dict                    # name -> bytes of the cleanly closed template

    def log_name(self, seg: int) -> str:
        return files.segment_name(self.bases[seg], files.LOG_SUFFIX)

    def seg_batches(self, seg: int) -> list[Batch]:
        return [b for b in self.batches if b.seg == seg]


def _build_template(directory: str) -> Layout:
    log = PartitionLog.open(directory, CFG, now_ms=NOW)
    codecs = [NONE, NONE, GZIP, NONE, LZ4, NONE]
    skews = [30, -40, 10, 0]
    try:
        for i in range(22):
            # The last three batches are small (one short record): every byte of them is a
            # crash point in test (a).
            small = i >= 19
            builder = BatchBuilder(compression=NONE if small else codecs[i % len(codecs)])
            for j in range(1 if small else 1 + i % 3):
                key = None if (i + j) % 4 == 0 else f"k{i}-{j}".encode()
                value = None if (i * 3 + j) % 7 == 0 else f"value {i}.{j} ".encode() * (1 + j)
                if small:
                    key, value = None, b"v%d" % i
                headers = [("h", b"x"), ("n", None)] if (i + j) % 5 == 0 else []
                ts = NOW - 100_000 + 100 * i + skews[(i + j) % 4]
                if i % 6 == 1 and j == 0:
                    ts += 50_000          # a spike: segments' largest timestamps come early
                builder.append(ts, key, value, headers)
            log.append(builder.build(), now_ms=NOW)
    finally:
        log.close()
    bases = sorted(p[0] for p in map(files.parse_segment_name, os.listdir(directory))
                   if p and p[1] == files.LOG_SUFFIX)
    batches = []
    for seg, base in enumerate(bases):
        with open(os.path.join(directory, files.segment_name(base, files.LOG_SUFFIX)), "rb") as f:
            data = f.read()
        for batch in iter_batches(data):
            batches.append(Batch(seg, batch.position, batch.size, batch.base_offset,
                                 tuple((o, t, k, v, tuple(h)) for o, t, k, v, h in
                                       rows_of(batch))))
    contents = {}
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            contents[name] = f.read()
    return Layout(directory, tuple(bases), tuple(batches), contents)


@pytest.fixture(scope="module")
def layout() -> Layout:
    root = tempfile.mkdtemp(prefix="mq-fault-template-", dir=SCRATCH)
    try:
        lay = _build_template(os.path.join(root, "topic-0"))
        # The scenarios need several segments, sparse index entries and >= 3 batches at the
        # end, the last three of them small.
        assert len(lay.bases) >= 4
        assert len(lay.seg_batches(len(lay.bases) - 1)) >= 3
        assert all(b.size < 80 for b in lay.seg_batches(len(lay.bases) - 1)[-3:])
        assert all(len(lay.files[files.segment_name(b, files.INDEX_SUFFIX)]) > 0
                   for b in lay.bases[:-1])
        yield lay
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Scratch:
    """A private copy of the template in its own temp dir (per Hypothesis example, too)."""

    def __init__(self, lay: Layout) -> None:
        self.root = tempfile.mkdtemp(prefix="mq-fault-", dir=SCRATCH)
        self.dir = os.path.join(self.root, "topic-0")
        shutil.copytree(lay.dir, self.dir)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


# --- the recovery rule and its checks --------------------------------------------------------

def survivors(lay: Layout, seg: int | None, position: int | None) -> list[Batch]:
    """Batches entirely before the first damaged byte (``position`` in segment ``seg``)."""
    if seg is None:
        return list(lay.batches)
    return [b for b in lay.batches if b.seg < seg or (b.seg == seg and b.end <= position)]


def first_difference(original: bytes, damaged: bytes) -> int | None:
    for i in range(min(len(original), len(damaged))):
        if original[i] != damaged[i]:
            return i
    return None if len(original) == len(damaged) else min(len(original), len(damaged))


def expected_content(kept: list[Batch]) -> list[tuple]:
    return [(b.base_offset, [(r[0], r[1], r[2], r[3], list(r[4])) for r in b.rows])
            for b in kept]


def verify(log: PartitionLog, lay: Layout, kept: list[Batch], bases: list[int],
           log_start_offset: int = 0) -> None:
    """The log holds exactly ``kept`` in segments ``bases``; every lookup agrees."""
    leo = kept[-1].next_offset if kept else (bases[-1] if bases else log_start_offset)
    assert [s.base_offset for s in log.segments] == bases
    on_disk = sorted(p[0] for p in map(files.parse_segment_name, os.listdir(log.dir))
                     if p and p[1] == files.LOG_SUFFIX and not p[2])
    assert on_disk == bases
    assert not [n for n in os.listdir(log.dir) if n.endswith((".deleted", ".swap", ".cleaned"))]
    assert log.log_end_offset == leo
    assert log.high_watermark == leo
    assert log.log_start_offset == log_start_offset
    for batch in log.batches():
        batch.validate()
    assert [(b.base_offset, rows_of(b)) for b in log.batches()] == expected_content(kept)
    # Every offset read returns whole batches starting with the one holding it.
    holding = {}
    for i, b in enumerate(kept):
        for r in b.rows:
            holding[r[0]] = i
    for offset in range(log_start_offset, leo):
        got = list(iter_batches(log.read(offset).data))
        assert got and got[0].base_offset <= offset <= got[0].last_offset, offset
        for j, batch in enumerate(got):
            assert batch.base_offset == kept[holding[offset] + j].base_offset
        one = list(iter_batches(log.read(offset, max_bytes=1).data))
        assert len(one) == 1 and one[0].base_offset == kept[holding[offset]].base_offset
    assert log.read(leo).data == b""
    for outside in ([log_start_offset - 1] if log_start_offset else []) + [leo + 1]:
        with pytest.raises(OffsetOutOfRangeError):
            log.read(outside)
    # Every timestamp lookup matches brute force (earliest offset in log order with ts >= T).
    records = [r for b in kept for r in b.rows if r[0] >= log_start_offset]
    targets = {0, NOW}
    for r in records:
        targets.update((r[1] - 1, r[1], r[1] + 1))
    for t in sorted(targets):
        expected = next(((r[0], r[1]) for r in records if r[1] >= t), None)
        assert log.offset_for_timestamp(t) == expected, t
    if records:
        top = max(r[1] for r in records)
        assert log.offset_for_timestamp(-3) == next((r[0], r[1]) for r in records
                                                    if r[1] == top)
    else:
        assert log.offset_for_timestamp(-3) is None


def append_continues(directory: str, lay: Layout, kept: list[Batch], bases: list[int],
                     log_start_offset: int = 0) -> None:
    """After recovery a clean reopen holds the same data and an append continues it."""
    with PartitionLog.open(directory, CFG, clean_shutdown=True, recovery_point=0,
                           log_start_offset=log_start_offset, now_ms=NOW) as log:
        assert not log.recovery_report.bytes_truncated
        verify(log, lay, kept, bases, log_start_offset)
        leo = log.log_end_offset
        builder = BatchBuilder(compression=GZIP)
        builder.append(NOW + 5, b"after", b"recovery")
        builder.append(NOW + 6, None, b"second")
        info = log.append(builder.build(), now_ms=NOW)
        assert (info.first_offset, info.last_offset) == (leo, leo + 1)
        got = [r for b in iter_batches(log.read(leo).data) for r in rows_of(b)]
        assert got == [(leo, NOW + 5, b"after", b"recovery", []),
                       (leo + 1, NOW + 6, None, b"second", [])]
        assert log.offset_for_timestamp(NOW + 6) == (leo + 1, NOW + 6)


def same_files_for_intact_segments(directory: str, lay: Layout, upto_seg: int) -> None:
    """Segments before ``upto_seg`` were rebuilt byte for byte (LogLoaderTest: recovery
    reproduces index entry counts and the last time-index entry exactly)."""
    for seg in range(upto_seg):
        for kind in (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX):
            name = files.segment_name(lay.bases[seg], kind)
            with open(os.path.join(directory, name), "rb") as f:
                assert f.read() == lay.files[name], name


def recover_and_check(scratch: Scratch, lay: Layout, seg: int | None, position: int | None,
                      *, log_start_offset: int = 0) -> None:
    """Open unclean (recovery point 0), check the survivors, close, compare files, reopen
    clean and append."""
    kept = survivors(lay, seg, position)
    bases = list(lay.bases if seg is None else lay.bases[:seg + 1])
    with PartitionLog.open(scratch.dir, CFG, clean_shutdown=False, recovery_point=0,
                           log_start_offset=log_start_offset, now_ms=NOW) as log:
        verify(log, lay, kept, bases, log_start_offset)
    same_files_for_intact_segments(scratch.dir, lay, len(lay.bases) if seg is None else seg)
    if seg is not None:
        # The damaged segment keeps exactly its valid prefix, and its rebuilt offset index
        # the entries of that prefix.
        name = files.segment_name(lay.bases[seg], files.LOG_SUFFIX)
        cut = sum(b.size for b in kept if b.seg == seg)
        with open(scratch.path(name), "rb") as f:
            assert f.read() == lay.files[name][:cut]
        index = files.segment_name(lay.bases[seg], files.INDEX_SUFFIX)
        with open(scratch.path(index), "rb") as f:
            rebuilt = f.read()
        assert lay.files[index].startswith(rebuilt)
    append_continues(scratch.dir, lay, kept, bases, log_start_offset)


def cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m mq ARGS`` from this checkout."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "mq", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)


def repair_with_cli_and_check(scratch: Scratch, lay: Layout, seg: int | None,
                              position: int | None) -> None:
    kept = survivors(lay, seg, position)
    bases = list(lay.bases if seg is None else lay.bases[:seg + 1])
    done = cli("log", "check", "--repair", scratch.dir)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    again = cli("log", "check", scratch.dir)
    assert again.returncode == 0, (again.stdout, again.stderr)
    with PartitionLog.open(scratch.dir, CFG, clean_shutdown=True, now_ms=NOW) as log:
        # The data needs nothing more (a missing index is not a problem `check` reports, so
        # the broker may still rebuild one at open).
        report = log.recovery_report
        assert not report.bytes_truncated and not report.segments_dropped, report
        verify(log, lay, kept, bases)
    append_continues(scratch.dir, lay, kept, bases)


def damage(path: str, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


# --- (a) a torn active segment, at every byte of its last three batches -----------------------

@pytest.mark.parametrize("from_end", [1, 2, 3])
def test_torn_active_segment_at_every_byte(layout, from_end):
    last = len(layout.bases) - 1
    batch = layout.seg_batches(last)[-from_end]
    name = layout.log_name(last)
    for cut in range(batch.position, batch.end + (from_end == 1)):
        with Scratch(layout) as s:
            os.truncate(s.path(name), cut)
            try:
                recover_and_check(s, layout, last, cut)
            except AssertionError as err:
                raise AssertionError(f"{name} truncated to {cut} bytes: {err}") from err


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damage_past_the_recovery_point_is_cut_as_by_a_full_recovery(layout, data):
    """Recovery from a recovery point inside a segment (issue 19): the batches before it are
    not read again, and a torn tail or a flipped byte in a batch at or after it is cut exactly
    where validating every batch cuts it, with the same lookups after."""
    seg = data.draw(st.integers(0, len(layout.bases) - 1), label="segment")
    batches = layout.seg_batches(seg)
    first = data.draw(st.integers(0, len(batches) - 1), label="first unflushed batch")
    point = data.draw(st.integers(batches[first].base_offset, batches[first].next_offset - 1),
                      label="recovery point")
    bad = data.draw(st.sampled_from(batches[first:]), label="damaged batch")
    where = data.draw(_crc_or_framing_byte(bad.size), label="byte in batch")
    torn = data.draw(st.booleans(), label="torn there (else flipped)")
    name = layout.log_name(seg)
    with Scratch(layout) as s:
        if torn:
            os.truncate(s.path(name), bad.position + where)
        else:
            damage(s.path(name), bad.position + where,
                   bytes([layout.files[name][bad.position + where] ^ 0x5A]))
        kept = survivors(layout, seg, bad.position + where)
        bases = list(layout.bases[:seg + 1])
        with PartitionLog.open(s.dir, CFG, clean_shutdown=False, recovery_point=point,
                               now_ms=NOW) as log:
            report = log.recovery_report
            assert report.indexes_rebuilt == 0, report
            assert report.bytes_validated == os.path.getsize(s.path(name)) + \
                report.bytes_truncated - batches[first].position, report
            verify(log, layout, kept, bases)
        append_continues(s.dir, layout, kept, bases)


@pytest.mark.parametrize("from_end,into", [(1, 1), (1, 17), (2, 40), (3, 61)])
def test_torn_active_segment_repaired_by_cli(layout, from_end, into):
    last = len(layout.bases) - 1
    batch = layout.seg_batches(last)[-from_end]
    with Scratch(layout) as s:
        os.truncate(s.path(layout.log_name(last)), batch.position + into)
        repair_with_cli_and_check(s, layout, last, batch.position + into)


# --- (b) flipped bytes in a random batch ----------------------------------------------------

def _crc_or_framing_byte(size: int):
    # baseOffset (0-7) and partitionLeaderEpoch (12-15) are not covered by the CRC, as in Kafka;
    # every other byte is: batchLength 8-11, magic 16, crc 17-20, attributes..records 21-end.
    return st.one_of(st.integers(8, 11), st.integers(16, size - 1))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_flipped_byte_in_a_random_batch(layout, data):
    batch = data.draw(st.sampled_from(layout.batches), label="batch")
    where = data.draw(_crc_or_framing_byte(batch.size), label="byte in batch")
    mask = data.draw(st.integers(1, 255), label="xor mask")
    with Scratch(layout) as s:
        path = s.path(layout.log_name(batch.seg))
        with open(path, "r+b") as f:
            f.seek(batch.position + where)
            byte = f.read(1)[0]
            f.seek(batch.position + where)
            f.write(bytes([byte ^ mask]))
        recover_and_check(s, layout, batch.seg, batch.position + where)


def test_flipped_leader_epoch_is_not_corruption(layout):
    """partitionLeaderEpoch is outside the CRC (Kafka stamps it in place): nothing is lost."""
    batch = layout.seg_batches(1)[0]
    with Scratch(layout) as s:
        damage(s.path(layout.log_name(1)), batch.position + 12, b"\x00\x00\x00\x07")
        with PartitionLog.open(s.dir, CFG, clean_shutdown=False, recovery_point=0,
                               now_ms=NOW) as log:
            verify(log, layout, list(layout.batches), list(layout.bases))
            first = next(iter_batches(log.read(batch.base_offset).data))
            assert first.partition_leader_epoch == 7


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_garbage_from_a_random_byte_to_the_end_of_a_segment(layout, data):
    """LogSegmentTest: random bytes from a random record to EOF; recovery keeps exactly the
    records before them (and, at the log level, drops every later segment)."""
    seg = data.draw(st.integers(0, len(layout.bases) - 1), label="segment")
    name = layout.log_name(seg)
    original = layout.files[name]
    start = data.draw(st.integers(0, len(original) - 1), label="start")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    garbage = random.Random(seed).randbytes(len(original) - start)
    damaged = original[:start] + garbage
    diff = first_difference(original, damaged)
    with Scratch(layout) as s:
        damage(s.path(name), start, garbage)
        if diff is None:
            recover_and_check(s, layout, None, None)
        else:
            recover_and_check(s, layout, seg, diff)


@pytest.mark.parametrize("seg,batch_no,where", [(0, 1, 30), (1, 0, 9), (2, 1, 16)])
def test_flipped_byte_repaired_by_cli(layout, seg, batch_no, where):
    batch = layout.seg_batches(seg)[batch_no]
    with Scratch(layout) as s:
        path = s.path(layout.log_name(seg))
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[batch.position + where] ^= 0x5A
        with open(path, "wb") as f:
            f.write(data)
        repair_with_cli_and_check(s, layout, seg, batch.position + where)


# --- (c) a zero-filled tail ------------------------------------------------------------------

@pytest.mark.parametrize("zeros", [1, 12, 16, 17, 60, 61, 4096])
def test_zero_filled_preallocated_tail_is_dropped(layout, zeros):
    last = len(layout.bases) - 1
    name = layout.log_name(last)
    with Scratch(layout) as s:
        with open(s.path(name), "ab") as f:
            f.write(bytes(zeros))
        recover_and_check(s, layout, None, None)


def _zero_cases(lay: Layout):
    for seg in (len(lay.bases) - 1, 1):
        batches = lay.seg_batches(seg)
        size = batches[-1].end
        for length in range(1, size - batches[-3].position + 1, 7):
            yield seg, size - length, length


def test_zero_filled_tail_overwrites_last_batches(layout):
    """A tail whose pages were allocated but never written reads back as zeros."""
    for seg, start, length in _zero_cases(layout):
        name = layout.log_name(seg)
        original = layout.files[name]
        damaged = original[:start] + bytes(length) + original[start + length:]
        diff = first_difference(original, damaged)
        with Scratch(layout) as s:
            damage(s.path(name), start, bytes(length))
            try:
                recover_and_check(s, layout, None if diff is None else seg, diff)
            except AssertionError as err:
                raise AssertionError(f"{name}: {length} zero bytes at {start}: {err}") from err


def test_zero_filled_tail_repaired_by_cli(layout):
    last = len(layout.bases) - 1
    batch = layout.seg_batches(last)[-2]
    with Scratch(layout) as s:
        with open(s.path(layout.log_name(last)), "r+b") as f:
            f.seek(batch.position + 20)
            f.write(bytes(batch.size - 20 + layout.seg_batches(last)[-1].size))
        repair_with_cli_and_check(s, layout, last, batch.position + 20)


# --- (d) damaged .index and .timeindex files ------------------------------------------------

INDEX_KINDS = {"index": [files.INDEX_SUFFIX], "timeindex": [files.TIMEINDEX_SUFFIX],
               "both": [files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX]}


def _break_index(path: str, how: str) -> None:
    size = os.path.getsize(path)
    if how == "delete":
        os.unlink(path)
    elif how == "empty":
        os.truncate(path, 0)
    elif how == "short":
        os.truncate(path, max(size - 3, 1))
    elif how == "long":
        with open(path, "ab") as f:
            f.write(b"\x01\x02\x03\x04\x05")
    elif how == "ones":
        with open(path, "wb") as f:
            f.write(b"\xff" * max(size, 24))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("kinds", list(INDEX_KINDS), ids=list(INDEX_KINDS))
@pytest.mark.parametrize("how", ["delete", "empty", "short", "long", "ones"])
@pytest.mark.parametrize("clean", [False, True], ids=["unclean", "clean"])
def test_broken_index_files_are_rebuilt(layout, kinds, how, clean):
    """LogLoaderTest: deleted or garbage index files are rebuilt; every offset and timestamp
    resolves again. Also after a clean shutdown, where only the sanity check can notice."""
    with Scratch(layout) as s:
        for base in layout.bases:
            for kind in INDEX_KINDS[kinds]:
                _break_index(s.path(files.segment_name(base, kind)), how)
        if not clean:
            recover_and_check(s, layout, None, None)
            return
        with PartitionLog.open(s.dir, CFG, clean_shutdown=True, now_ms=NOW) as log:
            verify(log, layout, list(layout.batches), list(layout.bases))
        if how != "empty" or kinds != "index":
            # An empty offset index passes every check (a segment may have no entries), so it
            # stays empty; everything else must have been rebuilt exactly.
            same_files_for_intact_segments(s.dir, layout, len(layout.bases))
        append_continues(s.dir, layout, list(layout.batches), list(layout.bases))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_garbage_in_index_files(layout, data):
    seg = data.draw(st.integers(0, len(layout.bases) - 1), label="segment")
    with Scratch(layout) as s:
        for kind in data.draw(st.sampled_from(list(INDEX_KINDS.values())), label="files"):
            garbage = data.draw(st.binary(min_size=0, max_size=200), label=f"{kind} bytes")
            with open(s.path(files.segment_name(layout.bases[seg], kind)), "wb") as f:
                f.write(garbage)
        recover_and_check(s, layout, None, None)


@pytest.mark.parametrize("how", ["delete", "ones"])
def test_broken_index_repaired_by_cli(layout, how):
    with Scratch(layout) as s:
        for kind in (files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX):
            _break_index(s.path(files.segment_name(layout.bases[1], kind)), how)
        repair_with_cli_and_check(s, layout, None, None)


def test_index_without_log_is_removed(layout):
    with Scratch(layout) as s:
        for kind in (files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX):
            with open(s.path(files.segment_name(999, kind)), "wb") as f:
                f.write(b"\x00" * 24)
        recover_and_check(s, layout, None, None)
        assert not any(n.startswith(files.segment_name(999, "")) for n in os.listdir(s.dir))


# --- (e) random bytes appended to the active .log and its .index ----------------------------

@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(log_tail=st.binary(min_size=0, max_size=300), index_tail=st.binary(max_size=40))
def test_random_bytes_appended_to_active_log_and_index(layout, log_tail, index_tail):
    """LogLoaderTest: recovery restores exactly the original records and indexes."""
    last = len(layout.bases) - 1
    with Scratch(layout) as s:
        with open(s.path(layout.log_name(last)), "ab") as f:
            f.write(log_tail)
        with open(s.path(files.segment_name(layout.bases[last], files.INDEX_SUFFIX)), "ab") as f:
            f.write(index_tail)
        recover_and_check(s, layout, None, None)


def test_random_bytes_appended_repaired_by_cli(layout):
    last = len(layout.bases) - 1
    with Scratch(layout) as s:
        with open(s.path(layout.log_name(last)), "ab") as f:
            f.write(random.Random(7).randbytes(150))
        with open(s.path(files.segment_name(layout.bases[last], files.INDEX_SUFFIX)), "ab") as f:
            f.write(random.Random(8).randbytes(13))
        repair_with_cli_and_check(s, layout, None, None)


# --- corruption below the log start offset -------------------------------------------------

def test_corruption_below_log_start_offset_leaves_one_empty_segment(layout):
    """LogLoaderTest: when recovery cuts the log below the checkpointed log start offset, every
    segment goes and the log restarts, empty, at the log start offset."""
    lso = layout.bases[2] + 1
    batch = layout.seg_batches(0)[1]
    with Scratch(layout) as s:
        damage(s.path(layout.log_name(0)), batch.position + 30, b"\xee")
        with PartitionLog.open(s.dir, CFG, clean_shutdown=False, recovery_point=0,
                               log_start_offset=lso, now_ms=NOW) as log:
            verify(log, layout, [], [lso], log_start_offset=lso)
        append_continues(s.dir, layout, [], [lso], log_start_offset=lso)


def test_unclean_open_above_the_recovery_point_only_checks_the_tail(layout):
    """With a recovery point in the last segment, damage in an earlier (flushed) segment is
    not looked for — Kafka's contract — but damage in the last one still is."""
    last = len(layout.bases) - 1
    batch = layout.seg_batches(last)[-1]
    with Scratch(layout) as s:
        os.truncate(s.path(layout.log_name(last)), batch.position + 5)
        with PartitionLog.open(s.dir, CFG, clean_shutdown=False,
                               recovery_point=layout.bases[last], now_ms=NOW) as log:
            assert log.recovery_report.segments_recovered == 1
            verify(log, layout, survivors(layout, last, batch.position + 5),
                   list(layout.bases))


def test_crash_again_right_after_a_recovery(layout):
    """A recovery is itself interrupted by a crash: the recovered (inactive) segments must be
    left exactly as a roll leaves them, so the next start trusts them below its recovery point
    without a rebuild — and after a clean reopen the same holds for untouched ones."""
    with Scratch(layout) as s:
        os.truncate(s.path(layout.log_name(len(layout.bases) - 1)),
                    layout.seg_batches(len(layout.bases) - 1)[-1].position + 3)
        for clean_first in (False, True):
            log = PartitionLog.open(s.dir, CFG, clean_shutdown=clean_first, recovery_point=0,
                                    now_ms=NOW)
            leo = log.log_end_offset
            crashed = os.path.join(s.root, f"crashed-{clean_first}", "topic-0")
            shutil.copytree(s.dir, crashed)       # the page cache, as a crash leaves it
            log.close()
            with PartitionLog.open(crashed, CFG, clean_shutdown=False, recovery_point=leo,
                                   now_ms=NOW) as again:
                report = again.recovery_report
                assert report.segments_recovered == 1 and report.indexes_rebuilt == 0, report
                assert not report.changed, report
                verify(again, layout, survivors(layout, len(layout.bases) - 1,
                                                layout.seg_batches(len(layout.bases) - 1)[-1]
                                                .position), list(layout.bases))


def test_crash_after_a_clean_restart_with_entryless_indexes():
    """Segments smaller than index.interval.bytes have no offset-index entries: their trimmed
    .index files are empty, and a restart must keep them so (not preallocate them again), or
    the next crash leaves runs of zero "entries" that fail the sanity check."""
    cfg = LogConfig(segment_bytes=200, index_interval_bytes=100_000, segment_index_bytes=4096)
    root = tempfile.mkdtemp(prefix="mq-fault-", dir=SCRATCH)
    try:
        directory = os.path.join(root, "topic-0")
        log = PartitionLog.open(directory, cfg, now_ms=NOW)
        for i in range(12):
            builder = BatchBuilder()
            builder.append(NOW + i, b"k", b"value %d" % i)
            log.append(builder.build(), now_ms=NOW)
        leo = log.log_end_offset
        assert len(log.segments) >= 3
        log.close()
        log = PartitionLog.open(directory, cfg, clean_shutdown=True, now_ms=NOW)
        crashed = os.path.join(root, "crashed", "topic-0")
        shutil.copytree(directory, crashed)
        log.close()
        with PartitionLog.open(crashed, cfg, clean_shutdown=False, recovery_point=leo,
                               now_ms=NOW) as again:
            report = again.recovery_report
            assert report.segments_recovered == 1 and report.indexes_rebuilt == 0, report
            assert again.log_end_offset == leo
            assert again.offset_for_timestamp(NOW + 5) == (5, NOW + 5)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- leftovers of an interrupted swap (Kafka's startup repair) -------------------------------

def _write_segment(directory: str, base: int, batches: list[bytes], suffix: str) -> None:
    """Cleaner output as it would be written: a real segment (indexes included) at ``base``,
    its files renamed to carry ``suffix``."""
    os.makedirs(directory, exist_ok=True)
    seg = LogSegment(directory, base, CFG, now_ms=NOW)
    try:
        for data in batches:
            batch = next(iter_batches(data))
            seg.append(data, last_offset=batch.last_offset, max_timestamp=batch.max_timestamp,
                       offset_of_max_timestamp=batch.last_offset)
        seg.on_become_inactive()
    finally:
        seg.close()
    if suffix:
        for kind in (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX):
            name = files.segment_name(base, kind)
            if os.path.exists(os.path.join(directory, name)):
                os.rename(os.path.join(directory, name), os.path.join(directory, name + suffix))


def _raw_batches(lay: Layout, seg: int) -> list[bytes]:
    data = lay.files[lay.log_name(seg)]
    return [data[b.position:b.end] for b in lay.seg_batches(seg)]


def _segment_names(base: int, suffix: str = "") -> list[str]:
    return [files.segment_name(base, k) + suffix
            for k in (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX)]


SPLIT_PHASES = ["cleaned", "one-swap", "all-swaps", "old-deleted", "mid-rename",
                "partly-installed", "installed-leftover-deleted"]


@pytest.mark.parametrize("phase", SPLIT_PHASES)
@pytest.mark.parametrize("recovery", ["all", "tail"])
def test_crash_during_segment_split(layout, phase, recovery):
    """LogLoaderTest's split phases: segment 1 is being split in two (same records). Whatever
    the phase, the log opens consistent with every record."""
    seg = 1
    old_base = layout.bases[seg]
    raw = _raw_batches(layout, seg)
    half = len(raw) // 2
    new_base = layout.seg_batches(seg)[half].base_offset
    with Scratch(layout) as s:
        staging = os.path.join(s.root, "staging")
        _write_segment(staging, old_base, raw[:half], "")
        _write_segment(staging, new_base, raw[half:], "")

        def put(base: int, suffix: str) -> None:
            for name in _segment_names(base):
                shutil.copy(os.path.join(staging, name), s.path(name + suffix))

        def rename_old(suffix: str) -> None:
            for name in _segment_names(old_base):
                os.rename(s.path(name), s.path(name + suffix))

        expected_bases = list(layout.bases)
        if phase == "cleaned":                   # both outputs still being written
            put(old_base, ".cleaned")
            put(new_base, ".cleaned")
        elif phase == "one-swap":                # renamed to .swap in descending order
            put(old_base, ".cleaned")
            put(new_base, ".swap")
        else:
            expected_bases = sorted(set(layout.bases) | {new_base})
            if phase == "all-swaps":
                put(old_base, ".swap")
                put(new_base, ".swap")
            elif phase == "old-deleted":
                put(old_base, ".swap")
                put(new_base, ".swap")
                rename_old(".deleted")
            elif phase == "mid-rename":         # the first output's .log is in place, not
                rename_old(".deleted")          # yet its indexes
                put(old_base, ".swap")
                put(new_base, ".swap")
                os.rename(s.path(files.segment_name(old_base, files.LOG_SUFFIX) + ".swap"),
                          s.path(files.segment_name(old_base, files.LOG_SUFFIX)))
            elif phase == "partly-installed":   # the first output is in place, not the second
                rename_old(".deleted")
                put(old_base, "")
                put(new_base, ".swap")
            elif phase == "installed-leftover-deleted":
                for name in _segment_names(old_base):
                    shutil.copy(s.path(name), s.path(name + ".deleted"))
                put(old_base, "")
                put(new_base, "")
        with PartitionLog.open(s.dir, CFG, clean_shutdown=False,
                               recovery_point=0 if recovery == "all" else layout.bases[-1],
                               now_ms=NOW) as log:
            assert not log.recovery_report.bytes_truncated
            assert not log.recovery_report.segments_dropped
            verify(log, layout, list(layout.batches), expected_bases)
        append_continues(s.dir, layout, list(layout.batches), expected_bases)


@pytest.mark.parametrize("phase", ["cleaned", "swapped", "old-deleted"])
def test_crash_during_compaction_swap(layout, phase):
    """Segments 1 and 2 are replaced by one cleaned segment at base 1 holding their records
    (a merge that dropped nothing): the log opens with every record either way."""
    merged = _raw_batches(layout, 1) + _raw_batches(layout, 2)
    b1, b2 = layout.bases[1], layout.bases[2]
    with Scratch(layout) as s:
        staging = os.path.join(s.root, "staging")
        _write_segment(staging, b1, merged, "")
        suffix = {"cleaned": ".cleaned", "swapped": ".swap", "old-deleted": ".swap"}[phase]
        for name in _segment_names(b1):
            shutil.copy(os.path.join(staging, name), s.path(name + suffix))
        if phase == "old-deleted":
            for base in (b1, b2):
                for name in _segment_names(base):
                    os.rename(s.path(name), s.path(name + ".deleted"))
        expected = list(layout.bases) if phase == "cleaned" else \
            [b for b in layout.bases if b != b2]
        with PartitionLog.open(s.dir, CFG, clean_shutdown=False, recovery_point=0,
                               now_ms=NOW) as log:
            verify(log, layout, list(layout.batches), expected)


def test_crash_during_retention_delete(layout):
    """Segment 0 was renamed to .deleted but the process died before the log start offset
    checkpoint moved: its files are removed, the log starts at segment 1."""
    with Scratch(layout) as s:
        for name in _segment_names(layout.bases[0]):
            os.rename(s.path(name), s.path(name + ".deleted"))
        kept = [b for b in layout.batches if b.seg > 0]
        with PartitionLog.open(s.dir, CFG, clean_shutdown=False, recovery_point=0,
                               now_ms=NOW) as log:
            verify(log, layout, kept, list(layout.bases[1:]), log_start_offset=layout.bases[1])
