"""Log cleaner benchmark: ``BackgroundCleaner`` end to end against a raw sequential read.

Not a test: one command, prints a table on stdout, writes every raw number as JSON, shows
progress on stderr and removes the data it writes::

    python3 -m bench.cleaner [--quick] [--out bench/out/cleaner.json] [--dir /tmp]

A template log of about 100 MiB (20 MiB with ``--quick``) is written once: ~16 KiB batches of
256-byte JSON-like values whose keys are drawn uniformly from a key space of 10% of the
record count, then rolled, so every segment is cleanable. Each run copies it to a fresh
partition dir (untimed) and measures, in an order rotated run by run:

- ``raw``: ``readinto`` of the template's ``.log`` files in 1 MiB chunks (page cache, like the
  cleaner's reads): the physical limit of reading those bytes once;
- ``cleaner``: a ``BackgroundCleaner`` over the copy, with a loop thread running its
  ``LoopCalls`` as the broker's does, from ``start()`` until its first pass completed: the
  choice on the loop, offset map, recopy, fsyncs of the cleaned segments, swaps on the loop,
  checkpoint. MB/s = bytes of the cleaned segments / that time. Kafka's figure (recopied bytes
  / pass time, ``CleanerStats.throughput_mb_s``) is in the JSON too.

See bench/README.md ("Cleaner") for the method and how to read the ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import selectors
import shutil
import sys
import tempfile
import threading
import time

from bench.harness import (
    MIB,
    CpuMeter,
    Rows,
    add_run_arguments,
    format_table,
    machine_facts,
    make_values,
    mm,
    rotated,
    summary,
    wait_idle,
    warn_if_busy,
    write_json,
)
from bench.storage import T0_MS, hot_loop, progress
from mq.broker.cleaning import BackgroundCleaner, LoopCalls
from mq.log.builder import BatchBuilder
from mq.log.config import LogConfig
from mq.log.log import PartitionLog

VALUE_BYTES = 256
BATCH_BYTES = 16 * 1024
UNIQUE_KEY_SHARE = 0.10
READ_CHUNK = MIB


def _config(segment_bytes: int) -> LogConfig:
    return LogConfig(segment_bytes=segment_bytes, cleanup_policy="compact",
                     file_delete_delay_ms=0)


def build_template(directory: str, total: int, segment_bytes: int) -> dict:
    """Write the template log; returns its facts (records, keys, cleanable bytes)."""
    values = make_values(VALUE_BYTES, 4096, seed=3)
    per_batch = BATCH_BYTES // (VALUE_BYTES + 30)
    records = total // (VALUE_BYTES + 30)
    keys = max(1, int(records * UNIQUE_KEY_SHARE))
    rnd = random.Random(11)
    plog = PartitionLog.open(directory, _config(segment_bytes))
    try:
        written = 0
        while written < records:
            builder = BatchBuilder()
            for i in range(min(per_batch, records - written)):
                builder.append(T0_MS + written + i, b"key-%08d" % rnd.randrange(keys),
                               values[(written + i) % len(values)])
            plog.append(builder.build(), now_ms=T0_MS)
            written += per_batch
        plog.roll()                                 # the active segment stays empty
        distinct = len({r.key.tobytes() if isinstance(r.key, memoryview) else bytes(r.key)
                        for b in plog.batches() for r in b.records()})
        facts = {"records": plog.log_end_offset, "key_space": keys, "distinct_keys": distinct,
                 "segments": len(plog.segments) - 1, "segment_bytes": segment_bytes,
                 "cleanable_bytes": sum(s.size for s in plog.segments[:-1])}
        plog.recovery_point = plog.log_end_offset  # page cache only: no fdatasync at close
    finally:
        plog.close()
    return facts


def raw_read(directory: str) -> tuple[int, float]:
    """(bytes, seconds) to read every ``.log`` file of ``directory`` once, sequentially."""
    buf = bytearray(READ_CHUNK)
    paths = sorted(os.path.join(directory, n) for n in os.listdir(directory)
                   if n.endswith(".log"))
    total = 0
    with hot_loop():
        t = time.perf_counter()
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
        dt = time.perf_counter() - t
    return total, dt


class _Loop(threading.Thread):
    """The broker loop's part: run the cleaner's calls when their pipe is readable."""

    def __init__(self, calls: LoopCalls) -> None:
        super().__init__(name="bench-loop", daemon=True)
        self.calls = calls
        self.halt = threading.Event()

    def run(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.calls, selectors.EVENT_READ)
            while not self.halt.is_set():
                if sel.select(0.05):
                    self.calls.run_pending()


def clean_once(directory: str, segment_bytes: int) -> dict:
    """One BackgroundCleaner pass over the partition dir ``directory``, timed end to end."""
    plog = PartitionLog.open(directory, _config(segment_bytes), clean_shutdown=True)
    calls = LoopCalls()
    loop = _Loop(calls)
    loop.start()
    cleaner = BackgroundCleaner(calls, lambda: [plog], os.path.dirname(directory),
                                backoff_ms=3_600_000)
    try:
        with hot_loop():
            t = time.perf_counter()
            cleaner.start()
            while cleaner.totals().completed < 1:
                if not cleaner.is_alive() or cleaner.totals().failures:
                    raise RuntimeError("the cleaner failed; see the log above")
                time.sleep(0.002)                    # < 0.1% of a pass
            dt = time.perf_counter() - t
        stats = cleaner.totals().last[(plog.topic, plog.partition)]
    finally:
        cleaner.stop()
        cleaner.join()
        loop.halt.set()
        loop.join()
        calls.close()
        plog.recovery_point = plog.log_end_offset
        plog.close()
    return {"seconds": dt, "bytes_read": stats.bytes_read, "bytes_written": stats.bytes_written,
            "records_read": stats.records_read, "records_kept": stats.records_kept,
            "pass_seconds": stats.elapsed, "pass_mib_s": stats.throughput_mb_s,
            "groups_swapped": stats.groups_swapped}


def run(base: str, total: int, segment_bytes: int, runs: int) -> dict:
    template = os.path.join(base, "template", "bench-0")
    progress(f"writing a {total / MIB:.0f} MiB template log")
    facts = build_template(template, total, segment_bytes)
    progress(f"template: {facts['records']} records, {facts['distinct_keys']} keys, "
             f"{facts['segments']} segments, {facts['cleanable_bytes'] / MIB:.1f} MiB")
    raw_mbs, cleaner_mbs, ratios, passes = [], [], [], []
    for r in range(runs):
        copy = os.path.join(base, f"run-{r}", "bench-0")
        shutil.copytree(template, copy)
        order = rotated(["raw", "cleaner"], r)
        progress(f"run {r + 1}/{runs} (order {', '.join(order)})")
        for side in order:
            if side == "raw":
                nbytes, dt = raw_read(template)
                raw_mbs.append(nbytes / dt / 1e6)
            else:
                p = clean_once(copy, segment_bytes)
                if p["records_kept"] != facts["distinct_keys"]:
                    raise RuntimeError(f"the pass kept {p['records_kept']} records, "
                                       f"expected one per key ({facts['distinct_keys']})")
                passes.append(p)
                cleaner_mbs.append(facts["cleanable_bytes"] / p["seconds"] / 1e6)
        ratios.append(cleaner_mbs[-1] / raw_mbs[-1])
        shutil.rmtree(os.path.dirname(copy))
    pass_mbs = [p["pass_mib_s"] * MIB / 1e6 for p in passes]
    return {"log": facts, "raw_read": {**summary(raw_mbs), "unit": "MB/s"},
            "cleaner": {**summary(cleaner_mbs), "unit": "MB/s", "passes": passes},
            "clean_pass": {**summary(pass_mbs), "unit": "MB/s",
                           "note": "CleanerStats: recopied bytes / clean() time"},
            "ratio": {**summary(ratios), "note": "per-run paired: cleaner MB/s / raw MB/s"}}


def build_table(res: dict) -> list[dict]:
    size = res["log"]["cleanable_bytes"] / MIB
    r = res["ratio"]
    written = res["cleaner"]["passes"][0]["bytes_written"] / MIB
    rows = Rows()
    rows.add(f"raw sequential read {size:.0f} MiB (limit)", mm(res["raw_read"], "{:.0f}".format),
             "MB/s")
    rows.add(f"BackgroundCleaner pass {size:.0f} MiB, 10% keys",
             mm(res["cleaner"], "{:.1f}".format), "MB/s",
             f"{r['median']:.3f}x raw ({r['min']:.3f}-{r['max']:.3f})")
    rows.add("  clean() alone: recopied / pass time (Kafka's)",
             mm(res["clean_pass"], "{:.1f}".format), "MB/s", f"{written:.1f} MiB written")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.cleaner", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 20 MiB log instead of 100 MiB")
    add_run_arguments(p, "cleaner")
    p.add_argument("--runs", type=int, default=5, help="repetitions (>= 5)")
    args = p.parse_args(argv)
    if args.runs < 5:
        progress(f"warning: --runs {args.runs} is below the method's minimum of 5")
    total = (20 if args.quick else 100) * MIB
    segment_bytes = (4 if args.quick else 16) * MIB
    base = tempfile.mkdtemp(prefix="mq-bench-cleaner-", dir=args.dir)
    try:
        idle = wait_idle(args.wait_idle, progress=progress)
        res: dict = {"meta": machine_facts(base, wait_idle=idle),
                     "params": {"quick": args.quick, "runs": args.runs, "log_bytes": total,
                                "segment_bytes": segment_bytes, "value_bytes": VALUE_BYTES,
                                "batch_bytes": BATCH_BYTES, "unique_keys": UNIQUE_KEY_SHARE}}
        meter = CpuMeter()
        res.update(run(base, total, segment_bytes, args.runs))
        res["meta"]["contention"] = c = meter.stop()
        warn_if_busy(c, progress=progress)
        res["table"] = rows = build_table(res)
        write_json(args.out, res)
        print(f"# mq cleaner benchmark: other CPUs {c['other_cpus']:.2f}, steal "
              f"{c['steal_cpus']:.2f}, load {c['loadavg_1m']:.1f}; JSON in {args.out}")
        print(format_table(rows))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
