"""Write-failure injection at every write of the storage engine, SQLite's way.

A fixed workload runs on a data dir (``LogManager``: appends that roll segments and add index
entries, flushes, checkpoints, DeleteRecords and retention, a clean close) with a
``FaultyDiskIO`` installed that fails the N-th write-side file operation, for N = 0, 1, 2, ...
until the workload no longer reaches N, in each of these modes:

- ``ENOSPC`` once, on the operations a full disk fails (space returns at once);
- a full disk from operation N on (every allocating operation fails until the end);
- ``EIO`` once, and ``EIO`` forever, on any write-side operation;
- a short write (part of a ``pwrite`` lands), then ``ENOSPC``;
- an fsync that fails.

Then the data dir is opened again with the real file system, as the broker's next start would,
and the model is checked (``docs/architecture.md``, "Write failures"):

- the workload only ever saw ``LogWriteError`` (never a raw ``OSError``, never anything else);
- every acknowledged record (its append returned) is readable at its offset with its value,
  so no offset was handed out twice;
- a space error alone never takes the log offline, and the log takes the next append;
- a log that went offline refused every write after that, and its close left no clean marker;
- after recovery, ``mq log check`` finds nothing wrong.

A Hypothesis test adds random workloads against random fault schedules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq.errors import LogWriteError
from mq.log import cleaner, diskio, files
from mq.log.builder import build_batch
from mq.log.check import check_partition
from mq.log.config import LogConfig
from mq.log.diskio import ALLOCATING_OPS, Fault, FaultyDiskIO
from mq.log.log import PartitionLog
from mq.log.manager import LogManager

CFG = LogConfig(segment_bytes=900, index_interval_bytes=150, segment_index_bytes=120,
                file_delete_delay_ms=0)
TOPIC = "t"
T0 = 1_700_000_000_000
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclasses.dataclass
class Model:
    """What the workload was told: acknowledged records and the log start it asked for."""

    acked: dict[int, bytes] = dataclasses.field(default_factory=dict)
    log_start: int = 0
    errors: list[LogWriteError] = dataclasses.field(default_factory=list)
    offline_at: int | None = None        # the step at which the log was first seen offline
    appends_after_offline: int = 0       # must stay 0
    steps: int = 0
    failures_counted: int = 0            # write failures the manager and the log counted

    def ack(self, first_offset: int, values: list[bytes]) -> None:
        for i, value in enumerate(values):
            offset = first_offset + i
            assert offset not in self.acked, f"offset {offset} handed out twice"
            self.acked[offset] = value


def _values(step: int) -> list[bytes]:
    return [b"step%03d-rec%d-" % (step, j) + b"x" * (step % 7 * 9) for j in range(1 + step % 3)]


@contextlib.contextmanager
def scratch_dir() -> Iterator[str]:
    """A data dir of its own, on tmpfs where there is one: these runs open and close logs
    thousands of times, and what they test is what a failed write does, not the disk."""
    root = tempfile.mkdtemp(prefix="mq-faults-", dir=SCRATCH)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def faulty_log(root: str) -> Iterator[tuple[FaultyDiskIO, LogManager, PartitionLog]]:
    """A data dir opened behind a ``FaultyDiskIO`` (no faults yet) with one partition that
    holds one record, b"a"; closed on the way out."""
    seam = FaultyDiskIO()
    with diskio.installed(seam):
        manager = LogManager.open(root, lambda topic: CFG)
        plog = manager.create(TOPIC, 0)
        plog.append(build_batch([(T0, None, b"a")]), now_ms=T0)
        try:
            yield seam, manager, plog
        finally:
            manager.close()


def values_of(plog: PartitionLog) -> list[bytes]:
    return [bytes(r.value) for b in plog.batches() for r in b.records()]


def run_workload(data_dir: str, steps: list[str], model: Model, seam: FaultyDiskIO) -> None:
    """Open a data dir, then run ``steps`` and close it with ``seam`` failing what it
    says; every storage error is recorded in ``model``. (Failures while opening are start-up
    failures: ``test_start_up_failures_leave_a_recoverable_data_dir``.)"""
    manager = LogManager.open(data_dir, lambda topic: CFG)
    plog = manager.create(TOPIC, 0)
    with diskio.installed(seam):
        _run_steps(manager, plog, steps, model)
    model.failures_counted = manager.write_failures + plog.write_failures
    if plog.offline is not None and model.offline_at is None:
        model.offline_at = len(steps)                  # at close


def _run_steps(manager: LogManager, plog, steps: list[str], model: Model) -> None:
    try:
        for n, step in enumerate(steps):
            model.steps += 1
            if plog.offline is not None and model.offline_at is None:
                model.offline_at = n
            try:
                if step == "append":
                    values = _values(n)
                    info = plog.append(build_batch(
                        [(T0 + n * 10, None, v) for v in values]), now_ms=T0 + n * 10)
                    if model.offline_at is not None:
                        model.appends_after_offline += 1
                    model.ack(info.first_offset, values)
                elif step == "flush":
                    plog.flush()
                elif step == "checkpoint":
                    manager.checkpoint()
                elif step == "delete-records":
                    target = (plog.log_start_offset + plog.high_watermark) // 2
                    model.log_start = plog.delete_records_before(target)
                    plog.apply_retention(now_ms=T0)
                elif step == "roll":
                    plog.roll(now_ms=T0 + n * 10)
                else:
                    raise AssertionError(step)
            except LogWriteError as err:
                model.errors.append(err)
    finally:
        manager.close()


WORKLOAD = (["append"] * 5 + ["flush", "checkpoint"] + ["append"] * 6 + ["roll", "append",
            "flush", "delete-records"] + ["append"] * 5 + ["checkpoint", "flush"]
            + ["append"] * 4)


def check_after_recovery(data_dir: str, model: Model, seam: FaultyDiskIO) -> None:
    """Open the data dir as the next broker start would (no faults) and check the model."""
    marker = os.path.exists(os.path.join(data_dir, files.CLEAN_SHUTDOWN_FILE))
    if model.offline_at is not None:
        assert not marker, "an offline log's close must leave no clean-shutdown marker"
    assert model.appends_after_offline == 0, "an offline log took an append"
    manager = LogManager.open(data_dir, lambda topic: CFG)
    try:
        plog = manager.get(TOPIC, 0)
        assert plog is not None
        assert plog.log_start_offset <= max(model.log_start, 0)
        stored = {rec.offset: bytes(rec.value) for batch in plog.batches()
                  for rec in batch.records()}
        lost = {o: v for o, v in model.acked.items()
                if o >= plog.log_start_offset and stored.get(o) != v}
        assert not lost, (f"acknowledged records lost or changed: {sorted(lost)[:5]} "
                          f"(injected {seam.injected})")
        if model.acked:
            assert plog.log_end_offset > max(model.acked), "offsets would be handed out again"
        # It takes writes again, at a fresh offset.
        info = plog.append(build_batch([(T0, None, b"after")]), now_ms=T0)
        assert info.first_offset not in model.acked
    finally:
        manager.close()
    result = check_partition(os.path.join(data_dir, f"{TOPIC}-0"))
    assert result.clean, [p.message for p in result.problems]


PWRITE = frozenset({"pwrite"})
# Files recovery rebuilds: a failed write is logged, and nothing else changes.
BEST_EFFORT = (".snapshot.tmp", ".snapshot", "leader-epoch-checkpoint.tmp",
               "leader-epoch-checkpoint")
MODES = {
    "enospc-once": lambda n: [Fault(errno.ENOSPC, ops=ALLOCATING_OPS, after=n)],
    "disk-full": lambda n: [Fault(errno.ENOSPC, ops=ALLOCATING_OPS, after=n, times=-1)],
    "eio-once": lambda n: [Fault(errno.EIO, after=n)],
    "eio-forever": lambda n: [Fault(errno.EIO, after=n, times=-1)],
    # Part of a write lands, then the disk is full (the next pwrite fails).
    "short-write": lambda n: [Fault(errno.ENOSPC, ops=PWRITE, after=n, short=0.5),
                              Fault(errno.ENOSPC, ops=PWRITE, after=n)],
    # Part of a write lands, and the rest on the next try: nothing to report.
    "short-then-rest": lambda n: [Fault(errno.ENOSPC, ops=PWRITE, after=n, short=0.5)],
    "fsync-eio": lambda n: [Fault(errno.EIO, ops=frozenset({"fdatasync", "fsync"}), after=n)],
}


def one_case(mode: str, n: int) -> tuple[Model, FaultyDiskIO, bool]:
    """Run the workload with operation ``n`` failing in ``mode``; check it; returns whether
    the fault was reached."""
    with scratch_dir() as root:
        seam = FaultyDiskIO(MODES[mode](n))
        model = Model()
        run_workload(root, WORKLOAD, model, seam)
        reached = bool(seam.injected)
        if mode in ("enospc-once", "short-write") and reached:
            assert model.offline_at is None, f"a space error took the log offline: {seam.injected}"
            best_effort = all(path.endswith(BEST_EFFORT) for _, path, _ in seam.injected)
            assert model.errors or model.failures_counted or best_effort, \
                f"{seam.injected} went unnoticed"
        if mode == "short-then-rest" and reached:
            assert not model.errors and not model.failures_counted
        if mode == "fsync-eio" and reached:
            if any(f"{TOPIC}-0" in path for _, path, _ in seam.injected):
                # A partition's file or directory: never retried, the log is offline.
                assert model.offline_at is not None or any(e.offline for e in model.errors)
            else:                                       # a checkpoint's: the old one stays
                assert model.failures_counted and model.offline_at is None
        check_after_recovery(root, model, seam)
        return model, seam, reached


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fail_every_write_operation_in_turn(mode):
    n = 0
    while True:
        _, _, reached = one_case(mode, n)
        if not reached:
            break
        n += 1
    assert n > 40, f"the workload reached only {n} write operations"


def test_a_space_error_is_reported_and_the_next_append_succeeds():
    """The issue's first finding, by hand: a short append on a full disk leaves nothing
    behind, and once space returns the next batch lands right after the last good one."""
    with scratch_dir() as root:
        with faulty_log(root) as (seam, _, plog):
            size = plog.active_segment.size
            for fault in MODES["short-write"](0):
                seam.add(fault)
            with pytest.raises(LogWriteError, match="No space left"):
                plog.append(build_batch([(T0, None, b"b" * 50)]), now_ms=T0)
            assert os.path.getsize(plog.active_segment.log_path) == size
            assert plog.log_end_offset == 1 and plog.offline is None
            assert plog.append(build_batch([(T0, None, b"c")]), now_ms=T0).first_offset == 1
        with LogManager.open(root, lambda topic: CFG) as manager:
            assert values_of(manager.get(TOPIC, 0)) == [b"a", b"c"]


def test_offline_log_refuses_writes_without_touching_the_disk():
    with scratch_dir() as root:
        with faulty_log(root) as (seam, _, plog):
            seam.add(Fault(errno.EIO, ops=frozenset({"fdatasync"})))
            with pytest.raises(LogWriteError) as failed:
                plog.flush()
            assert failed.value.offline and "fsync failed" in plog.offline
            calls = seam.calls
            for write in (lambda: plog.append(build_batch([(T0, None, b"b")]), now_ms=T0),
                          plog.flush, lambda: plog.roll(now_ms=T0)):
                with pytest.raises(LogWriteError, match="offline"):
                    write()
            assert seam.calls == calls
            assert values_of(plog) == [b"a"]
        assert not os.path.exists(os.path.join(root, files.CLEAN_SHUTDOWN_FILE))
        with LogManager.open(root, lambda topic: CFG) as manager:
            assert not manager.clean_shutdown and manager.get(TOPIC, 0).offline is None


def test_a_checkpoint_that_cannot_be_written_keeps_the_old_one():
    with scratch_dir() as root:
        with faulty_log(root) as (seam, manager, plog):
            plog.flush()
            assert manager.checkpoint()
            path = os.path.join(root, files.RECOVERY_POINT_CHECKPOINT)
            before = Path(path).read_bytes()
            plog.append(build_batch([(T0, None, b"b")]), now_ms=T0)
            plog.flush()
            seam.disk_full()
            assert manager.checkpoint() is False
            assert Path(path).read_bytes() == before
            assert not any(name.endswith(files.TMP_SUFFIX) for name in os.listdir(root))
            seam.clear()
        assert not os.path.exists(os.path.join(root, files.CLEAN_SHUTDOWN_FILE))


STEPS = st.lists(st.sampled_from(["append"] * 6 + ["flush", "checkpoint", "roll",
                                                    "delete-records"]),
                 min_size=5, max_size=40)
FAULTS = st.builds(
    Fault,
    errno=st.sampled_from([errno.ENOSPC, errno.EDQUOT, errno.EIO]),
    ops=st.sampled_from([None, ALLOCATING_OPS, frozenset({"pwrite"}),
                         frozenset({"fdatasync", "fsync"}), frozenset({"ftruncate"}),
                         frozenset({"rename", "replace"})]),
    after=st.integers(0, 80), times=st.sampled_from([1, 2, -1]),
    short=st.sampled_from([0.0, 0.0, 0.3]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, faults=st.lists(FAULTS, min_size=1, max_size=3))
def test_random_workloads_under_random_faults(steps, faults):
    with scratch_dir() as root:
        seam = FaultyDiskIO(faults)
        model = Model()
        run_workload(root, steps, model, seam)
        check_after_recovery(root, model, seam)


@pytest.mark.parametrize("clean", [True, False], ids=["after-clean-stop", "after-crash"])
@pytest.mark.parametrize("mode", ["enospc-once", "disk-full", "eio-once", "eio-forever"])
def test_start_up_failures_leave_a_recoverable_data_dir(mode, clean):
    """A broker that cannot start (its data dir fails while it opens) exits with the error;
    the data dir must still hold everything, for the start after the disk is mended."""
    with scratch_dir() as root:
        model = Model()
        manager = LogManager.open(root, lambda topic: CFG)
        plog = manager.create(TOPIC, 0)
        if clean:
            _run_steps(manager, plog, WORKLOAD, model)
        else:                    # a crash: nothing closed, indexes left preallocated
            for n in range(12):
                values = _values(n)
                info = plog.append(build_batch([(T0, None, v) for v in values]), now_ms=T0)
                model.ack(info.first_offset, values)
            manager._unlock()
        n = 0
        while True:
            seam = FaultyDiskIO(MODES[mode](n))
            with diskio.installed(seam):
                try:
                    LogManager.open(root, lambda topic: CFG).close()
                except (OSError, LogWriteError):
                    pass
            if not seam.injected:
                break
            n += 1
        assert n > 3
        check_after_recovery(root, model, FaultyDiskIO())


COMPACT = LogConfig(segment_bytes=500, index_interval_bytes=100, segment_index_bytes=4096,
                    cleanup_policy="compact", min_cleanable_dirty_ratio=0.0,
                    file_delete_delay_ms=0)


def _compacted_log(root: str) -> tuple[PartitionLog, dict[bytes, bytes]]:
    """A compacted-topic log with many overwritten keys, and the latest value per key."""
    plog = PartitionLog.open(os.path.join(root, "c-0"), COMPACT, now_ms=T0)
    latest: dict[bytes, bytes] = {}
    for i in range(60):
        key, value = b"k%d" % (i % 7), b"v%03d" % i
        plog.append(build_batch([(T0 + i, key, value)]), now_ms=T0 + i)
        latest[key] = value
    plog.roll(now_ms=T0 + 100)
    return plog, latest


@pytest.mark.parametrize("mode", ["enospc-once", "disk-full", "eio-once", "short-write"])
def test_the_cleaner_under_write_failures_keeps_every_latest_value(mode):
    """A compaction pass whose writes fail (its ``.cleaned`` output, its swap renames) either
    completes or leaves the log as it was, or (a swap that failed half-way) offline until the
    next open finishes or undoes it; the latest value of every key survives either way."""
    n = 0
    while True:
        with scratch_dir() as root:
            plog, latest = _compacted_log(root)
            seam = FaultyDiskIO(MODES[mode](n))
            with diskio.installed(seam):
                try:
                    cleaner.clean(plog, T0 + 200)
                except (OSError, LogWriteError):
                    pass
                plog.close()
            if plog.offline is None:
                assert not any(name.endswith(files.CLEANED_SUFFIX)
                               for name in os.listdir(plog.dir))
            reopened = PartitionLog.open(plog.dir, COMPACT, now_ms=T0)
            values = {bytes(r.key): bytes(r.value) for b in reopened.batches()
                      for r in b.records()}
            assert values == latest, seam.injected
            reopened.close()
            assert check_partition(plog.dir).clean
        if not seam.injected:
            break
        n += 1
    assert n > 10
