"""mq's asyncio clients in numbers (issue 22): ``mq.aio.Producer`` and ``mq.aio.Consumer`` next
to mq's threaded clients and to aiokafka through mq's Kafka listener, on one broker, in one run.

::

    python3 -m bench.aio_clients [--quick] [--runs 5] [--only produce,consume,latency]
                                 [--out bench/out/aio_clients.json] [--wait-idle 300]
                                 [--dir /tmp] [--profile]

One broker (``mq.testing.BrokerProcess``, default config plus ``kafka_listeners =
["127.0.0.1:0"]``: PLAINTEXT on a free loopback port, the bound address from
``Admin.broker_stats()``) serves all three families:

- *threaded*: ``mq.Producer`` (its I/O thread; batches through its shared-memory arena) and
  ``mq.Consumer.poll``;
- *mq.aio*: ``mq.aio.Producer`` (the same record path over the event loop; batches through
  the socket) and ``mq.aio.Consumer.getmany``;
- *aiokafka*: ``AIOKafkaProducer`` and ``AIOKafkaConsumer.getmany`` (no group: the partition
  assigned, from the earliest offset) through the Kafka listener.

Every producer and consumer is a forked worker process (``harness.run_workers``, in
``bench.aio_workers``): it connects and learns the metadata, waits on the barrier, then runs
its timed loop.

Sections (``--only``):

1. ``produce``: one producer process sends ``n`` records of 100 B and of 1 KiB
   (``harness.payloads``) to partition 0 of a fresh 1-partition topic, keeping every future;
   then ``flush()`` and every future's outcome read. acks=all, linger 5 ms, batches of
   16 KiB for all three; idempotence is each client's default (on in mq's, off in aiokafka).
   Rate = n / (first send -> last outcome read); the topic is checked to end at exactly n.
   Each family's n is sized for about 1 s from its own discarded warm-up.
   The producer process's CPU per record (all its threads) and its calling thread's.
2. ``consume``: a topic filled once per size (``mq.Producer``, section 1's settings,
   untimed) is read from offset 0 by one consumer process of each family until it has every
   record, at most 10,000 records a call, taking ``len()`` of every value. Rate = n /
   (barrier -> last record).
3. ``latency``: a producer process and a consumer process of the same family, open loop at
   1,000 records/s of 100 B (the value carries its intended send time:
   ``peers.paced_loop``, ``aio_workers.aio_paced_loop``), acks=1, linger 0 (bench.e2e's
   latency settings). p50/p99/p99.9/max of receive time - intended time, on the one
   monotonic clock all processes share.

Produce and consume are one process against the broker (the other side's work is not in
the figure); latency is one producer process -> one consumer process. The sides alternate in
each repetition, in an order rotated run by run; the ratios (mq.aio / threaded, mq.aio /
aiokafka) are paired per repetition; the table gives medians and min-max. Prints a table on
stdout, progress on stderr, every raw number as JSON. See bench/README.md ("asyncio
clients") for the method.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import importlib.metadata
import io
import itertools
import os
import pstats
import shutil
import signal
import sys
import tempfile
import time

from bench import aio_workers, harness
from bench.harness import (
    KIB,
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
    parse_sections,
    pip_install_missing,
    process_cpu,
    progress_printer,
    rotated,
    run_percentiles,
    run_sections,
    run_workers,
    summary,
    wait_idle,
)
from bench.mq_workers import mq_lat_consumer, mq_lat_producer

SECTIONS = ["produce", "consume", "latency"]
SIZES = [("100B", 100), ("1KiB", KIB)]
FAMILIES = {"threaded": "mq.Producer / mq.Consumer (threads)",
            "aio": "mq.aio.Producer / mq.aio.Consumer",
            "aiokafka": "aiokafka via the Kafka listener"}
# The ratios of the table: (numerator, denominator) families.
PAIRS = [("aio", "threaded"), ("aio", "aiokafka")]
# Rough records/s on this box, to size the discarded warm-up (and the runs, with --quick).
GUESS = {"produce": {"threaded": {"100B": 300e3, "1KiB": 150e3},
                     "aio": {"100B": 100e3, "1KiB": 70e3},
                     "aiokafka": {"100B": 35e3, "1KiB": 3.5e3}},
         "consume": {"threaded": {"100B": 1e6, "1KiB": 600e3},
                     "aio": {"100B": 1e6, "1KiB": 600e3},
                     "aiokafka": {"100B": 150e3, "1KiB": 100e3}}}
SLOW_FACTOR = 4       # consume: one n for all, at most ~4x the target for the slowest
LAT_RATE = 1_000
LAT_SIZE = 100

_topics = itertools.count()
progress = progress_printer("aio")


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
        self.target_s = 0.2 if args.quick else 1.0          # one run of the fastest side
        self.timeout = 180.0

    def topic(self) -> str:
        name = f"aio-{os.getpid()}-{next(_topics)}"
        self.admin.create_topic(name, 1)
        return name

    def drop(self, topic: str) -> None:
        with contextlib.suppress(Exception):
            self.admin.delete_topic(topic)

    def end_offset(self, topic: str) -> int:
        return self.admin.describe_topic(topic)["offsets"][0][1]

    def meter(self):
        pid = self.broker.pid
        return lambda: process_cpu(pid)


def rotation(ctx: Ctx, what: str, one) -> dict:
    """``ctx.runs`` repetitions of ``one(family)`` for every family, in an order rotated run
    by run: ``{family: [result of each run]}``."""
    per: dict = {f: [] for f in FAMILIES}
    for r in range(ctx.runs):
        order = rotated(list(FAMILIES), r)
        progress(f"{what}: run {r + 1}/{ctx.runs}, order {order}")
        for family in order:
            per[family].append(one(family))
    return per


def paired(per: dict, key: str) -> dict:
    """``{"aio/threaded": summary, "aio/aiokafka": summary}`` of ``key``, per run."""
    return {f"{a}/{b}": summary([x[key] / y[key] for x, y in zip(per[a], per[b], strict=True)])
            for a, b in PAIRS}


def size_n(ctx: Ctx, rates: dict, cap: int) -> int:
    """Records of one run: the fastest side's rate (``{family: records/s}``) x the target,
    but no more than the slowest side does in ``SLOW_FACTOR`` x the target."""
    return int(max(1000, min(cap, max(rates.values()) * ctx.target_s,
                             min(rates.values()) * ctx.target_s * SLOW_FACTOR)))


# --- 1. produce ---------------------------------------------------------------------------------

def one_produce(ctx: Ctx, family: str, values: list[bytes], n: int) -> dict:
    topic = ctx.topic()
    where = {"bootstrap": ctx.bootstrap} if family == "aiokafka" else {"socket": ctx.socket}
    fn = {"threaded": aio_workers.threaded_producer, "aio": aio_workers.aio_producer,
          "aiokafka": aio_workers.aiokafka_producer}[family]
    try:
        (w,), c0, c1 = run_workers([(fn, {**where, "topic": topic, "values": values, "n": n})],
                                   ctx.timeout, ctx.meter(), ctx.meter())
        end = ctx.end_offset(topic)
    finally:
        ctx.drop(topic)
    if end != n or w["last_offset"] != n - 1:
        raise WorkerError(f"produce {family}: the topic ends at {end} (last offset acked "
                          f"{w['last_offset']}), {n} sent")
    secs = (w["t_end"] - w["t_first"]) / 1e9
    size = len(values[0])
    return {"n": n, "seconds": secs, "rate": n / secs, "mb_s": n * size / secs / 1e6,
            "send_us_per_record": (w["t_sent"] - w["t_first"]) / 1e3 / n,
            "cpu_us_per_record": w["cpu_s_loop"] / n * 1e6,
            "caller_cpu_us_per_record": w["thread_cpu_s_loop"] / n * 1e6,
            "broker_cpu_us_per_record": (c1 - c0) / n * 1e6}


def run_produce(ctx: Ctx) -> dict:
    res: dict = {"settings": {"mq": aio_workers.PRODUCE,
                              "aiokafka": aio_workers.AIOKAFKA_PRODUCE,
                              "idempotence": "each client's default: mq on, aiokafka off"},
                 "cases": {}}
    for si, (label, size) in enumerate(SIZES):
        values = harness.payloads(size, 1024, seed=si + 1)
        cap = (64 if ctx.quick else 512) * 1024 * 1024 // size
        # Each family's n is sized for about the same time (``ctx.target_s``), from its own
        # discarded warm-up (with --quick, from GUESS): their rates differ 40-fold at acks=all.
        rates = {f: g[label] for f, g in GUESS["produce"].items()}
        warm = None
        if not ctx.quick:
            warm = {}
            for family in FAMILIES:
                n0 = int(max(500, rates[family] * ctx.target_s * 0.3))
                progress(f"produce {label}: {family} warm-up ({n0:,} records)")
                warm[family] = one_produce(ctx, family, values, n0)
                rates[family] = warm[family]["rate"]
        ns = {f: int(max(1000, min(cap, r * ctx.target_s))) for f, r in rates.items()}

        def one(family: str, values=values, ns=ns, size=size) -> dict:
            harness.prefault(ctx.base, ns[family] * size)
            return one_produce(ctx, family, values, ns[family])
        per = rotation(ctx, f"produce {label} ({', '.join(f'{f} {k:,}' for f, k in ns.items())}"
                       " records)", one)
        res["cases"][label] = entry = _entry(per, ns, size, warm)
        entry["cpu_us_per_record"] = {f: summary([x["cpu_us_per_record"] for x in per[f]])
                                      for f in per}
        entry["caller_cpu_us_per_record"] = {
            f: summary([x["caller_cpu_us_per_record"] for x in per[f]]) for f in per}
        entry["cpu_ratio"] = paired(per, "cpu_us_per_record")
        progress(f"produce {label}: " + ", ".join(
            f"{f} {entry['rate'][f]['median']:,.0f}/s" for f in FAMILIES))
    return res


def _entry(per: dict, n: int | dict, size: int, warm: dict | None) -> dict:
    return {"n": n, "size": size, "runs": per, "warmup": warm,
            "rate": {f: summary([x["rate"] for x in per[f]]) for f in per},
            "mb_s": {f: summary([x["mb_s"] for x in per[f]]) for f in per},
            "ratio": paired(per, "rate")}


# --- 2. consume ---------------------------------------------------------------------------------

def fill(ctx: Ctx, size: int, n: int) -> str:
    """A fresh topic of ``n`` records of ``size`` bytes, written by ``mq.Producer`` (section
    1's settings)."""
    topic = ctx.topic()
    values = harness.payloads(size, 1024, seed=7)
    progress(f"filling {topic} with {n:,} records of {size:,} B")
    run_workers([(aio_workers.threaded_producer, {"socket": ctx.socket, "topic": topic,
                                                  "values": values, "n": n})], ctx.timeout)
    if ctx.end_offset(topic) != n:
        raise WorkerError(f"fill {topic}: ends at {ctx.end_offset(topic)}, {n} sent")
    return topic


def one_consume(ctx: Ctx, family: str, topic: str, n: int, size: int) -> dict:
    where = {"bootstrap": ctx.bootstrap} if family == "aiokafka" else {"socket": ctx.socket}
    fn = {"threaded": aio_workers.threaded_consumer, "aio": aio_workers.aio_consumer,
          "aiokafka": aio_workers.aiokafka_consumer}[family]
    (w,), c0, c1 = run_workers([(fn, {**where, "topic": topic, "n": n})], ctx.timeout,
                               ctx.meter(), ctx.meter())
    if w["n"] != n or w["bytes"] != n * size:
        raise WorkerError(f"consume {family}: got {w['n']} records / {w['bytes']} bytes, "
                          f"expected {n} / {n * size}")
    secs = (w["t_end"] - w["t_first"]) / 1e9
    return {"n": n, "seconds": secs, "rate": n / secs, "mb_s": n * size / secs / 1e6,
            "cpu_us_per_record": w["cpu_s_loop"] / n * 1e6,
            "broker_cpu_us_per_record": (c1 - c0) / n * 1e6}


def run_consume(ctx: Ctx) -> dict:
    res: dict = {"settings": aio_workers.CONSUME, "cases": {}}
    for label, size in SIZES:
        cap = (64 if ctx.quick else 512) * 1024 * 1024 // size
        n = size_n(ctx, {f: g[label] for f, g in GUESS["consume"].items()}, cap)
        topic = fill(ctx, size, n)
        try:
            warm = None
            if not ctx.quick:
                progress(f"consume {label}: warm-up of each side")
                warm = {f: one_consume(ctx, f, topic, n, size) for f in FAMILIES}
            per = rotation(ctx, f"consume {label} ({n:,} records)",
                           lambda f, t=topic, n=n, size=size: one_consume(ctx, f, t, n, size))
        finally:
            ctx.drop(topic)
        res["cases"][label] = entry = _entry(per, n, size, warm)
        entry["cpu_us_per_record"] = {f: summary([x["cpu_us_per_record"] for x in per[f]])
                                      for f in per}
        progress(f"consume {label}: " + ", ".join(
            f"{f} {entry['rate'][f]['median']:,.0f}/s" for f in FAMILIES))
    return res


# --- 3. latency at a fixed rate -----------------------------------------------------------------

def latency_jobs(ctx: Ctx, family: str, topic: str, n: int, warm: int,
                 timeout: float) -> list:
    produce = {"topic": topic, "size": LAT_SIZE, "rate": LAT_RATE, "n": n}
    consume = {"topic": topic, "n": n, "warm": warm, "timeout_s": timeout}
    if family == "threaded":
        return [(mq_lat_producer, {"socket": ctx.socket, **produce, **aio_workers.LATENCY}),
                (mq_lat_consumer, {"socket": ctx.socket, **consume})]
    if family == "aio":
        return [(aio_workers.aio_lat_producer, {"socket": ctx.socket, **produce}),
                (aio_workers.aio_lat_consumer, {"socket": ctx.socket, **consume})]
    return [(aio_workers.aiokafka_lat_producer, {"bootstrap": ctx.bootstrap, **produce}),
            (aio_workers.aiokafka_lat_consumer, {"bootstrap": ctx.bootstrap, **consume})]


def one_latency(ctx: Ctx, family: str, seconds: float, warm_s: float) -> dict:
    warm = int(LAT_RATE * warm_s)
    n = warm + int(LAT_RATE * seconds)
    timeout = warm_s + seconds + 15.0
    topic = ctx.topic()
    try:
        (prod, cons), c0, c1 = run_workers(latency_jobs(ctx, family, topic, n, warm, timeout),
                                           timeout + 30, ctx.meter(), ctx.meter())
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
            "producer_cpu_us_per_record": prod["cpu_s"] / n * 1e6,
            "consumer_cpu_us_per_record": cons["cpu_s"] / n * 1e6,
            "broker_cpu_us_per_record": (c1 - c0) / n * 1e6}


def run_latency(ctx: Ctx) -> dict:
    seconds, warm_s = (0.5, 0.1) if ctx.quick else (5.0, 0.5)
    per = rotation(ctx, f"latency {LAT_RATE:,}/s ({seconds:g} s + {warm_s} s warm-up each)",
                   lambda family: one_latency(ctx, family, seconds, warm_s))
    res: dict = {"rate": LAT_RATE, "size": LAT_SIZE, "seconds": seconds,
                 "warmup_seconds": warm_s, "settings": aio_workers.LATENCY, "runs": per}
    for f, runs in per.items():
        res[f] = {"merged": hist_stats(merge_hists([x["hist"] for x in runs])),
                  **run_percentiles([x["stats"] for x in runs]),
                  "saturated_runs": sum(x["saturated"] for x in runs),
                  **{k: summary([x[k] for x in runs]) for k in (
                      "producer_cpu_us_per_record", "consumer_cpu_us_per_record",
                      "broker_cpu_us_per_record")}}
    for a, b in PAIRS:
        res[f"{a}/{b}"] = {q: summary([x["stats"][q] / y["stats"][q]
                                       for x, y in zip(per[a], per[b], strict=True)])
                           for q in ("p50_us", "p99_us")}
    progress("latency: p50 " + ", ".join(f"{f} {res[f]['merged']['p50_us']} us"
                                         for f in FAMILIES))
    return res


# --- table --------------------------------------------------------------------------------------

def _ratios(ratio: dict, family: str, what: str = "") -> str:
    """The ratio cell of ``family``'s row: mq.aio's row carries both pairs."""
    if family != "aio":
        return "-"
    return "; ".join(fmt_ratio(ratio[f"{a}/{b}"], f"{b}{what}") for a, b in PAIRS)


def build_table(res: dict) -> Rows:
    rows = Rows()
    for label, e in res.get("produce", {}).get("cases", {}).items():
        for f, name in FAMILIES.items():
            rows.add(f"produce {label} acks=all, {name}",
                     harness.mm(e["rate"][f], fmt_rate) + f"; {e['mb_s'][f]['median']:.0f} MB/s"
                     f"; CPU {e['cpu_us_per_record'][f]['median']:.2f} us/rec (caller thread "
                     f"{e['caller_cpu_us_per_record'][f]['median']:.2f})", "rec/s",
                     _ratios(e["ratio"], f))
        rows.add(f"produce {label} CPU per record, mq.aio against",
                 "; ".join(f"{b} {e['cpu_ratio'][f'aio/{b}']['median']:.2f}x" for _, b in PAIRS),
                 "x", _ratios(e["cpu_ratio"], "aio", " CPU"))
    for label, e in res.get("consume", {}).get("cases", {}).items():
        for f, name in FAMILIES.items():
            rows.add(f"consume {label} from offset 0, {name}",
                     harness.mm(e["rate"][f], fmt_rate) + f"; {e['mb_s'][f]['median']:.0f} MB/s"
                     f"; CPU {e['cpu_us_per_record'][f]['median']:.2f} us/rec", "rec/s",
                     _ratios(e["ratio"], f))
    lat = res.get("latency")
    if lat:
        for f, name in FAMILIES.items():
            m = lat[f]["merged"]
            sat = f"; SATURATED in {lat[f]['saturated_runs']} run(s)" \
                if lat[f]["saturated_runs"] else ""
            rows.add(f"e2e latency {LAT_RATE // 1000} k/s {LAT_SIZE} B acks=1, {name}",
                     f"{m['p50_us']:,} / {m['p99_us']:,} / {m['p99_9_us']:,} / {m['max_us']:,}"
                     + sat, "us p50/p99/p99.9/max",
                     "; ".join(fmt_ratio(lat[f"aio/{b}"]["p50_us"], f"{b} p50")
                               for _, b in PAIRS) if f == "aio" else "-")
    return rows


# --- profile: the mq.aio producer's per-record cost ------------------------------------------

def profile_aio_producer(ctx: Ctx, n: int) -> str:
    """cProfile of one mq.aio producer run of ``n`` records of 100 B (section 1's loop), in a
    worker: the top functions by own time, as text."""
    topic = ctx.topic()
    try:
        (w,), _, _ = run_workers([(_profiled_aio_producer, {
            "socket": ctx.socket, "topic": topic, "values": harness.payloads(100, 1024),
            "n": n})], ctx.timeout)
    finally:
        ctx.drop(topic)
    return w["profile"]


def _profiled_aio_producer(start, socket: str, topic: str, values: list[bytes],
                           n: int) -> dict:
    prof = cProfile.Profile()

    def profiled_start() -> None:
        start()
        prof.enable()
    res = aio_workers.aio_producer(profiled_start, socket, topic, values, n)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
    res["profile"] = out.getvalue()
    return res


# --- main ---------------------------------------------------------------------------------------

def ensure_installed() -> dict:
    """hdrhistogram (the latency histograms) and aiokafka with pip if missing, as the other
    benchmarks do; the clients' versions."""
    pip_install_missing({"hdrh": "hdrhistogram", "aiokafka": "aiokafka>=0.14"}, progress)
    return {"aiokafka": importlib.metadata.version("aiokafka")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.aio_clients", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_section_arguments(p, SECTIONS, quick_help=(
        "a smoke run: 1 run, no warm-up, runs of ~0.2 s for the fastest side, "
                          "0.5 s latency points (under 20 s)"))
    p.add_argument("--profile", action="store_true",
                   help="also cProfile one mq.aio producer run of 100 B records and print the "
                        "top functions by own time")
    add_run_arguments(p, "aio_clients", dir_help="parent of the temp dir (the broker's data); "
                      "default: the system temp dir. A real disk: acks=all waits for fdatasync")
    return parse_sections(p, argv, SECTIONS)


def run(args: argparse.Namespace) -> dict:
    """The whole benchmark: a broker with a Kafka listener in a temp dir (removed at the end),
    the sections of ``args.only``, the table printed and the JSON written. Returns the
    results (the JSON's content)."""
    versions = ensure_installed()
    idle = wait_idle(args.wait_idle, progress=progress)
    base = tempfile.mkdtemp(prefix="mq-aio-", dir=args.dir)
    t_start = time.perf_counter()
    broker = None
    try:
        meta = machine_facts(base, wait_idle=idle, start_method="fork")
        meta["packages"].update(versions)
        broker = kafka_listener_broker(base)
        ctx = Ctx(args, base, broker)
        progress(f"temp dir {base}; broker pid {broker.pid}, Kafka listener {ctx.bootstrap}")
        res: dict = {"meta": meta, "params": {
            "quick": args.quick, "runs": args.runs, "sections": args.only,
            "target_seconds_per_run": ctx.target_s, "families": FAMILIES,
            "broker": {"kafka_listeners": [ctx.bootstrap]}}}
        try:
            fns = {"produce": run_produce, "consume": run_consume, "latency": run_latency}
            run_sections({k: functools.partial(f, ctx) for k, f in fns.items()}, args.only,
                         res, meta.setdefault("contention", {}), progress=progress)
            if args.profile:
                progress("profiling one mq.aio producer run (cProfile)")
                res["profile_aio_producer"] = profile_aio_producer(
                    ctx, 20_000 if args.quick else 200_000)
        finally:
            ctx.admin.close()
        finish_run("mq asyncio clients benchmark", res, build_table, args.out,
                   time.perf_counter() - t_start,
                   f"{args.runs} runs{' (quick)' if args.quick else ''}; aiokafka "
                   f"{versions['aiokafka']}", default=json_bytes)
        if args.profile:
            print(res["profile_aio_producer"])
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
