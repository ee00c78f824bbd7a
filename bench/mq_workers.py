"""The worker processes that drive mq's own clients in the benchmarks (``bench.e2e``,
``bench.kafka_wire``, ``bench.large_records``, ``bench.spark_latency``), and the settings
they run with (stated in the README and in each run's JSON).

Each worker is ``fn(start, **kwargs)`` for ``harness.run_workers``: it connects and learns the
topic's metadata, calls ``start()`` (the barrier), runs its timed loop and returns a dict of
clock readings, counts and its own CPU. mq is imported in the worker, after the fork.
"""

from __future__ import annotations

import struct
import time

from bench import harness, peers
from bench.harness import quiet_gc

__all__ = ["MQ_LATENCY", "MQ_LATENCY_ACKS0", "MQ_MAX_RECORDS", "MQ_SPIN_US", "MQ_THROUGHPUT",
           "consume_latencies", "mq_consumer", "mq_lat_consumer", "mq_lat_producer",
           "mq_paced_producer", "mq_producer"]

# --- mq settings (stated in the README and the JSON) -----------------------------------------
MQ_THROUGHPUT = {"acks": 1, "linger_ms": 10, "batch_size": 1 << 20}   # 1 MiB batches
MQ_LATENCY = {"acks": 1, "linger_ms": 0}      # default batch_size: sent as soon as possible
MQ_LATENCY_ACKS0 = {"acks": 0, "linger_ms": 0}  # extra row: no acks to read in the producer
MQ_MAX_RECORDS = 10_000       # consumer poll(max_records=); the default is 500
# The latency section's spin wait strategy: the consumer's and the broker's spin_us. 1000 us is
# the gap between records at 1 k/s, the slowest rate measured, so at every rate the next
# record comes while they spin and neither sleeps between records: the strategy's best case,
# and its price in CPU.
MQ_SPIN_US = 1000

# --- mq workers ---------------------------------------------------------------------------------

def mq_producer(start, socket: str, topic: str, values: list[bytes], n: int, acks,
                linger_ms: float, batch_size: int, partition: int | None = None,
                shared_batches: bool = True) -> dict:
    import mq
    p = mq.Producer(socket=socket, acks=acks, linger_ms=linger_ms, batch_size=batch_size,
                    shared_batches=shared_batches)
    p.partitions_for(topic)                   # metadata before the clock starts
    send, k = p.send, len(values)
    quiet_gc()
    start()
    cpu0 = time.process_time()                # ns resolution: os.times() counts 10 ms ticks
    t0 = time.perf_counter_ns()
    for i in range(n):
        send(topic, values[i % k], partition=partition)
    p.flush()
    t1 = time.perf_counter_ns()
    loop = time.process_time() - cpu0
    cpu = harness.cpu_seconds()
    p.close()
    return {"t_first": t0, "t_end": t1, "n": n, "cpu_s": cpu, "cpu_s_loop": loop}


def mq_consumer(start, socket: str, topic: str, partitions: list[int], n: int,
                touch: bool = True, timeout_s: float = 120.0) -> dict:
    import mq
    c = mq.Consumer(socket=socket)
    c.assign([mq.TopicPartition(topic, p) for p in partitions])
    poll = c.poll
    got = nbytes = 0
    quiet_gc()
    start()
    cpu0 = time.process_time()                # ns resolution: os.times() counts 10 ms ticks
    t_start = time.perf_counter_ns()
    deadline = time.monotonic() + timeout_s
    while got < n and time.monotonic() < deadline:
        for recs in poll(1000, MQ_MAX_RECORDS).values():
            got += len(recs)
            if touch:
                for r in recs:
                    nbytes += len(r.value)
    t_last = time.perf_counter_ns()
    loop = time.process_time() - cpu0
    cpu = harness.cpu_seconds()
    c.close()
    return {"t_start": t_start, "t_last": t_last, "n": got, "bytes": nbytes, "cpu_s": cpu,
            "cpu_s_loop": loop}


def mq_lat_producer(start, socket: str, topic: str, size: int, rate: float, n: int,
                    acks, linger_ms: float) -> dict:
    import mq
    p = mq.Producer(socket=socket, acks=acks, linger_ms=linger_ms)
    p.partitions_for(topic)
    send = p.send
    buf = bytearray(b"x" * size)
    pack = struct.Struct("<q").pack_into

    def one(t_i: int) -> None:
        pack(buf, 0, t_i)
        send(topic, bytes(buf), partition=0)
    quiet_gc()
    start()
    res = peers.paced_loop(one, rate, n)
    p.flush()
    res["cpu_s"] = harness.cpu_seconds()
    p.close()
    return res


def mq_lat_consumer(start, socket: str, topic: str, n: int, warm: int,
                    timeout_s: float, spin_us: float = 0) -> dict:
    """``consume_latencies`` of one partition, the consumer's wait strategy ``spin_us``."""
    import mq
    c = mq.Consumer(socket=socket, spin_us=spin_us)
    c.assign([mq.TopicPartition(topic, 0)])
    return consume_latencies(c, start, n, warm, timeout_s)


def consume_latencies(c, start, n: int, warm: int, timeout_s: float) -> dict:
    """The consumer side of a latency run: start the producer (``start()``), then poll ``c``
    until ``n`` records (``warm`` of them discarded) carried their send time to us; closes
    ``c``. Shared with ``bench.spark_latency``."""
    rec = peers.LatencyRecorder(n, warm)
    add, poll, clock = rec.add, c.poll, time.perf_counter_ns
    quiet_gc()
    start()
    cpu0 = time.process_time()                # ns resolution: os.times() counts 10 ms ticks
    deadline = time.monotonic() + timeout_s
    while rec.got < n and time.monotonic() < deadline:
        out = poll(100)
        now = clock()
        for recs in out.values():
            for r in recs:
                add(now, r.value)
    res = rec.result()
    res["cpu_s"] = time.process_time() - cpu0
    c.close()
    return res


# --- paced: bench.e2e's fan-out section ------------------------------------------------------

def mq_paced_producer(start, socket: str, topic: str, values: list[bytes], rate: float,
                      n: int, tick_s: float) -> dict:
    """``n`` records at ``rate``/s: every ``tick_s`` the records due so far, with
    ``send_many``, sleeping in between (no spinning: the CPU stays free for the others)."""
    import mq
    p = mq.Producer(socket=socket, acks=1, linger_ms=0)
    p.partitions_for(topic)
    k = len(values)
    quiet_gc()
    start()
    t0 = time.perf_counter_ns()
    sent = tick = 0
    while sent < n:
        tick += 1
        delay = t0 / 1e9 + tick * tick_s - time.perf_counter_ns() / 1e9
        if delay > 0:
            time.sleep(delay)
        due = min(n, int(tick * tick_s * rate))
        if due > sent:
            p.send_many(topic, [values[i % k] for i in range(sent, due)], partition=0)
            sent = due
    p.flush()
    t1 = time.perf_counter_ns()
    cpu = harness.cpu_seconds()
    p.close()
    return {"t_first": t0, "t_end": t1, "n": n, "cpu_s": cpu}
