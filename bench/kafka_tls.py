"""What SASL_SSL costs a Kafka broker against PLAINTEXT (issue 21), for mq's Kafka listener and
for Apache Kafka itself, side by side: broker CPU per GB produced and fetched.

::

    python3 -m bench.kafka_tls [--mb 256] [--size 65536] [--consumers 1,4] [--runs 3]
                               [--brokers mq,kafka] [--dir /tmp] [--out bench/out/kafka_tls.json]

Each broker serves a PLAINTEXT listener and a SASL_SSL one: a self-signed P-256 certificate
made with the ``openssl`` CLI, TLS 1.3 (the suite each picks is recorded, asked with
``openssl s_client``), then SCRAM-SHA-256 as user ``bench``. mq: ``kafka_listeners`` with
``SASL_SSL://``, the user added with ``Admin.add_user`` and named in ``kafka_super_users``.
Kafka 4.3.1 (``bench.kafka_peer``): a ``SASL_SSL`` listener with a PEM key store, the user
written at format time, no authorizer. Both run for the whole bench; every figure below is
paired with the other listener of the same broker in the same repetition, the four (broker,
listener) sides in an order rotated run by run.

- **produce**: one librdkafka producer process (linger.ms 5, acks=1) writes ``--mb`` MB of
  ``--size``-byte records into partition 0 of a fresh topic; the broker's CPU (schedstat,
  ``harness.process_cpu``, all threads) per GB of values written.
- **fetch**: a topic of ``--mb`` MB written once per broker (untimed, over PLAINTEXT) is read
  from offset 0 by 1 and 4 librdkafka consumer processes (each assigned the whole topic); the
  broker's CPU per GB of values received, and each consumer's rate. Over PLAINTEXT both brokers
  send the log with ``sendfile``; over TLS both read and encrypt it in user space.

Durability is each broker's default (acks=1 is answered from the page cache on both).
Reported: CPU-s per GB on each listener, SASL_SSL : PLAINTEXT per broker, and mq : Kafka on
each listener, medians (min-max) of paired ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.harness import machine_facts, process_cpu, rotated

BROKERS = ("mq", "kafka")
LISTENERS = ("plain", "tls")
USER, PASSWORD = "bench", "bench-secret"
_OPENSSL = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
_PRODUCER = {"linger.ms": 5, "acks": 1, "log.connection.close": False}


class Endpoint:
    """One broker as the bench sees it: its two listeners' client settings and its pid."""

    def __init__(self, name: str, pid: int, plain: str, secure: str, cafile: str) -> None:
        self.name = name
        self.pid = pid
        self.conf = {"plain": {"bootstrap.servers": plain},
                     "tls": {"bootstrap.servers": secure, "security.protocol": "sasl_ssl",
                             "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": USER,
                             "sasl.password": PASSWORD, "ssl.ca.location": cafile}}
        self.secure = secure
        self._n = 0

    def topic(self) -> str:
        """A fresh one-partition topic, created over PLAINTEXT, with a leader."""
        from confluent_kafka.admin import AdminClient, NewTopic
        self._n += 1
        name = f"tls-{os.getpid()}-{self._n}"
        admin = AdminClient(self.conf["plain"])
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meta = admin.list_topics(name, timeout=5).topics.get(name)
            if meta is not None and meta.error is None and meta.partitions and \
                    meta.partitions[0].leader >= 0:
                return name
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: topic {name} has no leader")

    def drop(self, topic: str) -> None:
        from confluent_kafka.admin import AdminClient
        with contextlib.suppress(Exception):    # a leftover topic only costs disk
            AdminClient(self.conf["plain"]).delete_topics([topic])[topic].result(30)

    def cipher(self) -> str:
        """The TLS version and suite the secure listener picks for OpenSSL's defaults."""
        out = subprocess.run(["openssl", "s_client", "-brief", "-connect", self.secure],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=30).stderr
        got = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
        return f"{got.get('Protocol version', '?')} {got.get('Ciphersuite', '?')}"


@contextlib.contextmanager
def mq_endpoint(base: str, cert: str, key: str):
    import mq.testing
    from mq.client.admin import Admin
    conf = os.path.join(base, "mq.toml")
    with open(conf, "w") as f:
        f.write('kafka_listeners = ["127.0.0.1:0", "SASL_SSL://127.0.0.1:0"]\n'
                f'kafka_ssl_certfile = "{cert}"\nkafka_ssl_keyfile = "{key}"\n'
                f'kafka_super_users = ["{USER}"]\n')
    with mq.testing.broker(os.path.join(base, "mq-data"), config_file=conf) as b:
        with Admin(b.socket) as admin:
            admin.add_user(USER, PASSWORD)
            plain, secure = admin.broker_stats()["broker"]["kafka_listeners"]
        yield Endpoint("mq", b.pid, plain, secure.removeprefix("SASL_SSL://"), cert)


@contextlib.contextmanager
def kafka_endpoint(base: str, cert: str, key: str):
    from bench.kafka_peer import KafkaNode, SaslSsl
    with KafkaNode(os.path.join(base, "kafka"), sasl_ssl=SaslSsl(cert, key, {USER: PASSWORD})
                   ) as k:
        yield Endpoint("kafka", k.pid, k.bootstrap, k.secure_bootstrap, cert)


# --- workers (forked; librdkafka made after the fork) ----------------------------------------

def _produce(conf: dict, topic: str, value: bytes, n: int) -> None:
    from confluent_kafka import Producer
    p = Producer({**conf, **_PRODUCER})
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value=value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300):
        raise RuntimeError(f"{topic}: records left undelivered")


def _consume(conf: dict, topic: str, end: int, out) -> None:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({**conf, "group.id": "bench-tls", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 10})
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


_fork = multiprocessing.get_context("fork")


def produce_once(ep: Endpoint, listener: str, value: bytes, n: int) -> dict:
    topic = ep.topic()
    try:
        proc = _fork.Process(target=_produce, args=(ep.conf[listener], topic, value, n))
        cpu0, t0 = process_cpu(ep.pid), time.perf_counter()
        proc.start()
        proc.join(600)
        cpu, secs = process_cpu(ep.pid) - cpu0, time.perf_counter() - t0
    finally:
        ep.drop(topic)
    if proc.exitcode != 0:
        raise RuntimeError(f"{ep.name} {listener}: the producer exited with {proc.exitcode}")
    gb = n * len(value) / 1e9
    return {"cpu_s_per_gb": cpu / gb, "mb_per_s": gb * 1e3 / secs}


def fetch_once(ep: Endpoint, listener: str, topic: str, end: int, consumers: int) -> dict:
    q = _fork.Queue()
    procs = [_fork.Process(target=_consume, args=(ep.conf[listener], topic, end, q))
             for _ in range(consumers)]
    cpu0 = process_cpu(ep.pid)
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    cpu = process_cpu(ep.pid) - cpu0
    for p in procs:
        p.join()
    sent = sum(r[0] for r in results)
    return {"cpu_s_per_gb": cpu / (sent / 1e9),
            "mb_per_s_each": statistics.median(r[0] / r[1] / 1e6 for r in results)}


def idle_cpu(pid: int, seconds: float = 2.0) -> float:
    """CPU seconds per second a broker uses with no client (Kafka's JVM has timers, GC and
    the controller's heartbeats; the figures above include that background)."""
    cpu0 = process_cpu(pid)
    time.sleep(seconds)
    return (process_cpu(pid) - cpu0) / seconds


# --- the comparison ---------------------------------------------------------------------------

def median_range(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": list(values)}


def compare(per: dict[tuple[str, str], list[dict]], key: str = "cpu_s_per_gb") -> dict:
    """From ``{(broker, listener): [one result per run]}``: each side's figure, each broker's
    tls:plain ratio and, when both brokers ran, mq:kafka on each listener; every ratio paired
    run by run."""
    def ratios(a: tuple[str, str], b: tuple[str, str]) -> dict:
        return median_range([x[key] / y[key] for x, y in zip(per[a], per[b], strict=True)])
    brokers = sorted({b for b, _ in per}, key=BROKERS.index)
    out = {"sides": {f"{b} {lis}": median_range([x[key] for x in per[(b, lis)]])
                     for b in brokers for lis in LISTENERS},
           "tls_vs_plain": {b: ratios((b, "tls"), (b, "plain")) for b in brokers}}
    if len(brokers) == 2:
        out["mq_vs_kafka"] = {lis: ratios(("mq", lis), ("kafka", lis)) for lis in LISTENERS}
    return out


def report_lines(what: str, cmp: dict) -> list[str]:
    """The table rows of one measurement (``compare``'s result)."""
    def fig(s: dict, unit: str = "") -> str:
        return f"{s['median']:.2f}{unit} ({s['min']:.2f}-{s['max']:.2f})"
    lines = [f"{what} {side:11}: broker {fig(s)} CPU-s/GB" for side, s in cmp["sides"].items()]
    lines += [f"{what} {b:5} SASL_SSL/PLAINTEXT: {fig(r, 'x')}"
              for b, r in cmp["tls_vs_plain"].items()]
    lines += [f"{what} mq/Kafka on {lis:5}: {fig(r, 'x')}"
              for lis, r in cmp.get("mq_vs_kafka", {}).items()]
    return lines


def _paired_runs(endpoints: dict[str, Endpoint], runs: int, one) -> dict:
    """``one(endpoint, listener)`` for every side, once untimed (the JVM compiles its hot
    paths: Kafka's first pass costs it several times the CPU of the next), then ``runs``
    times in a rotated order."""
    sides = [(b, lis) for b in endpoints for lis in LISTENERS]
    for side in sides:
        one(endpoints[side[0]], side[1])
    per: dict = {s: [] for s in sides}
    for r in range(runs):
        for side in rotated(sides, r):
            per[side].append(one(endpoints[side[0]], side[1]))
    return per


def fill(ep: Endpoint, value: bytes, n: int) -> str:
    topic = ep.topic()
    proc = _fork.Process(target=_produce, args=(ep.conf["plain"], topic, value, n))
    proc.start()
    proc.join(600)
    if proc.exitcode != 0:
        raise RuntimeError(f"{ep.name}: filling {topic} failed")
    return topic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.kafka_tls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=256, help="MB of values per topic")
    p.add_argument("--size", type=int, default=65536, help="bytes per record")
    p.add_argument("--consumers", default="1,4")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--brokers", default=",".join(BROKERS), help="mq, kafka or both")
    p.add_argument("--dir", default=None, help="parent of the temp dir (brokers' data)")
    p.add_argument("--out", default="bench/out/kafka_tls.json", help="JSON output path")
    args = p.parse_args(argv)
    names = [b for b in args.brokers.split(",") if b]
    if not names or set(names) - set(BROKERS):
        p.error(f"--brokers takes {' and/or '.join(BROKERS)}")
    opens = {"mq": mq_endpoint, "kafka": kafka_endpoint}
    n = args.mb * 1_000_000 // args.size
    value = os.urandom(args.size)
    res: dict = {"params": vars(args), "records": n, "produce": None, "fetch": {}}
    with tempfile.TemporaryDirectory(prefix="mq-tls-", dir=args.dir) as base, \
            contextlib.ExitStack() as stack:
        res["meta"] = machine_facts(base)
        cert, key = os.path.join(base, "broker.pem"), os.path.join(base, "broker.key")
        subprocess.run([*_OPENSSL, "-keyout", key, "-out", cert], check=True,
                       capture_output=True)
        eps = {b: stack.enter_context(opens[b](base, cert, key)) for b in BROKERS
               if b in names}
        res["tls"] = {b: ep.cipher() for b, ep in eps.items()}
        res["idle_cpu"] = {b: idle_cpu(ep.pid) for b, ep in eps.items()}
        print(f"{n} records of {args.size} B ({n * args.size / 1e6:.0f} MB), {args.runs} runs "
              f"after one untimed, median (min-max); TLS: "
              + ", ".join(f"{b} {c}" for b, c in res["tls"].items()) + "; at rest: "
              + ", ".join(f"{b} {c * 1e3:.1f} ms CPU/s" for b, c in res["idle_cpu"].items()))
        per = _paired_runs(eps, args.runs, lambda ep, lis: produce_once(ep, lis, value, n))
        res["produce"] = {"runs": {" ".join(k): v for k, v in per.items()}, **compare(per)}
        print("\n".join(report_lines("produce", res["produce"])), flush=True)
        topics = {b: fill(ep, value, n) for b, ep in eps.items()}
        for consumers in map(int, args.consumers.split(",")):
            per = _paired_runs(eps, args.runs, lambda ep, lis, k=consumers: fetch_once(
                ep, lis, topics[ep.name], n, k))
            res["fetch"][str(consumers)] = cmp = {
                "runs": {" ".join(k): v for k, v in per.items()}, **compare(per)}
            print("\n".join(report_lines(f"fetch x{consumers}", cmp)), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"JSON: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
