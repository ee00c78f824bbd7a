"""Hypothesis: the log cleaner against an in-memory model of everything ever written.

Random appends of keyed records (a small key space, tombstones, unkeyed records, two codecs)
with rolls, then cleaning passes at random times with random map sizes and stable offsets,
some of them killed at a random file operation (rename, fsync, fdatasync, unlink) and followed
by an unclean open. After every step:

- every surviving record is byte for byte what was written at its offset;
- the log end and log start offsets never move;
- nothing past the map end of any pass (the first uncleanable offset, for a killed pass) was
  touched, and a pass never reaches its first uncleanable offset;
- a record that is the latest of its key (among offsets any pass could have looked at) is
  there, unless it is a tombstone whose delete horizon had passed at some pass;
- so, per key, the log's latest record is the model's, or the key is gone after a tombstone.

After a completed pass with map end E: below E only the latest record of each key remains,
no unkeyed record, and every tombstone left there carries a delete horizon in the future.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mq.log.builder import BatchBuilder
from mq.log.cleaner import CleanerConfig, clean, cleanable_range, resolve_first_dirty_offset
from mq.log.compression import GZIP, NONE
from mq.log.config import LogConfig
from mq.log.log import PartitionLog

SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
T0 = 1_000_000
ENTRY = 136                          # mq.log.cleaner.BYTES_PER_MAP_ENTRY
KEYS = [b"a", b"b", b"c", b"d", b"e", b"a-key-long-enough-for-md5"]


class Crash(BaseException):
    """A simulated power cut (not an Exception: nothing tidies up)."""


@contextlib.contextmanager
def crash_after(n: int):
    """Raise ``Crash`` instead of the (n+1)-th ``os.rename/fsync/fdatasync/unlink``."""
    names = ("rename", "fsync", "fdatasync", "unlink")
    saved = {name: getattr(os, name) for name in names}
    count = [0]

    def wrap(real):
        def op(*args, **kwargs):
            if count[0] >= n:
                raise Crash
            count[0] += 1
            return real(*args, **kwargs)
        return op
    for name in names:
        setattr(os, name, wrap(saved[name]))
    try:
        yield
    finally:
        for name, real in saved.items():
            setattr(os, name, real)


record = st.tuples(
    st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS), st.none()),
    st.one_of(st.binary(max_size=24), st.binary(max_size=24), st.none()),
    st.booleans())                                                  # with a header
append_op = st.tuples(st.just("append"), st.lists(record, min_size=1, max_size=6),
                      st.sampled_from([NONE, NONE, GZIP]), st.integers(0, 60))
roll_op = st.tuples(st.just("roll"))
clean_op = st.tuples(st.just("clean"), st.integers(0, 400), st.sampled_from([1, 2, 4, 1000]),
                     st.integers(0, 3))
crash_op = st.tuples(st.just("crash"), st.integers(0, 400), st.sampled_from([1, 3, 1000]),
                     st.integers(0, 60), st.booleans())
ops = st.lists(st.one_of(append_op, append_op, append_op, roll_op, clean_op, crash_op),
               min_size=8, max_size=50)


def _b(x):
    return None if x is None else bytes(x)


class Model:
    """What was written, and what the passes so far allow to have changed."""

    def __init__(self) -> None:
        self.written: dict[int, tuple] = {}   # offset -> (timestamp, key, value, headers)
        self.map_reach = 0          # max first uncleanable offset of any pass: keys mapped below
        self.touched_below = 0      # no pass changed anything at or past this: its map end + 1
        #                             (first uncleanable offset for a killed pass)
        self.may_be_gone: set[int] = set()     # tombstones whose horizon passed at a pass

    def latest_below(self, bound: int) -> dict[bytes, int]:
        """key -> offset of its latest record among offsets < bound."""
        out: dict[bytes, int] = {}
        for offset in sorted(self.written):
            key = self.written[offset][1]
            if offset < bound and key is not None:
                out[key] = offset
        return out


def survivors(plog: PartitionLog) -> dict[int, tuple]:
    out = {}
    for batch in plog.batches():
        for r in batch.records():
            out[r.offset] = (r.timestamp, _b(r.key), _b(r.value),
                             tuple((k, _b(v)) for k, v in r.headers))
    return out


def check_invariants(plog: PartitionLog, model: Model, leo: int) -> dict[int, tuple]:
    assert plog.log_end_offset == leo and plog.log_start_offset == 0
    got = survivors(plog)
    for offset, row in got.items():
        assert model.written[offset] == row, offset           # never altered
    latest = model.latest_below(model.map_reach)
    for offset, row in model.written.items():
        must_stay = offset >= model.touched_below or latest.get(row[1]) == offset
        if must_stay and offset not in got:
            assert row[2] is None and offset in model.may_be_gone, offset
    # Per key: the log's latest record is the model's latest, or the key expired.
    log_latest = {row[1]: o for o, row in sorted(got.items()) if row[1] is not None}
    for key, offset in model.latest_below(leo).items():
        if key in log_latest:
            assert log_latest[key] == offset, key
        else:
            assert model.written[offset][2] is None and offset in model.may_be_gone
    return got


def note_expired_tombstones(plog: PartitionLog, model: Model, now: int) -> None:
    for batch in plog.batches():
        if batch.has_delete_horizon and batch.delete_horizon_ms <= now:
            model.may_be_gone.update(r.offset for r in batch.records() if r.value is None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, lag=st.sampled_from([0, 0, 150]), delay=st.sampled_from([0, 50]))
def test_cleaning_matches_the_model(ops, lag, delay):
    cfg = LogConfig(segment_bytes=400, index_interval_bytes=120, segment_index_bytes=1024,
                    cleanup_policy="compact", delete_retention_ms=150,
                    min_compaction_lag_ms=lag, file_delete_delay_ms=delay)
    with tempfile.TemporaryDirectory(dir=SCRATCH) as root:
        path = os.path.join(root, "t-0")
        plog = PartitionLog.open(path, cfg, now_ms=T0)
        model = Model()
        now = T0
        first_dirty: int | None = None
        try:
            for op in ops:
                if op[0] == "append":
                    _, recs, codec, advance = op
                    now += advance
                    b = BatchBuilder(compression=codec)
                    for key, value, header in recs:
                        b.append(now, key, value, [("h", value)] if header else ())
                    info = plog.append(b.build(), now_ms=now)
                    for i, (key, value, header) in enumerate(recs):
                        model.written[info.first_offset + i] = (
                            now, key, value, (("h", value),) if header else ())
                elif op[0] == "roll":
                    plog.roll(now_ms=now)
                else:
                    now += op[1]
                    leo = plog.log_end_offset
                    lso = max(0, plog.high_watermark - op[3]) if op[0] == "clean" else None
                    # What clean() will compute: nothing at or past this is touched.
                    start, _ = resolve_first_dirty_offset(first_dirty, plog.log_start_offset,
                                                          leo)
                    rng = cleanable_range([s.meta() for s in plog.segments], start,
                                          plog.active_segment.base_offset,
                                          plog.high_watermark if lso is None else lso, now,
                                          lag)
                    model.map_reach = max(model.map_reach, rng.first_uncleanable_offset)
                    note_expired_tombstones(plog, model, now)
                    config = CleanerConfig(dedupe_buffer_bytes=op[2] * ENTRY,
                                           dedupe_buffer_load_factor=1.0)
                    if op[0] == "clean":
                        stats = clean(plog, now, config, first_dirty_offset=first_dirty,
                                      last_stable_offset=lso)
                    else:
                        stats = None
                        with crash_after(op[3]), contextlib.suppress(Crash):
                            stats = clean(plog, now, config, first_dirty_offset=first_dirty)
                        if stats is None:                 # killed: reopen uncleanly
                            for seg in plog.segments + [s for _, s in plog._pending_deletes]:
                                seg.close_without_index_changes()
                            plog.closed = True
                            model.touched_below = max(model.touched_below,
                                                      rng.first_uncleanable_offset)
                            plog = PartitionLog.open(path, cfg, clean_shutdown=False, now_ms=now,
                                                     recovery_point=leo if op[4] else 0)
                            assert not [n for n in os.listdir(path)
                                        if n.endswith((".cleaned", ".swap", ".deleted"))]
                    if stats is not None:
                        model.touched_below = max(model.touched_below, stats.map_end_offset + 1)
                    got = check_invariants(plog, model, leo)
                    event(f"{op[0]}: {'killed' if stats is None else 'completed'}, "
                          f"{'some' if stats is None or stats.groups_swapped else 'no'} swaps")
                    if stats is not None:
                        assert stats.completed
                        assert stats.first_uncleanable_offset == rng.first_uncleanable_offset
                        first_dirty = stats.next_dirty_offset
                        check_completed_pass(got, model, stats.map_end_offset, plog, now)
        finally:
            if not plog.closed:
                plog.close()


def check_completed_pass(got: dict, model: Model, map_end: int, plog: PartitionLog,
                         now: int) -> None:
    """Below the map's end only the latest record of each key is left."""
    latest = model.latest_below(map_end + 1)
    for offset, (_, key, _, _) in got.items():
        if offset <= map_end:
            assert key is not None and latest[key] == offset, offset
    for batch in plog.batches():
        for r in batch.records():
            if r.offset <= map_end and r.value is None:
                assert batch.has_delete_horizon and batch.delete_horizon_ms > now
