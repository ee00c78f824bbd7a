"""Worker-pool benchmarks: how fast ``mq workers run`` handles records next to the pools Python
users reach for, what exactly once costs, and how fast a killed child's partitions are handled
again. Every pool is a real ``python -m mq workers run`` process tree on a broker subprocess
(``mq.testing.BrokerProcess``); the peers run on the same box in the same run.

::

    python3 -m bench.workers [--quick] [--runs 3] [--children 1,2,4] [--trials 20]
                             [--only throughput,eos,failover] [--rate 4000]
                             [--target mq|mq-listener|kafka] [--bootstrap-server HOST:PORT,...]
                             [--out bench/out/workers.json] [--dir /tmp] [--wait-idle 300]

``--target`` moves the same pools off the local broker: onto mq's own Kafka listener, or onto a
three-node Apache Kafka cluster started here (``bench.kafka_cluster``), both through
``bootstrap_servers=`` and librdkafka; ``--bootstrap-server`` onto a cluster elsewhere (whose
CPU is then not in the per-record figure). Celery and ``multiprocessing.Pool`` stay the same
peers, so runs with each target compare in ratios.

Sections (``--only``):

- ``throughput``: a no-op handler over 100 B records with 1, 2 and 4 children, against a
  ``multiprocessing.Pool`` of as many processes fed by ``imap_unordered`` (the default
  ``chunksize=1``, the goal's baseline; and ``chunksize=256``, for information) and against
  Celery (prefork pool, ``--concurrency`` as many, Redis broker over a Unix socket). Goals:
  >= 1x the ``multiprocessing.Pool``, >= 3x Celery.
- ``eos``: the same transform (one output per input, its value upper-cased) by 2 children,
  exactly once (``--exactly-once``: transactions of 100 ms) against at least once. Goal >= 0.7x.
- ``failover``: 3 children on 8 partitions while a producer writes ``--rate`` records/s; a
  child is killed with SIGKILL, and the time until each partition it owned has a record
  handled by another child is taken. Goal p99 <= 100 ms (on one host: the broker sees the
  death at once; on a cluster the group waits out the session timeout, 6 s here,
  ``CLUSTER_PROPERTIES``).

Throughput is a steady-state window: the records are written before the pool starts (a
backlog), the pool starts, and the rate is taken over ``N`` records once it is steady (sampled
every 2 ms: the pool from its counter table, Celery from a Redis counter each task
increments, ``multiprocessing.Pool`` from the iterator). An mq pool's handler takes 1 ms a
record until the bench opens a gate, which it does once every child runs, owns partitions and
the group is Stable: the start-up rebalance stays out of the window. Sides of a ratio
are interleaved in each repetition, their order rotated; ratios are taken per repetition.
Prints a table on stdout, progress on stderr, writes every number as JSON. See bench/README.md
("Worker pools").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing as mp
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_VS_MP, GOAL_VS_CELERY, GOAL_EOS, GOAL_FAILOVER_P99_MS = 1.0, 3.0, 0.7, 100.0
PARTITIONS, VALUE_SIZE = 8, 100
_STAMP = struct.Struct("<iiq")              # pid, partition, CLOCK_MONOTONIC ns


# --- what the children run (imported by the pool's children and Celery's) ---------------------

_GATE = os.environ.get("BENCH_GATE")
_gate_open = [not _GATE]


def _gate() -> None:
    """Before the bench opens the gate (a file), a record takes 1 ms: the pool starts, joins
    and settles its assignment without eating the backlog (a child blocked in its handler
    could not give partitions up, so the gate slows instead of blocking)."""
    if os.path.exists(_GATE):                  # type: ignore[arg-type]
        _gate_open[0] = True
    else:
        time.sleep(0.001)


def noop(record) -> None:
    if not _gate_open[0]:
        _gate()
    return None


def transform(record):
    if not _gate_open[0]:
        _gate()
    return [(_OUT, record.key, bytes(record.value).upper())]


_OUT = os.environ.get("BENCH_OUT", "out")
_STAMPS = os.open(os.environ["BENCH_STAMPS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) \
    if os.environ.get("BENCH_STAMPS") else None


def stamp(record) -> None:
    os.write(_STAMPS, _STAMP.pack(os.getpid(), record.partition, time.monotonic_ns()))


def mp_noop(value: bytes) -> None:
    return None


def _celery_app():
    import redis
    from celery import Celery
    app = Celery("bench_workers", broker=os.environ["BENCH_CELERY_BROKER"])
    app.conf.update(task_ignore_result=True, worker_hijack_root_logger=False,
                    broker_connection_retry_on_startup=True, worker_redirect_stdouts=False)
    counter = os.environ.get("BENCH_CELERY_COUNTER", "done")
    client = []

    @app.task(name="bench.noop", ignore_result=True)
    def celery_noop(value):
        if not client:
            client.append(redis.Redis(unix_socket_path=os.environ["BENCH_REDIS_SOCKET"]))
        client[0].incr(counter)            # how the bench sees progress: one round trip
    return app


celery_app = _celery_app() if os.environ.get("BENCH_CELERY_BROKER") else None


# --- the bench's side --------------------------------------------------------------------------

def _progress(msg: str) -> None:
    from bench.harness import progress_printer
    progress_printer("workers")(msg)


def family_cpu(*roots: int) -> float:
    """CPU seconds (user + system) of these processes and all their descendants."""
    import psutil
    total = 0.0
    for root in roots:
        try:
            top = psutil.Process(root)
            procs = [top, *top.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


def window(sample, warm: int, n: int, cpu, timeout: float = 300.0, alive=None) -> dict:
    """Sample a growing count every 2 ms: the rate over ``n`` records from the first sample
    at which the count is >= ``warm``; ``cpu()`` (CPU seconds of everything doing the work)
    is read at both ends, for the CPU per record."""
    deadline = time.monotonic() + timeout
    start = None
    while True:
        count, now = sample(), time.perf_counter()
        if start is None and count >= warm:
            start = (count, now, cpu())
        if start is not None and count >= start[0] + n:
            used = cpu() - start[2]
            done = count - start[0]
            return {"rate": done / (now - start[1]), "seconds": now - start[1],
                    "start_count": start[0], "cpu_us_per_record": used / done * 1e6}
        if time.monotonic() > deadline or (alive is not None and not alive()):
            raise RuntimeError(f"stuck at {count} of {warm + n}")
        time.sleep(0.002)                      # the sampling period


class Pool:
    """``python -m mq workers run bench.workers:HANDLER`` with its own stats file."""

    def __init__(self, ctx, handler: str, topic: str, group: str, children: int,
                 args=(), env=None) -> None:
        self.server_pids = ctx.server_pids
        self.gate = os.path.join(ctx.base, f"{group}.gate")
        env = {"BENCH_GATE": self.gate, **(env or {})}
        self.stats = os.path.join(ctx.base, f"{group}.stats")
        self.err = os.path.join(ctx.base, f"{group}.stderr")
        cmd = [sys.executable, "-m", "mq", "workers", "run", f"bench.workers:{handler}",
               "--topic", topic, "--group", group, "--processes", str(children),
               *ctx.pool_args, "--stats-file", self.stats,
               "--log-level", "WARNING", *args]
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stderr=err, stdin=subprocess.DEVNULL,
                                         env=dict(os.environ, **env))

    def slots(self) -> list[dict]:
        import workers
        try:
            return workers.read_stats(self.stats)["slots"]
        except (OSError, ValueError):
            return []

    def handled(self) -> int:
        return sum(s["handled"] for s in self.slots())

    def open_gate(self, admin, group: str, timeout: float = 120.0) -> int:
        """Wait until every child runs, has handled a record and owns partitions, and the
        group is Stable; then open the gate. Returns the records handled until then."""
        deadline = time.monotonic() + timeout
        while True:
            slots = self.slots()
            if slots and all(s["state"] == "running" and s["handled"] for s in slots):
                desc = admin.describe_group(group)
                if desc["state"] == "Stable" and len(desc["members"]) == len(slots) and \
                        all(m["assignment"] for m in desc["members"]):
                    break
            if time.monotonic() > deadline or not self.alive():
                raise RuntimeError(f"the pool did not settle: {slots}")
            time.sleep(0.01)                       # the sampling period
        before = self.handled()
        open(self.gate, "w").close()
        return before

    def alive(self) -> bool:
        return self.proc.poll() is None

    def cpu(self) -> float:
        """The pool's CPU time and the broker's (the cluster's nodes', when they run here)."""
        return family_cpu(self.proc.pid, *self.server_pids)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.returncode != 0:
            raise RuntimeError(f"pool exited {self.proc.returncode}: {open(self.err).read()}")


# A killed child's partitions move when the group's session expires: Kafka's minimum, 6 s
# (45 s by default), as the README tells pools on a cluster to set, and as the tests run.
CLUSTER_PROPERTIES = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def _cluster_properties(base: str) -> str:
    """The pools' ``--command-config`` on a cluster (``CLUSTER_PROPERTIES``)."""
    path = os.path.join(base, "client.properties")
    with open(path, "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in CLUSTER_PROPERTIES.items())
    return path


class Ctx:
    """What the sections run against: ``where``, the clients' arguments (the local broker's
    socket, or a cluster's bootstrap servers), the pools' same flags, and the processes
    whose CPU counts as the server side's."""

    def __init__(self, args, base: str, where: dict, server_pids: list[int]) -> None:
        import mq
        from bench.harness import payloads
        self.args, self.base, self.where = args, base, where
        self.server_pids = server_pids
        self.pool_args = (["--socket", where["socket"]] if "socket" in where
                          else ["--bootstrap-server", where["bootstrap_servers"],
                                "--command-config", _cluster_properties(base)])
        self.admin = mq.Admin(**where)
        self.values = payloads(VALUE_SIZE, 1000)
        self.names = (f"t{i}" for i in range(1_000_000))
        self.redis = None

    def servers(self) -> list[int]:
        return self.server_pids + ([self.redis["pid"]] if self.redis else [])

    def topic(self, records: int, partitions: int = PARTITIONS) -> str:
        """A fresh topic holding ``records`` values of 100 B, keyed, round-robin."""
        import mq
        name = next(self.names)
        self.admin.create_topic(name, partitions)
        values = self.values
        with mq.Producer(**self.where, linger_ms=5, batch_size=1 << 18) as p:
            for i in range(records):
                p.send(name, value=values[i % 1000], key=b"k%d" % (i % 997),
                       partition=i % partitions)
        return name


# --- throughput ---------------------------------------------------------------------------------

def mq_noop(ctx, children: int) -> dict:
    warm, n = ctx.args.warm, ctx.args.n
    topic = ctx.topic(warm + n + ctx.args.slack)
    pool = Pool(ctx, "noop", topic, f"g{topic}", children)
    try:
        before = pool.open_gate(ctx.admin, f"g{topic}")
        res = window(pool.handled, before + warm, n, pool.cpu, alive=pool.alive)
    finally:
        pool.stop()
        ctx.admin.delete_topic(topic)
    return res


def mp_pool(ctx, children: int, chunksize: int) -> dict:
    n = ctx.args.n_mp if chunksize == 1 else ctx.args.n
    items = [ctx.values[i % 1000] for i in range(n)]
    # close() + join(), not the context manager's terminate(): terminating a pool can leave a
    # worker blocked forever on the task queue's lock (it hung this bench once).
    pool = mp.get_context("fork").Pool(children)
    try:
        for _ in pool.imap_unordered(mp_noop, items[:2000], chunksize=chunksize):
            pass
        def cpu() -> float:                      # this process and the pool's, not servers'
            return family_cpu(os.getpid()) - family_cpu(*ctx.servers())
        cpu0 = cpu()
        t0 = time.perf_counter()
        count = sum(1 for _ in pool.imap_unordered(mp_noop, items, chunksize=chunksize))
        dt = time.perf_counter() - t0
        used = cpu() - cpu0
    finally:
        pool.close()
        pool.join()
    return {"rate": count / dt, "seconds": dt, "cpu_us_per_record": used / count * 1e6}


def celery(ctx, children: int) -> dict:
    import redis
    warm, n = ctx.args.warm_celery, ctx.args.n_celery
    queue = next(ctx.names)
    sock = ctx.redis["socket"]
    env = {"BENCH_CELERY_BROKER": f"redis+socket://{sock}", "BENCH_REDIS_SOCKET": sock,
           "BENCH_CELERY_COUNTER": f"{queue}.done"}
    os.environ.update(env)
    app = _celery_app()
    r = redis.Redis(unix_socket_path=sock)
    with app.producer_or_acquire() as producer:
        for i in range(warm + n + n // 5):
            app.send_task("bench.noop", args=[ctx.values[i % 1000].decode()], queue=queue,
                          producer=producer)
    err = os.path.join(ctx.base, f"celery-{queue}.stderr")
    with open(err, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.workers:celery_app", "worker",
             "-Q", queue, "--concurrency", str(children), "--pool", "prefork",
             "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "WARNING", "-n", f"{queue}@bench"],
            cwd=REPO, env=dict(os.environ, **env), stdout=f, stderr=f,
            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        res = window(lambda: int(r.get(f"{queue}.done") or 0), warm, n,
                     lambda: family_cpu(proc.pid, ctx.redis["pid"]),
                     alive=lambda: proc.poll() is None)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        r.delete(queue, f"{queue}.done")
        r.close()
        for k in env:
            os.environ.pop(k, None)
    return res


def run_throughput(ctx) -> dict:
    from bench.harness import rotated
    out: dict = {}
    for children in ctx.args.children:
        sides = {"workers": lambda c=children: mq_noop(ctx, c),
                 "mp_pool": lambda c=children: mp_pool(ctx, c, 1),
                 "mp_pool_chunked": lambda c=children: mp_pool(ctx, c, 256),
                 "celery": lambda c=children: celery(ctx, c)}
        runs: dict = collections.defaultdict(list)
        for rep in range(ctx.args.runs):
            for name in rotated(list(sides), rep):
                res = sides[name]()
                runs[name].append(res)
                _progress(f"{children} child(ren), {name}: {res['rate']:,.0f} rec/s")
        out[children] = dict(runs)
    return out


# --- exactly once vs at least once --------------------------------------------------------------

def eos_side(ctx, exactly_once: bool) -> dict:
    import mq
    warm, n = ctx.args.warm, ctx.args.n_eos
    topic = ctx.topic(warm + n + ctx.args.slack)
    out = next(ctx.names)
    ctx.admin.create_topic(out, PARTITIONS)
    pool = Pool(ctx, "transform", topic, f"g{topic}", 2,
                args=["--exactly-once"] if exactly_once else [], env={"BENCH_OUT": out})
    try:
        before = pool.open_gate(ctx.admin, f"g{topic}")
        res = window(pool.handled, before + warm, n, pool.cpu, alive=pool.alive)
    finally:
        pool.stop()
    with mq.Consumer(out, **ctx.where, isolation_level="read_committed") as c:
        ends = c.end_offsets(sorted(c.assignment()))
        c.seek_to_beginning()
        got = 0
        while not all(c.position(tp) >= end for tp, end in ends.items()):
            got += sum(len(v) for v in c.poll(timeout_ms=100, max_records=10000).values())
    res["outputs_read_committed"] = got
    ctx.admin.delete_topic(topic)
    ctx.admin.delete_topic(out)
    return res


def run_eos(ctx) -> dict:
    from bench.harness import rotated
    runs: dict = collections.defaultdict(list)
    for rep in range(ctx.args.runs):
        for name in rotated(["at_least_once", "exactly_once"], rep):
            res = eos_side(ctx, name == "exactly_once")
            runs[name].append(res)
            _progress(f"transform, {name}: {res['rate']:,.0f} rec/s")
    return dict(runs)


# --- failover ---------------------------------------------------------------------------------

def _feed(where: dict, topic: str, rate: float, stop) -> None:
    import mq
    with mq.Producer(**where, linger_ms=0) as p:
        start, i = time.monotonic(), 0
        while not stop.is_set():
            ahead = start + i / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)                 # pacing
            p.send(topic, value=b"x" * VALUE_SIZE, partition=i % PARTITIONS)
            i += 1


class Stamps:
    """The handler's stamps file, read as it grows."""

    def __init__(self, path: str) -> None:
        self.path, self.pos = path, 0
        self.all: list[tuple[int, int, int]] = []

    def update(self) -> list[tuple[int, int, int]]:
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        whole = len(data) - len(data) % _STAMP.size
        self.pos += whole
        new = [_STAMP.unpack_from(data, i) for i in range(0, whole, _STAMP.size)]
        self.all.extend(new)
        return new


def _trial(pool: Pool, stamps: Stamps, rng: random.Random, wait) -> tuple[int, float]:
    """Kill one child once every child handles records; (partitions it owned, ms until
    each of them had a record handled by another child)."""
    def stable() -> bool:
        stamps.update()
        slots = pool.slots()
        if not slots or any(s["state"] != "running" for s in slots):
            return False
        recent = time.monotonic_ns() - 200_000_000
        busy = {pid for pid, _, t in stamps.all[-2000:] if t > recent}
        return {s["pid"] for s in slots} <= busy
    wait(stable, "every child to handle records")
    stamps.update()
    last = {p: pid for pid, p, _ in stamps.all}
    victim = rng.choice([s["pid"] for s in pool.slots()])
    owned = {p for p, pid in last.items() if pid == victim}
    killed = time.monotonic_ns()
    os.kill(victim, signal.SIGKILL)
    first: dict[int, int] = {}

    def moved() -> bool:
        for pid, p, t in stamps.update():
            if p in owned and pid != victim and t > killed:
                first.setdefault(p, t)
        return set(first) == owned
    wait(moved, "the victim's partitions to be handled again")
    return len(owned), (max(first.values()) - killed) / 1e6


def run_failover(ctx) -> dict:
    rng = random.Random(ctx.args.seed)
    topic = ctx.topic(0)
    path = os.path.join(ctx.base, "stamps.bin")
    open(path, "wb").close()
    stamps = Stamps(path)
    stop = mp.get_context("fork").Event()
    feeder = mp.get_context("fork").Process(target=_feed, daemon=True, args=(
        ctx.where, topic, ctx.args.rate, stop))
    feeder.start()
    pool = Pool(ctx, "stamp", topic, f"g{topic}", 3, env={"BENCH_STAMPS": path})
    trials: list[float] = []

    def wait(cond, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline or not pool.alive():
                raise RuntimeError(f"failover: timed out waiting for {what}")
            time.sleep(0.005)                    # the sampling period
    try:
        for _ in range(ctx.args.trials):
            moved, ms = _trial(pool, stamps, rng, wait)
            trials.append(ms)
            _progress(f"failover trial {len(trials)}: {moved} partitions handled again "
                      f"after {ms:.1f} ms")
    finally:
        stop.set()
        feeder.join(10)
        pool.stop()
    return {"children": 3, "rate": ctx.args.rate, "ms": trials}


# --- the table ----------------------------------------------------------------------------------

def build_table(res: dict) -> list[dict]:
    import statistics

    from bench.harness import Rows, mm, summary
    rows = Rows()

    def f0(x: float) -> str:
        return f"{x:,.0f}"

    def f2(x: float) -> str:
        return f"{x:.2f}"
    def cpu(runs: list[dict]) -> str:
        return f"; CPU {statistics.median(r['cpu_us_per_record'] for r in runs):.1f} us/rec"
    for children, runs in (res.get("throughput") or {}).items():
        rates = {k: [r["rate"] for r in v] for k, v in runs.items()}
        cpus = {k: [r["cpu_us_per_record"] for r in v] for k, v in runs.items()}
        vs = {k: summary([a / b for a, b in zip(rates["workers"], rates[k], strict=True)])
              for k in ("mp_pool", "mp_pool_chunked", "celery")}
        more = {k: statistics.median(b / a for a, b in zip(cpus["workers"], cpus[k],
                                                           strict=True))
                for k in ("mp_pool", "mp_pool_chunked", "celery")}
        label = f"no-op 100 B, {children} {'child' if int(children) == 1 else 'children'}"
        rows.add(f"{label}: mq workers", mm(summary(rates["workers"]), f0) + cpu(runs["workers"]),
                 "rec/s", f"{mm(vs['mp_pool'], f2)}x mp.Pool; {mm(vs['celery'], f2)}x Celery",
                 f">= {GOAL_VS_MP:g}x mp.Pool, >= {GOAL_VS_CELERY:g}x Celery",
                 "yes" if vs["mp_pool"]["median"] >= GOAL_VS_MP and
                 vs["celery"]["median"] >= GOAL_VS_CELERY else "NO")
        rows.add(f"{label}: multiprocessing.Pool imap_unordered",
                 mm(summary(rates["mp_pool"]), f0) + cpu(runs["mp_pool"]), "rec/s",
                 f"{more['mp_pool']:.1f}x mq's CPU/rec")
        rows.add(f"{label}: mp.Pool imap_unordered chunksize=256",
                 mm(summary(rates["mp_pool_chunked"]), f0) + cpu(runs["mp_pool_chunked"]),
                 "rec/s", f"mq workers {mm(vs['mp_pool_chunked'], f2)}x this; "
                          f"{more['mp_pool_chunked']:.2f}x mq's CPU/rec")
        rows.add(f"{label}: Celery prefork, Redis",
                 mm(summary(rates["celery"]), f0) + cpu(runs["celery"]), "rec/s",
                 f"{more['celery']:.0f}x mq's CPU/rec")
    eos = res.get("eos")
    if eos:
        a = [r["rate"] for r in eos["at_least_once"]]
        e = [r["rate"] for r in eos["exactly_once"]]
        ratio = summary([x / y for x, y in zip(e, a, strict=True)])
        cpu_ratio = statistics.median(x["cpu_us_per_record"] / y["cpu_us_per_record"] for x, y
                                      in zip(eos["exactly_once"], eos["at_least_once"],
                                             strict=True))
        rows.add("transform 100 B, 2 children: exactly once",
                 mm(summary(e), f0) + cpu(eos["exactly_once"]), "rec/s",
                 f"{mm(ratio, f2)}x at least once; {cpu_ratio:.2f}x its CPU/rec",
                 f">= {GOAL_EOS:g}x", "yes" if ratio["median"] >= GOAL_EOS else "NO")
        rows.add("transform 100 B, 2 children: at least once",
                 mm(summary(a), f0) + cpu(eos["at_least_once"]), "rec/s")
    fo = res.get("failover")
    if fo and fo["ms"]:
        from bench.harness import pct
        ms = fo["ms"]
        rows.add(f"kill -9 of a child -> its partitions handled again ({fo['children']} children, "
                 f"{len(ms)} trials)", f"p50 {pct(ms, 50):.1f} / p99 {pct(ms, 99):.1f} / max "
                 f"{max(ms):.1f}", "ms", "-", f"p99 <= {GOAL_FAILOVER_P99_MS:g} ms",
                 "yes" if pct(ms, 99) <= GOAL_FAILOVER_P99_MS else "NO")
    return rows


# --- main -----------------------------------------------------------------------------------------

SECTIONS = ("throughput", "eos", "failover")


def ensure_celery() -> dict:
    """pip install celery[redis] if missing (the `bench` extra has it); redis-server through
    bench.peers. Returns versions."""
    import importlib.metadata

    from bench.harness import pip_install_missing
    from bench.peers import ensure_installed
    versions = ensure_installed()
    pip_install_missing({"celery": "celery[redis]"}, _progress)
    versions["celery"] = importlib.metadata.version("celery")
    versions["kombu"] = importlib.metadata.version("kombu")
    return versions


def main(argv: list[str] | None = None) -> int:
    from bench.harness import (
        add_run_arguments,
        finish_run,
        machine_facts,
        run_sections,
        wait_idle,
    )
    p = argparse.ArgumentParser(prog="python3 -m bench.workers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 run, smaller windows, 5 trials")
    p.add_argument("--runs", type=int, default=None, help="repetitions (default 3, 1 quick)")
    p.add_argument("--children", default="1,2,4", help="pool sizes for throughput")
    p.add_argument("--trials", type=int, default=None, help="failover trials (20, 5 quick)")
    p.add_argument("--rate", type=float, default=4000.0, help="records/s during failover")
    p.add_argument("--seed", type=int, default=1, help="the failover victims' seed")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    p.add_argument("--target", choices=("mq", "mq-listener", "kafka"), default="mq",
                   help="where the pools read and write: the local broker (default), mq's "
                        "Kafka listener (bootstrap_servers=), or a three-node Kafka cluster "
                        "started here")
    p.add_argument("--bootstrap-server", default=None, metavar="HOST:PORT[,...]",
                   help="run the pools on this Kafka cluster (its CPU is not counted)")
    add_run_arguments(p, "workers", dir_help="parent of the temp dir (a real disk)")
    args = p.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 3)
    args.trials = args.trials or (5 if args.quick else 20)
    args.children = [int(x) for x in args.children.split(",")]
    scale = 0.3 if args.quick else 1.0
    args.warm, args.n = int(30_000 * scale), int(300_000 * scale)
    args.n_eos = int(150_000 * scale)
    args.n_mp = int(50_000 * scale)
    args.warm_celery, args.n_celery = int(1000 * scale), int(10_000 * scale)
    args.slack = int(100_000 * scale)       # backlog left after the window
    only = [s for s in args.only.split(",") if s]
    if set(only) - set(SECTIONS):
        p.error(f"unknown section(s); known: {', '.join(SECTIONS)}")

    from bench.peers import redis_server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    versions = ensure_celery() if "throughput" in only else {}
    idle = wait_idle(args.wait_idle, progress=_progress)
    base = tempfile.mkdtemp(prefix="mq-workers-", dir=args.dir)
    t_start = time.monotonic()
    try:
        meta = machine_facts(base, wait_idle=idle, peers=versions)
        res: dict = {"meta": meta, "params": {k: v for k, v in vars(args).items()}}
        with contextlib.ExitStack() as stack:
            where, pids = _target(args, base, stack)
            res["params"]["target"] = {k: v for k, v in where.items()}
            ctx = Ctx(args, base, where, pids)
            _progress(f"temp dir {base}; {args.target} at {where}, server pids {pids}")
            if "throughput" in only:
                ctx.redis = stack.enter_context(redis_server(base))
            run_sections({"throughput": lambda: run_throughput(ctx),
                          "eos": lambda: run_eos(ctx), "failover": lambda: run_failover(ctx)},
                         only, res, meta.setdefault("contention", {}), progress=_progress)
        ctx.admin.close()
        finish_run("mq worker-pool benchmarks", res, build_table, args.out,
                   time.monotonic() - t_start,
                   f"{'quick; ' if args.quick else ''}Celery {versions.get('celery')}, "
                   f"redis-server {versions.get('redis-server')}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


def _target(args, base: str, stack: contextlib.ExitStack) -> tuple[dict, list[int]]:
    """The clients' arguments and the server-side pids of ``--target``: a local broker
    (its socket), mq's Kafka listener, a three-node Kafka cluster started here, or the
    cluster at ``--bootstrap-server`` (whose CPU is not counted: it runs elsewhere)."""
    import mq
    import mq.testing
    from bench.harness import kafka_listener_broker
    from bench.kafka_cluster import KafkaCluster
    if args.bootstrap_server:
        return {"bootstrap_servers": args.bootstrap_server}, []
    if args.target == "kafka":
        _progress("starting a three-node Kafka cluster")
        cluster = stack.enter_context(KafkaCluster(os.path.join(base, "kafka")))
        return {"bootstrap_servers": cluster.bootstrap}, [n.pid for n in cluster.nodes]
    if args.target == "mq-listener":
        os.makedirs(os.path.join(base, "mq"))
        broker = kafka_listener_broker(os.path.join(base, "mq"))
        stack.callback(broker.close)
        with mq.Admin(broker.socket) as admin:
            [listener] = admin.broker_stats()["broker"]["kafka_listeners"]
        return {"bootstrap_servers": listener.rpartition("://")[2]}, [broker.pid]
    broker = mq.testing.BrokerProcess(os.path.join(base, "mq-data")).start()
    stack.callback(broker.close)
    return {"socket": broker.socket}, [broker.pid]


if __name__ == "__main__":
    sys.exit(main())
