"""Apache Kafka's own DumpLogSegments run over the files mq wrote, and its output judged against
mq's own reading of the same files.

The tool is ``org.apache.kafka.tools.DumpLogSegments`` in kafka-tools since 4.3.0 (KAFKA-14579;
``kafka.tools.DumpLogSegments`` of kafka_2.13 before, gone from 4.3.1's jar), on the classpath
``javakafka`` resolves. One JVM run takes every file of a *pass* (``--files a,b,…``), a pass
being one set of flags (``RECORDS``, ``OFFSETS``, ``TXN_LOG``, ``SANITY``, ``VERIFY``), so a
data dir costs five short JVM runs (``judge_data_dir``).

The tool exits 0 on most findings, so its output is what is judged (``Judge``):

- stdout is split into sections, one per ``Dumping FILE`` line;
- a ``.log``'s batch and record lines must equal mq's ``mq dump-log`` lines for the file (the
  same words, field for field: offsets, count, sequences, producer id and epoch, leader epoch,
  transactional and control flags, delete horizon, position, timestamp type and value, size,
  codec, CRC, ``isvalid``; per record its offset, timestamp, key and value sizes, sequence,
  header keys, key and payload). With a coordinator decoder the record lines carry the key
  and value as JSON instead (``Decoded``), which must name no unknown record type and no
  error;
- ``.index``, ``.timeindex``, ``.txnindex`` and ``.snapshot`` lines equal mq's;
- stderr holds the tool's findings ("Mismatches in :", "Found timestamp mismatch in :",
  "Found out of order timestamp in :", "The following indexed offsets are not found in the
  log.") and must be empty but for "Non-consecutive offsets in FILE", which must name exactly
  the gaps between record offsets mq reads in that file (the tool counts from -1 in each file,
  so a segment not starting at offset 0 has one, and compaction leaves more);
- ``--index-sanity-check`` (the check Kafka runs on its indexes at startup) must pass for
  every index, and ``--verify-index-only`` print nothing for any.

Every difference is a finding (a line naming the file and what differs); the tests assert
there are none.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
from collections.abc import Iterable

from javakafka import JavaKafka

from mq.cli.dump_log import Dumper
from mq.errors import MQError
from mq.log import files
from mq.log.batch import iter_batches

DUMP_LOG_SEGMENTS = "org.apache.kafka.tools.DumpLogSegments"
SUFFIXES = (files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX,
            files.TXNINDEX_SUFFIX, files.SNAPSHOT_SUFFIX)
INDEXES = (files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX)
OFFSETS_TOPIC = "__consumer_offsets"
TXN_TOPIC = "__transaction_state"
METADATA_TOPIC = "__cluster_metadata"        # mq's own metadata records, not Kafka's

# flags of each pass
RECORDS = ("--deep-iteration", "--print-data-log")
OFFSETS = ("--deep-iteration", "--offsets-decoder")
TXN_LOG = ("--deep-iteration", "--transaction-log-decoder")
SANITY = ("--index-sanity-check",)
VERIFY = ("--verify-index-only",)

_NON_CONSECUTIVE = "Non-consecutive offsets in "
_GAP = re.compile(r"  (-?\d+) is followed by (-?\d+)$")
_TIME_MISMATCH = "Found timestamp mismatch in :"
_TIME_PAIR = re.compile(r"  Index timestamp: (-?\d+), log timestamp: (-?\d+)$")
_FIELD = re.compile(r"(\w+): (\S+)")
# A decoded record line: mq's line, then the decoder's key and value (JSON or "<DELETE>").
_DECODED = re.compile(r" key: (.*?)(?: payload: (.*))?$")


def partition_files(data_dir: str) -> dict[str, list[str]]:
    """``{"topic-0": [absolute paths of its segment files]}`` for every partition dir of
    ``data_dir``, files sorted by name (base offset, then suffix)."""
    out = {}
    for name in sorted(os.listdir(data_dir)):
        directory = os.path.join(data_dir, name)
        if files.parse_partition_dir(name) is None or not os.path.isdir(directory):
            continue
        out[name] = [os.path.join(directory, f) for f in sorted(os.listdir(directory))
                     if f.endswith(SUFFIXES)]
    return out


@dataclasses.dataclass(frozen=True)
class Dump:
    """One run of the tool: ``sections`` maps each file to the lines printed after its
    ``Dumping FILE`` line; ``stderr`` is its error stream, line by line."""
    flags: tuple[str, ...]
    returncode: int
    sections: dict[str, list[str]]
    stderr: list[str]


def run(java: JavaKafka, paths: list[str], flags: tuple[str, ...]) -> Dump:
    """DumpLogSegments with ``flags`` over ``paths``, in one JVM."""
    done = java.run(DUMP_LOG_SEGMENTS, *flags, "--files", ",".join(paths), timeout=300,
                    check=False)
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in done.stdout.splitlines():
        if line.startswith("Dumping "):
            current = sections.setdefault(line[len("Dumping "):], [])
        else:
            current.append(line)
    return Dump(flags, done.returncode, sections, done.stderr.splitlines())


@dataclasses.dataclass(frozen=True)
class Decoded:
    """One record of ``__consumer_offsets`` or ``__transaction_state`` as Kafka's decoder read
    it: the key and value as JSON (value None for a tombstone, Kafka's "<DELETE>")."""
    path: str
    offset: int
    key: dict
    value: dict | None


def mq_lines(path: str, deep: bool, print_data: bool) -> list[str]:
    """What ``mq dump-log`` prints for ``path`` (its ``Dumping`` line left out), and the error
    it ends with on a file it finds corrupt."""
    out = io.StringIO()
    try:
        Dumper(deep_iteration=deep, print_data=print_data, write=out.write).dump(path)
    except MQError as err:
        out.write(f"mq: error: {err}\n")
    return out.getvalue().splitlines()[1:]


def mq_gaps(path: str) -> set[tuple[int, int]]:
    """The pairs of record offsets DumpLogSegments reports as non-consecutive in a ``.log``
    (counting from -1, as it does in each file), from mq's reading of the file."""
    with open(path, "rb") as f:
        data = f.read()
    gaps, last = set(), -1
    for batch in iter_batches(data, path=path):
        for record in batch.records():
            if record.offset != last + 1:
                gaps.add((last, record.offset))
            last = record.offset
    return gaps


def empty_batch_timestamps(log_path: str) -> set[int]:
    """The max timestamps of the batches without records (a cleaner's empty headers) that mq
    reads in a ``.log``."""
    with open(log_path, "rb") as f:
        data = f.read()
    return {b.max_timestamp for b in iter_batches(data, path=log_path) if b.records_count == 0}


def _log_of(index_path: str) -> str:
    return os.path.splitext(index_path)[0] + files.LOG_SUFFIX


def _stderr_sections(lines: list[str]) -> list[tuple[str, list[str]]]:
    """The tool's stderr as (header, its indented lines) pairs."""
    sections: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("  ") and sections:
            sections[-1][1].append(line)
        else:
            sections.append((line, []))
    return sections


def field_differences(kafka: str, mq: str) -> str:
    """The ``name: value`` fields in which two lines differ, or both lines when their fields
    agree (then the difference lies in the free text: a key or a payload)."""
    a, b = dict(_FIELD.findall(kafka)), dict(_FIELD.findall(mq))
    diff = [f"{k}: Kafka {a.get(k)} mq {b.get(k)}" for k in dict.fromkeys([*a, *b])
            if a.get(k) != b.get(k)]
    return "; ".join(diff) if diff else f"Kafka {kafka!r} mq {mq!r}"


class Judge:
    """Collects findings over the passes of one data dir; ``findings`` is empty when Kafka's
    tool and mq agree on every file."""

    def __init__(self) -> None:
        self.findings: list[str] = []
        self.decoded: list[Decoded] = []
        self.files_judged: set[str] = set()

    def _find(self, path: str, what: str) -> None:
        self.findings.append(f"{os.path.relpath(path, os.path.dirname(os.path.dirname(path)))}"
                             f": {what}")

    def _compare(self, path: str, kafka: list[str], mq: list[str]) -> None:
        for n, (k, m) in enumerate(zip(kafka, mq, strict=False)):
            if k != m:
                self._find(path, f"line {n + 1}: {field_differences(k, m)}")
                return
        if len(kafka) != len(mq):
            self._find(path, f"Kafka printed {len(kafka)} lines, mq {len(mq)}; the first "
                       f"extra: {(kafka + mq)[min(len(kafka), len(mq))]!r}")

    def _stderr(self, dump: Dump) -> None:
        """The tool's findings. "Non-consecutive offsets" must be mq's gaps exactly; a "timestamp
        mismatch" is no finding only where the indexed batch is an empty header (no records;
        Kafka's cleaner writes them too, keeping the batch's max timestamp, which its time
        index then names) and mq reads that timestamp in that header: the tool recomputes the
        batch's largest timestamp from its records, -1 without any."""
        gaps: dict[str, set[tuple[int, int]]] = {}
        for header, lines in _stderr_sections(dump.stderr):
            if header.startswith(_NON_CONSECUTIVE):
                pairs = [_GAP.match(line) for line in lines]
                if all(pairs):
                    gaps[header[len(_NON_CONSECUTIVE):]] = {(int(m[1]), int(m[2]))
                                                            for m in pairs}
                    continue
            elif header.startswith(_TIME_MISMATCH):
                path = header[len(_TIME_MISMATCH):]
                headers = empty_batch_timestamps(_log_of(path))
                if all((m := _TIME_PAIR.match(line)) and m[2] == "-1" and int(m[1]) in headers
                       for line in lines):
                    continue
            self.findings += [f"DumpLogSegments {' '.join(dump.flags)}: {line}"
                              for line in [header, *lines]]
        for path, lines in dump.sections.items():
            if path.endswith(files.LOG_SUFFIX) and "--deep-iteration" in dump.flags:
                expected = mq_gaps(path)
                if gaps.get(path, set()) != expected:
                    self._find(path, f"non-consecutive offsets: Kafka "
                               f"{sorted(gaps.get(path, ()))}, mq {sorted(expected)}")

    def judge(self, dump: Dump, paths: Iterable[str]) -> None:
        """Every finding of one run over ``paths`` (each must have its section)."""
        if dump.returncode != 0:
            self.findings.append(f"DumpLogSegments {' '.join(dump.flags)} exited "
                                 f"{dump.returncode}")
        self._stderr(dump)
        for path in paths:
            if path not in dump.sections:
                self._find(path, f"not dumped by {' '.join(dump.flags)}")
                continue
            self.files_judged.add(path)
            self._section(dump.flags, path, dump.sections[path])

    def _section(self, flags: tuple[str, ...], path: str, kafka: list[str]) -> None:
        suffix = os.path.splitext(path)[1]
        empty = [f"{path} is empty."]          # an .index without entries, in every pass
        if suffix in INDEXES and "--index-sanity-check" in flags:
            if kafka not in (empty, [f"{path} passed sanity check."]):
                self._find(path, f"sanity check: {kafka}")
        elif suffix in INDEXES and "--verify-index-only" in flags:
            if kafka not in ([], empty):
                self._find(path, f"verify: {kafka}")
        elif suffix == files.LOG_SUFFIX:
            self._log(flags, path, kafka)
        else:
            self._compare(path, kafka, mq_lines(path, deep=False, print_data=False))
        if any("isvalid: false" in line or " invalid bytes " in line for line in kafka):
            self._find(path, "Kafka found an invalid batch or invalid bytes")

    def _log(self, flags: tuple[str, ...], path: str, kafka: list[str]) -> None:
        deep = "--deep-iteration" in flags
        decoder = "--offsets-decoder" in flags or "--transaction-log-decoder" in flags
        mq = mq_lines(path, deep=deep, print_data="--print-data-log" in flags)
        if not decoder:
            self._compare(path, kafka, mq)
            return
        # Record lines carry the decoder's key and value after mq's line (not a marker's).
        stripped = []
        for line, mine in zip(kafka, mq, strict=False):
            if line.startswith("| ") and line != mine and line.startswith(mine + " key: "):
                key, value = _DECODED.match(line, len(mine)).groups()
                offset = int(line.split()[2])
                self._decoded(path, offset, key, value)
                line = mine
            stripped.append(line)
        self._compare(path, stripped + kafka[len(stripped):], mq)

    def _decoded(self, path: str, offset: int, key: str, value: str | None) -> None:
        try:
            key_json = json.loads(key)
            value_json = None if value == "<DELETE>" else json.loads(value or "")
        except json.JSONDecodeError:
            self._find(path, f"offset {offset}: Kafka's decoder says: {key} {value or ''}")
            return
        self.decoded.append(Decoded(path, offset, key_json, value_json))


def judge_data_dir(java: JavaKafka, data_dir: str) -> Judge:
    """Every pass over a stopped broker's ``data_dir``: the user topics' files with records
    printed, each coordinator topic's with its decoder, every ``.log`` at batch level and every
    index with the sanity check, every index verified. (mq's ``__cluster_metadata`` records
    are not Kafka's metadata records: its ``.log`` files are judged at batch level only.)"""
    passes: dict[tuple[str, ...], list[str]] = {RECORDS: [], OFFSETS: [], TXN_LOG: [],
                                                 SANITY: [], VERIFY: []}
    decoders = {OFFSETS_TOPIC: OFFSETS, TXN_TOPIC: TXN_LOG}
    partitions = partition_files(data_dir)
    for name, paths in partitions.items():
        topic = files.parse_partition_dir(name)[0]
        for p in paths:
            if topic in decoders:
                passes[decoders[topic]].append(p)
            elif topic != METADATA_TOPIC or not p.endswith(files.LOG_SUFFIX):
                passes[RECORDS].append(p)
            if p.endswith((files.LOG_SUFFIX, *INDEXES)):
                passes[SANITY].append(p)
            if p.endswith(INDEXES):
                passes[VERIFY].append(p)
    result = Judge()
    for flags, paths in passes.items():
        if paths:
            result.judge(run(java, paths, flags), paths)
    missed = {p for ps in partitions.values() for p in ps} - result.files_judged
    assert not missed, f"not judged: {sorted(missed)}"
    return result
