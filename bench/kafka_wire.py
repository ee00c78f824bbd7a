"""Kafka's wire protocol in numbers (issue 20): librdkafka (confluent-kafka) through mq's Kafka
listener against mq's own clients on the same broker, in the same run.

::

    python3 -m bench.kafka_wire [--quick] [--runs 5] [--only produce,consume,fanout,latency]
                                [--out bench/out/kafka_wire.json] [--wait-idle 300] [--dir /tmp]

One broker (``mq.testing.BrokerProcess``, default config plus ``kafka_listeners =
["127.0.0.1:0"]``; the bound address from ``Admin.broker_stats()``) serves both protocols.
Every producer and consumer is a forked worker process (``harness.run_workers``): it connects
and fetches metadata, waits on the barrier, then runs its timed loop.

Sections (``--only``):

1. ``produce``: one producer process writes ``n`` records of 100 B and of 64 KiB to partition 0
   of a fresh 1-partition topic, acks=1 and acks=all: librdkafka through the listener
   (Produce: the batch handed to the native Produce, 12 bytes patched) against ``mq.Producer``
   (its batches through the shared-memory arena and the Unix socket). The same batching on
   both: linger 5 ms, batches up to 1,000,000 bytes (librdkafka's defaults), no compression,
   idempotence off (librdkafka's default). acks=1 is answered once the batch is in the page
   cache (the broker fsyncs it within ``flush_interval_ms`` = 1 s); acks=all after the
   fdatasync that covers it (the flusher's group commit). Rate = n / (first send ->
   ``flush()`` returned); the topic is checked to end at exactly n.
2. ``consume``: a topic filled once per size by librdkafka (untimed) is read from offset 0 by
   one consumer process: a librdkafka consumer assigned the partition (Fetch from the segment
   files with ``sendfile``) against ``mq.Consumer`` assigned the same (records decoded from
   the segment's read-only map). Both take the length of every value. Rate = n / (barrier ->
   last record).
3. ``fanout``: 1 and 8 librdkafka consumer processes, each assigned the whole topic of section
   2's 64 KiB (and 100 B) data, read it concurrently; the broker's CPU (schedstat; psutil's
   ticks as a cross-check) over the bytes it sent: CPU seconds per GB, and the 8:1 ratio.
   With ``sendfile`` the broker's work is per Fetch request, not per byte.
4. ``latency``: open loop at 10,000 records/s of 100 B (``peers.paced_loop``: the value carries
   its intended send time), acks=1, linger 0, for a few seconds: librdkafka producer ->
   listener -> librdkafka consumer, against ``mq.Producer`` -> ``mq.Consumer`` (bench.mq_workers'
   latency workers). p50/p99/p99.9/max of receive time - intended time.

The sides of a ratio alternate in each repetition, in an order rotated run by run; ratios are
paired per repetition; the table gives medians and min-max. Prints a table on stdout,
progress on stderr, every raw number as JSON. See bench/README.md ("Kafka wire protocol") for
the method and bench/RESULTS.md for results.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import itertools
import os
import shutil
import signal
import sys
import tempfile
import time

from bench import harness, kafka_vs
from bench.harness import (
    KIB,
    MIB,
    Rows,
    WorkerError,
    add_run_arguments,
    add_section_arguments,
    finish_run,
    fmt_rate,
    fmt_ratio,
    hist_stats,
    json_bytes,
    kafka_listener_broker,
    machine_facts,
    merge_hists,
    mm,
    parse_sections,
    pip_install_missing,
    process_cpu,
    process_cpu_ticks,
    progress_printer,
    rotated,
    run_percentiles,
    run_sections,
    run_workers,
    summary,
    wait_idle,
)
from bench.kafka_workers import (
    MQ_PRODUCER,
    RDK_BATCH,
    RDK_CONSUMER,
    RDK_LATENCY,
    RDK_PRODUCER,
    mq_producer,
    rdk_consumer,
    rdk_lat_consumer,
    rdk_lat_producer,
    rdk_producer,
)
from bench.mq_workers import mq_consumer, mq_lat_consumer, mq_lat_producer

SECTIONS = ["produce", "consume", "fanout", "latency", "kafka"]   # kafka: bench/kafka_vs.py
SIZES = [("100B", 100), ("64KiB", 64 * KIB)]
ACKS = {"1": 1, "all": "all"}
SIDES = {"rdk": "librdkafka via Kafka listener", "mq": "mq native"}
GUESS = {"100B": 500e3, "64KiB": 5e3}          # records/s, to size the discarded warm-up

FANOUT = [1, 8]
LAT_RATE = 10_000
# Latency sides: librdkafka at its default linger.ms (5) and at 0, mq.Producer at linger 0
# (bench.e2e's latency setting: with 5 requests in flight, records wait in the open batch).
LAT_SIDES = {"rdk": ("librdkafka via Kafka listener, linger.ms=5 (default)", 5),
             "rdk0": ("librdkafka via Kafka listener, linger.ms=0", 0),
             "mq": ("mq native, linger_ms=0", 0)}
LAT_GOAL_P99_US = 10_000           # the goal: produce p99 <= 10 ms at 10 k msg/s

_topics = itertools.count()
progress = progress_printer("kafka")


# --- the run context ----------------------------------------------------------------------------

class Ctx:
    def __init__(self, args, base: str, broker) -> None:
        import mq
        self.quick = args.quick
        self.runs = args.runs
        self.base = base
        self.broker = broker
        self.socket = broker.socket
        self.admin = mq.Admin(socket=broker.socket)
        self.bootstrap = self.admin.broker_stats()["broker"]["kafka_listeners"][0]
        self.target_s = 0.3 if args.quick else 1.5          # one produce or consume run
        self.cap_bytes = (8 if args.quick else 512) * MIB   # records of one run, at most
        self.fanout_bytes = (8 if args.quick else 256) * MIB
        # Records of one run, at least: a quick run's 64 KiB runs stay within cap_bytes.
        self.min_records = 100 if args.quick else 1000
        self.timeout = 180.0

    def topic(self) -> str:
        name = f"kw-{os.getpid()}-{next(_topics)}"
        self.admin.create_topic(name, 1)
        return name

    def drop(self, topic: str) -> None:
        with contextlib.suppress(Exception):
            self.admin.delete_topic(topic)

    def end_offset(self, topic: str) -> int:
        return self.admin.describe_topic(topic)["offsets"][0][1]

    def log_bytes(self, topic: str) -> int:
        return self.admin.describe_topic(topic)["size_bytes"][0]

    def meter(self):
        pid = self.broker.pid
        return lambda: (time.perf_counter_ns(), process_cpu(pid), process_cpu_ticks(pid))


def rotation(ctx: Ctx, sides, what: str, one) -> dict:
    """``ctx.runs`` repetitions of ``one(side)`` for every side of a comparison, in an order
    rotated run by run: ``{side: [result of each run]}``."""
    per: dict = {s: [] for s in sides}
    for r in range(ctx.runs):
        order = rotated(list(sides), r)
        progress(f"{what}: run {r + 1}/{ctx.runs}, order {order}")
        for side in order:
            per[side].append(one(side))
    return per


def _broker_cpu(s0, s1) -> dict:
    return {"broker_cpu_s": s1[1] - s0[1], "broker_cpu_s_ticks": s1[2] - s0[2]}


# --- 1. produce ---------------------------------------------------------------------------------

def one_produce(ctx: Ctx, side: str, acks, values: list[bytes], n: int) -> dict:
    topic = ctx.topic()
    if side == "rdk":
        job = (rdk_producer, {"bootstrap": ctx.bootstrap, "topic": topic, "values": values,
                              "n": n, "acks": acks})
    else:
        job = (mq_producer, {"socket": ctx.socket, "topic": topic, "values": values, "n": n,
                             "acks": acks})
    try:
        (w,), s0, s1 = run_workers([job], ctx.timeout, ctx.meter(), ctx.meter())
        end = ctx.end_offset(topic)
    finally:
        ctx.drop(topic)
    if end != n:
        raise WorkerError(f"produce {side} acks={acks}: the topic ends at {end}, {n} sent")
    secs = (w["t_end"] - w["t_first"]) / 1e9
    size = len(values[0])
    cpu = _broker_cpu(s0, s1)
    return {"n": n, "seconds": secs, "rate": n / secs, "mb_s": n * size / secs / 1e6,
            "client_cpu_s": w["cpu_s_loop"], **cpu,
            "broker_cpu_us_per_mb": cpu["broker_cpu_s"] / (n * size / 1e6) * 1e6}


def run_produce(ctx: Ctx) -> dict:
    res: dict = {"librdkafka": RDK_PRODUCER, "mq": MQ_PRODUCER, "cases": {}}
    for si, (label, size) in enumerate(SIZES):
        values = harness.payloads(size, 64 if size > 4096 else 1024, seed=si + 1)
        cap = max(ctx.min_records, ctx.cap_bytes // size)
        for a, acks in ACKS.items():
            case = f"{label} acks={a}"
            warm = {}
            for side in SIDES:
                n0 = int(min(cap, max(500, GUESS[label] * ctx.target_s * 0.3)))
                progress(f"produce {case}: {side} warm-up ({n0:,} records)")
                warm[side] = one_produce(ctx, side, acks, values, n0)
            # The same n for both sides (paired on equal work), sized by the faster one.
            n = int(min(cap, max(ctx.min_records,
                                 max(w["rate"] for w in warm.values()) * ctx.target_s)))

            def one(side: str, acks=acks, values=values, n=n, size=size) -> dict:
                harness.prefault(ctx.base, n * size)
                return one_produce(ctx, side, acks, values, n)
            per = rotation(ctx, SIDES, f"produce {case} ({n:,} records)", one)
            res["cases"][case] = entry = _paired_entry(per, n, size, warm)
            progress(f"produce {case}: " + ", ".join(
                f"{s} {entry['rate'][s]['median']:,.0f}/s" for s in SIDES))
    return res


def _paired_entry(per: dict, n: int, size: int, warm: dict | None = None) -> dict:
    entry = {"n": n, "size": size, "runs": per, "warmup": warm,
             "rate": {s: summary([x["rate"] for x in per[s]]) for s in per},
             "mb_s": {s: summary([x["mb_s"] for x in per[s]]) for s in per},
             "broker_cpu_s": {s: summary([x["broker_cpu_s"] for x in per[s]]) for s in per},
             "ratio": summary([a["rate"] / b["rate"]
                               for a, b in zip(per["rdk"], per["mq"], strict=True)])}
    return entry


# --- 2. consume ---------------------------------------------------------------------------------

def fill(ctx: Ctx, size: int, n: int) -> tuple[str, int]:
    """A fresh topic of ``n`` records of ``size`` bytes written by librdkafka (acks=1):
    (topic, bytes of its log)."""
    topic = ctx.topic()
    values = harness.payloads(size, 64 if size > 4096 else 1024, seed=7)
    progress(f"filling {topic} with {n:,} records of {size:,} B (librdkafka)")
    run_workers([(rdk_producer, {"bootstrap": ctx.bootstrap, "topic": topic,
                                 "values": values, "n": n, "acks": 1})], ctx.timeout)
    if ctx.end_offset(topic) != n:
        raise WorkerError(f"fill {topic}: ends at {ctx.end_offset(topic)}, {n} sent")
    return topic, ctx.log_bytes(topic)


def one_consume(ctx: Ctx, side: str, topic: str, n: int, size: int) -> dict:
    if side == "rdk":
        job = (rdk_consumer, {"bootstrap": ctx.bootstrap, "topic": topic, "n": n})
    else:
        job = (mq_consumer, {"socket": ctx.socket, "topic": topic, "partitions": [0], "n": n})
    (w,), s0, s1 = run_workers([job], ctx.timeout, ctx.meter(), ctx.meter())
    if w["n"] != n or w["bytes"] != n * size:
        raise WorkerError(f"consume {side}: got {w['n']} records / {w['bytes']} bytes, "
                          f"expected {n} / {n * size}")
    secs = (w["t_last"] - w["t_start"]) / 1e9
    return {"n": n, "seconds": secs, "rate": n / secs, "mb_s": n * size / secs / 1e6,
            "consumer_cpu_s": w.get("cpu_s_loop", w["cpu_s"]), **_broker_cpu(s0, s1)}


def run_consume(ctx: Ctx) -> dict:
    res: dict = {"librdkafka": RDK_CONSUMER, "librdkafka_batch": RDK_BATCH, "cases": {}}
    for label, size in SIZES:
        n = max(ctx.min_records, int(min(ctx.cap_bytes // size, GUESS[label] * ctx.target_s)))
        topic, log_bytes = fill(ctx, size, n)
        try:
            progress(f"consume {label}: warm-up of each side")
            warm = {s: one_consume(ctx, s, topic, n, size) for s in SIDES}
            per = rotation(ctx, SIDES, f"consume {label} ({n:,} records)",
                           lambda side, t=topic, n=n, size=size: one_consume(ctx, side, t, n, size))
        finally:
            ctx.drop(topic)
        res["cases"][label] = entry = _paired_entry(per, n, size, warm)
        entry["log_bytes"] = log_bytes
        progress(f"consume {label}: " + ", ".join(
            f"{s} {entry['rate'][s]['median']:,.0f}/s" for s in SIDES))
    return res


# --- 3. fan-out: the broker's CPU per GB fetched ------------------------------------------------

def one_fanout(ctx: Ctx, consumers: int, topic: str, n: int, size: int,
               log_bytes: int) -> dict:
    jobs = [(rdk_consumer, {"bootstrap": ctx.bootstrap, "topic": topic, "n": n})
            for _ in range(consumers)]
    results, s0, s1 = run_workers(jobs, ctx.timeout, ctx.meter(), ctx.meter())
    for w in results:
        if w["n"] != n or w["bytes"] != n * size:
            raise WorkerError(f"fan-out x{consumers}: a consumer got {w['n']} records")
    sent = consumers * log_bytes
    cpu = _broker_cpu(s0, s1)
    secs = (max(w["t_last"] for w in results) - min(w["t_start"] for w in results)) / 1e9
    return {"consumers": consumers, "bytes_fetched": sent, "seconds": secs,
            "aggregate_mb_s": sent / secs / 1e6,
            "slowest_mb_s": min(log_bytes / ((w["t_last"] - w["t_start"]) / 1e9)
                                for w in results) / 1e6,
            **cpu, "cpu_s_per_gb": cpu["broker_cpu_s"] / (sent / 1e9),
            "cpu_s_per_gb_ticks": cpu["broker_cpu_s_ticks"] / (sent / 1e9),
            "consumer_cpu_s": [w["cpu_s_loop"] for w in results]}


def run_fanout(ctx: Ctx) -> dict:
    res: dict = {"consumers": FANOUT, "cases": {}}
    for label, size in reversed(SIZES):
        # A Python consumer spends ~5x more CPU per MB on 100 B records than on 64 KiB ones
        # (5 vs 1 ms/MB here): an eighth of the bytes keeps 8 of them on 2 CPUs to seconds.
        n = max(ctx.min_records, ctx.fanout_bytes // (size if size > 4096 else size * 8))
        topic, log_bytes = fill(ctx, size, n)
        try:
            per = rotation(ctx, FANOUT, f"fan-out {label} ({log_bytes / MIB:.0f} MiB each, "
                           "consumers)", lambda k, t=topic, n=n, size=size, b=log_bytes:
                           one_fanout(ctx, k, t, n, size, b))
        finally:
            ctx.drop(topic)
        hi, lo = FANOUT[-1], FANOUT[0]
        res["cases"][label] = entry = {
            "n": n, "size": size, "log_bytes": log_bytes, "runs": per,
            "cpu_s_per_gb": {k: summary([x["cpu_s_per_gb"] for x in per[k]]) for k in per},
            "aggregate_mb_s": {k: summary([x["aggregate_mb_s"] for x in per[k]])
                               for k in per},
            "ratio": summary([a["cpu_s_per_gb"] / b["cpu_s_per_gb"]
                              for a, b in zip(per[hi], per[lo], strict=True)])}
        progress(f"fan-out {label}: broker " + ", ".join(
            f"x{k} {entry['cpu_s_per_gb'][k]['median']:.2f} CPU-s/GB" for k in per))
    return res


# --- 4. latency at a fixed rate -----------------------------------------------------------------

def one_latency(ctx: Ctx, side: str, seconds: float, warm_s: float) -> dict:
    warm = int(LAT_RATE * warm_s)
    n = warm + int(LAT_RATE * seconds)
    timeout = warm_s + seconds + 15.0
    topic = ctx.topic()
    if side != "mq":
        jobs = [(rdk_lat_producer, {"bootstrap": ctx.bootstrap, "topic": topic, "size": 100,
                                    "rate": LAT_RATE, "n": n,
                                    "linger_ms": LAT_SIDES[side][1]}),
                (rdk_lat_consumer, {"bootstrap": ctx.bootstrap, "topic": topic, "n": n,
                                    "warm": warm, "timeout_s": timeout})]
    else:
        jobs = [(mq_lat_producer, {"socket": ctx.socket, "topic": topic, "size": 100,
                                   "rate": LAT_RATE, "n": n, "acks": 1, "linger_ms": 0}),
                (mq_lat_consumer, {"socket": ctx.socket, "topic": topic, "n": n, "warm": warm,
                                   "timeout_s": timeout})]
    try:
        (prod, cons), s0, s1 = run_workers(jobs, timeout + 30, ctx.meter(), ctx.meter())
    finally:
        ctx.drop(topic)
    span = (cons["t_last"] - prod["t_first"]) / 1e9 if cons["t_last"] else float("inf")
    achieved = cons["n"] / span
    return {"n": n, "warm": warm, "received": cons["n"], "achieved_rate": achieved,
            "send_rate": prod["send_rate"], "late_sends": prod["late_sends"],
            "saturated": cons["n"] < n or achieved < 0.95 * LAT_RATE
                         or prod["send_rate"] < 0.95 * LAT_RATE,
            "hist": cons["hist"], "stats": hist_stats(merge_hists([cons["hist"]])),
            "trend_mean_us": cons["trend_mean_us"],
            **_broker_cpu(s0, s1)}


def run_latency(ctx: Ctx) -> dict:
    seconds, warm_s = (0.3, 0.1) if ctx.quick else (4.0, 0.5)
    per = rotation(ctx, LAT_SIDES, f"latency {LAT_RATE:,}/s ({seconds:g} s + {warm_s} s "
                   "warm-up each)", lambda side: one_latency(ctx, side, seconds, warm_s))
    res: dict = {"rate": LAT_RATE, "seconds": seconds, "warmup_seconds": warm_s,
                 "librdkafka": RDK_LATENCY, "sides": LAT_SIDES, "mq": {"acks": 1, "linger_ms": 0},
                 "runs": per}
    for s, runs in per.items():
        res[s] = {"merged": hist_stats(merge_hists([x["hist"] for x in runs])),
                  **run_percentiles([x["stats"] for x in runs]),
                  "saturated_runs": sum(x["saturated"] for x in runs),
                  "broker_cpu_us_per_record": summary([x["broker_cpu_s"] / x["n"] * 1e6
                                                       for x in runs])}
        res[s]["p50_ratio"] = summary([a["stats"]["p50_us"] / b["stats"]["p50_us"]
                                       for a, b in zip(runs, per["mq"], strict=True)])
    progress("latency: p50 " + ", ".join(f"{s} {res[s]['merged']['p50_us']} us"
                                         for s in LAT_SIDES))
    return res


# --- table --------------------------------------------------------------------------------------

def build_table(res: dict) -> Rows:
    rows = Rows()
    durability = {"1": "page cache, fsync within 1 s", "all": "after the group-commit fsync"}
    for case, e in res.get("produce", {}).get("cases", {}).items():
        acks = case.split("acks=")[1]
        for s, name in SIDES.items():
            rows.add(f"produce {case} ({durability[acks]}), {name}",
                     mm(e["rate"][s], fmt_rate) + f"; {e['mb_s'][s]['median']:.0f} MB/s",
                     "rec/s", fmt_ratio(e["ratio"], "native") if s == "rdk" else "-")
    for label, e in res.get("consume", {}).get("cases", {}).items():
        for s in SIDES:
            how = "Fetch + sendfile" if s == "rdk" else "mq.Consumer, read-only map"
            rows.add(f"consume {label} from offset 0, {how}",
                     mm(e["rate"][s], fmt_rate) + f"; {e['mb_s'][s]['median']:.0f} MB/s; broker "
                     f"{e['broker_cpu_s'][s]['median'] * 1e3:.0f} ms CPU", "rec/s",
                     fmt_ratio(e["ratio"], "native") if s == "rdk" else "-")
    for label, e in res.get("fanout", {}).get("cases", {}).items():
        for k in FANOUT:
            rows.add(f"broker CPU per GB fetched, {label} records, {k} librdkafka consumer(s) "
                     f"x {e['log_bytes'] / MIB:.0f} MiB",
                     mm(e["cpu_s_per_gb"][k], lambda v: f"{v:.2f}")
                     + f"; {e['aggregate_mb_s'][k]['median']:.0f} MB/s in all",
                     "CPU-s/GB", fmt_ratio(e["ratio"], f"{FANOUT[0]} consumer") if k != FANOUT[0]
                     else "-", "flat (<= ~1x)" if k != FANOUT[0] else "-")
    lat = res.get("latency")
    if lat:
        for s, (name, _) in LAT_SIDES.items():
            m, kafka = lat[s]["merged"], s != "mq"
            sat = f"; SATURATED in {lat[s]['saturated_runs']} run(s)" \
                if lat[s]["saturated_runs"] else ""
            rows.add(f"e2e latency {LAT_RATE // 1000} k/s 100 B acks=1, {name}",
                     f"{m['p50_us']:,} / {m['p99_us']:,} / {m['p99_9_us']:,} / {m['max_us']:,}"
                     f"; broker {lat[s]['broker_cpu_us_per_record']['median']:.0f} us/rec"
                     + sat, "us p50/p99/p99.9/max",
                     fmt_ratio(lat[s]["p50_ratio"], "native p50") if kafka else "-",
                     f"p99 <= {LAT_GOAL_P99_US // 1000} ms" if kafka else "-",
                     ("yes" if m["p99_us"] <= LAT_GOAL_P99_US else "NO") if kafka else "-")
    kafka_vs.table_rows(rows, res.get("kafka", {}))
    return rows


# --- main ---------------------------------------------------------------------------------------

def ensure_installed() -> dict:
    """hdrhistogram (the latency histograms) with pip if missing, as bench.e2e does; the
    versions of the clients."""
    pip_install_missing({"hdrh": "hdrhistogram"}, progress)
    import confluent_kafka
    return {"confluent-kafka": importlib.metadata.version("confluent-kafka"),
            "librdkafka": confluent_kafka.libversion()[0]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.kafka_wire", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_section_arguments(p, SECTIONS, quick_help=(
        "a smoke run: 1 run of ~0.3 s per figure, 8 MiB at most per run, small fan-out "
        "topics, 0.3 s latency points, half the cases against Kafka (about 20 s)"))
    add_run_arguments(p, "kafka_wire", dir_help="parent of the temp dir (the broker's data); "
                      "default: the system temp dir. A real disk: acks=all waits for fdatasync")
    return parse_sections(p, argv, SECTIONS)


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark: a broker with a Kafka listener in a temp dir (removed at the end),
    the sections of ``args.only``, the table printed and the JSON written. Returns the
    results (the JSON's content)."""
    versions = ensure_installed()
    idle = wait_idle(args.wait_idle, progress=progress)
    base = tempfile.mkdtemp(prefix="mq-kafka-", dir=args.dir)
    t_start = time.perf_counter()
    broker = None
    try:
        meta = machine_facts(base, wait_idle=idle, start_method="fork")
        meta["packages"].update(versions)
        t0 = time.monotonic()
        broker = kafka_listener_broker(base)
        ctx = Ctx(args, base, broker)
        ctx.broker_start_s = time.monotonic() - t0
        progress(f"temp dir {base}; broker pid {broker.pid}, Kafka listener {ctx.bootstrap}")
        res: dict = {"meta": meta, "params": {
            "quick": args.quick, "runs": args.runs, "sections": args.only,
            "target_seconds_per_run": ctx.target_s, "cap_bytes_per_run": ctx.cap_bytes,
            "fanout_bytes": ctx.fanout_bytes, "broker": {"kafka_listeners": [ctx.bootstrap],
                                                         "flush_interval_ms": 1000}}}
        try:
            fns = {"produce": run_produce, "consume": run_consume, "fanout": run_fanout,
                   "latency": run_latency,
                   "kafka": lambda c: kafka_vs.run_vs_kafka(c, progress)}
            run_sections({k: functools.partial(f, ctx) for k, f in fns.items()}, args.only,
                         res, meta.setdefault("contention", {}), progress=progress)
        finally:
            ctx.admin.close()
        finish_run("mq Kafka wire protocol benchmark", res, build_table, args.out,
                   time.perf_counter() - t_start,
                   f"{args.runs} runs{' (quick)' if args.quick else ''}; confluent-kafka "
                   f"{versions['confluent-kafka']} (librdkafka {versions['librdkafka']})",
                   default=json_bytes)
    finally:
        if broker is not None:
            broker.close()
        shutil.rmtree(base, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C: the broker, the workers and the temp dir
    # are still cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
