"""The broker's cleaner scheduling (``mq.broker.cleaning``) without a broker process.

``LoopCalls`` on its own, then ``BackgroundCleaner`` over real ``PartitionLog``s in
``tmp_path`` with a fake loop thread standing in for the broker's: it runs ``run_pending``
when the pipe is readable, and can be paused so a swap waits for it (the moment a stop or a
topic deletion is the most dangerous). Time is a test clock; nothing sleeps to wait for a
condition (``mq.testing.wait_for``).
"""

from __future__ import annotations

import os
import select
import selectors
import threading
from collections.abc import Callable, Iterator

import pytest

from mq.broker.cleaning import BackgroundCleaner, LoopCalls
from mq.log import files
from mq.log.builder import BatchBuilder
from mq.log.check import check_partition
from mq.log.cleaner import read_cleaner_checkpoint, write_cleaner_checkpoint
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.testing import wait_for

T0 = 1_000_000
# ~8 single-record batches a segment, so a few dozen updates span several segments (and
# several cleaning groups: a group holds at most segment.bytes).
CFG = LogConfig(segment_bytes=700, index_interval_bytes=100, segment_index_bytes=4096,
                cleanup_policy="compact", file_delete_delay_ms=0, delete_retention_ms=1000,
                min_cleanable_dirty_ratio=0.01)
IDLE_BACKOFF_MS = 60_000        # longer than any test: only wake() or stop() ends a sleep


# --- a fake loop thread ---------------------------------------------------------------------------

class FakeLoop(threading.Thread):
    """The broker loop's part in the protocol: run queued calls when the pipe is readable."""

    def __init__(self, calls: LoopCalls) -> None:
        super().__init__(name="fake-loop", daemon=True)
        self.calls = calls
        self._running = threading.Event()
        self._running.set()
        self._halt = threading.Event()

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.calls, selectors.EVENT_READ)
        while not self._halt.is_set():
            if sel.select(0.05):
                self._running.wait()
                if not self._halt.is_set():
                    self.calls.run_pending()
        sel.close()

    def pause(self) -> None:
        """Calls queued from now on wait (a paused loop still finishes its current call)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def halt(self) -> None:
        self._halt.set()
        self._running.set()
        self.join(10)

    def run_here(self, fn: Callable):
        """Run ``fn`` on the loop thread, as the broker's request handlers do."""
        return self.calls.call(fn, lambda: False)


def call_queued(calls: LoopCalls) -> bool:
    """Whether a call waits for a (paused) loop: its wake-up byte is in the pipe."""
    return bool(select.select([calls], [], [], 0)[0])


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def calls() -> Iterator[LoopCalls]:
    c = LoopCalls()
    yield c
    c.close()


@pytest.fixture
def loop(calls) -> Iterator[FakeLoop]:
    fake = FakeLoop(calls)
    fake.start()
    yield fake
    fake.halt()


class Harness:
    """Logs in ``tmp_path`` plus a cleaner over them; everything closed at the end."""

    def __init__(self, tmp_path, calls: LoopCalls, loop: FakeLoop) -> None:
        self.dir = str(tmp_path)
        self.calls = calls
        self.loop = loop
        self.logs: dict[str, PartitionLog] = {}
        self.clock = Clock()
        self.swapped: list[str] = []
        self.on_swapped: Callable[[PartitionLog], None] = lambda plog: None
        self.cleaners: list[BackgroundCleaner] = []
        self.grabs = 0                       # rounds started (list_logs runs in each)

    def open(self, name: str = "t-0", config: LogConfig = CFG) -> PartitionLog:
        plog = PartitionLog.open(os.path.join(self.dir, name), config, now_ms=0)
        self.logs[name] = plog
        return plog

    def cleaner(self, backoff_ms: int = IDLE_BACKOFF_MS) -> BackgroundCleaner:
        def swapped(plog: PartitionLog) -> None:
            assert threading.current_thread() is self.loop
            self.swapped.append(plog.topic)
            self.on_swapped(plog)
        cleaner = BackgroundCleaner(self.calls, self.list_logs, self.dir,
                                    backoff_ms=backoff_ms, on_swapped=swapped,
                                    clock=self.clock)
        self.cleaners.append(cleaner)
        cleaner.start()
        return cleaner

    def list_logs(self) -> list[PartitionLog]:
        assert threading.current_thread() is self.loop
        self.grabs += 1
        return list(self.logs.values())

    def next_round_claims(self, cleaner: BackgroundCleaner, plog: PartitionLog) -> bool:
        """Wake the cleaner and say whether its next round claimed ``plog`` (claims happen
        on the loop thread, so once the round's call ran the answer is exact)."""
        grabs = self.grabs
        cleaner.wake()
        wait_for(lambda: self.grabs > grabs, message="the next round")
        return self.loop.run_here(lambda: cleaner.is_cleaning(plog))

    def close(self) -> None:
        for cleaner in self.cleaners:
            cleaner.stop()
        self.loop.resume()
        for cleaner in self.cleaners:
            cleaner.join(10)
            assert not cleaner.is_alive()
        for plog in self.logs.values():
            plog.close()


@pytest.fixture
def h(tmp_path, calls, loop) -> Iterator[Harness]:
    harness = Harness(tmp_path, calls, loop)
    yield harness
    harness.close()


def put(plog: PartitionLog, key: str, value: str | None, ts: int = T0) -> None:
    b = BatchBuilder()
    b.append(ts, key.encode(), None if value is None else value.encode())
    plog.append(b.build(), now_ms=ts)


def updates(plog: PartitionLog, keys: int, rounds: int) -> dict[bytes, bytes]:
    """``rounds`` updates of each of ``keys`` keys (one batch each); the latest values."""
    for r in range(rounds):
        for k in range(keys):
            put(plog, f"k{k}", f"v{r}")
    return {f"k{k}".encode(): f"v{rounds - 1}".encode() for k in range(keys)}


def records(plog: PartitionLog) -> list[tuple[int, bytes, bytes | None]]:
    return [(r.offset, bytes(r.key), None if r.value is None else bytes(r.value))
            for batch in plog.batches() for r in batch.records()]


def latest(rows) -> dict[bytes, bytes | None]:
    out = {}
    for _, key, value in rows:
        out[key] = value
    return out


def below_active(plog: PartitionLog) -> list[tuple[int, bytes, bytes | None]]:
    return [row for row in records(plog) if row[0] < plog.active_segment.base_offset]


def leftovers(plog: PartitionLog) -> list[str]:
    return [n for n in os.listdir(plog.dir)
            if n.endswith((files.CLEANED_SUFFIX, files.SWAP_SUFFIX))]


def assert_consistent(plog: PartitionLog, expected: dict[bytes, bytes]) -> None:
    """Every key's latest value is there, no swap leftover, and the directory checks clean
    after an unclean reopen (recovery validates every batch)."""
    assert leftovers(plog) == []
    assert latest(records(plog)) == expected
    directory, config = plog.dir, plog.config
    plog.close()
    with PartitionLog.open(directory, config) as reopened:
        assert latest(records(reopened)) == expected
    result = check_partition(directory)
    assert result.clean, result.problems


# --- LoopCalls ------------------------------------------------------------------------------------

def test_call_runs_on_the_loop_thread_and_returns_its_result(calls, loop):
    assert calls.call(lambda: threading.current_thread(), lambda: False) is loop


def test_call_raises_the_exception_of_the_callable(calls, loop):
    err = KeyError("boom")

    def fail():
        raise err
    with pytest.raises(KeyError) as caught:
        calls.call(fail, lambda: False)
    assert caught.value is err
    assert calls.call(lambda: 7, lambda: False) == 7      # the loop carries on


def test_call_gives_up_before_running_when_aborted(calls):
    ran = []
    abort = threading.Event()
    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            calls.call(lambda: ran.append(1), abort.is_set)
        except ValueError as err:
            outcome.append(err)
    t = threading.Thread(target=caller)
    t.start()
    wait_for(lambda: call_queued(calls), message="the call to be queued")
    abort.set()
    t.join(10)
    assert [str(e) for e in outcome] == ["broker stopping"]
    calls.run_pending()                     # the loop comes round later: nothing to run
    assert ran == []


def test_close_fails_queued_calls_and_later_ones(calls):
    outcome: list[BaseException] = []
    t = threading.Thread(target=lambda: outcome.append(
        pytest.raises(ValueError, calls.call, lambda: 1, lambda: False).value))
    t.start()
    wait_for(lambda: call_queued(calls), message="the call to be queued")
    calls.close()
    t.join(10)
    assert [str(e) for e in outcome] == ["broker stopping"]
    with pytest.raises(ValueError, match="broker stopping"):
        calls.call(lambda: 1, lambda: False)
    calls.close()                           # idempotent


def test_calls_from_many_threads_all_complete_in_order_per_thread(calls, loop):
    seen: dict[int, list[int]] = {}

    def worker(n: int) -> None:
        for i in range(300):
            assert calls.call(lambda i=i: seen.setdefault(n, []).append(i) or i,
                              lambda: False) == i
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {n: list(range(300)) for n in range(4)}


# --- BackgroundCleaner ----------------------------------------------------------------------------

def test_cleans_compacted_logs_filthiest_first_and_never_a_delete_log(h):
    a = h.open("a-0")
    b = h.open("b-0")
    c = h.open("c-0", LogConfig(segment_bytes=700, cleanup_policy="delete",
                                min_cleanable_dirty_ratio=0.01))
    want_a = updates(a, 3, 10)
    want_b = updates(b, 3, 10)
    updates(c, 3, 10)
    c_before = records(c)
    # b's checkpoint says its first half is clean already: a lower dirty ratio than a's 1.0.
    half = b.segments[len(b.segments) // 2].base_offset
    write_cleaner_checkpoint(h.dir, {("b", 0): half})
    cleaner = h.cleaner()
    wait_for(lambda: cleaner.totals().completed >= 2, message="two passes")
    totals = cleaner.totals()
    assert h.swapped[0] == "a" and set(h.swapped) == {"a", "b"}
    assert set(totals.last) == {("a", 0), ("b", 0)}
    assert totals.last[("b", 0)].first_dirty_offset == half
    assert totals.failures == 0 and totals.bytes_read > totals.bytes_written > 0
    assert totals.throughput_mb_s > 0
    h.loop.run_here(lambda: None)           # the loop is past the last swap
    for plog, want in ((a, want_a), (b, want_b)):
        rows = h.loop.run_here(lambda plog=plog: below_active(plog))
        assert len({k for _, k, _ in rows}) == len(rows), "one record per key below active"
        assert h.loop.run_here(lambda plog=plog: latest(records(plog))) == want
    assert records(c) == c_before


def test_checkpoint_is_written_after_a_pass_and_read_back_by_the_next_cleaner(h):
    plog = h.open("t-0")
    updates(plog, 3, 10)
    write_cleaner_checkpoint(h.dir, {("gone", 0): 5})     # a log that no longer exists
    cleaner = h.cleaner()
    wait_for(lambda: cleaner.totals().completed >= 1, message="a pass")
    stats = cleaner.totals().last[("t", 0)]
    assert stats.next_dirty_offset == h.loop.run_here(lambda: plog.active_segment.base_offset)
    assert read_cleaner_checkpoint(h.dir) == {("t", 0): stats.next_dirty_offset}
    cleaner.stop()
    cleaner.join(10)
    # More updates, then a new cleaner (a restarted broker): it starts at the checkpoint.
    want = updates(plog, 3, 10)
    second = h.cleaner()
    wait_for(lambda: second.totals().completed >= 1, message="a pass of the second cleaner")
    assert second.totals().last[("t", 0)].first_dirty_offset == stats.next_dirty_offset
    assert h.loop.run_here(lambda: latest(records(plog))) == want


def test_a_deleted_log_loses_its_checkpoint_entry(h):
    a, b = h.open("a-0"), h.open("b-0")
    updates(a, 2, 10)
    updates(b, 2, 10)
    cleaner = h.cleaner()
    wait_for(lambda: set(read_cleaner_checkpoint(h.dir)) == {("a", 0), ("b", 0)},
             message="both logs cleaned")

    def delete_b() -> None:                 # what the broker's DeleteTopics does
        del h.logs["b-0"]
        cleaner.remove(b)
        b.close()
    h.loop.run_here(delete_b)
    assert set(read_cleaner_checkpoint(h.dir)) == {("a", 0)}


def test_tombstones_go_on_a_later_round_once_their_delete_horizon_passed(h):
    plog = h.open("t-0")
    updates(plog, 4, 3)
    put(plog, "k0", None)
    put(plog, "k1", None)
    for i in range(20):                     # filler: the tombstones leave the active segment
        put(plog, f"f{i}", "x")
    h.clock.now = T0 + 10
    cleaner = h.cleaner()
    wait_for(lambda: cleaner.totals().completed >= 1, message="the first pass")
    first = cleaner.totals().last[("t", 0)]
    assert first.next_delete_horizon_ms == T0 + 10 + CFG.delete_retention_ms
    kept = h.loop.run_here(lambda: latest(below_active(plog)))
    assert kept[b"k0"] is None and kept[b"k1"] is None     # kept for delete.retention.ms
    h.clock.now = first.next_delete_horizon_ms            # the horizon has passed
    cleaner.wake()
    wait_for(lambda: cleaner.totals().completed >= 2, message="the horizon pass")
    final = h.loop.run_here(lambda: latest(records(plog)))
    assert b"k0" not in final and b"k1" not in final
    assert final[b"k2"] == final[b"k3"] == b"v2"
    assert cleaner.totals().last[("t", 0)].next_delete_horizon_ms < 0
    assert not h.next_round_claims(cleaner, plog)      # no tombstone left: nothing to do


def pause_after_first_swap(h: Harness) -> None:
    def on_swapped(plog: PartitionLog) -> None:
        if len(h.swapped) == 1:
            h.loop.pause()
    h.on_swapped = on_swapped


@pytest.mark.parametrize("how", ["stop", "remove"])
def test_stop_or_remove_while_a_swap_waits_for_the_loop_leaves_a_consistent_log(h, how):
    plog = h.open("t-0")
    want = updates(plog, 3, 30)             # ~90 batches: a dozen segments, several groups
    pause_after_first_swap(h)
    cleaner = h.cleaner()
    wait_for(lambda: len(h.swapped) == 1 and call_queued(h.calls),
             message="the second swap waiting for the paused loop")
    if how == "stop":
        cleaner.stop()
        cleaner.join(10)
        assert not cleaner.is_alive()
    else:
        del h.logs["t-0"]                   # the loop is paused: this thread stands in for it
        cleaner.remove(plog)
        assert not cleaner.is_cleaning(plog)
    stats = cleaner.totals().last[("t", 0)]
    assert not stats.completed and stats.groups_swapped == 1
    assert read_cleaner_checkpoint(h.dir) == {}
    h.loop.resume()
    if how == "remove":
        h.loop.run_here(lambda: None)       # the abandoned swap's call is gone from the loop
        assert cleaner.is_alive()
    assert_consistent(plog, want)


def test_stop_at_a_batch_in_the_middle_of_a_pass(h):
    plog = h.open("t-0")
    want = updates(plog, 3, 30)
    h.on_swapped = lambda p: cleaner.stop()     # the next group's recopy sees it
    cleaner = h.cleaner()
    cleaner.join(10)
    assert not cleaner.is_alive()
    stats = cleaner.totals().last[("t", 0)]
    assert (stats.completed, stats.groups_swapped, stats.stopped_reason) == (False, 1,
                                                                             "stopped")
    assert_consistent(plog, want)


def test_a_failing_pass_is_logged_and_skipped(h, caplog):
    bad, good = h.open("bad-0"), h.open("good-0")
    updates(bad, 3, 10)
    want = updates(good, 3, 10)
    first = bad.segments[0]
    with open(first.log_path, "r+b") as f:  # a record byte: the CRC no longer matches
        f.seek(70)
        byte = f.read(1)
        f.seek(70)
        f.write(bytes([byte[0] ^ 0xFF]))
    cleaner = h.cleaner()
    wait_for(lambda: cleaner.totals().completed >= 1 and cleaner.totals().failures >= 1,
             message="one failed and one completed pass")
    assert cleaner.is_alive()
    assert "pass over" in caplog.text and "bad-0" in caplog.text
    assert h.swapped == ["good"] * len(h.swapped)
    assert leftovers(bad) == []
    assert h.loop.run_here(lambda: latest(records(good))) == want
    assert not h.next_round_claims(cleaner, bad)       # it waits FAILED_LOG_RETRY_MS


def test_wake_and_stop_cut_the_backoff_short(h):
    plog = h.open("t-0")
    cleaner = h.cleaner()
    wait_for(lambda: h.grabs >= 1, message="the first round")
    h.loop.run_here(lambda: None)           # the first round found nothing: it sleeps
    want = h.loop.run_here(lambda: updates(plog, 3, 10))   # appends happen on the loop
    cleaner.wake()
    wait_for(lambda: cleaner.totals().completed >= 1, timeout=10, message="a pass after wake")
    assert h.loop.run_here(lambda: latest(records(plog))) == want
    cleaner.stop()
    cleaner.join(10)
    assert not cleaner.is_alive()


def test_retention_style_removal_of_segments_makes_the_pass_stop_not_fail(h):
    """A swap refused because the segments changed (``replace_segments`` raises ValueError)
    ends the pass quietly; the next round cleans the log."""
    plog = h.open("t-0")
    want = updates(plog, 3, 30)
    refused = []

    def refuse_once(new, old, now_ms):
        if not refused:
            refused.append(1)
            raise ValueError("segments are no longer a run of inactive segments")
        original(new, old, now_ms)
    original = plog.replace_segments
    plog.replace_segments = refuse_once
    cleaner = h.cleaner(backoff_ms=1)
    wait_for(lambda: cleaner.totals().completed >= 1, message="a completed pass")
    assert cleaner.totals().failures == 0 and cleaner.totals().passes >= 2
    assert h.loop.run_here(lambda: latest(records(plog))) == want
