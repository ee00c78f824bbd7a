"""What TLS costs the Kafka listener (issue 21): broker CPU per GB fetched, TLS against plain.

::

    python3 -m bench.kafka_tls [--mb 256] [--size 65536] [--consumers 1,4] [--runs 3]
                               [--dir /tmp]

One broker serves a plain listener and an ``SSL://`` one (a self-signed P-256 certificate made
with the ``openssl`` CLI, TLS 1.3, AES-256-GCM as OpenSSL picks it). A topic of ``--mb`` MB of
``--size``-byte records is written once (untimed); then 1 and 4 librdkafka consumer processes
(each assigned the whole topic) read it from offset 0, over plain TCP (Fetch's records sent
with ``sendfile``) and over TLS (read with ``pread`` and encrypted, 256 KiB at a time), the
sides alternating run by run. Reported: the broker's CPU (schedstat, ``harness.process_cpu``)
per GB of values the consumers received, the consumers' own rate, and the TLS:plain ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.harness import process_cpu

_OPENSSL = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]


def _consume(bootstrap: str, conf: dict, topic: str, end: int, out) -> None:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-tls",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 100, **conf})
    c.assign([TopicPartition(topic, 0, 0)])
    got = size = 0
    started = time.perf_counter()
    while got < end:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                got += 1
                size += len(m.value())
    out.put((size, time.perf_counter() - started))
    c.close()


def one(bootstrap: str, conf: dict, topic: str, end: int, consumers: int, pid: int) -> dict:
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_consume, args=(bootstrap, conf, topic, end, q))
             for _ in range(consumers)]
    cpu0 = process_cpu(pid)
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    cpu = process_cpu(pid) - cpu0
    for p in procs:
        p.join()
    sent = sum(r[0] for r in results)
    return {"cpu_s_per_gb": cpu / (sent / 1e9),
            "mb_per_s_each": statistics.median(r[0] / r[1] / 1e6 for r in results)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.kafka_tls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--size", type=int, default=65536)
    p.add_argument("--consumers", default="1,4")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    from confluent_kafka import Producer

    import mq.testing
    from mq.client.admin import Admin
    with tempfile.TemporaryDirectory(dir=args.dir) as base:
        cert, key = os.path.join(base, "broker.pem"), os.path.join(base, "broker.key")
        subprocess.run([*_OPENSSL, "-keyout", key, "-out", cert], check=True,
                       capture_output=True)
        conf = os.path.join(base, "mq.toml")
        with open(conf, "w") as f:
            f.write('kafka_listeners = ["127.0.0.1:0", "SSL://127.0.0.1:0"]\n'
                    f'kafka_ssl_certfile = "{cert}"\nkafka_ssl_keyfile = "{key}"\n')
        with mq.testing.broker(os.path.join(base, "data"), config_file=conf) as b:
            with Admin(b.socket) as admin:
                plain, secure = admin.broker_stats()["broker"]["kafka_listeners"]
                secure = secure.removeprefix("SSL://")      # shown with its protocol
            n = args.mb * 1_000_000 // args.size
            prod = Producer({"bootstrap.servers": plain, "linger.ms": 5})
            value = os.urandom(args.size)
            for _ in range(n):
                while True:
                    try:
                        prod.produce("tls", value=value, partition=0)
                        break
                    except BufferError:
                        prod.poll(0.1)
            assert prod.flush(120) == 0
            sides = {"plain": (plain, {}),
                     "tls": (secure, {"security.protocol": "ssl", "ssl.ca.location": cert})}
            print(f"{n} records of {args.size} B ({n * args.size / 1e6:.0f} MB), "
                  f"{args.runs} runs, median (min-max)", file=sys.stderr)
            for consumers in map(int, args.consumers.split(",")):
                per: dict[str, list[dict]] = {"plain": [], "tls": []}
                for run in range(args.runs):
                    for side in (["plain", "tls"] if run % 2 == 0 else ["tls", "plain"]):
                        per[side].append(one(*sides[side], "tls", n, consumers, b.pid))
                ratios = [t["cpu_s_per_gb"] / p_["cpu_s_per_gb"]
                          for t, p_ in zip(per["tls"], per["plain"])]
                for side, rows in per.items():
                    cpu = [r["cpu_s_per_gb"] for r in rows]
                    rate = [r["mb_per_s_each"] for r in rows]
                    print(f"x{consumers} {side:5}: broker {statistics.median(cpu):.2f} CPU-s/GB "
                          f"({min(cpu):.2f}-{max(cpu):.2f}); each consumer "
                          f"{statistics.median(rate):.0f} MB/s")
                print(f"x{consumers} tls/plain broker CPU per GB: "
                      f"{statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
