"""Consumer groups under process failures: members killed with SIGKILL and replaced while a
producer process writes, consumers that commit and exit in turn, and the broker killed with
SIGKILL while members consume and commit.

Every consumer is its own process (``group_workers.py``) and writes what it does to an event
file: the listener callbacks and every poll batch, with CLOCK_MONOTONIC times, which all the
processes of the host share. From those files the tests rebuild, per partition, the interval
each process owned it:

- it starts at the ``assigned`` callback, taken before any record of it is returned;
- it ends at the ``revoked`` callback (after which the consumer reports the release to the
  broker, which only then grants the partition to anyone else), or — for a process killed with
  SIGKILL — at the later of the time the parent sent the signal and the last event the process
  wrote: everything it logged happened before it died, and the broker hands its partitions on
  only once its socket closed, that is after it died.

So if the group works, no two processes' intervals of a partition overlap, and every batch lies
inside its process's interval. Records may be processed twice (a killed member's last batch was
processed but not committed), never lost.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import time

import pytest
from brokers import create_topic
from group_workers import read_events, reap, spawn_worker, stop_worker, wait_ready

import mq.testing
from mq.broker.offsets import OFFSETS_TOPIC, decode_key, decode_value
from mq.client.admin import Admin
from mq.client.types import TopicPartition
from mq.errors import GroupIdNotFoundError
from mq.log.log import PartitionLog

TIMEOUT = 30.0          # for each condition; a loaded 2-core CI host needs the headroom
GROUP = "chaos"


# --- bookkeeping --------------------------------------------------------------------------------

class Worker:
    """A consumer process and its event file; ``killed_at`` once the parent sent SIGKILL."""

    def __init__(self, tmp_path, n: int, socket: str, topic: str, **options) -> None:
        self.events = tmp_path / f"worker{n}.jsonl"
        self.proc = spawn_worker("consume", socket=socket, topics=[topic], group=GROUP,
                                 events=str(self.events), **options)
        self.killed_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self) -> list[dict]:
        return read_events(self.events)

    def owned(self) -> set[TopicPartition]:
        owned: set[TopicPartition] = set()
        for e in self.read():
            tps = {TopicPartition(t, p) for t, p in e.get("tps", ())}
            if e["kind"] == "assigned":
                owned |= tps
            elif e["kind"] in ("revoked", "lost"):
                owned -= tps
        return owned

    def kill(self) -> None:
        self.killed_at = time.monotonic()          # before the signal: see the module doc
        self.proc.kill()
        reap(self.proc)


def consumed_values(workers) -> list[str]:
    return [v for w in workers for e in w.read() if e["kind"] == "batch" for v in e["values"]]


def ownership(workers) -> dict[TopicPartition, list[tuple[float, float, int]]]:
    """Per partition, every (start, end, pid) interval a worker owned it (see module doc);
    also checks that each batch lies inside an interval of its own process."""
    out: dict[TopicPartition, list[tuple[float, float, int]]] = collections.defaultdict(list)
    for w in workers:
        events = w.read()
        assert events and events[0]["kind"] == "started", f"worker {w.pid} wrote nothing"
        assert all(e["pid"] == w.pid for e in events)
        assert not [e for e in events if e["kind"] == "lost"], \
            f"worker {w.pid} lost partitions: nobody hung, so nobody should be fenced"
        opened: dict[TopicPartition, float] = {}
        mine: dict[TopicPartition, list[tuple[float, float]]] = collections.defaultdict(list)
        batches = []
        for e in events:
            tps = [TopicPartition(t, p) for t, p in e.get("tps", ())]
            if e["kind"] == "assigned":
                for tp in tps:
                    assert tp not in opened, f"worker {w.pid}: {tp} assigned twice"
                    opened[tp] = e["t"]
            elif e["kind"] == "revoked":
                for tp in tps:
                    mine[tp].append((opened.pop(tp), e["t"]))
            elif e["kind"] == "batch":
                batches.append(e)
        if opened:
            assert w.killed_at is not None, \
                f"worker {w.pid} exited cleanly without revoking {sorted(opened)}"
            end = max(w.killed_at, events[-1]["t"])
            for tp, start in opened.items():
                mine[tp].append((start, end))
        for b in batches:
            tp = TopicPartition(*b["tp"])
            assert any(s <= b["t0"] and b["t"] <= e for s, e in mine[tp]), \
                f"worker {w.pid} consumed {tp} offsets {b['offsets'][:3]}... outside its " \
                f"ownership {mine[tp]}"
        for tp, spans in mine.items():
            out[tp] += [(s, e, w.pid) for s, e in spans]
    return out


def assert_no_overlap(intervals) -> None:
    for tp, spans in intervals.items():
        spans = sorted(spans)
        for (s1, e1, p1), (s2, _, p2) in itertools.pairwise(spans):
            assert e1 <= s2, (f"{tp} owned by {p1} during [{s1:.4f}, {e1:.4f}] and by {p2} "
                              f"from {s2:.4f}: {e1 - s2:.4f} s of overlap")


def wait_settled(socket: str, live, partitions, timeout: float = TIMEOUT) -> None:
    """The broker says Stable with exactly the live workers as members, each partition
    assigned to exactly one, and each worker's listener agrees with the broker."""
    def ok() -> bool:
        try:
            with Admin(socket) as admin:
                d = admin.describe_group(GROUP)
        except GroupIdNotFoundError:
            return False
        by_pid = {m["pid"]: {TopicPartition(t, p) for t, p in m["assignment"]}
                  for m in d["members"]}
        assigned = [tp for m in d["members"] for t, p in m["assignment"]
                    for tp in [TopicPartition(t, p)]]
        return (d["state"] == "Stable" and len(d["members"]) == len(live)
                and set(by_pid) == {w.pid for w in live}
                and sorted(assigned) == sorted(partitions)
                and all(w.owned() == by_pid[w.pid] for w in live))
    mq.testing.wait_for(ok, timeout=timeout, interval=0.02,
                        message=f"the group to settle on {len(live)} member(s)")


class _Scripted:
    """A worker whose events are given (to test the bookkeeping itself)."""

    def __init__(self, pid: int, events: list[tuple], killed_at: float | None = None) -> None:
        self.pid, self.killed_at = pid, killed_at
        self.events = [{"kind": "started", "pid": pid, "t": 0.0}]
        for kind, t, *rest in events:
            e = {"kind": kind, "pid": pid, "t": t}
            if kind == "batch":
                e.update(tp=["x", 0], t0=rest[0], offsets=[0], values=["0"])
            else:
                e["tps"] = [["x", 0]]
            self.events.append(e)

    def read(self) -> list[dict]:
        return self.events


def test_the_bookkeeping_catches_shared_partitions():
    handoff = [_Scripted(1, [("assigned", 1.0), ("batch", 1.2, 1.1), ("revoked", 2.0)]),
               _Scripted(2, [("assigned", 2.1), ("batch", 2.3, 2.2), ("revoked", 3.0)])]
    assert_no_overlap(ownership(handoff))
    early = [handoff[0], _Scripted(2, [("assigned", 1.9), ("revoked", 3.0)])]
    with pytest.raises(AssertionError, match="overlap"):
        assert_no_overlap(ownership(early))
    # A killed worker owns its partitions until the kill, or its last event if that is later.
    killed = _Scripted(1, [("assigned", 1.0), ("batch", 3.5, 3.4)], killed_at=3.0)
    with pytest.raises(AssertionError, match="overlap"):
        assert_no_overlap(ownership([killed, _Scripted(2, [("assigned", 3.2),
                                                            ("revoked", 4.0)])]))
    assert_no_overlap(ownership([killed, _Scripted(2, [("assigned", 3.6), ("revoked", 4.0)])]))
    with pytest.raises(AssertionError, match="outside its ownership"):
        ownership([_Scripted(1, [("assigned", 1.0), ("revoked", 2.0), ("batch", 2.2, 2.1)])])
    with pytest.raises(AssertionError, match="without revoking"):
        ownership([_Scripted(1, [("assigned", 1.0)])])


@pytest.fixture
def cleanup():
    """Processes started by a test: reaped at the end whatever happened."""
    procs = []
    yield procs.append
    for proc in procs:
        reap(proc)


def start_producer(tmp_path, cleanup, socket: str, topic: str, partitions: int, count: int):
    """The ``produce`` worker (``count`` records at 1000/s, acks=all), started; returns it and
    the file it writes the acknowledged sequence numbers to."""
    acked_path = tmp_path / "acked.json"
    producer = spawn_worker("produce", socket=socket, topic=topic, partitions=partitions,
                            count=count, rate=1000, out=str(acked_path))
    cleanup(producer)
    wait_ready(producer)
    return producer, acked_path


def all_acked_and_consumed(producer, acked_path, count: int, workers) -> list[int]:
    """Wait for the producer to exit with all ``count`` records acknowledged, then for the
    workers to have consumed every one; returns the acknowledged sequence numbers."""
    assert producer.wait(TIMEOUT * 2) == 0
    acked = json.loads(acked_path.read_text())
    assert len(acked) == count
    mq.testing.wait_for(lambda: set(consumed_values(workers)) >= set(map(str, acked)),
                        timeout=TIMEOUT, interval=0.05,
                        message="every record to be consumed")
    return acked


# --- members killed and replaced ----------------------------------------------------------------

def test_killed_members_are_replaced_and_no_partition_is_shared(tmp_path, cleanup):
    topic, partitions, count = "chaos", 6, 4000
    every = [TopicPartition(topic, p) for p in range(partitions)]
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, topic, partitions)
        made = 0
        workers: list[Worker] = []

        def start_worker() -> Worker:
            nonlocal made
            w = Worker(tmp_path, made, b.socket, topic, commit="sync", max_records=40)
            made += 1
            cleanup(w.proc)
            workers.append(w)
            return w
        live = [start_worker() for _ in range(3)]
        for w in live:
            wait_ready(w.proc)
        wait_settled(b.socket, live, every)

        producer, acked_path = start_producer(tmp_path, cleanup, b.socket, topic, partitions,
                                              count)

        for victims in (1, 1, 2, 1):
            seen = len(consumed_values(workers))
            mq.testing.wait_for(lambda seen=seen: len(consumed_values(workers)) >= seen + 100
                                or producer.poll() is not None, timeout=TIMEOUT,
                                interval=0.05, message="consumption to progress")
            for w in live[:victims]:                 # the oldest members
                w.kill()
            live = live[victims:]
            wait_settled(b.socket, live, every)
            fresh = [start_worker() for _ in range(victims)]
            for w in fresh:
                wait_ready(w.proc)
            live += fresh
            wait_settled(b.socket, live, every)

        acked = all_acked_and_consumed(producer, acked_path, count, workers)
        for w in live:
            assert stop_worker(w.proc) == 0
    assert_no_overlap(ownership(workers))
    consumed = consumed_values(workers)
    assert set(consumed) == set(map(str, acked))
    # Processed twice only after a kill: at most the victim's last poll batch (max_records=40),
    # processed but not committed; a rebalance hands over after the last batch's commit.
    assert len(consumed) - len(set(consumed)) <= 5 * 40


# --- consume, commit, exit ----------------------------------------------------------------------

def test_each_consumer_resumes_exactly_at_the_previous_commit(tmp_path, cleanup):
    topic, partitions, per_partition, k = "cycles", 3, 20, 12
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, topic, partitions)
        with mq.Producer(socket=b.socket, acks="all", linger_ms=0) as p:
            for i in range(per_partition * partitions):
                p.send(topic, value=str(i).encode(), partition=i % partitions)
            p.flush(TIMEOUT)
        committed = {p: 0 for p in range(partitions)}
        consumed: dict[int, list[int]] = {p: [] for p in range(partitions)}
        for cycle in range(per_partition * partitions // k):
            out = tmp_path / f"cycle{cycle}.json"
            proc = spawn_worker("cycle", socket=b.socket, topic=topic, group=GROUP, k=k,
                                out=str(out))
            cleanup(proc)
            wait_ready(proc)
            assert proc.wait(TIMEOUT) == 0, f"cycle {cycle} failed"
            result = json.loads(out.read_text())
            assert len(result["records"]) == k
            by_partition = collections.defaultdict(list)
            for p, offset in result["records"]:
                by_partition[p].append(offset)
            for p, offsets in by_partition.items():
                assert offsets == list(range(committed[p], committed[p] + len(offsets))), \
                    f"cycle {cycle}, partition {p}: not resumed exactly at {committed[p]}"
                committed[p] += len(offsets)
                consumed[p] += offsets
            assert result["committed"] == {f"{topic}-{p}": committed[p]
                                           for p in range(partitions)}
        with Admin(b.socket) as admin:
            assert admin.list_group_offsets(GROUP) == {TopicPartition(topic, p): per_partition
                                                       for p in range(partitions)}
    assert consumed == {p: list(range(per_partition)) for p in range(partitions)}


# --- the broker killed under committing members -------------------------------------------------

def test_acknowledged_commits_survive_broker_kills(tmp_path, cleanup):
    topic, partitions, count = "durable", 4, 3000
    every = [TopicPartition(topic, p) for p in range(partitions)]
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, topic, partitions)
        workers = [Worker(tmp_path, n, b.socket, topic, commit="sync", max_records=20)
                   for n in range(2)]
        for w in workers:
            cleanup(w.proc)
            wait_ready(w.proc)
        wait_settled(b.socket, workers, every)
        producer, acked_path = start_producer(tmp_path, cleanup, b.socket, topic, partitions,
                                              count)

        def commits() -> list[dict]:
            return [e for w in workers for e in w.read() if e["kind"] == "commit"]
        for _ in range(2):
            before = len(commits())
            mq.testing.wait_for(lambda before=before: len(commits()) >= before + 20,
                                timeout=TIMEOUT, interval=0.05, message="the members to commit")
            killed_at = time.monotonic()
            b.kill()
            acknowledged: dict[TopicPartition, int] = {}
            for e in sorted(commits(), key=lambda e: e["t"]):
                if e["t"] < killed_at:
                    for t, p, offset in e["offsets"]:
                        acknowledged[TopicPartition(t, p)] = offset
            b.start()
            with Admin(b.socket) as admin:
                after = admin.list_group_offsets(GROUP)
            for tp, offset in acknowledged.items():
                assert after.get(tp, -1) >= offset, f"{tp}: commit of {offset} lost"
            # Consumption resumes: each member processes and commits again.
            resumed = time.monotonic()
            mq.testing.wait_for(lambda resumed=resumed: all(
                any(e["kind"] == "commit" and e["t"] > resumed for e in w.read())
                for w in workers), timeout=TIMEOUT, interval=0.05,
                message="both members to commit again")

        acked = all_acked_and_consumed(producer, acked_path, count, workers)
        wait_settled(b.socket, workers, every)
        for w in workers:
            assert stop_worker(w.proc) == 0
        b.stop()
    # Every acknowledged commit is a record of __consumer_offsets (the group's partition).
    stored = set()
    for name in os.listdir(b.data_dir):
        if name.startswith(OFFSETS_TOPIC + "-"):
            with PartitionLog.open(os.path.join(b.data_dir, name)) as plog:
                for batch in plog.batches():
                    for r in batch.records():
                        key = decode_key(bytes(r.key))
                        if key is not None and r.value is not None:
                            stored.add((*key, decode_value(bytes(r.value)).offset))
    for e in commits():
        for t, p, offset in e["offsets"]:
            assert (GROUP, t, p, offset) in stored, f"acknowledged commit {t}-{p}@{offset} lost"
    # Members kept their partitions through the restarts (the group had committed offsets).
    assert_no_overlap(ownership(workers))
    assert set(consumed_values(workers)) == set(map(str, acked))
