"""``mq dump-log``: Kafka's DumpLogSegments for ``.log``, ``.index``, ``.timeindex``,
``.txnindex`` and ``.snapshot`` (producer state) files.

Files are opened read-only and streamed: a ``.log`` is read in 1 MiB chunks through
``LogSegment(read_only=True).batches()``, an index through a read-only map, so a 1 GiB segment
never sits in memory and nothing on disk changes. Text output follows Kafka's tool line for line
(field names, order, ``| offset: ...`` record lines); ``--json`` is the contract of
``docs/api.md`` ("The command line"): one object per batch (or index entry) per line.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from collections.abc import Callable

from mq.cli import json_line
from mq.cli.common import run_each
from mq.errors import CorruptIndexError, CorruptRecordError, StorageError
from mq.log import files
from mq.log.batch import RecordBatch
from mq.log.check import Problem, index_entries, require_regular_file, scan_segment
from mq.log.config import LogConfig
from mq.log.index import OffsetIndex, TimeIndex
from mq.log.layout import CONTROL_KEY, END_TXN_VALUE, LOG_APPEND_TIME
from mq.log.producer_state import decode_snapshot
from mq.log.segment import LogSegment
from mq.log.txnindex import read_entries

__all__ = ["Dumper", "add_parser", "json_bytes", "run", "timestamp_type_name"]

_CONFIG = LogConfig()
_KINDS = (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX, files.TXNINDEX_SUFFIX,
          files.SNAPSHOT_SUFFIX)

# Text output keeps one record per line: control characters become escapes.
_ESCAPES = {i: f"\\x{i:02x}" for i in range(0x20)}
_ESCAPES.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x7F: "\\x7f"})

DESCRIPTION = """\
Print what a log segment file holds, as Kafka's kafka-dump-log (DumpLogSegments) does:
the batches of a .log, the entries of a .index, .timeindex or .txnindex, the producers of a
.snapshot. Files are opened read-only and streamed; segments of any size work and nothing on
disk changes."""

EPILOG = """\
output (text):
  .log        Dumping FILE / Log starting offset: N, then one line per batch:
                baseOffset: 0 lastOffset: 4 count: 5 baseSequence: -1 lastSequence: -1
                producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false
                isControl: false deleteHorizonMs: OptionalLong.empty position: 0
                CreateTime: 1000 size: 616 magic: 2 compresscodec: none crc: 123 isvalid: true
              with --deep-iteration, one line per record under its batch:
                | offset: 0 CreateTime: 1000 keySize: 2 valueSize: 5 sequence: -1 headerKeys: [h]
              --print-data adds ' key: k0 payload: hello' (transaction markers show
              ' endTxnMarker: COMMIT coordinatorEpoch: 0' instead).
  .index      offset: N position: P        one line per entry ('FILE is empty.' if none)
  .timeindex  timestamp: T offset: N       one line per entry
  .txnindex   version: 0 producerId: P firstOffset: F lastOffset: L lastStableOffset: S
              one line per aborted transaction (L is its ABORT marker)
  .snapshot   producerId: P producerEpoch: E coordinatorEpoch: C currentTxnFirstOffset:
              OptionalLong[O] (OptionalLong.empty without an open transaction) lastTimestamp:
              T, then for its last batch firstSequence: F lastSequence: S lastOffset: L
              offsetDelta: D timestamp: T; one line per producer

output (--json, one object per line):
  per batch   {"baseOffset", "lastOffset", "count", "position", "createTime" (the batch's max
              timestamp), "size", "magic", "compresscodec", "crc", "isValid", "producerId",
              "producerEpoch", "baseSequence", "isTransactional", "isControl"}, and with
              --print-data "records": [{"offset", "timestamp", "key", "value",
              "headers": [{"key", "value"}, ...]}, ...]
  per entry   {"offset", "position"} (.index) or {"timestamp", "offset"} (.timeindex),
              {"version", "producerId", "firstOffset", "lastOffset", "lastStableOffset"}
              (.txnindex), {"producerId", "producerEpoch", "coordinatorEpoch",
              "currentTxnFirstOffset", "lastTimestamp", "lastSequence", "lastOffset",
              "offsetDelta"} (.snapshot)

keys, values and header values:
  --json      a string when the bytes are valid UTF-8; null when absent (a null key, a
              tombstone); otherwise {"base64": "<standard base64 of the bytes>"}
  text        decoded as UTF-8; control characters and invalid UTF-8 bytes print as escapes
              (\\n, \\t, \\xNN); an absent key or value is left out (its size shows -1)

--verify-index-only checks every entry of a .index or .timeindex against the .log next to it
(for a .log: both of its indexes) and prints only the mismatches: an offset-index entry must
name a batch start and that batch's last offset; a time-index entry must name a batch's last
offset and the largest timestamp in the segment up to that batch.

exit status: 0 when every file is fine; 1 when a file is missing, unreadable, not a segment
file or corrupt (the valid batches print first, then one 'mq: error: FILE at byte N: ...' line
on stderr), or when --verify-index-only finds mismatches; 2 for bad arguments.

examples:
  mq dump-log DIR/orders-0/00000000000000000000.log
  mq dump-log --print-data DIR/orders-0/00000000000000000000.log | head -20
  mq dump-log --json --print-data DIR/orders-0/00000000000000000000.log | jq -c '.records[]'
  mq dump-log DIR/orders-0/00000000000000000000.index DIR/orders-0/00000000000000000000.timeindex
  mq dump-log --verify-index-only DIR/orders-0/*.index"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "dump-log", help="print the batches and records of .log, .index and .timeindex files",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="segment files: <base offset>.log, .index or .timeindex")
    parser.add_argument("--print-data", action="store_true",
                        help="print every record with its key and value (implies "
                             "--deep-iteration)")
    parser.add_argument("--deep-iteration", action="store_true",
                        help="decode every record (decompressing batches) and print its "
                             "metadata")
    parser.add_argument("--verify-index-only", action="store_true",
                        help="check index entries against the .log; print only mismatches")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per batch or index entry per line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    dumper = Dumper(print_data=args.print_data, deep_iteration=args.deep_iteration,
                    verify_index_only=args.verify_index_only, as_json=args.json)
    return run_each(args.files, dumper.dump)


# --- formatting -------------------------------------------------------------------------------

def text(data) -> str:
    """Bytes as one line of text: UTF-8, with control characters and bad bytes escaped."""
    return bytes(data).decode("utf-8", "backslashreplace").translate(_ESCAPES)


def json_bytes(data):
    """Bytes for ``--json``: text when valid UTF-8, None when absent, else ``{"base64": ...}``."""
    if data is None:
        return None
    raw = bytes(data)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode("ascii")}


def timestamp_type_name(timestamp_type: int) -> str:
    """Kafka's name of a batch's (or record's) timestamp type."""
    return "LogAppendTime" if timestamp_type == LOG_APPEND_TIME else "CreateTime"


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def batch_line(batch: RecordBatch, valid: bool) -> str:
    """Kafka's DumpLogSegments line for one batch."""
    horizon = (f"OptionalLong[{batch.delete_horizon_ms}]" if batch.has_delete_horizon
               else "OptionalLong.empty")
    return (f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset} "
            f"count: {batch.records_count} baseSequence: {batch.base_sequence} "
            f"lastSequence: {batch.last_sequence} producerId: {batch.producer_id} "
            f"producerEpoch: {batch.producer_epoch} "
            f"partitionLeaderEpoch: {batch.partition_leader_epoch} "
            f"isTransactional: {_bool(batch.is_transactional)} "
            f"isControl: {_bool(batch.is_control)} deleteHorizonMs: {horizon} "
            f"position: {batch.position} {timestamp_type_name(batch.timestamp_type)}: "
            f"{batch.max_timestamp} size: {batch.size} "
            f"magic: {batch.magic} compresscodec: {batch.compression_name} crc: {batch.crc} "
            f"isvalid: {_bool(valid)}")


def _control_text(record) -> str:
    key = b"" if record.key is None else bytes(record.key)
    value = b"" if record.value is None else bytes(record.value)
    if len(key) < CONTROL_KEY.size:
        return " controlType: unknown"
    _, control_type = CONTROL_KEY.unpack_from(key)
    if control_type in (0, 1) and len(value) >= END_TXN_VALUE.size:
        _, coordinator_epoch = END_TXN_VALUE.unpack_from(value)
        marker = "COMMIT" if control_type == 1 else "ABORT"
        return f" endTxnMarker: {marker} coordinatorEpoch: {coordinator_epoch}"
    return f" controlType: {control_type}"


def record_line(batch: RecordBatch, record, print_data: bool) -> str:
    """Kafka's ``| offset: ...`` line for one record of ``batch``."""
    key_size = -1 if record.key is None else len(record.key)
    value_size = -1 if record.value is None else len(record.value)
    sequence = (-1 if batch.base_sequence < 0
                else (batch.base_sequence + record.offset - batch.base_offset) & 0x7FFFFFFF)
    header_keys = ",".join(k for k, _ in record.headers)
    line = (f"| offset: {record.offset} {timestamp_type_name(batch.timestamp_type)}: "
            f"{record.timestamp} keySize: {key_size} "
            f"valueSize: {value_size} sequence: {sequence} headerKeys: [{header_keys}]")
    if batch.is_control:
        line += _control_text(record)
    elif print_data:
        if record.key is not None:
            line += f" key: {text(record.key)}"
        if record.value is not None:
            line += f" payload: {text(record.value)}"
    return line


def batch_json(batch: RecordBatch, valid: bool, records=None) -> dict:
    """The ``--json`` object (``docs/api.md``) for one batch (with ``records`` when given)."""
    obj = {"baseOffset": batch.base_offset, "lastOffset": batch.last_offset,
           "count": batch.records_count, "position": batch.position,
           "createTime": batch.max_timestamp, "size": batch.size, "magic": batch.magic,
           "compresscodec": batch.compression_name, "crc": batch.crc, "isValid": valid,
           "producerId": batch.producer_id, "producerEpoch": batch.producer_epoch,
           "baseSequence": batch.base_sequence, "isTransactional": batch.is_transactional,
           "isControl": batch.is_control}
    if records is not None:
        obj["records"] = [
            {"offset": r.offset, "timestamp": r.timestamp, "key": json_bytes(r.key),
             "value": json_bytes(r.value),
             "headers": [{"key": k, "value": json_bytes(v)} for k, v in r.headers]}
            for r in records]
    return obj


# --- dumping ----------------------------------------------------------------------------------

def _snapshot_line(e) -> str:
    """Kafka's DumpLogSegments line for one producer of a snapshot."""
    txn = e.current_txn_first_offset
    line = (f"producerId: {e.producer_id} producerEpoch: {e.epoch} "
            f"coordinatorEpoch: {e.coordinator_epoch} currentTxnFirstOffset: "
            f"{f'OptionalLong[{txn}]' if txn >= 0 else 'OptionalLong.empty'} "
            f"lastTimestamp: {e.last_timestamp}")
    if e.batches:
        b = e.batches[-1]
        line += (f" firstSequence: {b.first_seq} lastSequence: {b.last_seq} "
                 f"lastOffset: {b.last_offset} offsetDelta: {b.offset_delta} "
                 f"timestamp: {b.timestamp}")
    return line


def _segment_file(path: str) -> tuple[str, int, str, str]:
    """(directory, base offset, kind, suffix) of a segment file; raises ``OSError`` or
    ``StorageError`` naming the problem. Anything but a regular file is refused before it is
    opened (opening a FIFO would block)."""
    require_regular_file(path)                      # also FileNotFoundError, PermissionError
    name = os.path.basename(path)
    parsed = files.parse_segment_name(name)
    if parsed is None or parsed[1] not in _KINDS:
        kind = parsed[1] if parsed else os.path.splitext(name)[1] or "(none)"
        raise StorageError(f"{path}: not a segment file this tool reads (suffix {kind}); "
                           "expected <20-digit base offset>.log, .index, .timeindex, "
                           ".txnindex or .snapshot, e.g. 00000000000000000000.log")
    base, kind, suffix = parsed
    return os.path.dirname(path), base, kind, suffix


class Dumper:
    """Dumps files to ``write`` (default: stdout). ``dump`` returns False when it found
    mismatches (``--verify-index-only``) and raises ``MQError``/``OSError`` for bad input,
    after writing everything valid before the problem."""

    def __init__(self, *, print_data: bool = False, deep_iteration: bool = False,
                 verify_index_only: bool = False, as_json: bool = False,
                 write: Callable[[str], object] | None = None) -> None:
        self.print_data = print_data
        self.deep = deep_iteration or print_data
        self.verify_only = verify_index_only
        self.as_json = as_json
        self.write = write or sys.stdout.write

    def dump(self, path: str, max_batches: int | None = None) -> bool:
        directory, base, kind, suffix = _segment_file(path)
        if not self.as_json:
            self.write(f"Dumping {path}\n")
        if kind in (files.TXNINDEX_SUFFIX, files.SNAPSHOT_SUFFIX):
            if self.verify_only:
                raise StorageError(f"{path}: --verify-index-only checks .index and .timeindex "
                                   "files (or a .log's)")
            (self._dump_txnindex if kind == files.TXNINDEX_SUFFIX else self._dump_snapshot)(path)
            return True
        if self.verify_only:
            kinds = (files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX) if kind == files.LOG_SUFFIX \
                else (kind,)
            return self._verify(path, directory, base, suffix, kinds)
        if kind == files.LOG_SUFFIX:
            self._dump_log(path, directory, base, suffix, max_batches)
        else:
            self._dump_index(path, base, kind)
        return True

    def _dump_txnindex(self, path: str) -> None:
        for t in read_entries(path):
            obj = {"version": 0, "producerId": t.producer_id, "firstOffset": t.first_offset,
                   "lastOffset": t.last_offset, "lastStableOffset": t.last_stable_offset}
            self.write(json_line(obj) if self.as_json
                       else " ".join(f"{k}: {v}" for k, v in obj.items()) + "\n")

    def _dump_snapshot(self, path: str) -> None:
        with open(path, "rb") as f:
            entries = decode_snapshot(f.read(), path)
        for e in entries:
            last = e.batches[-1] if e.batches else None
            obj = {"producerId": e.producer_id, "producerEpoch": e.epoch,
                   "coordinatorEpoch": e.coordinator_epoch,
                   "currentTxnFirstOffset": e.current_txn_first_offset,
                   "lastTimestamp": e.last_timestamp,
                   "lastSequence": last.last_seq if last else -1,
                   "lastOffset": last.last_offset if last else -1,
                   "offsetDelta": last.offset_delta if last else 0}
            self.write(json_line(obj) if self.as_json else _snapshot_line(e) + "\n")

    def _dump_log(self, path: str, directory: str, base: int, suffix: str,
                  max_batches: int | None) -> None:
        write = self.write
        if not self.as_json:
            write(f"Log starting offset: {base}\n")
        seg = LogSegment(directory, base, _CONFIG, suffix=suffix, read_only=True)
        first_invalid: CorruptRecordError | None = None
        end = 0
        try:
            for n, batch in enumerate(seg.batches()):
                if max_batches is not None and n >= max_batches:
                    return
                try:
                    batch.validate()
                    valid = True
                except CorruptRecordError as err:
                    valid = False
                    first_invalid = first_invalid or err
                if self.as_json:
                    records = batch.records() if self.deep else None
                    write(json_line(batch_json(batch, valid,
                                               records if self.print_data else None)))
                else:
                    write(batch_line(batch, valid) + "\n")
                    if self.deep:
                        write("".join(record_line(batch, r, self.print_data) + "\n"
                                      for r in batch.records()))
                end = batch.position + batch.size
        finally:
            seg.close()
        if end != seg.size:
            raise CorruptRecordError(seg.log_path, end, f"torn batch: {seg.size - end} bytes "
                                     "after the last whole batch")
        if first_invalid is not None:
            raise first_invalid

    def _dump_index(self, path: str, base: int, kind: str) -> None:
        cls = OffsetIndex if kind == files.INDEX_SUFFIX else TimeIndex
        write = self.write
        with cls(path, base, writable=False) as index:
            if kind == files.INDEX_SUFFIX and index.entries == 0 and not self.as_json:
                write(f"{path} is empty.\n")             # Kafka's words
            for slot in range(index_entries(index)):
                a, b = index.entry(slot)
                if kind == files.INDEX_SUFFIX:
                    write(json_line({"offset": a, "position": b}) if self.as_json
                          else f"offset: {a} position: {b}\n")
                else:
                    write(json_line({"timestamp": a, "offset": b}) if self.as_json
                          else f"timestamp: {a} offset: {b}\n")
            size = cls.ENTRY.size
            if index.file_length % size:
                raise CorruptIndexError(path, f"length {index.file_length} is not a multiple of "
                                        f"the {size}-byte entry size")

    def _verify(self, path: str, directory: str, base: int, suffix: str,
                kinds: tuple[str, ...]) -> bool:
        log_path = os.path.join(directory, files.segment_name(base, files.LOG_SUFFIX) + suffix)
        if not os.path.exists(log_path):
            raise StorageError(f"{path}: cannot verify without its log: {log_path} does not "
                               "exist")
        require_regular_file(log_path)
        mismatches = 0

        def report(problem: Problem) -> None:
            nonlocal mismatches
            mismatches += 1
            self.write(json_line(problem.as_dict()) if self.as_json else problem.message + "\n")

        seg = LogSegment(directory, base, _CONFIG, suffix=suffix, read_only=True)
        try:
            scan = scan_segment(seg, validate=False, decode_records=False,
                                offset_index=files.INDEX_SUFFIX in kinds,
                                time_index=files.TIMEINDEX_SUFFIX in kinds,
                                on_index_problem=report, untrimmed_is_problem=False)
        finally:
            seg.close()
        log_problem = None
        for problem in scan.problems:
            if problem.path == scan.path:
                log_problem = log_problem or problem
            else:
                report(problem)                     # an index length of partial entries
        if log_problem is not None:
            raise StorageError(log_problem.message)
        if not mismatches and not self.as_json:
            self.write(f"No mismatches: every entry agrees with {log_path}\n")
        return not mismatches
