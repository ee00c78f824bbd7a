"""Worker pools on a Kafka cluster (issue 24): ``mq workers run --bootstrap-server`` with the
contract the local tests hold pools to — retries and dead letters, redrive, hang kills, two
pools of one group splitting the partitions, exactly-once outputs across a child killed with
SIGKILL, a drain on SIGTERM that a restart repeats nothing of, and an exactly-once pool that
goes on while a Kafka node is killed (on the cluster only). Each test runs on every bootstrap of
``cluster``: mq's own Kafka listener and a real three-node Apache Kafka cluster, held to one
contract, with a plain handler and with an ``async def`` one (``handler``).

The pools read their librdkafka properties from a ``--command-config`` file: a session timeout
of 6 s (Kafka's minimum; 45 s by default), after which the group drops a member killed with
SIGKILL and gives its partitions to the others, and heartbeats every 0.5 s, which carry
rebalances to the members. The Kafka cluster is shared by the run's tests, so every test names
its topics and group uniquely.

On a cluster a consumer's position stops before the transaction markers (and aborted
records) that end a partition, where the local one moves past them: ``read_all(...,
markers=True)`` appends a plain record to each partition and reads up to it.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
import uuid

import pytest
from wk_handlers import parse_output, transform
from wk_pool import (
    Cluster,
    Feeder,
    Pool,
    calls,
    caught_up,
    committed,
    coordinator_not_ready,
    mq_run,
    produce,
    read_all,
    read_events,
)

import mq
import mq.testing
from tests.integration.brokers import kafka_listener

KAFKA_CONFIG = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
# For a test that kills no child: librdkafka's default session. With 6 s, a child whose
# heartbeats went unanswered that long on a loaded box (a test beside it killing and
# restarting a Kafka node) lost its partitions, and their next owner handled again what it
# had done since its last commit, which a test of "nothing runs twice" cannot allow.
PATIENT_CONFIG = {**KAFKA_CONFIG, "session.timeout.ms": 45000}
TIMEOUT = 90.0             # a condition that waits for a dead member's session to expire


@pytest.fixture(params=["mq", "kafka"])
def cluster(request, tmp_path):
    """The bootstrap a test's pools run on: ``mq`` (a broker of the test's own with a Kafka
    listener) or ``kafka`` (the run's three-node Apache Kafka cluster, ``kafka_cluster``)."""
    if request.param == "mq":
        with kafka_listener(tmp_path) as (_, address):
            yield Cluster(address, KAFKA_CONFIG)
    else:
        yield Cluster(request.getfixturevalue("kafka_cluster").bootstrap, KAFKA_CONFIG)


@pytest.fixture(params=["handle", "ahandle"])
def handler(request):
    """The pools' handler: a plain function, or an ``async def`` (``mq.aio``'s clients)."""
    return f"wk_handlers:{request.param}"


@pytest.fixture
def name():
    """``name("in")``: a topic or group name of this test's own."""
    tag = uuid.uuid4().hex[:8]
    return lambda what: f"{what}-{tag}"


def create(cluster: Cluster, partitions: dict[str, int]) -> None:
    """Create the topics, then wait until the cluster's metadata lists them."""
    with mq.Admin(bootstrap_servers=cluster.bootstrap) as admin:
        for topic, count in partitions.items():
            admin.create_topic(topic, count)
        mq.testing.wait_for(lambda: set(partitions) <= set(admin.list_topics()), timeout=30,
                            message="the new topics in the metadata")


def progressed(pool: Pool, since: int, feeder: Feeder | None = None):
    """A condition: a record was handled after ``since`` (CLOCK_MONOTONIC ns). With a
    ``feeder``, what stopped it is raised: the pool cannot progress without input. Its
    ``explain()``, shown when the wait times out, says how long ago the last record was
    handled and what the feeder wrote meanwhile (a stall of the input, or of the pool)."""
    def check() -> bool:
        if feeder is not None:
            feeder.check()
        return any(e["t"] > since and e["kind"] == "done"
                   for e in read_events(pool.events)[-200:])

    def explain() -> str:
        done = [e for e in read_events(pool.events) if e["kind"] == "done"]
        last = (f"the last record handled {(time.monotonic_ns() - done[-1]['t']) / 1e9:.1f} s "
                f"ago ({done[-1]['partition']}@{done[-1]['offset']}, pid {done[-1]['pid']})"
                if done else "no record handled")
        return f"{last}; {feeder.state() if feeder is not None else 'no feeder'}"
    check.explain = explain
    return check


def test_retries_dead_letters_and_redrive(cluster, handler, tmp_path, pools, name):
    source, dlq, out, group = name("in"), name("dlq"), name("out"), name("g")
    create(cluster, {source: 2, dlq: 1, out: 2})
    values = [b"poison%d" % i if i in (5, 16) else b"v%02d" % i for i in range(30)]
    produce(cluster, source, values, partition=lambda i: i % 2)
    fixed = tmp_path / "fixed"
    pool = Pool(tmp_path, cluster, handler, topics=(source,), group=group, processes=2,
                args=["--dead-letter-topic", dlq, "--max-retries", "2",
                      "--retry-backoff-ms", "10"],
                env={"WK_OUTPUT": out, "WK_FIXED": str(fixed)})
    pools(pool)
    pool.wait_for(lambda: caught_up(cluster, group, source), "every record handled",
                  timeout=TIMEOUT)
    good = {v for v in values if not v.startswith(b"poison")}
    done = {e["value"].encode() for e in read_events(pool.events) if e["kind"] == "done"}
    assert done == good
    assert {parse_output(r.value)[2] for r in read_all(cluster, out)} == good

    dead = read_all(cluster, dlq)
    assert sorted(r.value for r in dead) == [b"poison16", b"poison5"]
    for r in dead:
        headers = dict(r.headers)
        assert headers["mq.dlq.topic"] == source.encode()
        assert headers["mq.dlq.attempts"] == b"3"
        assert headers["mq.dlq.group"] == group.encode()
        assert headers["mq.dlq.error"].startswith(b"ValueError: poison")
    rows = [json.loads(line) for line in
            mq_run("workers", "stats", "--file", pool.stats_path, "--json").out.splitlines()]
    assert sum(row["dead_lettered"] for row in rows) == 2
    assert sum(row["failed"] for row in rows) == 6
    assert sum(row["handled"] for row in rows) == len(good)

    fixed.touch()
    redrive = ("workers", "redrive", dlq, "--bootstrap-server", cluster.bootstrap)
    moved = mq_run(*redrive, "--json")
    assert moved.code == 0, moved
    assert sorted((m["offset"], m["to"]) for m in map(json.loads, moved.out.splitlines())) \
        == [(0, source), (1, source)]
    pool.wait_for(lambda: {b"poison5", b"poison16"} <= {
        e["value"].encode() for e in read_events(pool.events) if e["kind"] == "done"},
        "the redriven records handled", timeout=TIMEOUT)
    again = mq_run(*redrive)
    assert again.code == 0 and "moved 0 record(s)" in again.err, again
    assert pool.stop() == 0, pool.stderr()[-4000:]


def test_a_hung_handler_is_killed_and_dead_lettered(cluster, tmp_path, pools, name):
    """Hang detection on a cluster: the supervisor kills a child stuck past
    ``--handler-timeout-s``; its partitions go on with another member once the group drops
    the dead one (the session timeout), and the record's last attempt is dead-lettered."""
    source, dlq, group = name("in"), name("dlq"), name("g")
    create(cluster, {source: 2, dlq: 1})
    produce(cluster, source, [b"hang-1" if i == 10 else b"v%d" % i for i in range(40)],
            partition=lambda i: i % 2)
    pool = Pool(tmp_path, cluster, topics=(source,), group=group, processes=2,
                args=["--handler-timeout-s", "1", "--max-retries", "1",
                      "--dead-letter-topic", dlq, "--retry-backoff-ms", "10"])
    pools(pool)
    pool.wait_for(lambda: caught_up(cluster, group, source), "every record handled",
                  timeout=TIMEOUT)
    [dead] = read_all(cluster, dlq)
    headers = dict(dead.headers)
    assert dead.value == b"hang-1"
    assert headers["mq.dlq.error"].startswith(b"HandlerTimeout: the handler ran longer than "
                                              b"handler_timeout_s=1 s")
    assert headers["mq.dlq.attempts"] == b"2"
    assert sum(s["hang_kills"] for s in pool.slots()) == 2
    assert set(calls(read_events(pool.events), "done")) == \
        {(p, o) for p in (0, 1) for o in range(20)} - {(0, 5)}
    assert pool.stop() == 0, pool.stderr()[-4000:]


def test_two_pools_of_one_group_split_the_partitions(cluster, handler, tmp_path, pools, name):
    """Two pools ("hosts") of one group: four members, a partition each, every record
    handled once; ``mq workers stats GROUP`` shows both pools' tables."""
    source, group = name("in"), name("g")
    create(cluster, {source: 4})
    first, second = (Pool(tmp_path, cluster, handler, topics=(source,), group=group,
                          processes=2, stats_file=False) for _ in range(2))
    pools(first)
    pools(second)

    def split() -> bool:
        try:
            with mq.Admin(bootstrap_servers=cluster.bootstrap) as admin:
                members = admin.describe_group(group)["members"]
        except mq.errors.RequestTimedOutError:
            return False                    # the coordinator is busy with the rebalance
        except mq.errors.UnknownServerError as err:
            if not coordinator_not_ready(err):
                raise
            return False
        return len(members) == 4 and all(len(m["assignment"]) == 1 for m in members)
    first.wait_for(split, "four members with a partition each", timeout=TIMEOUT)
    produce(cluster, source, [b"v%03d" % i for i in range(200)], partition=lambda i: i % 4)
    first.wait_for(lambda: caught_up(cluster, group, source), "every record handled",
                   timeout=TIMEOUT)

    events = read_events(first.events)
    assert sorted(e["value"] for e in events if e["kind"] == "done") == \
        ["v%03d" % i for i in range(200)]
    partitions = [{e["partition"] for e in events if e["pid"] in set(pool.child_pids())}
                  for pool in (first, second)]
    assert len(partitions[0]) == len(partitions[1]) == 2 and \
        partitions[0] | partitions[1] == {0, 1, 2, 3}, partitions

    shown = mq_run("workers", "stats", group, "--json")
    assert shown.code == 0, shown
    rows = [json.loads(line) for line in shown.out.splitlines()]
    assert sorted(row["file"] for row in rows) == sorted(
        [str(first.stats_path)] * 2 + [str(second.stats_path)] * 2)
    assert sum(row["handled"] for row in rows) == 200
    assert first.stop() == 0 and second.stop() == 0


def exactly_once_pool(cluster, handler, tmp_path, pools, source: str, out: str, group: str):
    """A feeder writing 100 records/s to ``source``'s two partitions, and a ready pool of two
    ``--exactly-once`` children writing one output per input to ``out``."""
    feeder = Feeder(cluster, source, 2, rate=100)
    feeder.start()
    pools(feeder)
    pool = Pool(tmp_path, cluster, handler, topics=(source,), group=group, processes=2,
                args=["--exactly-once"], env={"WK_OUTPUT": out, "WK_SLEEP_MS": "2"})
    pools(pool)
    pool.wait_ready()
    return feeder, pool


def test_exactly_once_outputs_across_a_child_killed(cluster, handler, tmp_path, pools, name):
    """``--exactly-once`` under load: two children are killed with SIGKILL, one after the
    other; a ``read_committed`` reader of the outputs sees one output per input, none twice."""
    source, out, group = name("in"), name("out"), name("g")
    create(cluster, {source: 2, out: 2})
    produce(cluster, source, [b"u%04d" % i for i in range(300)], partition=lambda i: i % 2)
    feeder, pool = exactly_once_pool(cluster, handler, tmp_path, pools, source, out, group)
    killed: set[int] = set()
    for _ in range(2):
        pool.wait_for(progressed(pool, time.monotonic_ns(), feeder), "progress since the last kill",
                      timeout=TIMEOUT)
        victim = next(s["pid"] for s in pool.slots()
                      if s["state"] == "running" and s["pid"] not in killed)
        os.kill(victim, signal.SIGKILL)
        killed.add(victim)
    acked = feeder.stop()
    pool.wait_for(lambda: caught_up(cluster, group, source), "every input handled",
                  timeout=TIMEOUT)
    pool.wait_for(lambda: pool.total("deaths") == 2, "both deaths counted")
    assert pool.stop() == 0, pool.stderr()[-4000:]

    assert_exactly_once(cluster, source, out, [b"u%04d" % i for i in range(300)] + acked)


def assert_exactly_once(cluster, source: str, out: str, written: list[bytes],
                        rewritten: bool = False) -> None:
    """``source`` holds exactly what was ``written`` (acknowledged), and a ``read_committed``
    reader of ``out`` sees one output per input, none twice.

    ``rewritten``: the writer's idempotent producer saw a leader change, after which
    librdkafka may write a record twice (librdkafka#4953: an epoch bump on the
    OUT_OF_ORDER_SEQUENCE_NUMBER answers that follow one failed request re-sends records
    already written; only transactions rule that out). Then ``source`` must hold every
    record written, and nothing else, at least once: each copy is an input of its own."""
    inputs = {(r.partition, r.offset): r.value for r in read_all(cluster, source)}
    if rewritten:
        assert set(inputs.values()) == set(written)
    else:
        assert sorted(inputs.values()) == sorted(written)
    outputs = collections.Counter()
    for r in read_all(cluster, out, "read_committed", markers=True):
        p, o, value = parse_output(r.value)
        assert inputs.get((p, o)) == value and r.value == transform(p, o, value), r.value
        outputs[(p, o)] += 1
    assert [k for k, n in outputs.items() if n > 1] == [], "an input with two outputs"
    assert sorted(set(inputs) - set(outputs)) == [], "an input without an output"


def test_an_exactly_once_pool_goes_on_while_a_kafka_node_is_killed(kafka_cluster, handler,
                                                                    tmp_path, pools, name):
    """The cluster loses a node (SIGKILL) under an exactly-once pool's load: replication
    factor 3, ``min.insync.replicas=2``, ``acks=all``. Nothing acknowledged is lost, the pool
    handles records while the node is down, and the outputs are exactly once."""
    cluster = Cluster(kafka_cluster.bootstrap, KAFKA_CONFIG)
    source, out, group = name("in"), name("out"), name("g")
    create(cluster, {source: 2, out: 2})                  # the cluster's default: 3 replicas
    feeder, pool = exactly_once_pool(cluster, handler, tmp_path, pools, source, out, group)
    pool.wait_for(progressed(pool, time.monotonic_ns(), feeder), "progress", timeout=TIMEOUT)
    with kafka_cluster.node_down(1):
        pool.wait_for(progressed(pool, time.monotonic_ns(), feeder), "progress with a node down",
                      timeout=TIMEOUT)
    pool.wait_for(progressed(pool, time.monotonic_ns(), feeder), "progress with the node back",
                  timeout=TIMEOUT)
    acked = feeder.stop()
    pool.wait_for(lambda: caught_up(cluster, group, source), "every input handled",
                  timeout=TIMEOUT)
    assert pool.stop() == 0, pool.stderr()[-4000:]
    assert_exactly_once(cluster, source, out, acked, rewritten=True)


def test_sigterm_drains_and_a_restart_repeats_nothing(cluster, handler, tmp_path, pools, name):
    """SIGTERM drains a pool (each child finishes the record in hand, commits, leaves) and a
    second pool of the group starts where it stopped: no record runs twice. A failure says
    which way: records run twice inside the first pool, a partition handled and never
    committed, or one committed and started over by the second pool; with the pools' logs,
    where a child whose partitions were lost or whose commit failed says so. The children's
    sessions are librdkafka's default (``PATIENT_CONFIG``)."""
    cluster = Cluster(cluster.bootstrap, PATIENT_CONFIG)
    source, group = name("in"), name("g")
    create(cluster, {source: 4})
    feeder = Feeder(cluster, source, 4, rate=500)
    feeder.start()
    pools(feeder)
    first = Pool(tmp_path, cluster, handler, topics=(source,), group=group, processes=2,
                 env={"WK_SLEEP_MS": "1"})
    pools(first)
    first.wait_for(lambda: len(calls(read_events(first.events), "done")) > 200, "some work",
                   timeout=TIMEOUT)
    assert first.stop() == 0, first.stderr()[-4000:]
    events = read_events(first.events)
    assert set(calls(events)) == set(calls(events, "done")), "a record was left half-done"
    handled: dict[int, list[int]] = collections.defaultdict(list)
    for p, o in calls(events, "done"):
        handled[p].append(o)
    after_first = committed(cluster, group)
    assert not twice(events), f"the first pool ran records twice: {twice(events)}; " \
                              f"committed: {after_first}\n{first.stderr()[-6000:]}"
    for tp, offset in after_first.items():
        assert sorted(handled[tp.partition]) == list(range(offset)), \
            f"{tp}: committed {offset} is not right after what was handled\n" \
            f"{first.stderr()[-6000:]}"
    never = sorted(set(handled) - {tp.partition for tp in after_first})
    assert not never, f"partitions {never} were handled but never committed: " \
                      f"{first.stderr()[-6000:]}"

    second = Pool(tmp_path, cluster, handler, topics=(source,), group=group, processes=2,
                  events=first.events)
    pools(second)
    feeder.stop()
    second.wait_for(lambda: caught_up(cluster, group, source), "the rest", timeout=TIMEOUT)
    assert second.stop() == 0, second.stderr()[-4000:]
    both = read_events(first.events)
    firsts = {e["pid"] for e in events}
    assert not twice(both), f"records ran twice: {twice(both, firsts)}; committed after the " \
                            f"first pool: {after_first}\nthe first pool: " \
                            f"{first.stderr()[-4000:]}\nthe second pool: " \
                            f"{second.stderr()[-4000:]}"
    done = calls(both, "done")
    assert set(done) == {(r.partition, r.offset) for r in read_all(cluster, source)}


def twice(events: list[dict], first: set[int] = frozenset()) -> dict[int, str]:
    """The partitions with records handled more than once: for each, which offsets and the
    children that handled them, in order ("pid P (first pool): first-last"; ``first``: the
    first pool's children). Empty if none ran twice."""
    done = calls(events, "done")
    again: dict[int, set[int]] = collections.defaultdict(set)
    for (p, o), n in done.items():
        if n > 1:
            again[p].add(o)
    out = {}
    for p, offsets in sorted(again.items()):
        by_pid: dict[int, list[int]] = {}
        for e in events:
            if e["kind"] == "done" and e["partition"] == p and e["offset"] in offsets:
                by_pid.setdefault(e["pid"], []).append(e["offset"])
        out[p] = f"{len(offsets)} record(s) of {min(offsets)}-{max(offsets)}, by " + ", ".join(
            f"pid {pid}{' (first pool)' if pid in first else ''}: {min(o)}-{max(o)}"
            for pid, o in by_pid.items())
    return out
