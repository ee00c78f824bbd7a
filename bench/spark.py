"""The ``mq`` Spark data source's figures, in one run (issue 10, "Figures"), each against a peer
measured in the same run on the same machine. Spark runs in local mode (``local[2]``, this
process's JVM); the broker is a subprocess on a temp data dir.

::

    python3 -m bench.spark [--quick] [--rows 10000000] [--runs 5] [--rate 10000]
                           [--only read,latency,sink] [--out bench/out/spark.json]
                           [--dir /tmp] [--wait-idle S]

Figures (``--only``):

- ``read``: a batch read of ``--rows`` records of 100 B (10 M; 1 M with ``--quick``) from a
  topic of 2 partitions, into ``count()``, into the ``noop`` sink (every column of every row
  materialised) and into a Parquet write: rows/s with ``format("mq")``, against Spark reading
  the same records (the same 7 columns, written from the topic before the runs) from Parquet
  files and from JSON lines files. Goals: mq >= 2 M rows/s, and >= 0.5x the Parquet read.
- ``latency``: end to end, a record produced -> its row visible in the sink, at ``--rate``
  records/s with a 100 ms trigger (``bench.spark_latency``): p50/p99 of the query with the
  exactly-once sink, with the at-least-once sink, and without Spark.
- ``sink``: ``bench.spark_sink`` (the sink against ``mq.Producer`` alone), run as a
  subprocess with this run's ``--quick``/``--runs``/``--dir``; its table rows and JSON are
  taken in here.

The sides of a ratio alternate within each run, their order rotated run by run; ratios are
per run, then median (min-max). Prints the table on stdout, progress on stderr, every number as
JSON to ``--out``. Method and reading: bench/README.md ("Spark"); results: bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench import harness
from bench.harness import (
    Rows,
    format_table,
    machine_facts,
    mm,
    print_contention,
    rotated,
    run_workers,
    summary,
    write_json,
)

progress = harness.progress_printer("spark")

FIGURES = ("read", "latency", "sink")
SOURCES = ("mq", "parquet", "json")
ACTIONS = ("count()", "noop", "parquet write")
VALUE_SIZE = 100
KAFKA_DDL = ("key binary, value binary, topic string, partition int, offset long, "
             "timestamp timestamp, timestampType int")
GOAL_ROWS_S = 2e6
GOAL_VS_PARQUET = 0.5


class Ctx:
    """What the sections share: the broker, the temp dir, the Spark session. The session
    starts on first use, after the read section's fill forked its producers; the latency
    section's workers are forked with the JVM running, as ``bench.spark_sink``'s are (a forked
    child never touches the gateway)."""

    def __init__(self, args, base: str, broker) -> None:
        import mq
        self.args, self.base, self.broker = args, base, broker
        self.quick, self.runs = args.quick, args.runs
        self.socket = broker.socket
        self.admin = mq.Admin(self.socket)
        self.progress = progress
        self._spark = None

    def create_topic(self, name: str, partitions: int) -> None:
        self.admin.create_topic(name, partitions)

    def spark(self):
        if self._spark is None:
            from pyspark.sql import SparkSession

            import mq.spark
            os.environ["PYSPARK_PYTHON"] = sys.executable
            os.environ["SPARK_LOCAL_DIRS"] = os.path.join(self.base, "spark-local")
            self._spark = (SparkSession.builder.master("local[2]").appName("bench-spark")
                           .config("spark.ui.enabled", "false")
                           .config("spark.ui.showConsoleProgress", "false")
                           .config("spark.sql.shuffle.partitions", "2")
                           .config("spark.driver.memory", "2g")
                           .getOrCreate())
            self._spark.sparkContext.setLogLevel("ERROR")
            mq.spark.register(self._spark)
        return self._spark

    def stop_spark(self) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


# --- read ---------------------------------------------------------------------------------------

def _fill_worker(start, socket: str, topic: str, partition: int, n: int) -> dict:
    """``n`` records into ``partition``: distinct values (``harness.payloads`` text whose first
    12 bytes are the record's number), so no copy gets them cheaper by dictionary encoding."""
    import mq
    values = harness.payloads(VALUE_SIZE, 100_000, seed=partition + 1)
    with mq.Producer(socket=socket, acks=1, linger_ms=20, batch_size=256 << 10) as p:
        p.partitions_for(topic)
        harness.quiet_gc()
        start()
        send = p.send
        for i in range(n):
            send(topic, b"%012d" % (i * 2 + partition) + values[i % 100_000][12:],
                 partition=partition)
        p.flush()
    return {}


def cpu_split() -> dict[str, float]:
    """CPU seconds so far of this process's JVM and of Spark's Python workers (the processes
    of ``pyspark.daemon``): where a read's time goes, Spark side and Python side."""
    import psutil
    out = {"jvm": 0.0, "python": 0.0}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd, t = proc.cmdline(), proc.cpu_times()
        except psutil.Error:
            continue
        kind = "jvm" if cmd and os.path.basename(cmd[0]) == "java" else \
            "python" if "pyspark.daemon" in cmd else None
        if kind:
            out[kind] += t.user + t.system
    return out


def _du(path: str, suffix: str = "") -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if f.endswith(suffix))


def run_read(ctx: Ctx) -> dict:
    n = ctx.args.rows
    ctx.create_topic("records", 2)
    t = time.perf_counter()
    run_workers([(_fill_worker, {"socket": ctx.socket, "topic": "records", "partition": p,
                                 "n": n // 2 + (p < n % 2)}) for p in (0, 1)], timeout=1800)
    fill_s = time.perf_counter() - t
    progress(f"read: {n:,} records of {VALUE_SIZE} B written in {fill_s:.1f} s")
    spark = ctx.spark()
    files = {s: os.path.join(ctx.base, f"records.{s}") for s in ("parquet", "json")}
    frames = {"mq": lambda: spark.read.format("mq").option("socket", ctx.socket)
              .option("subscribe", "records").load(),
              "parquet": lambda: spark.read.parquet(files["parquet"]),
              "json": lambda: spark.read.schema(KAFKA_DDL).json(files["json"])}
    frames["mq"]().write.parquet(files["parquet"])
    frames["mq"]().write.json(files["json"])
    sizes = {"mq": sum(_du(os.path.join(ctx.broker.data_dir, f"records-{p}"), ".log")
                       for p in (0, 1)),
             **{s: _du(p) for s, p in files.items()}}
    progress("read: copies written (MB: " + ", ".join(f"{s} {b / 1e6:,.0f}"
                                                      for s, b in sizes.items()) + ")")
    out_dir = os.path.join(ctx.base, "written.parquet")

    cpu: dict = {}

    def one(action: str, source: str) -> float:
        df = frames[source]()
        c0 = cpu_split()
        t0 = time.perf_counter()
        if action == "count()":
            got = df.count()
        elif action == "noop":
            df.write.format("noop").mode("overwrite").save()
        else:
            df.write.parquet(out_dir)
        seconds = time.perf_counter() - t0
        c1 = cpu_split()
        cpu[f"{action} {source}"] = {k: (c1[k] - c0[k]) / n * 1e6 for k in c0}    # us/row
        if action == "count()" and got != n:
            raise RuntimeError(f"{source}: count() = {got:,}, expected {n:,}")
        shutil.rmtree(out_dir, ignore_errors=True)
        return seconds

    for action in ACTIONS:          # warm-up, untimed: workers, JIT-compiled code, page cache
        for source in SOURCES:
            one(action, source)
    runs = []
    for r in range(ctx.runs):
        meter = harness.FamilyMeter()
        run: dict = {}
        for action in ACTIONS:
            for source in rotated(SOURCES, r):
                run[f"{action} {source}"] = n / one(action, source)
                run[f"{action} {source} cpu_us_per_row"] = cpu[f"{action} {source}"]
        run["contention"] = c = meter.stop()
        progress(f"read: run {r + 1}/{ctx.runs}: " + ", ".join(
            f"{k} {v / 1e6:.2f} M" for k, v in run.items() if isinstance(v, float)) + " rows/s")
        harness.warn_if_busy(c, f"read run {r + 1}: ", progress)
        runs.append(run)
    out: dict = {"rows": n, "fill_s": fill_s, "bytes": sizes, "runs": runs}
    for action in ACTIONS:
        for source in SOURCES:
            key = f"{action} {source}"
            out[key] = {"rows_per_s": summary([run[key] for run in runs]),
                        **{f"{k}_cpu_us_per_row": summary([run[f"{key} cpu_us_per_row"][k]
                                                           for run in runs])
                           for k in ("jvm", "python")}}
            if source != "parquet":
                out[key]["ratio_vs_parquet"] = summary(
                    [run[key] / run[f"{action} parquet"] for run in runs])
            if source == "mq":
                out[key]["ratio_vs_json"] = summary(
                    [run[key] / run[f"{action} json"] for run in runs])
    return out


# --- sink ---------------------------------------------------------------------------------------

def run_sink(ctx: Ctx) -> dict:
    """``bench.spark_sink`` in a subprocess (its own broker and JVM; this one's stopped)."""
    ctx.stop_spark()
    out = os.path.join(ctx.base, "spark_sink.json")
    cmd = [sys.executable, "-m", "bench.spark_sink", "--out", out, "--dir", ctx.base] + \
        (["--quick"] if ctx.quick else ["--runs", str(ctx.runs)])
    progress(f"sink: {' '.join(cmd[1:])}")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.spark_sink exited with {proc.returncode}")
    with open(out) as f:
        res = json.load(f)
    res["table_text"] = proc.stdout
    return res


# --- the table ----------------------------------------------------------------------------------

def _ratio(s: dict) -> str:
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"


def build_table(res: dict) -> Rows:
    rows = Rows()
    m = lambda x: f"{x / 1e6:.2f} M"                               # noqa: E731
    rd = res.get("read")
    if rd:
        for action in ACTIONS:
            for source in SOURCES:
                e = rd[f"{action} {source}"]
                bench = f"read {rd['rows'] / 1e6:g} M x {VALUE_SIZE} B -> {action}, {source}"
                fig = f"{mm(e['rows_per_s'], m)}; CPU JVM " \
                      f"{e['jvm_cpu_us_per_row']['median']:.2f} + Python " \
                      f"{e['python_cpu_us_per_row']['median']:.2f} us/row"
                if source != "mq":
                    rows.add(bench, fig, "rows/s")
                    continue
                ratio = f"{_ratio(e['ratio_vs_parquet'])} parquet; " \
                        f"{_ratio(e['ratio_vs_json'])} json"
                med = e["rows_per_s"]["median"]
                vs = e["ratio_vs_parquet"]["median"]
                met = "yes" if med >= GOAL_ROWS_S and vs >= GOAL_VS_PARQUET else "NO"
                rows.add(bench, fig, "rows/s", ratio, f">= 2 M; >= {GOAL_VS_PARQUET}x parquet",
                         met)
    lt = res.get("latency")
    if lt:
        floor = lt["no spark"]["p50_us_runs"]["median"]
        for side in ("spark, exactly once", "spark, at least once", "no spark"):
            e = lt[side]
            p50, p99 = e["p50_us_runs"], e["p99_us_runs"]
            ms = lambda x: f"{x / 1e3:,.1f}"                       # noqa: E731
            sat = f"; saturated {e['saturated_runs']} runs" if e["saturated_runs"] else ""
            rows.add(f"latency {lt['rate']:,.0f}/s, trigger 100 ms: {side}",
                     f"p50 {mm(p50, ms)}; p99 {mm(p99, ms)}", "ms",
                     "-" if side == "no spark" else f"p50 {p50['median'] / floor:,.0f}x no "
                     f"spark; achieved {e['achieved_rate']['median']:,.0f}/s{sat}")
    sk = res.get("sink")
    if sk:
        for side, e in sk["summary"].items():
            rows.add(f"sink {sk['params']['rows'] / 1e6:g} M x {VALUE_SIZE} B: {side}",
                     mm(e["rows_per_s"], lambda x: f"{x / 1e3:,.0f}k"), "rows/s",
                     "-" if side == "Producer x1" else
                     f"{_ratio(e['ratio_vs_producer_x1'])} Producer x1")
    return rows


def _json_default(o):
    """HdrHistogram encodings are bytes (base64 text): written as str."""
    if isinstance(o, bytes):
        return o.decode("ascii")
    raise TypeError(f"not JSON: {type(o).__name__}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.spark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="1 M rows, 3 runs, 8 s latency windows, bench.spark_sink --quick")
    p.add_argument("--rows", type=int, default=None, help="records of the read figure "
                   "(default 10 M; 1 M with --quick)")
    p.add_argument("--runs", type=int, default=None, help="repetitions (default 5; 3 quick)")
    p.add_argument("--rate", type=float, default=10_000, help="offered records/s of the "
                   "latency figure (default 10000)")
    p.add_argument("--only", default=",".join(FIGURES),
                   help=f"comma-separated subset of {','.join(FIGURES)}")
    harness.add_run_arguments(p, "spark", dir_help="parent of the temp dir (broker data, Parquet "
                              "and JSON copies, checkpoints); a real disk, not tmpfs")
    args = p.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    if set(only) - set(FIGURES):
        p.error(f"unknown figure(s) {', '.join(sorted(set(only) - set(FIGURES)))}")
    args.rows = args.rows or (1_000_000 if args.quick else 10_000_000)
    args.runs = args.runs or (3 if args.quick else 5)
    if args.runs < 5:
        progress(f"warning: --runs {args.runs} is below the method's minimum of 5")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import mq.testing
    from bench.spark_latency import run_latency

    idle = harness.wait_idle(args.wait_idle, progress=progress)
    base = tempfile.mkdtemp(prefix="mq-bench-spark-", dir=args.dir)
    broker = mq.testing.BrokerProcess(os.path.join(base, "data"))
    t_start = time.perf_counter()
    meta = machine_facts(base, wait_idle=idle)
    res: dict = {"meta": meta, "params": vars(args)}
    try:
        broker.start()
        progress(f"temp dir {base}; broker pid {broker.pid}")
        ctx = Ctx(args, base, broker)
        try:
            sections = {"read": functools.partial(run_read, ctx),
                        "latency": functools.partial(run_latency, ctx),
                        "sink": functools.partial(run_sink, ctx)}
            harness.run_sections(sections, only, res, meta.setdefault("contention", {}),
                                 progress=progress)
            if "sink" in res:             # its JVM left this family before the meter read it
                meta["contention"]["sink"] = {
                    k: statistics.median(r["contention"][k] for r in res["sink"]["runs"])
                    for k in ("other_cpus", "steal_cpus", "loadavg_1m")}
        finally:
            ctx.stop_spark()
            ctx.admin.close()
    finally:
        broker.close()
        shutil.rmtree(base, ignore_errors=True)
    meta["loadavg_end"] = os.getloadavg()
    meta["wall_seconds"] = time.perf_counter() - t_start
    rows = res["table"] = build_table(res)
    write_json(args.out, res, default=_json_default)
    print(f"mq Spark benchmarks - {meta['date_utc']}, Python {meta['python']}, "
          f"{meta['cpus_usable']} CPUs ({meta['cpu_model']}), pyspark local[2]; {args.runs} "
          f"runs{' (quick)' if args.quick else ''}; loadavg {meta['loadavg_start'][0]:.2f} -> "
          f"{meta['loadavg_end'][0]:.2f}")
    print_contention(meta["contention"])
    print(format_table(rows))
    print(f"JSON: {args.out} ({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
