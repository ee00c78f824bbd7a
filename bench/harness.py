"""Machinery shared by the benchmarks (bench/storage.py, e2e.py, groups.py, cleaner.py): progress
lines, the options they all take (--out, --dir, --wait-idle), summaries and percentiles, CPU
meters (this process, or a whole process family) with the wait for an idle box, the machine's
facts, the result table and JSON; for the multi-process ones also worker processes started
together behind a barrier, HdrHistogram helpers, payloads, and the physical limits measured in
the same run (raw page-cache write, fdatasync, a bare POSIX-semaphore round trip between two
processes).

Timestamps everywhere are ``time.perf_counter_ns()``: CLOCK_MONOTONIC on Linux, one clock for
the whole system, so a time taken in one process can be subtracted from one taken in another.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import importlib.metadata
import importlib.util
import json
import mmap
import multiprocessing as mp
import multiprocessing.connection
import os
import platform
import random
import secrets
import select
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import posix_ipc
import psutil

from mq.log import native

KIB = 1024
MIB = 1024 * 1024
HDR_MIN_US, HDR_MAX_US, HDR_DIGITS = 1, 60_000_000, 3     # 1 us .. 60 s, 3 digits

# fork: a worker starts in milliseconds (spawn re-imports mq and the clients: ~0.2 s each,
# and this suite starts ~300 workers). The harness process itself never starts a thread or
# holds a producer, so forking it is safe.
CTX = mp.get_context("fork")

_START = time.monotonic()


def progress_printer(tag: str) -> Callable[[str], None]:
    """A ``progress(msg)`` writing ``[TAG  seconds since start] msg`` lines on stderr."""
    def progress(msg: str) -> None:
        print(f"[{tag} {time.monotonic() - _START:6.1f}s] {msg}", file=sys.stderr, flush=True)
    return progress


progress = progress_printer("e2e")


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": list(values)}


def rotated(items: Sequence, r: int) -> list:
    """Run ``r``'s order of ``items``: rotated by one each run, so that no side of a comparison
    always goes first."""
    k = r % len(items)
    return [*items[k:], *items[:k]]


def pip_install_missing(packages: dict[str, str],
                        progress: Callable[[str], None] = progress) -> None:
    """``pip install`` the package of every module that does not import (``{module:
    package}``), in one call, as the ``bench`` extra would have."""
    missing = []
    for module, package in packages.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        progress(f"installing {' '.join(missing)} with pip")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
        importlib.invalidate_caches()


def quiet_gc() -> None:
    """For a worker's hot loop: collect, freeze the survivors, switch the collector off. Every
    system's workers get the same treatment (bench/README.md, "End to end", "Method")."""
    gc.collect()
    gc.freeze()
    gc.disable()


def cpu_seconds() -> float:
    """This process's CPU time (user + system, all threads)."""
    t = os.times()
    return t.user + t.system


# --- worker processes -----------------------------------------------------------------------

class WorkerError(RuntimeError):
    pass


def _worker_main(idx: int, fn: Callable, kwargs: dict, barrier, conn, timeout: float) -> None:
    try:
        def start() -> None:
            barrier.wait(timeout)
        res = fn(start, **kwargs)
        if isinstance(res, dict):
            res.setdefault("cpu_s", cpu_seconds())
        conn.send(("ok", res))
    except BaseException:                     # noqa: BLE001 - everything goes to the parent
        with contextlib.suppress(threading.BrokenBarrierError, OSError):
            barrier.abort()
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_workers(jobs: list[tuple[Callable, dict]], timeout: float,
                on_start: Callable[[], Any] | None = None,
                on_end: Callable[[], Any] | None = None) -> tuple[list[dict], Any, Any]:
    """Run ``fn(start, **kwargs)`` for each job in its own (forked) process. Each worker sets
    itself up, calls ``start()`` (a barrier shared with every other worker and this process)
    and then does the timed work; it returns a dict. ``on_start`` runs here right after the
    barrier opens, ``on_end`` right after the last result came in (for meters such as the
    broker's CPU). Returns (results in job order, on_start's value, on_end's value). Raises
    ``WorkerError`` with the child's traceback if a worker fails or ``timeout`` passes; every
    child is gone when this returns or raises."""
    # Garbage collected here, not in a forked worker: a librdkafka client left in a cycle
    # by an earlier test would be destroyed in the child, whose librdkafka threads are gone.
    gc.collect()
    barrier = CTX.Barrier(len(jobs) + 1)
    procs, readers = [], []
    for i, (fn, kwargs) in enumerate(jobs):
        r, w = CTX.Pipe(duplex=False)
        p = CTX.Process(target=_worker_main, args=(i, fn, kwargs, barrier, w, timeout),
                        name=f"bench-{getattr(fn, '__name__', 'worker')}-{i}", daemon=True)
        p.start()
        w.close()
        procs.append(p)
        readers.append(r)
    results: list[Any] = [None] * len(jobs)
    errors: list[str] = []
    started = ended = None
    deadline = time.monotonic() + timeout
    try:
        try:
            barrier.wait(timeout)
        except threading.BrokenBarrierError:  # a worker failed in setup: its error follows
            pass
        else:
            if on_start is not None:
                started = on_start()
        pending = dict(enumerate(readers))
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                errors.append(f"timed out after {timeout:.0f} s waiting for "
                              f"{[procs[i].name for i in pending]}")
                break
            for r in mp.connection.wait(list(pending.values()), timeout=left):
                i = next(k for k, v in pending.items() if v is r)
                try:
                    status, payload = r.recv()
                except EOFError:
                    status, payload = "error", (f"{procs[i].name} exited without a result " \
                                               f"(exit code {procs[i].exitcode})")
                del pending[i]
                if status == "ok":
                    results[i] = payload
                else:
                    errors.append(f"{procs[i].name}:\n{payload}")
                    with contextlib.suppress(threading.BrokenBarrierError, OSError):
                        barrier.abort()
        if on_end is not None:
            ended = on_end()
    finally:
        for p in procs:
            p.join(timeout=max(0.1, min(10.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        for r in readers:
            r.close()
    if errors:
        raise WorkerError("\n".join(errors))
    return results, started, ended


# --- CPU: this process (or its whole family), and everyone else ---------------------------------

def _proc_cpu(p: psutil.Process) -> float:
    c = p.cpu_times()
    return c.user + c.system + c.children_user + c.children_system


def _busy(t) -> float:
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


class CpuMeter:
    """What else ran on the box during a section: CPUs used by other processes and the
    hypervisor's steal, from system-wide busy time minus this process's (and its waited
    children's) CPU time. The box has 2 vCPUs shared with other work; a figure taken while
    others used a CPU is noisier and lower, so each section records this next to its numbers."""

    OWN = "own_cpus"

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._t = time.monotonic()
        self._sys = psutil.cpu_times()
        self._start: Any = self._own()

    def _own(self) -> Any:
        return _proc_cpu(self._me)

    def _own_since_start(self) -> float:
        return self._own() - self._start

    def stop(self) -> dict:
        wall = time.monotonic() - self._t
        now = psutil.cpu_times()
        own = self._own_since_start()
        other = _busy(now) - _busy(self._sys) - own
        steal = getattr(now, "steal", 0) - getattr(self._sys, "steal", 0)
        return {"wall_s": wall, self.OWN: own / wall, "other_cpus": max(other, 0.0) / wall,
                "steal_cpus": steal / wall, "loadavg_1m": os.getloadavg()[0]}


class FamilyMeter(CpuMeter):
    """A ``CpuMeter`` whose own time is this process and all its descendants (workers, broker,
    redis-server, nats-server): those servers are long-lived children, which ``CpuMeter`` (own
    + *waited* children) would count as neighbours."""

    OWN = "family_cpus"

    def _own(self) -> dict[int, float]:
        out = {}
        for p in (self._me, *self._me.children(recursive=True)):
            try:
                out[p.pid] = _proc_cpu(p)
            except psutil.Error:
                pass
        return out

    def _own_since_start(self) -> float:
        return sum(v - self._start.get(pid, 0.0) for pid, v in self._own().items())


def warn_if_busy(c: dict, what: str = "", progress: Callable[[str], None] = progress) -> None:
    """Warn when other processes (> 0.2 CPUs) or steal (> 0.1) made the figures noisy."""
    if c["other_cpus"] > 0.2 or c["steal_cpus"] > 0.1:
        progress(f"warning: {what}other processes used {c['other_cpus']:.2f} CPUs and steal "
                 f"was {c['steal_cpus']:.2f} (of {os.cpu_count()}): figures are noisier and "
                 "lower than on an idle box")


def wait_idle(limit_s: float, threshold: float = 0.25, window_s: float = 5.0,
              progress: Callable[[str], None] = progress) -> dict | None:
    """Wait (up to ``limit_s``) for a ``window_s`` window in which other processes use less
    than ``threshold`` CPUs. Returns what was seen (None, without waiting, when ``limit_s`` is
    not positive: a benchmark's ``--wait-idle`` left at 0); never fails."""
    if limit_s <= 0:
        return None
    deadline = time.monotonic() + limit_s
    seen = []
    while True:
        meter = CpuMeter()
        time.sleep(window_s)
        c = meter.stop()
        seen.append(round(c["other_cpus"], 2))
        if c["other_cpus"] < threshold:
            progress(f"box idle enough: other processes used {c['other_cpus']:.2f} CPUs")
            return {"idle": True, "waited_windows": seen}
        if time.monotonic() >= deadline:
            progress(f"still busy after {limit_s:.0f} s (other CPUs {c['other_cpus']:.2f}); "
                     "running anyway")
            return {"idle": False, "waited_windows": seen}
        progress(f"waiting for an idle box: other processes use {c['other_cpus']:.2f} CPUs")


def add_run_arguments(parser: argparse.ArgumentParser, name: str, *,
                      dir_help: str | None = None, wait_idle: bool = True) -> None:
    """The options every benchmark takes: ``--out`` (its JSON, ``bench/out/NAME.json``),
    ``--dir`` (the parent of its temp dir; ``dir_help`` says what the benchmark keeps there, or
    needs of it) and, unless ``wait_idle`` is false, ``--wait-idle SECONDS`` (the limit to pass
    to the function ``wait_idle``)."""
    parser.add_argument("--out", default=f"bench/out/{name}.json", help="JSON output path")
    parser.add_argument("--dir", default=None, help=dir_help or
                        "parent of the temporary data dir (default: the system temp dir)")
    if wait_idle:
        parser.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS",
                            help="first wait up to SECONDS for other processes to go quiet "
                                 "(< 0.25 CPU over 5 s)")


def add_section_arguments(parser: argparse.ArgumentParser, sections: Sequence[str],
                          quick_help: str) -> None:
    """``--quick`` (``quick_help`` says what a smoke run does), ``--runs`` (default 5, 1
    quick: ``parse_sections``) and ``--only`` (a comma-separated subset of ``sections``)."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--runs", type=int, default=None,
                        help="repetitions (default 5, 1 quick)")
    parser.add_argument("--only", default=",".join(sections),
                        help=f"comma-separated subset of {','.join(sections)}")


def parse_sections(parser: argparse.ArgumentParser, argv: list[str] | None,
                   sections: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with ``add_section_arguments``' options settled: ``only``
    a list (an unknown section is a usage error), ``runs`` its default, and a warning for
    fewer runs than the method's minimum of 5."""
    args = parser.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    unknown = set(args.only) - set(sections)
    if unknown:
        parser.error(f"unknown section(s) {','.join(sorted(unknown))}; "
                     f"known: {','.join(sections)}")
    args.runs = args.runs or (1 if args.quick else 5)
    if args.runs < 5 and not args.quick:
        progress(f"warning: --runs {args.runs} is below the method's minimum of 5")
    return args


def kafka_listener_broker(base: str):
    """A started ``mq.testing.BrokerProcess`` on ``base``/data with a Kafka listener on a
    free loopback port (its config file in ``base``)."""
    import mq.testing
    cfg = os.path.join(base, "broker.toml")
    with open(cfg, "w") as f:
        f.write('kafka_listeners = ["127.0.0.1:0"]\n')
    return mq.testing.BrokerProcess(os.path.join(base, "data"), config_file=cfg).start()


def run_sections(sections: dict[str, Callable[[], Any]], only: Collection[str], results: dict,
                 contention: dict, meter: type[CpuMeter] = FamilyMeter,
                 progress: Callable[[str], None] = progress) -> None:
    """Run each section named in ``only``, in ``sections``' order, under ``meter``; record its
    result and how much CPU other processes took meanwhile, warning when that makes the
    figures noisy."""
    for name, fn in sections.items():
        if name not in only:
            continue
        m = meter()
        results[name] = fn()
        contention[name] = c = m.stop()
        warn_if_busy(c, f"during {name}, ", progress)


def sched_ns(pid: int) -> tuple[int, int]:
    """(on-CPU ns, ns runnable but waiting for a CPU) of a process, all its threads, from
    ``/proc/<pid>/task/*/schedstat``; (0, 0) once it is gone."""
    run = wait = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    fields = f.read().split()
                run += int(fields[0])
                wait += int(fields[1])
    except OSError:
        pass
    return run, wait


def process_cpu(pid: int) -> float:
    """On-CPU seconds of one process, all its threads: ``sched_ns`` (schedstat run times).
    psutil's ``cpu_times()`` comes in clock ticks (10 ms), too coarse for a broker that uses
    40 ms in a short run; it is the fallback when /proc has no tasks to read. (A thread that
    exited during the interval drops out of the sum; the broker's two threads live as long as
    it does.)"""
    if not os.path.isdir(f"/proc/{pid}/task"):
        return process_cpu_ticks(pid)
    return sched_ns(pid)[0] / 1e9


def process_cpu_ticks(pid: int) -> float:
    """psutil's user + system seconds (10 ms resolution), recorded as a cross-check."""
    c = psutil.Process(pid).cpu_times()
    return c.user + c.system


# --- histograms -----------------------------------------------------------------------------

def new_hist():
    # Imported here, not at the top: on a fresh machine bench.peers.ensure_installed pip
    # installs hdrhistogram after this module was loaded (and forked workers inherit it).
    from hdrh.histogram import HdrHistogram
    return HdrHistogram(HDR_MIN_US, HDR_MAX_US, HDR_DIGITS)


def merge_hists(encoded: list) -> Any:
    h = new_hist()
    for e in encoded:
        h.decode_and_add(e)
    return h


def hist_stats(h) -> dict:
    if h.get_total_count() == 0:
        return {"count": 0}
    return {"count": h.get_total_count(), "min_us": h.get_min_value(),
            "p50_us": h.get_value_at_percentile(50), "p90_us": h.get_value_at_percentile(90),
            "p99_us": h.get_value_at_percentile(99),
            "p99_9_us": h.get_value_at_percentile(99.9), "max_us": h.get_max_value(),
            "mean_us": h.get_mean_value()}


# --- payloads -------------------------------------------------------------------------------

_WORDS = None


def make_values(size: int, count: int, seed: int) -> list[bytes]:
    """``count`` distinct JSON-like values of exactly ``size`` bytes: log-event text, so gzip
    and lz4 see a realistic ratio (about 3-5x), not all-zero or random bytes."""
    global _WORDS
    rnd = random.Random(seed)
    if _WORDS is None:
        w = random.Random(12345)
        _WORDS = ["".join(w.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(w.randint(3, 9)))
                  for _ in range(300)]
    out = []
    for i in range(count):
        head = (f'{{"id":{seed * 1_000_000 + i},"user":"{rnd.choice(_WORDS)}",'
                f'"event":"{rnd.choice(_WORDS)}","ms":{rnd.randint(0, 99999)},"text":"')
        body = []
        n = len(head) + 2
        while n < size:
            word = rnd.choice(_WORDS)
            body.append(word)
            n += len(word) + 1
        text = (head + " ".join(body))[:size - 2] + '"}'
        out.append(text.encode()[:size].ljust(size, b" "))
    return out


def payloads(size: int, count: int, seed: int = 1) -> list[bytes]:
    """``count`` distinct values of exactly ``size`` bytes (JSON-like text; the same bytes are
    given to every system)."""
    if size <= 4096:
        return make_values(size, count, seed)
    base = make_values(4096, count * (size // 4096 + 1), seed)
    k = size // 4096 + 1
    return [b"".join(base[i * k:(i + 1) * k])[:size] for i in range(count)]


# --- physical limits ------------------------------------------------------------------------

def raw_write(directory: str, total: int, chunk: int = MIB) -> float:
    """Seconds to ``os.write`` ``total`` bytes in ``chunk``-byte writes into a fresh file
    (page cache only, no fsync; O_APPEND like a segment). The file is deleted at once, so its
    dirty pages are dropped, never written back."""
    data = os.urandom(chunk)
    path = os.path.join(directory, f"raw-{secrets.token_hex(4)}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        left = total
        t = time.perf_counter()
        while left > 0:
            n = os.write(fd, data if left >= chunk else data[:left])
            left -= n
        dt = time.perf_counter() - t
    finally:
        os.close(fd)
        os.unlink(path)
    return dt


def persisting_floor(directory: str, size: int, total: int = 256 * MIB) -> dict:
    """The CPU a queue that persists every record cannot avoid per MiB of ``size``-byte
    records, each step timed alone in this one process (hot caches, no waits, nothing handed
    between processes), over ``total`` bytes in 1 MiB batches:

    - ``producer``: each value copied into its batch, and the batch's CRC-32C;
    - ``broker``: the CRC checked, and the batch written into the page cache (a fresh file,
      deleted at once, as ``raw_write``);
    - ``consumer``: the CRC checked again from a read-only map of the file, and each value
      copied out into ``bytes``.

    Returns the µs of CPU per MiB of each step, their ``sum``, and ``mb_s``: this box's CPUs
    divided by that sum, the rate no such queue passes here however it hands the bytes on."""
    import crc32c
    per = max(1, MIB // size)
    batch_bytes = per * size
    values = [os.urandom(size) for _ in range(per)]
    batch = bytearray(batch_bytes)
    batches = max(1, total // batch_bytes)
    mib = batches * batch_bytes / MIB
    prefault(directory, batches * batch_bytes)
    t = time.process_time()
    for _ in range(batches):
        for i, v in enumerate(values):
            batch[i * size:(i + 1) * size] = v
        crc32c.crc32c(batch)
    producer = time.process_time() - t
    path = os.path.join(directory, f"floor-{secrets.token_hex(4)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    try:
        t = time.process_time()
        for _ in range(batches):
            crc32c.crc32c(batch)
            os.write(fd, batch)
        broker = time.process_time() - t
        with mmap.mmap(fd, batches * batch_bytes, access=mmap.ACCESS_READ) as m, \
                memoryview(m) as view:
            t = time.process_time()
            for b in range(batches):
                with view[b * batch_bytes:(b + 1) * batch_bytes] as one:
                    crc32c.crc32c(one)
                    for i in range(per):
                        bytes(one[i * size:(i + 1) * size])
            consumer = time.process_time() - t
    finally:
        os.close(fd)
        os.unlink(path)
    us = {"producer": producer / mib * 1e6, "broker": broker / mib * 1e6,
          "consumer": consumer / mib * 1e6}
    us["sum"] = sum(us.values())
    us["mb_s"] = (os.cpu_count() or 1) / (us["sum"] / 1e6) * MIB / 1e6
    return us


def prefault(directory: str, total: int) -> None:
    """Write ``total`` bytes to a fresh file and delete it, untimed, right before a run.

    This VM (Firecracker, virtio-balloon) hands guest pages that have been free for a few
    seconds back to the host; the next first touch of such a page then faults on the host too,
    and a 1 GiB page-cache write that would run at ~5 GB/s runs at ~0.6-0.8 GB/s (measured:
    back-to-back 1 GiB writes 4.4-5.5 GB/s, the first one after a 5 s pause 0.7-0.8 GB/s).
    Whichever side of a ratio ran after a pause would lose. Every throughput run, of every
    system and of the raw write, is preceded by this, so each one starts with recently used
    (host-backed) free pages."""
    if total > 0:
        raw_write(directory, min(total, 1 << 30))


def fdatasync_ns(directory: str, samples: int, warmup: int = 5) -> list[int]:
    """ns of ``fdatasync`` after each 4 KiB append to a fresh file, the first ``warmup`` left
    out."""
    path = os.path.join(directory, f"fsync-{secrets.token_hex(4)}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    block = os.urandom(4096)
    out = []
    try:
        for i in range(warmup + samples):
            os.write(fd, block)
            t = time.perf_counter_ns()
            os.fdatasync(fd)
            dt = time.perf_counter_ns() - t
            if i >= warmup:
                out.append(dt)
    finally:
        os.close(fd)
        os.unlink(path)
    return out


def _sem_pong(ping_name: str, pong_name: str, n: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    ping, pong = posix_ipc.Semaphore(ping_name), posix_ipc.Semaphore(pong_name)
    acquire, release = ping.acquire, pong.release
    quiet_gc()
    for _ in range(n):
        acquire()
        release()
    ping.close()
    pong.close()


def sem_round_trips(n: int, warmup: int | None = None, same_cpu: bool = False,
                    gap_s: float = 0.0) -> list[float]:
    """µs per round trip of a bare POSIX semaphore ping-pong between two processes
    (posix_ipc: this process posts *ping* and waits on *pong*, the other waits on *ping* and
    posts *pong*). ``same_cpu``: both processes pinned to one CPU (a wake-up is then a local
    context switch). ``gap_s``: sleep that long before each round trip (paced, like a message
    stream at 1/gap_s per second) instead of a tight loop. Both named semaphores are unlinked
    before this returns."""
    if warmup is None:
        warmup = 50 if gap_s else 2000
    tag = secrets.token_hex(4)
    names = (f"/mq-bench-ping-{tag}", f"/mq-bench-pong-{tag}")
    ping = posix_ipc.Semaphore(names[0], posix_ipc.O_CREX, initial_value=0)
    pong = posix_ipc.Semaphore(names[1], posix_ipc.O_CREX, initial_value=0)
    cpu = min(os.sched_getaffinity(0)) if same_cpu else None
    old_affinity = os.sched_getaffinity(0)
    child = CTX.Process(target=_sem_pong, args=(*names, n + warmup, cpu), daemon=True)
    try:
        child.start()
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        release, acquire, clock, sleep = ping.release, pong.acquire, time.perf_counter_ns, \
            time.sleep
        out = [0] * n
        gc.collect()
        gc.disable()
        try:
            for i in range(warmup + n):
                if gap_s:
                    sleep(gap_s)
                t = clock()
                release()
                acquire()
                if i >= warmup:
                    out[i - warmup] = clock() - t
        finally:
            gc.enable()
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        if cpu is not None:
            os.sched_setaffinity(0, old_affinity)
        for s in (ping, pong):
            try:
                s.unlink()
            except posix_ipc.ExistentialError:
                pass
            s.close()
    return [v / 1000 for v in out]


def _relay_broker(sock: socket.socket, region: mmap.mmap, n: int) -> None:
    """The relay's middle process: epoll on the socket, read a stamp, store it in the shared
    region and wake its futex word, as mq's broker wakes a consumer (no other work)."""
    from mq.protocol.state import futex
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    quiet_gc()
    for i in range(n):
        ep.poll()
        stamp = sock.recv(8, socket.MSG_WAITALL)
        region[8 + 8 * i:16 + 8 * i] = stamp
        struct.pack_into("<I", region, 0, i + 1)
        futex.wake(region, 0, 1)
    ep.close()


def _relay_consumer(sock: socket.socket | None, region: mmap.mmap, n: int, out) -> None:
    """The relay's last process: woken by the futex word (two hops) or a blocking read of the
    socket (one hop), it records each stamp's age."""
    from mq.protocol.state import futex
    clock, ages = time.perf_counter_ns, []
    quiet_gc()
    for i in range(n):
        if sock is not None:
            stamp = sock.recv(8, socket.MSG_WAITALL)
        else:
            while (seq := struct.unpack_from("<I", region, 0)[0]) <= i:
                futex.wait_any(region, [0], [seq], bytearray(4), 0, 1.0)
            stamp = region[8 + 8 * i:16 + 8 * i]
        ages.append(clock() - struct.unpack("<q", stamp)[0])
    out.send(ages)


def relay_latencies(n: int, hops: int, gap_s: float = 0.001, warmup: int = 50) -> list[float]:
    """µs from a paced sender's stamp to the wake-up of the last of ``hops`` + 1 processes that
    do no work but pass it on: the floor of a pipeline of that many cross-process wake-ups at
    1/gap_s messages per second. One hop: a Unix socket read by a blocked process (what a
    ``multiprocessing.Queue``'s reader waits on). Two hops: mq's path without mq in it: a Unix
    socket to a process in epoll, which wakes the last one through a futex word. The sender
    goes back to its pacing at once, as a producer does."""
    total = n + warmup
    region = mmap.mmap(-1, 8 * (total + 1))     # shared with the forked children
    a, b = socket.socketpair()
    results, results_w = CTX.Pipe(duplex=False)
    if hops == 1:
        kids = [CTX.Process(target=_relay_consumer, args=(b, region, total, results_w))]
    else:
        kids = [CTX.Process(target=_relay_broker, args=(b, region, total)),
                CTX.Process(target=_relay_consumer, args=(None, region, total, results_w))]
    try:
        for k in kids:
            k.start()
        clock, sleep, send = time.perf_counter_ns, time.sleep, a.send
        for _ in range(total):
            due = clock() + int(gap_s * 1e9)
            sleep(gap_s * 0.8)
            while clock() < due:
                pass
            send(struct.pack("<q", clock()))
        ages = results.recv()
    finally:
        for k in kids:
            k.join(10)
            if k.is_alive():
                k.kill()
                k.join()
        a.close()
        b.close()
        region.close()
    return [v / 1000 for v in ages[warmup:]]


# --- percentiles ------------------------------------------------------------------------------

def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` (nearest rank, from below)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def percentiles(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"count": len(s), "p50_us": pct(s, 50), "p99_us": pct(s, 99),
            "p99_9_us": pct(s, 99.9), "max_us": s[-1], "mean_us": sum(s) / len(s)}


def run_percentiles(per_run: list[dict]) -> dict:
    """How the runs' p50 and p99 (``p50_us``, ``p99_us``) spread, as summaries."""
    return {"p50_us_runs": summary([s["p50_us"] for s in per_run]),
            "p99_us_runs": summary([s["p99_us"] for s in per_run])}


# --- the machine ------------------------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _mount_of(path: str) -> dict:
    path = os.path.realpath(path)
    best = ("", "?", "?", "?")
    for line in (_read("/proc/mounts") or "").splitlines():
        dev, mnt, fstype, opts = line.split()[:4]
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
            best = (dev, mnt, fstype, opts)
    return {"device": best[0], "mount": best[1], "fstype": best[2], "options": best[3]}


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def decoder_state() -> dict:
    """Which codec paths this process uses (``mq.log.native``): the optional C decoder
    (``decode_records``) and the C record encoder (``RecordAccumulator``)."""
    try:
        importlib.import_module("mq.log._crecords")
        present = True
    except ImportError:
        present = False
    return {"crecords_importable": present,
            "c_decoder_active": native.decode_records is not None,
            "c_encoder_active": native.RecordAccumulator is not None,
            "MQ_PURE_PYTHON": os.environ.get("MQ_PURE_PYTHON")}


def machine_facts(base: str, **extra: Any) -> dict:
    """The machine, the packages and the code a run measured, with ``base`` (its temp dir)
    standing for the data dir; ``extra`` (say ``wait_idle=``, ``start_method=``) goes last."""
    cpuinfo = _read("/proc/cpuinfo") or ""
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines()
                  if ln.startswith("model name")), platform.processor())
    meminfo = _read("/proc/meminfo") or ""
    mem_kb = next((int(ln.split()[1]) for ln in meminfo.splitlines()
                   if ln.startswith("MemTotal")), 0)
    versions = {}
    for pkg in ("crc32c", "lz4", "hdrhistogram", "zstandard", "cramjam"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    so = getattr(importlib.util.find_spec("mq.log._crecords"), "origin", None) \
        if importlib.util.find_spec("mq.log._crecords") else None
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0], "implementation": platform.python_implementation(),
        "kernel": platform.release(), "cpu_model": model, "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)), "mem_gib": round(mem_kb / 1024 / 1024, 1),
        "data_dir": base, "data_dir_mount": _mount_of(base),
        "vm_dirty": {k: _read(f"/proc/sys/vm/{k}") for k in (
            "dirty_ratio", "dirty_background_ratio", "dirty_bytes", "dirty_background_bytes",
            "dirty_expire_centisecs")},
        "loadavg_start": os.getloadavg(), "packages": versions,
        "git_head": _git("rev-parse", "HEAD"),
        "git_dirty_files": (_git("status", "--porcelain") or "").splitlines(),
        "crecords_so": so, "decoder": decoder_state(), **extra,
    }


# --- the report -------------------------------------------------------------------------------

COLUMNS = [("benchmark", "benchmark"), ("figure", "figure: median (min-max)"), ("unit", "unit"),
           ("ratio", "ratio vs peer/limit"), ("goal", "goal"), ("met", "met?")]


class Rows(list):
    """The result table: one dict per row, keyed by ``COLUMNS``."""

    def add(self, benchmark: str, figure: str, unit: str, ratio: str = "-", goal: str = "-",
            met: str = "-") -> None:
        self.append({"benchmark": benchmark, "figure": figure, "unit": unit, "ratio": ratio,
                     "goal": goal, "met": met})


def mm(s: dict, fmt: Callable[[float], str]) -> str:
    """A ``summary`` as ``median (min-max)``."""
    return f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})"


def fmt_rate(v: float) -> str:
    """A rate for the table: ``1.23 M``, ``456 k``, ``7.8 k``."""
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.0f} k" if v >= 1e4 \
        else f"{v / 1e3:.1f} k"


def fmt_ratio(s: dict, what: str) -> str:
    """A ``summary`` of ratios for the table: ``1.23x what (1.01-1.40)``."""
    return f"{s['median']:.2f}x {what} ({s['min']:.2f}-{s['max']:.2f})"


def json_bytes(o: Any) -> str:
    """``json.dump``'s ``default`` for results holding ASCII bytes (names, ids)."""
    if isinstance(o, bytes):
        return o.decode("ascii")
    raise TypeError(type(o).__name__)


def format_table(rows: list[dict]) -> str:
    widths = [max(len(title), *(len(r[key]) for r in rows)) for key, title in COLUMNS]
    lines = ["| " + " | ".join(t.ljust(w) for (_, t), w in zip(COLUMNS, widths, strict=True))
             + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for r in rows:
        cells = (r[k].ljust(w) for (k, _), w in zip(COLUMNS, widths, strict=True))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_contention(contention: dict) -> None:
    """The line saying how much CPU other processes used during each section."""
    if contention:
        print(f"other processes' CPU use per section (of {os.cpu_count()} CPUs): "
              + ", ".join(f"{k} {v['other_cpus']:.2f} (steal {v['steal_cpus']:.2f})"
                          for k, v in contention.items()))


def print_report(title: str, meta: dict, rows: Rows, out: str, detail: str = "",
                 notes: Iterable[str] = ()) -> None:
    """The end of a benchmark run on stdout: a line of facts about the machine and the run
    (``detail``: e.g. "5 runs (quick)"), the neighbours' CPU per section, ``notes``, the
    table, and where the JSON went."""
    mount = meta["data_dir_mount"]
    print(f"{title} - {meta['date_utc']}, Python {meta['python']}, {meta['cpus_usable']} CPUs "
          f"({meta['cpu_model']}), {meta['kernel']}, data on {mount['fstype']} "
          f"{mount['device']}{'; ' + detail if detail else ''}; loadavg "
          f"{meta['loadavg_start'][0]:.2f} -> {meta['loadavg_end'][0]:.2f}")
    print_contention(meta.get("contention", {}))
    for note in notes:
        print(f"NOTE: {note}")
    print(format_table(rows))
    print(f"JSON: {out} ({meta['wall_seconds']:.0f} s)")


def finish_run(title: str, res: dict, build_table: Callable[[dict], Rows], out: str,
               wall_seconds: float, detail: str = "", notes: Iterable[str] = (),
               default: Callable[[Any], Any] | None = None) -> Rows:
    """The end of a benchmark run: the closing facts in ``res["meta"]`` (load average, wall
    seconds), the table built into ``res["table"]``, the JSON written to ``out``, and the
    report printed (``print_report``). Returns the table."""
    meta = res["meta"]
    meta["loadavg_end"] = os.getloadavg()
    meta["wall_seconds"] = wall_seconds
    rows = res["table"] = build_table(res)
    write_json(out, res, default=default)
    print_report(title, meta, rows, out, detail, notes)
    return rows


def write_json(path: str, res: dict, default: Callable[[Any], Any] | None = None) -> None:
    """Every raw number to ``path`` (its directory made if missing)."""
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=default)
