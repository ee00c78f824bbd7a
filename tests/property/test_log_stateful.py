"""Hypothesis state machine: ``PartitionLog`` against an in-memory model of its records.

The model is the list of batches physically present in the log — ``(base_offset, records)``
with records ``(offset, timestamp, key, value, headers)`` — plus the log start and end offsets.
Rules append (1-20 records, codecs none/gzip/lz4, keys/values incl. null), roll, truncate,
DeleteRecords, apply retention (tiny segments and index intervals so that rolls, index entries
and full indexes happen all the time), close + clean reopen, and a crash (the directory is
copied while the log is open — the page cache makes every written byte visible — and the copy
is opened with recovery). After every step the invariants compare offsets, the whole content,
reads from pseudo-random offsets and timestamp lookups with the model.

Retention deletes whole segments, so the model learns what disappeared from the log's new
first segment (and log start offset) — but only after checking the number of deleted segments
against an independent evaluation of Kafka's retention rules over the model's timestamps
and the segment file sizes. ``MQ_STATEFUL_EXAMPLES=1000`` runs a longer search.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mq.errors import OffsetOutOfRangeError
from mq.log.batch import iter_batches
from mq.log.builder import BatchBuilder
from mq.log.compression import GZIP, LZ4, NONE
from mq.log.config import LogConfig
from mq.log.log import PartitionLog

DAY_MS = 24 * 60 * 60 * 1000
# Examples live on tmpfs when there is one: every close and roll fsyncs, and durability is not
# what this machine tests (its crash is a copy of the page cache).
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

keys_or_values = st.one_of(st.none(), st.binary(max_size=24))
headers = st.lists(st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=6))),
                   max_size=2)


def _b(x):
    return None if x is None else bytes(x)


def _facts(seg) -> tuple:
    """What a segment knows of itself beyond its bytes (retention and lookups use them)."""
    return (seg.base_offset, seg.size, seg.next_offset, seg.max_timestamp_so_far,
            seg.offset_of_max_timestamp_so_far, seg.first_batch_timestamp)


def rows_of(batch) -> list[tuple]:
    return [(r.offset, r.timestamp, _b(r.key), _b(r.value), [(k, _b(v)) for k, v in r.headers])
            for r in batch.records()]


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="mq-stateful-", dir=SCRATCH)
        self.generation = 0
        self.log: PartitionLog | None = None
        self.batches: list[tuple[int, list[tuple]]] = []   # physically present, log order
        self.lso = 0
        self.leo = 0
        self.clock = 1_000_000                             # ms; drives record timestamps
        self.steps = 0

    # --- helpers ------------------------------------------------------------------------------
    def _new_dir(self) -> str:
        self.generation += 1
        return os.path.join(self.root, f"topic-{self.generation}")

    def _records(self) -> list[tuple]:
        return [rec for _, recs in self.batches for rec in recs]

    def _drop_batches_below(self, offset: int) -> None:
        for base, recs in self.batches:
            if base < offset:
                assert recs[-1][0] < offset, "retention split a batch"
        self.batches = [(b, r) for b, r in self.batches if b >= offset]

    # --- setup and teardown ---------------------------------------------------------------------
    @initialize(segment_bytes=st.integers(300, 3000), index_interval=st.integers(0, 300),
                index_bytes=st.sampled_from([24, 64, 120, 480, 4096]),
                retention_bytes=st.sampled_from([-1, -1, 900, 2500]),
                retention_ms=st.sampled_from([-1, 1000, 5000]),
                segment_ms=st.sampled_from([7 * DAY_MS, 7 * DAY_MS, 3000]),
                delete_delay=st.sampled_from([0, 60000]))
    def setup(self, segment_bytes, index_interval, index_bytes, retention_bytes, retention_ms,
              segment_ms, delete_delay):
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval,
                                segment_index_bytes=index_bytes, retention_bytes=retention_bytes,
                                retention_ms=retention_ms, segment_ms=segment_ms,
                                file_delete_delay_ms=delete_delay)
        self.dir = self._new_dir()
        self.log = PartitionLog.open(self.dir, self.config, now_ms=self.clock)

    def teardown(self) -> None:
        try:
            if self.log is not None:
                self.log.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # --- rules ----------------------------------------------------------------------------------
    @rule(data=st.data(), n=st.integers(1, 20), codec=st.sampled_from([NONE, GZIP, LZ4]),
          advance=st.integers(0, 700))
    def append(self, data, n, codec, advance):
        self.clock += advance
        builder = BatchBuilder(compression=codec)
        rows = []
        for _ in range(n):
            ts = max(0, self.clock + data.draw(st.integers(-300, 300), label="ts skew"))
            key, value = data.draw(keys_or_values), data.draw(keys_or_values)
            hdrs = data.draw(headers)
            builder.append(ts, key, value, hdrs)
            rows.append((ts, key, value, hdrs))
        info = self.log.append(builder.build(), now_ms=self.clock)
        assert (info.first_offset, info.last_offset, info.records_count) == \
            (self.leo, self.leo + n - 1, n)
        assert info.max_timestamp == max(r[0] for r in rows)
        recs = [(self.leo + i, ts, None if k is None else bytes(k),
                 None if v is None else bytes(v), [(hk, hv) for hk, hv in h])
                for i, (ts, k, v, h) in enumerate(rows)]
        self.batches.append((self.leo, recs))
        self.leo += n
        # The batch landed in the active segment, which starts at or below it.
        assert self.log.active_segment.base_offset <= info.first_offset

    @rule()
    def roll(self):
        before = len(self.log.segments)
        was_empty = self.log.active_segment.size == 0
        self.log.roll(now_ms=self.clock)
        assert self.log.active_segment.base_offset == self.leo
        assert self.log.active_segment.size == 0
        assert len(self.log.segments) == before + (0 if was_empty else 1)

    @rule(data=st.data())
    def truncate_to(self, data):
        offset = data.draw(st.integers(0, self.leo + 1), label="truncate offset")
        first_base = self.log.segments[0].base_offset
        active_base = self.log.active_segment.base_offset
        self.log.truncate_to(offset)
        if offset >= self.leo:
            return
        event(f"truncate across segments: {first_base < offset < active_base}")
        if offset < active_base and offset <= first_base:
            # Everything is at or above the target: start over, empty, at the target.
            self.batches, self.leo, self.lso = [], offset, offset
            return
        # Whole batches holding `offset` or later offsets go.
        self.batches = [(b, r) for b, r in self.batches if r[-1][0] < offset]
        # With nothing left, the log ends where its first segment starts.
        self.leo = self.batches[-1][1][-1][0] + 1 if self.batches else first_base
        self.lso = min(self.lso, self.leo)

    @rule(data=st.data())
    def delete_records_before(self, data):
        offset = data.draw(st.integers(0, self.leo), label="delete before")
        assert self.log.delete_records_before(offset) == max(self.lso, offset)
        self.lso = max(self.lso, offset)
        with pytest.raises(OffsetOutOfRangeError):
            self.log.delete_records_before(self.leo + 1)

    @rule(data=st.data())
    def apply_retention(self, data):
        cfg = self.config
        segs = self.log.segments
        uppers = [s.base_offset for s in segs[1:]] + [self.leo]
        spans = []
        for seg, upper in zip(segs, uppers):
            ts = [r[1] for r in self._records() if seg.base_offset <= r[0] < upper]
            spans.append((seg.base_offset, upper, os.path.getsize(seg.log_path),
                          max(ts) if ts else None))
        # now_ms: around each segment's expiry point, or the current clock.
        candidates = [self.clock]
        if cfg.retention_ms >= 0:
            for *_, max_ts in spans:
                if max_ts is not None:
                    candidates += [max_ts + cfg.retention_ms, max_ts + cfg.retention_ms + 1]
        now_ms = data.draw(st.sampled_from(candidates), label="now_ms")
        expected = self._expected_retention(spans, now_ms)
        old_lso = self.lso
        deleted = self.log.apply_retention(now_ms)
        event(f"retention deleted {min(deleted, 2)}{'+' if deleted > 2 else ''} segment(s)")
        assert deleted == expected, (spans, now_ms)
        if deleted:
            assert self.log.segments[0].base_offset == spans[deleted - 1][1]
        # Never the active segment: something always remains, and it ends at the log end.
        assert self.log.segments and self.log.log_end_offset == self.leo
        assert self.log.log_start_offset >= old_lso
        self.lso = max(old_lso, self.log.segments[0].base_offset)
        self._drop_batches_below(self.log.segments[0].base_offset)
        if deleted:
            assert self.log.log_start_offset == self.lso

    def _expected_retention(self, spans, now_ms) -> int:
        """Kafka's retention rules, evaluated on the model's timestamps."""
        cfg = self.config
        total = sum(size for _, _, size, _ in spans)
        excess = total - cfg.retention_bytes if cfg.retention_bytes >= 0 else None
        count = 0
        for i, (base, upper, size, max_ts) in enumerate(spans):
            if i == len(spans) - 1 and size == 0:
                break                                # an empty last segment always stays
            if upper > self.leo:                     # the high watermark is the log end
                break
            if upper <= self.lso:
                pass
            elif excess is not None and excess >= size:
                pass
            elif cfg.retention_ms >= 0 and max_ts is not None and \
                    now_ms - max_ts > cfg.retention_ms:
                pass
            else:
                break
            if excess is not None:
                excess -= size
            count += 1
        return count

    @rule()
    def close_and_reopen_clean(self):
        self.log.close()
        self.log.close()                                     # idempotent
        self.log = PartitionLog.open(self.dir, self.config, clean_shutdown=True,
                                     recovery_point=self.leo, log_start_offset=self.lso,
                                     now_ms=self.clock)
        report = self.log.recovery_report
        assert report.bytes_truncated == 0 and report.segments_dropped == 0
        # Every index passes its sanity check (an empty active segment may have none yet).
        assert report.indexes_rebuilt <= (self.log.active_segment.size == 0), report
        assert self.log.recovery_point == self.leo
        assert not any(n.endswith(".deleted") for n in os.listdir(self.dir))

    @rule(data=st.data())
    def crash_and_recover(self, data):
        # Crash: whatever was written is in the page cache, so a copy of the directory taken
        # while the log is open is what a restarted process would find on disk.
        copy = self._new_dir()
        shutil.copytree(self.dir, copy)
        full = self._new_dir()
        shutil.copytree(self.dir, full)
        self.log.close()                  # the abandoned process; its files are not used again
        shutil.rmtree(self.dir)
        self.dir = copy
        recovery_point = data.draw(st.sampled_from([0, 0, self.leo // 2, self.leo]),
                                   label="recovery point")
        self.log = PartitionLog.open(copy, self.config, clean_shutdown=False,
                                     recovery_point=recovery_point, log_start_offset=self.lso,
                                     now_ms=self.clock)
        report = self.log.recovery_report
        assert report.bytes_truncated == 0 and report.segments_dropped == 0, report
        # Segments below the recovery point are trusted: their indexes must pass the sanity
        # check (no leftover preallocated zero entries from an earlier open or recovery), and
        # so must the entries below it in the segment holding it (recovery starts there).
        assert report.indexes_rebuilt == 0, report
        # What the kept entries say equals what validating every batch finds.
        with PartitionLog.open(full, self.config, clean_shutdown=False, recovery_point=0,
                               log_start_offset=self.lso, now_ms=self.clock) as everything:
            assert [_facts(s) for s in self.log.segments] == \
                [_facts(s) for s in everything.segments]
            assert report.bytes_validated <= everything.recovery_report.bytes_validated
        shutil.rmtree(full)
        assert not any(n.endswith(".deleted") for n in os.listdir(copy))
        assert self.log.recovery_point == min(recovery_point, self.leo)

    # --- invariants ---------------------------------------------------------------------------
    @invariant()
    def offsets_match(self):
        if self.log is None:
            return
        self.steps += 1
        event(f"segments: {min(len(self.log.segments), 4)}"
              f"{'+' if len(self.log.segments) >= 4 else ''}")
        assert self.log.log_end_offset == self.leo
        assert self.log.log_start_offset == self.lso
        assert self.log.high_watermark == self.leo
        assert self.lso <= self.leo

    @invariant()
    def segments_are_well_formed(self):
        if self.log is None:
            return
        segs = self.log.segments
        bases = [s.base_offset for s in segs]
        assert bases == sorted(set(bases)), bases
        assert self.log._bases == bases
        assert all(s.size > 0 for s in segs[:-1]), "only the active segment may be empty"
        assert bases[0] <= self.lso
        content = []
        for i, seg in enumerate(segs):
            upper = bases[i + 1] if i + 1 < len(segs) else None
            assert os.path.getsize(seg.log_path) == seg.size
            last = None
            for batch in seg.batches():
                batch.validate()
                assert batch.base_offset >= seg.base_offset
                if upper is not None:
                    assert batch.last_offset < upper
                last = batch.last_offset
                content.append((batch.base_offset, rows_of(batch)))
            assert seg.next_offset == (seg.base_offset if last is None else last + 1)
        assert content == self.batches

    @invariant()
    def reads_match(self):
        if self.log is None:
            return
        rnd = random.Random(f"read/{self.steps}/{self.leo}/{self.lso}/{len(self.batches)}")
        with pytest.raises(OffsetOutOfRangeError):
            self.log.read(self.leo + 1)
        if self.lso > 0:
            with pytest.raises(OffsetOutOfRangeError):
                self.log.read(self.lso - 1)
        assert self.log.read(self.leo).data == b""
        if self.leo == self.lso:
            return
        offsets = {self.lso, self.leo - 1}
        offsets.update(rnd.randrange(self.lso, self.leo) for _ in range(3))
        index_of = {}
        for i, (base, recs) in enumerate(self.batches):
            for rec in recs:
                index_of[rec[0]] = i
        for offset in sorted(offsets):
            max_bytes = rnd.choice([1, 200, 1 << 20])
            got = self.log.read(offset, max_bytes)
            batches = list(iter_batches(got.data))
            assert batches, f"empty read at {offset}"
            assert sum(b.size for b in batches) == len(got.data)
            assert batches[0].base_offset <= offset <= batches[0].last_offset
            i = index_of[offset]
            for j, batch in enumerate(batches):
                batch.validate()
                base, recs = self.batches[i + j]
                assert (batch.base_offset, rows_of(batch)) == (base, recs)
            if max_bytes > 1 and len(batches) > 1:
                assert len(got.data) <= max_bytes

    @invariant()
    def timestamp_lookups_match(self):
        if self.log is None:
            return
        records = [r for r in self._records() if r[0] >= self.lso]
        rnd = random.Random(f"time/{self.steps}/{self.leo}/{self.lso}")
        targets = {0, self.clock + 10_000}
        if records:
            sample = rnd.sample(records, min(3, len(records)))
            for r in sample:
                targets.update((r[1], r[1] + 1, max(0, r[1] - 1)))
            targets.add(max(r[1] for r in records))
        for t in sorted(targets):
            expected = next(((r[0], r[1]) for r in records if r[1] >= t), None)
            assert self.log.offset_for_timestamp(t) == expected, t
        assert self.log.offset_for_timestamp(-2) == (self.lso, -1)
        assert self.log.offset_for_timestamp(-1) == (self.leo, -1)
        if records:
            top = max(r[1] for r in records)
            first_top = next(r for r in records if r[1] == top)
            assert self.log.offset_for_timestamp(-3) == (first_top[0], top)
        else:
            assert self.log.offset_for_timestamp(-3) is None


TestPartitionLogStateful = LogMachine.TestCase
TestPartitionLogStateful.settings = settings(
    max_examples=int(os.environ.get("MQ_STATEFUL_EXAMPLES", "60")), stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])


def test_regression_max_timestamp_below_log_start_offset(tmp_path):
    """Shrunk from the machine: DeleteRecords moved the log start offset past the record with
    the batch's largest timestamp; ListOffsets(-3) must answer from the records left."""
    log = PartitionLog.open(str(tmp_path / "topic-0"), LogConfig(), now_ms=1_000_000)
    try:
        builder = BatchBuilder()
        for ts in (1_000_000, 1_000_000, 1_000_000, 1_000_001, 1_000_000, 1_000_000):
            builder.append(ts, None, None)
        log.append(builder.build(), now_ms=1_000_000)
        log.delete_records_before(4)
        assert log.offset_for_timestamp(-3) == (4, 1_000_000)
        assert log.offset_for_timestamp(1_000_001) is None
    finally:
        log.close()
