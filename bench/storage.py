"""Storage benchmarks: record codec, log append vs raw write, lookup latency, fdatasync.

Not a test: one command, prints a table on stdout, writes every raw number as JSON, shows
progress on stderr and removes the data it writes::

    python3 -m bench.storage [--quick] [--out bench/out/storage.json] [--dir /tmp]

See bench/README.md for what each row measures and how to read the ratios, and
``--profile TARGET`` to profile one measurement with cProfile. Method: perf_counter, every
figure repeated (>= 5 runs, median and min-max), gc collected, frozen and disabled around hot
loops, the sides of a ratio interleaved in the same run (their order rotated every run).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from bench.harness import (
    KIB,
    MIB,
    CpuMeter,
    Rows,
    add_run_arguments,
    decoder_state,
    fdatasync_ns,
    format_table,
    machine_facts,
    make_values,
    mm,
    print_contention,
    progress_printer,
    rotated,
    run_percentiles,
    run_sections,
    summary,
    wait_idle,
    write_json,
)
from mq.log.batch import RecordBatch
from mq.log.builder import BatchBuilder
from mq.log.compression import GZIP, LZ4, NONE
from mq.log.config import LogConfig
from mq.log.layout import ATTRIBUTES_OFFSET, BASE_TIMESTAMP_OFFSET, CRC_OFFSET, crc32c, field
from mq.log.log import PartitionLog

try:  # HdrHistogram (pip install hdrhistogram); sorted lists otherwise
    from hdrh.histogram import HdrHistogram
except ImportError:  # pragma: no cover - depends on the environment
    HdrHistogram = None

GIB = 1024 * MIB
T0_MS = 1_700_000_000_000          # record timestamps start here (2023-11-14)
GOAL_CODEC_RATE = 1_000_000        # records/s, 100 B, each way, one process
GOAL_APPEND_RATIO = 0.8            # PartitionLog.append MB/s / raw os.write MB/s

progress = progress_printer("bench")


@contextlib.contextmanager
def hot_loop():
    """gc collected, surviving objects frozen, collector off for the timed region."""
    gc.collect()
    gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()


# --- record payloads ------------------------------------------------------------------------

def build_batch(values: list[bytes], codec: int = NONE, ts0: int = T0_MS) -> bytearray:
    builder = BatchBuilder(compression=codec)
    for i, v in enumerate(values):
        builder.append(ts0 + i, None, v)
    return builder.build()


def fill_batch(target_bytes: int, value_size: int, seed: int = 7,
               ts_of=lambda i: T0_MS + i) -> bytearray:
    """The largest uncompressed batch of ``value_size`` records that fits ``target_bytes``."""
    values = make_values(value_size, 4096, seed)
    probe = BatchBuilder()
    n = 0
    while probe.size_in_bytes <= target_bytes:
        probe.append(ts_of(n), None, values[n % len(values)])
        n += 1
    builder = BatchBuilder()
    for i in range(n - 1):
        builder.append(ts_of(i), None, values[i % len(values)])
    batch = builder.build()
    assert len(batch) <= target_bytes, (len(batch), target_bytes)
    return batch


# --- 1. codec -------------------------------------------------------------------------------

CODEC_CASES = [  # (name, value size, codec)
    ("100B none", 100, NONE),
    ("1KiB none", 1024, NONE),
    ("1KiB lz4", 1024, LZ4),
    ("1KiB gzip", 1024, GZIP),
]
RECORDS_PER_BATCH = 1000


def _calibrate(fn, target_s: float) -> int:
    """How many batches make one run last about ``target_s`` (also serves as warm-up)."""
    n = 2
    while True:
        t = time.perf_counter()
        fn(n)
        dt = time.perf_counter() - t
        if dt >= 0.05 or n >= 1 << 16:
            return max(2, int(n * target_s / max(dt, 1e-9)))
        n *= 4


def encode_work(case):
    """``work(n)`` encodes n batches of 1000 records (BatchBuilder.append + build)."""
    _, size, codec = case
    pairs = [(T0_MS + i, v) for i, v in enumerate(make_values(size, RECORDS_PER_BATCH, 1))]

    def work(n_batches: int) -> None:
        for _ in range(n_batches):
            builder = BatchBuilder(compression=codec)
            append = builder.append
            for ts, v in pairs:
                append(ts, None, v)
            builder.build()

    raw_len = len(build_batch([v for _, v in pairs], NONE))
    batch_len = len(build_batch([v for _, v in pairs], codec))
    return work, {"batch_bytes": batch_len, "compression_ratio": raw_len / batch_len}


def decode_work(case):
    """``work(n)`` decodes n prebuilt batches (8 distinct ones in turn), touching each value."""
    _, size, codec = case
    distinct = [bytes(build_batch(make_values(size, RECORDS_PER_BATCH, seed), codec))
                for seed in range(1, 9)]

    def work(n_batches: int) -> int:
        total = 0
        for i in range(n_batches):
            for rec in RecordBatch(distinct[i & 7]).records():
                total += len(rec.value)           # touch every value
        assert total == n_batches * RECORDS_PER_BATCH * size
        return total

    return work, {"batch_bytes": len(distinct[0]), "distinct_batches": len(distinct)}


def _run_codec_case(work, info: dict, case, runs: int, target_s: float) -> dict:
    n = _calibrate(work, target_s)
    rates, cpu_rates = [], []
    for _ in range(runs):
        with hot_loop():
            c = time.process_time()
            t = time.perf_counter()
            work(n)
            dt = time.perf_counter() - t
            cpu = time.process_time() - c
        rates.append(n * RECORDS_PER_BATCH / dt)
        cpu_rates.append(n * RECORDS_PER_BATCH / max(cpu, 1e-9))
    return {**summary(rates), "unit": "records/s (wall clock, perf_counter)",
            "per_cpu_second": summary(cpu_rates), "batches_per_run": n,
            "records_per_batch": RECORDS_PER_BATCH, "value_bytes": case[1],
            "codec": case[0].split()[1], **info,
            **{k: v for k, v in decoder_state().items() if k.startswith("c_")}}


def bench_encode(case, runs: int, target_s: float) -> dict:
    work, info = encode_work(case)
    return _run_codec_case(work, info, case, runs, target_s)


def bench_decode(case, runs: int, target_s: float) -> dict:
    work, info = decode_work(case)
    return _run_codec_case(work, info, case, runs, target_s)


def _codec_pass(runs: int, target_s: float, where: str = "") -> dict:
    state = decoder_state()
    out: dict = {"decoder": state, "encode": {}, "decode": {}}
    for op, fn, flag in (("encode", bench_encode, "c_encoder_active"),
                         ("decode", bench_decode, "c_decoder_active")):
        path = "c" if state[flag] else "pure"
        for case in CODEC_CASES:
            progress(f"codec: {op} {case[0]} [{path}{where}]")
            out[op].setdefault(path, {})[case[0]] = fn(case, runs, target_s)
    return out


def run_codec(runs: int, target_s: float) -> dict:
    out = _codec_pass(runs, target_s)
    state = out["decoder"]
    if state["c_decoder_active"] or state["c_encoder_active"]:
        progress("codec: pure-Python paths (subprocess, MQ_PURE_PYTHON=1)")
        env = dict(os.environ, MQ_PURE_PYTHON="1")
        proc = subprocess.run(
            [sys.executable, "-m", "bench.storage", "--child-codec",
             "--runs", str(runs), "--target-seconds", str(target_s)],
            env=env, capture_output=True, text=True, check=False,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"pure-Python codec subprocess failed ({proc.returncode})")
        child = json.loads(proc.stdout)
        if child["decoder"]["c_decoder_active"] or child["decoder"]["c_encoder_active"]:
            raise RuntimeError("MQ_PURE_PYTHON=1 did not disable the C codec")
        for op in ("encode", "decode"):
            if "c" in out[op]:
                out[op]["pure"] = child[op]["pure"]
        out["decoder_pure_subprocess"] = child["decoder"]
    return out


def child_codec(runs: int, target_s: float) -> None:
    json.dump(_codec_pass(runs, target_s, ", subprocess"), sys.stdout)


# --- 2. log append vs raw os.write ----------------------------------------------------------

def _raw_write(path: str, data: bytes, count: int) -> float:
    """Seconds to os.write ``data`` ``count`` times into a fresh file (same flags as a
    segment: O_APPEND, no fsync)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    try:
        write = os.write
        size = len(data)
        with hot_loop():
            t = time.perf_counter()
            for _ in range(count):
                if write(fd, data) != size:
                    raise OSError("short write")
            dt = time.perf_counter() - t
    finally:
        os.close(fd)
        os.unlink(path)
    return dt


def _log_append(directory: str, template: bytes, count: int, copy: bool,
                prof: cProfile.Profile | None = None) -> float:
    """Seconds for ``count`` PartitionLog.append calls into a fresh partition directory.

    Without ``copy`` one bytearray is appended over and over: append re-stamps its
    baseOffset in place before writing, and the CRC does not cover that field, so every
    write is a valid batch at the right offset (a broker appending from its receive buffer).
    With ``copy`` each call gets ``bytearray(template)``, the copy inside the timed loop.
    """
    log = PartitionLog.open(directory, LogConfig())
    try:
        append = log.append
        buf = bytearray(template)
        with hot_loop():
            if prof is not None:
                prof.enable()
            t = time.perf_counter()
            if copy:
                for _ in range(count):
                    append(bytearray(template))
            else:
                for _ in range(count):
                    append(buf)
            dt = time.perf_counter() - t
            if prof is not None:
                prof.disable()
        assert log.log_end_offset == count * RecordBatch(template).records_count
        assert log.size_in_bytes == count * len(template)
        # Page cache only, like the raw side: skip close()'s fdatasync, the files go now.
        log.recovery_point = log.log_end_offset
    finally:
        log.close()
        shutil.rmtree(directory)
    return dt


APPEND_SIZES = [("16KiB", 16 * KIB), ("1MiB", MIB)]


def run_append(base: str, total: int, runs: int) -> dict:
    out = {}
    limit = LogConfig().max_message_bytes
    for label, target in APPEND_SIZES:
        template = bytes(fill_batch(min(target, limit), 100))
        count = total // len(template)
        nbytes = count * len(template)
        sides = ["raw_os_write", "log_append", "log_append_copy"]
        times: dict[str, list[float]] = {s: [] for s in sides}
        for r in range(runs):
            order = rotated(sides, r)
            progress(f"append {label}: run {r + 1}/{runs} ({nbytes / MIB:.0f} MiB per side, "
                     f"order {', '.join(order)})")
            for side in order:
                if side == "raw_os_write":
                    dt = _raw_write(os.path.join(base, f"raw-{label}-{r}.bin"), template, count)
                else:
                    dt = _log_append(os.path.join(base, f"log-{label}-{r}", "bench-0"),
                                     template, count, side == "log_append_copy")
                times[side].append(dt)
        res: dict = {"batch_bytes": len(template),
                     "records_per_batch": RecordBatch(template).records_count,
                     "value_bytes": 100, "batches": count, "total_bytes": nbytes}
        for side in sides:
            mbs = [nbytes / dt / 1e6 for dt in times[side]]
            res[side] = {**summary(mbs), "unit": "MB/s", "seconds": times[side],
                         "appends_per_s": statistics.median(count / dt for dt in times[side])}
        for side in ("log_append", "log_append_copy"):
            ratios = [raw / mine for raw, mine
                      in zip(times["raw_os_write"], times[side], strict=True)]
            res[f"{side}_ratio"] = {**summary(ratios), "note": "per-run paired: raw s / log s"}
        out[label] = res
    return out


# --- 3. lookup latency ----------------------------------------------------------------------

class Latencies:
    """Per-call latencies in ns; HdrHistogram when installed, else sorted lists."""

    def __init__(self) -> None:
        self.samples: list[int] = []

    def add(self, ns: int) -> None:
        self.samples.append(ns)

    def stats(self) -> dict:
        s = sorted(self.samples)
        if HdrHistogram is not None:
            h = HdrHistogram(1, 60 * 10**9, 3)
            for v in s:
                h.record_value(max(v, 1))
            pct = {p: h.get_value_at_percentile(p) / 1000 for p in (50, 90, 99, 99.9)}
            enc = h.encode()
            return {"count": len(s), "p50_us": pct[50], "p90_us": pct[90], "p99_us": pct[99],
                    "p999_us": pct[99.9], "max_us": s[-1] / 1000, "min_us": s[0] / 1000,
                    "mean_us": statistics.fmean(s) / 1000, "method": "hdrhistogram (3 digits)",
                    "hdr_encoded": enc.decode() if isinstance(enc, bytes) else enc}

        def q(p):
            return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))] / 1000
        return {"count": len(s), "p50_us": q(50), "p90_us": q(90), "p99_us": q(99),
                "p999_us": q(99.9), "max_us": s[-1] / 1000, "min_us": s[0] / 1000,
                "mean_us": statistics.fmean(s) / 1000, "method": "sorted list"}


def _lookup_template(per_ms: int = 4) -> tuple[bytes, int]:
    """A ~16 KiB batch of 100 B records, ``per_ms`` records per millisecond."""
    batch = fill_batch(16 * KIB, 100, seed=3, ts_of=lambda i: T0_MS + i // per_ms)
    n = RecordBatch(batch).records_count
    return bytes(batch), (n - 1) // per_ms + 1


_TS2 = struct.Struct(">qq")   # baseTimestamp, maxTimestamp (adjacent)
_CRC = field("crc")           # of bytes [ATTRIBUTES_OFFSET, end)


def build_lookup_log(directory: str, total: int, segment_bytes: int) -> tuple[PartitionLog, dict]:
    template, span_ms = _lookup_template()
    first = RecordBatch(template)
    count = total // len(template)
    config = LogConfig(segment_bytes=segment_bytes)
    log = PartitionLog.open(directory, config)
    t = time.perf_counter()
    step = max(1, count // 10)
    for k in range(count):
        buf = bytearray(template)
        base_ts = T0_MS + k * span_ms             # timestamps increase batch after batch
        _TS2.pack_into(buf, BASE_TIMESTAMP_OFFSET, base_ts,
                       base_ts + (first.max_timestamp - first.base_timestamp))
        _CRC.pack_into(buf, CRC_OFFSET, crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
        log.append(buf)
        if (k + 1) % step == 0:
            progress(f"lookup: building log {100 * (k + 1) // count}% "
                     f"({(k + 1) * len(template) / MIB:.0f} MiB)")
    build_s = time.perf_counter() - t
    last = RecordBatch(bytearray(log.read(log.log_end_offset - 1, 1).data))
    info = {"log_bytes": log.size_in_bytes, "batches": count, "batch_bytes": len(template),
            "records_per_batch": first.records_count, "records": log.log_end_offset,
            "segments": len(log.segments), "segment_bytes": segment_bytes,
            "index_interval_bytes": config.index_interval_bytes,
            "ts_min": T0_MS, "ts_max": last.max_timestamp, "build_seconds": build_s}
    return log, info


def run_lookup(base: str, total: int, segment_bytes: int, runs: int, per_run: int) -> dict:
    directory = os.path.join(base, "lookup", "bench-0")
    log, info = build_lookup_log(directory, total, segment_bytes)
    try:
        rnd = random.Random(2024)
        leo = log.log_end_offset
        bases = [s.base_offset for s in log.segments]
        segs = log.segments

        def seg_of(off):
            return segs[bisect.bisect_right(bases, off) - 1]

        # correctness spot checks, outside any timing
        for _ in range(50):
            off = rnd.randrange(leo)
            found = seg_of(off).translate_offset(off)
            assert found is not None and found.last_offset >= off
            got = RecordBatch(bytearray(log.read(off, 1).data))
            assert got.base_offset <= off <= got.last_offset
            ts = rnd.randrange(info["ts_min"], info["ts_max"] + 1)
            _, t = log.offset_for_timestamp(ts)
            assert t >= ts

        kinds = {
            "translate_offset": lambda off, ts: seg_of_cache[off].translate_offset(off),
            "read_first_batch": lambda off, ts: log.read(off, 1),
            "read_1MiB": lambda off, ts: log.read(off, MIB),
            "offset_for_timestamp": lambda off, ts: log.offset_for_timestamp(ts),
        }
        lat = {k: [] for k in kinds}
        merged = {k: Latencies() for k in kinds}
        seg_of_cache: dict = {}
        pnc = time.perf_counter_ns
        for r in range(runs + 1):          # run 0 is a discarded warm-up
            n = per_run if r else max(200, per_run // 10)
            offs = [rnd.randrange(leo) for _ in range(n)]
            tss = [rnd.randrange(info["ts_min"], info["ts_max"] + 1) for _ in range(n)]
            seg_of_cache = {off: seg_of(off) for off in offs}   # bare: segment chosen before
            progress(f"lookup: {'warm-up' if r == 0 else f'run {r}/{runs}'} "
                     f"({n} lookups of each kind)")
            for kind, fn in kinds.items():
                one = Latencies()
                with hot_loop():
                    for off, ts in zip(offs, tss, strict=True):
                        t = pnc()
                        fn(off, ts)
                        one.add(pnc() - t)
                if r:
                    lat[kind].append(one.stats())
                    merged[kind].samples.extend(one.samples)
        out = {"log": info, "runs": runs, "lookups_per_run": per_run,
               "kinds": {kind: _latency_runs(lat[kind], merged[kind]) for kind in kinds}}
    finally:
        log.recovery_point = log.log_end_offset   # page cache only; the data goes now
        log.close()
        shutil.rmtree(os.path.dirname(directory))
    return out


def _latency_runs(per: list[dict], merged: Latencies) -> dict:
    """Every run's samples merged, each run's stats (without its encoded histogram) and how
    their p50 and p99 spread."""
    return {"merged": merged.stats(),
            "per_run": [{k: v for k, v in s.items() if k != "hdr_encoded"} for s in per],
            **run_percentiles(per), "samples_ns": merged.samples}


# --- 4. fdatasync ---------------------------------------------------------------------------

def run_fsync(base: str, runs: int, samples: int) -> dict:
    per = []
    merged = Latencies()
    for r in range(runs):
        progress(f"fdatasync: run {r + 1}/{runs} ({samples} x 4 KiB append + fdatasync)")
        one = Latencies()
        one.samples = fdatasync_ns(base, samples)      # after a discarded warm-up of 5
        per.append(one.stats())
        merged.samples.extend(one.samples)
    return _latency_runs(per, merged)


# --- table ----------------------------------------------------------------------------------

def _rate(v: float) -> str:
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.0f} k"


def build_table(res: dict) -> list[dict]:
    rows = Rows()
    row = rows.add

    codec = res.get("codec")
    if codec:
        for op in ("encode", "decode"):
            paths = [p for p in ("c", "pure") if p in codec[op]]
            for name in codec[op][paths[0]]:
                for path in paths:
                    s = codec[op][path][name]
                    goal = name == "100B none"
                    if path == "c" and "pure" in codec[op]:
                        ratio = f"{s['median'] / codec[op]['pure'][name]['median']:.1f}x pure"
                    elif goal:
                        ratio = f"{s['median'] / GOAL_CODEC_RATE:.2f}x goal"
                    else:
                        ratio = "-"
                    row(f"{op} {name} [{path}]", mm(s, _rate), "rec/s", ratio,
                        ">= 1 M rec/s" if goal else "-",
                        ("yes" if s["median"] >= GOAL_CODEC_RATE else "NO") if goal else "-")
    app = res.get("append")
    if app:
        for label, a in app.items():
            row(f"raw os.write {label} (limit)", mm(a["raw_os_write"], "{:.0f}".format),
                "MB/s")
            for side, what in (("log_append", "append"), ("log_append_copy", "append+copy")):
                r = a[f"{side}_ratio"]
                goal = side == "log_append"
                row(f"log {what} {label}", mm(a[side], "{:.0f}".format), "MB/s",
                    f"{r['median']:.2f}x raw ({r['min']:.2f}-{r['max']:.2f})",
                    f">= {GOAL_APPEND_RATIO}x raw" if goal else "-",
                    ("yes" if r["median"] >= GOAL_APPEND_RATIO else "NO") if goal else "-")
    fs = res.get("fsync")
    if fs:
        m = fs["merged"]
        row("fdatasync after 4 KiB append (limit)",
            f"p50 {m['p50_us']:.0f} / p99 {m['p99_us']:.0f} / max {m['max_us']:.0f}", "us",
            f"p50 runs {fs['p50_us_runs']['min']:.0f}-{fs['p50_us_runs']['max']:.0f}")
    lk = res.get("lookup")
    if lk:
        size = lk["log"]["log_bytes"] / MIB
        for kind, k in lk["kinds"].items():
            m = k["merged"]
            fmt = (lambda v: f"{v:.1f}") if m["p99_us"] < 100 else (lambda v: f"{v:.0f}")
            row(f"lookup {kind} ({size:.0f} MiB log)",
                f"p50 {fmt(m['p50_us'])} / p99 {fmt(m['p99_us'])} / max {fmt(m['max_us'])}",
                "us", f"p50 runs {k['p50_us_runs']['min']:.1f}-{k['p50_us_runs']['max']:.1f}")
    return rows


# --- profiling ------------------------------------------------------------------------------

def profile(target: str, base: str, top: int) -> None:
    """cProfile one measurement and print the top functions by own time."""
    prof = cProfile.Profile()
    if target in ("encode100", "decode100"):
        work, _ = (encode_work if target == "encode100" else decode_work)(CODEC_CASES[0])
        n = _calibrate(work, 1.0)
        prof.runcall(work, n)
    elif target in ("append16k", "append1m"):
        size = 16 * KIB if target == "append16k" else MIB
        template = bytes(fill_batch(min(size, LogConfig().max_message_bytes), 100))
        count = (256 * MIB) // len(template)
        _log_append(os.path.join(base, "prof", "bench-0"), template, count, False, prof)
    elif target == "lookup-ts":
        log, info = build_lookup_log(os.path.join(base, "prof", "bench-0"), 128 * MIB, 32 * MIB)
        rnd = random.Random(1)
        tss = [rnd.randrange(info["ts_min"], info["ts_max"] + 1) for _ in range(2000)]
        prof.runcall(lambda: [log.offset_for_timestamp(t) for t in tss])
        log.recovery_point = log.log_end_offset
        log.close()
        shutil.rmtree(os.path.join(base, "prof"))
    else:
        raise SystemExit(f"unknown profile target {target!r}")
    stream = io.StringIO()
    stats = pstats.Stats(prof, stream=stream)
    total = sum(v[2] for v in stats.stats.values())   # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    print(f"# profile of {target} (decoder: {decoder_state()}), total own time {total:.3f} s")
    print(stream.getvalue())


# --- main -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.storage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes (64 MiB appends, 128 MiB lookup log): under a minute")
    add_run_arguments(p, "storage")
    p.add_argument("--runs", type=int, default=5, help="repetitions per figure (>= 5)")
    p.add_argument("--only", default="codec,fsync,append,lookup",
                   help="comma-separated subset of codec,fsync,append,lookup")
    p.add_argument("--profile", metavar="TARGET",
                   help="cProfile one measurement instead: encode100, decode100, append16k, "
                        "append1m, lookup-ts (set MQ_PURE_PYTHON=1 for the pure-Python codec)")
    p.add_argument("--target-seconds", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-codec", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    target_s = args.target_seconds or (0.1 if args.quick else 0.3)
    if args.child_codec:
        child_codec(args.runs, target_s)
        return 0
    if args.runs < 5:
        progress(f"warning: --runs {args.runs} is below the method's minimum of 5")
    base = tempfile.mkdtemp(prefix="mq-bench-", dir=args.dir)
    try:
        if args.profile:
            profile(args.profile, base, 30)
            return 0
        only = set(args.only.split(","))
        params = {
            "quick": args.quick, "runs": args.runs, "codec_target_seconds_per_run": target_s,
            "append_total_bytes": (64 if args.quick else 512) * MIB,
            "lookup_log_bytes": (128 * MIB) if args.quick else GIB,
            "lookup_segment_bytes": (32 * MIB) if args.quick else 256 * MIB,
            "lookups_per_run": 2000 if args.quick else 5000,
            "fsync_samples_per_run": 100,
        }
        idle = wait_idle(args.wait_idle, progress=progress)
        res: dict = {"meta": machine_facts(base, wait_idle=idle), "params": params}
        progress(f"data dir {base}; decoder {res['meta']['decoder']}")
        t = time.perf_counter()
        sections = {"codec": lambda: run_codec(args.runs, target_s),
                    "fsync": lambda: run_fsync(base, args.runs,
                                               params["fsync_samples_per_run"]),
                    "append": lambda: run_append(base, params["append_total_bytes"],
                                                 args.runs),
                    "lookup": lambda: run_lookup(base, params["lookup_log_bytes"],
                                                 params["lookup_segment_bytes"], args.runs,
                                                 params["lookups_per_run"])}
        contention = res["meta"]["contention"] = {}
        run_sections(sections, only, res, contention, meter=CpuMeter, progress=progress)
        res["meta"]["loadavg_end"] = os.getloadavg()
        res["meta"]["wall_seconds"] = time.perf_counter() - t
        rows = res["table"] = build_table(res)
        write_json(args.out, res)
        m = res["meta"]
        dec = m["decoder"]
        pure_sub = " ([pure] rows from a MQ_PURE_PYTHON=1 subprocess)" \
            if "decoder_pure_subprocess" in res.get("codec", {}) else ""
        print(f"mq storage benchmarks - {m['date_utc']}, Python {m['python']}, "
              f"{m['cpus_usable']} CPUs ({m['cpu_model']}), {m['kernel']}, data dir on "
              f"{m['data_dir_mount']['fstype']} {m['data_dir_mount']['device']}; "
              f"C decoder {'active' if dec['c_decoder_active'] else 'inactive'}, "
              f"C encoder {'active' if dec['c_encoder_active'] else 'inactive'}{pure_sub}; "
              f"{args.runs} runs{' (quick)' if args.quick else ''}; loadavg "
              f"{m['loadavg_start'][0]:.2f} -> {m['loadavg_end'][0]:.2f}")
        print_contention(contention)
        print(format_table(rows))
        print(f"JSON: {args.out} ({m['wall_seconds']:.0f} s)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
