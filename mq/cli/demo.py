"""``mq demo``: the README's "run" command until the broker exists.

It writes a real topic through ``LogManager`` (a few partitions, a few thousand keyed records
with headers, several codecs, small segments so that they roll), shuts it down cleanly, prints
a summary, dumps the start of the first segment as ``mq dump-log --print-data`` would and runs
``mq log check`` on every partition. It takes well under a few seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from mq.cli.dump_log import Dumper
from mq.log import files
from mq.log.check import check_partition
from mq.log.config import LogConfig
from mq.log.manager import LogManager
from mq.log.records import BatchBuilder, available_codecs, codec_from_name

__all__ = ["add_parser", "run"]

TOPIC = "demo"
RECORDS_PER_BATCH = 50
SEGMENT_BYTES = 32 * 1024          # small, so that each partition rolls a few segments
INDEX_INTERVAL_BYTES = 1024
DUMP_LINES = 12
_ITEMS = ("keyboard", "monitor", "mouse", "laptop", "headset", "webcam", "dock")

DESCRIPTION = """\
Write a small real topic to a data directory (through the storage engine, no broker needed),
then show it: a summary, the first records as 'mq dump-log --print-data' prints them, and
'mq log check' on every partition. The data directory is kept so that you can explore it."""

EPILOG = """\
examples:
  mq demo
  mq demo --data-dir /tmp/mq-demo --partitions 4 --records 20000
  mq dump-log --print-data /tmp/mq-demo/demo-0/00000000000000000000.log | head"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="write, dump and check a small demo topic (no broker needed)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", metavar="DIR",
                        help="data directory to write to (default: a new temporary directory)")
    parser.add_argument("--partitions", type=int, default=3, metavar="N",
                        help="partitions of the demo topic (default 3)")
    parser.add_argument("--records", type=int, default=6000, metavar="N",
                        help="records to write (default 6000)")
    parser.set_defaults(run=run)


def _write(data_dir: str, partitions: int, records: int) -> tuple[int, int, list[str]]:
    """Write ``records`` records round-robin in batches; returns (batches, bytes, codecs)."""
    config = LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=INDEX_INTERVAL_BYTES)
    codecs = [c for c in ("none", "gzip", "lz4", "zstd") if available_codecs()[c]]
    base_ts = int(time.time() * 1000) - records
    batches = size = written = 0
    with LogManager.open(data_dir, config_for=lambda topic: config) as manager:
        logs = [manager.create(TOPIC, p) for p in range(partitions)]
        while written < records:
            codec = codecs[(batches // partitions) % len(codecs)]
            builder = BatchBuilder(compression=codec_from_name(codec))
            for _ in range(min(RECORDS_PER_BATCH, records - written)):
                n = written
                value = json.dumps({"order": n, "item": _ITEMS[n % len(_ITEMS)],
                                    "quantity": 1 + n % 5, "priceCents": 499 + 37 * (n % 50)})
                builder.append(base_ts + n, f"customer-{n % 97}".encode(), value.encode(),
                               [("source", b"mq-demo"), ("trace-id", f"{n:08x}".encode())])
                written += 1
            size += logs[batches % partitions].append(builder.build()).size
            batches += 1
    return batches, size, codecs


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.partitions <= 64:
        raise ValueError(f"--partitions must be between 1 and 64, got {args.partitions}")
    if not 1 <= args.records <= 10_000_000:
        raise ValueError(f"--records must be between 1 and 10000000, got {args.records}")
    data_dir = os.path.abspath(args.data_dir or tempfile.mkdtemp(prefix="mq-demo-"))
    out = sys.stdout.write

    started = time.perf_counter()
    batches, size, codecs = _write(data_dir, args.partitions, args.records)
    elapsed = max(time.perf_counter() - started, 1e-6)
    out(f"mq demo: wrote {args.records:,} records in {batches:,} batches "
        f"({', '.join(codecs)}) to topic '{TOPIC}' with {args.partitions} partitions\n"
        f"  {elapsed:.2f} s including a clean shutdown: {args.records / elapsed:,.0f} "
        f"records/s, {size / elapsed / 1e6:.1f} MB/s of log\n"
        f"  data dir: {data_dir}\n")
    partition_dirs = [os.path.join(data_dir, files.partition_dir_name(TOPIC, p))
                      for p in range(args.partitions)]
    results = [check_partition(d) for d in partition_dirs]
    for directory, result in zip(partition_dirs, results):
        out(f"  {os.path.basename(directory)}: {result.summary()}\n")

    first = os.path.join(partition_dirs[0], files.segment_name(
        results[0].segments[0].base_offset if results[0].segments else 0, files.LOG_SUFFIX))
    out(f"\n$ mq dump-log --print-data {first}\n")
    lines: list[str] = []
    Dumper(print_data=True, write=lines.append).dump(first, max_batches=1)
    lines = "".join(lines).splitlines()
    out("".join(line + "\n" for line in lines[:DUMP_LINES]))
    if len(lines) > DUMP_LINES:
        out(f"... ({len(lines) - DUMP_LINES} more lines of the first batch; run the command "
            "above for the whole segment)\n")

    out(f"\n$ mq log check {os.path.join(data_dir, TOPIC + '-*')}\n")
    clean = True
    for directory, result in zip(partition_dirs, results):
        for problem in result.problems:
            out(problem.message + "\n")
        if result.clean:
            out(f"{directory}: OK: {result.summary()}\n")
        clean &= result.clean
    out(f"\nExplore it: mq dump-log --print-data --json {first} | head -3\n")
    return 0 if clean else 1
