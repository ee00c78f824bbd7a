"""The ``mq`` storage tools end to end: ``dump-log``, ``log check`` and ``demo`` run as real
processes (``python -m mq``) on logs written by ``PartitionLog`` into each test's ``tmp_path``.

Every expected error must be one ``mq: error:`` line on stderr with a non-zero exit and never a
traceback; checking must change no file (names, sizes, mtimes and bytes compared).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import json_value

from mq.cli.main import main
from mq.log.batch import iter_batches
from mq.log.builder import BatchBuilder, control_batch
from mq.log.compression import GZIP, LZ4, NONE
from mq.log.config import LogConfig
from mq.log.index import OffsetIndex, TimeIndex
from mq.log.layout import CONTROL_COMMIT
from mq.log.log import PartitionLog
from mq.log.segment import LogSegment

# Small segments so the partition rolls; an index entry after every batch but a segment's first.
CONFIG = LogConfig(segment_bytes=1200, index_interval_bytes=0)
BATCH_FIELDS = {"baseOffset", "lastOffset", "count", "position", "createTime", "size", "magic",
                "compresscodec", "crc", "isValid", "producerId", "producerEpoch",
                "baseSequence", "isTransactional", "isControl"}
BATCH_LINE = re.compile(
    r"^baseOffset: (\d+) lastOffset: (\d+) count: (\d+) baseSequence: -?\d+ lastSequence: -?\d+ "
    r"producerId: -?\d+ producerEpoch: -?\d+ partitionLeaderEpoch: -?\d+ "
    r"isTransactional: (true|false) isControl: (true|false) deleteHorizonMs: OptionalLong.empty "
    r"position: (\d+) CreateTime: (-?\d+) size: (\d+) magic: 2 compresscodec: (\w+) "
    r"crc: (\d+) isvalid: (true|false)$")


# --- helpers ----------------------------------------------------------------------------------

ENV = {**os.environ, "PYTHONIOENCODING": "utf-8"}


def mq(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mq", *map(str, args)], check=False,
                          capture_output=True,
                          encoding="utf-8", env=ENV, timeout=timeout)


def assert_one_error(proc: subprocess.CompletedProcess, *fragments: str, code: int = 1) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mq: error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def snapshot(directory: Path) -> dict:
    """Every file's size, mtime and content hash, to prove a tool changed nothing."""
    out = {}
    for path in sorted(directory.iterdir()):
        st = path.stat()
        out[path.name] = (st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).digest())
    return out


def logs(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def segment_files(directory: Path) -> list[Path]:
    """The .log, .index and .timeindex files (not snapshots, checkpoints, leftovers)."""
    return sorted(p for p in directory.iterdir()
                  if p.suffix in (".log", ".index", ".timeindex"))


def batch_positions(path: Path) -> list[tuple[int, int, int]]:
    """(position, base offset, last offset) of each whole batch of a .log file."""
    return [(b.position, b.base_offset, b.last_offset) for b in iter_batches(path.read_bytes())]


def read_records(directory: Path) -> list[dict]:
    """Every record of every segment, decoded independently of the CLI."""
    out = []
    for path in logs(directory):
        for batch in iter_batches(path.read_bytes()):
            batch.validate()
            for r in batch.records():
                out.append({"offset": r.offset, "timestamp": r.timestamp,
                            "key": json_value(r.key), "value": json_value(r.value),
                            "headers": [{"key": k, "value": json_value(v)}
                                        for k, v in r.headers]})
    return out


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def write_partition(directory: Path, batches: int = 24) -> list[dict]:
    """A partition of ``batches`` 5-record batches (codecs none/gzip/lz4; null keys,
    tombstones, binary values, headers) and a COMMIT marker; returns the records as
    ``dump-log --json`` should show them."""
    expected: list[dict] = []
    with PartitionLog.open(str(directory), CONFIG) as plog:
        for b in range(batches):
            builder = BatchBuilder(compression=(NONE, GZIP, LZ4)[b % 3])
            pending = []
            for j in range(5):
                n = b * 5 + j
                key = None if n % 7 == 3 else f"k{n}".encode()
                if n % 11 == 5:
                    value = None
                elif n % 13 == 6:
                    value = bytes([0xFF, 0xFE, n % 256])
                else:
                    value = f"value-{n}-é".encode()
                headers = [("h1", f"x{n}".encode()), ("bin", b"\x80\x81"), ("nil", None)] \
                    if n % 2 else []
                ts = 1_000_000 + 10 * n
                builder.append(ts, key, value, headers)
                pending.append((ts, key, value, headers))
            info = plog.append(builder.build())
            for j, (ts, key, value, headers) in enumerate(pending):
                expected.append({"offset": info.first_offset + j, "timestamp": ts,
                                 "key": json_value(key), "value": json_value(value),
                                 "headers": [{"key": k, "value": json_value(v)}
                                             for k, v in headers]})
        info = plog.append(control_batch(CONTROL_COMMIT, producer_id=42, producer_epoch=3,
                                         coordinator_epoch=5, timestamp_ms=2_000_000))
        expected.append({"offset": info.first_offset, "timestamp": 2_000_000,
                         "key": json_value(b"\x00\x00\x00\x01"),
                         "value": json_value(b"\x00\x00\x00\x00\x00\x05"), "headers": []})
    return expected


@pytest.fixture
def part(tmp_path: Path) -> tuple[Path, list[dict]]:
    directory = tmp_path / "orders-0"
    expected = write_partition(directory)
    assert len(logs(directory)) >= 3, "the fixture must roll several segments"
    return directory, expected


# --- help, version, usage ---------------------------------------------------------------------

def test_help_and_version():
    top = mq("--help")
    assert top.returncode == 0 and top.stderr == ""
    for word in ("dump-log", "log", "demo", "examples"):
        assert word in top.stdout
    dump = mq("dump-log", "--help")
    assert dump.returncode == 0
    for word in ("--print-data", "--deep-iteration", "--verify-index-only", "--json", "base64",
                 "examples"):
        assert word in dump.stdout
    check = mq("log", "check", "--help")
    assert check.returncode == 0 and "--repair" in check.stdout and "examples" in check.stdout
    version = mq("--version")
    assert version.returncode == 0 and version.stdout.startswith("mq ")


@pytest.mark.parametrize("args", [(), ("bogus",), ("dump-log",), ("dump-log", "--nope", "x"),
                                  ("log",), ("log", "check"), ("demo", "--partitions", "0")])
def test_usage_errors_are_one_line_exit_2(args):
    assert_one_error(mq(*args), code=2)


def test_main_in_process(tmp_path, capsys):
    assert main(["--version"]) == 0
    assert main(["dump-log", str(tmp_path / "00000000000000000000.log")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "No such file or directory" in err[0]


# --- dump-log: .log ---------------------------------------------------------------------------

def test_dump_log_text_batches(part):
    directory, _ = part
    seg = logs(directory)[1]
    proc = mq("dump-log", seg)
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert lines[0] == f"Dumping {seg}"
    assert lines[1] == f"Log starting offset: {int(seg.stem)}"
    expected = list(iter_batches(seg.read_bytes()))
    assert len(lines) == 2 + len(expected)
    for line, batch in zip(lines[2:], expected):
        m = BATCH_LINE.match(line)
        assert m, line
        assert [int(m[i]) for i in (1, 2, 3, 6, 7, 8)] == [
            batch.base_offset, batch.last_offset, batch.records_count, batch.position,
            batch.max_timestamp, batch.size]
        assert m[9] == batch.compression_name and int(m[10]) == batch.crc
        assert m[11] == "true"


def test_dump_log_print_data_text(part):
    directory, expected = part
    seg = logs(directory)[0]
    proc = mq("dump-log", "--print-data", seg)
    assert proc.returncode == 0, proc.stderr
    records = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    by_offset = {r["offset"]: r for r in expected}
    assert records
    for line in records:
        offset = int(line.split()[2])
        rec = by_offset[offset]
        key, value = rec["key"], rec["value"]
        key_size = -1 if key is None else len(key.encode())
        value_size = (-1 if value is None else
                      len(base64.b64decode(value["base64"])) if isinstance(value, dict)
                      else len(value.encode()))
        header_keys = ",".join(h["key"] for h in rec["headers"])
        prefix = (f"| offset: {offset} CreateTime: {rec['timestamp']} keySize: {key_size} "
                  f"valueSize: {value_size} sequence: -1 headerKeys: [{header_keys}]")
        assert line.startswith(prefix), (line, prefix)
        rest = line[len(prefix):]
        want = ""
        if key is not None:
            want += f" key: {key}"
        if isinstance(value, dict):
            raw = base64.b64decode(value["base64"])
            want += " payload: " + "".join(
                f"\\x{b:02x}" if b >= 0x7F or b < 0x20 else chr(b) for b in raw)
        elif value is not None:
            want += f" payload: {value}"
        assert rest == want, (line, want)


def test_dump_log_deep_iteration_has_no_payload_and_shows_marker(part):
    directory, _ = part
    last = logs(directory)[-1]
    proc = mq("dump-log", "--deep-iteration", last)
    assert proc.returncode == 0, proc.stderr
    records = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert records and not any(" payload: " in line for line in records)
    assert records[-1].endswith("endTxnMarker: COMMIT coordinatorEpoch: 5")
    assert "isTransactional: true isControl: true" in proc.stdout


def test_dump_log_json_is_the_api_contract(part):
    directory, expected = part
    segments = logs(directory)
    batches = [b for seg in segments for b in iter_batches(seg.read_bytes())]
    plain = mq("dump-log", "--json", *segments)            # objects follow file order
    assert plain.returncode == 0, plain.stderr
    objs = [json.loads(line) for line in plain.stdout.splitlines()]
    assert all(set(o) == BATCH_FIELDS for o in objs)
    assert [(o["baseOffset"], o["lastOffset"], o["count"], o["position"], o["size"],
             o["createTime"], o["crc"], o["compresscodec"]) for o in objs] == [
        (b.base_offset, b.last_offset, b.records_count, b.position, b.size, b.max_timestamp,
         b.crc, b.compression_name) for b in batches]
    assert {o["compresscodec"] for o in objs} == {"none", "gzip", "lz4"}
    assert all(o["isValid"] is True and o["magic"] == 2 for o in objs)
    marker = objs[-1]
    assert marker["isControl"] is True and marker["isTransactional"] is True
    assert marker["producerId"] == 42 and marker["producerEpoch"] == 3
    assert not any(o["isControl"] or o["isTransactional"] for o in objs[:-1])

    data = mq("dump-log", "--json", "--print-data", *segments)
    assert data.returncode == 0, data.stderr
    got_records = []
    for line in data.stdout.splitlines():
        obj = json.loads(line)
        assert set(obj) == BATCH_FIELDS | {"records"}
        assert obj["count"] == len(obj["records"])
        got_records += obj["records"]
    assert got_records == expected


def test_dump_log_multiple_files_one_missing(part, tmp_path):
    directory, _ = part
    seg = logs(directory)[0]
    missing = directory / "00000000000000999999.log"
    proc = mq("dump-log", seg, missing)
    assert_one_error(proc, str(missing), "No such file or directory")
    assert f"Dumping {seg}" in proc.stdout and "baseOffset: 0 " in proc.stdout


# --- dump-log: indexes ------------------------------------------------------------------------

def test_dump_offset_and_time_index(part):
    directory, _ = part
    seg = logs(directory)[0]
    base = int(seg.stem)
    index_path, time_path = seg.with_suffix(".index"), seg.with_suffix(".timeindex")
    with OffsetIndex(str(index_path), base, writable=False) as idx:
        entries = [idx.entry(i) for i in range(idx.entries)]
    with TimeIndex(str(time_path), base, writable=False) as tidx:
        tentries = [tidx.entry(i) for i in range(tidx.entries)]
    assert len(entries) >= 2 and tentries

    text = mq("dump-log", index_path)
    assert text.returncode == 0
    assert text.stdout.splitlines() == [f"Dumping {index_path}"] + [
        f"offset: {o} position: {p}" for o, p in entries]
    js = mq("dump-log", "--json", index_path)
    assert [json.loads(line) for line in js.stdout.splitlines()] == [
        {"offset": o, "position": p} for o, p in entries]

    ttext = mq("dump-log", time_path)
    assert ttext.returncode == 0
    assert ttext.stdout.splitlines() == [f"Dumping {time_path}"] + [
        f"timestamp: {t} offset: {o}" for t, o in tentries]
    tjs = mq("dump-log", "--json", time_path)
    assert [json.loads(line) for line in tjs.stdout.splitlines()] == [
        {"timestamp": t, "offset": o} for t, o in tentries]


def test_verify_index_only_good(part):
    directory, _ = part
    files = sorted(directory.glob("*.index")) + sorted(directory.glob("*.timeindex"))
    proc = mq("dump-log", "--verify-index-only", *files, logs(directory)[0])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("No mismatches") == len(files) + 1
    js = mq("dump-log", "--verify-index-only", "--json", *files)
    assert js.returncode == 0 and js.stdout == ""


def test_verify_index_only_broken_offset_index(part):
    directory, _ = part
    seg = logs(directory)[0]
    index_path = seg.with_suffix(".index")
    raw = bytearray(index_path.read_bytes())
    raw[4:8] = (int.from_bytes(raw[4:8], "big") + 1).to_bytes(4, "big")   # entry 0: position+1
    raw[8:12] = (int.from_bytes(raw[8:12], "big") + 1).to_bytes(4, "big")  # entry 1: offset+1
    index_path.write_bytes(bytes(raw))
    proc = mq("dump-log", "--verify-index-only", index_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    mismatch = [line for line in proc.stdout.splitlines() if "entry" in line]
    assert len(mismatch) == 2
    assert "entry 0" in mismatch[0] and "does not point at the start of a batch" in mismatch[0]
    assert "entry 1" in mismatch[1] and "does not match the log" in mismatch[1]
    js = mq("dump-log", "--verify-index-only", "--json", index_path)
    objs = [json.loads(line) for line in js.stdout.splitlines()]
    assert js.returncode == 1 and [o["kind"] for o in objs] == ["index-mismatch"] * 2
    assert all(o["file"] == str(index_path) for o in objs)


def test_verify_index_only_broken_time_index(part):
    directory, _ = part
    time_path = logs(directory)[0].with_suffix(".timeindex")
    raw = bytearray(time_path.read_bytes())
    raw[0:8] = (10**12).to_bytes(8, "big")                # entry 0: a timestamp from the future
    time_path.write_bytes(bytes(raw))
    proc = mq("dump-log", "--verify-index-only", time_path)
    assert proc.returncode == 1
    assert "entry 0 (timestamp 1000000000000" in proc.stdout
    assert "does not match the log: the largest timestamp up to offset" in proc.stdout


# --- dump-log: bad input ----------------------------------------------------------------------

def test_dump_corrupt_crc_prints_every_batch_then_one_error(part):
    directory, _ = part
    seg = logs(directory)[0]
    batches = batch_positions(seg)
    pos = batches[2][0]
    flip_byte(seg, pos + 70)                              # inside the records: CRC mismatch
    proc = mq("dump-log", seg)
    assert_one_error(proc, str(seg), f"at byte {pos}", "CRC mismatch")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("baseOffset")]
    assert len(lines) == len(batches)
    assert [line.endswith("isvalid: false") for line in lines] == [
        i == 2 for i in range(len(batches))]
    js = mq("dump-log", "--json", seg)
    assert_one_error(js, f"at byte {pos}")
    assert [json.loads(line)["isValid"] for line in js.stdout.splitlines()] == [
        i != 2 for i in range(len(batches))]


def test_dump_broken_framing_prints_valid_prefix_then_one_error(part):
    directory, _ = part
    seg = logs(directory)[0]
    batches = batch_positions(seg)
    pos = batches[3][0]
    with open(seg, "r+b") as f:
        f.seek(pos)
        f.write(bytes(17))                                # batch length 0, magic 0
    proc = mq("dump-log", "--print-data", seg)
    assert_one_error(proc, str(seg), f"at byte {pos}")
    assert len([line for line in proc.stdout.splitlines() if line.startswith("baseOffset")]) == 3


def test_dump_torn_tail(part):
    directory, _ = part
    seg = logs(directory)[0]
    size = seg.stat().st_size
    last_pos = batch_positions(seg)[-1][0]
    os.truncate(seg, size - 5)
    assert_one_error(mq("dump-log", seg), f"at byte {last_pos}", "torn")


def test_dump_zero_filled_and_random_logs(tmp_path):
    zeros = tmp_path / "00000000000000000000.log"
    zeros.write_bytes(bytes(4096))
    assert_one_error(mq("dump-log", zeros), str(zeros), "at byte 0")
    noise = tmp_path / "00000000000000000100.log"
    noise.write_bytes(random.Random(7).randbytes(10_000))
    assert_one_error(mq("dump-log", "--print-data", noise), str(noise), "at byte")
    assert_one_error(mq("dump-log", "--json", noise), str(noise))


def test_dump_wrong_suffix_missing_file_directory(tmp_path):
    txt = tmp_path / "notes.txt"
    txt.write_text("hello\n")
    assert_one_error(mq("dump-log", txt), str(txt), "not a segment file")
    odd = tmp_path / "foo.log"
    odd.write_bytes(b"")
    assert_one_error(mq("dump-log", odd), "not a segment file")
    missing = tmp_path / "00000000000000000000.log"
    assert_one_error(mq("dump-log", missing), str(missing), "No such file or directory")
    assert_one_error(mq("dump-log", tmp_path), "is a directory")
    index = tmp_path / "00000000000000000000.index"
    index.write_bytes(bytes(16))
    assert_one_error(mq("dump-log", "--verify-index-only", index), "cannot verify without its log")


def test_dump_permission_denied(part):
    directory, _ = part
    seg = logs(directory)[0]
    seg.chmod(0)
    # Root reads any file: as root (CI), run without the capabilities that let it.
    drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    try:
        proc = subprocess.run([*drop, sys.executable, "-m", "mq", "dump-log", str(seg)],
                              check=False, capture_output=True, encoding="utf-8", env=ENV,
                              timeout=120)
        assert_one_error(proc, "Permission denied")
    finally:
        seg.chmod(0o644)


def test_dump_does_not_modify_files(part):
    directory, _ = part
    before = snapshot(directory)
    dumpable = segment_files(directory) + sorted(directory.glob("*.snapshot"))
    assert mq("dump-log", "--print-data", *dumpable).returncode == 0
    assert mq("dump-log", "--verify-index-only", *logs(directory)).returncode == 0
    assert snapshot(directory) == before


def test_broken_pipe_exits_quietly(tmp_path):
    directory = tmp_path / "big-0"
    write_partition(directory, batches=400)               # ~250 KB of text, > a pipe buffer
    proc = subprocess.Popen([sys.executable, "-m", "mq", "dump-log", "--print-data",
                             *logs(directory)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=ENV)
    assert proc.stdout.readline().startswith(b"Dumping ")
    proc.stdout.close()                                   # what `| head -1` does
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141
    assert stderr == b""


# --- log check --------------------------------------------------------------------------------

def test_log_check_clean_changes_nothing(part):
    directory, expected = part
    before = snapshot(directory)
    proc = mq("log", "check", directory)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == (f"{directory}: OK: {len(logs(directory))} segments, 25 batches, "
                           f"{len(expected)} records, offsets 0..{len(expected) - 1}, "
                           f"{sum(p.stat().st_size for p in logs(directory))} bytes\n")
    js = mq("log", "check", "--json", directory)
    assert js.returncode == 0 and js.stdout == ""
    assert snapshot(directory) == before


def _check_finds(directory: Path, *fragments: str) -> list[dict]:
    before = snapshot(directory)
    proc = mq("log", "check", directory)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "--repair" in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stdout, (fragment, proc.stdout)
    js = mq("log", "check", "--json", directory)
    assert js.returncode == 1
    problems = [json.loads(line) for line in js.stdout.splitlines()]
    assert len(problems) == len(proc.stdout.splitlines())
    assert all(set(p) == {"dir", "file", "kind", "position", "message"} for p in problems)
    assert snapshot(directory) == before, "log check must not change any file"
    return problems


def _repair_keeps(directory: Path, expected: list[dict], keep: int) -> str:
    proc = mq("log", "check", "--repair", directory)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines()[-1].startswith(f"{directory}: OK: ")
    again = mq("log", "check", directory)
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_records(directory) == expected[:keep]
    return proc.stdout


def test_torn_tail_check_and_repair(part):
    directory, expected = part
    last = logs(directory)[-1]
    torn_pos = batch_positions(last)[-1][0]
    os.truncate(last, last.stat().st_size - 7)            # the COMMIT marker is torn
    problems = _check_finds(directory, f"{last} at byte {torn_pos}: torn batch")
    assert [p["kind"] for p in problems] == ["torn-tail"]
    assert problems[0]["position"] == torn_pos
    out = _repair_keeps(directory, expected, len(expected) - 1)
    assert f"truncated {last.name} from " in out


def test_flipped_byte_check_and_repair(part):
    directory, expected = part
    first = logs(directory)[0]
    batches = batch_positions(first)
    pos, base, _ = batches[1]
    flip_byte(first, pos + 65)
    problems = _check_finds(directory, f"{first} at byte {pos}: CRC mismatch")
    assert [p["kind"] for p in problems] == ["corrupt-batch"]
    assert problems[0]["position"] == pos
    later = sorted(p.name for p in segment_files(directory) if not p.name.startswith(first.stem))
    assert later
    out = _repair_keeps(directory, expected, base)         # records before the bad batch
    assert logs(directory) == [first]                       # every later segment dropped
    removed = [line.split(": removed ")[1] for line in out.splitlines() if ": removed " in line]
    assert sorted(name for name in removed if not name.endswith(".snapshot")) == later


def test_garbage_index_check_and_repair(part):
    directory, expected = part
    index = logs(directory)[1].with_suffix(".index")
    index.write_bytes(random.Random(3).randbytes(13))
    problems = _check_finds(directory, str(index), "not a multiple of the 8-byte entry size")
    assert [p["kind"] for p in problems] == ["index-corrupt"]
    out = _repair_keeps(directory, expected, len(expected))
    assert f"rebuilt {index.name}" in out


def test_wrong_index_entries_check(part):
    directory, _ = part
    index = logs(directory)[0].with_suffix(".index")
    raw = bytearray(index.read_bytes())
    raw[0:4] = (int.from_bytes(raw[0:4], "big") + 2).to_bytes(4, "big")
    index.write_bytes(bytes(raw))
    problems = _check_finds(directory, f"{index}: entry 0", "does not match the log")
    assert [p["kind"] for p in problems] == ["index-mismatch"]


def test_untrimmed_index_after_a_crash(tmp_path):
    directory = tmp_path / "t-0"
    plog = PartitionLog.open(str(directory), CONFIG)
    builder = BatchBuilder()
    builder.append(1000, b"k", b"v")
    batch = builder.build()
    for _ in range(5):
        plog.append(bytearray(batch))
    plog.flush()
    for seg in plog.segments:                             # a crash: nothing trimmed
        seg.close_without_index_changes()
    problems = _check_finds(directory, "zero-filled slots")
    assert {p["kind"] for p in problems} == {"index-untrimmed"}
    proc = mq("log", "check", "--repair", directory)
    assert proc.returncode == 0 and "rebuilt 00000000000000000000.index" in proc.stdout
    assert mq("log", "check", directory).returncode == 0


def test_leftovers_check_and_repair(part):
    directory, expected = part
    (directory / "00000000000000000000.log.deleted").write_bytes(b"old")
    (directory / "00000000000000000000.index.tmp").write_bytes(b"")
    (directory / "00000000000000777777.timeindex").write_bytes(b"")
    problems = _check_finds(directory, ".index.tmp: leftover", "index without its")
    assert sorted(p["kind"] for p in problems) == ["leftover", "orphan-index"]
    out = _repair_keeps(directory, expected, len(expected))
    assert "removed leftover 00000000000000000000.log.deleted" in out
    assert not list(directory.glob("*.deleted")) and not list(directory.glob("*.tmp"))


def test_pending_deletes_are_clean(part):
    """Kafka's broker leaves the segments its cleaner or retention dropped as ``.deleted``
    files at a clean shutdown (their unlink waits file.delete.delay.ms, 60 s): a pending
    delete, not an interrupted change, so such a directory is clean (both brokers remove the
    files at open)."""
    directory, _ = part
    for suffix in (".log", ".index", ".timeindex", ".snapshot"):
        (directory / f"00000000000000000000{suffix}.deleted").write_bytes(b"old")
    proc = mq("log", "check", directory)
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"{directory}: OK: ")


def test_repair_of_a_clean_directory_changes_nothing(part):
    directory, _ = part
    before = snapshot(directory)
    proc = mq("log", "check", "--repair", directory)
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == f"{directory}: nothing to repair"
    assert snapshot(directory) == before
    js = mq("log", "check", "--repair", "--json", directory)
    obj = json.loads(js.stdout)
    assert obj["repaired"] is False and obj["clean"] is True and obj["changes"] == []


def test_repair_json_reports_changes(part):
    directory, _ = part
    last = logs(directory)[-1]
    os.truncate(last, last.stat().st_size - 3)
    proc = mq("log", "check", "--repair", "--json", directory)
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["repaired"] is True and obj["clean"] is True and obj["problems"] == []
    assert obj["bytesTruncated"] == 78 - 3                 # the rest of the 78-byte marker
    assert {"file": last.name, "action": "truncated", "sizeBefore": last.stat().st_size + 75,
            "sizeAfter": last.stat().st_size} in obj["changes"]


def test_log_check_bad_directories(tmp_path, part):
    directory, _ = part
    assert_one_error(mq("log", "check", tmp_path / "nope-0"), "no such directory")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert_one_error(mq("log", "check", plain), "not a partition directory")
    assert_one_error(mq("log", "check", "--repair", plain), "not a partition directory")
    assert not list(plain.iterdir())
    assert_one_error(mq("log", "check", tmp_path), "data directory", str(directory))
    file = tmp_path / "file-0"
    file.write_text("x")
    assert_one_error(mq("log", "check", file), "not a directory")
    assert_one_error(mq("log", "check", "--repair", tmp_path / "nope-1"), "no such directory")
    assert not (tmp_path / "nope-1").exists()


# --- demo -------------------------------------------------------------------------------------

def test_read_only_segment_verify_without_offset_index(part):
    """Regression: a segment that rolled in with one batch has no .index after a clean close;
    ``LogSegment.verify()`` on it, read-only, used to raise FileNotFoundError."""
    directory, _ = part
    last = logs(directory)[-1]
    last.with_suffix(".index").unlink(missing_ok=True)   # the storage may create it at roll
    before = snapshot(directory)
    seg = LogSegment(str(directory), int(last.stem), CONFIG, read_only=True)
    try:
        assert seg.verify() == []
    finally:
        seg.close()
    assert snapshot(directory) == before


# --- files that are not regular files ---------------------------------------------------------

def regular_files(directory: Path) -> dict:
    """``snapshot`` of the regular files only (reading a FIFO would block)."""
    out = {}
    for path in sorted(directory.iterdir()):
        if path.is_file():
            st = path.stat()
            out[path.name] = (st.st_size, st.st_mtime_ns,
                              hashlib.sha256(path.read_bytes()).digest())
    return out


def test_dump_log_refuses_fifos_and_directories_without_hanging(tmp_path, part):
    directory, _ = part
    fifo_log = tmp_path / "00000000000000000000.log"
    os.mkfifo(fifo_log)                   # opening it for reading would wait for a writer
    assert_one_error(mq("dump-log", fifo_log, timeout=60), str(fifo_log),
                     "not a regular file (it is a FIFO)")
    assert_one_error(mq("dump-log", "--json", "--print-data", fifo_log, timeout=60),
                     "it is a FIFO")
    fifo_index = tmp_path / "00000000000000000000.timeindex"
    os.mkfifo(fifo_index)
    assert_one_error(mq("dump-log", fifo_index, timeout=60), "not a regular file")
    # --verify-index-only opens the files next to the one named: those are checked too.
    index = tmp_path / "00000000000000000000.index"
    index.write_bytes((directory / index.name).read_bytes())
    assert_one_error(mq("dump-log", "--verify-index-only", index, timeout=60),
                     f"{fifo_log}: not a regular file")
    log_copy = tmp_path / "other" / "00000000000000000000.log"
    log_copy.parent.mkdir()
    log_copy.write_bytes((directory / log_copy.name).read_bytes())
    os.mkfifo(log_copy.with_suffix(".index"))
    assert_one_error(mq("dump-log", "--verify-index-only", log_copy, timeout=60),
                     f"{log_copy.with_suffix('.index')}: not a regular file (it is a FIFO)")
    named_dir = tmp_path / "00000000000000000100.log"
    named_dir.mkdir()
    assert_one_error(mq("dump-log", named_dir, timeout=60), "not a regular file",
                     "it is a directory")


@pytest.mark.parametrize("entry", ["00000000000000000777.log", "00000000000000000000.timeindex",
                                   "00000000000000000000.log.deleted"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_log_check_refuses_a_segment_name_that_is_not_a_regular_file(part, entry, kind):
    directory, _ = part
    if entry.endswith(".timeindex"):
        (directory / entry).unlink()
    before = regular_files(directory)
    if kind == "fifo":
        os.mkfifo(directory / entry)
    else:
        (directory / entry).mkdir()
    what = "a FIFO" if kind == "fifo" else "a directory"
    for args in (["log", "check"], ["log", "check", "--json"], ["log", "check", "--repair"]):
        line = assert_one_error(mq(*args, directory, timeout=60), str(directory / entry),
                                f"not a regular file (it is {what})",
                                "not a partition directory")
        assert "OK" not in line
    assert regular_files(directory) == before


# --- missing indexes ----------------------------------------------------------------------------

def test_missing_indexes_check_and_repair(part):
    directory, expected = part
    first = logs(directory)[0]
    for suffix in (".index", ".timeindex"):
        first.with_suffix(suffix).unlink()
    problems = _check_finds(directory, f"{first.with_suffix('.index')}: missing",
                            "holds 6 batches (offsets 0..29)")
    assert [p["kind"] for p in problems] == ["index-missing", "index-missing"]
    assert [p["file"] for p in problems] == [str(first.with_suffix(".index")),
                                             str(first.with_suffix(".timeindex"))]
    out = _repair_keeps(directory, expected, len(expected))
    assert f"rebuilt {first.stem}.index" in out and f"rebuilt {first.stem}.timeindex" in out
    assert first.with_suffix(".index").exists() and first.with_suffix(".timeindex").exists()


def test_a_one_batch_last_segment_without_offset_index_is_clean(part):
    """Indexes used to be created lazily: a last segment rolled into by one batch and closed
    had a .timeindex (close writes its final entry) but no .index. Such a segment is clean
    (the broker rebuilds it at open); its .timeindex missing is not."""
    directory, _ = part
    last = logs(directory)[-1]
    assert len(batch_positions(last)) == 1
    last.with_suffix(".index").unlink(missing_ok=True)
    assert last.with_suffix(".timeindex").exists()
    assert mq("log", "check", directory).returncode == 0
    last.with_suffix(".timeindex").unlink()
    problems = _check_finds(directory, f"{last.with_suffix('.timeindex')}: missing")
    assert [p["kind"] for p in problems] == ["index-missing"]
    # A segment before the last one always had both: its .index missing is a problem.
    first = logs(directory)[0]
    first.with_suffix(".index").unlink()
    problems = _check_finds(directory, f"{first.with_suffix('.index')}: missing")
    assert sorted(p["kind"] for p in problems) == ["index-missing", "index-missing"]


# --- a live broker ------------------------------------------------------------------------------

def test_log_check_under_a_live_broker(broker):
    from brokers import create_topic

    from mq.client.producer import Producer
    create_topic(broker, "t", 1, {"segment.bytes": "2000"})
    with Producer(socket=broker.socket, linger_ms=0) as producer:
        for i in range(30):
            producer.send("t", value=b"%03d" % i + b"x" * 97).get(timeout=60)
    directory = Path(broker.data_dir) / "t-0"
    active = logs(directory)[-1]
    assert len(logs(directory)) >= 3
    index_bytes = LogConfig().segment_index_bytes
    assert active.with_suffix(".index").stat().st_size == index_bytes   # preallocated
    before = regular_files(directory)
    proc = mq("log", "check", directory)
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"{directory}: OK: {len(logs(directory))} segments, 30 batches")
    assert f"a live broker owns {broker.data_dir}" in proc.stdout
    assert "untrimmed" not in proc.stdout
    js = mq("log", "check", "--json", directory)
    assert (js.returncode, js.stdout, js.stderr) == (0, "", "")
    assert_one_error(mq("log", "check", "--repair", directory),
                     f"{broker.data_dir}: a live broker owns this data dir",
                     "stop it before --repair")
    assert regular_files(directory) == before
    # Real problems are still found: a rolled segment's missing index.
    first = logs(directory)[0]
    first.with_suffix(".index").unlink()
    proc = mq("log", "check", directory)
    assert proc.returncode == 1 and "index-missing" not in proc.stdout
    assert proc.stdout == f"{first.with_suffix('.index')}: missing, but its segment holds " \
        f"{len(batch_positions(first))} batches (offsets 0..{len(batch_positions(first)) - 1}); " \
        "the broker rebuilds it at open\n"
    broker.stop()
    assert active.with_suffix(".index").stat().st_size < index_bytes    # trimmed at close
    proc = mq("log", "check", directory)
    assert proc.returncode == 1 and "live broker" not in proc.stdout + proc.stderr
    repaired = mq("log", "check", "--repair", directory)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"rebuilt {first.stem}.index" in repaired.stdout


def test_dump_txnindex_and_snapshot_text_and_json(tmp_path):
    directory = tmp_path / "t-0"
    with PartitionLog.open(str(directory), CONFIG) as plog:
        for pid, seq in ((7, 0), (8, 0), (7, 1)):
            b = BatchBuilder(producer_id=pid, producer_epoch=2, base_sequence=seq,
                             is_transactional=True)
            b.append(1000, None, b"x")
            plog.append(b.build())
        plog.append_marker(7, 2, commit=False, coordinator_epoch=4, now_ms=1000)   # 3
    txn = logs(directory)[0].with_suffix(".txnindex")
    snap = directory / f"{4:020d}.snapshot"
    out = mq("dump-log", txn, snap)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "version: 0 producerId: 7 firstOffset: 0 lastOffset: 3 lastStableOffset: 1" in lines
    assert any(line.startswith("producerId: 8 producerEpoch: 2 coordinatorEpoch: -1 "
                               "currentTxnFirstOffset: OptionalLong[1] ") for line in lines)
    assert any(line.startswith("producerId: 7 producerEpoch: 2 coordinatorEpoch: 4 "
                               "currentTxnFirstOffset: OptionalLong.empty ") for line in lines)
    objs = [json.loads(line) for line in mq("dump-log", "--json", txn).stdout.splitlines()]
    assert objs == [{"version": 0, "producerId": 7, "firstOffset": 0, "lastOffset": 3,
                     "lastStableOffset": 1}]
    objs = [json.loads(line) for line in mq("dump-log", "--json", snap).stdout.splitlines()]
    assert {o["producerId"]: o["lastSequence"] for o in objs} == {7: 1, 8: 0}
    marker = [json.loads(line) for line in mq("dump-log", "--json", logs(directory)[0])
              .stdout.splitlines()][-1]
    assert marker["isControl"] and marker["isTransactional"] and marker["producerId"] == 7
    text = mq("dump-log", "--deep-iteration", logs(directory)[0]).stdout
    assert "endTxnMarker: ABORT coordinatorEpoch: 4" in text
    snap.write_bytes(snap.read_bytes()[:-1])
    assert_one_error(mq("dump-log", snap), "snapshot")


def test_damaged_snapshot_and_txnindex_check_and_repair(tmp_path):
    directory = tmp_path / "t-0"
    with PartitionLog.open(str(directory), CONFIG) as plog:
        for pid in (7, 8):
            b = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=0,
                             is_transactional=True)
            b.append(1000, None, b"x")
            plog.append(b.build())
        plog.append_marker(7, 0, commit=False, now_ms=1000)
        plog.append_marker(8, 0, commit=True, now_ms=1000)
    txn = logs(directory)[-1].with_suffix(".txnindex")
    snap = sorted(directory.glob("*.snapshot"))[-1]
    assert mq("log", "check", directory).returncode == 0
    good_txn = txn.read_bytes()
    txn.write_bytes(good_txn + b"\x00" * 5)                  # a torn entry
    snap.write_bytes(snap.read_bytes()[:-3])                 # a torn snapshot
    problems = _check_finds(directory, "txnindex", "snapshot")
    assert sorted(p["kind"] for p in problems) == ["snapshot-corrupt", "txnindex-corrupt"]
    proc = mq("log", "check", "--repair", directory)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert mq("log", "check", directory).returncode == 0
    assert txn.read_bytes() == good_txn                       # rebuilt from the log
