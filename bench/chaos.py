"""Chaos run: kill -9 of the broker, of producers and of group members, clean broker restarts
and full-disk episodes, with the durability invariants checked after every cycle.

::

    python3 -m bench.chaos [--cycles 300] [--seed S] [--partitions 4] [--producers 3]
                           [--members 2] [--no-disk-full] [--out bench/out/chaos.json] [--quick]

Processes: the broker (``python -m mq.broker``) on a data dir that, when this runs as root, is
a tmpfs of its own (``--tmpfs-mb``) so that the disk can be filled; ``--producers`` producer
processes (``mq.Producer``, acks="all", about ``--rate`` records/s each, value
``p<producer>-<seq>|`` plus filler, partitions in turn; odd ones with ``linger_ms=0``, even
ones 2 ms; every third one with acks=1 and ``linger_ms=0``, not idempotent: its batches
take the broker's append in C and may be written twice); ``--members`` consumer-group members
(``mq.Consumer`` with ``group_id``, ``commit()`` of what they consumed at most every 100 ms).
Producers and members come from a multiprocessing forkserver (a child starts in ~20 ms).

Each cycle lets the load run 0-0.4 s, then does one action, chosen by an RNG seeded with
``--seed`` (the schedule, the victims, the delays, the episode lengths and the broker settings
replay exactly; process timing does not):

- ``kill-broker``: SIGKILL the broker, start it again (recovery), wait until it listens;
- ``term-broker``: SIGTERM it (exit status 0 expected), run ``python -m mq log check`` over
  every partition directory (exit 0 expected), re-check every acknowledged record from disk
  while nothing writes, start it again;
- ``kill-producer`` / ``kill-member``: SIGKILL a random one, start a new one in its place;
- ``disk-full``: write a ballast file into the tmpfs until ``write`` fails with ENOSPC, keep the
  load running for 0.2-0.8 s, delete the ballast. When the broker has a ``min_free_bytes``
  setting (checked at run time in ``BrokerConfig``), each broker start picks 0 (writes reach
  ENOSPC inside the broker) or ``FLOOR_BYTES``; with the floor on, an episode fills either to
  ENOSPC or only to half the floor (the broker should refuse produce before the disk is full).

After the action the run waits (``--stall-timeout``) for a record and a commit acknowledged
after it, then checks, from the ledgers the clients write and from the files on disk:

- ``records-lost``: every acknowledged record reads back at its acked offset with its value.
  The log is read straight from the ``.log`` files (``pread``, CRC of every batch, offsets
  contiguous across batches and segments), not through the broker: what a restart would find.
  A record is lost if it is missing, different, or behind bytes that are not a valid batch;
- ``offset-reused``: no offset was acknowledged for two different values;
- ``commit-lost``: the group's committed offset of each partition (``Admin.list_group_offsets``)
  is the last acknowledged commit or one that may have come after it - never an older one;
- ``broker-exit``: the broker is alive unless the run stopped it (exit status and stderr tail);
  ``broker-start``: it starts again; ``clean-stop``: SIGTERM gives exit status 0 within 30 s;
- ``log-check``: ``mq log check`` exits 0 after each clean stop and at the end;
- ``stalled``: a record and a commit are acknowledged within ``--stall-timeout`` s after each
  action (if not, the broker is restarted with kill -9 so that the run goes on);
- ``worker-exit``: producers and members never exit on their own (they ride out restarts).

Checks are incremental (new acknowledgements, new log bytes); every ``--full-every`` cycles,
after each clean stop and at the end, every acknowledged record is re-read from scratch.
Ledgers: ``p<N>.acks`` lines ``A partition offset seq time`` written by the producer's callback
after the broker acknowledged, ``F seq error time`` for failed sends; ``m<N>.commits`` JSON lines
(attempt, then outcome). They live in the work dir, never on the tmpfs, and are appended with
one ``write(2)`` per line, so a SIGKILL never leaves half a line. Times are CLOCK_MONOTONIC
(one clock for every process). Exit status 1 if any invariant broke; the report names the first
violation of each kind: partition, offset, cycle and action. When one broke, the work dir is
kept, with a copy of the data dir (the tmpfs is always unmounted).

Modules: this one runs the cycles and reports; ``bench.chaos_procs`` holds the processes (client
bodies, broker, tmpfs), ``bench.chaos_checks`` the ledgers, the disk reader and the checks.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from bench.chaos_checks import AckLedger, CommitLedger, PartitionScan, Violations, describe_code
from bench.chaos_procs import (
    GROUP,
    TOPIC,
    Broker,
    Disk,
    exit_text,
    member_main,
    plain_producer,
    producer_main,
)
from bench.harness import add_run_arguments
from mq.protocol.state import remove_leftovers

ACTIONS = {"kill-broker": 3, "term-broker": 1, "kill-producer": 2, "kill-member": 2,
           "disk-full": 2}                  # action: weight
FLOOR_BYTES = 8 << 20                       # min_free_bytes when a broker start turns it on
DWELL_S = 0.4                               # load between two faults: 0 to this, seeded
MAX_SOCKET_PATH = 100                       # sun_path is 108 bytes on Linux

CTX = mp.get_context("forkserver")


class Aborted(Exception):
    """The broker cannot be started again: the run ends early (and reports why)."""


# --- the run ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Options:
    cycles: int = 300
    seed: int | None = None
    partitions: int = 4
    producers: int = 3
    members: int = 2
    disk_full: bool = True
    rate: float = 100.0                   # records/s per producer
    tmpfs_mb: int = 64
    segment_bytes: int = 1 << 20          # small, so that rolls happen (also on a full disk)
    full_every: int = 25
    progress_every: int = 10
    stall_timeout: float = 20.0
    actions: tuple[str, ...] = tuple(ACTIONS)
    schedule: list[str] | None = None     # a fixed action list (tests) instead of the RNG
    dir: str | None = None
    keep: bool = False


class Chaos:
    def __init__(self, opts: Options, progress: Callable[[str], None]) -> None:
        self.opts = opts
        self.progress = progress
        self.seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(
            1 << 31)
        self.rng = random.Random(self.seed)
        self.work = tempfile.mkdtemp(prefix="mq-chaos-", dir=opts.dir)
        self.data_dir = os.path.join(self.work, "data")
        os.makedirs(self.data_dir)
        sock = os.path.join(self.work, "mq.sock")
        self.sock_dir = None
        if len(sock) > MAX_SOCKET_PATH:
            self.sock_dir = tempfile.mkdtemp(prefix="mq-chaos-")
            sock = os.path.join(self.sock_dir, "mq.sock")
        self.broker = Broker(self.data_dir, sock, self.work)
        self.disk = Disk(self.data_dir, opts.tmpfs_mb)
        self.disk_note: str | None = None
        self.floor_key = False
        self.violations = Violations(progress)
        self.cycle_marks: list[tuple[float, str]] = []
        self.acks = AckLedger(opts.partitions, self.violations, self.where)
        self.commits = CommitLedger()
        self.scans = self.fresh_scans()
        self.lost: set[tuple[int, int]] = set()
        self.duplicated: set[tuple[int, int]] = set()
        self.procs: dict[str, dict[int, mp.Process]] = {"producer": {}, "member": {}}
        self.ledger_paths: dict[str, dict[int, str]] = {"producer": {}, "member": {}}
        self.next_id = {"producer": 1, "member": 1}
        self.actions: collections.Counter = collections.Counter()
        self.episodes: list[dict] = []
        self.log_checks = 0
        self.full_checks = 0
        self.restarted = False
        self.cycles_done = 0
        self.aborted: str | None = None
        self.t0 = time.monotonic()

    # --- bookkeeping ------------------------------------------------------------------------
    def where(self, t: float) -> str:
        """The cycle (and action) during which monotonic time ``t`` fell."""
        i = bisect.bisect_right([m[0] for m in self.cycle_marks], t) - 1
        return self.cycle_marks[i][1] if i >= 0 else "setup"

    def fresh_scans(self) -> list[PartitionScan]:
        return [PartitionScan(os.path.join(self.data_dir, f"{TOPIC}-{p}"))
                for p in range(self.opts.partitions)]

    # --- processes --------------------------------------------------------------------------
    def start_worker(self, kind: str) -> None:
        n = self.next_id[kind]
        self.next_id[kind] += 1
        err = os.path.join(self.work, f"{kind[0]}{n}.stderr")
        if kind == "producer":
            path = os.path.join(self.work, f"p{n}.acks")
            args = (n, self.broker.socket, self.opts.partitions, self.opts.rate, path, err)
            target = producer_main
        else:
            path = os.path.join(self.work, f"m{n}.commits")
            args = (n, self.broker.socket, path, err)
            target = member_main
        proc = CTX.Process(target=target, args=args, name=f"chaos-{kind}-{n}", daemon=True)
        proc.start()
        self.procs[kind][n] = proc
        self.ledger_paths[kind][n] = path

    def kill_worker(self, kind: str) -> str:
        n = self.rng.choice(sorted(self.procs[kind]))
        proc = self.procs[kind].pop(n)
        if proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        self.start_worker(kind)
        return f"{kind[0]}{n}"

    def check_workers(self) -> None:
        for kind, procs in self.procs.items():
            for n, proc in list(procs.items()):
                if proc.exitcode is not None:
                    tail = ""
                    with contextlib.suppress(OSError), open(
                            os.path.join(self.work, f"{kind[0]}{n}.stderr"),
                            errors="replace") as f:
                        tail = " | ".join(f.read().strip().splitlines()[-3:])
                    self.violations.add("worker-exit", f"{kind} {kind[0]}{n}",
                                        f"exited on its own ({exit_text(proc.exitcode)}): "
                                        f"{tail or '(no stderr)'}")
                    del procs[n]
                    self.start_worker(kind)

    def stop_workers(self) -> None:
        procs = [p for ps in self.procs.values() for p in ps.values()]
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()
        for ps in self.procs.values():
            ps.clear()

    # --- the broker -------------------------------------------------------------------------
    def start_broker(self) -> None:
        floor = None
        if self.floor_key:
            floor = self.rng.choice((0, FLOOR_BYTES))
        for attempt in (0, 1):
            try:
                self.broker.start(floor)
                self.restarted = True
                return
            except RuntimeError as err:
                self.violations.add("broker-start", f"start #{self.broker.starts}", str(err))
                if attempt:
                    raise Aborted(f"the broker does not start: {err}") from err

    def broker_exited(self) -> bool:
        """If the broker exited on its own: report it (status, stderr tail), start it again."""
        if self.broker.alive():
            return False
        self.violations.add("broker-exit", f"broker pid {self.broker.proc.pid}",
                            f"exited on its own ({exit_text(self.broker.proc.returncode)}); "
                            f"stderr ends: {self.broker.stderr_tail(4)}")
        self.disk.drain()
        self.start_broker()
        return True

    def clean_stop(self) -> None:
        """SIGTERM: exit status 0 expected; then ``mq log check`` and a full re-check while
        nothing writes."""
        code = self.broker.term()
        if code != 0:
            self.violations.add("clean-stop", f"broker pid {self.broker.proc.pid}",
                                f"SIGTERM gave {exit_text(code)}; stderr ends: "
                                f"{self.broker.stderr_tail(4)}")
        self.log_check()
        self.check(full=True)

    def log_check(self) -> None:
        dirs = sorted(os.path.join(self.data_dir, d) for d in os.listdir(self.data_dir)
                      if os.path.isdir(os.path.join(self.data_dir, d)) and "-" in d
                      and d.rsplit("-", 1)[1].isdigit())
        res = subprocess.run([sys.executable, "-m", "mq", "log", "check", *dirs],
                             check=False, capture_output=True, text=True, timeout=300)
        self.log_checks += 1
        if res.returncode != 0:
            bad = [ln for ln in (res.stdout + res.stderr).splitlines() if ": OK:" not in ln]
            self.violations.add("log-check", f"{len(dirs)} partition dirs",
                                f"mq log check exited {res.returncode}: "
                                + " | ".join(bad[:4]))

    # --- the checks -------------------------------------------------------------------------
    def check(self, full: bool = False) -> None:
        """Every acknowledged record since the last check (all of them if ``full``) reads
        back from disk at its offset; committed offsets did not go back (when the broker is
        up)."""
        self.read_ledgers()
        if full:
            self.scans = self.fresh_scans()
            self.full_checks += 1
        elif self.restarted:
            self.scans = [s if s.unchanged() else PartitionScan(s.dir) for s in self.scans]
        self.restarted = False
        for p, scan in enumerate(self.scans):
            scan.advance()
            acked = self.acks.codes[p]
            offsets = (i for i in range(len(acked)) if acked[i] >= 0) if full \
                else self.acks.pending[p]
            bad = [off for off in offsets if scan.get(off) != acked[off]
                   and (p, off) not in self.lost]
            if bad and not full:
                # Read the partition again from scratch before calling anything lost, so that
                # nothing stale in the incremental reader is ever reported.
                scan = self.scans[p] = PartitionScan(scan.dir)
                scan.advance()
                bad = [off for off in bad if scan.get(off) != acked[off]]
            for off in bad:
                self.lost.add((p, off))
                got = scan.get(off)
                why = f"the disk holds {describe_code(got)} there" if got is not None \
                    else f"is not readable on disk: {scan.end()}"
                self.violations.add("records-lost", f"partition {p} offset {off}",
                                    f"{describe_code(acked[off])} acknowledged "
                                    f"({self.where(self.acks.times[p][off])}) {why}")
            self.acks.pending[p] = []
        if full:
            self.check_duplicates()
        if self.broker.alive():
            self.check_commits()

    def check_duplicates(self) -> None:
        """The idempotent producers (mq's default with acks="all"; all but
        ``plain_producer``s): a record sent once is in the log once, however often the
        broker was killed while its batch was in flight."""
        for p, scan in enumerate(self.scans):
            seen: dict[int, int] = {}
            for offset, code in enumerate(scan.codes):
                if code < 0 or plain_producer(code >> 32):
                    continue
                first = seen.setdefault(code, offset)
                if first != offset and (p, offset) not in self.duplicated:
                    self.duplicated.add((p, offset))
                    self.violations.add("duplicate", f"partition {p} offset {offset}",
                                        f"{describe_code(code)} is in the log twice (first at "
                                        f"offset {first}): an idempotent producer's re-send "
                                        "was written again")

    def check_commits(self) -> None:
        from mq.client.admin import Admin
        from mq.errors import MQError
        asked = time.monotonic()
        try:
            with Admin(self.broker.socket, timeout=30) as admin:
                offsets = admin.list_group_offsets(GROUP)
        except MQError as err:
            if self.broker.alive():
                self.violations.add("commit-lost", "OffsetFetch", f"failed: {err!r}")
            return
        answered = time.monotonic()
        self.commits.read(self.ledger_paths["member"])
        self.commits.check({tp.partition: o for tp, o in offsets.items() if tp.topic == TOPIC},
                           asked, answered, self.violations, self.where)

    def read_ledgers(self) -> None:
        self.acks.read(self.ledger_paths["producer"])
        self.commits.read(self.ledger_paths["member"])

    def wait_progress(self, since: float) -> None:
        """Until a record and a commit are acknowledged after ``since`` (``--stall-timeout``);
        meanwhile the broker and the clients must stay up."""
        deadline = time.monotonic() + self.opts.stall_timeout
        while True:
            self.read_ledgers()
            waiting = [what for what, t in (("record", self.acks.last_ack_t),
                                            ("commit", self.commits.last_ack_t))
                       if t <= since and (what == "record" or self.opts.members)]
            if not waiting:
                return
            if self.broker_exited():
                since = time.monotonic()
            self.check_workers()
            if time.monotonic() > deadline:
                self.violations.add("stalled", " and ".join(waiting),
                                    f"none acknowledged within {self.opts.stall_timeout:.0f} s;"
                                    f" broker stderr: {self.broker.stderr_tail(4)}; "
                                    "restarting the broker with kill -9")
                self.broker.kill()
                self.start_broker()
                return
            time.sleep(0.01)                  # polling the ledgers

    # --- actions ----------------------------------------------------------------------------
    def disk_full(self) -> str:
        floor = self.broker.min_free_bytes or 0
        mode = "enospc" if not floor else self.rng.choice(("floor+enospc", "floor"))
        hold = self.rng.uniform(0.2, 0.8)
        t = time.monotonic()
        log_at = self.broker.stderr_size()
        size = self.disk.fill(leave_free=floor // 2 if mode == "floor" else 0)
        free = self.disk.free_bytes()
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline and self.broker.alive():
            time.sleep(0.01)                  # the fault's duration, not a condition
        alive = self.broker.alive()
        self.disk.drain()
        self.episodes.append({"mode": mode, "ballast_bytes": size, "free_bytes": free,
                              "hold_s": round(time.monotonic() - t, 3),
                              "broker_survived": alive,
                              "broker_log_lines": self.broker.stderr_lines_since(log_at)})
        return f"disk-full {mode}"

    def do(self, action: str) -> str:
        if action == "kill-broker":
            self.broker.kill()
            self.start_broker()
            return action
        if action == "term-broker":
            self.clean_stop()
            self.start_broker()
            return action
        if action in ("kill-producer", "kill-member"):
            return f"{action} {self.kill_worker(action.split('-')[1])}"
        if action == "disk-full":
            return self.disk_full() if self.disk.mounted else "disk-full skipped"
        raise ValueError(action)

    def dwell(self) -> None:
        """Let the load run 0-``DWELL_S`` s (seeded), so that faults land at random moments of
        it; the broker and the clients are watched meanwhile."""
        deadline = time.monotonic() + self.rng.uniform(0, DWELL_S)
        while time.monotonic() < deadline:
            self.broker_exited()
            time.sleep(0.01)                  # a random delay, not a condition

    def choose(self, cycle: int) -> str:
        if self.opts.schedule is not None:
            return self.opts.schedule[cycle % len(self.opts.schedule)]
        names = [a for a in self.opts.actions if a != "disk-full" or self.disk.mounted]
        return self.rng.choices(names, weights=[ACTIONS[a] for a in names])[0]

    # --- the whole run ----------------------------------------------------------------------
    def setup(self) -> None:
        if self.opts.disk_full:
            self.disk_note = self.disk.mount()
        else:
            self.disk_note = "--no-disk-full"
        if self.disk_note:
            self.progress(f"full-disk episodes skipped: {self.disk_note}")
        self.floor_key = self.disk.mounted and Broker.has_min_free_bytes()
        if self.disk.mounted and not self.floor_key:
            self.progress("BrokerConfig has no min_free_bytes: every full-disk episode "
                          "reaches ENOSPC inside the broker")
        self.start_broker()
        from mq.client.admin import Admin
        with Admin(self.broker.socket) as admin:
            admin.create_topic(TOPIC, self.opts.partitions,
                               {"segment.bytes": self.opts.segment_bytes})
        for _ in range(self.opts.producers):
            self.start_worker("producer")
        for _ in range(self.opts.members):
            self.start_worker("member")
        self.wait_progress(time.monotonic())
        where = f"a {self.opts.tmpfs_mb} MiB tmpfs" if self.disk.mounted else "the work dir"
        self.progress(f"seed {self.seed}; work dir {self.work}; data dir on {where}; "
                      f"broker pid {self.broker.proc.pid}")

    def run(self) -> None:
        try:
            self.cycles()
        except Aborted as err:
            # Still check what is on disk; the broker stays down. (No mq log check: the last
            # broker did not stop cleanly, so its indexes are legitimately untrimmed.)
            self.aborted = f"in {self.cycle_marks[-1][1] if self.cycle_marks else 'setup'}: {err}"
            self.progress(f"run aborted {self.aborted}")
            self.violations.cycle = "the aborted run"
            self.stop_workers()
            self.check(full=True)

    def cycles(self) -> None:
        self.setup()
        for cycle in range(1, self.opts.cycles + 1):
            action = self.choose(cycle - 1)
            self.dwell()
            self.cycle_marks.append((time.monotonic(), f"cycle {cycle} {action}"))
            self.violations.cycle = f"cycle {cycle} {action}"
            label = self.do(action)
            self.cycle_marks[-1] = (self.cycle_marks[-1][0], f"cycle {cycle} {label}")
            self.violations.cycle = f"cycle {cycle} {label}"
            self.actions[label.split()[0] if not label.startswith("disk-full") else label] += 1
            self.broker_exited()
            self.check_workers()
            self.wait_progress(time.monotonic())
            self.check(full=cycle % self.opts.full_every == 0)
            self.cycles_done = cycle
            if cycle % self.opts.progress_every == 0 or cycle == self.opts.cycles:
                self.progress(f"{cycle}/{self.opts.cycles} cycles, {self.acks.count} acked, "
                              f"{len(self.lost)} lost, {sum(self.violations.count.values())} "
                              f"violations, {time.monotonic() - self.t0:.0f} s")
        self.finish()

    def finish(self) -> None:
        """Stop the clients (SIGTERM), check commits once more, stop the broker cleanly,
        ``mq log check``, and a last full re-check."""
        self.violations.cycle = "the end of the run"
        self.stop_workers()
        self.check()
        self.clean_stop()

    def teardown(self) -> None:
        """Always: every process gone, the tmpfs unmounted, the work dir removed (kept, with a
        copy of the data dir, when something broke or ``keep``), and nothing of the broker's
        left in /dev/shm (a run cut short by an error ends with a kill)."""
        self.stop_workers()
        self.broker.kill()
        if self.broker.proc is not None:
            remove_leftovers(self.data_dir, self.broker.proc.pid)
        keep = self.opts.keep or bool(self.violations.count)
        if keep and self.disk.mounted:
            with contextlib.suppress(OSError, shutil.Error):
                self.disk.drain()
                shutil.copytree(self.data_dir, os.path.join(self.work, "data-copy"),
                                ignore=shutil.ignore_patterns("ballast"))
        self.disk.unmount()
        if self.sock_dir:
            shutil.rmtree(self.sock_dir, ignore_errors=True)
        if keep:
            self.progress(f"work dir kept: {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    def report(self) -> dict:
        elapsed = time.monotonic() - self.t0
        return {
            "seed": self.seed, "cycles": self.cycles_done, "elapsed_s": round(elapsed, 1),
            "records_acked": self.acks.count, "records_lost": len(self.lost),
            "sends_failed": dict(self.acks.failed), "commits_acked": self.commits.acked,
            "commits_failed": self.commits.failed, "member_errors": dict(self.commits.errors),
            "actions": dict(self.actions), "disk_full": self.disk_note or "tmpfs",
            "min_free_bytes_key": self.floor_key, "episodes": self.episodes,
            "broker_starts": self.broker.starts, "log_checks": self.log_checks,
            "full_checks": self.full_checks, "violations": self.violations.summary(),
            "options": {k: v for k, v in dataclasses.asdict(self.opts).items()
                        if k not in ("dir",)},
            "reproduce": repro_command(self.opts, self.seed), "mq_commit": mq_commit(),
            "aborted": self.aborted,
            "work_dir": self.work,
        }


def run(opts: Options, progress: Callable[[str], None] | None = None) -> dict:
    """One chaos run; returns the report (``report["violations"]`` is empty if every invariant
    held). Everything it started is gone and the tmpfs unmounted when it returns or raises."""
    if progress is None:
        def progress(msg: str) -> None:
            print(f"[chaos {time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    CTX.set_forkserver_preload(["bench.chaos_procs", "mq.client.producer",
                                "mq.client.consumer"])
    chaos = Chaos(opts, progress)
    try:
        chaos.run()
    finally:
        chaos.teardown()
    return chaos.report()


def mq_commit() -> str:
    """The git commit of the mq package this run imported (the broker runs the same one)."""
    import mq
    here = os.path.dirname(os.path.abspath(mq.__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here,
                               check=False, capture_output=True, text=True).stdout.strip()
        return head + (" + uncommitted changes under mq/" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return f"unknown (mq from {here}, not a git checkout)"


def repro_command(opts: Options, seed: int) -> str:
    """The command line that replays this run's schedule."""
    cmd = f"python3 -m bench.chaos --seed {seed} --cycles {opts.cycles}"
    default = Options()
    for name in ("partitions", "producers", "members", "rate", "tmpfs_mb"):
        if getattr(opts, name) != getattr(default, name):
            cmd += f" --{name.replace('_', '-')} {getattr(opts, name):g}"
    if tuple(opts.actions) != default.actions:
        cmd += f" --actions {','.join(opts.actions)}"
    if not opts.disk_full:
        cmd += " --no-disk-full"
    return cmd


def print_report(res: dict) -> None:
    acts = ", ".join(f"{k} {v}" for k, v in sorted(res["actions"].items()))
    if res["aborted"]:
        print(f"RUN ABORTED {res['aborted']}")
    print(f"mq chaos run: {res['cycles']} cycles in {res['elapsed_s']:.0f} s "
          f"({res['elapsed_s'] / max(res['cycles'], 1):.2f} s a cycle), seed {res['seed']}, "
          f"mq {res['mq_commit']}")
    print(f"actions: {acts}")
    if res["disk_full"] != "tmpfs":
        print(f"full-disk episodes: skipped ({res['disk_full']})")
    else:
        eps = res["episodes"]
        modes = collections.Counter(e["mode"] for e in eps)
        floor = f"0 or {FLOOR_BYTES >> 20} MiB per broker start" if res["min_free_bytes_key"] \
            else "not a broker setting"
        print(f"full-disk episodes: {len(eps)} ({', '.join(f'{k} {v}' for k, v in modes.items())});"
              f" the broker logged the fault in {sum(e['broker_log_lines'] > 0 for e in eps)}, "
              f"was alive at the end of {sum(e['broker_survived'] for e in eps)}; min_free_bytes "
              f"{floor}")
    print(f"records acknowledged: {res['records_acked']}   records lost: {res['records_lost']}"
          f"   sends failed: {sum(res['sends_failed'].values())} {res['sends_failed'] or ''}")
    print(f"commits acknowledged: {res['commits_acked']}   commits failed: "
          f"{res['commits_failed']} {res['member_errors'] or ''}")
    print(f"broker starts: {res['broker_starts']}   mq log check runs: {res['log_checks']}   "
          f"full re-checks: {res['full_checks']}")
    if not res["violations"]:
        print("violations: none")
    for kind, v in res["violations"].items():
        print(f"VIOLATION {kind} x{v['count']}: {v['first'][0]}")
    if res["violations"]:
        print(f"reproduce: {res['reproduce']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.chaos", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, help="cycles to run (default 300; 30 with --quick; "
                    "1000 is the release bar)")
    ap.add_argument("--seed", type=int, help="RNG seed of the schedule (default: random, "
                    "printed)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--rate", type=float, default=100.0, help="records/s per producer")
    ap.add_argument("--no-disk-full", action="store_true", help="no full-disk episodes")
    ap.add_argument("--tmpfs-mb", type=int, default=64, help="size of the data dir's tmpfs")
    ap.add_argument("--actions", default=",".join(ACTIONS),
                    help=f"the actions to draw from (default all: {','.join(ACTIONS)})")
    ap.add_argument("--full-every", type=int, help="full re-check every N cycles (default 25;"
                    " 10 with --quick)")
    ap.add_argument("--stall-timeout", type=float, default=20.0)
    add_run_arguments(ap, "chaos", wait_idle=False,
                      dir_help="parent of the work dir (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (kept anyway, "
                    "with a copy of the data dir, when an invariant broke)")
    ap.add_argument("--quick", action="store_true", help="30 cycles, full re-check every 10")
    args = ap.parse_args(argv)
    actions = tuple(a for a in args.actions.split(",") if a)
    if not actions or set(actions) - set(ACTIONS):
        ap.error(f"--actions: choose from {', '.join(ACTIONS)}")
    if min(args.partitions, args.producers) < 1 or args.members < 0 or args.rate <= 0:
        ap.error("--partitions, --producers and --rate must be positive, --members >= 0")
    if args.members == 0:
        actions = tuple(a for a in actions if a != "kill-member") or ("kill-broker",)
    opts = Options(cycles=args.cycles or (30 if args.quick else 300), seed=args.seed,
                   partitions=args.partitions, producers=args.producers, members=args.members,
                   disk_full=not args.no_disk_full, rate=args.rate, tmpfs_mb=args.tmpfs_mb,
                   full_every=args.full_every or (10 if args.quick else 25),
                   stall_timeout=args.stall_timeout, actions=actions, dir=args.dir,
                   keep=args.keep)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # unwinds: unmount, kill
    res = run(opts)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print_report(res)
    print(f"JSON: {args.out}")
    return 1 if res["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
