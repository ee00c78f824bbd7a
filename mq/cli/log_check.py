"""``mq log check``: verify (or, with ``--repair``, recover) partition directories offline.

The logic lives in ``mq.log.check``; this module parses arguments and prints. Problems go to
stdout, one per line (one JSON object per line with ``--json``); a directory that cannot be
checked at all, and the verdict for a directory with problems, go to stderr as one
``mq: error:`` line each.
"""

from __future__ import annotations

import argparse
import os
import sys

from mq.cli import json_line, log_kafka, print_error
from mq.cli.common import plural, run_each
from mq.log.check import CheckResult, RepairResult, check_partition, repair_partition

__all__ = ["add_parser", "run"]

LOG_DESCRIPTION = """\
Offline tools for partition directories (<data-dir>/<topic>-<partition>), run without a
broker: check (and repair) them, and copy a topic between mq's data dir and a stopped Apache
Kafka broker's log dir."""

CHECK_DESCRIPTION = """\
Verify partition directories without a broker and without changing anything: every batch
frames, has a valid CRC and decodes; offsets increase within and across segments; the .index
and .timeindex files exist, agree with the .log and are trimmed; no leftovers of interrupted
changes (.deleted, .cleaned, .swap, .tmp files, an index without its .log).

A directory whose segment files are not all regular files (a FIFO, a directory named *.log)
is refused without opening them. Under a live broker (one holding the data dir's .lock) the
active segment is being written: its preallocated indexes and unfinished tail are expected and
not reported, nor are the broker's pending deletes."""

CHECK_EPILOG = """\
output:
  a clean directory prints  DIR: OK: 3 segments, 120 batches, 6000 records, offsets 0..5999, ...
  each problem prints one line naming the file and byte position, e.g.
    DIR/00000000000000000000.log at byte 8192: CRC mismatch: stored 0x..., computed 0x...
  --json prints one object per problem instead (nothing for a clean directory):
    {"dir", "file", "kind", "position", "message"}
  kinds: corrupt-batch, torn-tail, offset-order, unsupported-codec, index-mismatch,
  index-corrupt, index-untrimmed, index-missing, orphan-index, leftover

--repair does what the broker does at an unclean start: it truncates each segment at its first
torn or invalid batch (dropping every later segment), rebuilds the indexes and removes or
finishes leftovers. It then prints what changed, one line per file (with --json, one object
per directory), and checks the directory again. Stop the broker first: --repair refuses to run
while another process (a live broker) holds the data directory's lock.

exit status: 0 when every directory is clean (or was repaired clean); 1 when problems were
found (or remain after --repair) or a directory could not be checked; 2 for bad arguments.

examples:
  mq log check ~/.local/state/mq/orders-0
  mq log check --json DIR/orders-* | jq -r .message
  mq log check --repair DIR/orders-3"""


def add_parser(subparsers) -> None:
    log_parser = subparsers.add_parser(
        "log", help="offline tools for partition directories (check, export-kafka, "
                    "import-kafka)",
        description=LOG_DESCRIPTION,
        epilog="examples:\n  mq log check DIR/orders-0\n  mq log check --repair DIR/orders-0\n"
               "  mq log export-kafka orders --kafka-log-dir /var/lib/kafka/data\n"
               "  mq log import-kafka orders --kafka-log-dir /var/lib/kafka/data",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    log_commands = log_parser.add_subparsers(title="commands", metavar="COMMAND",
                                             dest="log_command")
    log_commands.required = True
    check = log_commands.add_parser(
        "check", help="verify partition directories (and --repair them) without a broker",
        description=CHECK_DESCRIPTION, epilog=CHECK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("dirs", nargs="+", metavar="PARTITION_DIR",
                       help="a partition directory, e.g. <data-dir>/orders-0")
    check.add_argument("--repair", action="store_true",
                       help="truncate at the first invalid batch, rebuild indexes, remove "
                            "leftovers (what the broker does at an unclean start)")
    check.add_argument("--json", action="store_true",
                       help="one JSON object per problem (per directory with --repair)")
    check.set_defaults(run=run)
    log_kafka.add_commands(log_commands)


def run(args: argparse.Namespace) -> int:
    action = _repair if args.repair else _check
    return run_each(args.dirs, lambda directory: action(directory, args.json))


def _print_problems(directory: str, result: CheckResult, as_json: bool) -> None:
    write = sys.stdout.write
    for problem in result.problems:
        write(json_line({"dir": directory, **problem.as_dict()}) if as_json
              else problem.message + "\n")


def _check(directory: str, as_json: bool) -> bool:
    result = check_partition(directory)
    _print_problems(directory, result, as_json)
    if result.clean:
        if not as_json:
            live = (f" (a live broker owns {os.path.dirname(os.path.abspath(directory))}: its "
                    "active segment is being written, so its preallocated indexes are "
                    "expected)") if result.live_broker else ""
            sys.stdout.write(f"{directory}: OK: {result.summary()}{live}\n")
        return True
    print_error(f"{directory}: {plural(len(result.problems), 'problem')} found; 'mq log check "
                f"--repair {directory}' recovers it as the broker would (stop the broker first)")
    return False


def _repair(directory: str, as_json: bool) -> bool:
    result: RepairResult = repair_partition(directory)
    report, after = result.report, result.after
    write = sys.stdout.write
    if as_json:
        write(json_line({
            "dir": directory,
            "repaired": bool(result.changes),
            "bytesTruncated": report.bytes_truncated,
            "segmentsRecovered": report.segments_recovered,
            "segmentsDropped": report.segments_dropped,
            "indexesRebuilt": sum(c.action == "rebuilt" for c in result.changes),
            "leftoversRemoved": sorted(report.leftovers_removed),
            "swapsCompleted": sorted(report.swaps_completed),
            "changes": [c.as_dict() for c in result.changes],
            "clean": after.clean,
            "problems": [p.as_dict() for p in after.problems]}))
    else:
        for change in result.changes:
            write(f"{directory}: {change.describe()}\n")
        if not result.changes:
            write(f"{directory}: nothing to repair\n")
        _print_problems(directory, after, False)
        if after.clean:
            write(f"{directory}: OK: {after.summary()}\n")
    if after.clean:
        return True
    print_error(f"{directory}: {plural(len(after.problems), 'problem')} remain that --repair "
                "cannot fix")
    return False
