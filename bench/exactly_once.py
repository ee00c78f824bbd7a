"""Exactly-once benchmarks: what idempotence, transactions and ``read_committed`` cost, each
measured against the same thing without it, side by side in the same run. The broker is a
subprocess on a temp data dir (``mq.testing.BrokerProcess``); producers, pipelines and
consumers are forked worker processes (``bench.harness.run_workers``), as in bench/e2e.py.

::

    python3 -m bench.exactly_once [--quick] [--runs 5] [--out bench/out/exactly_once.json]
                                  [--only idempotence,transactions,pipeline,read_committed]
                                  [--interval-ms 100] [--wait-idle 300] [--dir /tmp]

Figures (``--only``), all with 100 B values and 1-partition topics:

- ``idempotence``: records/s of one producer process with the default settings (acks="all",
  idempotent) against the same with ``enable_idempotence=False``. Goal >= 0.95x.
- ``transactions``: records/s of a transactional producer committing every ``--interval-ms``
  (100) against the non-transactional (idempotent) one. Goal >= 0.8x. Run together with
  ``idempotence``, the three producers are interleaved in one rotation.
- ``pipeline``: consume-transform-produce from a prefilled topic, one process: exactly once
  (``read_committed`` group consumer + transactional producer; each interval the outputs and
  the consumed offsets go in one transaction) against at least once (``read_uncommitted``
  group consumer + idempotent producer; each interval ``flush()`` then ``commit()``).
- ``read_committed``: a fresh consumer reading every record of the same committed,
  transactionally written topic from offset 0, ``read_committed`` against
  ``read_uncommitted``. Goal >= 0.9x.

The input of the last two (the *fill*) is written once per run of the benchmark by a
transactional producer committing every interval. Prints a table on stdout, progress on
stderr, writes every raw number as JSON. See bench/README.md ("Exactly once") for the method
and bench/RESULTS.md for results.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import shutil
import signal
import sys
import tempfile
import time

from bench import harness
from bench.harness import (
    Rows,
    WorkerError,
    add_run_arguments,
    finish_run,
    fmt_ratio,
    machine_facts,
    mm,
    process_cpu,
    progress_printer,
    quiet_gc,
    rotated,
    run_workers,
    summary,
    wait_idle,
)

# --- goals (the issue's) ------------------------------------------------------------------------
GOAL_IDEMPOTENT = 0.95         # idempotent producer rec/s / non-idempotent
GOAL_TRANSACTIONAL = 0.8       # transactional (commit every 100 ms) / non-transactional
GOAL_READ_COMMITTED = 0.9      # read_committed consumer rec/s / read_uncommitted

VALUE_SIZE = 100
# Producer settings: mq's defaults (acks="all", linger_ms=5, batch_size=16 KiB, max_in_flight
# 5); idempotence follows from acks="all" unless switched off.
PRODUCER = {"acks": "all"}
MAX_RECORDS = 10_000           # poll(max_records=), as bench.e2e's consumers
CHECK_EVERY = 1024             # records between two looks at the clock in a producer loop
POLL_MS = 100

PRODUCE_SIDES = {"idempotence": ("plain", "idempotent"),
                 "transactions": ("idempotent", "transactional")}
SIDE_NAMES = {"plain": 'non-idempotent (enable_idempotence=False, acks="all")',
              "idempotent": 'idempotent (the default, acks="all")',
              "transactional": "transactional, commit every {ms:g} ms"}

_names = itertools.count()
progress = progress_printer("eos")


# --- workers (forked; each sets itself up, then waits on the barrier) ---------------------------

def produce_worker(start, socket: str, topic: str, values: list[bytes], n: int, mode: str,
                   interval_ms: float, txn_id: str) -> dict:
    """``n`` records to partition 0, then ``flush()`` (or the last commit). Every
    ``CHECK_EVERY`` records the loop looks at the clock, on every side; the transactional one
    commits and begins anew when ``interval_ms`` has passed since its last commit."""
    import mq
    kw = dict(PRODUCER)
    if mode == "plain":
        kw["enable_idempotence"] = False
    elif mode == "transactional":
        kw["transactional_id"] = txn_id
    p = mq.Producer(socket=socket, **kw)
    p.partitions_for(topic)                   # metadata (and InitProducerId) before the clock
    txn = mode == "transactional"
    if txn:
        p.init_transactions()
    send, k, clock = p.send, len(values), time.perf_counter_ns
    mask, interval = CHECK_EVERY - 1, int(interval_ms * 1e6)
    commits = 0
    commit_ns = 0
    quiet_gc()
    start()
    cpu0 = time.process_time()
    t0 = clock()
    if txn:
        p.begin_transaction()
    due = t0 + interval
    for i in range(n):
        send(topic, values[i % k], partition=0)
        if not i & mask:
            now = clock()
            if now >= due:
                if txn:
                    p.commit_transaction()
                    p.begin_transaction()
                    commits += 1
                    t = clock()
                    commit_ns += t - now
                    now = t
                due = now + interval
    if txn:
        t = clock()
        p.commit_transaction()
        commits += 1
        commit_ns += clock() - t
    else:
        p.flush()
    t1 = clock()
    cpu = time.process_time() - cpu0
    p.close()
    return {"t0": t0, "t1": t1, "n": n, "commits": commits, "commit_s": commit_ns / 1e9,
            "cpu_s_loop": cpu, "pid": os.getpid()}


def fill_worker(start, socket: str, topic: str, values: list[bytes], n: int,
                interval_ms: float, txn_id: str) -> dict:
    """The input of ``pipeline`` and ``read_committed``: ``n`` records written by a
    transactional producer committing every ``interval_ms``."""
    return produce_worker(start, socket, topic, values, n, "transactional", interval_ms,
                          txn_id)


def pipeline_worker(start, socket: str, src: str, dst: str, n: int, mode: str,
                    interval_ms: float, group: str, txn_id: str) -> dict:
    """Consume ``n`` records of ``src`` (partition 0, from offset 0) in a fresh group,
    transform each (``bytes(value).upper()``) and send it to ``dst``; every ``interval_ms``
    make the progress durable: exactly once (``eos``), the outputs and the consumed position
    in one transaction; at least once (``alo``), ``flush()`` then ``commit()``."""
    import mq
    eos = mode == "eos"
    c = mq.Consumer(src, group_id=group, socket=socket, enable_auto_commit=False,
                    isolation_level="read_committed" if eos else "read_uncommitted")
    p = mq.Producer(socket=socket, **PRODUCER, **({"transactional_id": txn_id} if eos else {}))
    p.partitions_for(dst)
    if eos:
        p.init_transactions()
    tp = mq.TopicPartition(src, 0)
    deadline = time.monotonic() + 30
    while not c.poll(50, max_records=1):      # joined, assigned, and the first record read
        if time.monotonic() > deadline:
            raise RuntimeError(f"no record of {src} within 30 s of joining group {group}")
    c.seek(tp, 0)
    send, poll, position, clock = p.send, c.poll, c.position, time.perf_counter_ns
    interval = int(interval_ms * 1e6)
    got = commits = commit_ns = polls = 0
    quiet_gc()
    start()
    cpu0 = time.process_time()
    t0 = clock()
    if eos:
        p.begin_transaction()
    due = t0 + interval
    while got < n:
        for recs in poll(POLL_MS, min(MAX_RECORDS, n - got)).values():
            for r in recs:
                send(dst, bytes(r.value).upper(), partition=0)
            got += len(recs)
        polls += 1
        now = clock()
        if now >= due or got >= n:
            offsets = {tp: position(tp)}
            if eos:
                p.send_offsets_to_transaction(offsets, c)
                p.commit_transaction()
                if got < n:
                    p.begin_transaction()
            else:
                p.flush()
                c.commit(offsets)
            commits += 1
            t = clock()
            commit_ns += t - now
            due = t + interval
    t1 = clock()
    cpu = time.process_time() - cpu0
    out = {"t0": t0, "t1": t1, "n": got, "commits": commits, "commit_s": commit_ns / 1e9,
           "polls": polls, "cpu_s_loop": cpu, "position": position(tp),
           "committed": c.committed(tp), "pid": os.getpid()}
    p.close()
    c.close()
    return out


def read_worker(start, socket: str, topic: str, n: int, isolation: str) -> dict:
    """A fresh consumer reads all ``n`` records of partition 0 from offset 0 with
    ``poll(1000, max_records=10000)`` (values not touched, as bench.e2e's ``poll`` row)."""
    import mq
    c = mq.Consumer(socket=socket, isolation_level=isolation)
    c.assign([mq.TopicPartition(topic, 0)])
    poll, clock = c.poll, time.perf_counter_ns
    got = polls = 0
    quiet_gc()
    start()
    cpu0 = time.process_time()
    t0 = clock()
    while got < n:
        for recs in poll(1000, MAX_RECORDS).values():
            got += len(recs)
        polls += 1
    t1 = clock()
    cpu = time.process_time() - cpu0
    c.close()
    return {"t0": t0, "t1": t1, "n": got, "polls": polls, "cpu_s_loop": cpu}


# --- the run context ----------------------------------------------------------------------------

class Ctx:
    def __init__(self, args, base: str, broker) -> None:
        import mq
        self.quick = args.quick
        self.runs = args.runs
        self.interval_ms = args.interval_ms
        self.base = base
        self.broker = broker
        self.socket = broker.socket
        self.admin = mq.Admin(socket=broker.socket)
        # Runs span many commit intervals (100 ms each by default): 10 in a quick run, 25 in a
        # full one, so the last commit and the start weigh little.
        self.target_s = 1.0 if args.quick else 2.5
        self.fill_n = 600_000 if args.quick else 2_000_000
        self.timeout = 180.0
        self.input: str | None = None         # the fill's topic
        self.values = harness.payloads(VALUE_SIZE, 1024, seed=41)

    def name(self, what: str) -> str:
        return f"eos-{what}-{os.getpid()}-{next(_names)}"

    def topic(self, what: str) -> str:
        name = self.name(what)
        self.admin.create_topic(name, 1)
        return name

    def drop(self, topic: str) -> None:
        with contextlib.suppress(Exception):
            self.admin.delete_topic(topic)

    def end_offset(self, topic: str) -> int:
        return self.admin.describe_topic(topic)["offsets"][0][1]

    def sized(self, rate: float, lo: int, hi: int) -> int:
        """Records for a run of about ``target_s`` at ``rate``, within [lo, hi]."""
        return int(min(hi, max(lo, rate * self.target_s)))


def _broker_meter(ctx: Ctx):
    pid = ctx.broker.pid
    return lambda: (time.perf_counter_ns(), process_cpu(pid))


def _rate(x: dict) -> float:
    return x["n"] / ((x["t1"] - x["t0"]) / 1e9)


def _with_cpu(out: dict, n: int, s0, s1) -> dict:
    out["broker_cpu_s"] = s1[1] - s0[1]
    out["broker_cpu_us_per_record"] = out["broker_cpu_s"] / n * 1e6
    out["client_cpu_us_per_record"] = out["cpu_s_loop"] / n * 1e6
    return out


def _ratios(per: dict, pairs: dict[str, tuple[str, str]]) -> dict:
    return {k: summary([x["rate"] / y["rate"] for x, y in zip(per[a], per[b], strict=True)])
            for k, (a, b) in pairs.items()}


def _cpu_ratios(per: dict, pairs: dict[str, tuple[str, str]]) -> dict:
    """Paired ratios of CPU per record (``_cpu_us``), this side over the other: > 1 means
    this side spends more CPU on a record. Less sensitive to neighbours than the rate."""
    return {k: summary([_cpu_us(x) / _cpu_us(y) for x, y in zip(per[a], per[b], strict=True)])
            for k, (a, b) in pairs.items()}


def _cpu_us(x: dict) -> float:
    """CPU per record of one run: the worker's, plus the broker's where it was measured."""
    return x["client_cpu_us_per_record"] + x.get("broker_cpu_us_per_record", 0.0)


# --- 1 and 2: producers -------------------------------------------------------------------------

def one_produce(ctx: Ctx, mode: str, n: int) -> dict:
    topic = ctx.topic(mode)
    meter = _broker_meter(ctx)
    try:
        job = {"socket": ctx.socket, "topic": topic, "values": ctx.values, "n": n,
               "mode": mode, "interval_ms": ctx.interval_ms, "txn_id": ctx.name("txn")}
        (w,), s0, s1 = run_workers([(produce_worker, job)], ctx.timeout, meter, meter)
        end = ctx.end_offset(topic)
    finally:
        ctx.drop(topic)
    markers = w["commits"] if mode == "transactional" else 0
    if end != n + markers:                    # every record once, one marker per commit
        raise WorkerError(f"produce {mode}: the topic ends at offset {end}, expected "
                          f"{n} records + {markers} markers")
    out = {"mode": mode, "n": n, "seconds": (w["t1"] - w["t0"]) / 1e9, "rate": _rate(w),
           "commits": w["commits"], "commit_s": w["commit_s"], "cpu_s_loop": w["cpu_s_loop"],
           "end_offset": end}
    return _with_cpu(out, n, s0, s1)


def run_produce(ctx: Ctx, figures: list[str]) -> dict:
    sides = list(dict.fromkeys(s for f in figures for s in PRODUCE_SIDES[f]))
    n0 = 150_000 if ctx.quick else 400_000
    progress(f"produce: warm-up (idempotent, {n0:,} records)")
    warm = one_produce(ctx, "idempotent", n0)
    n = ctx.sized(warm["rate"], 50_000, 3_000_000)
    per: dict = {s: [] for s in sides}
    for r in range(ctx.runs):
        order = rotated(sides, r)
        progress(f"produce: run {r + 1}/{ctx.runs} ({n:,} records of {VALUE_SIZE} B; "
                 f"{', '.join(order)})")
        for s in order:
            harness.prefault(ctx.base, n * VALUE_SIZE)
            per[s].append(one_produce(ctx, s, n))
    pairs = {}
    if "idempotence" in figures:
        pairs["idempotent_vs_plain"] = ("idempotent", "plain")
    if "transactions" in figures:
        pairs["transactional_vs_idempotent"] = ("transactional", "idempotent")
        if "plain" in per:
            pairs["transactional_vs_plain"] = ("transactional", "plain")
    res = {"n": n, "value_size": VALUE_SIZE, "settings": PRODUCER,
           "interval_ms": ctx.interval_ms, "check_every": CHECK_EVERY, "warmup": warm,
           "runs": per, "rate": {s: summary([x["rate"] for x in per[s]]) for s in sides},
           "broker_cpu_us_per_record": {s: summary([x["broker_cpu_us_per_record"]
                                                    for x in per[s]]) for s in sides},
           "client_cpu_us_per_record": {s: summary([x["client_cpu_us_per_record"]
                                                    for x in per[s]]) for s in sides},
           "commit_share": {s: summary([x["commit_s"] / x["seconds"] for x in per[s]])
                            for s in sides},
           "ratio": _ratios(per, pairs), "cpu_ratio": _cpu_ratios(per, pairs)}
    progress("produce: " + ", ".join(f"{s} {res['rate'][s]['median']:,.0f}/s" for s in sides))
    return res


# --- the input of 3 and 4 -----------------------------------------------------------------------

def run_fill(ctx: Ctx) -> dict:
    topic = ctx.topic("input")
    n = ctx.fill_n
    progress(f"fill: {n:,} records of {VALUE_SIZE} B, transactional, commit every "
             f"{ctx.interval_ms:g} ms")
    job = {"socket": ctx.socket, "topic": topic, "values": ctx.values, "n": n,
           "interval_ms": ctx.interval_ms, "txn_id": ctx.name("fill")}
    (w,), _, _ = run_workers([(fill_worker, job)], ctx.timeout)
    end = ctx.end_offset(topic)
    if end != n + w["commits"]:
        raise WorkerError(f"fill: the topic ends at {end}, expected {n} records + "
                          f"{w['commits']} markers")
    ctx.input = topic
    return {"topic": topic, "n": n, "transactions": w["commits"], "end_offset": end,
            "seconds": (w["t1"] - w["t0"]) / 1e9, "rate": _rate(w)}


# --- 3: consume-transform-produce ---------------------------------------------------------------

def one_pipeline(ctx: Ctx, mode: str, n: int) -> dict:
    dst = ctx.topic(f"out-{mode}")
    group = ctx.name(f"group-{mode}")
    meter = _broker_meter(ctx)
    try:
        job = {"socket": ctx.socket, "src": ctx.input, "dst": dst, "n": n, "mode": mode,
               "interval_ms": ctx.interval_ms, "group": group, "txn_id": ctx.name("txn")}
        (w,), s0, s1 = run_workers([(pipeline_worker, job)], ctx.timeout, meter, meter)
        end = ctx.end_offset(dst)
    finally:
        ctx.drop(dst)
        with contextlib.suppress(Exception):
            ctx.admin.delete_group(group)
    markers = w["commits"] if mode == "eos" else 0
    if w["n"] != n or end != n + markers or w["committed"] != w["position"]:
        raise WorkerError(f"pipeline {mode}: {w['n']} records consumed, output ends at {end} "
                          f"(expected {n} + {markers} markers), committed offset "
                          f"{w['committed']} at position {w['position']}")
    out = {"mode": mode, "n": n, "seconds": (w["t1"] - w["t0"]) / 1e9, "rate": _rate(w),
           "commits": w["commits"], "commit_s": w["commit_s"], "polls": w["polls"],
           "cpu_s_loop": w["cpu_s_loop"], "committed": w["committed"], "output_end": end}
    return _with_cpu(out, n, s0, s1)


def run_pipeline(ctx: Ctx) -> dict:
    n0 = 150_000 if ctx.quick else 300_000
    progress(f"pipeline: warm-up (exactly once, {n0:,} records)")
    warm = one_pipeline(ctx, "eos", n0)
    n = ctx.sized(warm["rate"], 20_000, ctx.fill_n)
    per: dict = {"alo": [], "eos": []}
    for r in range(ctx.runs):
        order = rotated(list(per), r)
        progress(f"pipeline: run {r + 1}/{ctx.runs} ({n:,} records; {', '.join(order)})")
        for m in order:
            harness.prefault(ctx.base, n * VALUE_SIZE)
            per[m].append(one_pipeline(ctx, m, n))
    res = {"n": n, "value_size": VALUE_SIZE, "settings": PRODUCER,
           "interval_ms": ctx.interval_ms, "max_records": MAX_RECORDS, "warmup": warm,
           "runs": per, "rate": {m: summary([x["rate"] for x in per[m]]) for m in per},
           "broker_cpu_us_per_record": {m: summary([x["broker_cpu_us_per_record"]
                                                    for x in per[m]]) for m in per},
           "client_cpu_us_per_record": {m: summary([x["client_cpu_us_per_record"]
                                                    for x in per[m]]) for m in per},
           "commit_share": {m: summary([x["commit_s"] / x["seconds"] for x in per[m]])
                            for m in per},
           "ratio": _ratios(per, {"eos_vs_alo": ("eos", "alo")}),
           "cpu_ratio": _cpu_ratios(per, {"eos_vs_alo": ("eos", "alo")})}
    progress("pipeline: " + ", ".join(f"{m} {res['rate'][m]['median']:,.0f}/s" for m in per))
    return res


# --- 4: read_committed vs read_uncommitted ------------------------------------------------------

def one_read(ctx: Ctx, isolation: str, n: int) -> dict:
    job = {"socket": ctx.socket, "topic": ctx.input, "n": n, "isolation": isolation}
    (w,), _, _ = run_workers([(read_worker, job)], ctx.timeout)
    if w["n"] != n:
        raise WorkerError(f"read {isolation}: {w['n']} records, expected {n}")
    return {"isolation": isolation, "n": n, "seconds": (w["t1"] - w["t0"]) / 1e9,
            "rate": _rate(w), "polls": w["polls"], "cpu_s_loop": w["cpu_s_loop"],
            "client_cpu_us_per_record": w["cpu_s_loop"] / n * 1e6}


def run_read(ctx: Ctx) -> dict:
    n = ctx.fill_n
    progress(f"read_committed: warm-up (read_uncommitted, {n:,} records)")
    warm = one_read(ctx, "read_uncommitted", n)
    per: dict = {"read_uncommitted": [], "read_committed": []}
    for r in range(ctx.runs):
        order = rotated(list(per), r)
        progress(f"read_committed: run {r + 1}/{ctx.runs} ({n:,} records; {', '.join(order)})")
        for iso in order:
            per[iso].append(one_read(ctx, iso, n))
    res = {"n": n, "value_size": VALUE_SIZE, "max_records": MAX_RECORDS, "warmup": warm,
           "runs": per, "rate": {i: summary([x["rate"] for x in per[i]]) for i in per},
           "client_cpu_us_per_record": {i: summary([x["client_cpu_us_per_record"]
                                                    for x in per[i]]) for i in per},
           "ratio": _ratios(per, {"committed_vs_uncommitted": ("read_committed",
                                                                "read_uncommitted")}),
           "cpu_ratio": _cpu_ratios(per, {"committed_vs_uncommitted": ("read_committed",
                                                                        "read_uncommitted")})}
    progress("read_committed: " + ", ".join(f"{i} {res['rate'][i]['median']:,.0f}/s"
                                            for i in per))
    return res


# --- table --------------------------------------------------------------------------------------

def _fmt_rate(v: float) -> str:
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.0f} k"


def _cpu(sec: dict, side: str) -> str:
    """The medians of the worker's and the broker's CPU per record: steadier than the rate
    when neighbours come and go."""
    out = f"; CPU {sec['client_cpu_us_per_record'][side]['median']:.2f}"
    if "broker_cpu_us_per_record" in sec:
        out += f" + broker {sec['broker_cpu_us_per_record'][side]['median']:.2f}"
    return out + " us/rec"


def _cpu_ratio(sec: dict, key: str) -> str:
    c = sec.get("cpu_ratio", {}).get(key)
    return f"; CPU/rec {c['median']:.2f}x" if c else ""


def build_table(res: dict) -> list[dict]:
    rows = Rows()
    row = rows.add

    def yes(ok: bool) -> str:
        return "yes" if ok else "NO"

    pr = res.get("produce")
    if pr:
        ms = pr["interval_ms"]
        rt = pr["ratio"]
        for s in pr["rate"]:
            ratio = goal = met = "-"
            if s == "idempotent" and "idempotent_vs_plain" in rt:
                r = rt["idempotent_vs_plain"]
                ratio = fmt_ratio(r, "non-idempotent") + _cpu_ratio(pr, "idempotent_vs_plain")
                goal = f">= {GOAL_IDEMPOTENT:g}x"
                met = yes(r["median"] >= GOAL_IDEMPOTENT)
            elif s == "transactional":
                r = rt["transactional_vs_idempotent"]
                ratio = (fmt_ratio(r, "non-transactional")
                         + _cpu_ratio(pr, "transactional_vs_idempotent"))
                goal = f">= {GOAL_TRANSACTIONAL:g}x"
                met = yes(r["median"] >= GOAL_TRANSACTIONAL)
            row(f"produce 100 B, {SIDE_NAMES[s].format(ms=ms)}",
                mm(pr["rate"][s], _fmt_rate) + _cpu(pr, s), "rec/s", ratio, goal, met)
    pl = res.get("pipeline")
    if pl:
        ms = pl["interval_ms"]
        row(f"pipeline 100 B, at least once (read_uncommitted + idempotent producer; "
            f"flush + commit every {ms:g} ms)", mm(pl["rate"]["alo"], _fmt_rate)
            + _cpu(pl, "alo"), "rec/s")
        row(f"pipeline 100 B, exactly once (read_committed + transactional producer; "
            f"outputs + offsets in one txn every {ms:g} ms)", mm(pl["rate"]["eos"], _fmt_rate)
            + _cpu(pl, "eos"), "rec/s", fmt_ratio(pl["ratio"]["eos_vs_alo"], "at least once")
            + _cpu_ratio(pl, "eos_vs_alo"))
    rd = res.get("read_committed")
    if rd:
        what = f"consume {rd['n'] / 1e6:g} M committed records of 100 B"
        row(f"{what}, read_uncommitted", mm(rd["rate"]["read_uncommitted"], _fmt_rate)
            + _cpu(rd, "read_uncommitted"), "rec/s")
        r = rd["ratio"]["committed_vs_uncommitted"]
        row(f"{what}, read_committed", mm(rd["rate"]["read_committed"], _fmt_rate)
            + _cpu(rd, "read_committed"), "rec/s",
            fmt_ratio(r, "read_uncommitted") + _cpu_ratio(rd, "committed_vs_uncommitted"),
            f">= {GOAL_READ_COMMITTED:g}x",
            yes(r["median"] >= GOAL_READ_COMMITTED))
    return rows


# --- main ---------------------------------------------------------------------------------------

FIGURES = ("idempotence", "transactions", "pipeline", "read_committed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.exactly_once", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="runs of about 1 s instead of 2.5 s, a 0.6 M-record input instead "
                        "of 2 M (under a minute)")
    p.add_argument("--runs", type=int, default=5, help="repetitions per figure (>= 5)")
    p.add_argument("--only", default=",".join(FIGURES),
                   help=f"comma-separated subset of {','.join(FIGURES)}")
    p.add_argument("--interval-ms", type=float, default=100.0,
                   help="commit interval of the transactional producers and of both "
                        "pipelines (default 100, Kafka Streams' exactly-once default)")
    add_run_arguments(p, "exactly_once", dir_help="parent of the temp dir (broker data); "
                      "default: the system temp dir. It must be a real disk, not tmpfs")
    args = p.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    unknown = set(only) - set(FIGURES)
    if unknown:
        p.error(f"unknown figure(s) {', '.join(sorted(unknown))}; known: {', '.join(FIGURES)}")
    if args.runs < 5:
        progress(f"warning: --runs {args.runs} is below the method's minimum of 5")
    if args.interval_ms <= 0:
        p.error("--interval-ms must be positive")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import mq.testing

    idle = wait_idle(args.wait_idle, progress=progress)
    base = tempfile.mkdtemp(prefix="mq-eos-", dir=args.dir)
    broker = None
    t_start = time.perf_counter()
    try:
        meta = machine_facts(base, wait_idle=idle, start_method="fork")
        res: dict = {"meta": meta, "params": {"quick": args.quick, "runs": args.runs,
                                              "figures": only, "interval_ms": args.interval_ms,
                                              "value_size": VALUE_SIZE, "producer": PRODUCER}}
        broker = mq.testing.BrokerProcess(os.path.join(base, "mq-data")).start()
        progress(f"temp dir {base}; broker pid {broker.pid}")
        ctx = Ctx(args, base, broker)
        try:
            res["params"].update({"target_seconds_per_run": ctx.target_s,
                                  "fill_records": ctx.fill_n})
            produce = [f for f in ("idempotence", "transactions") if f in only]
            sections = {"produce": functools.partial(run_produce, ctx, produce),
                        "fill": functools.partial(run_fill, ctx),
                        "pipeline": functools.partial(run_pipeline, ctx),
                        "read_committed": functools.partial(run_read, ctx)}
            wanted = (["produce"] if produce else []) + \
                (["fill"] if {"pipeline", "read_committed"} & set(only) else []) + \
                [s for s in ("pipeline", "read_committed") if s in only]
            harness.run_sections(sections, wanted, res, meta.setdefault("contention", {}),
                                 progress=progress)
        finally:
            ctx.admin.close()
        finish_run("mq exactly-once benchmarks", res, build_table, args.out,
                   time.perf_counter() - t_start,
                   f"{args.runs} runs{' (quick)' if args.quick else ''}")
    finally:
        if broker is not None:
            broker.close()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
