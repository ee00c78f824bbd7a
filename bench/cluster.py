"""What a user gains and loses moving mq's code from one host to a Kafka cluster: the same
``mq.Producer`` and ``mq.Consumer`` on the local broker (Unix socket and maps), on mq's own
Kafka listener (``bootstrap_servers=``, librdkafka underneath) and on a three-node Apache
Kafka cluster (``bench.kafka_cluster``: replication factor 3, ``min.insync.replicas=2``), in
one run, and how long a write stalls when a node dies.

::

    python3 -m bench.cluster [--quick] [--runs 5] [--only clients,failover] [--records N]
                             [--bootstrap-server HOST:PORT,...]
                             [--out bench/out/cluster.json] [--dir /tmp] [--wait-idle 300]

Sections (``--only``):

- ``clients``: one producer process sends ``--records`` records of 100 B (``acks="all"``,
  idempotent: the defaults) to a topic of 3 partitions and flushes; then one consumer
  process reads them all. Reported per target: records/s and the client process's CPU per
  record (all its threads: librdkafka's too), with ratios against the local broker.
  Durability differs and is stated with each row: locally ``acks="all"`` is an fsync; on the
  cluster it is two of three replicas' page caches.
- ``failover``: a producer sends 2,000 records/s (``acks="all"``) over 3 partitions while a
  node is killed with SIGKILL: on the cluster, one Kafka node (the cluster notices a dead node
  after ``broker.session.timeout.ms``, 3 s as the tests run it, 9 s by Kafka's defaults); on
  one host, the broker itself, restarted at once (as systemd's ``Restart=always`` would). The
  figure is the longest gap between two acknowledgements after the kill, and the check that
  every acknowledged record is read back.

Prints a table on stdout, progress on stderr, writes every number as JSON (see bench/README.md,
"Beyond one host").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time

from bench import harness
from bench.harness import progress, quiet_gc

SECTIONS = ("clients", "failover")
VALUE = b"x" * 100
PARTITIONS = 3
RATE = 2000.0


# --- the timed clients (each in its own process) ------------------------------------------------

def _produce(start, where: dict, topic: str, n: int) -> dict:
    import mq
    p = mq.Producer(**where)
    p.partitions_for(topic)
    send = p.send
    quiet_gc()
    start()
    t0 = time.perf_counter_ns()
    for i in range(n):
        send(topic, VALUE)
    p.flush()
    t1 = time.perf_counter_ns()
    cpu = harness.cpu_seconds()
    p.close()
    return {"t_first": t0, "t_end": t1, "n": n, "cpu_s": cpu}


def _consume(start, where: dict, topic: str, n: int, timeout_s: float = 120.0) -> dict:
    import mq
    c = mq.Consumer(topic, **where)
    quiet_gc()
    start()
    t0 = time.perf_counter_ns()
    got = 0
    deadline = time.monotonic() + timeout_s
    while got < n and time.monotonic() < deadline:
        for records in c.poll(1000, 10_000).values():
            got += len(records)
    t1 = time.perf_counter_ns()
    cpu = harness.cpu_seconds()
    c.close()
    return {"t_first": t0, "t_end": t1, "n": got, "cpu_s": cpu}


def _rate_and_cpu(result: dict) -> dict:
    seconds = (result["t_end"] - result["t_first"]) / 1e9
    return {"records_per_s": result["n"] / seconds,
            "cpu_us_per_record": result["cpu_s"] / max(1, result["n"]) * 1e6,
            "n": result["n"]}


# --- the targets ------------------------------------------------------------------------------

@contextlib.contextmanager
def _targets(base: str, which: list[str], servers: str | None = None):
    """``{name: client arguments}`` for the local broker, mq's Kafka listener and the Kafka
    cluster (as asked: ``servers``' if given, else one started here), all running until the
    block ends."""
    import mq
    from bench.kafka_cluster import KafkaCluster
    with contextlib.ExitStack() as stack:
        out: dict[str, dict] = {}
        if "mq" in which or "mq-listener" in which:
            os.makedirs(os.path.join(base, "mq"))
            broker = harness.kafka_listener_broker(os.path.join(base, "mq"))
            stack.callback(broker.close)
            with mq.Admin(broker.socket) as admin:
                [listener] = admin.broker_stats()["broker"]["kafka_listeners"]
            out["mq"] = {"socket": broker.socket}
            out["mq-listener"] = {"bootstrap_servers": listener.rpartition("://")[2]}
        if "kafka" in which and servers is not None:
            out["kafka"] = {"bootstrap_servers": servers}
        elif "kafka" in which:
            progress("starting a three-node Kafka cluster")
            cluster = stack.enter_context(KafkaCluster(os.path.join(base, "kafka"),
                                                       fast_failover=True))
            out["kafka"] = {"bootstrap_servers": cluster.bootstrap, "cluster": cluster}
        yield out


def _topic(where: dict, name: str) -> None:
    import mq
    args = {k: v for k, v in where.items() if k != "cluster"}
    with mq.Admin(**args) as admin:
        admin.create_topic(name, PARTITIONS)


def clients(base: str, runs: int, n: int, servers: str | None) -> dict:
    out: dict = {"records": n, "value_bytes": len(VALUE), "partitions": PARTITIONS, "runs": [],
                 "cluster": servers or "three nodes started by the benchmark"}
    with _targets(base, ["mq", "mq-listener", "kafka"], servers) as targets:
        for r in range(runs):
            row = {}
            for name in harness.rotated(list(targets), r):
                where = {k: v for k, v in targets[name].items() if k != "cluster"}
                topic = f"clients-{name}-{r}"
                _topic(targets[name], topic)
                progress(f"run {r + 1}/{runs}: {name}: produce {n}")
                [produced], _, _ = harness.run_workers([(_produce, {"where": where,
                                                                    "topic": topic, "n": n})],
                                                       timeout=600)
                [consumed], _, _ = harness.run_workers([(_consume, {"where": where,
                                                                    "topic": topic, "n": n})],
                                                       timeout=600)
                row[name] = {"produce": _rate_and_cpu(produced),
                             "consume": _rate_and_cpu(consumed)}
            out["runs"].append(row)
    return out


# --- failover ----------------------------------------------------------------------------------

def _paced(where: dict, topic: str, stop: threading.Event, acks: list, errors: list) -> None:
    """Send ``RATE`` records/s until ``stop``; each acknowledgement's (time, value) into
    ``acks``."""
    import mq
    with mq.Producer(**where, linger_ms=1) as p:
        i = 0
        t0 = time.monotonic()
        while not stop.is_set():
            fut = p.send(topic, b"%d" % i)
            fut.add_callback(lambda md, v=i: acks.append((time.monotonic(), v)))
            fut.add_errback(errors.append)
            i += 1
            delay = t0 + i / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        p.flush(120)


def _read_back(where: dict, topic: str, want: set, timeout_s: float = 120.0) -> set:
    import mq
    seen: set = set()
    with mq.Consumer(topic, **where) as c:
        deadline = time.monotonic() + timeout_s
        while not want <= seen and time.monotonic() < deadline:
            for records in c.poll(500).values():
                seen.update(int(r.value) for r in records)
    return seen


def _one_failover(where: dict, topic: str, kill, revive) -> dict:
    acks: list = []
    errors: list = []
    stop = threading.Event()
    sender = threading.Thread(target=_paced, args=(where, topic, stop, acks, errors))
    sender.start()
    try:
        harness_wait(lambda: len(acks) > RATE, 30)           # a second of steady sending
        killed_at = time.monotonic()
        kill()
        revive()
        harness_wait(lambda: acks and acks[-1][0] > killed_at + 2, 120)
        time.sleep(1)
    finally:
        stop.set()
        sender.join()
    times = sorted(t for t, _ in acks if t >= killed_at - 1)
    gap = max((b - a for a, b in zip(times, times[1:])), default=None)
    acked = {v for _, v in acks}
    lost = len(acked - _read_back(where, topic, acked))
    return {"longest_ack_gap_ms": None if gap is None else gap * 1000, "acked": len(acked),
            "lost": lost, "failed_sends": len(errors)}


def harness_wait(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("failover: the producer did not get going again")
        time.sleep(0.01)


def failover(base: str, runs: int) -> dict:
    import mq.testing
    out: dict = {"rate": RATE, "kafka": [], "mq": []}
    with _targets(base, ["kafka"]) as targets:
        cluster = targets["kafka"]["cluster"]
        where = {"bootstrap_servers": cluster.bootstrap}
        for r in range(runs):
            victim = r % len(cluster.nodes)
            topic = f"failover-{r}"
            _topic(where, topic)
            progress(f"failover {r + 1}/{runs}: kill Kafka node {victim + 1}")
            out["kafka"].append(_one_failover(where, topic, lambda v=victim: cluster.kill(v),
                                              lambda v=victim: cluster.restart(v)))
            progress(f"  {out['kafka'][-1]}")
    for r in range(runs):
        broker = mq.testing.BrokerProcess(os.path.join(base, f"mq-failover-{r}")).start()
        try:
            where = {"socket": broker.socket}
            _topic(where, "failover")
            progress(f"failover {r + 1}/{runs}: kill -9 the mq broker, restart it")
            out["mq"].append(_one_failover(where, "failover", broker.kill, broker.start))
            progress(f"  {out['mq'][-1]}")
        finally:
            broker.close()
    return out


# --- report ----------------------------------------------------------------------------------

def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def report(results: dict) -> str:
    lines = []
    c = results.get("clients")
    if c:
        lines.append(f"clients: {c['records']} records of {c['value_bytes']} B, acks=all, "
                     f"{c['partitions']} partitions, median of {len(c['runs'])} run(s)")
        lines.append(f"{'target':<14}{'produce/s':>12}{'µs CPU/rec':>12}{'consume/s':>12}"
                     f"{'µs CPU/rec':>12}   vs local (produce, consume)")
        local = {side: _median([r["mq"][side]["records_per_s"] for r in c["runs"]])
                 for side in ("produce", "consume")}
        for name in ("mq", "mq-listener", "kafka"):
            m = {side: {k: _median([r[name][side][k] for r in c["runs"]])
                        for k in ("records_per_s", "cpu_us_per_record")}
                 for side in ("produce", "consume")}
            lines.append(f"{name:<14}{m['produce']['records_per_s']:>12,.0f}"
                         f"{m['produce']['cpu_us_per_record']:>12.1f}"
                         f"{m['consume']['records_per_s']:>12,.0f}"
                         f"{m['consume']['cpu_us_per_record']:>12.1f}   "
                         f"{m['produce']['records_per_s'] / local['produce']:.2f}x, "
                         f"{m['consume']['records_per_s'] / local['consume']:.2f}x")
    f = results.get("failover")
    if f:
        for name, what in (("kafka", "a Kafka node SIGKILLed (session timeout 3 s)"),
                           ("mq", "the mq broker kill -9'd and restarted")):
            trials = f[name]
            gaps = [t["longest_ack_gap_ms"] for t in trials if t["longest_ack_gap_ms"]]
            lines.append(f"failover, {what}: longest ack gap median "
                         f"{_median(gaps):,.0f} ms (max {max(gaps):,.0f}), lost "
                         f"{sum(t['lost'] for t in trials)} of "
                         f"{sum(t['acked'] for t in trials)} acknowledged")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_section_arguments(parser, SECTIONS, "1 run of 20,000 records, 1 failover each")
    parser.add_argument("--records", type=int, default=None,
                        help="records per client run (default 200,000; 20,000 quick)")
    parser.add_argument("--bootstrap-server", default=None, metavar="HOST:PORT[,...]",
                        help="measure the clients on this Kafka cluster instead of starting "
                             "one (the failover section always starts its own)")
    harness.add_run_arguments(parser, "cluster", dir_help="parent of the brokers' temp dirs")
    args = harness.parse_sections(parser, argv, SECTIONS)
    n = args.records or (20_000 if args.quick else 200_000)
    if args.wait_idle:
        harness.wait_idle(args.wait_idle)
    base = tempfile.mkdtemp(prefix="mq-bench-cluster-", dir=args.dir)
    results: dict = {"decoder": harness.decoder_state()}
    contention: dict = {}
    try:
        harness.run_sections({"clients": lambda: clients(base, args.runs, n,
                                                         args.bootstrap_server),
                              "failover": lambda: failover(base, args.runs)},
                             args.only, results, contention)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results["contention"] = contention
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
