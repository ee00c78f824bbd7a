"""The order events of ``mq demo --spark`` and the processes that produce them.

An order event is a JSON object, keyed by its customer (``customer-0`` .. ``customer-19``)::

    {"order_id": "1-42", "customer": "customer-7", "amount": 123.45,
     "event_time": "2026-11-25T00:29:08.303Z"}

``event_time`` is when the order happened: up to ``LATE_MS`` before it is produced, so events
reach the topic late and out of order (by far less than the pipeline's 5 s watermark, so
none is dropped unless a producer stalls for seconds). ``amount`` has two decimals; each
producer reports the sum it sent in cents, which the demo checks the totals against.

Producers are forked before Spark starts (a JVM gateway and its threads are not to be
forked), wait for a go, and then send open loop: order ``i`` of a producer is due ``i / rate``
seconds after the go, so a stall is caught up rather than spread out.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import queue
import random
import time

from mq.errors import MQError

__all__ = ["CUSTOMERS", "LATE_MS", "Producers", "iso_ms", "order_event"]

CUSTOMERS = 20
LATE_MS = 1000              # an order reaches the topic up to this long after it happened
READY_S = 60.0


def _worker_signals() -> None:
    """Ctrl-C reaches only the parent, which stops the producers; and a producer dies with the
    parent (Linux's PR_SET_PDEATHSIG), so a demo killed with SIGKILL leaves none behind."""
    import ctypes
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)                      # the parent died before the line above


def iso_ms(ms: int) -> str:
    """``2026-11-25T00:29:08.303Z``: an epoch time in milliseconds, as the events carry it."""
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def order_event(order_id: str, customer: str, cents: int, event_ms: int) -> bytes:
    return (f'{{"order_id": "{order_id}", "customer": "{customer}", '
            f'"amount": {cents // 100}.{cents % 100:02d}, '
            f'"event_time": "{iso_ms(event_ms)}"}}').encode()


def _produce(index: int, clients: dict, topic: str, count: int, rate: float, go, sent,
             results) -> None:
    """Write ``count`` orders at ``rate`` per second (open loop: order ``i`` is due at
    ``i / rate`` s after the go; 0 = unpaced) with ``mq.Producer(**clients)`` (the local broker
    or a Kafka cluster). Reports its total of cents."""
    _worker_signals()
    try:
        from mq.client.producer import Producer
        rng = random.Random(index)
        failed: list = []
        cents_total = 0
        with Producer(**clients) as producer:
            producer.partitions_for(topic)              # metadata before the go
            results.put(("ready", index, None))
            go.wait()
            start = time.monotonic()
            seq = 0
            while seq < count:
                due = count if rate <= 0 else \
                    min(count, int((time.monotonic() - start) * rate) + 1)
                if seq >= due:
                    time.sleep(max(0.0, min(0.01, seq / rate - (time.monotonic() - start))))
                    continue
                now_ms = int(time.time() * 1000)
                for i in range(seq, due):
                    customer = f"customer-{rng.randrange(CUSTOMERS)}"
                    cents = rng.randrange(100, 50_000)
                    cents_total += cents
                    value = order_event(f"{index}-{i}", customer, cents,
                                        now_ms - rng.randrange(LATE_MS))
                    producer.send(topic, value, key=customer.encode()) \
                        .add_errback(failed.append)
                seq = due
                sent.value = seq
            producer.flush()
        if failed:
            raise failed[0]
        results.put(("done", index, {"orders": count, "cents": cents_total,
                                     "seconds": time.monotonic() - start}))
    except BaseException as err:  # noqa: BLE001 -- reported to the parent, which prints it
        results.put(("error", index, f"{type(err).__name__}: {err}"))


class Producers:
    """The producer processes and what they reported."""

    def __init__(self, clients: dict, topic: str, records: int, rate: int,
                 processes: int = 2) -> None:
        ctx = multiprocessing.get_context("fork")
        self.results = ctx.Queue()
        self.go = ctx.Event()
        self.sent = [ctx.RawValue("q", 0) for _ in range(processes)]
        counts = [records // processes + (i < records % processes) for i in range(processes)]
        self.procs = [ctx.Process(target=_produce, name=f"mq-demo-producer-{i}", daemon=True,
                                  args=(i, clients, topic, counts[i], rate / processes,
                                        self.go, self.sent[i], self.results))
                      for i in range(processes)]
        self.ready = 0
        self.done: dict[int, dict] = {}

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def collect(self, timeout: float) -> None:
        """Take the reports in, for up to ``timeout`` s; raise ``MQError`` for a failed or
        dead producer."""
        try:
            while True:
                kind, index, payload = self.results.get(timeout=timeout)
                timeout = 0
                if kind == "error":
                    raise MQError(f"demo producer {index} failed: {payload}")
                if kind == "ready":
                    self.ready += 1
                else:
                    self.done[index] = payload
        except queue.Empty:
            pass
        for i, p in enumerate(self.procs):
            if p.exitcode not in (None, 0) and i not in self.done:
                raise MQError(f"demo producer {i} exited with status {p.exitcode}")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while self.ready < len(self.procs):
            self.collect(0.2)
            if time.monotonic() > deadline:
                raise MQError(f"the demo's producers did not start within {READY_S:.0f} s")

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.procs)

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
            p.join(10)
