"""Retries in place, the dead-letter topic and redrive, with a real pool: poison records are
tried exactly ``max_retries + 1`` times, land in the DLQ with their key, value, headers and
the ``mq.dlq.*`` headers, while the records around them flow on; ``mq workers redrive`` puts
them back once (a second redrive moves nothing), and the fixed handler handles them."""

from __future__ import annotations

import time

import pytest
from wk_handlers import parse_output
from wk_pool import Pool, calls, caught_up, mq_run, produce, read_all, read_events

import mq

POISON = {(0, 3), (0, 11), (1, 7)}


def test_poison_records_go_to_the_dlq_and_redrive_puts_them_back(broker, tmp_path, pools):
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 2)
        admin.create_topic("jobs.dlq", 1)
    with mq.Producer(socket=broker.socket) as p:
        for partition in (0, 1):
            for offset in range(20):
                poison = (partition, offset) in POISON
                p.send("jobs", partition=partition, key=b"k%d" % offset,
                       value=b"poison-%d-%d" % (partition, offset) if poison else b"v%d" % offset,
                       headers=[("trace", b"t%d" % offset)])
    fixed = tmp_path / "fixed"
    started = time.monotonic()
    pool = Pool(tmp_path, broker.socket, processes=2, env={"WK_FIXED": str(fixed)},
                args=["--max-retries", "2", "--retry-backoff-ms", "20",
                      "--dead-letter-topic", "jobs.dlq"])
    pools(pool)
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")

    events = read_events(pool.events)
    tried = calls(events)
    assert {k: tried[k] for k in POISON} == {k: 3 for k in POISON}
    done = calls(events, "done")
    assert set(done) == {(p, o) for p in (0, 1) for o in range(20)} - POISON
    # In place: within a partition, nothing after a poison record ran before it gave up.
    order = [(e["partition"], e["offset"]) for e in events if e["kind"] == "call"]
    for p, o in POISON:
        last_try = max(i for i, k in enumerate(order) if k == (p, o))
        assert all(q != p or n <= o for q, n in order[:last_try]), "a later record overtook"
    # Backoff: 20 ms then 40 ms (with jitter at least half of each) between the tries.
    for key in POISON:
        times = [e["t"] for e in events if e["kind"] == "call" and
                 (e["partition"], e["offset"]) == key]
        gaps = [(b - a) / 1e6 for a, b in zip(times, times[1:], strict=False)]
        assert gaps[0] >= 10 and gaps[1] >= 20, gaps

    dead = read_all(broker.socket, "jobs.dlq")
    assert len(dead) == 3
    for r in dead:
        h = dict(r.headers)
        p, o = int(h["mq.dlq.partition"]), int(h["mq.dlq.offset"])
        assert (p, o) in POISON
        assert r.value == b"poison-%d-%d" % (p, o) and r.key == b"k%d" % o
        assert h["trace"] == b"t%d" % o
        assert h["mq.dlq.topic"] == b"jobs"
        assert h["mq.dlq.error"] == b"ValueError: poison poison-%d-%d" % (p, o)
        assert h["mq.dlq.attempts"] == b"3"
        assert h["mq.dlq.group"] == b"g"
        assert int(h["mq.dlq.timestamp"]) > 0
    stats = pool.slots()
    assert sum(s["dead_lettered"] for s in stats) == 3
    assert sum(s["retried"] for s in stats) == 6
    assert sum(s["failed"] for s in stats) == 9
    assert sum(s["handled"] for s in stats) >= 37
    print(f"poison run: {time.monotonic() - started:.1f} s")

    # Fix the handler; a dry run moves nothing, a redrive moves the three once.
    fixed.touch()
    dry = mq_run("workers", "redrive", "jobs.dlq", "--dry-run", "--socket", broker.socket)
    assert dry.code == 0 and dry.out.count("(dry run)") == 3, dry
    moved = mq_run("workers", "redrive", "jobs.dlq", "--to", "jobs", "--socket", broker.socket)
    assert moved.code == 0 and moved.out.count(" -> jobs: ValueError: poison") == 3, moved
    again = mq_run("workers", "redrive", "jobs.dlq", "--socket", broker.socket)
    assert again.code == 0 and again.out == "" and "moved 0 record(s)" in again.err, again
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the redriven records")
    redriven = [e for e in read_events(pool.events) if e["kind"] == "done" and
                e["value"].startswith("poison")]
    assert sorted(e["value"] for e in redriven) == sorted(
        "poison-%d-%d" % k for k in POISON)
    back = [r for r in read_all(broker.socket, "jobs") if r.offset >= 20]
    assert all(k.startswith("mq.dlq.") is False for r in back for k, _ in r.headers)
    assert sorted(dict(r.headers)["trace"] for r in back) == sorted(
        b"t%d" % o for _, o in POISON)
    assert pool.stop() == 0


def test_an_output_the_broker_refuses_dead_letters_its_record(broker, tmp_path, pools):
    """At least once, an output refused after the handler returned (too large for its topic,
    found when the batch is answered): the record is dead-lettered at the next commit,
    instead of the child exiting and the record coming back forever."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 1)
        admin.create_topic("out", 1, {"max.message.bytes": "10000"})
        admin.create_topic("jobs.dlq", 1)
    with mq.Producer(socket=broker.socket) as p:
        for i in range(20):
            p.send("jobs", value=b"big" if i == 7 else b"v%d" % i)
    pool = Pool(tmp_path, broker.socket, processes=1, env={"WK_OUTPUT": "out"},
                args=["--dead-letter-topic", "jobs.dlq"])
    pools(pool)
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")
    [dead] = read_all(broker.socket, "jobs.dlq")
    headers = dict(dead.headers)
    assert headers["mq.dlq.offset"] == b"7"
    assert headers["mq.dlq.error"].startswith(b"BadOutput: MessageTooLargeError")
    assert len(read_all(broker.socket, "out")) == 20        # record 7's first output too
    assert calls(read_events(pool.events)) == {(0, o): 1 for o in range(20)}
    assert [s["deaths"] for s in pool.slots()] == [0]
    assert pool.stop() == 0


@pytest.mark.parametrize("handler", ["wk_handlers:handle", "wk_handlers:ahandle"])
def test_records_wait_for_a_missing_output_topic(broker, tmp_path, pools, handler):
    """A pool started before its output topic exists: not the records' fault, so none is
    dead-lettered (it used to be every one, after its attempts). They wait, their attempts
    untouched, and go out once the topic is created."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 2)
        admin.create_topic("jobs.dlq", 1)
    produce(broker.socket, "jobs", [b"v%d" % i for i in range(10)])
    pool = Pool(tmp_path, broker.socket, handler=handler, processes=1,
                env={"WK_OUTPUT": "out"},
                args=["--max-retries", "1", "--retry-backoff-ms", "5",
                      "--dead-letter-topic", "jobs.dlq"])
    pools(pool)
    # More waits than the max_retries + 1 = 2 attempts a failing record gets.
    pool.wait_for(lambda: pool.stderr().count("output topic 'out' does not exist") >= 6 or
                  pool.total("dead_lettered"), "the records to wait for the topic")
    assert "mq topics create out" in pool.stderr()
    assert read_all(broker.socket, "jobs.dlq") == []
    assert pool.total("dead_lettered") == pool.total("handled") == 0
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("out", 1)
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")
    outputs = [parse_output(r.value)[2] for r in read_all(broker.socket, "out")]
    assert sorted(set(outputs)) == sorted(b"v%d" % i for i in range(10))
    assert read_all(broker.socket, "jobs.dlq") == []
    assert pool.total("dead_lettered") == pool.total("failed") == 0
    assert pool.stop() == 0
