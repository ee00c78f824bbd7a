"""The producer's small-records send path alone: Python cost per record of ``send()`` and
``send_many()`` into a real broker, without a consumer competing for the 2 vCPUs.

Why a bench of its own: ``bench.e2e`` measures the whole pipe (producer, broker, consumer),
where the producer's per-record cost is one term among several; tuning it needs that term
alone, and a profile of it (``--profile``).

    python3 -m bench.producer_path [--n 1000000] [--size 100] [--mode send|send_many]
                                   [--profile] [--pure]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time


def run(n: int, size: int, mode: str, profile: bool, batch: int) -> dict:
    import mq
    from mq.testing import broker
    values = [os.urandom(size) for _ in range(64)]
    with tempfile.TemporaryDirectory() as d, broker(d) as b:
        mq.Admin(b.socket).create_topic("t", 1)
        p = mq.Producer(socket=b.socket, acks=1, linger_ms=10, batch_size=1 << 20)
        p.partitions_for("t")
        k = len(values)
        chunk = [values[i % k] for i in range(batch)]
        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        c0, t0, th0 = time.process_time(), time.perf_counter(), time.thread_time()
        if mode == "send":
            send = p.send
            for i in range(n):
                send("t", values[i % k])
        else:
            send_many = p.send_many
            for _ in range(n // batch):
                send_many("t", chunk)
        t1, th1 = time.perf_counter(), time.thread_time()
        p.flush()
        t2, c2 = time.perf_counter(), time.process_time()
        if prof:
            prof.disable()
        p.close()
    out = {"mode": mode, "n": n, "size": size, "send_us_per_record": (t1 - t0) / n * 1e6,
           "caller_cpu_us_per_record": (th1 - th0) / n * 1e6,
           "total_rate": n / (t2 - t0), "cpu_us_per_record": (c2 - c0) / n * 1e6,
           "c_codec": os.environ.get("MQ_PURE_PYTHON", "") in ("", "0")}
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--mode", choices=("send", "send_many"), default="send")
    ap.add_argument("--batch", type=int, default=1000, help="records per send_many call")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    print(run(args.n, args.size, args.mode, args.profile, args.batch))


if __name__ == "__main__":
    main()
