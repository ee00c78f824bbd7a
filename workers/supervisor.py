"""The supervisor: the process that calls ``workers.run`` (or ``mq workers run``). It starts
one child per slot, watches them through the counter table and ``waitpid``, and owns every
signal. It never touches a record and holds no connection to the broker.

Its loop wakes on a signal (``signal.set_wakeup_fd``) or every ``_TICK_S`` and then:

- **reaps** children. A child that exits while nobody asked it to is a death. The records in
  its in-flight entries each spend an attempt (``stats.record_attempt``: the next owner
  starts from there, so a record that kills its child ends in the dead-letter topic after
  ``max_retries + 1`` deaths). The slot restarts after ``restart_backoff_ms`` doubled per
  death in the last ``crash_loop_window_s``. A child that dies before it joined its group
  (its import fails in the child, its config is wrong) is a crash loop in the making:
  ``crash_loop_deaths`` of those within the window stop the slot, with an error in the log
  and ``crash-loop`` in the table. A child that joined proved the code runs; its deaths only
  lengthen the backoff (to at most 5 s), so repeated kills of healthy children never stop a
  slot.
  When every slot is stopped so, the pool exits 1. Exactly once, a slot that stops with a dead
  child (crash loop, or the pool stopping) gets one short-lived child that only fences its
  transactional id: the dead child's open transaction is aborted at once instead of holding
  ``read_committed`` readers and the partitions' next owners until it times out.
- **kills hung handlers.** An in-flight entry older than ``handler_timeout_s`` (plus a grace
  for async handlers, which time out by themselves first) gets its child SIGKILLed; the
  record spends an attempt (``HandlerTimeout``) and the slot restarts at once.
- **drains** on SIGTERM or SIGINT: SIGUSR1 to every child (finish, commit, leave), no more
  restarts, SIGKILL to what is left after ``drain_timeout_s``, exit 0. A second SIGTERM or
  SIGINT kills the children at once: exit 128 + the signal's number.
- **rolls** on SIGHUP: one slot at a time, drain its child, start a fresh one (a new
  interpreter: the handler's code is imported again) and wait until it joined the group
  before the next. Crash-looped slots get a new chance.
- tells systemd (when ``NOTIFY_SOCKET`` is set): ``READY=1`` once every child has joined its
  group, ``WATCHDOG=1`` from this loop, ``STOPPING=1`` on drain.

Children are started from this (main) thread: ``PR_SET_PDEATHSIG`` fires when the thread that
forked a child ends, and the main thread ends only with the process.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import signal
import subprocess
import sys
import time

from mq import systemd
from workers.child import ENV_CONFIG, ENV_FENCE, ENV_PARENT, ENV_SLOT
from workers.config import PoolConfig
from workers.failures import exit_text
from workers.metrics import serve_pool
from workers.stats import (
    BACKOFF,
    CRASH_LOOP,
    DEATHS,
    DRAINING,
    HANG_KILLS,
    INCARNATIONS,
    KIND_DIED,
    KIND_TIMEOUT,
    PID,
    RUNNING,
    STARTING,
    STATE,
    STOPPED,
    StatsTable,
)

__all__ = ["Supervisor"]

log = logging.getLogger("workers.supervisor")

_TICK_S = 0.05                      # hang checks and restarts happen on this grain
_MAX_RESTART_BACKOFF_S = 5.0
_ASYNC_GRACE_S = 1.0                # an async handler's own timeout acts first
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD_BLOCKED = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class Slot:
    """One place in the pool: its current child and its history."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.deaths: collections.deque[float] = collections.deque()   # backoff window
        self.early_deaths: collections.deque[float] = collections.deque()   # crash loop
        self.restart_at: float | None = None
        self.expected = False          # asked to drain: its exit is not a death
        self.kill_at: float | None = None
        self.hang_killed_at: int | None = None          # monotonic ns of the kill
        self.hung: list = []                            # the in-flight entries it hung on
        self.stopped = False           # crash loop, or the pool is stopping
        self.clean = True              # the last child drained (exit 0), or none ran yet

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Supervisor:
    """Runs a pool until it is drained; ``run()`` returns the exit status."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.slots = [Slot(i) for i in range(config.processes)]
        self.table: StatsTable | None = None
        self.signals: list[int] = []
        self.stopping = False
        self.stop_deadline = 0.0
        self.ready_sent = False
        self.rolling: list[int] = []   # slots still to restart after SIGHUP
        self.roll_stage: str | None = None          # the head slot's: draining, starting
        self.watchdog_s = systemd.watchdog_usec() / 2e6
        self.watchdog_at = 0.0
        self.hang_limit_ns = None if config.handler_timeout_s is None else int(
            (config.handler_timeout_s + (_ASYNC_GRACE_S + config.handler_timeout_s / 10
                                         if config.asynchronous else 0)) * 1e9)

    # --- the loop -----------------------------------------------------------------------------
    def run(self) -> int:
        config = self.config
        assert config.stats_path is not None
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in
                    (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)}
        old_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        self.table = StatsTable.create(config.stats_path, config.group_id, list(config.topics),
                                       config.processes, config.inflight_entries)
        log.info("pool of %d %s children for group %s on %s; handler %s; counters in %s",
                 config.processes, "exactly-once" if config.exactly_once else "at-least-once",
                 config.group_id, ",".join(config.topics), config.handler, config.stats_path)
        metrics = None
        try:
            if config.metrics_address is not None:     # the table exists: it serves it
                metrics = serve_pool(config.stats_path, config.metrics_address)
                log.info("metrics at %s", metrics.url)
            for slot in self.slots:
                self.start(slot)
            while True:
                status = self.turn(wake_r)
                if status is not None:
                    return status
        finally:
            if metrics is not None:
                metrics.close()
            self.kill_all()
            signal.set_wakeup_fd(old_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_r)
            os.close(wake_w)
            self.table.close()
            try:
                os.unlink(config.stats_path)
            except OSError:
                pass

    def _on_signal(self, signum, _frame) -> None:
        self.signals.append(signum)

    def turn(self, wake_r: int) -> int | None:
        """One turn of the loop; the exit status once the pool is done."""
        select.select([wake_r], [], [], _TICK_S)
        try:
            while os.read(wake_r, 512):
                pass
        except BlockingIOError:
            pass
        signals, self.signals = self.signals, []
        for signum in signals:
            status = self.on_signal(signum)
            if status is not None:
                return status
        self.reap()
        now = time.monotonic()
        if self.stopping:
            live = [s for s in self.slots if s.alive]
            if not live:
                log.info("drained; exiting")
                return 0
            if now >= self.stop_deadline:
                log.warning("drain_timeout_s=%g passed: killing %d child(ren) still draining "
                            "(their unfinished records are handled again later)",
                            self.config.drain_timeout_s, len(live))
                self.kill_all()
            return None
        self.check_hangs()
        self.restart_due(now)
        self.roll(now)
        self.notify(now)
        if all(s.stopped and not s.alive for s in self.slots):
            log.error("every slot is stopped by a crash loop; exiting")
            return 1
        return None

    def on_signal(self, signum: int) -> int | None:
        if signum == signal.SIGCHLD:
            return None
        if signum == signal.SIGHUP:
            if not self.stopping:
                log.info("SIGHUP: restarting the children one by one")
                head = self.rolling[:1]
                self.rolling = head + [s.index for s in self.slots if s.index not in head]
            return None
        name = signal.Signals(signum).name
        if self.stopping:
            log.warning("second %s: killing the children now", name)
            self.kill_all()
            return 128 + signum
        self.stopping = True
        self.stop_deadline = time.monotonic() + self.config.drain_timeout_s
        systemd.notify("STOPPING=1")
        live = [s for s in self.slots if s.alive]
        log.info("%s: draining %d child(ren) (at most %g s)", name, len(live),
                 self.config.drain_timeout_s)
        for slot in live:
            self.ask_drain(slot)
        if self.config.exactly_once:
            # A slot whose last child died holds an open transaction until its transactional
            # id is fenced: a short-lived child does that instead of the coordinator's timeout.
            for slot in self.slots:
                if not slot.alive and not slot.clean:
                    self.start(slot, fence_only=True)
                    self.ask_drain(slot)
        return None

    # --- children -----------------------------------------------------------------------------
    def start(self, slot: Slot, fence_only: bool = False) -> None:
        """Start the slot's next child (``fence_only``: one that only fences the slot's
        transactional id, aborting a dead predecessor's transaction, and exits)."""
        table, config = self.table, self.config
        assert table is not None
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        env.pop("WATCHDOG_USEC", None)
        env.pop("WATCHDOG_PID", None)
        env[ENV_CONFIG] = config.to_json()
        env[ENV_SLOT] = str(slot.index)
        env[ENV_PARENT] = str(os.getpid())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (_ROOT, env.get("PYTHONPATH"))))
        table.clear_in_flight(slot.index)
        table.set(slot.index, STATE, STARTING)
        if fence_only:
            env[ENV_FENCE] = "1"
        # The child starts with these signals blocked (a mask survives fork and exec) and
        # unblocks them once it has its own dispositions: a drain asked for while it starts
        # waits instead of killing it (SIGUSR1's default), and a Ctrl-C meant for the
        # supervisor does not.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _CHILD_BLOCKED)
        try:
            slot.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.child", f"group={config.group_id}",
                 f"slot={slot.index}"], env=env, stdin=subprocess.DEVNULL)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        slot.clean = False
        table.set(slot.index, PID, slot.proc.pid)
        table.add(slot.index, INCARNATIONS)
        slot.restart_at = None
        slot.expected = False
        slot.kill_at = None
        slot.hang_killed_at = None
        log.debug("slot %d: started pid %d", slot.index, slot.proc.pid)

    def ask_drain(self, slot: Slot) -> None:
        slot.expected = True
        slot.kill_at = time.monotonic() + self.config.drain_timeout_s
        try:
            slot.proc.send_signal(signal.SIGUSR1)   # type: ignore[union-attr]
        except ProcessLookupError:
            pass

    def kill_all(self) -> None:
        for slot in self.slots:
            if slot.alive:
                slot.expected = True
                slot.proc.kill()                    # type: ignore[union-attr]
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                slot.proc.wait()
                self.exited(slot, slot.proc.returncode)

    def reap(self) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                status = slot.proc.poll()
                if status is not None:
                    self.exited(slot, status)
            if slot.alive and slot.kill_at is not None and time.monotonic() >= slot.kill_at:
                log.warning("slot %d (pid %d) did not drain within %g s: killing it",
                            slot.index, slot.proc.pid, self.config.drain_timeout_s)
                slot.proc.kill()                    # type: ignore[union-attr]
                slot.kill_at = None

    def exited(self, slot: Slot, status: int) -> None:
        """A child is gone: account for it and plan the slot's next child."""
        table = self.table
        assert table is not None and slot.proc is not None
        pid, how = slot.proc.pid, exit_text(status)
        in_flight = table.in_flight(slot.index)
        joined = table.words[table.row(slot.index) + STATE] in (RUNNING, DRAINING)
        table.clear_in_flight(slot.index)
        table.set(slot.index, STATE, CRASH_LOOP if slot.stopped else STOPPED)
        now = time.monotonic()
        if slot.hang_killed_at is not None:
            table.add(slot.index, HANG_KILLS)
            log.warning("slot %d (pid %d) killed: %s hung past handler_timeout_s; "
                        "restarting it", slot.index, pid, self.describe(slot.hung))
            self.schedule(slot, now)
            return
        if slot.expected:
            slot.clean = status == 0
            level = logging.DEBUG if status == 0 else logging.WARNING
            log.log(level, "slot %d (pid %d) stopped (%s)", slot.index, pid, how)
            return
        table.add(slot.index, DEATHS)
        for t, p, o, attempt, _ in in_flight:
            table.record_attempt(t, p, o, attempt, KIND_DIED, status)
        if in_flight:
            log.warning("slot %d (pid %d) died (%s) while handling %s: that attempt "
                        "failed; restarting it", slot.index, pid, how, self.describe(in_flight))
            self.schedule(slot, now + self.config.restart_backoff_ms / 1000)
            return
        deaths, early = slot.deaths, slot.early_deaths
        deaths.append(now)
        if not joined:
            early.append(now)
        for window in (deaths, early):
            while window and window[0] < now - self.config.crash_loop_window_s:
                window.popleft()
        if len(early) >= self.config.crash_loop_deaths:
            slot.stopped = True
            log.error("slot %d: crash loop: %d deaths within %g s before joining the group, "
                      "the last %s; not restarting it (SIGHUP tries again)", slot.index,
                      len(early), self.config.crash_loop_window_s, how)
            if self.config.exactly_once and not self.stopping:
                self.start(slot, fence_only=True)   # its open transaction must not wait
                self.ask_drain(slot)
            table.set(slot.index, STATE, CRASH_LOOP)
            return
        delay = min(_MAX_RESTART_BACKOFF_S,
                    self.config.restart_backoff_ms / 1000 * 2 ** (len(deaths) - 1))
        log.warning("slot %d (pid %d) died (%s); restarting it in %.0f ms", slot.index, pid,
                    how, delay * 1000)
        self.schedule(slot, now + delay)

    def schedule(self, slot: Slot, when: float) -> None:
        if self.stopping:
            return
        slot.restart_at = when
        self.table.set(slot.index, STATE, BACKOFF)   # type: ignore[union-attr]

    def restart_due(self, now: float) -> None:
        for slot in self.slots:
            if slot.restart_at is not None and now >= slot.restart_at and not slot.alive:
                self.start(slot)

    def describe(self, entries) -> str:
        topics = self.config.topics
        return ", ".join(f"{topics[t]}-{p}@{o} (attempt {a})" for t, p, o, a, _ in entries) \
            or "no record"

    def check_hangs(self) -> None:
        if self.hang_limit_ns is None:
            return
        table = self.table
        now = time.monotonic_ns()
        for slot in self.slots:
            if not slot.alive or slot.hang_killed_at is not None or slot.expected:
                continue
            entries = table.in_flight(slot.index)   # type: ignore[union-attr]
            if any(now - started > self.hang_limit_ns for *_, started in entries):
                # The attempts first: the partition's next owner may start the record the
                # moment the kill frees it.
                limit = self.config.handler_timeout_s * 1e9    # type: ignore[operator]
                slot.hung = [e for e in entries if now - e[4] >= limit]
                for t, p, o, attempt, _ in slot.hung:
                    table.record_attempt(t, p, o, attempt, KIND_TIMEOUT, 0)   # type: ignore
                slot.hang_killed_at = now
                slot.proc.kill()                    # type: ignore[union-attr]

    # --- SIGHUP, systemd ----------------------------------------------------------------------
    def roll(self, now: float) -> None:
        """Advance a rolling restart: the head slot's child drains, its successor starts and
        joins the group, then the next slot."""
        if not self.rolling:
            return
        slot = self.slots[self.rolling[0]]
        state = self.table.words[self.table.row(slot.index) + STATE]   # type: ignore[union-attr]
        if self.roll_stage is None:
            if slot.alive:
                self.ask_drain(slot)
                self.roll_stage = "draining"
                return
            slot.stopped = False                    # crash-looped or in backoff: anew
            slot.deaths.clear()
            slot.early_deaths.clear()
            self.start(slot)
            self.roll_stage = "starting"
        elif self.roll_stage == "draining":
            if not slot.alive:
                self.start(slot)
                self.roll_stage = "starting"
        elif not slot.alive or state == RUNNING:    # joined (or died: its restart is planned)
            self.rolling.pop(0)
            self.roll_stage = None
            if not self.rolling:
                log.info("SIGHUP: every slot has a new child")

    def notify(self, now: float) -> None:
        table = self.table
        if not self.ready_sent and all(
                s.stopped or table.words[table.row(s.index) + STATE] == RUNNING   # type: ignore
                for s in self.slots):
            self.ready_sent = True
            joined = sum(not s.stopped for s in self.slots)
            log.info("ready: %d child(ren) joined group %s", joined, self.config.group_id)
            systemd.notify(f"READY=1\nSTATUS={joined} children in group {self.config.group_id}")
        if self.watchdog_s and now >= self.watchdog_at:
            self.watchdog_at = now + self.watchdog_s
            systemd.notify("WATCHDOG=1")
