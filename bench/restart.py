"""Restart benchmark: how long ``LogManager.open`` takes after a kill -9, against the bytes
the last flush did not cover, the batch size and the segment size; this code against an
older checkout (``--old``) in the same run.

Not a test: one command, prints a table on stdout, writes every raw number as JSON, shows
progress on stderr and removes the data it writes::

    python3 -m bench.restart [--quick] [--old /tmp/oldmq] [--out bench/out/restart.json]

Each case builds a data dir once, in a child process that does what the broker's loop does
with ``LogManager``: append batches, ``flush_all`` (fsync, then checkpoint) every
``FLUSH_EVERY_BYTES`` as the 1 s flush would, one last ``flush_all``, then append the
case's unflushed bytes and die with ``os._exit`` (kill -9: the page cache keeps every
written byte, the preallocated index files stay as they were). The issue's two rows use a
real broker instead: producers send through the socket, the broker is idle (everything
flushed and checkpointed), and it is killed with SIGKILL.

Each run copies the crashed dir (untimed) and times ``LogManager.open`` on the copy in a
fresh Python process (imports untimed), with this tree or the ``--old`` one on
``PYTHONPATH``, in an order rotated run by run; "clean" is the same data after a clean
close. Figures are medians of ``--runs`` runs (min-max).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback

from bench.harness import (
    MIB,
    CpuMeter,
    Rows,
    add_run_arguments,
    finish_run,
    machine_facts,
    mm,
    progress_printer,
    rotated,
    summary,
    wait_idle,
    warn_if_busy,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLUSH_EVERY_BYTES = 4 * MIB          # the 1 s flush at ~4 MB/s of appends
T0_MS = 1_700_000_000_000
progress = progress_printer("restart")

# Run in a fresh interpreter: open the data dir, print the time and what recovery did, and
# leave without closing (the copy is thrown away).
_OPEN = r"""
import json, os, sys, time
from mq.log.config import LogConfig
from mq.log.manager import LogManager
cfg = LogConfig(segment_bytes=int(sys.argv[2]))
t = time.perf_counter()
mgr = LogManager.open(sys.argv[1], lambda topic: cfg)
dt = time.perf_counter() - t
reports = [lg.recovery_report for lg in mgr]
print(json.dumps({"seconds": dt, "clean": mgr.clean_shutdown,
                  "validated": sum(getattr(r, "bytes_validated", -1) for r in reports),
                  "replayed": sum(getattr(r, "batches_replayed", -1) for r in reports),
                  "truncated": sum(r.bytes_truncated for r in reports)}))
sys.stdout.flush()
os._exit(0)
"""


def _batch(records: int, value_bytes: int) -> bytearray:
    from mq.log.builder import BatchBuilder
    builder = BatchBuilder()
    value = (b"0123456789abcdef" * (value_bytes // 16 + 1))[:value_bytes]
    for i in range(records):
        builder.append(T0_MS + i, None, value)
    return builder.build()


def _stamp_producer(buf: bytearray, producer_id: int, sequence: int) -> None:
    """Make ``buf`` a batch of an idempotent producer (id, epoch 0, ``sequence``), CRC anew."""
    from mq.log.layout import ATTRIBUTES_OFFSET, CRC_OFFSET, PRODUCER_ID_OFFSET, crc32c, field
    struct.pack_into(">qhi", buf, PRODUCER_ID_OFFSET, producer_id, 0, sequence)
    field("crc").pack_into(buf, CRC_OFFSET, crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))


def _build(data: str, case: dict) -> None:
    """In a forked child: write ``case`` into ``data`` as the broker would, then die."""
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"building {case} failed (status {status})")
        return
    code = 1
    try:
        from mq.log.config import LogConfig
        from mq.log.manager import LogManager
        cfg = LogConfig(segment_bytes=case["segment_bytes"])
        mgr = LogManager.open(data, lambda topic: cfg)
        logs = [mgr.create("bench", p) for p in range(case["partitions"])]
        template = _batch(case["records_per_batch"], case["value_bytes"])
        per_batch = case["records_per_batch"]
        producers = case["producers"]
        sequences: dict[tuple[int, int], int] = {}      # (producer, partition) -> next
        total = case["flushed_bytes"] + case["unflushed_bytes"]
        written = since_flush = i = 0
        flushed = case["flushed_bytes"] == 0
        if flushed:
            mgr.flush_all()
        while written < total * case["partitions"]:
            buf = bytearray(template)
            part = i % len(logs)
            if producers:
                key = ((i // len(logs)) % producers, part)
                _stamp_producer(buf, 1000 + key[0], sequences.get(key, 0))
                sequences[key] = sequences.get(key, 0) + per_batch
            logs[part].append(buf, now_ms=T0_MS)
            i += 1
            written += len(buf)
            since_flush += len(buf)
            if not flushed and since_flush >= FLUSH_EVERY_BYTES * case["partitions"]:
                mgr.flush_all()
                since_flush = 0
            if not flushed and written >= case["flushed_bytes"] * case["partitions"]:
                mgr.flush_all()
                flushed = True
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _broker_build(data: str, case: dict) -> None:
    """Write ``case`` through a real broker (this tree) and kill -9 it once it is idle: every
    partition flushed and its recovery point checkpointed."""
    from mq.log import files
    from mq.testing import BrokerProcess, wait_for
    broker = BrokerProcess(data, env={"PYTHONPATH": REPO})
    broker.start()
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _produce(broker.socket, case)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"producing {case} failed")
        from mq.client.admin import Admin
        with Admin(broker.socket) as admin:
            ends = [end for _, end in admin.describe_topic("bench")["offsets"]]
        checkpoint = os.path.join(data, files.RECOVERY_POINT_CHECKPOINT)

        def idle() -> bool:
            points = files.read_checkpoint(checkpoint)
            return all(points.get(("bench", p), -1) >= end for p, end in enumerate(ends))
        wait_for(idle, timeout=60, interval=0.1)
    finally:
        broker.kill()
        broker.close()
        for name in ("mq.sock", "broker.stderr.log"):
            if os.path.exists(os.path.join(data, name)):
                os.unlink(os.path.join(data, name))


def _produce(socket: str, case: dict) -> None:
    from mq.client.admin import Admin
    from mq.client.producer import Producer
    with Admin(socket) as admin:
        admin.create_topic("bench", case["partitions"],
                           {"segment.bytes": case["segment_bytes"]})
    value = b"v" * case["value_bytes"]
    per_producer = case["records"] // max(case["producers"], 1)
    producers = [Producer(socket, acks=0 if not case["producers"] else "all", linger_ms=0,
                          enable_idempotence=bool(case["producers"]))
                 for _ in range(max(case["producers"], 1))]
    try:
        for i in range(per_producer):
            for n, producer in enumerate(producers):
                producer.send("bench", value, partition=(i + n) % case["partitions"])
        for producer in producers:
            producer.flush()
    finally:
        for producer in producers:
            producer.close()


def _time_open(tree: str, data: str, segment_bytes: int) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run([sys.executable, "-c", _OPEN, data, str(segment_bytes)], env=env,
                          capture_output=True, text=True, timeout=900, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"open failed with {tree}:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _clean_copy(crashed: str, clean: str, segment_bytes: int) -> None:
    """``crashed`` recovered and closed cleanly (this tree), as ``clean``."""
    shutil.copytree(crashed, clean)
    code = (f"from mq.log.config import LogConfig\nfrom mq.log.manager import LogManager\n"
            f"cfg = LogConfig(segment_bytes={segment_bytes})\n"
            f"LogManager.open({clean!r}, lambda t: cfg).close()\n")
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=REPO),
                   check=True, timeout=900)


def measure(base: str, name: str, crashed: str, segment_bytes: int, trees: dict[str, str],
            runs: int, clean: bool = True) -> dict:
    """Time open after the crash with each tree, and a clean open (this tree)."""
    sides = {f"crash {label}": (tree, crashed) for label, tree in trees.items()}
    if clean:
        clean_dir = os.path.join(base, f"{name}-clean")
        _clean_copy(crashed, clean_dir, segment_bytes)
        sides["clean new"] = (REPO, clean_dir)
    out: dict = {side: [] for side in sides}
    for r in range(runs):
        for side in rotated(list(sides), r):
            tree, src = sides[side]
            copy = os.path.join(base, f"{name}-run")
            shutil.copytree(src, copy)
            try:
                out[side].append(_time_open(tree, copy, segment_bytes))
            finally:
                shutil.rmtree(copy)
    if clean:
        shutil.rmtree(clean_dir)
    res = {}
    for side, got in out.items():
        res[side] = {**summary([g["seconds"] for g in got]), "unit": "s",
                     "validated_bytes": got[-1]["validated"],
                     "replayed_batches": got[-1]["replayed"],
                     "truncated_bytes": got[-1]["truncated"]}
    return res


def _case(*, partitions=1, producers=0, records_per_batch=1, value_bytes=100,
          flushed_mib=64.0, unflushed_mib=1.0, segment_mib=1024) -> dict:
    return {"partitions": partitions, "producers": producers,
            "records_per_batch": records_per_batch, "value_bytes": value_bytes,
            "flushed_bytes": int(flushed_mib * MIB), "unflushed_bytes": int(unflushed_mib * MIB),
            "segment_bytes": segment_mib * MIB}


def sweeps(quick: bool) -> dict[str, list[tuple[str, dict]]]:
    """The cases: (label, case) per sweep. One thing varies in each."""
    scale = 0.25 if quick else 1.0
    kib1 = {"records_per_batch": 9, "value_bytes": 100}        # ~1 KiB batches
    return {
        "unflushed bytes (1 KiB batches, 256 MiB flushed before)": [
            (f"{u:g} MiB unflushed", _case(**kib1, flushed_mib=256 * scale, unflushed_mib=u))
            for u in (0, 1, 4, 16, 64)],
        "batch size (64 MiB flushed, 4 MiB unflushed)": [
            (f"{label} batches", _case(records_per_batch=n, flushed_mib=64 * scale,
                                       unflushed_mib=4))
            for label, n in (("170 B", 1), ("1 KiB", 9), ("16 KiB", 150))],
        "segment size (1 KiB batches, the segment filled, 1 MiB unflushed)": [
            (f"{s} MiB segment", _case(**kib1, flushed_mib=s * scale - 1, unflushed_mib=1,
                                       segment_mib=s))
            for s in (16, 64, 256)],
    }


def issue_cases(quick: bool) -> list[tuple[str, dict]]:
    """The issue's two data dirs, everything flushed before the kill: through a real broker
    killed with SIGKILL, and the same shapes written at the log layer."""
    scale = 0.25 if quick else 1.0
    return [
        ("broker: one partition, 300 k records of 100 B (acks=0, linger_ms=0)",
         {"via": "broker", "partitions": 1, "producers": 0, "records": int(300_000 * scale),
          "value_bytes": 100, "segment_bytes": 1 << 30}),
        ("broker: 8 partitions, 4 idempotent producers (acks=all), 600 k records of 100 B",
         {"via": "broker", "partitions": 8, "producers": 4, "records": int(600_000 * scale),
          "value_bytes": 100, "segment_bytes": 1 << 30}),
        ("one partition, 300 k batches of 100 B, all flushed",
         _case(flushed_mib=300_000 * 170 * scale / MIB, unflushed_mib=0)),
        ("8 partitions x 24 MiB, 4 idempotent producers, 730 B batches, all flushed",
         _case(partitions=8, producers=4, records_per_batch=6, flushed_mib=24 * scale,
               unflushed_mib=0)),
        ("the same, then 4 MiB a partition unflushed (32 MiB in all)",
         _case(partitions=8, producers=4, records_per_batch=6, flushed_mib=24 * scale,
               unflushed_mib=4)),
    ]


def run(base: str, trees: dict[str, str], runs: int, quick: bool) -> dict:
    res: dict = {"issue": [], "sweeps": {}}
    for label, case in issue_cases(quick):
        res["issue"].append(_run_case(base, label, case, trees, runs))
    for sweep, cases in sweeps(quick).items():
        res["sweeps"][sweep] = [_run_case(base, label, case, trees, runs, clean=False)
                                for label, case in cases]
    return res


def _run_case(base: str, label: str, case: dict, trees: dict[str, str], runs: int,
              clean: bool = True) -> dict:
    crashed = os.path.join(base, "crashed")
    progress(f"building: {label}")
    t = time.perf_counter()
    (_broker_build if case.get("via") == "broker" else _build)(crashed, case)
    built = time.perf_counter() - t
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(crashed)
               for f in fs if f.endswith(".log"))
    progress(f"  {size / MIB:.0f} MiB of .log in {built:.1f} s; timing opens")
    got = measure(base, "case", crashed, case["segment_bytes"], trees, runs, clean)
    shutil.rmtree(crashed)
    return {"label": label, "case": case, "log_bytes": size, **got}


def _fmt(s: dict) -> str:
    return mm(s, lambda v: f"{v * 1000:.0f}" if v >= 0.1 else f"{v * 1000:.1f}")


def build_table(res: dict) -> Rows:
    rows = Rows()

    def add(item: dict, prefix: str = "") -> None:
        new = item["crash new"]
        old = item.get("crash old")
        ratio = f"{old['median'] / new['median']:.1f}x faster than old" if old else "-"
        rows.add(f"{prefix}{item['label']}: after kill -9", _fmt(new), "ms", ratio)
        if old:
            rows.add(f"{prefix}  old code", _fmt(old), "ms")
        if "clean new" in item:
            rows.add(f"{prefix}  clean restart", _fmt(item["clean new"]), "ms")
        rows.add(f"{prefix}  validated / replayed (new)",
                 f"{new['validated_bytes'] / MIB:.1f} MiB / {new['replayed_batches']} batches",
                 "-")
    for item in res["issue"]:
        add(item)
    for sweep, items in res["sweeps"].items():
        rows.add(f"sweep: {sweep}", "", "")
        for item in items:
            add(item, "  ")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.restart", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a quarter of the data")
    p.add_argument("--old", default=None, metavar="TREE",
                   help="a checkout of older code to time beside this one")
    p.add_argument("--runs", type=int, default=5, help="repetitions (>= 5)")
    add_run_arguments(p, "restart")
    args = p.parse_args(argv)
    trees = {"new": REPO}
    if args.old:
        trees["old"] = os.path.abspath(args.old)
    base = tempfile.mkdtemp(prefix="mq-bench-restart-", dir=args.dir)
    started = time.monotonic()
    try:
        idle = wait_idle(args.wait_idle, progress=progress)
        res: dict = {"meta": machine_facts(base, wait_idle=idle, old_tree=args.old),
                     "params": {"quick": args.quick, "runs": args.runs,
                                "flush_every_bytes": FLUSH_EVERY_BYTES}}
        meter = CpuMeter()
        res.update(run(base, trees, args.runs, args.quick))
        c = meter.stop()
        res["meta"]["contention"] = {"run": c}
        warn_if_busy(c, progress=progress)
        finish_run("mq restart benchmark", res, build_table, args.out,
                   time.monotonic() - started, f"{args.runs} runs")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
