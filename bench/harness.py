"""Machinery shared by the multi-process benchmarks (bench/e2e.py): worker processes started
together behind a barrier, CPU meters that count a whole process family, HdrHistogram helpers,
payloads, and the physical limits measured in the same run (raw page-cache write, fdatasync,
a bare POSIX-semaphore round trip between two processes).

Timestamps everywhere are ``time.perf_counter_ns()``: CLOCK_MONOTONIC on Linux, one clock for
the whole system, so a time taken in one process can be subtracted from one taken in another.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import multiprocessing.connection
import os
import secrets
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import posix_ipc
import psutil

try:  # pip install hdrhistogram (the `bench` extra)
    from hdrh.histogram import HdrHistogram
except ImportError:  # pragma: no cover - checked by bench.peers.ensure_python_packages
    HdrHistogram = None

KIB = 1024
MIB = 1024 * 1024
HDR_MIN_US, HDR_MAX_US, HDR_DIGITS = 1, 60_000_000, 3     # 1 us .. 60 s, 3 digits

# fork: a worker starts in milliseconds (spawn re-imports mq and the clients: ~0.2 s each,
# and this suite starts ~300 workers). The harness process itself never starts a thread or
# holds a producer, so forking it is safe.
CTX = mp.get_context("fork")

_START = time.monotonic()


def progress(msg: str) -> None:
    print(f"[e2e {time.monotonic() - _START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": list(values)}


def quiet_gc() -> None:
    """For a worker's hot loop: collect, freeze the survivors, switch the collector off. Every
    system's workers get the same treatment (the method, perf-anchors.md §7.4)."""
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


# --- CPU of the whole process family, and of everyone else ------------------------------------

def _proc_cpu(p: psutil.Process) -> float:
    c = p.cpu_times()
    return c.user + c.system + c.children_user + c.children_system


def _busy(t) -> float:
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


class FamilyMeter:
    """CPUs used by other sessions' processes during a section: system-wide busy time minus
    this process and all its descendants (workers, broker, redis-server, nats-server), plus
    the hypervisor's steal. Like bench.storage.CpuMeter, but the servers here are long-lived
    children, which that meter (own + *waited* children) would count as neighbours."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._t = time.monotonic()
        self._sys = psutil.cpu_times()
        self._start = self._family()

    def _family(self) -> dict[int, float]:
        out = {}
        try:
            out[self._me.pid] = _proc_cpu(self._me)
        except psutil.Error:
            pass
        for p in self._me.children(recursive=True):
            try:
                out[p.pid] = _proc_cpu(p)
            except psutil.Error:
                pass
        return out

    def stop(self) -> dict:
        wall = time.monotonic() - self._t
        now_sys = psutil.cpu_times()
        fam = self._family()
        own = sum(v - self._start.get(pid, 0.0) for pid, v in fam.items())
        other = _busy(now_sys) - _busy(self._sys) - own
        steal = getattr(now_sys, "steal", 0) - getattr(self._sys, "steal", 0)
        return {"wall_s": wall, "family_cpus": own / wall,
                "other_cpus": max(other, 0.0) / wall, "steal_cpus": steal / wall,
                "loadavg_1m": os.getloadavg()[0]}


def run_sections(sections: list[str], only: set[str], fns: dict[str, Callable[[], Any]],
                 results: dict, contention: dict) -> None:
    """Run each selected section under a ``FamilyMeter``; record its result and how much CPU
    other processes took meanwhile, warning when that makes the figures noisy."""
    for name in sections:
        if name not in only:
            continue
        meter = FamilyMeter()
        results[name] = fns[name]()
        contention[name] = c = meter.stop()
        if c["other_cpus"] > 0.2 or c["steal_cpus"] > 0.1:
            progress(f"warning: during {name}, other processes used {c['other_cpus']:.2f} "
                     f"CPUs and steal was {c['steal_cpus']:.2f} (of {os.cpu_count()}): "
                     "figures are noisier and lower than on an idle box")


def process_cpu(pid: int) -> float:
    """On-CPU seconds of one process, all its threads: the sum of
    ``/proc/<pid>/task/*/schedstat`` run times (nanoseconds). psutil's ``cpu_times()`` comes in
    clock ticks (10 ms), too coarse for a broker that uses 40 ms in a short run; it is the
    fallback when schedstat is unavailable. (A thread that exited during the interval drops
    out of the sum; the broker's two threads live as long as it does.)"""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass
        return total / 1e9
    except (OSError, ValueError):
        c = psutil.Process(pid).cpu_times()
        return c.user + c.system


def process_cpu_ticks(pid: int) -> float:
    """psutil's user + system seconds (10 ms resolution), recorded as a cross-check."""
    c = psutil.Process(pid).cpu_times()
    return c.user + c.system


# --- histograms -----------------------------------------------------------------------------

def new_hist():
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

def payloads(size: int, count: int, seed: int = 1) -> list[bytes]:
    """``count`` distinct values of exactly ``size`` bytes (JSON-like text; the same bytes are
    given to every system)."""
    from bench.storage import make_values
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


def fdatasync_samples(directory: str, samples: int, warmup: int = 5) -> list[float]:
    """µs of ``fdatasync`` after each 4 KiB append to a fresh file (bench.storage's method)."""
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
                out.append(dt / 1000)
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


def percentiles(samples: list[float]) -> dict:
    s = sorted(samples)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p / 100 * len(s)))]
    return {"count": len(s), "p50_us": q(50), "p99_us": q(99), "p99_9_us": q(99.9),
            "max_us": s[-1], "mean_us": sum(s) / len(s)}
