"""Where an end-to-end record's time goes, hop by hop, at a paced rate (100 B, acks=1, linger 0).

    python3 -m bench.latency_hops [--rate 1000] [--n 3000] [--broker-spin-us 0]
                                  [--consumer-spin-us 0] [--broker-steps] [--group]

The broker runs in this process (a thread: its methods are wrapped to stamp the time); the
producer and the consumer are forked processes, also stamping. Every stamp is
``perf_counter_ns`` (CLOCK_MONOTONIC, the same clock in all processes). Each record's hops are
matched in order: its ``send()`` call, that call's write (``native.produce_send``: the request
built and written by one C call), the broker's next read, append
and publish, the consumer's wake-up and its ``poll()`` returning. The first fifth is warm-up.
The spin options choose the wait strategies (README, "Wait strategies"): 0, the default,
sleeps at once. ``--group`` makes the consumer a member of a consumer group (subscribed with
a ``group_id``) instead of assigned the partition.
Prints p50 and p90 per hop (bench/RESULTS.md, "Latency at 1 k/s"). ``--broker-steps`` adds
the p50 of each step from the broker's read to its publish (``BROKER_STEPS``: the handler of
a Produce taken from a tail frame, the Produce itself (in C, ``produce_plain``, for a plain
batch with acks=1), the publication), each stamp costing about a µs more.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import multiprocessing as mp
import os
import shutil
import struct
import tempfile
import threading
import time

import mq
from mq.broker import server, wakeups
from mq.broker.apis import produce
from mq.broker.config import BrokerConfig

EVENTS: list[tuple[str, int]] = []        # the broker's stamps (this process)
HOPS = ["send() to its write (C)", "the write to the broker's read", "read to appended",
        "appended to publish", "publish and futex wake (broker)", "publish to consumer awake",
        "consumer awake to poll()", "TOTAL (intended send to poll)"]
BROKER_STEPS = ["  read to the Produce handler", "  the Produce: checks to reply",
                "  appended to publishing", "  publishing to the publication"]


def stamp(owner, name: str, tag: str, at_end: bool = False) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def stamped(*args, **kwargs):
        if not at_end:
            EVENTS.append((tag, time.perf_counter_ns()))
        try:
            return fn(*args, **kwargs)
        finally:
            if at_end:
                EVENTS.append((tag, time.perf_counter_ns()))
    setattr(owner, name, stamped)


def producer(sock: str, n: int, rate: float, start, out) -> None:
    from mq.log import native
    sendmsgs: list[int] = []
    build_and_write = native.produce_send     # the request built and written in one C call

    def stamped(*args):
        sendmsgs.append(time.perf_counter_ns())
        return build_and_write(*args)
    native.produce_send = stamped
    p = mq.Producer(socket=sock, acks=1, linger_ms=0)
    p.partitions_for("t")
    start.wait()
    sendmsgs.clear()
    sends = []
    t0, interval = time.perf_counter(), 1 / rate
    for i in range(n):
        due = t0 + i * interval
        while time.perf_counter() < due - 0.0002:
            time.sleep(0.0001)
        while time.perf_counter() < due:
            pass
        ts = time.perf_counter_ns()
        sends.append(ts)
        p.send("t", struct.pack("<q", ts) + b"x" * 92, partition=0)
    p.flush()
    p.close()
    out.put(("p", sends, sendmsgs))


def consumer(sock: str, n: int, spin_us: int, start, out, group: bool = False) -> None:
    from mq.client import consumer_driver as consumer_module
    wakes: list[int] = []
    for seam in ("_sleep_on", "_block"):          # futex words, or the semaphore
        fn = getattr(consumer_module, seam)

        def stamped(*args, _fn=fn):
            r = _fn(*args)
            wakes.append(time.perf_counter_ns())
            return r
        setattr(consumer_module, seam, stamped)
    if group:                                 # a group member: subscribed, then assigned
        c = mq.Consumer("t", group_id="hops", socket=sock, spin_us=spin_us)
        deadline = time.monotonic() + 30
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(10)
    else:
        c = mq.Consumer(socket=sock, spin_us=spin_us)
        c.assign([mq.TopicPartition("t", 0)])
        c.poll(10)
    wakes.clear()
    start.set()
    got = []
    while len(got) < n:
        polled = c.poll(100)
        now = time.perf_counter_ns()
        for records in polled.values():
            got += [(struct.unpack_from("<q", r.value)[0], now) for r in records]
    out.put(("c", got, wakes))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.latency_hops",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1000, help="records per second (1000)")
    ap.add_argument("--n", type=int, default=3000, help="records (3000)")
    ap.add_argument("--broker-spin-us", type=int, default=0, metavar="US",
                    help="the broker's spin_us: its loop's busy wait before sleeping (0)")
    ap.add_argument("--broker-steps", action="store_true",
                    help="also stamp the steps from the broker's read to its publish")
    ap.add_argument("--consumer-spin-us", type=int, default=0, metavar="US",
                    help="the consumer's spin_us: its busy wait before sleeping (0)")
    ap.add_argument("--group", action="store_true",
                    help="the consumer is a group member (subscribed), not assigned")
    args = ap.parse_args()
    n = args.n
    stamp(server.Broker, "_read", "read")
    stamp(produce.ProduceApis, "append", "appended", at_end=True)
    # The partition's publication: its slot's write and the futex wake (in C, or the Python
    # path's state_of and StateWriter.publish).
    stamp(wakeups.StatePublisher, "publish", "publish")
    stamp(wakeups.StatePublisher, "publish", "woke", at_end=True)
    if args.broker_steps:
        stamp(server.Broker, "_produce_tail", "handler")
        stamp(server.Broker, "_publish_touched", "publishing")
    d = tempfile.mkdtemp(prefix="mq-hops-")
    sock = os.path.join(d, "mq.sock")
    broker = server.Broker(BrokerConfig(data_dir=d, socket=sock, spin_us=args.broker_spin_us))
    broker.start()
    serving = threading.Thread(target=broker.serve_forever, daemon=True)
    serving.start()
    mq.Admin(socket=sock).create_topic("t", partitions=1)
    ctx = mp.get_context("fork")
    out, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=consumer, args=(sock, n, args.consumer_spin_us, start, out,
                                                args.group)),
             ctx.Process(target=producer, args=(sock, n, args.rate, start, out))]
    for p in procs:
        p.start()
    res = {kind: (a, b) for kind, a, b in (out.get(), out.get())}
    for p in procs:
        p.join()
    (sends, sendmsgs), (got, wakes) = res["p"], res["c"]
    events = list(EVENTS)

    def times(tag: str) -> list[int]:
        return [t for k, t in events if k == tag]

    def after(xs: list[int], t: int) -> int:
        i = bisect.bisect_left(xs, t)
        if i == len(xs):
            raise LookupError           # a record taken with no later stamp (below)
        return xs[i]
    read, appended, publish, woke = times("read"), times("appended"), times("publish"), \
        times("woke")
    steps = {tag: times(tag) for tag in ("handler", "publishing")}
    rows, step_rows = [], []
    for i in range(n // 5, n - 5):
        s = sends[i]
        try:
            sm = after(sendmsgs, s)
            rd = after(read, sm)
            ap_ = after(appended, rd)
            pb = after(publish, ap_)
            row = (sm - s, rd - sm, ap_ - rd, pb - ap_, after(woke, pb) - pb,
                   after(wakes, pb) - pb, got[i][1] - after(wakes, pb), got[i][1] - s)
            if args.broker_steps:
                hd = after(steps["handler"], rd)
                ps = after(steps["publishing"], ap_)
                step_rows.append((hd - rd, ap_ - hd, ps - ap_, pb - ps))
            rows.append(row)
        except LookupError:
            continue        # under load a consumer may take the last records without sleeping
    if not rows:
        raise SystemExit("latency_hops: no record had every stamp (an overloaded box?)")
    print(f"{n} records at {args.rate:g}/s, 100 B, acks=1, linger_ms=0, spin: broker "
          f"{args.broker_spin_us} us, consumer {args.consumer_spin_us} us"
          f"{', a group member' if args.group else ''} (first fifth skipped)")
    for j, name in enumerate(HOPS):
        v = sorted(r[j] for r in rows)
        print(f"{name:34s} p50 {v[len(v) // 2] / 1000:7.1f} us   "
              f"p90 {v[int(len(v) * 0.9)] / 1000:7.1f} us")
    for j, name in enumerate(BROKER_STEPS if step_rows else []):
        v = sorted(r[j] for r in step_rows)
        print(f"{name:34s} p50 {v[len(v) // 2] / 1000:7.1f} us")
    broker.request_stop()       # a clean stop: its shared memory and semaphores go too
    serving.join(30)
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
