"""Supervision with real processes: kill -9 of a child under load (its partitions move to the
others at once, nothing is lost, only its uncommitted records run twice), kill -9 of the
supervisor (no child survives), a crash loop (stops and says so), a hung handler (killed,
counted, dead-lettered after its attempts), a child that dies in its handler (the death spends
an attempt), SIGHUP (every child replaced, nothing lost or run twice).

Timings are printed, never asserted: ``bench/workers.py`` measures them.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
from wk_pool import (
    TIMEOUT,
    Feeder,
    Pool,
    calls,
    caught_up,
    committed,
    produce,
    read_all,
    read_events,
)

import mq
import mq.testing


def create(b, name: str, partitions: int) -> None:
    with mq.Admin(b.socket) as admin:
        admin.create_topic(name, partitions)


def dead_letters(b, topic: str = "jobs.dlq") -> list:
    return read_all(b.socket, topic)


def test_kill9_child_under_load(broker, tmp_path, pools):
    """Three children share six partitions while a feeder writes 1,500 records/s; one child
    is killed with SIGKILL. The others take its partitions and handle them again at once; in
    the end every record was handled, and the only ones handled twice were the killed
    child's uncommitted tail of each of its partitions."""
    create(broker, "jobs", 6)
    feeder = Feeder(broker.socket, "jobs", 6, rate=1500)
    feeder.start()
    pools(feeder)
    pool = Pool(tmp_path, broker.socket, processes=3, env={"WK_SLEEP_MS": "0.2"})
    pools(pool)
    pool.wait_ready()

    def busy_pids() -> set[int]:
        recent = time.monotonic_ns() - 300_000_000
        return {e["pid"] for e in read_events(pool.events) if e["t"] > recent}
    pool.wait_for(lambda: len(busy_pids()) == 3, "all three children to handle records")
    victim = pool.child_pids()[0]

    def owned_by_victim(until: int) -> set[int]:
        last: dict[int, int] = {}
        for e in read_events(pool.events):
            if e["t"] < until:
                last[e["partition"]] = e["pid"]
        return {p for p, pid in last.items() if pid == victim}

    def victim_committed() -> bool:
        owned, done = owned_by_victim(time.monotonic_ns()), committed(broker.socket, "g")
        return bool(owned) and all(done.get(mq.TopicPartition("jobs", p), 0) > 0
                                   for p in owned)
    pool.wait_for(victim_committed, "the victim to commit on each of its partitions")
    before = committed(broker.socket, "g")          # nothing below these may run again
    killed_at = time.monotonic_ns()
    os.kill(victim, signal.SIGKILL)
    moved = owned_by_victim(killed_at)
    assert moved, "the victim owned no partition"

    def taken_over() -> dict[int, int]:
        first: dict[int, int] = {}
        for e in read_events(pool.events):
            if e["t"] > killed_at and e["pid"] != victim and e["partition"] in moved:
                first.setdefault(e["partition"], e["t"])
        return first
    pool.wait_for(lambda: set(taken_over()) == moved, "the victim's partitions to move")
    failover_ms = (max(taken_over().values()) - killed_at) / 1e6
    print(f"kill -9 of a child: its {len(moved)} partitions handled again after "
          f"{failover_ms:.1f} ms")
    pool.wait_for(lambda: sum(s["deaths"] for s in pool.slots()) == 1 and
                  sorted(s["state"] for s in pool.slots()) == ["running"] * 3,
                  "the victim's slot to be restarted")

    acked = feeder.stop()
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")
    assert pool.stop() == 0, pool.stderr()

    records = {(r.partition, r.offset): r.value for r in read_all(broker.socket, "jobs")}
    assert sorted(records.values()) == sorted(acked)
    events = read_events(pool.events)
    done = calls(events, "done")
    assert set(done) == set(records), "a record was never handled"
    started = calls(events, "call")
    twice = {k for k, n in started.items() if n > 1}
    first_by: dict[tuple[int, int], int] = {}
    for e in events:
        if e["kind"] == "call":
            first_by.setdefault((e["partition"], e["offset"]), e["pid"])
    assert all(first_by[k] == victim for k in twice), "a survivor's record ran twice"
    for p in {p for p, _ in twice}:
        victims = sorted(o for (q, o), pid in first_by.items() if q == p and pid == victim)
        again = sorted(o for q, o in twice if q == p)
        assert again == victims[len(victims) - len(again):], \
            f"partition {p}: what ran twice is not the victim's uncommitted tail"
    # Behaviour, not timing: a record the group had committed before the kill never runs
    # again (how long the tail is depends on how far commits lag on a loaded box).
    for p, o in twice:
        assert o >= before.get(mq.TopicPartition("jobs", p), 0), \
            f"partition {p}: offset {o} ran twice though {before} was committed before the kill"
    print(f"{len(twice)} records ran twice (the victim's uncommitted tail), "
          f"{len(records)} in all")


def test_kill9_supervisor_leaves_no_child(broker, tmp_path, pools):
    create(broker, "jobs", 3)
    pool = Pool(tmp_path, broker.socket, processes=3)
    pools(pool)
    pool.wait_ready()
    children = psutil.Process(pool.proc.pid).children(recursive=True)
    assert len(children) == 3
    pool.proc.kill()
    pool.proc.wait()

    def gone(p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_ZOMBIE      # dead, not reaped by our init
        except psutil.NoSuchProcess:
            return True
    mq.testing.wait_for(lambda: all(gone(p) for p in children), timeout=TIMEOUT,
                        message="every child to die with the supervisor")


def test_crash_loop_stops_and_reports(broker, tmp_path, pools):
    """Children that die at start (the handler's module fails in them) are restarted with
    backoff, then their slots stop; with every slot stopped the pool exits 1."""
    create(broker, "jobs", 2)
    pool = Pool(tmp_path, broker.socket, handler="wk_broken:handle", processes=2)
    pools(pool)
    assert pool.wait() == 1
    err = pool.stderr()
    assert err.count("crash loop: 5 deaths within 10 s before joining the group") == 2, err
    assert "cannot reach the database" in err
    assert "every slot is stopped by a crash loop" in err


def test_hung_handler_is_killed_counted_and_dead_lettered(broker, tmp_path, pools):
    create(broker, "jobs", 2)
    create(broker, "jobs.dlq", 1)
    produce(broker.socket, "jobs", [b"hang-1" if i == 10 else b"v%d" % i for i in range(40)],
            partition=lambda i: i % 2)
    pool = Pool(tmp_path, broker.socket, processes=2,
                args=["--handler-timeout-s", "1", "--max-retries", "1",
                      "--dead-letter-topic", "jobs.dlq", "--retry-backoff-ms", "10"])
    pools(pool)
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")
    [dead] = dead_letters(broker)
    headers = dict(dead.headers)
    assert headers["mq.dlq.error"].startswith(b"HandlerTimeout: the handler ran longer than "
                                              b"handler_timeout_s=1 s")
    assert (headers["mq.dlq.partition"], headers["mq.dlq.offset"]) == (b"0", b"5")
    assert headers["mq.dlq.attempts"] == b"2"
    assert dead.value == b"hang-1"
    assert sum(s["hang_kills"] for s in pool.slots()) == 2
    assert sum(s["incarnations"] for s in pool.slots()) == 4
    events = read_events(pool.events)
    assert calls(events)[(0, 5)] == 2
    assert set(calls(events, "done")) == {(p, o) for p in (0, 1) for o in range(20)} - {(0, 5)}
    assert pool.stop() == 0


def test_death_in_the_handler_spends_an_attempt(broker, tmp_path, pools):
    """A record that kills its child each time (segfault, OOM kill) is not redelivered
    forever: each death is a failed attempt, then it is dead-lettered."""
    create(broker, "jobs", 1)
    create(broker, "jobs.dlq", 1)
    produce(broker.socket, "jobs", [b"crash" if i == 3 else b"v%d" % i for i in range(10)])
    pool = Pool(tmp_path, broker.socket, processes=1,
                args=["--max-retries", "1", "--dead-letter-topic", "jobs.dlq"])
    pools(pool)
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")
    [dead] = dead_letters(broker)
    headers = dict(dead.headers)
    assert headers["mq.dlq.error"] == (b"ChildDied: the child died while handling the record "
                                       b"(exit status 13)")
    assert headers["mq.dlq.attempts"] == b"2"
    assert calls(read_events(pool.events))[(0, 3)] == 2
    assert sum(s["deaths"] for s in pool.slots()) == 2
    assert pool.stop() == 0


def test_sighup_replaces_every_child_without_loss_or_repeat(broker, tmp_path, pools):
    create(broker, "jobs", 4)
    feeder = Feeder(broker.socket, "jobs", 4, rate=800)
    feeder.start()
    pools(feeder)
    pool = Pool(tmp_path, broker.socket, processes=2)
    pools(pool)
    pool.wait_ready()
    before = set(pool.child_pids())
    pool.send_signal(signal.SIGHUP)
    pool.wait_for(lambda: "every slot has a new child" in pool.stderr(), "the rolling restart")
    after = set(pool.child_pids())
    assert len(after) == 2 and not before & after
    assert [s["incarnations"] for s in pool.slots()] == [2, 2]
    feeder.stop()
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")
    assert [s["deaths"] for s in pool.slots()] == [0, 0]
    assert pool.stop() == 0
    done = calls(read_events(pool.events), "done")
    records = read_all(broker.socket, "jobs")
    assert set(done) == {(r.partition, r.offset) for r in records}
    assert [k for k, n in done.items() if n > 1] == [], "a record ran twice"
