"""Consumer-group benchmarks: failover after kill -9, join to first record, group throughput
through a rebalance, offset-commit rates next to the raw fdatasync rate. Every member, the
producer and the committer are real processes (multiprocessing "forkserver": the server
imports mq once, each child then starts in ~20 ms); the broker is ``mq.testing.BrokerProcess``.

::

    python3 -m bench.groups [--quick] [--trials 20] [--members 2,3,4] [--rate 4000]
                            [--only failover,rebalance,commits] [--budget 1200]
                            [--out bench/out/groups.json] [--dir /tmp] [--wait-idle 300]

Sections (``--only``):

- ``failover`` (figures 1 and 2): a group of N members over an 8-partition topic while a
  producer process writes ``--rate`` records/s round-robin (value = its send time). Each
  trial SIGKILLs one member and times, from ``time.monotonic()`` just before ``os.kill``,
  until every partition it owned has had a record consumed by a survivor (the *failover*);
  then it lets a replacement member (a process already started and waiting for "go") join
  and times from "go" - just before it constructs its ``Consumer`` - to its first record
  (the *join*). Both come with a breakdown (assigned, first record, group stable again).
- ``rebalance`` (figure 3): a fresh group of 3 members reads an 8-partition backlog as fast
  as it can; after a steady window a member joins, is killed (-9) or leaves (``close()``).
  Group records/s in the window from that event until every moved partition is consumed
  again, over the steady rate before it (and the worst 50 ms bucket).
- ``commits`` (figure 4): one group member in its own process: ``commit()`` of one
  partition's offset in a loop (each acknowledged after the broker's fsync), and
  ``commit_async`` with callbacks, at most ``ASYNC_WINDOW`` unanswered, completed in
  ``poll(0)``; next to the raw ``write``+``fdatasync`` rate of a file in the broker's data
  dir, measured in the same run, interleaved.

Clock: ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for every process on Linux), so
a time taken in a member is subtracted from one taken here. Prints a table on stdout,
progress on stderr, writes every raw number as JSON. See bench/README.md ("Consumer groups").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import itertools
import multiprocessing as mp
import multiprocessing.connection
import os
import random
import secrets
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
from array import array

import mq
from bench.harness import (
    Rows,
    add_run_arguments,
    finish_run,
    machine_facts,
    mm,
    pct,
    progress_printer,
    quiet_gc,
    rotated,
    run_sections,
    sched_ns,
    wait_idle,
)

# --- goals and references -----------------------------------------------------------------------
GOAL_FAILOVER_P99_MS = 100.0
KAFKA_SESSION_TIMEOUT_MS = 45_000      # Kafka's default session.timeout.ms (KIP-735)
GOAL_REBALANCE_RATIO = 0.5             # group records/s during a rebalance / steady

PARTITIONS = 8
VALUE_SIZE = 100                       # 8 bytes of send time (ns), then filler
# Unanswered commit_async calls at most. Each fsync round acks everything in flight, so the
# rate follows the window until the broker's CPU binds (measured with a busy disk: 1 -> 0.6 k/s,
# 128 -> 5 k/s, 512 -> 12 k/s, 2048 -> 12-33 k/s).
ASYNC_WINDOW = 1024
TPUT_MAX_RECORDS = 2000                # poll(max_records=) in the rebalance section
BUCKET_NS = 50_000_000                 # 50 ms

CTX = mp.get_context("forkserver")
_clock = time.monotonic_ns
_ts = struct.Struct("<q")
_ids = itertools.count()


progress = progress_printer("groups")


def _ms(ns: float) -> float:
    return ns / 1e6


def dist(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    return {"count": len(values), "min": min(values), "median": statistics.median(values),
            "p50": pct(values, 50), "p90": pct(values, 90), "p99": pct(values, 99),
            "max": max(values), "mean": statistics.fmean(values)}


# --- processes ----------------------------------------------------------------------------------

def member_main(name: str, socket: str, topic: str, group: str, mode: str,
                consumer_opts: dict, ctrl, out) -> None:
    """A group member. Sends ("ready"), waits for "go", then constructs its Consumer and
    polls until "stop" (close(): commit and leave) or SIGKILL. Reports assignments and, per
    partition, the first record consumed after each assignment; in "throughput" mode also
    (time, records) per poll, flushed every 50 ms so a kill loses at most that much."""
    send = out.send
    owned: set[int] = set()
    pending: set[int] = set()            # assigned, no record consumed since

    class Listener(mq.ConsumerRebalanceListener):
        def on_partitions_assigned(self, tps):
            ps = sorted(tp.partition for tp in tps)
            owned.update(ps)
            pending.update(ps)
            send(("assigned", name, _clock(), ps))

        def on_partitions_revoked(self, tps):
            self._gone("revoked", tps)

        def on_partitions_lost(self, tps):
            self._gone("lost", tps)

        def _gone(self, kind, tps):
            ps = sorted(tp.partition for tp in tps)
            owned.difference_update(ps)
            pending.difference_update(ps)
            send((kind, name, _clock(), ps))

    throughput = mode == "throughput"
    if throughput:
        quiet_gc()                       # before "go": a collection is not part of joining
    send(("ready", name, os.getpid(), _clock()))
    if ctrl.recv() != "go":
        return
    t_go = _clock()
    c = mq.Consumer(topic, group_id=group, socket=socket, listener=Listener(), **consumer_opts)
    send(("go", name, t_go, _clock()))
    samples = array("q")
    first_empty = None
    last_flush = _clock()
    nbytes = 0
    while True:
        batch = c.poll(20, TPUT_MAX_RECORDS) if throughput else c.poll(50)
        now = _clock()
        if batch:
            n = 0
            for tp, recs in batch.items():
                n += len(recs)
                if tp.partition in pending:
                    pending.discard(tp.partition)
                    r = recs[0]
                    send(("first", name, now, tp.partition, _ts.unpack_from(r.value)[0],
                          r.offset))
                if throughput:
                    for r in recs:
                        nbytes += len(r.value)
            if throughput:
                samples.append(now)
                samples.append(n)
        elif throughput and owned and first_empty is None:
            first_empty = now             # owns partitions, nothing readable: backlog ran out
        if throughput and now - last_flush >= BUCKET_NS:
            send(("samples", name, samples.tobytes(), first_empty))
            samples = array("q")
            last_flush = now
        if ctrl.poll() and ctrl.recv() == "stop":
            if throughput:
                send(("samples", name, samples.tobytes(), first_empty))
            c.close()
            send(("closed", name, _clock(), nbytes))
            return


def producer_main(socket: str, topic: str, rate: float, ctrl, out) -> None:
    """Writes ``rate`` records/s round-robin over the topic's partitions (acks=1, linger 0),
    each value starting with its send time, until "stop"."""
    p = mq.Producer(socket=socket, acks=1, linger_ms=0)
    nparts = len(p.partitions_for(topic))
    filler = b"x" * (VALUE_SIZE - 8)
    out.send(("ready", "producer", os.getpid(), _clock()))
    ctrl.recv()
    t0 = _clock()
    i = 0
    while not ctrl.poll():
        due = (_clock() - t0) * rate / 1e9
        while i < due:
            p.send(topic, _ts.pack(_clock()) + filler, partition=i % nparts)
            i += 1
        time.sleep(0.001)
    ctrl.recv()
    p.flush()
    out.send(("done", "producer", i, (_clock() - t0) / 1e9))
    p.close()


def prefill_main(socket: str, topic: str, partitions: list[int], per_partition: int) -> None:
    """Backlog for the rebalance section: 1 MiB batches, as fast as possible."""
    p = mq.Producer(socket=socket, acks=1, linger_ms=10, batch_size=1 << 20)
    p.partitions_for(topic)
    value = _ts.pack(0) + b"y" * (VALUE_SIZE - 8)
    for _ in range(per_partition):
        for part in partitions:
            p.send(topic, value, partition=part)
    p.flush()
    p.close()


def committer_main(socket: str, topic: str, group: str, ctrl, out) -> None:
    """One member of its own group on a 1-partition topic, committing on command."""
    assigned = []

    class Listener(mq.ConsumerRebalanceListener):
        def on_partitions_assigned(self, tps):
            assigned.extend(tps)

    c = mq.Consumer(topic, group_id=group, socket=socket, listener=Listener(),
                    enable_auto_commit=False)
    deadline = time.monotonic() + 30
    while not assigned and time.monotonic() < deadline:
        c.poll(50)
    if not assigned:
        raise RuntimeError("the committer got no partition within 30 s")
    tp = assigned[0]
    offset = itertools.count(1)
    out.send(("ready", "committer", os.getpid(), _clock()))
    quiet_gc()
    while True:
        cmd = ctrl.recv()
        if cmd[0] == "stop":
            c.close()
            return
        kind, seconds = cmd
        if kind == "sync":
            lat = []
            t0 = _clock()
            end = t0 + seconds * 1e9
            t = t0
            while t < end:
                c.commit({tp: next(offset)})
                t1 = _clock()
                lat.append(t1 - t)
                t = t1
            res = {"n": len(lat), "seconds": (t - t0) / 1e9, "p50_us": pct(lat, 50) / 1e3,
                   "p99_us": pct(lat, 99) / 1e3, "max_us": max(lat) / 1e3}
        else:
            done = [0, 0]                 # completed, failed

            def callback(offsets, err, done=done):
                done[0] += 1
                if err is not None:
                    done[1] += 1
            sent = polls = 0
            t0 = _clock()
            end = t0 + seconds * 1e9
            while _clock() < end:
                if sent - done[0] < ASYNC_WINDOW:
                    c.commit_async({tp: next(offset)}, callback)
                    sent += 1
                else:
                    c.poll(0)
                    polls += 1
            while done[0] < sent and _clock() < end + 10e9:
                c.poll(0)
            t1 = _clock()
            res = {"n": done[0], "sent": sent, "failed": done[1], "polls": polls,
                   "seconds": (t1 - t0) / 1e9, "window": ASYNC_WINDOW}
        last = next(offset) - 1
        res["committed_ok"] = c.committed(tp) == last
        res["rate"] = res["n"] / res["seconds"]
        out.send(("result", "committer", res))


# --- the fleet: processes, their pipes and what they reported ------------------------------------

class TrialError(RuntimeError):
    """A trial that cannot give a figure (e.g. the backlog ran out); the run goes on."""


class Member:
    def __init__(self, name: str, proc, ctrl) -> None:
        self.name, self.proc, self.ctrl = name, proc, ctrl
        self.pid = None
        self.alive = True
        self.started = False             # "go" sent
        self.t_go = self.t_con = None
        self.owned: set[int] = set()
        self.assign_t: dict[int, int] = {}
        self.first_t: dict[int, int] = {}    # first record after the latest assignment
        self.firsts: list[tuple] = []        # (t, partition, send_t, assign_t)
        self.timeline: list[tuple] = []      # (t, kind, partitions) of assigned/revoked/lost
        self.samples = array("q")
        self.first_empty = None
        self.closed_t = None


class Fleet:
    """Child processes and the messages they send over one pipe each (a process killed
    with -9 cannot wedge a shared lock). ``pump`` reads whatever arrived."""

    def __init__(self, socket: str, topic: str, timeout: float = 30.0) -> None:
        self.socket, self.topic, self.timeout = socket, topic, timeout
        self.members: dict[str, Member] = {}
        self.readers: dict = {}
        self.other: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self.procs: list = []
        self.abort_check = lambda: None

    def _start(self, name: str, target, args: tuple):
        r_out, w_out = CTX.Pipe(duplex=False)
        r_ctrl, w_ctrl = CTX.Pipe(duplex=False)
        proc = CTX.Process(target=target, args=(*args, r_ctrl, w_out), name=f"bench-{name}",
                           daemon=True)
        proc.start()
        w_out.close()
        r_ctrl.close()
        self.readers[r_out] = name
        self.procs.append(proc)
        return proc, w_ctrl

    def spawn_member(self, name: str, group: str, mode: str, consumer_opts: dict) -> Member:
        proc, ctrl = self._start(name, member_main,
                                 (name, self.socket, self.topic, group, mode, consumer_opts))
        m = self.members[name] = Member(name, proc, ctrl)
        self.wait_until(lambda: m.pid is not None or not m.alive, f"{name} ready")
        if m.pid is None:
            proc.join(5)
            raise RuntimeError(f"member {name} died before it was ready (exit code "
                               f"{proc.exitcode}); its traceback is above")
        return m

    def start_other(self, name: str, target, args: tuple):
        proc, ctrl = self._start(name, target, args)
        self.wait_until(lambda: self.other[name], f"{name} ready")
        self.other[name].popleft()
        return proc, ctrl

    def go(self, m: Member) -> None:
        m.started = True
        m.ctrl.send("go")

    def kill(self, m: Member) -> int:
        t = _clock()
        os.kill(m.pid, signal.SIGKILL)
        m.alive = False
        return t

    def stop(self, m: Member) -> int:
        t = _clock()
        m.ctrl.send("stop")
        m.alive = False
        return t

    def live(self) -> list[Member]:
        return [m for m in self.members.values() if m.alive and m.started]

    def pump(self, timeout: float) -> None:
        for r in mp.connection.wait(list(self.readers), timeout):
            name = self.readers[r]
            try:
                msg = r.recv()
            except (EOFError, OSError):
                del self.readers[r]
                r.close()
                if name in self.members:
                    self.members[name].alive = False
                continue
            self._handle(msg)

    def _handle(self, msg: tuple) -> None:
        kind, name = msg[0], msg[1]
        m = self.members.get(name)
        if m is None:
            self.other[name].append(msg)
            return
        if kind == "ready":
            m.pid = msg[2]
        elif kind == "go":
            m.t_go, m.t_con = msg[2], msg[3]
        elif kind == "assigned":
            m.timeline.append((msg[2], kind, msg[3]))
            for p in msg[3]:
                m.owned.add(p)
                m.assign_t[p] = msg[2]
                m.first_t.pop(p, None)
        elif kind in ("revoked", "lost"):
            m.timeline.append((msg[2], kind, msg[3]))
            for p in msg[3]:
                m.owned.discard(p)
                m.assign_t.pop(p, None)
                m.first_t.pop(p, None)
        elif kind == "first":
            t, p, send_t = msg[2], msg[3], msg[4]
            m.first_t[p] = t
            m.firsts.append((t, p, send_t, m.assign_t.get(p)))
        elif kind == "samples":
            m.samples.frombytes(msg[2])
            m.first_empty = msg[3]
        elif kind == "closed":
            m.closed_t = msg[2]

    def wait_until(self, cond, what: str, timeout: float | None = None) -> None:
        """Pump until ``cond()``; ``TimeoutError`` after ``timeout`` (default 30 s),
        ``TrialError`` as soon as ``self.abort_check()`` names a reason."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while not cond():
            reason = self.abort_check()
            if reason:
                raise TrialError(f"{reason} (waiting for {what})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout or self.timeout:.0f} s waiting "
                                   f"for {what}")
            self.pump(0.005)

    def settled(self, admin, group: str) -> bool:
        """Every partition owned by exactly one live member, which has consumed from it since
        it was assigned; every member owns some; the broker calls the group Stable."""
        live = self.live()
        counts = collections.Counter(p for m in live for p in m.owned)
        if len(counts) != PARTITIONS or any(v != 1 for v in counts.values()):
            return False
        if any(not m.owned or any(p not in m.first_t for p in m.owned) for m in live):
            return False
        d = admin.describe_group(group)
        return d["state"] == "Stable" and len(d["members"]) == len(live)

    def wait_settled(self, admin, group: str, what: str) -> int:
        """Wait until ``settled``; returns when the last partition was consumed again."""
        last = [0.0]

        def check():
            if time.monotonic() - last[0] < 0.02:
                return False
            last[0] = time.monotonic()
            return self.settled(admin, group)
        self.wait_until(check, what)
        return max(m.first_t[p] for m in self.live() for p in m.owned)

    def close(self) -> None:
        for m in self.members.values():
            with contextlib.suppress(OSError, ValueError):
                m.ctrl.send("stop")
        deadline = time.monotonic() + 5
        for p in self.procs:
            p.join(max(0.05, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join()
        for r in list(self.readers):
            r.close()
        self.readers.clear()


# --- the run context ----------------------------------------------------------------------------

class Ctx:
    def __init__(self, args, base: str, broker) -> None:
        self.args, self.quick, self.base, self.broker = args, args.quick, base, broker
        self.socket = broker.socket
        self.admin = mq.Admin(socket=broker.socket)
        self.deadline = time.monotonic() + args.budget
        self.truncated: list[str] = []

    def topic(self, partitions: int) -> str:
        name = f"g-{next(_ids)}-{secrets.token_hex(2)}"
        self.admin.create_topic(name, partitions)
        return name

    def drop(self, topic: str) -> None:
        with contextlib.suppress(Exception):
            self.admin.delete_topic(topic)

    def out_of_time(self, what: str) -> bool:
        if time.monotonic() < self.deadline:
            return False
        note = f"{what}: stopped early by --budget {self.args.budget:.0f} s"
        if note not in self.truncated:
            self.truncated.append(note)
            progress("warning: " + note)
        return True


# --- 1 + 2: failover and join ---------------------------------------------------------------------

def failover_trials(ctx: Ctx, n_members: int) -> dict:
    topic = ctx.topic(PARTITIONS)
    group = f"fo-{n_members}-{secrets.token_hex(2)}"
    opts = {"session_timeout_ms": KAFKA_SESSION_TIMEOUT_MS, "enable_auto_commit": True,
            "auto_commit_interval_ms": 1000}
    fleet = Fleet(ctx.socket, topic)
    names = (f"m{i}" for i in itertools.count())
    trials, joins, failures = [], [], []
    try:
        _, prod = fleet.start_other("producer", producer_main,
                                    (ctx.socket, topic, ctx.args.rate))
        prod.send("go")
        members = [fleet.spawn_member(next(names), group, "latency", opts)
                   for _ in range(n_members)]
        for m in members:
            fleet.go(m)
        fleet.wait_settled(ctx.admin, group, f"a group of {n_members} to settle")
        want = ctx.args.trials
        for trial in range(want):
            if ctx.out_of_time(f"failover with {n_members} members") and trials:
                break
            spare = fleet.spawn_member(next(names), group, "latency", opts)
            time.sleep(random.uniform(0.2, 0.4))     # settle: auto-commits, heartbeats
            fleet.pump(0)
            live = fleet.live()
            victim = live[trial % len(live)]
            lost = set(victim.owned)
            watched = {m.name: m.pid for m in live if m is not victim}
            watched["broker"] = ctx.broker.pid
            before = {k: sched_ns(pid) for k, pid in watched.items()}
            t_kill = fleet.kill(victim)

            def recovered(lost=lost, t_kill=t_kill):
                return all(any(p in m.first_t and m.assign_t.get(p, 0) > t_kill
                               for m in fleet.live()) for p in lost)
            try:
                fleet.wait_until(recovered, "the victim's partitions to be consumed", 10)
            except TimeoutError as err:
                # Counted as a miss; the group's state is unknown, so the size ends here.
                failures.append({"trial": trial, "stage": "failover", "error": str(err),
                                 "victim_owned": sorted(lost)})
                progress(f"failover trial {trial}: {err}")
                break
            after = {k: sched_ns(pid) for k, pid in watched.items()}
            # How long each process was runnable but off-CPU (other processes had the CPUs)
            # and on-CPU, from the kill until recovery was seen here.
            sched = {k: {"cpu_wait_ms": _ms(after[k][1] - before[k][1]),
                         "on_cpu_ms": _ms(after[k][0] - before[k][0])} for k in watched}
            per = {}
            for p in lost:
                m = next(m for m in fleet.live() if m.assign_t.get(p, 0) > t_kill
                         and p in m.first_t)
                first = next(f for f in m.firsts if f[1] == p and f[0] == m.first_t[p])
                per[p] = {"assigned_ms": _ms(m.assign_t[p] - t_kill),
                          "first_ms": _ms(first[0] - t_kill),
                          "record_age_ms": _ms(first[0] - first[2]), "to": m.name}
            trials.append({"trial": trial, "t_kill_ns": t_kill, "members": len(live),
                           "victim_owned": sorted(lost),
                           "failover_ms": max(v["first_ms"] for v in per.values()),
                           "assigned_ms": max(v["assigned_ms"] for v in per.values()),
                           "partitions": per, "sched": sched,
                           "takers_cpu_wait_ms": max(sched[v["to"]]["cpu_wait_ms"]
                                                     for v in per.values())})
            # Join: the spare constructs its Consumer on "go" (t_go is its own clock read).
            fleet.go(spare)
            try:
                t_stable = fleet.wait_settled(ctx.admin, group, "the replacement to settle")
            except TimeoutError as err:
                failures.append({"trial": trial, "stage": "join", "error": str(err)})
                progress(f"join trial {trial}: {err}")
                break
            t_go = spare.t_go
            moved = [m.assign_t[p] for m in fleet.live() for p in m.owned]
            revoked = [t for m in fleet.live() if m is not spare
                       for t, kind, _ in m.timeline if kind == "revoked" and t >= t_go]
            joins.append({"trial": trial, "t_go_ns": t_go,
                          "construct_ms": _ms(spare.t_con - t_go),
                          "first_revoked_ms": _ms(min(revoked) - t_go) if revoked else None,
                          "assigned_ms": _ms(min(spare.assign_t.values()) - t_go),
                          "first_record_ms": _ms(min(f[0] for f in spare.firsts) - t_go),
                          "group_stable_ms": _ms(t_stable - t_go),
                          "last_assignment_ms": _ms(max(moved) - t_go)})
            progress(f"failover {n_members} members, trial {trial + 1}/{want}: "
                     f"{trials[-1]['failover_ms']:.1f} ms ({len(lost)} partitions); join "
                     f"{joins[-1]['first_record_ms']:.1f} ms")
        prod.send("stop")
        fleet.wait_until(lambda: fleet.other["producer"], "the producer to stop")
        done = fleet.other["producer"].popleft()
        if done[2] < 0.9 * ctx.args.rate * done[3]:
            progress(f"warning: the producer wrote {done[2] / done[3]:.0f} records/s, "
                     f"not {ctx.args.rate:.0f}")
    finally:
        fleet.close()
        ctx.drop(topic)
    fo = [t["failover_ms"] for t in trials]
    return {"members": n_members, "partitions": PARTITIONS, "rate": ctx.args.rate,
            "produced": done[2], "produce_seconds": done[3], "consumer_options": opts,
            "trials": trials, "joins": joins, "failures": failures,
            "failover_ms": dist(fo), "assigned_ms": dist([t["assigned_ms"] for t in trials]),
            "takers_cpu_wait_ms": dist([t["takers_cpu_wait_ms"] for t in trials]),
            "broker_cpu_wait_ms": dist([t["sched"]["broker"]["cpu_wait_ms"] for t in trials]),
            "takers_on_cpu_ms": dist([max(t["sched"][v["to"]]["on_cpu_ms"]
                                          for v in t["partitions"].values()) for t in trials]),
            "join_ms": dist([j["first_record_ms"] for j in joins]),
            "join_assigned_ms": dist([j["assigned_ms"] for j in joins]),
            "join_construct_ms": dist([j["construct_ms"] for j in joins]),
            "join_revoked_ms": dist([j["first_revoked_ms"] for j in joins
                                     if j["first_revoked_ms"] is not None]),
            "join_stable_ms": dist([j["group_stable_ms"] for j in joins])}


def run_failover(ctx: Ctx) -> dict:
    return {str(n): failover_trials(ctx, n) for n in ctx.args.members}


# --- 3: throughput through a rebalance -------------------------------------------------------------

def _records_between(members: list[Member], t0: int, t1: int) -> int:
    total = 0
    for m in members:
        s = m.samples
        for i in range(0, len(s), 2):
            if t0 <= s[i] < t1:
                total += s[i + 1]
    return total


def rebalance_trial(ctx: Ctx, topic: str, event: str, steady_s: float, after_s: float) -> dict:
    group = f"rb-{event}-{secrets.token_hex(3)}"
    opts = {"session_timeout_ms": KAFKA_SESSION_TIMEOUT_MS}
    fleet = Fleet(ctx.socket, topic)
    try:
        members = [fleet.spawn_member(f"m{i}", group, "throughput", opts) for i in range(3)]
        joiner = fleet.spawn_member("joiner", group, "throughput", opts) \
            if event == "join" else None
        fleet.abort_check = lambda: next(
            (f"{m.name}'s partitions ran dry: the backlog is too small for this box's speed"
             for m in fleet.live() if m.first_empty is not None), None)
        for m in members:
            fleet.go(m)
        fleet.wait_settled(ctx.admin, group, "3 members to settle")
        t_steady = _clock()
        while _clock() - t_steady < steady_s * 1e9:
            fleet.pump(0.01)
        if event == "join":
            fleet.go(joiner)
            fleet.wait_until(lambda: joiner.t_go is not None, "the joiner's go")
            t_event = joiner.t_go
        elif event == "kill":
            t_event = fleet.kill(members[1])
        else:
            t_event = fleet.stop(members[1])
        t_stable = fleet.wait_settled(ctx.admin, group, f"the group to settle after {event}")
        t_end = max(t_stable, t_event + BUCKET_NS) + int(after_s * 1e9)
        while _clock() < t_end:
            fleet.pump(0.01)
        for m in fleet.live():
            m.ctrl.send("stop")
        fleet.wait_until(lambda: all(m.closed_t for m in fleet.live()), "members to close")
        everyone = list(fleet.members.values())
    finally:
        fleet.close()
    steady_ns = t_event - t_steady
    steady = _records_between(everyone, t_steady, t_event) / (steady_ns / 1e9)
    window_ns = max(t_stable - t_event, 1)
    window = _records_between(everyone, t_event, t_stable) / (window_ns / 1e9)
    buckets = []
    t = t_steady
    while t + BUCKET_NS <= t_end:
        buckets.append(_records_between(everyone, t, t + BUCKET_NS) / (BUCKET_NS / 1e9))
        t += BUCKET_NS
    steady_buckets = buckets[:int(steady_ns // BUCKET_NS)]
    after = buckets[int(steady_ns // BUCKET_NS):]
    n_win = max(1, -(-window_ns // BUCKET_NS))          # buckets touching the window
    worst = min(after[:n_win + 1]) if after else 0.0
    ran_out = [m.name for m in everyone if m.first_empty is not None and
               m.first_empty < t_end and m.alive]
    return {"event": event, "group": group, "steady_rate": steady, "window_rate": window,
            "timeline": _timeline(everyone, t_event, t_stable),
            "window_ms": _ms(window_ns), "ratio": window / steady if steady else 0.0,
            "worst_bucket_ratio": worst / steady if steady else 0.0,
            "steady_bucket_p50": pct(steady_buckets, 50) if steady_buckets else None,
            "steady_bucket_min": min(steady_buckets) if steady_buckets else None,
            "buckets_from_steady_start": buckets, "event_bucket_index": len(steady_buckets),
            "backlog_ran_out": ran_out}


def _timeline(members: list[Member], t_event: int, t_stable: int) -> dict:
    """ms after the event: the joiner's Consumer() built; the last revocation by an old
    owner; the last assignment; the last moved partition's first record (until stable)."""
    out: dict = {}
    for m in members:
        if m.t_go is not None and m.t_go >= t_event:
            out["construct_ms"] = _ms(m.t_con - t_event)
        for t, kind, ps in m.timeline:
            if t_event <= t <= t_stable:
                key = {"assigned": "last_assigned_ms"}.get(kind, "last_revoked_ms")
                out[key] = max(out.get(key, -1e9), _ms(t - t_event))
                out.setdefault(f"moved_{kind}", []).extend(ps)
        firsts = [f[0] for f in m.firsts if f[3] is not None and f[3] >= t_event]
        if firsts:
            out["last_first_record_ms"] = max(out.get("last_first_record_ms", -1e9),
                                              _ms(max(firsts) - t_event))
    return out


def run_rebalance(ctx: Ctx) -> dict:
    # A fresh group per trial reads from offset 0. 3 members on 2 CPUs read up to ~3 M rec/s,
    # and a member with 2 of the 8 partitions drains each at up to ~0.5 M/s for ~2 s a trial.
    per_partition = 700_000 if ctx.quick else 1_500_000
    steady_s, after_s = (0.4, 0.2) if ctx.quick else (1.0, 0.3)
    trials_per_event = 2 if ctx.quick else 5
    topic = ctx.topic(PARTITIONS)
    progress(f"rebalance: prefilling {PARTITIONS} x {per_partition:,} records of "
             f"{VALUE_SIZE} B")
    t = time.monotonic()
    fillers = [CTX.Process(target=prefill_main, args=(ctx.socket, topic, parts, per_partition))
               for parts in (list(range(0, PARTITIONS, 2)), list(range(1, PARTITIONS, 2)))]
    for p in fillers:
        p.start()
    for p in fillers:
        p.join()
    if any(p.exitcode for p in fillers):
        raise RuntimeError("a prefill producer failed")
    progress(f"rebalance: prefill took {time.monotonic() - t:.1f} s")
    out: dict = {"per_partition": per_partition, "steady_s": steady_s, "after_s": after_s,
                 "members": 3, "max_records": TPUT_MAX_RECORDS, "trials": []}
    try:
        for i in range(trials_per_event):
            for event in ("join", "kill", "close"):
                if ctx.out_of_time("rebalance") and out["trials"]:
                    break
                try:
                    r = rebalance_trial(ctx, topic, event, steady_s, after_s)
                except (TrialError, TimeoutError) as err:
                    out.setdefault("failures", []).append({"event": event, "error": str(err)})
                    progress(f"rebalance {event} {i + 1}/{trials_per_event} failed: {err}")
                    continue
                out["trials"].append(r)
                progress(f"rebalance {event} {i + 1}/{trials_per_event}: steady "
                         f"{r['steady_rate'] / 1e6:.2f} M/s, window {r['window_ms']:.1f} ms at "
                         f"{r['window_rate'] / 1e6:.2f} M/s = {r['ratio']:.2f}x, worst 50 ms "
                         f"bucket {r['worst_bucket_ratio']:.2f}x"
                         + (f"; BACKLOG RAN OUT ({r['backlog_ran_out']})"
                            if r["backlog_ran_out"] else ""))
    finally:
        ctx.drop(topic)
    for event in ("join", "kill", "close"):
        rs = [r for r in out["trials"] if r["event"] == event and not r["backlog_ran_out"]]
        if rs:
            out[event] = {k: dist([r[k] for r in rs]) for k in
                          ("ratio", "worst_bucket_ratio", "window_ms", "steady_rate",
                           "window_rate")}
    return out


# --- 4: commit rates ------------------------------------------------------------------------------

def raw_fsync_rate(directory: str, seconds: float) -> dict:
    """``write`` of 128 bytes + ``fdatasync`` in a loop on a fresh file (an offset commit's
    record is about that size), for ``seconds``."""
    path = os.path.join(directory, f"fsync-{secrets.token_hex(4)}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    block = os.urandom(128)
    n = 0
    try:
        t0 = _clock()
        end = t0 + seconds * 1e9
        t = t0
        while t < end:
            os.write(fd, block)
            os.fdatasync(fd)
            n += 1
            t = _clock()
    finally:
        os.close(fd)
        os.unlink(path)
    return {"n": n, "seconds": (t - t0) / 1e9, "rate": n / ((t - t0) / 1e9)}


def run_commits(ctx: Ctx) -> dict:
    runs = 3 if ctx.quick else 5
    seconds = 0.5 if ctx.quick else 1.5
    topic = ctx.topic(1)
    fleet = Fleet(ctx.socket, topic)
    res: dict = {"runs": runs, "seconds": seconds, "window": ASYNC_WINDOW,
                 "sync": [], "async": [], "raw": []}
    try:
        _, ctrl = fleet.start_other("committer", committer_main,
                                    (ctx.socket, topic, f"cg-{secrets.token_hex(2)}"))
        for r in range(runs):
            progress(f"commits: run {r + 1}/{runs}")
            for kind in rotated(["raw", "sync", "async"], r):
                if kind == "raw":
                    res["raw"].append(raw_fsync_rate(ctx.broker.data_dir, seconds))
                    continue
                ctrl.send((kind, seconds))
                fleet.wait_until(lambda: fleet.other["committer"], f"{kind} commits")
                res[kind].append(fleet.other["committer"].popleft()[2])
        ctrl.send(("stop",))
    finally:
        fleet.close()
        ctx.drop(topic)
    for k in ("sync", "async", "raw"):
        res[f"{k}_rate"] = dist([x["rate"] for x in res[k]])
    for k in ("sync", "async"):
        res[f"{k}_vs_fsync"] = dist([a["rate"] / b["rate"]
                                     for a, b in zip(res[k], res["raw"], strict=True)])
    res["all_committed_ok"] = all(x["committed_ok"] for k in ("sync", "async") for x in res[k])
    return res


# --- table ----------------------------------------------------------------------------------------

def _d(d: dict, fmt="{:.1f}") -> str:
    return " / ".join(fmt.format(d[k]) for k in ("p50", "p99", "max"))


def build_table(res: dict) -> list[dict]:
    rows = Rows()
    row = rows.add
    f0, f2 = "{:.0f}".format, "{:.2f}".format

    def vs_kafka(p99: float) -> str:
        return (f"p99 = {p99 / KAFKA_SESSION_TIMEOUT_MS:.5f}x Kafka session timeout "
                f"(1/{KAFKA_SESSION_TIMEOUT_MS / p99:.0f})")

    fos = res.get("failover") or {}
    for n, fo in fos.items():
        d = fo["failover_ms"]
        misses = [f for f in fo["failures"] if f["stage"] == "failover"]
        if d["count"]:
            fail = f", {len(misses)} timed out" if misses else ""
            row(f"failover after kill -9, {n} members, {PARTITIONS} partitions "
                f"({d['count']} trials{fail})", "p50 / p99 / max " + _d(d), "ms",
                vs_kafka(d["p99"]), f"p99 <= {GOAL_FAILOVER_P99_MS:g} ms",
                "yes" if d["p99"] <= GOAL_FAILOVER_P99_MS and not misses else "NO")
            row("  of which: kill -> last partition assigned to a survivor",
                "p50 / p99 / max " + _d(fo["assigned_ms"]), "ms")
            row("  meanwhile: taker runnable but off-CPU / taker on-CPU / broker off-CPU",
                f"p50 {fo['takers_cpu_wait_ms']['p50']:.1f} / "
                f"{fo['takers_on_cpu_ms']['p50']:.1f} / {fo['broker_cpu_wait_ms']['p50']:.1f}; "
                f"p99 {fo['takers_cpu_wait_ms']['p99']:.1f} / "
                f"{fo['takers_on_cpu_ms']['p99']:.1f} / {fo['broker_cpu_wait_ms']['p99']:.1f}",
                "ms")
        j = fo["join_ms"]
        if j["count"]:
            row(f"join -> first record, member {n} joining {int(n) - 1} ({j['count']} trials)",
                "p50 / p99 / max " + _d(j), "ms")
            row("  of which: Consumer() built / an old owner revoked / first assigned (p50)",
                f"{fo['join_construct_ms']['p50']:.1f} / "
                f"{fo['join_revoked_ms'].get('p50', float('nan')):.1f} / "
                f"{fo['join_assigned_ms']['p50']:.1f}", "ms")
            row("  join -> group stable (every moved partition consumed)",
                "p50 / p99 / max " + _d(fo["join_stable_ms"]), "ms")
    if len(fos) > 1:
        pooled = dist([t["failover_ms"] for fo in fos.values() for t in fo["trials"]])
        misses = sum(f["stage"] == "failover" for fo in fos.values() for f in fo["failures"])
        if pooled["count"]:
            row(f"failover after kill -9, all sizes ({pooled['count']} trials)",
                "p50 / p99 / max " + _d(pooled), "ms", vs_kafka(pooled["p99"]),
                f"p99 <= {GOAL_FAILOVER_P99_MS:g} ms",
                "yes" if pooled["p99"] <= GOAL_FAILOVER_P99_MS and not misses else "NO")
        joins = dist([j["first_record_ms"] for fo in fos.values() for j in fo["joins"]])
        if joins["count"]:
            row(f"join -> first record, all sizes ({joins['count']} trials)",
                "p50 / p99 / max " + _d(joins), "ms")
    rb = res.get("rebalance")
    if rb:
        for event, what in (("join", "a 4th member joins"), ("kill", "a member is killed -9"),
                            ("close", "a member leaves (close)")):
            e = rb.get(event)
            if not e:
                continue
            r = e["ratio"]
            row(f"group rec/s while {what} (3 members, {r['count']} trials)",
                f"{e['window_rate']['median'] / 1e6:.2f} M/s over "
                f"{e['window_ms']['median']:.0f} ms; steady {e['steady_rate']['median'] / 1e6:.2f}"
                " M/s", "rec/s",
                f"{mm(r, f2)}x steady; worst 50 ms {mm(e['worst_bucket_ratio'], f2)}x",
                f">= {GOAL_REBALANCE_RATIO:g}x steady",
                "yes" if r["median"] >= GOAL_REBALANCE_RATIO else "NO")
    cm = res.get("commits")
    if cm:
        for k, what in (("sync", "commit() in a loop"),
                        ("async", f"commit_async, <= {cm['window']} in flight")):
            extra = ""
            if k == "sync":
                lat = [x["p50_us"] for x in cm["sync"]]
                p99 = [x["p99_us"] for x in cm["sync"]]
                extra = (f"; latency p50 {statistics.median(lat):.0f} us, p99 "
                         f"{statistics.median(p99):.0f} us")
            row(f"commits/s, one partition, {what}", mm(cm[f"{k}_rate"], f0) + extra,
                "commits/s", f"{mm(cm[f'{k}_vs_fsync'], f2)}x fdatasync rate")
        row("write 128 B + fdatasync in the data dir (limit)", mm(cm["raw_rate"], f0),
            "fsyncs/s")
    return rows


# --- main -----------------------------------------------------------------------------------------

SECTIONS = ("failover", "rebalance", "commits")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.groups", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="5 failover trials, 3 members only, shorter windows (about 1 minute)")
    p.add_argument("--trials", type=int, default=None,
                   help="failover (and join) trials per group size (default 20, 5 quick)")
    p.add_argument("--members", default=None,
                   help="comma-separated group sizes for failover (default 2,3,4; 3 quick)")
    p.add_argument("--rate", type=float, default=4000.0,
                   help="records/s the producer writes during failover trials")
    p.add_argument("--only", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--budget", type=float, default=1200.0, metavar="SECONDS",
                   help="stop starting trials after this long (at least one runs per part)")
    add_run_arguments(p, "groups", dir_help="parent of the temp dir (a real disk)")
    args = p.parse_args(argv)
    args.trials = args.trials or (5 if args.quick else 20)
    args.members = [int(x) for x in (args.members or ("3" if args.quick else "2,3,4"))
                    .split(",")]
    if any(not 2 <= n <= PARTITIONS for n in args.members):
        p.error(f"--members: group sizes between 2 and {PARTITIONS}")
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Not bench.groups itself: each child runs it as __mp_main__ (runpy warns if the server
    # had imported it under its own name). Its imports are what cost.
    CTX.set_forkserver_preload(["mq.client.consumer", "mq.client.producer", "bench.harness"])
    idle = wait_idle(args.wait_idle, progress=progress)
    base = tempfile.mkdtemp(prefix="mq-groups-", dir=args.dir)
    broker = None
    t_start = time.monotonic()
    try:
        meta = machine_facts(base, wait_idle=idle, start_method="forkserver")
        res: dict = {"meta": meta, "params": {
            "quick": args.quick, "trials": args.trials, "members": args.members,
            "rate": args.rate, "budget_s": args.budget, "sections": only,
            "partitions": PARTITIONS, "value_size": VALUE_SIZE}}
        broker = mq.testing.BrokerProcess(os.path.join(base, "mq-data")).start()
        progress(f"temp dir {base}; broker pid {broker.pid}")
        ctx = Ctx(args, base, broker)
        fns = {"failover": run_failover, "rebalance": run_rebalance, "commits": run_commits}
        try:
            run_sections({k: functools.partial(f, ctx) for k, f in fns.items()}, only, res,
                         meta.setdefault("contention", {}), progress=progress)
        finally:
            ctx.admin.close()
        res["truncated"] = ctx.truncated
        finish_run("mq consumer-group benchmarks", res, build_table, args.out,
                   time.monotonic() - t_start, "quick" if args.quick else "",
                   notes=ctx.truncated)
    finally:
        if broker is not None:
            broker.close()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
