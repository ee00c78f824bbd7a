"""kafka-python as an independent oracle for whole ``.log`` files written by ``PartitionLog``.

Every segment file mq writes — several codecs, headers, null keys and values, idempotent and
transactional batches, COMMIT/ABORT markers, LogAppendTime topics, rolled segments — must
decode with ``kafka.record.MemoryRecords(open(file, 'rb').read())``: each batch's CRC checks
(``validate_crc()`` before iterating), base offsets are the assigned ones and
contiguous across batches and segments, and records are identical. The other way round,
batches built by kafka-python's ``DefaultRecordBatchBuilder`` with every codec are appended
through ``PartitionLog.append`` and read back identical through ``PartitionLog.read`` and
``iter_batches``.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq.log import files
from mq.log.batch import iter_batches
from mq.log.builder import BatchBuilder, control_batch
from mq.log.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from mq.log.config import LogConfig
from mq.log.layout import CONTROL_ABORT, CONTROL_COMMIT
from mq.log.log import PartitionLog

with warnings.catch_warnings():
    # importing the kafka package loads protocol schemas through a deprecated importlib API
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kafka_codec
    from kafka.record import MemoryRecords
    from kafka.record.default_records import (ControlRecord, DefaultRecordBatch,
                                              DefaultRecordBatchBuilder)

ALL_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
NOW = 1_700_000_000_000
# Random timestamps reach 2^42 ms (year 2109): no message.timestamp.after.max.ms window here.
SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_index_bytes=4096,
                  message_timestamp_after_max_ms=(1 << 63) - 1)


def _b(x):
    return None if x is None else bytes(x)


@pytest.fixture
def log_dir():
    root = tempfile.mkdtemp(prefix="mq-conformance-")
    try:
        yield os.path.join(root, "topic-0")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def segment_files(directory: str) -> list[tuple[int, str]]:
    out = []
    for name in os.listdir(directory):
        parsed = files.parse_segment_name(name)
        if parsed and parsed[1] == files.LOG_SUFFIX and not parsed[2]:
            out.append((parsed[0], os.path.join(directory, name)))
    return sorted(out)


def kafka_read_log(directory: str) -> list[tuple[DefaultRecordBatch, list]]:
    """Every batch of every segment, decoded by kafka-python, checked for framing, CRC and
    offset continuity within and across segments."""
    out = []
    expected_next = None
    for base, path in segment_files(directory):
        with open(path, "rb") as f:
            data = f.read()
        records = MemoryRecords(data)
        consumed = 0
        first = True
        while records.has_next():
            kbatch = records.next_batch()
            assert isinstance(kbatch, DefaultRecordBatch)
            assert kbatch.magic == 2
            assert kbatch.validate_crc() is True, (path, kbatch.base_offset)
            if first:
                assert kbatch.base_offset == base, path   # the file is named after it
                first = False
            if expected_next is not None:
                assert kbatch.base_offset == expected_next, (path, kbatch.base_offset)
            expected_next = kbatch.next_offset
            consumed += kbatch.size_in_bytes
            out.append((kbatch, list(kbatch)))
        assert consumed == len(data), f"{path}: kafka-python stopped at byte {consumed}"
    return out


def krow(rec) -> tuple:
    return (rec.offset, rec.timestamp, rec.key, rec.value, list(rec.headers))


def mq_rows(batch) -> list[tuple]:
    return [(r.offset, r.timestamp, _b(r.key), _b(r.value), [(k, _b(v)) for k, v in r.headers])
            for r in batch.records()]


def test_kafka_python_has_every_codec():
    assert (kafka_codec.has_gzip(), kafka_codec.has_snappy(), kafka_codec.has_lz4(),
            kafka_codec.has_zstd()) == (True, True, True, True)


# --- mq writes, kafka-python reads ---------------------------------------------------------

def _sample_records(i: int, n: int) -> list[tuple]:
    rows = []
    for j in range(n):
        key = None if (i + j) % 3 == 0 else f"key-{i}-{j}".encode()
        value = None if (i + 2 * j) % 5 == 0 else (f"value {i}/{j} " * (1 + (i + j) % 7)).encode()
        headers = [] if j % 2 else [("trace", f"{i}.{j}".encode()), ("null", None),
                                    ("\u00e9t\u00e9", b"\x00\xff")][:1 + (i + j) % 3]
        ts = NOW + 1000 * i + (37 * j) % 11 - 5          # not monotonic inside a batch
        rows.append((ts, key, value, headers))
    return rows


def test_every_segment_mq_writes_decodes_in_kafka_python(log_dir):
    """Codecs, headers, nulls, idempotent and transactional batches and markers, over several
    rolled segments; the leader epoch and producer fields survive as stamped."""
    log = PartitionLog.open(log_dir, SMALL, now_ms=NOW)
    expected: list[tuple[dict, list[tuple]]] = []
    # One idempotent producer and one transactional producer, each with its own sequence; a
    # marker ends the transactional one's transaction (its sequence goes on).
    pids = {"idempotent": 4_000_000_001, "transactional": 4_000_000_002}
    seqs = dict.fromkeys(pids, 0)
    epoch = 3
    try:
        for i in range(40):
            codec = ALL_CODECS[i % len(ALL_CODECS)]
            kind = ("plain", "idempotent", "transactional", "plain")[i % 4]
            leo = log.log_end_offset
            if i % 9 == 8:
                ctype = CONTROL_ABORT if i % 2 else CONTROL_COMMIT
                pid = pids["transactional"]
                marker = control_batch(ctype, producer_id=pid, producer_epoch=epoch,
                                       coordinator_epoch=7, timestamp_ms=NOW + i)
                info = log.append(marker, leader_epoch=5, now_ms=NOW)
                assert info.first_offset == info.last_offset == leo
                expected.append(({"control": ctype, "pid": pid, "epoch": epoch, "seq": -1,
                                  "txn": True, "codec": NONE, "epoch_stamp": 5},
                                 [(leo, NOW + i, struct.pack(">hh", 0, ctype),
                                   struct.pack(">hi", 0, 7), [])]))
                continue
            rows = _sample_records(i, 1 + i % 6)
            pid = pids.get(kind, -1)
            fields = {"producer_id": pid, "producer_epoch": epoch, "base_sequence": seqs[kind],
                      "is_transactional": kind == "transactional"} if kind != "plain" else {}
            builder = BatchBuilder(compression=codec, **fields)
            for row in rows:
                builder.append(*row)
            info = log.append(builder.build(), leader_epoch=i // 10, now_ms=NOW)
            assert info.first_offset == leo and info.last_offset == leo + len(rows) - 1
            if kind != "plain":
                seqs[kind] += len(rows)
            expected.append(({"control": None, "pid": pid if kind != "plain" else -1,
                              "epoch": epoch if kind != "plain" else -1,
                              "seq": fields.get("base_sequence", -1),
                              "txn": kind == "transactional", "codec": codec,
                              "epoch_stamp": i // 10},
                             [(leo + j, ts, k, v, h) for j, (ts, k, v, h) in enumerate(rows)]))
        assert len(log.segments) >= 3
    finally:
        log.close()

    got = kafka_read_log(log_dir)
    assert len(got) == len(expected)
    for (kbatch, krecs), (meta, rows) in zip(got, expected):
        assert kbatch.base_offset == rows[0][0]
        assert kbatch.compression_type == meta["codec"]
        assert kbatch.leader_epoch == meta["epoch_stamp"]
        assert kbatch.producer_id == meta["pid"] and kbatch.producer_epoch == meta["epoch"]
        assert kbatch.base_sequence == meta["seq"]
        assert kbatch.is_transactional == meta["txn"]
        assert kbatch.is_control_batch == (meta["control"] is not None)
        assert kbatch.timestamp_type == 0
        assert kbatch.max_timestamp == max(r[1] for r in rows)
        assert kbatch.records_count == len(rows) and kbatch.last_offset == rows[-1][0]
        if meta["control"] is not None:
            rec, = krecs
            assert isinstance(rec, ControlRecord)
            assert (rec.offset, rec.timestamp, rec.version, rec.type) == \
                (rows[0][0], rows[0][1], 0, meta["control"])
            assert rec.commit == (meta["control"] == CONTROL_COMMIT)
            assert rec.value == rows[0][3]
        else:
            assert [krow(r) for r in krecs] == rows


@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
def test_log_append_time_topic_decodes_in_kafka_python(log_dir, codec):
    """message.timestamp.type=LogAppendTime: mq rewrites maxTimestamp and the attribute bit and
    recomputes the CRC; kafka-python reports the append time for every record."""
    cfg = LogConfig(segment_bytes=1024, message_timestamp_type="LogAppendTime")
    log = PartitionLog.open(log_dir, cfg, now_ms=NOW)
    appended = []
    try:
        for i in range(12):
            rows = _sample_records(i, 1 + i % 4)
            builder = BatchBuilder(compression=codec)
            for row in rows:
                builder.append(*row)
            now = NOW + 10_000 + i
            info = log.append(builder.build(), now_ms=now)
            assert info.log_append_time == now == info.max_timestamp
            appended.append((info.first_offset, now, rows))
        assert len(log.segments) >= 2
    finally:
        log.close()
    got = kafka_read_log(log_dir)
    assert len(got) == len(appended)
    for (kbatch, krecs), (first, now, rows) in zip(got, appended):
        assert kbatch.timestamp_type == 1 and kbatch.max_timestamp == now
        assert kbatch.first_timestamp == rows[0][0]           # baseTimestamp is left alone
        assert [krow(r) for r in krecs] == [(first + j, now, k, v, h)
                                            for j, (_, k, v, h) in enumerate(rows)]
        assert all(r.timestamp_type == 1 for r in krecs)


def test_recovered_and_truncated_log_still_decodes(log_dir):
    """Files after an unclean reopen (torn tail cut off), a truncation and more appends."""
    log = PartitionLog.open(log_dir, SMALL, now_ms=NOW)
    try:
        for i in range(30):
            builder = BatchBuilder(compression=ALL_CODECS[i % 5])
            for row in _sample_records(i, 3):
                builder.append(*row)
            log.append(builder.build(), now_ms=NOW)
        leo = log.log_end_offset
    finally:
        log.close()
    last = segment_files(log_dir)[-1][1]
    os.truncate(last, os.path.getsize(last) - 7)
    log = PartitionLog.open(log_dir, SMALL, recovery_point=0, now_ms=NOW)
    try:
        assert log.log_end_offset == leo - 3
        log.truncate_to(leo - 20)
        for i in range(5):
            builder = BatchBuilder(compression=ALL_CODECS[(i + 2) % 5])
            for row in _sample_records(100 + i, 2):
                builder.append(*row)
            log.append(builder.build(), now_ms=NOW)
        final = log.log_end_offset
    finally:
        log.close()
    got = kafka_read_log(log_dir)
    assert got[0][0].base_offset == 0 and got[-1][0].next_offset == final


# --- kafka-python writes, mq reads ---------------------------------------------------------

def kafka_build(codec: int, rows: list[tuple], *, transactional: bool = False,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1
                ) -> bytearray:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec,
                                        is_transactional=transactional, producer_id=producer_id,
                                        producer_epoch=producer_epoch,
                                        base_sequence=base_sequence, batch_size=1 << 20)
    for delta, (ts, key, value, headers) in enumerate(rows):
        assert builder.append(delta, timestamp=ts, key=key, value=value,
                              headers=headers) is not None
    return builder.build()


def _compressible_rows(i: int, n: int) -> list[tuple]:
    # Repetitive values, so that kafka-python keeps the codec (it falls back to no
    # compression when compressing does not shrink the batch).
    rows = _sample_records(i, n)
    return [(ts, k, (b"payload-%d " % i) * 20 if v is None and j % 2 else v, h)
            for j, (ts, k, v, h) in enumerate(rows)]


@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
def test_kafka_python_batches_appended_read_back_identical(log_dir, codec):
    log = PartitionLog.open(log_dir, SMALL, now_ms=NOW)
    try:
        appended = []
        seqs = {77: 0, 78: 0}               # an idempotent and a transactional producer
        for i in range(15):
            rows = _compressible_rows(i, 2 + i % 5)
            rows[0] = (rows[0][0], rows[0][1], (b"abc" * 50), rows[0][3])
            txn = i % 3 == 2
            pid = (-1, 77, 78)[i % 3]
            buf = kafka_build(codec, rows, transactional=txn, producer_id=pid,
                              producer_epoch=1 if pid >= 0 else -1,
                              base_sequence=seqs[pid] if pid >= 0 else -1)
            if pid >= 0:
                seqs[pid] += len(rows)
            info = log.append(buf, leader_epoch=2, now_ms=NOW)
            appended.append((info.first_offset, rows, txn))
        assert len(log.segments) >= 2
        leo = log.log_end_offset
        # PartitionLog.read + iter_batches, from every batch start and from inside batches.
        for first, rows, txn in appended:
            for start in {first, first + len(rows) - 1}:
                batch = next(iter_batches(log.read(start).data))
                batch.validate()
                assert batch.base_offset == first
                assert batch.compression == codec
                assert batch.is_transactional == txn
                assert batch.partition_leader_epoch == 2
                assert mq_rows(batch) == [(first + j, ts, k, v, h)
                                          for j, (ts, k, v, h) in enumerate(rows)]
        # The whole log, batch after batch.
        offset, seen = 0, []
        while offset < leo:
            chunk = list(iter_batches(log.read(offset).data))
            assert chunk
            seen += chunk
            offset = chunk[-1].next_offset
        assert [b.base_offset for b in seen] == [a[0] for a in appended]
    finally:
        log.close()
    # And the file mq wrote from them is still kafka-python's.
    got = kafka_read_log(log_dir)
    assert [krow(r) for _, recs in got for r in recs] == [
        (first + j, ts, k, v, h) for first, rows, _ in appended
        for j, (ts, k, v, h) in enumerate(rows)]


# --- Hypothesis: random records both ways ---------------------------------------------------

_headers = st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))),
                    max_size=3)
_rows = st.lists(st.tuples(st.integers(0, 1 << 42), st.one_of(st.none(), st.binary(max_size=40)),
                           st.one_of(st.none(), st.binary(max_size=200)), _headers),
                 min_size=1, max_size=12)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=st.lists(st.tuples(st.sampled_from(ALL_CODECS), st.booleans(), _rows),
                        min_size=1, max_size=6))
def test_random_batches_agree_both_ways(batches):
    """mq-built and kafka-python-built batches with random content, appended to one log:
    kafka-python decodes the file, mq reads every batch back, and both see the same records."""
    root = tempfile.mkdtemp(prefix="mq-conformance-")
    try:
        directory = os.path.join(root, "topic-0")
        log = PartitionLog.open(directory, SMALL, now_ms=NOW)
        expected = []
        try:
            for codec, by_kafka, rows in batches:
                if by_kafka:
                    buf = kafka_build(codec, rows)
                else:
                    builder = BatchBuilder(compression=codec)
                    for row in rows:
                        builder.append(*row)
                    buf = builder.build()
                info = log.append(buf, now_ms=NOW)
                expected += [(info.first_offset + j, ts, k, v, list(h))
                             for j, (ts, k, v, h) in enumerate(rows)]
            mq_seen = [row for b in log.batches() for row in mq_rows(b)]
        finally:
            log.close()
        assert mq_seen == expected
        assert [krow(r) for _, recs in kafka_read_log(directory) for r in recs] == expected
    finally:
        shutil.rmtree(root, ignore_errors=True)
