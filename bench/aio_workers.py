"""The worker processes of ``bench.aio_clients``: one producer, consumer or latency worker per
client family — mq's threaded clients (``mq.Producer``, ``mq.Consumer``), mq's asyncio clients
(``mq.aio.Producer``, ``mq.aio.Consumer``) and aiokafka through mq's Kafka listener — each
written the way that family is meant to be used, with the same settings (``PRODUCE``,
``CONSUME``, ``LATENCY``).

Each is ``fn(start, **kwargs)`` for ``harness.run_workers``: it connects and learns the
topic's metadata, calls ``start()`` (the barrier), runs its timed loop and returns a dict of
clock readings, counts and its CPU. The clients are imported in the worker, after the fork,
and every asyncio worker runs its own event loop (the harness process never makes one).
Timestamps are ``time.perf_counter_ns()``: CLOCK_MONOTONIC, one clock for every process on
the host (``bench/harness.py``), so a receive time minus a send time taken in another process
is a latency.
"""

from __future__ import annotations

import asyncio
import selectors
import struct
import time

from bench import harness, peers
from bench.harness import quiet_gc

__all__ = ["CONSUME", "LATENCY", "PRODUCE", "aio_consumer", "aio_lat_consumer",
           "aio_lat_producer", "aio_producer", "aiokafka_consumer", "aiokafka_lat_consumer",
           "aiokafka_lat_producer", "aiokafka_producer", "threaded_consumer",
           "threaded_producer"]

# --- the settings, the same for every family (stated in the README and the JSON) ------------
# Produce: acks=all, linger 5 ms, batches of 16 KiB (aiokafka's and Kafka's default; mq's too).
# Idempotence is each client's default: on in mq's producers (with acks=all), off in aiokafka.
PRODUCE = {"acks": "all", "linger_ms": 5, "batch_size": 16384}
AIOKAFKA_PRODUCE = {"acks": "all", "linger_ms": 5, "max_batch_size": 16384}
CONSUME = {"max_records": 10_000, "timeout_ms": 1000}     # per getmany()/poll() call
# Latency: bench.e2e's settings (acks=1, linger 0: a record is sent as soon as it is given).
LATENCY = {"acks": 1, "linger_ms": 0}


# --- asyncio -------------------------------------------------------------------------------------

def run_loop(coro, precise_timers: bool = False):
    """Run ``coro`` in a fresh event loop. ``precise_timers``: a loop over ``select()``, whose
    timeouts are in microseconds, instead of asyncio's default ``epoll``, whose ``epoll_wait``
    takes whole milliseconds rounded up: there ``asyncio.sleep(0.0003)`` sleeps 1.1 ms, which
    would make a paced sender at 1 k/s up to 1 ms late by the bench's own doing."""
    if not precise_timers:
        return asyncio.run(coro)
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def aio_paced_loop(send, rate: float, n: int) -> dict:
    """``peers.paced_loop`` for a coroutine ``send(t_i)``: record i is due at t0 + i/rate and
    carries that intended time. Sleeps with ``asyncio.sleep`` (the loop reads replies
    meanwhile) until ``SPIN_NS`` before it is due, then spins, as ``paced_loop`` does."""
    clock, spin_ns = time.perf_counter_ns, peers.SPIN_NS
    interval = 1e9 / rate
    send_hist = harness.new_hist()
    record = send_hist.record_value
    t0 = clock() + 2_000_000
    late = 0
    for i in range(n):
        t_i = t0 + int(i * interval)
        now = clock()
        if t_i - now > spin_ns:
            await asyncio.sleep((t_i - now - spin_ns) / 1e9)
            now = clock()
        while now < t_i:
            now = clock()
        await send(t_i)
        done = clock()
        record((done - now) // 1000 or 1)
        if done - t_i > interval:
            late += 1
    t_end = clock()
    return {"t_first": t0, "t_end": t_end, "n": n, "late_sends": late,
            "send_rate": n / ((t_end - t0) / 1e9), "send_call_hist": send_hist.encode()}


class _Clock:
    """The timed loop's readings: wall time, this process's CPU and the calling thread's."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter_ns()
        self.cpu0, self.thread0 = time.process_time(), time.thread_time()

    def stop(self, n: int, **extra) -> dict:
        t1 = time.perf_counter_ns()
        return {"t_first": self.t0, "t_end": t1, "n": n,
                "cpu_s_loop": time.process_time() - self.cpu0,
                "thread_cpu_s_loop": time.thread_time() - self.thread0, **extra}


# --- produce: n records to partition 0, keeping every future; flush; every outcome read ------

def threaded_producer(start, socket: str, topic: str, values: list[bytes], n: int) -> dict:
    import mq
    p = mq.Producer(socket=socket, **PRODUCE)
    p.partitions_for(topic)                    # metadata before the clock starts
    send, k = p.send, len(values)
    futures: list = [None] * n
    quiet_gc()
    start()
    clock = _Clock()
    for i in range(n):
        futures[i] = send(topic, values[i % k], partition=0)
    t_sent = time.perf_counter_ns()
    p.flush()
    last = [f.get() for f in futures][-1]
    res = clock.stop(n, t_sent=t_sent, last_offset=last.offset)
    p.close()
    return res


def aio_producer(start, socket: str, topic: str, values: list[bytes], n: int) -> dict:
    return run_loop(_aio_producer(start, socket, topic, values, n))


async def _aio_producer(start, socket: str, topic: str, values: list[bytes], n: int) -> dict:
    import mq.aio
    async with mq.aio.Producer(socket, **PRODUCE) as p:
        return await _timed_sends(p, start, topic, values, n)


def aiokafka_producer(start, bootstrap: str, topic: str, values: list[bytes], n: int) -> dict:
    return run_loop(_aiokafka_producer(start, bootstrap, topic, values, n))


async def _aiokafka_producer(start, bootstrap: str, topic: str, values: list[bytes],
                             n: int) -> dict:
    from aiokafka import AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, **AIOKAFKA_PRODUCE)
    await p.start()
    try:
        return await _timed_sends(p, start, topic, values, n)
    finally:
        await p.stop()


async def _timed_sends(p, start, topic: str, values: list[bytes], n: int) -> dict:
    """``n`` sends of ``values`` (cycled) to partition 0 of ``topic`` through ``p``, an
    asyncio producer of either family (they take the same calls), timed from ``start()``."""
    await p.partitions_for(topic)
    send, k = p.send, len(values)
    futures: list = [None] * n
    quiet_gc()
    start()
    clock = _Clock()
    for i in range(n):
        futures[i] = await send(topic, values[i % k], partition=0)
    t_sent = time.perf_counter_ns()
    await p.flush()
    for f in futures:
        last = await f
    return clock.stop(n, t_sent=t_sent, last_offset=last.offset)


# --- consume: partition 0 from offset 0 until n records, the length of every value taken ----

def threaded_consumer(start, socket: str, topic: str, n: int, timeout_s: float = 120.0) -> dict:
    import mq
    c = mq.Consumer(socket=socket)
    c.assign([mq.TopicPartition(topic, 0)])
    poll, timeout_ms, most = c.poll, CONSUME["timeout_ms"], CONSUME["max_records"]
    got = nbytes = 0
    quiet_gc()
    start()
    clock = _Clock()
    deadline = time.monotonic() + timeout_s
    while got < n and time.monotonic() < deadline:
        for recs in poll(timeout_ms, most).values():
            got += len(recs)
            for r in recs:
                nbytes += len(r.value)
    res = clock.stop(got, bytes=nbytes)
    c.close()
    return res


def aio_consumer(start, socket: str, topic: str, n: int, timeout_s: float = 120.0) -> dict:
    return run_loop(_aio_consumer(start, socket, topic, n, timeout_s))


async def _aio_consumer(start, socket: str, topic: str, n: int, timeout_s: float) -> dict:
    import mq.aio
    async with mq.aio.Consumer(topic, socket=socket) as c:
        getmany, timeout_ms, most = c.getmany, CONSUME["timeout_ms"], CONSUME["max_records"]
        got = nbytes = 0
        quiet_gc()
        start()
        clock = _Clock()
        deadline = time.monotonic() + timeout_s
        while got < n and time.monotonic() < deadline:
            for recs in (await getmany(timeout_ms=timeout_ms, max_records=most)).values():
                got += len(recs)
                for r in recs:
                    nbytes += len(r.value)
        return clock.stop(got, bytes=nbytes)


def aiokafka_consumer(start, bootstrap: str, topic: str, n: int,
                      timeout_s: float = 120.0) -> dict:
    return run_loop(_aiokafka_consumer(start, bootstrap, topic, n, timeout_s))


def _aiokafka_new_consumer(bootstrap: str):
    """No group (nothing committed, no coordinator), from the earliest offset."""
    from aiokafka import AIOKafkaConsumer
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                            enable_auto_commit=False, auto_offset_reset="earliest")


async def _aiokafka_consumer(start, bootstrap: str, topic: str, n: int,
                             timeout_s: float) -> dict:
    from aiokafka import TopicPartition
    c = _aiokafka_new_consumer(bootstrap)
    await c.start()
    try:
        await c.topics()                       # the cluster's metadata, before the clock
        getmany, timeout_ms, most = c.getmany, CONSUME["timeout_ms"], CONSUME["max_records"]
        got = nbytes = 0
        quiet_gc()
        start()
        clock = _Clock()
        # Assigned only now: aiokafka's fetcher task starts fetching at once and would have
        # records buffered before the clock started.
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + timeout_s
        while got < n and time.monotonic() < deadline:
            for recs in (await getmany(timeout_ms=timeout_ms, max_records=most)).values():
                got += len(recs)
                for r in recs:
                    nbytes += len(r.value)
        return clock.stop(got, bytes=nbytes)
    finally:
        await c.stop()


# --- latency: open loop (the intended send time in the value), bench.e2e's method -----------
# The threaded family is bench.mq_workers' mq_lat_producer and mq_lat_consumer.

def _stamped(size: int):
    """A function making a ``size``-byte value that starts with a time (ns, little endian)."""
    buf = bytearray(b"x" * size)
    pack = struct.Struct("<q").pack_into

    def stamp(t_i: int) -> bytes:
        pack(buf, 0, t_i)
        return bytes(buf)
    return stamp


def aio_lat_producer(start, socket: str, topic: str, size: int, rate: float, n: int) -> dict:
    return run_loop(_aio_lat_producer(start, socket, topic, size, rate, n), precise_timers=True)


async def _aio_lat_producer(start, socket: str, topic: str, size: int, rate: float,
                            n: int) -> dict:
    import mq.aio
    async with mq.aio.Producer(socket, **LATENCY) as p:
        res = await _paced_sends(p, start, topic, size, rate, n)
    res["cpu_s"] = harness.cpu_seconds()
    return res


async def _paced_sends(p, start, topic: str, size: int, rate: float, n: int) -> dict:
    """``n`` stamped sends of ``size`` bytes at ``rate`` per second through ``p``, an asyncio
    producer of either family (they take the same calls), from ``start()``; flushed."""
    stamp = _stamped(size)
    await p.partitions_for(topic)
    send = p.send

    async def one(t_i: int) -> None:
        await send(topic, stamp(t_i), partition=0)
    quiet_gc()
    start()
    res = await aio_paced_loop(one, rate, n)
    await p.flush()
    return res


def aio_lat_consumer(start, socket: str, topic: str, n: int, warm: int,
                     timeout_s: float) -> dict:
    return run_loop(_aio_lat_consumer(start, socket, topic, n, warm, timeout_s))


async def _aio_lat_consumer(start, socket: str, topic: str, n: int, warm: int,
                            timeout_s: float) -> dict:
    import mq.aio
    async with mq.aio.Consumer(topic, socket=socket) as c:
        return await _consume_latencies(c.getmany, start, n, warm, timeout_s)


async def _consume_latencies(getmany, start, n: int, warm: int, timeout_s: float) -> dict:
    """``mq_workers.consume_latencies`` for an asyncio consumer's ``getmany``."""
    rec = peers.LatencyRecorder(n, warm)
    add, clock = rec.add, time.perf_counter_ns
    quiet_gc()
    start()
    cpu0 = harness.cpu_seconds()
    deadline = time.monotonic() + timeout_s
    while rec.got < n and time.monotonic() < deadline:
        out = await getmany(timeout_ms=100)
        now = clock()
        for recs in out.values():
            for r in recs:
                add(now, r.value)
    res = rec.result()
    res["cpu_s"] = harness.cpu_seconds() - cpu0
    return res


def aiokafka_lat_producer(start, bootstrap: str, topic: str, size: int, rate: float,
                          n: int) -> dict:
    return run_loop(_aiokafka_lat_producer(start, bootstrap, topic, size, rate, n),
                    precise_timers=True)


async def _aiokafka_lat_producer(start, bootstrap: str, topic: str, size: int, rate: float,
                                 n: int) -> dict:
    from aiokafka import AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, **LATENCY)
    await p.start()
    try:
        res = await _paced_sends(p, start, topic, size, rate, n)
    finally:
        await p.stop()
    res["cpu_s"] = harness.cpu_seconds()
    return res


def aiokafka_lat_consumer(start, bootstrap: str, topic: str, n: int, warm: int,
                          timeout_s: float) -> dict:
    return run_loop(_aiokafka_lat_consumer(start, bootstrap, topic, n, warm, timeout_s))


async def _aiokafka_lat_consumer(start, bootstrap: str, topic: str, n: int, warm: int,
                                 timeout_s: float) -> dict:
    from aiokafka import TopicPartition
    c = _aiokafka_new_consumer(bootstrap)
    await c.start()
    try:
        await c.topics()                       # the cluster's metadata, before the clock
        c.assign([TopicPartition(topic, 0)])
        return await _consume_latencies(c.getmany, start, n, warm, timeout_s)
    finally:
        await c.stop()
