"""Unit tests with exact byte-level expectations for the RecordBatch v2 codec: mq.log.layout,
varints, compression, batch (the reader) and builder."""

from __future__ import annotations

import struct

import pytest

from mq.errors import CorruptRecordError, UnsupportedCodecError
from mq.log import compression, layout, varints
from mq.log.batch import RecordBatch, iter_batches
from mq.log.builder import BatchBuilder, control_batch
from mq.log.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, codec_from_name
from mq.log.layout import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CREATE_TIME,
    LOG_APPEND_TIME,
    crc32c,
    set_log_append_time,
    stamp_batch,
)
from mq.log.varints import decode_varint, encode_varint

ALL_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
COMPRESSED = [GZIP, SNAPPY, LZ4, ZSTD]
INT32_MAX = (1 << 31) - 1


def _codec_id(codec: int) -> str:
    return compression.CODEC_NAMES[codec]


def _build(rows, **kwargs) -> bytearray:
    builder = BatchBuilder(**kwargs)
    for row in rows:
        builder.append(*row)
    return builder.build()


def _sample_rows(n: int = 5) -> list[tuple]:
    return [(1_700_000_000_000 + 7 * i, b"key-%d" % i, b"value-%d " % i * 20,
             [("h%d" % i, b"x" * i), ("null", None)]) for i in range(n)]


def _recrc(buf: bytearray) -> bytearray:
    struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return buf


def _as_tuples(batch: RecordBatch) -> list[tuple]:
    return [(r.offset, r.timestamp, None if r.key is None else bytes(r.key),
             None if r.value is None else bytes(r.value),
             [(k, None if v is None else bytes(v)) for k, v in r.headers])
            for r in batch.records()]


# --- header layout ----------------------------------------------------------------------------

def test_constants():
    assert layout.RECORD_BATCH_OVERHEAD == 61
    assert layout.LOG_OVERHEAD == 12
    assert layout.HEADER_SIZE_UP_TO_MAGIC == 17
    assert layout.MAGIC == 2
    assert (NONE, GZIP, SNAPPY, LZ4, ZSTD) == (0, 1, 2, 3, 4)



def test_named_offsets_follow_the_one_header_declaration():
    """Every ``*_OFFSET`` is Kafka's, and ``field()`` reads what the header struct packs."""
    assert (layout.BASE_OFFSET_OFFSET, layout.LENGTH_OFFSET,
            layout.PARTITION_LEADER_EPOCH_OFFSET, layout.MAGIC_OFFSET, layout.CRC_OFFSET,
            layout.ATTRIBUTES_OFFSET, layout.LAST_OFFSET_DELTA_OFFSET,
            layout.BASE_TIMESTAMP_OFFSET, layout.MAX_TIMESTAMP_OFFSET,
            layout.PRODUCER_ID_OFFSET, layout.PRODUCER_EPOCH_OFFSET,
            layout.BASE_SEQUENCE_OFFSET, layout.RECORDS_COUNT_OFFSET) == (
        0, 8, 12, 16, 17, 21, 23, 27, 35, 43, 51, 53, 57)
    assert layout.HEADER.size == layout.RECORD_BATCH_OVERHEAD == 61
    assert layout.FRAME.size == layout.HEADER_SIZE_UP_TO_MAGIC
    values = tuple(range(100, 100 + len(layout.HEADER_FIELDS)))
    buf = layout.HEADER.pack(*values)
    offsets = [0, 8, 12, 16, 17, 21, 23, 27, 35, 43, 51, 53, 57]
    for (name, _), offset, value in zip(layout.HEADER_FIELDS, offsets, values, strict=True):
        assert layout.field(name).unpack_from(buf, offset)[0] == value, name
    with pytest.raises(KeyError):
        layout.field("nope")

def test_header_field_offsets():
    builder = BatchBuilder(base_offset=0x0102030405060708, partition_leader_epoch=0x0A0B0C0D,
                           producer_id=0x1112131415161718, producer_epoch=0x2122,
                           base_sequence=0x31323334, is_transactional=True)
    builder.append(1_000, b"a", b"b")
    builder.append(1_500, b"c", b"d")
    builder.append(1_200, None, None)
    buf = bytes(builder.build())

    def field(off, fmt):
        return struct.unpack_from(">" + fmt, buf, off)[0]

    assert field(0, "q") == 0x0102030405060708               # baseOffset
    assert field(8, "i") == len(buf) - 12                     # batchLength
    assert field(12, "i") == 0x0A0B0C0D                       # partitionLeaderEpoch
    assert buf[16] == 2                                       # magic
    assert field(17, "I") == crc32c(buf[21:])                 # crc over [21, end)
    assert field(21, "h") == 0x10                             # attributes: transactional
    assert field(23, "i") == 2                                # lastOffsetDelta
    assert field(27, "q") == 1_000                            # baseTimestamp
    assert field(35, "q") == 1_500                            # maxTimestamp
    assert field(43, "q") == 0x1112131415161718               # producerId
    assert field(51, "h") == 0x2122                           # producerEpoch
    assert field(53, "i") == 0x31323334                       # baseSequence
    assert field(57, "i") == 3                                # recordsCount

    batch = RecordBatch(buf)
    batch.validate()
    assert (batch.base_offset, batch.partition_leader_epoch, batch.magic) == (
        0x0102030405060708, 0x0A0B0C0D, 2)
    assert batch.size == len(buf) and batch.batch_length == len(buf) - 12
    assert batch.crc == batch.compute_crc() == crc32c(buf[21:])
    assert (batch.last_offset_delta, batch.records_count) == (2, 3)
    assert (batch.base_timestamp, batch.max_timestamp) == (1_000, 1_500)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
        0x1112131415161718, 0x2122, 0x31323334)
    assert batch.last_offset == 0x0102030405060708 + 2
    assert batch.next_offset == 0x0102030405060708 + 3


def test_single_record_exact_bytes():
    buf = bytes(_build([(5_000, b"k", b"v")]))
    # record: length 8 (varint 0x10), attrs 0, tsDelta 0, offsetDelta 0, keyLen 1 (0x02), "k",
    # valueLen 1 (0x02), "v", headerCount 0
    assert buf[61:] == bytes.fromhex("10 00 00 00 02 6b 02 76 00")
    assert len(buf) == 70
    header = struct.pack(">qiib", 0, 58, -1, 2)
    assert buf[:17] == header
    assert buf[21:61] == struct.pack(">hiqqqhii", 0, 0, 5_000, 5_000, -1, -1, -1, 1)


def test_empty_batch():
    buf = BatchBuilder().build()
    assert len(buf) == 61
    batch = RecordBatch(buf)
    batch.validate()
    assert batch.records() == []
    assert (batch.records_count, batch.last_offset_delta) == (0, 0)
    assert (batch.base_timestamp, batch.max_timestamp) == (-1, -1)


# --- varints ----------------------------------------------------------------------------------

VARINT_VECTORS = [
    (0, "00"), (-1, "01"), (1, "02"), (63, "7e"), (-64, "7f"), (64, "8001"), (300, "d804"),
    # around the encoder's precomputed-cache boundary (+-8192)
    (8191, "fe7f"), (-8192, "ff7f"), (8192, "808001"), (-8193, "818001"),
    (INT32_MAX, "feffffff0f"), (-(1 << 31), "ffffffff0f"),
    ((1 << 63) - 1, "feffffffffffffffff01"), (-(1 << 63), "ffffffffffffffffff01"),
]


@pytest.mark.parametrize("value,hexbytes", VARINT_VECTORS)
def test_varint_vectors(value, hexbytes):
    expected = bytes.fromhex(hexbytes)
    assert encode_varint(value) == expected
    assert decode_varint(expected, 0) == (value, len(expected))
    # decoding at an offset inside a larger buffer
    assert decode_varint(b"\xff\xff" + expected + b"\x00", 2) == (value, 2 + len(expected))


def test_the_varint_table_is_the_encoder_over_its_whole_range():
    """``VARINTS`` is built in closed form at import: each entry is what the encoder makes."""
    assert len(varints.VARINTS) == 2 * varints.CACHED
    assert all(varints.VARINTS[v + varints.CACHED] == varints.encode_varint_uncached(v)
               for v in range(-varints.CACHED, varints.CACHED))


@pytest.mark.parametrize("value", [v for v, _ in VARINT_VECTORS if -(1 << 31) <= v <= INT32_MAX])
def test_varint_fits_int32_limit(value):
    encoded = encode_varint(value)
    assert len(encoded) <= 5
    assert decode_varint(encoded, 0, 5) == (value, len(encoded))


def test_varint_too_long():
    with pytest.raises(ValueError):
        decode_varint(b"\x80\x80\x80\x80\x80\x01", 0, 5)          # 6 bytes for a varint
    with pytest.raises(ValueError):
        decode_varint(b"\x80" * 10 + b"\x01", 0, 10)             # 11 bytes for a varlong
    with pytest.raises(ValueError):
        decode_varint(encode_varint(1 << 40), 0, 5)              # varlong where a varint is due


def test_varint_truncated():
    with pytest.raises(IndexError):
        decode_varint(b"\x80\x80", 0)
    with pytest.raises(IndexError):
        decode_varint(b"", 0)


def test_record_with_overlong_varint_is_corrupt():
    buf = bytearray(_build([(0, b"k", b"v")]))
    # replace the key length varint (0x02) by a 6-byte encoding that never terminates in time
    body = bytes.fromhex("00 00 00") + b"\x82\x80\x80\x80\x80\x00" + b"k" + b"\x02v\x00"
    rec = encode_varint(len(body)) + body
    buf = bytearray(buf[:61]) + rec
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    _recrc(buf)
    batch = RecordBatch(buf)
    batch.validate()
    with pytest.raises(CorruptRecordError):
        batch.records()


def test_null_key_and_value_cost_one_byte_each():
    null = bytes(_build([(0, None, None)]))
    empty = bytes(_build([(0, b"", b"")]))
    # length 6 (0x0c) | attrs | ts | offset | key -1 (01) | value -1 (01) | headers 0
    assert null[61:] == bytes.fromhex("0c 00 00 00 01 01 00")
    # empty (not null): lengths 0 (00), distinguishable from null
    assert empty[61:] == bytes.fromhex("0c 00 00 00 00 00 00")
    rec_null, = RecordBatch(null).records()
    rec_empty, = RecordBatch(empty).records()
    assert rec_null.key is None and rec_null.value is None
    assert bytes(rec_empty.key) == b"" and bytes(rec_empty.value) == b""


def test_null_header_value_costs_one_byte():
    buf = bytes(_build([(0, None, b"v", [("ab", None), ("c", b"")])]))
    # headers: count 2 | keyLen 2 "ab" valueLen -1 (01) | keyLen 1 "c" valueLen 0
    assert buf[61:].endswith(bytes.fromhex("04 04 61 62 01 02 63 00"))
    rec, = RecordBatch(buf).records()
    assert [(k, None if v is None else bytes(v)) for k, v in rec.headers] == [
        ("ab", None), ("c", b"")]
    assert all(isinstance(k, str) for k, _ in rec.headers)


# --- control batches --------------------------------------------------------------------------

@pytest.mark.parametrize("ctype", [CONTROL_COMMIT, CONTROL_ABORT])
def test_control_batch(ctype):
    buf = control_batch(ctype, producer_id=4242, producer_epoch=7, coordinator_epoch=99,
                        timestamp_ms=123_456, base_offset=1000, partition_leader_epoch=3)
    assert len(buf) == 78
    batch = RecordBatch(buf)
    batch.validate()
    assert batch.is_control and batch.is_transactional
    assert batch.attributes == 0x30
    assert batch.compression == NONE
    assert batch.base_sequence == -1
    assert (batch.producer_id, batch.producer_epoch) == (4242, 7)
    assert batch.records_count == 1 and batch.last_offset_delta == 0
    assert batch.next_offset - batch.base_offset == 1
    assert batch.control_type() == ctype
    rec, = batch.records()
    assert rec.offset == 1000 and rec.timestamp == 123_456
    assert bytes(rec.key) == struct.pack(">hh", 0, ctype)
    assert bytes(rec.value) == struct.pack(">hi", 0, 99)
    assert rec.headers == []


def test_control_type_on_data_batch_is_corrupt():
    with pytest.raises(CorruptRecordError):
        RecordBatch(_build([(0, b"k", b"v")])).control_type()


def test_control_type_with_short_key_is_corrupt():
    buf = _build([(0, b"\x00\x00\x01", b"")], is_control=True, is_transactional=True,
                 producer_id=1, producer_epoch=0)
    with pytest.raises(CorruptRecordError):
        RecordBatch(buf).control_type()


def test_control_type_with_negative_version_is_corrupt():
    buf = _build([(0, struct.pack(">hh", -1, 1), b"")], is_control=True,
                 is_transactional=True, producer_id=1, producer_epoch=0)
    with pytest.raises(CorruptRecordError):
        RecordBatch(buf).control_type()


# --- in-place rewrites ------------------------------------------------------------------------

@pytest.mark.parametrize("codec", ALL_CODECS, ids=_codec_id)
def test_stamp_batch_keeps_crc(codec):
    buf = _build(_sample_rows(), compression=codec)
    crc_before = bytes(buf[17:21])
    stamp_batch(buf, 987_654_321, 17)
    assert bytes(buf[17:21]) == crc_before
    batch = RecordBatch(buf)
    batch.validate()
    assert batch.base_offset == 987_654_321
    assert batch.partition_leader_epoch == 17
    assert batch.batch_length == len(buf) - 12
    assert [r.offset for r in batch.records()] == [987_654_321 + i for i in range(5)]


def test_stamp_batch_at_position():
    first = _build([(0, b"a", b"1")])
    second = _build([(0, b"b", b"2"), (1, b"c", b"3")])
    buf = bytearray(first + second)
    stamp_batch(buf, 1, 5, pos=len(first))
    batches = list(iter_batches(buf))
    assert [(b.base_offset, b.partition_leader_epoch) for b in batches] == [(0, -1), (1, 5)]
    for b in batches:
        b.validate()


@pytest.mark.parametrize("pos", range(21, 88))
def test_flip_covered_byte_fails_crc(pos):
    buf = _build([(1_000, b"key", b"value", [("h", b"v")]), (1_001, None, b"x")],
                 producer_id=5, producer_epoch=1, base_sequence=0)
    assert len(buf) == 88
    for mask in (0x01, 0x80, 0xFF):
        bad = bytearray(buf)
        bad[pos] ^= mask
        with pytest.raises(CorruptRecordError, match="CRC"):
            RecordBatch(bad).validate()
        assert not RecordBatch(bad).is_valid


@pytest.mark.parametrize("codec", ALL_CODECS, ids=_codec_id)
def test_flip_any_covered_byte_fails_crc_every_codec(codec):
    buf = _build(_sample_rows(3), compression=codec)
    for pos in range(21, len(buf)):
        bad = bytearray(buf)
        bad[pos] ^= 0x5A
        with pytest.raises(CorruptRecordError, match="CRC"):
            RecordBatch(bad).validate()


@pytest.mark.parametrize("pos", range(17, 21))
def test_flip_stored_crc_fails(pos):
    buf = _build([(0, b"k", b"v")])
    buf[pos] ^= 0x10
    with pytest.raises(CorruptRecordError, match="CRC"):
        RecordBatch(buf).validate()


@pytest.mark.parametrize("pos", range(12, 16))
def test_flip_leader_epoch_keeps_crc(pos):
    buf = _build(_sample_rows(2))
    for mask in (0x01, 0xFF):
        bad = bytearray(buf)
        bad[pos] ^= mask
        RecordBatch(bad).validate()


def test_wrong_magic_is_corrupt():
    buf = _build([(0, b"k", b"v")])
    for magic in (0, 1, 3, 0xFF):
        bad = bytearray(buf)
        bad[16] = magic
        with pytest.raises(CorruptRecordError, match="magic"):
            RecordBatch(bad)


def test_short_or_truncated_buffer_is_corrupt():
    buf = bytes(_build([(0, b"k", b"v")]))
    with pytest.raises(CorruptRecordError):
        RecordBatch(buf[:60])
    with pytest.raises(CorruptRecordError):
        RecordBatch(buf[:-1])
    bad = bytearray(buf)
    struct.pack_into(">i", bad, 8, 48)
    with pytest.raises(CorruptRecordError):
        RecordBatch(bad)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=_codec_id)
def test_set_log_append_time(codec):
    buf = _build(_sample_rows(), compression=codec)
    assert RecordBatch(buf).timestamp_type == CREATE_TIME
    set_log_append_time(buf, 1_800_000_000_123)
    batch = RecordBatch(buf)
    batch.validate()
    assert batch.timestamp_type == LOG_APPEND_TIME
    assert batch.attributes & 0x08
    assert batch.compression == codec
    assert batch.max_timestamp == 1_800_000_000_123
    recs = batch.records()
    assert len(recs) == 5
    assert all(r.timestamp == 1_800_000_000_123 for r in recs)
    # every other record field is untouched
    assert [(bytes(r.key), bytes(r.value)) for r in recs] == [
        (k, v) for _, k, v, _ in _sample_rows()]


def test_set_log_append_time_at_position():
    first = _build([(10, b"a", b"1")])
    second = _build([(20, b"b", b"2"), (30, b"c", b"3")], compression=GZIP)
    buf = bytearray(first + second)
    set_log_append_time(buf, 999, pos=len(first))
    one, two = iter_batches(buf)
    one.validate()
    two.validate()
    assert [r.timestamp for r in one.records()] == [10]
    assert [r.timestamp for r in two.records()] == [999, 999]
    assert (one.timestamp_type, two.timestamp_type) == (CREATE_TIME, LOG_APPEND_TIME)


def test_timestamp_type_from_builder():
    rows = [(100, b"k", b"v"), (300, b"k", b"v"), (200, b"k", b"v")]
    create = RecordBatch(_build(rows))
    append = RecordBatch(_build(rows, timestamp_type=LOG_APPEND_TIME))
    assert create.timestamp_type == CREATE_TIME
    assert append.timestamp_type == LOG_APPEND_TIME
    assert [r.timestamp for r in create.records()] == [100, 300, 200]
    assert create.max_timestamp == append.max_timestamp == 300
    assert [r.timestamp for r in append.records()] == [300, 300, 300]


# --- record count mismatch --------------------------------------------------------------------

def _with_count(codec: int, delta: int) -> bytearray:
    buf = _build(_sample_rows(4), compression=codec)
    (count,) = struct.unpack_from(">i", buf, 57)
    struct.pack_into(">i", buf, 57, count + delta)
    return _recrc(buf)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=_codec_id)
@pytest.mark.parametrize("delta", [1, 2, 1000, -1, -3, -4])
def test_record_count_mismatch(codec, delta):
    batch = RecordBatch(_with_count(codec, delta))
    batch.validate()                          # CRC and header are fine; the records are not
    with pytest.raises(CorruptRecordError):
        batch.records()


@pytest.mark.parametrize("codec", ALL_CODECS, ids=_codec_id)
def test_record_count_huge_or_negative(codec):
    for count in (INT32_MAX, -1):
        buf = _build(_sample_rows(2), compression=codec)
        struct.pack_into(">i", buf, 57, count)
        batch = RecordBatch(_recrc(buf))
        with pytest.raises(CorruptRecordError):
            batch.records()
        if count < 0:
            with pytest.raises(CorruptRecordError, match="negative record count"):
                batch.validate()


def test_record_length_mismatch_is_corrupt():
    buf = _build([(0, b"key", b"value")])
    buf[61] += 2                               # record length varint 0x1c (14) -> 0x1e (15)
    batch = RecordBatch(_recrc(buf))
    with pytest.raises(CorruptRecordError):
        batch.records()


def test_unused_attribute_bits_are_corrupt():
    buf = _build([(0, b"k", b"v")])
    struct.pack_into(">h", buf, 21, 0x0100)
    with pytest.raises(CorruptRecordError, match="attribute"):
        RecordBatch(_recrc(buf)).validate()


# --- iter_batches -----------------------------------------------------------------------------

def _three_batches() -> tuple[list[bytearray], bytes]:
    parts = [_build([(0, b"a", b"1")], base_offset=0),
             _build([(0, b"b", b"2"), (1, b"c", b"3")], base_offset=1, compression=GZIP),
             _build(_sample_rows(3), base_offset=3)]
    return parts, b"".join(parts)


def test_iter_batches_all():
    parts, buf = _three_batches()
    got = list(iter_batches(buf))
    assert [b.base_offset for b in got] == [0, 1, 3]
    assert [b.position for b in got] == [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    assert [bytes(b.buffer) for b in got] == [bytes(p) for p in parts]
    for b in got:
        b.validate()


def test_iter_batches_torn_tail():
    parts, buf = _three_batches()
    head = len(buf) - len(parts[-1])
    for cut in range(head, len(buf)):
        got = list(iter_batches(buf[:cut]))
        assert [b.base_offset for b in got] == [0, 1], cut


def test_iter_batches_start_end():
    parts, buf = _three_batches()
    start = len(parts[0])
    got = list(iter_batches(buf, start, len(buf) - 1))
    assert [b.base_offset for b in got] == [1]
    assert got[0].position == start


@pytest.mark.parametrize("zeros", [17, 18, 61, 4096])
def test_iter_batches_zero_filled_tail(zeros, tmp_path):
    _, buf = _three_batches()
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(buf + b"\x00" * zeros)
    data = path.read_bytes()
    it = iter_batches(data, path=path)
    assert [next(it).base_offset for _ in range(3)] == [0, 1, 3]
    with pytest.raises(CorruptRecordError) as info:
        next(it)
    assert info.value.position == len(buf)
    assert info.value.path == str(path)


@pytest.mark.parametrize("zeros", [1, 16])
def test_iter_batches_short_zero_tail_is_quiet(zeros):
    _, buf = _three_batches()
    assert len(list(iter_batches(buf + b"\x00" * zeros))) == 3


def test_iter_batches_bad_magic_is_corrupt():
    _, buf = _three_batches()
    bad = bytearray(buf)
    bad[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        list(iter_batches(bad))


# --- producer / transactional / delete horizon ------------------------------------------------

@pytest.mark.parametrize("codec", ALL_CODECS, ids=_codec_id)
def test_producer_fields_round_trip(codec):
    buf = _build(_sample_rows(4), compression=codec, producer_id=123_456_789_012,
                 producer_epoch=32_767, base_sequence=42, is_transactional=True,
                 partition_leader_epoch=9, base_offset=77)
    batch = RecordBatch(buf)
    batch.validate()
    assert batch.is_transactional and not batch.is_control
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (
        123_456_789_012, 32_767, 42)
    assert batch.last_sequence == 45
    assert batch.partition_leader_epoch == 9
    assert batch.compression == codec and batch.compression_name == compression.CODEC_NAMES[codec]
    assert _as_tuples(batch) == [
        (77 + i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(_sample_rows(4))]


def test_non_idempotent_defaults():
    batch = RecordBatch(_build([(0, b"k", b"v")]))
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
    assert batch.last_sequence == -1
    assert not batch.is_transactional and not batch.is_control


def test_last_sequence_wraps():
    rows = [(0, b"k", b"v")] * 4
    batch = RecordBatch(_build(rows, producer_id=1, producer_epoch=0,
                               base_sequence=INT32_MAX - 1))
    assert batch.last_sequence == 1     # MAX-1, MAX, 0, 1


def test_explicit_offset_deltas():
    builder = BatchBuilder(base_offset=100)
    assert builder.append(0, b"a", b"1", offset_delta=0) == 0
    assert builder.append(0, b"b", b"2", offset_delta=5) == 5
    assert builder.append(0, b"c", b"3") == 6
    with pytest.raises(ValueError):
        builder.append(0, b"d", b"4", offset_delta=6)
    batch = RecordBatch(builder.build())
    assert batch.last_offset_delta == 6 and batch.records_count == 3
    assert [r.offset for r in batch.records()] == [100, 105, 106]


@pytest.mark.parametrize("codec", ALL_CODECS, ids=_codec_id)
def test_delete_horizon_round_trip(codec):
    rows = [(1_000, b"a", None), (9_000, b"b", b"2"), (-5, b"c", b"3"), (5_000, b"d", None)]
    buf = _build(rows, compression=codec, delete_horizon_ms=7_777)
    batch = RecordBatch(buf)
    batch.validate()
    assert batch.has_delete_horizon
    assert batch.attributes & 0x40
    assert batch.delete_horizon_ms == 7_777
    assert batch.base_timestamp == 7_777
    assert batch.max_timestamp == 9_000
    assert [r.timestamp for r in batch.records()] == [1_000, 9_000, -5, 5_000]


@pytest.mark.parametrize("horizon", [0, 7_777])
def test_delete_horizon_on_empty_batch(horizon):
    # Kafka's MemoryRecordsBuilder sets baseTimestamp = deleteHorizonMs even with no records.
    batch = RecordBatch(BatchBuilder(delete_horizon_ms=horizon).build())
    batch.validate()
    assert batch.has_delete_horizon
    assert batch.delete_horizon_ms == batch.base_timestamp == horizon
    assert batch.records() == []


def test_no_delete_horizon():
    batch = RecordBatch(_build([(1_000, b"a", b"1")]))
    assert not batch.has_delete_horizon
    assert batch.delete_horizon_ms == -1
    assert batch.base_timestamp == 1_000


# --- codecs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", ALL_CODECS, ids=_codec_id)
def test_codec_round_trip(codec):
    rows = _sample_rows(50)
    batch = RecordBatch(_build(rows, compression=codec))
    batch.validate()
    assert batch.compression == codec
    assert _as_tuples(batch) == [(i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(rows)]


def test_compression_shrinks_repetitive_data():
    rows = [(0, None, b"x" * 10_000)]
    plain = len(_build(rows))
    for codec in COMPRESSED:
        assert len(_build(rows, compression=codec)) < plain // 10, compression.CODEC_NAMES[codec]


def test_snappy_is_xerial_framed():
    buf = _build([(0, None, b"y" * 100_000)], compression=SNAPPY)
    assert bytes(buf[61:69]) == b"\x82SNAPPY\x00"
    assert struct.unpack_from(">ii", buf, 69) == (1, 1)
    assert len(RecordBatch(buf).records()[0].value) == 100_000


MISSING = [(ZSTD, "_zstd", "zstandard", "zstd"), (LZ4, "_lz4_frame", "lz4", "lz4"),
           (SNAPPY, "_cramjam", "cramjam", "snappy")]


@pytest.mark.parametrize("codec,attr,package,name", MISSING, ids=[m[3] for m in MISSING])
def test_missing_codec_package_on_build(monkeypatch, codec, attr, package, name):
    monkeypatch.setattr(compression, attr, None)
    assert compression.available_codecs()[name] is False
    builder = BatchBuilder(compression=codec)
    builder.append(0, b"k", b"v")
    with pytest.raises(UnsupportedCodecError, match=package) as info:
        builder.build()
    assert isinstance(info.value, CorruptRecordError)


@pytest.mark.parametrize("codec,attr,package,name", MISSING, ids=[m[3] for m in MISSING])
def test_missing_codec_package_on_decode(monkeypatch, codec, attr, package, name):
    buf = _build(_sample_rows(3), compression=codec)
    monkeypatch.setattr(compression, attr, None)
    batch = RecordBatch(buf, position=4096, path="/data/t-0/00000000000000000000.log")
    batch.validate()                          # the bytes are fine
    with pytest.raises(UnsupportedCodecError, match=package) as info:
        batch.records()
    assert isinstance(info.value, CorruptRecordError)
    assert info.value.position == 4096
    assert info.value.path == "/data/t-0/00000000000000000000.log"


def test_available_codecs_all_installed():
    assert compression.available_codecs() == {"none": True, "gzip": True, "snappy": True,
                                              "lz4": True, "zstd": True}


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_invalid_codec_in_attributes(codec):
    buf = _build(_sample_rows(2))
    struct.pack_into(">h", buf, 21, codec)
    batch = RecordBatch(_recrc(buf))
    assert batch.compression == codec
    with pytest.raises(CorruptRecordError, match="codec"):
        batch.validate()
    assert not batch.is_valid
    with pytest.raises(CorruptRecordError):
        batch.records()


@pytest.mark.parametrize("codec", [-1, 5, 8])
def test_builder_rejects_invalid_codec(codec):
    with pytest.raises(ValueError):
        BatchBuilder(compression=codec)


@pytest.mark.parametrize("codec", COMPRESSED, ids=_codec_id)
def test_garbage_compressed_payload_is_corrupt(codec):
    buf = _build([(0, None, b"z" * 500)], compression=codec)
    body = bytearray(buf[61:])
    for i in range(len(body)):
        body[i] ^= 0xA5
    buf = _recrc(bytearray(buf[:61]) + body)
    batch = RecordBatch(buf)
    batch.validate()
    with pytest.raises(CorruptRecordError):
        batch.records()


@pytest.mark.parametrize("name,code", [
    (None, NONE), ("none", NONE), ("gzip", GZIP), ("snappy", SNAPPY), ("lz4", LZ4),
    ("zstd", ZSTD), ("GZIP", GZIP), ("Zstd", ZSTD)])
def test_codec_from_name(name, code):
    assert codec_from_name(name) == code


@pytest.mark.parametrize("name", ["", "brotli", "zstandard", "lz4-frame", " gzip"])
def test_codec_from_name_rejects(name):
    with pytest.raises(ValueError, match="compression"):
        codec_from_name(name)


# --- errors -----------------------------------------------------------------------------------

def test_corrupt_record_error_names_path_and_position():
    buf = bytearray(_build([(0, b"k", b"v")]))
    buf[30] ^= 1
    batch = RecordBatch(buf, position=1234, path="seg.log")
    with pytest.raises(CorruptRecordError) as info:
        batch.validate()
    err = info.value
    assert (err.path, err.position) == ("seg.log", 1234)
    assert str(err).startswith("seg.log at byte 1234: CRC mismatch")
