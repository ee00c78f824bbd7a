"""Hypothesis: batches round trip exactly; malformed bytes only ever raise CorruptRecordError."""

from __future__ import annotations

import gzip
import random
import re
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mq.errors import CorruptRecordError
from mq.log.batch import RecordBatch, iter_batches
from mq.log.builder import BatchBuilder
from mq.log.compression import CODEC_NAMES, GZIP, NONE
from mq.log.layout import CREATE_TIME, HEADER, LOG_APPEND_TIME, crc32c

INT32_MAX = (1 << 31) - 1
TS_BOUND = 1 << 62          # any two timestamps in [-2**62, 2**62] differ by a valid int64



def examples(n: int) -> settings:
    """Explicit example counts keep the file fast in CI (it inherits deadline=None)."""
    return settings(max_examples=n,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- strategies -------------------------------------------------------------------------------


def _large_blob():
    """~60-72 KiB blobs, generated from a seed (drawing every byte would be far too slow)."""
    def make(args):
        size, seed, compressible = args
        rnd = random.Random(seed)
        if compressible:
            return (rnd.randbytes(64) * (size // 64 + 1))[:size]
        return rnd.randbytes(size)
    return st.tuples(st.integers(60_000, 72_000), st.integers(0, 2**32),
                     st.booleans()).map(make)


def blobs(max_small: int = 40, large: bool = True):
    options = [st.none(), st.just(b""), st.binary(min_size=1, max_size=max_small)]
    strategy = st.one_of(*options)
    if large:
        # rare: a value big enough to span several snappy/lz4 blocks and need 3-byte varints
        strategy = st.one_of(*([strategy] * 9), _large_blob())
    return strategy


header_lists = st.lists(st.tuples(st.text(max_size=12), st.one_of(st.none(),
                                                                  st.binary(max_size=16))),
                        max_size=4)


@st.composite
def timestamps(draw, n: int) -> list[int]:
    base = draw(st.one_of(st.integers(0, 2_000_000_000_000),
                          st.integers(-TS_BOUND, TS_BOUND), st.just(-1)))
    out = []
    for _ in range(n):
        kind = draw(st.integers(0, 3))
        if kind == 0:
            ts = base
        elif kind == 1:
            ts = base + draw(st.integers(-100_000, 100_000))
        elif kind == 2:
            ts = base + draw(st.integers(-(1 << 40), 1 << 40))      # varlong deltas
        else:
            ts = draw(st.integers(-TS_BOUND, TS_BOUND))
        out.append(max(-TS_BOUND, min(TS_BOUND, ts)))
    return out


@st.composite
def offset_deltas(draw, n: int) -> list[int] | None:
    if draw(st.booleans()):
        return None                                          # let the builder number 0..n-1
    out, current = [], draw(st.integers(0, 3))
    for _ in range(n):
        out.append(current)
        current += draw(st.one_of(st.just(1), st.integers(1, 5), st.integers(1, 1 << 20)))
    return out


@st.composite
def batch_specs(draw, max_records: int = 12, large: bool = True, codecs=None):
    n = draw(st.integers(0, max_records))
    ts = draw(timestamps(n))
    deltas = draw(offset_deltas(n))
    rows = []
    for i in range(n):
        rows.append((ts[i], draw(blobs(large=large)), draw(blobs(large=large)),
                     draw(header_lists), None if deltas is None else deltas[i]))
    producer_id = draw(st.one_of(st.just(-1), st.integers(0, (1 << 63) - 1)))
    kwargs = dict(
        compression=draw(st.sampled_from(codecs or sorted(CODEC_NAMES))),
        timestamp_type=draw(st.sampled_from([CREATE_TIME, LOG_APPEND_TIME])),
        producer_id=producer_id,
        producer_epoch=draw(st.integers(-1, 32_767)),
        base_sequence=draw(st.integers(-1, INT32_MAX)),
        is_transactional=draw(st.booleans()),
        partition_leader_epoch=draw(st.integers(-1, INT32_MAX)),
        base_offset=draw(st.integers(0, 1 << 62)),
    )
    return rows, kwargs


def build(rows, kwargs) -> bytearray:
    builder = BatchBuilder(**kwargs)
    for ts, key, value, headers, delta in rows:
        builder.append(ts, key, value, headers, offset_delta=delta)
    return builder.build()


def _bytes(x):
    return None if x is None else bytes(x)


def _row(rec) -> tuple:
    return (rec.offset, rec.timestamp, _bytes(rec.key), _bytes(rec.value),
            [(k, _bytes(v)) for k, v in rec.headers])


# --- (a) round trip ---------------------------------------------------------------------------

@pytest.mark.parametrize("codec", sorted(CODEC_NAMES), ids=CODEC_NAMES.get)
@examples(30)
@given(batch_specs())
def test_round_trip(codec, spec):
    rows, kwargs = spec
    kwargs = dict(kwargs, compression=codec)
    buf = build(rows, kwargs)
    batch = RecordBatch(bytes(buf))
    batch.validate()
    assert batch.is_valid
    assert batch.size == len(buf)
    assert batch.compression == kwargs["compression"]
    assert batch.timestamp_type == kwargs["timestamp_type"]
    assert batch.is_transactional == kwargs["is_transactional"]
    assert not batch.is_control and not batch.has_delete_horizon
    assert batch.base_offset == kwargs["base_offset"]
    assert batch.partition_leader_epoch == kwargs["partition_leader_epoch"]
    assert batch.producer_id == kwargs["producer_id"]
    assert batch.producer_epoch == kwargs["producer_epoch"]
    assert batch.base_sequence == kwargs["base_sequence"]
    assert batch.records_count == len(rows)

    offsets, next_delta = [], 0
    for *_, delta in rows:
        delta = next_delta if delta is None else delta
        offsets.append(kwargs["base_offset"] + delta)
        next_delta = delta + 1
    assert batch.last_offset_delta == (offsets[-1] - kwargs["base_offset"] if rows else 0)
    max_ts = max([-1] + [r[0] for r in rows])
    assert batch.max_timestamp == max_ts

    got = batch.records()
    assert len(got) == len(rows)
    for rec, (ts, key, value, headers, _), offset in zip(got, rows, offsets):
        assert rec.offset == offset
        assert rec.timestamp == (max_ts if kwargs["timestamp_type"] == LOG_APPEND_TIME else ts)
        assert _bytes(rec.key) == key
        assert _bytes(rec.value) == value
        assert [(k, _bytes(v)) for k, v in rec.headers] == headers
        assert all(type(k) is str for k, _ in rec.headers)

    # the same batch read through the file framing, behind another batch
    framed = list(iter_batches(bytes(buf) + bytes(buf)))
    assert len(framed) == 2 and framed[1].position == len(buf)
    assert [_row(r) for r in framed[1].records()] == [_row(r) for r in got]


@examples(40)
@given(batch_specs(max_records=6, large=False), st.integers(-1, 1 << 50))
def test_delete_horizon_keeps_timestamps(spec, horizon):
    rows, kwargs = spec
    kwargs = dict(kwargs, timestamp_type=CREATE_TIME, delete_horizon_ms=horizon)
    batch = RecordBatch(build(rows, kwargs))
    batch.validate()
    assert batch.has_delete_horizon == (horizon >= 0)
    assert batch.delete_horizon_ms == horizon
    assert [r.timestamp for r in batch.records()] == [r[0] for r in rows]


# --- decoding that must fail cleanly ----------------------------------------------------------

def exercise(buf) -> list | None:
    """Run every decoding entry point over ``buf``; let anything but CorruptRecordError escape.

    Returns the decoded records of the first batch when they decode, else None."""
    decoded = None
    try:
        batch = RecordBatch(buf)
    except CorruptRecordError:
        batch = None
    if batch is not None:
        repr(batch)
        _ = (batch.last_sequence, batch.delete_horizon_ms, batch.compression_name,
             batch.is_valid, batch.next_offset)
        try:
            batch.validate()
        except CorruptRecordError:
            pass
        try:
            decoded = batch.records()
        except CorruptRecordError as err:
            event("records() failed: " + re.sub(r"\d+", "N", err.reason)[:30])
        else:
            event("records(): decoded")
            assert len(decoded) == batch.records_count
            for rec in decoded:
                repr(rec)
                assert rec.key is None or isinstance(bytes(rec.key), bytes)
                assert rec.value is None or isinstance(bytes(rec.value), bytes)
                assert all(type(k) is str for k, _ in rec.headers)
        if batch.is_control:
            try:
                batch.control_type()
            except CorruptRecordError:
                pass
    try:
        for framed in iter_batches(buf):
            try:
                framed.validate()
                framed.records()
            except CorruptRecordError:
                pass
    except CorruptRecordError:
        pass
    return decoded


@st.composite
def framed_garbage(draw):
    """Random bytes behind a plausible frame (magic 2, consistent length, maybe a right CRC)."""
    body = draw(st.binary(max_size=300))
    fields = bytearray(draw(st.binary(min_size=40, max_size=40)))
    if draw(st.booleans()):
        struct.pack_into(">h", fields, 0, draw(st.integers(0, 0x7F)))      # sane attributes
    if draw(st.booleans()):
        struct.pack_into(">i", fields, 36, draw(st.integers(-2, 12)))       # small count
    covered = bytes(fields) + body
    crc = crc32c(covered) if draw(st.booleans()) else draw(st.integers(0, 2**32 - 1))
    head = struct.pack(">qiibI", draw(st.integers(-(1 << 63), (1 << 63) - 1)),
                       len(covered) + 9, draw(st.integers(-(1 << 31), INT32_MAX)), 2, crc)
    return head + covered


@examples(300)
@given(st.one_of(st.binary(max_size=400), framed_garbage()))
def test_random_bytes_only_raise_corrupt_record_error(buf):
    exercise(buf)
    exercise(bytearray(buf))
    exercise(memoryview(buf))


def _recrc(buf: bytearray) -> bytearray:
    if len(buf) >= 21:
        struct.pack_into(">I", buf, 17, crc32c(memoryview(buf)[21:]))
    return buf


def _reframe(buf: bytearray) -> bytearray:
    """Make batchLength agree with the buffer and recompute the CRC."""
    if len(buf) >= 12:
        struct.pack_into(">i", buf, 8, len(buf) - 12)
    return _recrc(buf)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("set"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 8)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.none()),
)


def mutate(buf: bytearray, ops, lo: int = 0) -> bytearray:
    """Apply ``ops`` to ``buf[lo:]`` (positions wrap around the mutable region)."""
    buf = bytearray(buf)
    for op, where, arg in ops:
        span = len(buf) - lo
        if span <= 0:
            break
        pos = lo + where % span
        if op == "flip":
            buf[pos] ^= arg
        elif op == "set":
            buf[pos] = arg
        elif op == "insert":
            buf[pos:pos] = arg
        elif op == "delete":
            del buf[pos:pos + arg]
        else:
            del buf[pos:]
    return buf


small_specs = batch_specs(max_records=5, large=False)


@examples(250)
@given(small_specs, st.lists(mutation, min_size=1, max_size=4),
       st.sampled_from(["raw", "recrc", "reframe"]))
def test_mutated_batches(spec, ops, fixup):
    """Mutations anywhere in the batch; optionally with the CRC (and length) made to match."""
    buf = mutate(build(*spec), ops)
    if fixup == "recrc":
        buf = _recrc(buf)
    elif fixup == "reframe":
        buf = _reframe(buf)
    exercise(bytes(buf))


@examples(300)
@given(batch_specs(max_records=5, large=False, codecs=[NONE]),
       st.lists(mutation, min_size=1, max_size=4), st.booleans())
def test_mutated_records_reach_the_parser(spec, ops, in_gzip):
    """Mutate only the (uncompressed) records section, then re-frame (and maybe re-compress
    with gzip) so that CRC and framing pass and the record parser sees the damage."""
    rows, kwargs = spec
    plain = build(rows, kwargs)
    body = mutate(plain[61:], ops)
    head = bytearray(plain[:61])
    if in_gzip:
        struct.pack_into(">h", head, 21, struct.unpack_from(">h", head, 21)[0] | GZIP)
        body = gzip.compress(bytes(body), mtime=0)
    buf = _reframe(head + body)
    batch = RecordBatch(bytes(buf))
    batch.validate()
    exercise(bytes(buf))


header_field = st.sampled_from(range(5, 13))   # HEADER fields from attributes to recordsCount


@examples(200)
@given(small_specs, header_field, st.integers(-(1 << 63), (1 << 63) - 1),
       st.booleans())
def test_mutated_header_fields(spec, index, raw_value, recrc):
    """Overwrite one CRC-covered header field with an arbitrary value of its width."""
    buf = build(*spec)
    fields = list(HEADER.unpack_from(buf))
    fmt = HEADER.format[1:][index]
    bits = {"b": 8, "h": 16, "i": 32, "q": 64, "I": 32}[fmt]
    if fmt == "I":
        value = raw_value % (1 << 32)
    else:
        value = (raw_value + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
    fields[index] = value
    HEADER.pack_into(buf, 0, *fields)
    if recrc:
        buf = _recrc(buf)
    exercise(bytes(buf))
