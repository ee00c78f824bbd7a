"""Large records, 1 producer -> 1 consumer: mq against mp.Queue and the raw page-cache write.

    python3 -m bench.large_records [--size 65536] [--mib 512] [--runs 3] [--profile out.txt]

A focused companion of ``bench.e2e``'s throughput row for one record size, quick enough to run
before and after a change to the broker's produce path (issue 13: 64 KiB records at >= 0.7x
the raw sequential page-cache write, >= 2x ``mp.Queue``). Each run measures, interleaved and in
the same conditions (``harness.prefault`` before each): mq with ``bench.e2e``'s producer and
consumer workers and settings (acks=1, 1 MiB batches), batches through the producer's arena
("mq") and through the socket ("mq socket", ``shared_batches=False``), ``mp.Queue`` with
``bench.peers``' workers, and ``harness.raw_write`` of the same bytes in 1 MiB writes.
``--profile`` runs ``py-spy record`` on the broker during the mq runs and writes its flat top
functions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from bench import harness, peers
from bench.mq_workers import MQ_THROUGHPUT, mq_consumer, mq_producer
from bench.harness import MIB, run_workers, summary


def one_mq(socket: str, broker_pid: int, topic: str, values: list[bytes], n: int,
           shared_batches: bool = True) -> dict:
    jobs = [(mq_producer, dict(socket=socket, topic=topic, values=values, n=n,
                               shared_batches=shared_batches, **MQ_THROUGHPUT)),
            (mq_consumer, {"socket": socket, "topic": topic, "partitions": [0], "n": n})]
    meter = lambda: harness.process_cpu(broker_pid)     # noqa: E731
    (prod, cons), cpu0, cpu1 = run_workers(jobs, 300.0, meter, meter)
    res = _result(prod, cons, n, len(values[0]))
    res["broker_cpu_us_per_mib"] = (cpu1 - cpu0) * 1e6 / (n * len(values[0]) / MIB)
    return res


def one_mpq(values: list[bytes], n: int) -> dict:
    q = harness.CTX.Queue()
    try:
        jobs = [(peers.mpq_producer, {"queue": q, "values": values, "n": n}),
                (peers.mpq_consumer, {"queue": q, "n": n})]
        (prod, cons), _, _ = run_workers(jobs, 300.0)
    finally:
        q.close()
    return _result(prod, cons, n, len(values[0]))


def _result(prod: dict, cons: dict, n: int, size: int) -> dict:
    if cons["n"] != n or cons["bytes"] != n * size:
        raise harness.WorkerError(f"consumer got {cons['n']} records / {cons['bytes']} bytes, "
                                  f"expected {n} / {n * size}")
    secs = (cons["t_last"] - prod["t_first"]) / 1e9
    return {"seconds": secs, "mb_s": n * size / secs / 1e6,
            "producer_cpu_s": prod.get("cpu_s"), "consumer_cpu_s": cons.get("cpu_s")}


def _py_spy(pid: int, out: str) -> subprocess.Popen | None:
    exe = shutil.which("py-spy")
    if exe is None:
        harness.progress("py-spy not found: no profile")
        return None
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--format", "raw",
                             "--rate", "500", "--nonblocking", "-o", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    import mq
    from mq.testing import broker
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--mib", type=int, default=512, help="bytes per run, MiB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", help="py-spy raw (collapsed) stacks of the broker")
    args = parser.parse_args(argv)
    values = harness.payloads(args.size, 64)
    n = args.mib * MIB // args.size
    total = n * args.size
    base = tempfile.mkdtemp(prefix="mq-large-")
    systems = ["mq", "mq socket", "mp.Queue", "raw"]
    per: dict[str, list[float]] = {system: [] for system in systems}
    cpu: dict[str, list[float]] = {f"{system} {side}": [] for system in systems[:2]
                                   for side in ("broker", "producer", "consumer")}
    try:
        with broker(os.path.join(base, "data")) as b:
            admin = mq.Admin(socket=b.socket)
            spy = _py_spy(b.pid, args.profile) if args.profile else None
            for r in range(args.runs + 1):          # run 0 warms up and is discarded
                for system in harness.rotated(systems, r):
                    harness.prefault(base, total)
                    if system.startswith("mq"):
                        topic = f"large-{r}"
                        admin.create_topic(topic, 1)
                        res = one_mq(b.socket, b.pid, topic, values, n,
                                     shared_batches=system == "mq")
                        admin.delete_topic(topic)
                        mb_s = res["mb_s"]
                        if r:
                            cpu[f"{system} broker"].append(res["broker_cpu_us_per_mib"])
                            for side in ("producer", "consumer"):
                                cpu[f"{system} {side}"].append(
                                    res[f"{side}_cpu_s"] * 1e6 * MIB / total)
                    elif system == "mp.Queue":
                        mb_s = one_mpq(values, n)["mb_s"]
                    else:
                        mb_s = total / harness.raw_write(base, total) / 1e6
                    if r:
                        per[system].append(mb_s)
                    harness.progress(f"run {r} {system}: {mb_s:.0f} MB/s")
            if spy is not None:
                spy.send_signal(signal.SIGINT)       # py-spy writes its file on SIGINT
                spy.wait()
            admin.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    stats = {k: summary(v) for k, v in per.items()}
    ratios = {peer: summary([a / b for a, b in zip(per["mq"], per[peer], strict=True)])
              for peer in ("mq socket", "mp.Queue", "raw")}
    print(f"{args.size} B records, {args.mib} MiB per run, {args.runs} runs (median, min-max)")
    for k, s in stats.items():
        print(f"  {k:13s} {s['median']:7.0f} MB/s  ({s['min']:.0f}-{s['max']:.0f})")
    for k, s in ratios.items():
        print(f"  mq / {k:9s} {s['median']:.2f}x  ({s['min']:.2f}-{s['max']:.2f})")
    for k, v in cpu.items():
        s = summary(v)
        print(f"  {k:18s} CPU {s['median']:6.0f} us/MiB  ({s['min']:.0f}-{s['max']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
