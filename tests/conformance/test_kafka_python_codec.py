"""kafka-python as an independent oracle: mq and kafka-python agree on RecordBatch v2, both ways."""

from __future__ import annotations

import struct
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq.log.batch import RecordBatch, iter_batches
from mq.log.builder import BatchBuilder, control_batch
from mq.log.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from mq.log.layout import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CREATE_TIME,
    LOG_APPEND_TIME,
    set_log_append_time,
    stamp_batch,
)

with warnings.catch_warnings():
    # importing the kafka package loads protocol schemas through a deprecated importlib API
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kafka_codec
    from kafka.record import MemoryRecords
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

ALL_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
INT32_MAX = (1 << 31) - 1


def _b(x):
    return None if x is None else bytes(x)


def mq_rows(batch: RecordBatch) -> list[tuple]:
    return [(r.offset, r.timestamp, _b(r.key), _b(r.value), [(k, _b(v)) for k, v in r.headers])
            for r in batch.records()]


def kafka_batches(data: bytes) -> list[tuple[DefaultRecordBatch, list]]:
    """Every batch kafka-python finds in ``data``: CRC checked before iteration, then records."""
    out = []
    for kbatch in MemoryRecords(bytes(data)):
        assert isinstance(kbatch, DefaultRecordBatch)
        assert kbatch.validate_crc() is True
        out.append((kbatch, list(kbatch)))
    return out


def kafka_rows(records: list) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]


def assert_same_header(kbatch: DefaultRecordBatch, batch: RecordBatch) -> None:
    assert kbatch.magic == batch.magic == 2
    assert kbatch.base_offset == batch.base_offset
    assert kbatch.size_in_bytes == batch.size
    assert kbatch.leader_epoch == batch.partition_leader_epoch
    assert kbatch.crc == batch.crc
    assert kbatch.attributes == batch.attributes
    assert kbatch.compression_type == batch.compression
    assert kbatch.timestamp_type == batch.timestamp_type
    assert kbatch.is_transactional == batch.is_transactional
    assert kbatch.is_control_batch == batch.is_control
    assert kbatch.last_offset_delta == batch.last_offset_delta
    assert kbatch.first_timestamp == batch.base_timestamp
    assert kbatch.max_timestamp == batch.max_timestamp
    assert kbatch.producer_id == batch.producer_id
    assert kbatch.producer_epoch == batch.producer_epoch
    assert kbatch.base_sequence == batch.base_sequence
    assert kbatch.records_count == batch.records_count
    assert kbatch.next_offset == batch.next_offset


def check_mq_batch(buf) -> None:
    """kafka-python decodes an mq-built batch to exactly what mq decodes."""
    batch = RecordBatch(bytes(buf))
    batch.validate()
    (kbatch, krecs), = kafka_batches(buf)
    assert_same_header(kbatch, batch)
    assert kafka_rows(krecs) == mq_rows(batch)


def check_kafka_batch(kbuf, expected_rows, *, codec, transactional=False, producer_id=-1,
                      producer_epoch=-1, base_sequence=-1) -> None:
    """mq decodes a kafka-python-built batch to exactly the appended records."""
    batch, = iter_batches(bytes(kbuf))
    batch.validate()
    assert batch.compression == codec
    assert batch.is_transactional == transactional
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
        producer_id, producer_epoch, base_sequence)
    assert batch.base_offset == 0 and batch.partition_leader_epoch == 0
    assert batch.records_count == len(expected_rows)
    assert mq_rows(batch) == expected_rows
    assert mq_rows(RecordBatch(kbuf)) == expected_rows


def test_kafka_python_has_every_codec():
    assert (kafka_codec.has_gzip(), kafka_codec.has_snappy(), kafka_codec.has_lz4(),
            kafka_codec.has_zstd()) == (True, True, True, True)


SAMPLE = [
    (1_700_000_000_000, b"key-0", b"value-0" * 40, [("trace", b"abc"), ("null", None)]),
    (1_700_000_000_005, None, b"null key" * 10, []),
    (1_699_999_999_000, b"key-2", None, [("\u00e9t\u00e9", b"\x00\xff"), ("", b"")]),
    (1_700_000_100_000, b"", b"", [("dup", b"1"), ("dup", b"2")]),
    (1_700_000_000_001, b"k" * 300, b"v" * 20_000, [("h", b"x" * 200)]),
]


def build_mq(rows, **kwargs) -> bytearray:
    builder = BatchBuilder(**kwargs)
    for row in rows:
        builder.append(*row)
    return builder.build()


# --- mq -> kafka-python -----------------------------------------------------------------------

@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
def test_mq_batch_decodes_in_kafka_python(codec):
    buf = build_mq(SAMPLE, compression=codec, base_offset=1_000)
    check_mq_batch(buf)
    (kbatch, krecs), = kafka_batches(buf)
    assert [r.offset for r in krecs] == [1_000 + i for i in range(len(SAMPLE))]
    assert kafka_rows(krecs) == [(1_000 + i, ts, k, v, h) for i, (ts, k, v, h) in
                                 enumerate(SAMPLE)]


@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
def test_mq_transactional_batch(codec):
    buf = build_mq(SAMPLE[:3], compression=codec, producer_id=9_876_543_210,
                   producer_epoch=12, base_sequence=INT32_MAX - 1, is_transactional=True,
                   partition_leader_epoch=33)
    check_mq_batch(buf)
    (kbatch, _), = kafka_batches(buf)
    assert kbatch.has_producer_id() and kbatch.has_sequence
    assert kbatch.last_sequence == RecordBatch(buf).last_sequence == 0   # wrapped


@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
def test_mq_log_append_time(codec):
    buf = build_mq(SAMPLE, compression=codec)
    stamp_batch(buf, 500, 4)
    set_log_append_time(buf, 1_900_000_000_000)
    check_mq_batch(buf)
    (kbatch, krecs), = kafka_batches(buf)
    assert kbatch.timestamp_type == LOG_APPEND_TIME
    assert [r.timestamp for r in krecs] == [1_900_000_000_000] * len(SAMPLE)
    assert all(r.timestamp_type == LOG_APPEND_TIME for r in krecs)


def test_mq_builder_log_append_time():
    buf = build_mq(SAMPLE, timestamp_type=LOG_APPEND_TIME)
    check_mq_batch(buf)
    (_, krecs), = kafka_batches(buf)
    assert {r.timestamp for r in krecs} == {max(row[0] for row in SAMPLE)}


@pytest.mark.parametrize("ctype", [CONTROL_COMMIT, CONTROL_ABORT])
def test_mq_control_marker(ctype):
    buf = control_batch(ctype, producer_id=77, producer_epoch=3, coordinator_epoch=5,
                        timestamp_ms=1_234, base_offset=42, partition_leader_epoch=2)
    check_mq_batch(buf)
    (kbatch, krecs), = kafka_batches(buf)
    assert kbatch.is_control_batch and kbatch.is_transactional
    assert kbatch.base_sequence == -1 and not kbatch.has_sequence
    rec, = krecs
    assert (rec.offset, rec.timestamp, rec.version, rec.type) == (42, 1_234, 0, ctype)
    assert rec.commit == (ctype == CONTROL_COMMIT)
    assert rec.abort == (ctype == CONTROL_ABORT)
    assert rec.value == struct.pack(">hi", 0, 5)
    assert RecordBatch(buf).control_type() == rec.type


def test_mq_delete_horizon_batch():
    buf = build_mq(SAMPLE[:3], delete_horizon_ms=1_800_000_000_000)
    check_mq_batch(buf)
    (kbatch, krecs), = kafka_batches(buf)
    assert kbatch.attributes & 0x40
    assert kbatch.first_timestamp == 1_800_000_000_000
    assert [r.timestamp for r in krecs] == [row[0] for row in SAMPLE[:3]]


def test_mq_explicit_offset_gaps_and_varlong_deltas():
    builder = BatchBuilder(base_offset=10)
    builder.append(0, b"a", b"1", offset_delta=0)
    builder.append(1 << 50, b"b", b"2", offset_delta=7)
    builder.append(-(1 << 45), None, None, offset_delta=1 << 20)
    check_mq_batch(builder.build())
    (_, krecs), = kafka_batches(builder.build())
    assert [(r.offset, r.timestamp) for r in krecs] == [
        (10, 0), (17, 1 << 50), (10 + (1 << 20), -(1 << 45))]


def test_mq_empty_batch():
    check_mq_batch(BatchBuilder().build())


def test_concatenated_mq_batches(tmp_path):
    parts = []
    next_offset = 0
    for i, codec in enumerate(ALL_CODECS):
        buf = build_mq(SAMPLE[: i + 1], compression=codec, base_offset=next_offset)
        next_offset += i + 1
        parts.append(buf)
    parts.append(control_batch(CONTROL_COMMIT, producer_id=1, producer_epoch=0,
                               timestamp_ms=5, base_offset=next_offset))
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(b"".join(parts) + bytes(parts[0][:40]))      # plus a torn tail
    data = segment.read_bytes()

    found = kafka_batches(data)
    ours = list(iter_batches(data))
    assert len(found) == len(ours) == len(parts)
    mr = MemoryRecords(data)
    assert mr.valid_bytes() == len(data) - 40
    for (kbatch, krecs), batch, part in zip(found, ours, parts):
        batch.validate()
        assert_same_header(kbatch, batch)
        assert kafka_rows(krecs) == mq_rows(batch)
        assert bytes(batch.buffer) == bytes(part)
    assert [kb.base_offset for kb, _ in found] == [0, 1, 3, 6, 10, 15]


def test_kafka_python_detects_mq_crc_damage():
    buf = build_mq(SAMPLE[:2])
    buf[70] ^= 1
    kbatch = next(iter(MemoryRecords(bytes(buf))))
    assert kbatch.validate_crc() is False


# --- kafka-python -> mq -----------------------------------------------------------------------

def build_kafka(rows, *, codec=NONE, transactional=False, producer_id=-1, producer_epoch=-1,
                base_sequence=-1, offsets=None) -> bytearray:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec,
                                        is_transactional=transactional, producer_id=producer_id,
                                        producer_epoch=producer_epoch,
                                        base_sequence=base_sequence, batch_size=1 << 30)
    for i, (ts, key, value, headers) in enumerate(rows):
        offset = i if offsets is None else offsets[i]
        assert builder.append(offset, ts, key, value, headers) is not None
    return builder.build()


@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
def test_kafka_python_batch_decodes_in_mq(codec):
    kbuf = build_kafka(SAMPLE, codec=codec)
    check_kafka_batch(kbuf, [(i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(SAMPLE)],
                      codec=codec)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
def test_kafka_python_transactional_batch_in_mq(codec):
    kbuf = build_kafka(SAMPLE, codec=codec, transactional=True, producer_id=123_456,
                       producer_epoch=9, base_sequence=1_000)
    check_kafka_batch(kbuf, [(i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(SAMPLE)],
                      codec=codec, transactional=True, producer_id=123_456, producer_epoch=9,
                      base_sequence=1_000)
    assert RecordBatch(kbuf).last_sequence == 1_004


def test_kafka_python_offset_gaps_in_mq():
    offsets = [0, 3, 4, 100]
    rows = SAMPLE[:4]
    kbuf = build_kafka(rows, offsets=offsets)
    check_kafka_batch(kbuf, [(o, ts, k, v, h) for o, (ts, k, v, h) in zip(offsets, rows)],
                      codec=NONE)
    assert RecordBatch(kbuf).last_offset_delta == 100


def test_kafka_python_batch_restamped_by_mq():
    kbuf = build_kafka(SAMPLE, codec=LZ4)
    stamp_batch(kbuf, 5_000, 8)
    set_log_append_time(kbuf, 1_234_567)
    batch = RecordBatch(kbuf)
    batch.validate()
    assert [r.timestamp for r in batch.records()] == [1_234_567] * len(SAMPLE)
    (kbatch, krecs), = kafka_batches(kbuf)
    assert kafka_rows(krecs) == mq_rows(batch)
    assert kbatch.base_offset == 5_000 and kbatch.leader_epoch == 8


def test_concatenated_kafka_python_batches_in_mq():
    kparts = [build_kafka(SAMPLE[: i + 1], codec=codec) for i, codec in enumerate(ALL_CODECS)]
    for i, part in enumerate(kparts):
        stamp_batch(part, 100 * i, 0)
    data = b"".join(kparts)
    batches = list(iter_batches(data))
    assert [b.base_offset for b in batches] == [0, 100, 200, 300, 400]
    for i, batch in enumerate(batches):
        batch.validate()
        assert mq_rows(batch) == [(100 * i + j, ts, k, v, h)
                                  for j, (ts, k, v, h) in enumerate(SAMPLE[: i + 1])]


# --- Hypothesis: both directions --------------------------------------------------------------

def examples(n: int) -> settings:
    return settings(max_examples=n,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


blob = st.one_of(st.none(), st.binary(max_size=64),
                 st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=4),
                           st.integers(0, 3_000)))      # compressible, so codecs really apply
headers = st.lists(st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=12))),
                   max_size=3)
timestamp = st.one_of(st.integers(0, 2_000_000_000_000), st.integers(-(1 << 62), 1 << 62))
rows_strategy = st.lists(st.tuples(timestamp, blob, blob, headers), min_size=1, max_size=8)


@st.composite
def offsets_for(draw, n: int) -> list[int]:
    out, cur = [], 0
    for _ in range(n):
        out.append(cur)
        cur += draw(st.one_of(st.just(1), st.integers(1, 1 << 16)))
    return out


@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
@examples(25)
@given(rows_strategy, st.sampled_from([CREATE_TIME, LOG_APPEND_TIME]), st.booleans(),
       st.integers(0, 1 << 62), st.data())
def test_hypothesis_mq_to_kafka_python(codec, rows, ts_type, transactional, base_offset, data):
    offsets = data.draw(offsets_for(len(rows)))
    idempotent = data.draw(st.booleans())
    builder = BatchBuilder(
        compression=codec, timestamp_type=ts_type, is_transactional=transactional,
        base_offset=base_offset,
        producer_id=data.draw(st.integers(0, (1 << 63) - 1)) if idempotent else -1,
        producer_epoch=data.draw(st.integers(0, 32_767)) if idempotent else -1,
        base_sequence=data.draw(st.integers(0, INT32_MAX)) if idempotent else -1,
        partition_leader_epoch=data.draw(st.integers(-1, INT32_MAX)))
    for (ts, key, value, hdrs), delta in zip(rows, offsets):
        builder.append(ts, key, value, hdrs, offset_delta=delta)
    buf = builder.build()
    check_mq_batch(buf)
    (_, krecs), = kafka_batches(buf)
    max_ts = max([-1] + [r[0] for r in rows])
    expected = [(base_offset + d, max_ts if ts_type == LOG_APPEND_TIME else ts, k, v, h)
                for (ts, k, v, h), d in zip(rows, offsets)]
    assert kafka_rows(krecs) == expected


@pytest.mark.parametrize("codec", ALL_CODECS, ids=NAMES.get)
@examples(25)
@given(rows_strategy, st.booleans(), st.data())
def test_hypothesis_kafka_python_to_mq(codec, rows, idempotent, data):
    # kafka-python sends a batch uncompressed when compression does not pay off; one
    # compressible record makes sure the requested codec is really used
    filler = (rows[0][0], None, b"mq" * data.draw(st.integers(200, 2_000)), [])
    rows = list(rows)
    rows.insert(data.draw(st.integers(0, len(rows))), filler)
    offsets = data.draw(offsets_for(len(rows)))
    if idempotent:
        producer = dict(producer_id=data.draw(st.integers(0, (1 << 63) - 1)),
                        producer_epoch=data.draw(st.integers(0, 32_767)),
                        base_sequence=data.draw(st.integers(0, INT32_MAX)),
                        transactional=data.draw(st.booleans()))
    else:
        producer = dict(producer_id=-1, producer_epoch=-1, base_sequence=-1,
                        transactional=False)
    kbuf = build_kafka(rows, codec=codec, offsets=offsets, **producer)
    check_kafka_batch(kbuf, [(o, ts, k, v, h) for (ts, k, v, h), o in zip(rows, offsets)],
                      codec=codec, **producer)
