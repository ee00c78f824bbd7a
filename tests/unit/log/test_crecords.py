"""The optional C codec (mq/log/_crecords.c) against its pure-Python references: the decoder
of mq/log/batch.py, mq.log.builder.RecordEncoder and mq.client.accumulator.RecordAccumulator.

Decoding goes through ``RecordBatch.records()`` both ways: with ``native.decode_records`` set
to the extension's ``decode_records``, and set to ``None`` (what ``MQ_PURE_PYTHON=1`` or a
missing extension give). Both must return equal records or both raise ``CorruptRecordError`` —
the C path never anything else, and never crashes. Encoding (``BatchBuilder.append`` through
the C accumulator) must give the same bytes as the Python path.
"""

from __future__ import annotations

import gc
import gzip
import os
import random
import struct
import subprocess
import sys
import time
import tracemalloc
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq.client.accumulator import RecordAccumulator, RecordFuture
from mq.errors import CorruptRecordError
from mq.log import native
from mq.log.batch import BatchRecord, RecordBatch
from mq.log.builder import BatchBuilder
from mq.log.compression import GZIP, NONE
from mq.log.layout import CREATE_TIME, HEADER, LOG_APPEND_TIME, RECORD_BATCH_OVERHEAD, crc32c
from mq.log.varints import encode_varint

_crecords = pytest.importorskip("mq.log._crecords")
C_DECODE = _crecords.decode_records
Record = _crecords.Record


def examples(n: int) -> settings:
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@contextmanager
def decoder(fn):
    """Run ``RecordBatch.records()`` through ``fn`` (the C decoder, or None for Python)."""
    saved = native.decode_records
    native.decode_records = fn
    try:
        yield
    finally:
        native.decode_records = saved


def _b(x):
    return None if x is None else bytes(x)


def _row(rec) -> tuple:
    return (rec.offset, rec.timestamp, _b(rec.key), _b(rec.value),
            [(k, _b(v)) for k, v in rec.headers])


def decode(buf, fn):
    """``("ok", records)`` or ``("corrupt", error)`` for one decoder."""
    batch = RecordBatch(buf)
    with decoder(fn):
        try:
            return "ok", batch.records()
        except CorruptRecordError as err:
            return "corrupt", err


def check_same(buf) -> list | None:
    """Decode ``buf`` both ways and assert identical outcomes; returns the C records."""
    c_kind, c_out = decode(buf, C_DECODE)
    py_kind, py_out = decode(buf, None)
    assert c_kind == py_kind, (c_out, py_out)
    if c_kind == "corrupt":
        # raised by records() itself, or converted by it from the extension's ValueError
        assert c_out.__cause__ is None or type(c_out.__cause__) in (ValueError,
                                                                    UnicodeDecodeError)
        return None
    assert [_row(r) for r in c_out] == [_row(r) for r in py_out]
    for c_rec, py_rec in zip(c_out, py_out):
        assert type(c_rec) is Record and type(py_rec) is BatchRecord
        assert c_rec == py_rec and py_rec == c_rec
        assert not (c_rec != py_rec)  # noqa: SIM202 -- __ne__ is its own C slot
        assert repr(c_rec) == repr(py_rec)
        assert type(c_rec.offset) is int and type(c_rec.timestamp) is int
        assert type(c_rec.headers) is list
        for value in (c_rec.key, c_rec.value, *(v for _, v in c_rec.headers)):
            assert value is None or type(value) is memoryview
    return c_out


# --- (a) batches built by BatchBuilder --------------------------------------------------------

def _big_blob(args) -> bytes:
    size, seed = args
    return random.Random(seed).randbytes(size)


blobs = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=40),
                  st.tuples(st.integers(16 * 1024 + 1, 40 * 1024), st.integers(0, 2**32))
                  .map(_big_blob))
header_keys = st.one_of(st.text(max_size=12), st.sampled_from(["trace-id", "ключ", "ü", "😀"]))
header_lists = st.one_of(
    st.lists(st.tuples(header_keys, st.one_of(st.none(), st.binary(max_size=16))), max_size=4),
    st.integers(50, 300).map(lambda n: [(f"h{i % 7}", None if i % 5 == 0 else b"v" * (i % 9))
                                        for i in range(n)]),
)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
TS = st.one_of(st.integers(0, 2_000_000_000_000), st.integers(-(1 << 62), 1 << 62), st.just(-1))


@st.composite
def batches(draw, max_records: int = 8):
    n = draw(st.integers(0, max_records))
    base = draw(TS)
    builder = BatchBuilder(
        compression=draw(st.sampled_from([NONE, NONE, NONE, GZIP])),
        timestamp_type=draw(st.sampled_from([CREATE_TIME, LOG_APPEND_TIME])),
        base_offset=draw(st.one_of(st.integers(0, 1 << 62),
                                   st.integers((1 << 63) - 2**20, (1 << 63) - 1))))
    delta = -1
    for _ in range(n):
        ts = draw(st.one_of(st.just(base), st.integers(base - 100_000, base + 100_000), TS))
        delta += draw(st.one_of(st.just(1), st.integers(1, 1 << 20)))
        builder.append(ts, draw(blobs), draw(blobs), draw(header_lists), offset_delta=delta)
    return builder.build()


@examples(150)
@given(batches())
def test_built_batches_decode_identically(buf):
    records = check_same(buf)
    assert records is not None
    if RecordBatch(buf).compression == NONE:            # zero copy: views into `buf` itself
        for rec in records:
            for view in (rec.key, rec.value, *(v for _, v in rec.headers)):
                assert view is None or view.obj is buf


# --- (b) random and mutated bytes -------------------------------------------------------------

def framed(section: bytes, count: int, *, base_offset: int = 0, base_ts: int = 0,
           max_ts: int = 0, attributes: int = 0) -> bytes:
    """A batch header (CRC not computed; records() does not check it) around ``section``."""
    return HEADER.pack(base_offset, 49 + len(section), -1, 2, 0, attributes, 0, base_ts, max_ts,
                       -1, -1, -1, count) + section


@examples(400)
@given(st.binary(max_size=300), st.integers(-1, 40), INT64, INT64, INT64, st.booleans())
def test_random_sections(section, count, base_offset, base_ts, max_ts, log_append):
    check_same(framed(section, count, base_offset=base_offset, base_ts=base_ts, max_ts=max_ts,
                      attributes=0x08 if log_append else 0))


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("set"), st.integers(0, 10**6), st.sampled_from([0, 1, 0x7F, 0x80, 0xFF])),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 8)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.none()),
)


def mutate(section: bytes, ops) -> bytes:
    buf = bytearray(section)
    for op, where, arg in ops:
        if not buf:
            break
        pos = where % len(buf)
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
    return bytes(buf)


@examples(500)
@given(batches(max_records=5).filter(lambda b: RecordBatch(b).compression == NONE),
       st.lists(mutation, min_size=1, max_size=4), st.integers(-1, 2), st.booleans())
def test_mutated_sections(buf, ops, count_change, in_gzip):
    """Damage only the records section, re-frame (maybe gzip it) so records() parses it."""
    batch = RecordBatch(buf)
    section = mutate(bytes(buf[61:]), ops)
    attributes = batch.attributes
    if in_gzip:
        section = gzip.compress(section, mtime=0)
        attributes |= GZIP
    out = framed(section, max(-1, batch.records_count + count_change),
                 base_offset=batch.base_offset, base_ts=batch.base_timestamp,
                 max_ts=batch.max_timestamp, attributes=attributes)
    check_same(out)


def record(body: bytes) -> bytes:
    return encode_varint(len(body)) + body


VARLONG_MAX_BITS = b"\xff" * 9 + b"\x7f"          # 70 bits: beyond int64 after zig-zag


@pytest.mark.parametrize("section, count, kwargs", [
    # timestamp deltas that do not fit int64 (Python ints are unbounded; so must C's be)
    (record(b"\x00" + VARLONG_MAX_BITS + b"\x00\x01\x01\x00"), 1, {"base_ts": 5}),
    (record(b"\x00" + b"\xfe" + b"\xff" * 8 + b"\x7f" + b"\x00\x01\x01\x00"), 1, {}),
    (record(b"\x00" + b"\xff" * 9 + b"\x01" + b"\x00\x01\x01\x00"), 1, {"base_ts": -(1 << 63)}),
    (record(b"\x00" + VARLONG_MAX_BITS + b"\x00\x01\x01\x00"), 1, {"attributes": 0x08}),
    # offsets past int64
    (record(b"\x00\x00\xfe\xff\xff\xff\x0f\x01\x01\x00"), 1, {"base_offset": (1 << 63) - 1}),
    (record(b"\x00\x00\x01\x01\x01\x00"), 1, {"base_offset": -(1 << 63)}),
    # 5-byte varints beyond int32 (accepted by the Python reference, so by C too)
    (record(b"\x00\x00\xfe\xff\xff\xff\x7f\x01\x01\x00"), 1, {}),
    # overlong varints, bad lengths, header troubles
    (record(b"\x00" + b"\x80" * 10 + b"\x00\x00\x01\x01\x00"), 1, {}),
    (record(b"\x00\x00" + b"\x80" * 5 + b"\x00\x01\x01\x00"), 1, {}),
    (record(b"\x00\x00\x00\x03\x01\x00"), 1, {}),                 # key length -2
    (record(b"\x00\x00\x00\x01\x03\x00"), 1, {}),                 # value length -2
    (record(b"\x00\x00\x00\x01\x01\x01"), 1, {}),                 # header count -1
    (record(b"\x00\x00\x00\x01\x01\x02\x04\xff\xfe\x01"), 1, {}),  # non-UTF-8 header key
    (record(b"\x00\x00\x00\x01\x01\x02\x02h\x03"), 1, {}),        # header value length -2
    (record(b"\x00\x00\x00\x01\x01\x02\x02h\x01"), 1, {}),        # ok: header value None
    (record(b"\x00\x00\x00\x01\x01\x00") * 2, 1, {}),             # bytes left over
    (record(b"\x00\x00\x00\x01\x01\x00\x00"), 1, {}),             # record not consumed
    (b"\x0a\x00\x00\x00\x01\x01\x00", 1, {}),                     # length 5
    (b"\x80", 1, {}),
    (b"", 0, {}),
])
def test_edge_cases(section, count, kwargs):
    check_same(framed(section, count, **kwargs))


def test_error_reasons_are_specific():
    with decoder(C_DECODE), pytest.raises(CorruptRecordError) as info:
        RecordBatch(framed(record(b"\x00\x00\x00\x03\x01\x00"), 1)).records()
    assert "malformed record 0 of 1" in info.value.reason
    assert "invalid key length -2" in info.value.reason
    with decoder(C_DECODE), pytest.raises(CorruptRecordError, match="bytes left after 1"):
        RecordBatch(framed(record(b"\x00\x00\x00\x01\x01\x00") * 2, 1)).records()
    with decoder(C_DECODE), pytest.raises(CorruptRecordError, match="can't decode"):
        RecordBatch(framed(record(b"\x00\x00\x00\x01\x01\x02\x04\xff\xfe\x01"), 1)).records()


# --- (c) encoding: the record accumulator (BatchBuilder.append, the producer's add) -----------

any_int = st.one_of(INT64, st.integers(-(1 << 80), 1 << 80))
buffers = st.one_of(blobs, st.binary(max_size=20).map(bytearray),
                    st.binary(max_size=20).map(memoryview))
any_headers = st.one_of(st.none(), st.just(()), st.just([]), header_lists,
                        header_lists.map(lambda hs: [list(h) for h in hs]),
                        header_lists.map(lambda hs: [(k.encode(), v) for k, v in hs]))
ACCUMULATORS = [RecordAccumulator, _crecords.RecordAccumulator]


def accumulated(cls, first_ts, rows, horizon=-1, deltas=None):
    """``rows`` through a ``cls`` accumulator: (records, size, count, base, max, last)."""
    acc = cls(horizon)
    acc.append(first_ts, None, None)
    for i, (ts, key, value, headers) in enumerate(rows):
        if deltas is None:
            acc.append(first_ts + ts, key, value, headers)
        else:
            acc.append(first_ts + ts, key, value, headers, deltas[i])
    buf = acc.buffer()
    assert buf[:RECORD_BATCH_OVERHEAD] == bytes(RECORD_BATCH_OVERHEAD)   # header room
    return (acc.records(), bytes(buf), acc.size, acc.count, acc.base_timestamp,
            acc.max_timestamp, acc.last_offset_delta)


@examples(200)
@given(st.lists(st.tuples(st.integers(-(1 << 61), 1 << 61), buffers, buffers, any_headers),
                max_size=6),
       st.integers(-(1 << 61), 1 << 61), st.sampled_from([-1, 0, 1_700_000_000_000]),
       st.one_of(st.none(), st.lists(st.integers(1, 1 << 40), min_size=6, max_size=6)))
def test_accumulator_matches_python(rows, first_ts, horizon, gaps):
    """Same record bytes, sizes, counts and header fields from the C accumulator as from the
    pure-Python reference, for any timestamps (deltas beyond int64 wrap the same way),
    bytes-like keys/values, header forms, a delete horizon and explicit offset deltas."""
    deltas = None if gaps is None else [sum(gaps[:i + 1]) for i in range(len(rows))]
    assert accumulated(_crecords.RecordAccumulator, first_ts, rows, horizon, deltas) == \
        accumulated(RecordAccumulator, first_ts, rows, horizon, deltas)


def built(acc_cls, rows, compression, fields, more, recycled=None):
    """``rows`` through a BatchBuilder over ``acc_cls`` (in a copy of the ``recycled`` buffer,
    if given), built; then built again with other header fields, and again after ``more``
    records: every batch as bytes, and whether each earlier batch was left as it was."""
    fields = dict(fields)
    acc = acc_cls(-1, None, None, fields.pop("capacity"),
                  None if recycled is None else bytearray(recycled))
    builder = BatchBuilder(compression=compression, records=acc, **fields)
    for ts, key, value, headers in rows:
        builder.append(ts, key, value, headers)
    first = builder.build()
    first_bytes = bytes(first)
    builder.base_sequence += 1                       # re-sealed: the header is rewritten
    second = builder.build()
    second_bytes = bytes(second)
    for ts, key, value, headers in more:
        builder.append(ts, key, value, headers)
    third = builder.build()
    for batch in (first_bytes, second_bytes, bytes(third)):
        RecordBatch(batch).validate()
    return (first_bytes, second_bytes, bytes(third), bytes(first) == first_bytes,
            bytes(second) == second_bytes)


@examples(100)
@given(st.lists(st.tuples(st.integers(0, 1 << 41), buffers, buffers, any_headers),
                max_size=5),
       st.sampled_from([NONE, GZIP]),
       st.fixed_dictionaries({"producer_id": st.integers(-1, 1 << 40),
                              "producer_epoch": st.integers(-1, 1000),
                              "base_sequence": st.integers(-1, 1 << 20),
                              "is_transactional": st.booleans(),
                              "capacity": st.sampled_from([0, 61, 300, 1 << 16])}),
       st.lists(st.tuples(st.integers(0, 1 << 41), buffers, buffers, any_headers),
                max_size=2),
       st.one_of(st.none(), st.binary(max_size=3000)))
def test_builder_batches_match_python(rows, compression, fields, more, recycled):
    """BatchBuilder.build over the C accumulator (the header written into its own buffer,
    sized by a capacity hint or not, fresh or a used one handed back with whatever it held)
    gives the pure-Python reference's bytes, built again after a change of header or more
    records, and never changes a batch already handed out."""
    c = built(_crecords.RecordAccumulator, rows, compression, fields, more, recycled)
    assert c == built(RecordAccumulator, rows, compression, fields, more, recycled)
    assert c[3] and c[4]


def test_a_handed_back_buffer_is_built_in_only_while_nothing_else_holds_it():
    recycled = bytearray(b"\xff" * 4096)
    acc = _crecords.RecordAccumulator(-1, None, None, 4096, recycled)
    acc.append(5, b"k", b"v" * 100, ())
    assert recycled == b"\xff" * 4096                           # still held here: untouched
    assert bytes(acc.buffer()[:RECORD_BATCH_OVERHEAD]) == bytes(RECORD_BATCH_OVERHEAD)
    ident = id(recycled)
    acc = _crecords.RecordAccumulator(-1, None, None, 4096, recycled)
    del recycled
    acc.append(5, b"k", b"v" * 100, ())
    out = acc.buffer()
    assert id(out) == ident and len(out) == acc.size             # built in it, no copy
    with pytest.raises(TypeError):
        _crecords.RecordAccumulator(-1, None, None, 0, b"bytes")


def test_buffer_is_handed_out_without_a_copy_only_when_unshared():
    acc = _crecords.RecordAccumulator()
    assert acc.buffer() == bytes(RECORD_BATCH_OVERHEAD)       # empty: the header room
    acc.append(5, b"k", b"v" * 1000, ())
    first = acc.buffer()
    assert acc.buffer() is not first and acc.buffer() == first  # held: a copy
    ident = id(first)
    del first
    again = acc.buffer()
    assert id(again) == ident                                   # its own buffer again
    view = memoryview(again)
    acc.append(6, None, b"w", ())                               # moves to a new buffer
    assert len(view) == len(again) and acc.size == len(acc.buffer()) > len(again)
    view.release()


@examples(100)
@given(st.lists(st.tuples(st.integers(-(1 << 61), 1 << 61), buffers, buffers,
                          st.one_of(st.none(), st.just(()), header_lists)), max_size=6),
       st.integers(0, 1 << 61))
def test_accumulator_matches_encode_record(rows, first_ts):
    """The accumulator's records are encode_record's, one after another."""
    acc = _crecords.RecordAccumulator()
    expected = []
    for i, (ts, key, value, headers) in enumerate(rows):
        ts = max(first_ts + ts, 0)
        acc.append(ts, key, value, headers)
        expected.append(_crecords.encode_record(ts - acc.base_timestamp, i, key, value, headers))
    assert acc.records() == b"".join(expected)


@pytest.mark.parametrize("cls", ACCUMULATORS)
def test_accumulator_add_returns_futures(cls):
    class Future(cls is RecordAccumulator and RecordFuture or _crecords.RecordFuture):
        __slots__ = ()

    owner = object()
    acc = cls(future_type=Future, owner=owner)
    before = int(time.time() * 1000)
    f0 = acc.add(None, None, b"v", ())
    f1 = acc.add(1234, b"k", b"w", [("h", None)])
    after = int(time.time() * 1000)
    assert type(f0) is Future and f0._batch is owner and f1._batch is owner
    assert (f0._delta, f1._delta, f1._ts) == (0, 1, 1234)
    assert before <= f0._ts <= after and acc.base_timestamp == f0._ts
    assert acc.count == 2 and acc.max_timestamp == f0._ts
    assert Future(owner, 7, 8)._delta == 7                  # constructible as before


@pytest.mark.parametrize("cls", ACCUMULATORS)
def test_accumulator_errors_leave_it_unchanged(cls):
    acc = cls()
    acc.append(100, b"k", b"v", [("h", b"x")])
    state = (acc.records(), acc.size, acc.count, acc.base_timestamp, acc.max_timestamp,
             acc.last_offset_delta)
    for args, error in [((200, "key", None, ()), TypeError),
                        ((200, None, None, [("k",)]), ValueError),
                        ((200, None, None, [(None, b"")]), (TypeError, AttributeError)),
                        ((200, None, None, (), 0), ValueError)]:   # delta does not follow
        with pytest.raises(error):
            acc.append(*args)
    assert (acc.records(), acc.size, acc.count, acc.base_timestamp, acc.max_timestamp,
            acc.last_offset_delta) == state


def test_accumulator_is_not_reentered_by_python_code_it_runs():
    """A header pair whose iteration appends to the same accumulator (Python code run while
    a record is half encoded) is refused, not allowed to move the buffer under the record."""
    acc = _crecords.RecordAccumulator()

    class Sneaky:
        def __iter__(self):
            acc.append(1, None, b"x" * 10_000)
            return iter(("h", b"v"))

    with pytest.raises(RuntimeError, match="re-entered"):
        acc.append(1, None, b"v", [Sneaky()])
    assert acc.count == 0
    acc.append(1, None, b"v", [("h", b"v")])
    ref = RecordAccumulator()
    ref.append(1, None, b"v", [("h", b"v")])
    assert (acc.records(), acc.count) == (ref.records(), 1)


def test_accumulator_add_needs_a_future_type():
    with pytest.raises(TypeError):
        _crecords.RecordAccumulator().add(1, None, b"v", ())
    with pytest.raises(TypeError):
        _crecords.RecordAccumulator(future_type=int)


def test_encode_record_errors():
    enc = _crecords.encode_record
    empty = b"\x0c\x00\x00\x00\x01\x01\x00"    # length 6, attrs, ts, offset, null key/value, 0
    assert enc(0, 0, None, None, None) == enc(0, 0, None, None, ()) == empty
    for args, error in [((0, 0, "key", None, ()), TypeError),            # str is not bytes
                        ((0, 0, None, None, [("k",)]), ValueError),       # not a pair
                        ((0, 0, None, None, [(None, b"")]), TypeError),   # header key None
                        ((0, 0, None, None, [("\ud800", b"")]), UnicodeEncodeError),
                        ((0, 0, None, None, 5), TypeError),
                        ((0.5, 0, None, None, ()), TypeError),
                        ((0, 0, None, None), TypeError)]:
        with pytest.raises(error):
            enc(*args)


# --- the extension's own interface ------------------------------------------------------------

def test_decode_records_arguments():
    payload = memoryview(record(b"\x00\x00\x02\x01\x01\x00"))
    (rec,) = C_DECODE(payload, 10, 100, 0, 999, 1)
    assert (rec.offset, rec.timestamp, rec.key, rec.value, rec.headers) == (11, 100, None,
                                                                             None, [])
    (rec,) = C_DECODE(payload, 10, 100, 1, 999, 1)                 # LogAppendTime: max ts
    assert rec.timestamp == 999
    (rec,) = C_DECODE(payload, 10, 100, 0, 999, 1, BatchRecord)    # custom record type
    assert type(rec) is BatchRecord and rec.offset == 11
    (rec,) = C_DECODE(payload, 10, 100, 0, 999, 1, Record)
    assert type(rec) is Record
    with pytest.raises(TypeError):
        C_DECODE(bytes(payload), 10, 100, 0, 999, 1)               # not a memoryview
    with pytest.raises(TypeError):
        C_DECODE(payload.cast("b"), 10, 100, 0, 999, 1)            # not format 'B'
    with pytest.raises(ValueError, match="record count 9 exceeds"):
        C_DECODE(payload, 0, 0, 0, 0, 9)
    with pytest.raises(ValueError, match="record count -1 exceeds"):
        C_DECODE(payload, 0, 0, 0, 0, -1)


def test_gc_state_is_restored():
    """decode_records pauses the cyclic GC while it allocates; it must leave it as it was."""
    good = memoryview(record(b"\x00\x00\x00\x01\x01\x00"))
    bad = memoryview(record(b"\x00\x00\x00\x03\x01\x00"))
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            C_DECODE(good, 0, 0, 0, 0, 1)
            assert gc.isenabled() is enabled
            with pytest.raises(ValueError):
                C_DECODE(bad, 0, 0, 0, 0, 1)
            assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_record_type_behaves_like_batch_record():
    rec = Record(offset=1, timestamp=2, key=memoryview(b"k"), value=None,
                 headers=[("a", memoryview(b"x"))])
    twin = BatchRecord(1, 2, b"k", None, [("a", b"x")])
    assert rec == twin and twin == rec
    assert rec != BatchRecord(1, 2, b"k", b"", [("a", b"x")])
    assert rec != Record(1, 2, b"k", None, [("a", None)])
    assert rec != object() and rec != 5
    assert repr(rec) == repr(twin) == \
        "BatchRecord(offset=1, timestamp=2, key=b'k', value=None, headers=[('a', b'x')])"
    with pytest.raises(TypeError):
        hash(rec)
    rec.offset = 7                                         # attributes are writable, as slots
    assert rec.offset == 7
    (decoded,) = C_DECODE(memoryview(record(b"\x00\x00\x00\x01\x01\x00")), 0, 0, 0, 0, 1)
    headers = decoded.headers                              # created on first access, then kept
    assert headers == [] and decoded.headers is headers
    headers.append(("k", None))
    assert decoded.headers == [("k", None)]
    with pytest.raises(AttributeError):
        del decoded.headers


@pytest.mark.parametrize("readonly", [False, True])
def test_keys_and_values_are_the_views_slicing_makes(readonly):
    """The C decoder narrows a copy of the payload's view instead of slicing it; each key and
    value is still what ``payload[a:b]`` would be, in every attribute, and outlives the
    payload's own view."""
    builder = BatchBuilder()
    for i, value in enumerate([b"alpha", b"", b"beta" * 300, None]):
        builder.append(1000 + i, b"key-%d" % i, value, [("h", b"hv-%d" % i)])
    buf = builder.build()
    data = bytes(buf) if readonly else buf
    payload = memoryview(data)
    records = RecordBatch(payload).records()
    assert [r.value for r in records] == [b"alpha", b"", b"beta" * 300, None]
    for view in (v for r in records for v in (r.key, r.value, r.headers[0][1])
                 if v is not None):
        start = bytes(data).index(bytes(view)) if len(view) else 0
        ref = payload[start:start + len(view)]
        assert (view.obj, view.readonly, view.format, view.itemsize, view.ndim, view.shape,
                view.strides, view.nbytes, view.c_contiguous, view.contiguous) == \
            (ref.obj, ref.readonly, ref.format, ref.itemsize, ref.ndim, ref.shape,
             ref.strides, ref.nbytes, ref.c_contiguous, ref.contiguous)
        assert view == ref and view.tobytes() == ref.tobytes() and view[1:] == ref[1:]
        if readonly:
            assert hash(view) == hash(ref.tobytes())
    payload.release()                                      # the views hold the buffer alone
    assert records[2].value.tobytes() == b"beta" * 300


def test_env_var_forces_pure_python():
    code = ("from mq.log import native; print(native.decode_records is None "
            "and native.RecordAccumulator is None)")
    for env, expected in (({"MQ_PURE_PYTHON": "1"}, "True"), ({"MQ_PURE_PYTHON": "0"}, "False")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, **env}, check=True)
        assert out.stdout.strip() == expected


# --- references and memory --------------------------------------------------------------------

def _sample_batch() -> bytearray:
    builder = BatchBuilder()
    for i in range(20):
        builder.append(1_700_000_000_000 + i, b"key-%d" % i if i % 3 else None, b"v" * 100,
                       [("trace", b"t%d" % i), ("ключ", None)] if i % 2 else ())
    return builder.build()


@contextmanager
def _alone():
    """The calling thread keeps the GIL for the block: a thread left running by another test
    on this worker (a feeder, a client's I/O thread) allocates nothing and moves no refcount
    while the block measures."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def test_refcounts_are_stable():
    raw = _sample_batch()
    payload = RecordBatch(raw).records_payload()
    bad = payload[:-3]                                      # error path: truncated last record

    def counts():
        return sys.getrefcount(raw), sys.getrefcount(payload), sys.getrefcount(None)

    gc.collect()
    gc.disable()                  # no collection of other tests' garbage moves None's count
    try:
        with _alone():
            before = counts()
            for _ in range(2000):
                C_DECODE(payload, 0, 0, 0, 0, 20)
                try:
                    C_DECODE(bad, 0, 0, 0, 0, 20)
                except ValueError:
                    pass
            after = counts()
    finally:
        gc.enable()
    assert after == before


def test_no_memory_growth():
    raw = _sample_batch()
    payload = RecordBatch(raw).records_payload()
    bad = payload[:-3]

    def work(n):
        acc = None                                          # a chain of owners, then freed
        for _ in range(n):
            _crecords.encode_record(5, 1, b"k", b"v" * 100, [("trace", b"t"), ("ключ", None)])
            acc = _crecords.RecordAccumulator(future_type=_crecords.RecordFuture, owner=acc)
            acc.add(None, b"k", b"v" * 100, [("trace", b"t"), ("ключ", None)])
            acc.records()
            held = acc.buffer()
            acc.add(None, b"k", b"v" * 100, ())                 # moves to a new buffer
            del held
            acc.buffer()
            try:
                _crecords.encode_record(5, 1, b"k", b"v", [("trace", "not bytes")])
            except TypeError:
                pass
            for rec in C_DECODE(payload, 0, 0, 0, 0, 20):
                assert rec.headers is not None              # materialise the lazy lists too
            try:
                C_DECODE(bad, 0, 0, 0, 0, 20)
            except ValueError:
                pass

    work(1000)                                              # warm caches and freelists
    gc.collect()
    tracemalloc.start()
    try:
        with _alone():
            work(1000)
            gc.collect()
            start, _ = tracemalloc.get_traced_memory()
            work(100_000 // 20)                             # 1e5 records each way
            gc.collect()
            end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert end - start < 64 * 1024, end - start


def test_crc_is_not_part_of_decoding():
    """records() never checks the CRC (validate() does): both paths agree on a bad one."""
    raw = _sample_batch()
    struct.pack_into(">I", raw, 17, crc32c(memoryview(raw)[21:]) ^ 1)
    assert check_same(bytes(raw)) is not None
