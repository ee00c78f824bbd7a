"""Exactly-once pools under chaos: a transform pool (``--exactly-once``, one output per input
to ``out``) runs while a feeder writes, and children and the broker are killed with SIGKILL at
random moments; at the end a ``read_committed`` reader of ``out`` sees exactly one output per
input — none missing, none twice, each naming its input and carrying its transform — and the
group committed the end of every input partition. ``tests/integration/test_eos_pipeline.py``
does the same for a hand-written loop; this is the pool's own loop, supervisor included.

The kills are placed by a seeded ``random.Random``: the seed is printed and ``WK_SEED=<seed>``
replays the choices (the processes' timing still differs). Both handler kinds run: the plain
one and the ``async def`` one, whose outputs are released in offset order.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import time

import pytest
from wk_handlers import parse_output, transform
from wk_pool import Feeder, Pool, caught_up, ends, read_all, read_events

import mq

KILLS = 8
UPFRONT = 1500


def seed() -> int:
    value = int(os.environ.get("WK_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"WK_SEED={value}")
    return value


def progressed(pool: Pool, since: int):
    """A condition: a record was handled after ``since`` (CLOCK_MONOTONIC ns)."""
    return lambda: any(e["t"] > since and e["kind"] == "done"
                       for e in read_events(pool.events)[-200:])


@pytest.mark.parametrize("handler", ["wk_handlers:handle", "wk_handlers:ahandle"])
def test_exactly_once_under_kill9_of_children_and_broker(broker, tmp_path, pools, handler):
    rng = random.Random(seed())
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("in", 3)
        admin.create_topic("out", 2)
    with mq.Producer(socket=broker.socket, linger_ms=5) as p:
        for i in range(UPFRONT):
            p.send("in", value=b"u%05d" % i, partition=i % 3)
    feeder = Feeder(broker.socket, "in", 3, rate=300)
    feeder.start()
    pools(feeder)
    pool = Pool(tmp_path, broker.socket, handler=handler, topics=("in",), processes=2,
                args=["--exactly-once", "--concurrency", "4"], env={"WK_OUTPUT": "out"})
    pools(pool)
    pool.wait_ready()
    kills = collections.Counter()
    for _ in range(KILLS):
        pool.wait_for(progressed(pool, time.monotonic_ns()),
                      "the pool to make progress since the last kill")
        time.sleep(rng.uniform(0.0, 0.3))          # places the kill; waits for nothing
        if rng.random() < 0.3:
            broker.kill()
            broker.start()
            kills["broker"] += 1
        else:
            slots = [s for s in pool.slots() if s["state"] == "running"]
            if slots:
                victim = rng.choice(slots)
                try:
                    os.kill(victim["pid"], signal.SIGKILL)
                    kills["child"] += 1
                except ProcessLookupError:
                    pass
    acked = feeder.stop()
    pool.wait_for(lambda: caught_up(broker.socket, "g", "in"), "the group to catch up",
                  timeout=60)
    assert pool.stop() == 0, pool.stderr()[-4000:]

    inputs = {(r.partition, r.offset): r.value for r in read_all(broker.socket, "in")}
    assert sorted(inputs.values()) == sorted([b"u%05d" % i for i in range(UPFRONT)] + acked)
    assert ends(broker.socket, "out", "read_committed") == ends(broker.socket, "out"), \
        "a transaction is still open"
    committed = read_all(broker.socket, "out", "read_committed")
    outputs = collections.Counter()
    for r in committed:
        p, o, value = parse_output(r.value)
        assert inputs.get((p, o)) == value, f"output {r.value!r} names no such input"
        assert r.value == transform(p, o, value)
        outputs[(p, o)] += 1
    twice = [k for k, n in outputs.items() if n > 1]
    missing = sorted(set(inputs) - set(outputs))
    everything = read_all(broker.socket, "out")
    print(f"{dict(kills)} kills; {len(inputs)} inputs, {len(committed)} committed outputs, "
          f"{len(everything) - len(committed)} aborted")
    assert not twice and not missing, (f"{len(twice)} inputs with two outputs (first "
                                       f"{twice[:5]}), {len(missing)} without (first "
                                       f"{missing[:5]})")


@pytest.mark.parametrize("handler", ["wk_handlers:handle", "wk_handlers:ahandle"])
def test_a_refused_output_aborts_the_transaction_and_dead_letters_its_record(
        broker, tmp_path, pools, handler):
    """Exactly once, a record whose second output the producer refuses (too large) after its
    first joined the transaction: the transaction is aborted, the record dead-lettered when it
    comes back, and no output of it is ever committed."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("in", 1)
        admin.create_topic("out", 1, {"max.message.bytes": "10000"})
        admin.create_topic("in.dlq", 1)
    with mq.Producer(socket=broker.socket) as p:
        for i in range(20):
            p.send("in", value=b"big" if i == 7 else b"v%d" % i)
    pool = Pool(tmp_path, broker.socket, handler=handler, topics=("in",), processes=1,
                args=["--exactly-once", "--dead-letter-topic", "in.dlq"],
                env={"WK_OUTPUT": "out"})
    pools(pool)
    pool.wait_for(lambda: caught_up(broker.socket, "g", "in"), "the group to catch up")
    [dead] = read_all(broker.socket, "in.dlq", "read_committed")
    assert dict(dead.headers)["mq.dlq.offset"] == b"7"
    outputs = [parse_output(r.value)[:2] for r in read_all(broker.socket, "out",
                                                           "read_committed")]
    assert sorted(outputs) == [(0, o) for o in range(20) if o != 7]
    assert "an output was refused: BadOutput: MessageTooLargeError" in pool.stderr()
    assert pool.stop() == 0
