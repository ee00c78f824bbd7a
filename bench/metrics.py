"""What being scraped costs the broker: ``mq broker --metrics HOST:PORT`` (issue 12: "Scraping
costs the loop next to nothing: measure it"). A scrape of ``/metrics`` asks the broker's loop
for one snapshot (``mq/broker/stats.py``: every partition's offsets, and for every group
partition with lag one batch decoded for the age of its oldest unconsumed record), then
formats it off the loop (``mq/broker/metrics.py``). The broker exports what the loop spent on
that snapshot as ``mq_metrics_snapshot_seconds``; this benchmark collects it.

::

    python3 -m bench.metrics [--quick] [--runs 5] [--out bench/out/metrics.json]
                             [--wait-idle 300] [--dir /tmp] [--profile]

The broker is ``mq.testing.BrokerProcess`` on a temp data dir with ``metrics_address =
"127.0.0.1:0"``; producers, the fill and the scraper are forked worker processes
(``bench.harness.run_workers``). Two shapes:

- *large*: 16 topics x 4 partitions (64), 2,000 records of 100 B in each, and 8 groups with
  committed offsets on all 64 partitions, each in the middle of a batch with lag > 0: the
  lag-seconds path runs for 512 group partitions per snapshot;
- *small*: 1 topic x 1 partition, 1 group, the same per partition: for contrast.

Figures:

1. Loop time per scrape (``mq_metrics_snapshot_seconds`` of each scrape): p50/p99/max over
   every scrape, idle (a scrape every 0.2 s) and under produce load, with the scrape's wall
   time seen by the client, the body's size and the broker's CPU per scrape; the loop share
   at Prometheus' default interval (15 s) and at 1 s is snapshot seconds / interval.
2. Paired throughput (large shape): one producer process (100 B values, acks=1, mq's
   defaults otherwise) flat out for a fixed time, while nobody scrapes / a scraper process
   scrapes every 1 s / every 100 ms, in a rotation; producer records/s and the broker's CPU
   per record as ratios against "no scraping" in the same repetition. Goal: >= 0.99x at 1 s
   ("next to nothing").

Then an in-process ``mq.broker.server.Broker`` (in a forked child) on the large shape's data
dir times ``BrokerStats.snapshot()`` and ``GroupApis.summaries()`` (the groups' part) and
profiles the snapshot with cProfile (``--profile`` prints the top functions). Prints a table
on stdout, progress on stderr, writes every raw number as JSON. See bench/README.md
("Metrics") for the method and bench/RESULTS.md for results.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request

from bench import harness
from bench.harness import (
    Rows,
    WorkerError,
    add_run_arguments,
    finish_run,
    machine_facts,
    mm,
    pct,
    process_cpu,
    progress_printer,
    quiet_gc,
    rotated,
    run_sections,
    run_workers,
    summary,
    wait_idle,
)

GOAL_1S = 0.99                  # producer rec/s while scraped every 1 s / not scraped
GOAL_SNAPSHOT_S = 1e-3          # loop time per scrape at the large shape (0.1% of a 1 s interval)
PROMETHEUS_INTERVAL_S = 15.0    # Prometheus' default scrape_interval

VALUE_SIZE = 100
PRODUCER = {"acks": 1}          # mq's defaults otherwise (linger_ms=5, batch_size=16 KiB)
CHECK_EVERY = 1024              # records between two looks at the clock in the producer
FILL_PER_PARTITION = 2_000      # records of each shape partition: about 14 batches of 16 KiB
SHAPES = {"small": {"topics": 1, "partitions": 1, "groups": 1},
          "large": {"topics": 16, "partitions": 4, "groups": 8}}
SIDES = {"none": None, "1s": 1.0, "100ms": 0.1}       # scrape interval of each side
SIDE_NAMES = {"none": "no scraping", "1s": "scraped every 1 s", "100ms": "scraped every 100 ms"}
IDLE_INTERVAL_S = 0.2
SNAPSHOT_LINE = b"\nmq_metrics_snapshot_seconds "

progress = progress_printer("metrics")


def committed_offset(group: int, partition: int) -> int:
    """Where group ``group`` has committed on a shape partition: past the middle of the fill,
    never on a batch boundary, a little different for every group and partition."""
    return FILL_PER_PARTITION // 2 + 13 * group + 3 * partition + 7


# --- workers (forked; each sets itself up, then waits on the barrier) ---------------------------

def fill_worker(start, socket: str, partitions: list[tuple[str, int]], values: list[bytes],
                n: int) -> dict:
    """``n`` records to each of ``partitions``, one partition after the other (full batches)."""
    import mq
    p = mq.Producer(socket=socket, **PRODUCER)
    start()
    k = len(values)
    for topic, part in partitions:
        for i in range(n):
            p.send(topic, values[i % k], partition=part)
    p.flush()
    p.close()
    return {"n": n * len(partitions)}


def produce_worker(start, socket: str, topic: str, values: list[bytes], seconds: float) -> dict:
    """Records to partition 0 of ``topic`` as fast as one producer can, for ``seconds``, then
    ``flush()``. The clock is read every ``CHECK_EVERY`` records."""
    import mq
    p = mq.Producer(socket=socket, **PRODUCER)
    p.partitions_for(topic)                    # metadata before the clock
    send, k, clock = p.send, len(values), time.perf_counter_ns
    mask = CHECK_EVERY - 1
    quiet_gc()
    start()
    cpu0 = time.process_time()
    t0 = clock()
    end = t0 + int(seconds * 1e9)
    i = 0
    while True:
        send(topic, values[i % k], partition=0)
        i += 1
        if not i & mask and clock() >= end:
            break
    p.flush()
    t1 = clock()
    cpu = time.process_time() - cpu0
    p.close()
    return {"t0": t0, "t1": t1, "n": i, "cpu_s_loop": cpu}


def scrape(url: str) -> dict:
    """One GET of ``url``: client wall time, body bytes and the snapshot's loop seconds."""
    t = time.perf_counter_ns()
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = resp.read()
    wall = time.perf_counter_ns() - t
    at = body.find(SNAPSHOT_LINE)
    if at < 0:
        raise WorkerError(f"{url}: no mq_metrics_snapshot_seconds in {len(body)} bytes")
    line = body[at + len(SNAPSHOT_LINE):body.index(b"\n", at + 1)]
    return {"at_ns": t, "wall_s": wall / 1e9, "bytes": len(body),
            "snapshot_s": float(line.split()[0])}


def scrape_worker(start, url: str, interval: float, seconds: float) -> dict:
    """Scrape ``url`` every ``interval`` s for ``seconds`` (the first at once). A scrape that
    takes longer than the interval delays the next one; scrapes never overlap."""
    scrape(url)                                # connect once, untimed
    start()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    samples = []
    due = t0
    while due < t0 + seconds:
        time.sleep(max(0.0, due - time.perf_counter()))
        samples.append(scrape(url))
        due = max(due + interval, time.perf_counter())
    return {"samples": samples, "cpu_s_loop": time.process_time() - cpu0}


def breakdown_worker(start, data_dir: str, socket: str, repeats: int) -> dict:
    """An in-process ``Broker`` on a stopped broker's ``data_dir``: seconds of
    ``stats.snapshot()`` and of ``groups.summaries()`` (its groups part), and a cProfile of
    the snapshot (the top functions by own time)."""
    from mq.broker.config import BrokerConfig
    from mq.broker.server import Broker
    broker = Broker(BrokerConfig.from_mapping({"data_dir": data_dir, "socket": socket,
                                               "min_free_bytes": 0, "log_level": "WARNING"}))
    broker.start()
    try:
        start()
        snapshot, summaries = broker.stats.snapshot, broker.groups.summaries
        for _ in range(3):                     # warm: page cache, index maps
            snapshot()
        out: dict = {"snapshot_s": [], "groups_s": [], "groups_cold_s": []}
        for _ in range(repeats):
            for key, fn in (("snapshot_s", snapshot), ("groups_s", summaries)):
                t = time.perf_counter()
                fn()
                out[key].append(time.perf_counter() - t)
            # Every group moved since the last look: no timestamp is known (the cache of the
            # lag ages emptied, as after a round of commits on every lagging partition).
            broker.groups._ages = {}
            t = time.perf_counter()
            summaries()
            out["groups_cold_s"].append(time.perf_counter() - t)
        offsets = [o for g in summaries() for o in g["offsets"]]
        out["group_partitions"] = len(offsets)
        out["with_lag"] = sum(1 for o in offsets if o["lag"])
        lagging = next(o for o in offsets if o["lag"])
        batch = next(broker.partitions.get(lagging["topic"], lagging["partition"]).log
                     .batches(lagging["committed_offset"]))
        out["lag_batch"] = {"records": batch.records_count, "bytes": batch.size}
        out["format_s"] = _format_seconds(snapshot(), repeats)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(repeats):
            snapshot()
        profile.disable()
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        stats.sort_stats("tottime").print_stats(12)
        out["profile_tottime"] = text.getvalue()
        out["profile_repeats"] = repeats
        cum = {(os.path.basename(path), func): ct
               for (path, _, func), (_, _, _, ct, _) in stats.stats.items()}
        out["profile_groups_share"] = cum["groups.py", "summaries"] / cum["stats.py", "snapshot"]
    finally:
        broker.request_stop()
        broker.serve_forever()                 # stops at once: a clean shutdown
    return out


def _format_seconds(snap: dict, repeats: int) -> list[float]:
    """Seconds to build the families from ``snap`` and write the text exposition: the part
    of a scrape that runs off the loop, on prometheus_client's HTTP thread (it holds the GIL
    while it runs, so in CPython the loop waits for it in 5 ms slices)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from mq.broker.metrics import BrokerCollector
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(lambda: (snap, 0.0)))
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        generate_latest(registry)
        out.append(time.perf_counter() - t)
    return out


# --- the run context ----------------------------------------------------------------------------

class Ctx:
    def __init__(self, args, base: str) -> None:
        self.quick = args.quick
        self.runs = args.runs
        self.base = base
        self.seconds = 1.5 if args.quick else 4.0          # one produce run
        self.idle_s = 4.0 if args.quick else 12.0          # idle scraping, per shape
        self.timeout = 120.0
        self.values = harness.payloads(VALUE_SIZE, 1024, seed=43)
        self.brokers: dict = {}
        self.admin = None
        self.url = ""
        self._topics = 0

    def start_broker(self, shape: str):
        """A broker serving /metrics on a free port, on a data dir of its own."""
        import mq
        import mq.testing
        cfg = os.path.join(self.base, f"{shape}.toml")
        with open(cfg, "w") as f:
            f.write('metrics_address = "127.0.0.1:0"\n')
        broker = mq.testing.BrokerProcess(os.path.join(self.base, shape), config_file=cfg)
        self.brokers[shape] = broker.start()
        self.admin = mq.Admin(socket=broker.socket)
        self.url = self.admin.broker_stats()["broker"]["metrics_url"]
        progress(f"{shape}: broker pid {broker.pid}, metrics at {self.url}")
        return broker

    def stop_broker(self, shape: str) -> None:
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        self.brokers.pop(shape).close()

    def fresh_topic(self) -> str:
        self._topics += 1
        name = f"load-{self._topics}"
        self.admin.create_topic(name, 1)
        return name


def setup_shape(ctx: Ctx, broker, shape: str) -> dict:
    """The shape's topics, filled, and its groups' committed offsets; checked through the
    stats api: every group partition has lag and a known age."""
    import mq
    s = SHAPES[shape]
    topics = [f"{shape}-{t}" for t in range(s["topics"])]
    for t in topics:
        ctx.admin.create_topic(t, s["partitions"])
    parts = [(t, p) for t in topics for p in range(s["partitions"])]
    job = {"socket": broker.socket, "partitions": parts, "values": ctx.values,
           "n": FILL_PER_PARTITION}
    t = time.perf_counter()
    run_workers([(fill_worker, job)], ctx.timeout)
    fill_s = time.perf_counter() - t
    for g in range(s["groups"]):
        ctx.admin.alter_group_offsets(f"{shape}-group-{g}", {
            mq.TopicPartition(t, p): committed_offset(g, p) for t, p in parts})
    offsets = [o for g in ctx.admin.broker_stats()["groups"] for o in g["offsets"]]
    aged = sum(1 for o in offsets if o["lag"] and o["lag_ms"] is not None)
    if aged != len(parts) * s["groups"]:
        raise WorkerError(f"{shape}: {aged} group partitions with lag and age, expected "
                          f"{len(parts) * s['groups']}")
    progress(f"{shape}: {len(parts)} partitions x {FILL_PER_PARTITION:,} records, "
             f"{s['groups']} group(s): {aged} group partitions with lag ({fill_s:.1f} s)")
    return {**s, "partitions_total": len(parts), "group_partitions_with_lag": aged,
            "records_per_partition": FILL_PER_PARTITION, "fill_seconds": fill_s}


def _broker_meter(pid: int):
    return lambda: (time.perf_counter_ns(), process_cpu(pid))


def scrape_stats(samples: list[dict]) -> dict:
    """Percentiles of the snapshot's loop time and of the scrape's wall time; body sizes."""
    def dist(key: str) -> dict:
        v = [x[key] for x in samples]
        return {"count": len(v), "p50": pct(v, 50), "p99": pct(v, 99), "max": max(v),
                "mean": statistics.fmean(v)}
    return {"snapshot_s": dist("snapshot_s"), "wall_s": dist("wall_s"),
            "bytes": summary([x["bytes"] for x in samples])}


def idle_scrapes(ctx: Ctx, broker) -> dict:
    """A scrape every ``IDLE_INTERVAL_S`` for ``idle_s``, nothing else running."""
    meter = _broker_meter(broker.pid)
    job = {"url": ctx.url, "interval": IDLE_INTERVAL_S, "seconds": ctx.idle_s}
    (w,), s0, s1 = run_workers([(scrape_worker, job)], ctx.timeout, meter, meter)
    n = len(w["samples"])
    out = scrape_stats(w["samples"])
    out.update({"samples": w["samples"], "broker_cpu_s": s1[1] - s0[1],
                "broker_cpu_s_per_scrape": (s1[1] - s0[1]) / n,
                "scraper_cpu_s_per_scrape": w["cpu_s_loop"] / n})
    return out


def one_produce(ctx: Ctx, broker, side: str) -> dict:
    """One produce run on a fresh 1-partition topic (deleted after), scraped as ``side``
    says; the broker's CPU from the barrier to the last result."""
    topic = ctx.fresh_topic()
    jobs = [(produce_worker, {"socket": broker.socket, "topic": topic, "values": ctx.values,
                              "seconds": ctx.seconds})]
    if SIDES[side] is not None:
        jobs.append((scrape_worker, {"url": ctx.url, "interval": SIDES[side],
                                     "seconds": ctx.seconds}))
    meter = _broker_meter(broker.pid)
    try:
        (w, *scraper), s0, s1 = run_workers(jobs, ctx.timeout, meter, meter)
        end = ctx.admin.describe_topic(topic)["offsets"][0][1]
    finally:
        with contextlib.suppress(Exception):
            ctx.admin.delete_topic(topic)
    if end != w["n"]:
        raise WorkerError(f"produce {side}: the topic ends at {end}, {w['n']} records sent")
    n, seconds = w["n"], (w["t1"] - w["t0"]) / 1e9
    out = {"side": side, "n": n, "seconds": seconds, "rate": n / seconds,
           "broker_cpu_s": s1[1] - s0[1], "broker_cpu_us_per_record": (s1[1] - s0[1]) / n * 1e6,
           "client_cpu_us_per_record": w["cpu_s_loop"] / n * 1e6}
    if scraper:
        out["scrapes"] = scraper[0]["samples"]
        out["scraper_cpu_s"] = scraper[0]["cpu_s_loop"]
    return out


# --- sections -----------------------------------------------------------------------------------

def run_small(ctx: Ctx) -> dict:
    """Figure 1 for the small shape: idle, then under load (one produce run scraped every
    100 ms)."""
    broker = ctx.start_broker("small")
    try:
        res = {"shape": setup_shape(ctx, broker, "small")}
        progress(f"small: idle scrapes for {ctx.idle_s:g} s")
        res["idle"] = idle_scrapes(ctx, broker)
        progress(f"small: {ctx.seconds:g} s of produce load, scraped every 100 ms")
        run = one_produce(ctx, broker, "100ms")
        res["load"] = {**scrape_stats(run["scrapes"]), "run": run}
    finally:
        ctx.stop_broker("small")
    return res


def run_large(ctx: Ctx) -> dict:
    """Figure 1 (idle) and figure 2 (paired throughput) for the large shape; the load
    scrapes of figure 1 are those of figure 2's scraping sides."""
    broker = ctx.start_broker("large")
    res: dict = {"shape": setup_shape(ctx, broker, "large")}
    progress(f"large: idle scrapes for {ctx.idle_s:g} s")
    res["idle"] = idle_scrapes(ctx, broker)
    progress(f"large: produce warm-up ({ctx.seconds:g} s, not scraped)")
    res["warmup"] = one_produce(ctx, broker, "none")
    per: dict = {s: [] for s in SIDES}
    for r in range(ctx.runs):
        order = rotated(list(SIDES), r)
        progress(f"large: run {r + 1}/{ctx.runs} ({ctx.seconds:g} s each; {', '.join(order)})")
        for s in order:
            harness.prefault(ctx.base, int(res["warmup"]["rate"] * ctx.seconds * VALUE_SIZE))
            per[s].append(one_produce(ctx, broker, s))
    res["runs"] = per
    res["rate"] = {s: summary([x["rate"] for x in per[s]]) for s in SIDES}
    res["broker_cpu_us_per_record"] = {s: summary([x["broker_cpu_us_per_record"]
                                                   for x in per[s]]) for s in SIDES}
    res["ratio"] = {s: summary([x["rate"] / y["rate"] for x, y in
                                zip(per[s], per["none"], strict=True)]) for s in SIDES}
    res["cpu_ratio"] = {s: summary([x["broker_cpu_us_per_record"] / y["broker_cpu_us_per_record"]
                                    for x, y in zip(per[s], per["none"], strict=True)])
                        for s in SIDES}
    res["load"] = {s: scrape_stats([x for run in per[s] for x in run["scrapes"]])
                   for s in SIDES if SIDES[s] is not None}
    res["load"]["all"] = scrape_stats([x for s in SIDES if SIDES[s] is not None
                                       for run in per[s] for x in run["scrapes"]])
    progress("large: " + ", ".join(f"{SIDE_NAMES[s]} {res['rate'][s]['median']:,.0f}/s"
                                   for s in SIDES))
    return res


def run_breakdown(ctx: Ctx) -> dict:
    """The in-process snapshot on the large shape's data dir (its broker stopped first)."""
    if "large" in ctx.brokers:
        ctx.stop_broker("large")
    repeats = 5 if ctx.quick else 20
    job = {"data_dir": os.path.join(ctx.base, "large"),
           "socket": os.path.join(ctx.base, "inproc.sock"), "repeats": repeats}
    (w,), _, _ = run_workers([(breakdown_worker, job)], ctx.timeout)
    res = {k: summary(w[k]) for k in ("snapshot_s", "groups_s", "groups_cold_s", "format_s")}
    res.update({k: w[k] for k in ("group_partitions", "with_lag", "lag_batch",
                                  "profile_tottime", "profile_repeats", "profile_groups_share")})
    res["per_group_partition_s"] = res["groups_s"]["median"] / max(1, w["with_lag"])
    res["per_group_partition_cold_s"] = res["groups_cold_s"]["median"] / max(1, w["with_lag"])
    progress(f"breakdown: snapshot {res['snapshot_s']['median'] * 1e3:.1f} ms in-process, "
             f"groups.summaries() {res['groups_s']['median'] * 1e3:.1f} ms "
             f"({res['per_group_partition_s'] * 1e6:.0f} us per group partition with lag; "
             f"{w['profile_groups_share']:.1%} of the snapshot in cProfile), formatting "
             f"{res['format_s']['median'] * 1e3:.1f} ms")
    return res


# --- table --------------------------------------------------------------------------------------

def _secs(v: float) -> str:
    return f"{v * 1e3:.1f} ms" if v >= 1e-3 else f"{v * 1e6:.0f} us"


def _dist(d: dict) -> str:
    return f"{_secs(d['p50'])} / {_secs(d['p99'])} / {_secs(d['max'])}"


def _share(d: dict) -> str:
    return (f"loop share at 15 s {d['p50'] / PROMETHEUS_INTERVAL_S:.3%}, at 1 s "
            f"{d['p50'] / 1.0:.2%} (p50)")


def _shape_name(shape: str, sec: dict) -> str:
    s = sec["shape"]
    return (f"{shape} ({s['partitions_total']} partitions x {s['groups']} groups = "
            f"{s['group_partitions_with_lag']} with lag)")


def build_table(res: dict) -> Rows:
    rows = Rows()
    row = rows.add

    def yes(ok: bool) -> str:
        return "yes" if ok else "NO"

    for shape in ("small", "large"):
        sec = res.get(shape)
        if not sec:
            continue
        name = _shape_name(shape, sec)
        loads = [("idle", sec["idle"]),
                 ("produce load", sec["load"]["all"] if shape == "large" else sec["load"])]
        for what, d in loads:
            snap = d["snapshot_s"]
            goal = met = "-"
            if shape == "large":
                goal = f"<= {_secs(GOAL_SNAPSHOT_S)}"
                met = yes(snap["p50"] <= GOAL_SNAPSHOT_S)
            row(f"loop time per scrape, {name}, {what} ({snap['count']} scrapes)",
                _dist(snap), "p50/p99/max", _share(snap), goal, met)
            row(f"scrape wall time (client), {name}, {what}", _dist(d["wall_s"]),
                "p50/p99/max", f"body {d['bytes']['median'] / 1024:.0f} KiB")
        idle = sec["idle"]
        row(f"broker CPU per scrape (loop + HTTP thread), {name}, idle",
            _secs(idle["broker_cpu_s_per_scrape"]), "per scrape",
            f"scraper {_secs(idle['scraper_cpu_s_per_scrape'])}")
    lg = res.get("large")
    if lg:
        for s in SIDES:
            ratio = goal = met = "-"
            if s != "none":
                r, c = lg["ratio"][s], lg["cpu_ratio"][s]
                ratio = (f"{r['median']:.3f}x no scraping ({r['min']:.3f}-{r['max']:.3f}); "
                         f"broker CPU/rec {c['median']:.2f}x")
            if s == "1s":
                goal, met = f">= {GOAL_1S:g}x", yes(lg["ratio"][s]["median"] >= GOAL_1S)
            cpu = lg["broker_cpu_us_per_record"][s]["median"]
            row(f"produce 100 B acks=1, 1 producer, {SIDE_NAMES[s]}",
                mm(lg["rate"][s], lambda v: f"{v / 1e3:.0f} k") + f"; broker {cpu:.2f} us/rec",
                "rec/s", ratio, goal, met)
    bd = res.get("breakdown")
    if bd:
        b = bd["lag_batch"]
        row("in-process BrokerStats.snapshot(), large shape", mm(bd["snapshot_s"], _secs),
            "per call", f"{bd['profile_groups_share']:.1%} in groups.summaries() (cProfile)")
        row(f"in-process GroupApis.summaries(), {bd['with_lag']} group partitions with lag, "
            "none moved since the last look (their ages' timestamps known)",
            mm(bd["groups_s"], _secs), "per call",
            f"{_secs(bd['per_group_partition_s'])} per group partition with lag")
        row(f"the same, every group moved (each timestamp read from a batch of "
            f"{b['records']:,} records, {b['bytes'] / 1024:.0f} KiB)",
            mm(bd["groups_cold_s"], _secs), "per call",
            f"{_secs(bd['per_group_partition_cold_s'])} per group partition with lag")
        row("formatting the large snapshot (BrokerCollector + generate_latest, off the loop)",
            mm(bd["format_s"], _secs), "per scrape")
    return rows


# --- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.metrics", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="produce runs of 1.5 s instead of 4 s, 4 s of idle scraping per shape "
                        "instead of 12 s, 3 runs (under a minute)")
    p.add_argument("--runs", type=int, default=None,
                   help="repetitions of the paired throughput rotation (default 5, 3 quick)")
    add_run_arguments(p, "metrics", dir_help="parent of the temp dir (brokers' data); default: "
                      "the system temp dir")
    p.add_argument("--profile", action="store_true",
                   help="print the cProfile of the in-process snapshot (top functions by own "
                        "time); it is in the JSON either way")
    args = p.parse_args(argv)
    args.runs = args.runs or (3 if args.quick else 5)
    if args.runs < 5 and not args.quick:
        progress(f"warning: --runs {args.runs} is below the method's minimum of 5")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    idle = wait_idle(args.wait_idle, progress=progress)
    base = tempfile.mkdtemp(prefix="mq-metrics-", dir=args.dir)
    t_start = time.perf_counter()
    ctx = Ctx(args, base)
    try:
        meta = machine_facts(base, wait_idle=idle, start_method="fork")
        res: dict = {"meta": meta, "params": {
            "quick": args.quick, "runs": args.runs, "seconds_per_run": ctx.seconds,
            "idle_seconds": ctx.idle_s, "idle_interval_s": IDLE_INTERVAL_S,
            "value_size": VALUE_SIZE, "producer": PRODUCER, "shapes": SHAPES,
            "records_per_partition": FILL_PER_PARTITION, "scrape_intervals_s": SIDES}}
        sections = {"small": functools.partial(run_small, ctx),
                    "large": functools.partial(run_large, ctx),
                    "breakdown": functools.partial(run_breakdown, ctx)}
        run_sections(sections, list(sections), res, meta.setdefault("contention", {}),
                     progress=progress)
        finish_run("mq metrics benchmark", res, build_table, args.out,
                   time.perf_counter() - t_start,
                   f"{args.runs} runs{' (quick)' if args.quick else ''}")
        if args.profile:
            print(res["breakdown"]["profile_tottime"])
    finally:
        for shape in list(ctx.brokers):
            ctx.stop_broker(shape)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
