"""Records as Arrow: ``columns.decode_columns`` (C and pure Python) against ``records()``,
and ``ColumnBuilder``'s batches against Spark's required schema and the records' fields."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from mq.errors import CorruptRecordError  # noqa: E402
from mq.log import native  # noqa: E402
from mq.log.batch import RecordBatch  # noqa: E402
from mq.log.builder import BatchBuilder  # noqa: E402
from mq.log.columns import decode_columns  # noqa: E402
from mq.log.compression import GZIP, LZ4  # noqa: E402
from mq.log.layout import LOG_APPEND_TIME  # noqa: E402
from mq.spark.arrow import ColumnBuilder, arrow_schema, spark_schema  # noqa: E402

C_CODEC = native.decode_columns is not None

blobs = st.one_of(st.none(), st.binary(max_size=40))
record_lists = st.lists(
    st.tuples(st.integers(-5, 10**13), blobs, blobs,
              st.lists(st.tuples(st.text(max_size=6), blobs), max_size=3)),
    min_size=1, max_size=30)


def build(recs, *, base_offset=100, compression=0, timestamp_type=0, deltas=None):
    b = BatchBuilder(base_offset=base_offset, compression=compression,
                     timestamp_type=timestamp_type)
    for i, (ts, key, value, headers) in enumerate(recs):
        b.append(ts, key, value, headers, None if deltas is None else deltas[i])
    return RecordBatch(b.build())


def columns_of(batch, lo, hi, pure=False, monkeypatch=None):
    cols = [bytearray(), bytearray(), bytearray(4), bytearray(), bytearray(), bytearray(4),
            bytearray(), bytearray()]
    if pure:
        monkeypatch.setattr(native, "decode_columns", None)
        monkeypatch.setattr(native, "decode_records", None)
    n = decode_columns(batch, cols, lo, hi)
    if pure:
        monkeypatch.undo()
    return n, [bytes(c) for c in cols]


def expected_columns(batch, lo, hi):
    recs = [r for r in batch.records() if lo <= r.offset < hi]
    out = [struct.pack(f"={len(recs)}q", *[r.offset for r in recs]),
           struct.pack(f"={len(recs)}q", *[r.timestamp for r in recs])]
    for field in ("key", "value"):
        values = [getattr(r, field) for r in recs]
        ends, size = [0], 0
        for v in values:
            size += 0 if v is None else len(v)
            ends.append(size)
        out += [struct.pack(f"={len(ends)}i", *ends),
                b"".join(bytes(v) for v in values if v is not None),
                bytes(v is not None for v in values)]
    return len(recs), out


@given(record_lists, st.integers(90, 140), st.integers(90, 140),
       st.sampled_from([0, GZIP, LZ4]), st.booleans())
def test_decode_columns_matches_records(recs, lo, hi, codec, log_append):
    batch = build(recs, compression=codec, timestamp_type=LOG_APPEND_TIME if log_append else 0)
    want = expected_columns(batch, lo, hi)
    assert columns_of(batch, lo, hi) == want
    with pytest.MonkeyPatch.context() as mp:
        assert columns_of(batch, lo, hi, pure=True, monkeypatch=mp) == want


def test_decode_columns_appends_and_skips_offset_gaps():
    # Offset deltas with gaps (a compacted batch) and two batches appended to one set.
    first = build([(1, b"k", b"a", []), (2, None, b"b", [])] * 2, base_offset=0,
                  deltas=[0, 2, 5, 9])
    second = build([(3, b"kk", None, [])], base_offset=10)
    cols = [bytearray(), bytearray(), bytearray(4), bytearray(), bytearray(), bytearray(4),
            bytearray(), bytearray()]
    assert decode_columns(first, cols, 2, 100) == 3 and decode_columns(second, cols, 0, 100) == 1
    assert list(struct.unpack("=4q", cols[0])) == [2, 5, 9, 10]
    assert list(struct.unpack("=5i", cols[2])) == [0, 0, 1, 1, 3] and cols[3] == b"kkk"
    assert bytes(cols[4]) == b"\x00\x01\x00\x01" and bytes(cols[7]) == b"\x01\x01\x01\x00"


@pytest.mark.parametrize("pure", [False, True])
def test_decode_columns_rejects_what_records_rejects(pure, monkeypatch):
    raw = bytearray(build([(1, b"key", b"value", [("h", b"x")])]).buffer)
    raw[61] = 0x7E                       # the first record's length varint: 63, too long
    batch = RecordBatch(raw)
    with pytest.raises(CorruptRecordError) as want:
        batch.records()
    cols = [bytearray(b"keep") for _ in range(8)]
    if pure:
        monkeypatch.setattr(native, "decode_columns", None)
        monkeypatch.setattr(native, "decode_records", None)
    with pytest.raises(CorruptRecordError) as got:
        decode_columns(batch, cols, 0, 10)
    assert "record length 63 does not fit the batch" in want.value.reason
    assert "record length 63 does not fit the batch" in got.value.reason
    assert all(bytes(c) == b"keep" for c in cols)         # left as they were


@pytest.mark.skipif(not C_CODEC, reason="the C codec is not built")
def test_invalid_utf8_header_key_is_corrupt_in_both():
    batch = build([(1, None, b"v", [("ab", b"x")])])
    raw = bytearray(batch.buffer)
    at = bytes(raw).index(b"ab")
    raw[at] = 0xFF
    batch = RecordBatch(raw)
    with pytest.raises(CorruptRecordError, match="utf-8"):
        batch.records()
    with pytest.raises(CorruptRecordError, match="utf-8"):
        decode_columns(batch, [bytearray() for _ in range(8)], 0, 10)


@pytest.mark.parametrize("headers", [False, True])
def test_column_builder_batches_have_sparks_schema_and_the_records(headers):
    from pyspark.sql.pandas.types import to_arrow_schema
    recs = [(1_700_000_000_123, b"k1", b"v1", [("h", b"1"), ("h", None)]),
            (1_700_000_000_456, None, b"", []),
            (-1, b"", None, [("x", b"")])]
    builder = ColumnBuilder("topic-\u00e9", 7, headers)
    builder.add(build(recs, base_offset=10), 11, 13)     # a range inside a batch
    builder.add(build(recs[:1], base_offset=20, timestamp_type=LOG_APPEND_TIME), 0, 100)
    assert builder.rows == 3
    out = builder.take()
    assert out.schema.equals(to_arrow_schema(spark_schema(headers), timezone="UTC"))
    assert out.schema.equals(arrow_schema(headers)) and builder.rows == 0
    rows = out.to_pylist()
    assert [r["offset"] for r in rows] == [11, 12, 20]
    assert [r["key"] for r in rows] == [None, b"", b"k1"]
    assert [r["value"] for r in rows] == [b"", None, b"v1"]
    assert {r["topic"] for r in rows} == {"topic-\u00e9"} and {r["partition"] for r in rows} == {7}
    assert [r["timestampType"] for r in rows] == [0, 0, 1]
    micros = [r["timestamp"].timestamp() * 1e6 for r in rows]
    assert micros == pytest.approx([1_700_000_000_456_000, -1000, 1_700_000_000_123_000])
    if headers:
        assert [r["headers"] for r in rows] == [
            None, [{"key": "x", "value": b""}],
            [{"key": "h", "value": b"1"}, {"key": "h", "value": None}]]
    else:
        assert "headers" not in out.schema.names


def test_column_builder_empty_and_all_null():
    builder = ColumnBuilder("t", 0, False)
    builder.add(build([(5, None, None, [])] * 3, base_offset=0), 0, 3)
    out = builder.take()
    assert out.column("key").null_count == 3 and out.column("value").null_count == 3
    builder.add(build([(5, None, None, [])]), 500, 600)   # nothing in range
    assert builder.rows == 0
