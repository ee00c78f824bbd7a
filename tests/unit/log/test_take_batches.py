"""The tailing consumer's C read, ``_crecords.take_batches``, against the Python path.

``take_batches`` walks whole batches of a buffer (a segment's map, or a ``pread`` of its
tail) into public records. It takes only plain batches: at a control, compressed or damaged
batch it stops, and the Python path (RecordBatch, ``is_visible``, ``validate``, ``records``)
reads on from there. Here, over batches built by ``BatchBuilder``: what it takes equals what
``RecordBatch.records()`` decodes, cut to ``[offset, bound)``; it stops where it must, with
the position and offset a reader goes on from; damaged bytes never crash it or leak
records.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq.client.fetcher import Record
from mq.log.batch import RecordBatch
from mq.log.builder import build_batch, control_batch
from mq.log.compression import LZ4, NONE
from mq.log.layout import CREATE_TIME, LOG_APPEND_TIME, crc32c

_crecords = pytest.importorskip("mq.log._crecords")
take_batches = _crecords.take_batches

END, BUDGET, BOUND, OTHER = range(4)
BIG = 1 << 30

records_st = st.lists(st.tuples(
    st.integers(0, 1 << 41),
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=200),
    st.lists(st.tuples(st.sampled_from(["h", "trace", "é"]), st.none() | st.binary(max_size=8)),
             max_size=3)), min_size=1, max_size=6)


def examples(n: int) -> settings:
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def log(*batches: bytearray) -> tuple[memoryview, list[RecordBatch]]:
    """The batches one after another, at consecutive offsets, as a segment holds them."""
    out, parsed, offset = bytearray(), [], 0
    for b in batches:
        struct.pack_into(">q", b, 0, offset)
        b[17:21] = struct.pack(">I", crc32c(bytes(b[21:])))
        pos = len(out)
        out += b
        batch = RecordBatch(memoryview(bytes(b)), pos, "seg.log")
        parsed.append(batch)
        offset = batch.next_offset
    return memoryview(bytes(out)), parsed


def expected(batches: list[RecordBatch], offset: int, bound: int) -> list[Record]:
    """What the Python path returns of plain batches: records()' records in [offset, bound)."""
    return [Record("t", 3, r.offset, r.timestamp, b.timestamp_type, _b(r.key), _b(r.value),
                   [(k, _b(v)) for k, v in r.headers])
            for b in batches for r in b.records() if offset <= r.offset < bound]


def _b(v):
    return None if v is None else bytes(v)


def plain(records) -> list[Record]:
    return [r._replace(key=_b(r.key), value=_b(r.value),
                       headers=[(k, _b(v)) for k, v in r.headers]) for r in records]


def take(buf, start=0, end=None, offset=0, bound=BIG, max_bytes=BIG, check_crc=True):
    return take_batches(buf, start, len(buf) if end is None else end, offset, bound, max_bytes,
                        check_crc, "t", 3, Record)


@examples(200)
@given(st.lists(st.tuples(records_st, st.sampled_from([CREATE_TIME, LOG_APPEND_TIME])),
                min_size=1, max_size=5), st.data())
def test_plain_batches_come_out_as_the_python_path_decodes_them(specs, data):
    buf, batches = log(*(build_batch(r, timestamp_type=tt) for r, tt in specs))
    last = batches[-1].next_offset
    offset = data.draw(st.integers(0, last))
    bound = data.draw(st.integers(offset, last + 2))
    records, pos, next_offset, stop = take(buf, offset=offset, bound=bound)
    whole = [b for b in batches if b.last_offset < bound]          # it stops before the rest
    assert plain(records) == expected(whole, offset, bound)
    assert all(type(r) is Record for r in records)
    assert pos == sum(b.size for b in whole)
    assert stop == (BOUND if len(whole) < len(batches) else END)
    taken = [b for b in whole if b.last_offset >= offset]
    assert next_offset == (taken[-1].next_offset if taken else offset)


def test_keys_and_values_are_slices_of_the_buffer():
    buf, _ = log(build_batch([(5, b"k", b"value", [("h", b"v")])]))
    [r], _, _, _ = take(buf)
    assert isinstance(r.value, memoryview) and r.value.obj is buf.obj
    assert isinstance(r.headers[0][1], memoryview)
    assert (bytes(r.key), bytes(r.value), r.timestamp_ms, r.timestamp_type) == \
        (b"k", b"value", 5, CREATE_TIME)


@pytest.mark.parametrize("odd", ["control", "compressed"])
def test_it_stops_at_a_batch_the_python_path_reads(odd):
    other = control_batch(0, producer_id=7, producer_epoch=0) if odd == "control" else \
        build_batch([(1, None, b"x" * 50)], compression=LZ4)
    buf, batches = log(build_batch([(1, None, b"a")]), other, build_batch([(1, None, b"b")]))
    records, pos, offset, stop = take(buf)
    assert [bytes(r.value) for r in records] == [b"a"]
    assert (pos, offset, stop) == (batches[0].size, 1, OTHER)
    # started at that batch: nothing taken, nothing moved
    assert take(buf, start=pos, offset=1) == ([], pos, 1, OTHER)


def test_a_crc_mismatch_stops_it_when_crcs_are_checked():
    buf, batches = log(build_batch([(1, None, b"a")]), build_batch([(1, None, b"b")]))
    damaged = bytearray(buf)
    damaged[-2] ^= 0xFF                      # the second batch's value (its header count follows)
    damaged = memoryview(bytes(damaged))
    assert take(damaged)[1:] == (batches[0].size, 1, OTHER)
    records, pos, _, stop = take(damaged, check_crc=False)
    assert (len(records), pos, stop) == (2, len(damaged), END)


def test_records_that_do_not_decode_stop_it_and_leave_nothing_of_their_batch():
    buf, batches = log(build_batch([(1, None, b"a")]),
                       build_batch([(1, None, b"b"), (2, None, b"c")]))
    damaged = bytearray(buf)
    struct.pack_into(">i", damaged, batches[0].size + 57, 3)    # 3 records declared, 2 there
    damaged[batches[0].size + 17:batches[0].size + 21] = struct.pack(
        ">I", crc32c(bytes(damaged[batches[0].size + 21:])))
    records, pos, offset, stop = take(memoryview(bytes(damaged)))
    assert ([bytes(r.value) for r in records], pos, offset, stop) == \
        ([b"a"], batches[0].size, 1, OTHER)


def test_max_bytes_takes_whole_batches_and_at_least_one():
    buf, batches = log(*(build_batch([(1, None, b"v" * 30)]) for _ in range(4)))
    size = batches[0].size
    assert take(buf, max_bytes=1)[1:] == (size, 1, BUDGET)
    assert take(buf, max_bytes=2 * size + 1)[1:] == (2 * size, 2, BUDGET)
    assert take(buf, max_bytes=4 * size)[1:] == (4 * size, 4, END)


def test_a_torn_tail_ends_the_take_and_bytes_that_are_no_batch_stop_it():
    buf, batches = log(build_batch([(1, None, b"a")]), build_batch([(1, None, b"b")]))
    torn = take(buf, end=len(buf) - 1)
    assert (len(torn[0]), torn[1:]) == (1, (batches[0].size, 1, END))
    zeros = memoryview(bytes(buf) + bytes(80))
    assert take(zeros)[1:] == (len(buf), 2, OTHER)
    assert take(zeros, end=len(buf) + 20)[1:] == (len(buf), 2, OTHER)   # a short frame
    assert take(buf, end=len(buf) + 0)[3] == END


@examples(300)
@given(st.binary(min_size=0, max_size=400), st.integers(0, 20))
def test_arbitrary_bytes_never_crash_it(junk, offset):
    buf, _ = log(build_batch([(1, b"k", b"v", [("h", None)])]))
    data = memoryview(bytes(buf) + junk)
    records, pos, next_offset, stop = take(data, offset=offset)
    assert 0 <= pos <= len(data) and stop in (END, BUDGET, BOUND, OTHER)
    assert next_offset >= offset


def test_bad_arguments_are_refused():
    buf, _ = log(build_batch([(1, None, b"a")]))
    with pytest.raises(ValueError, match="window"):
        take(buf, end=len(buf) + 1)
    with pytest.raises(TypeError, match="tuple subclass"):
        take_batches(buf, 0, len(buf), 0, BIG, BIG, True, "t", 3, dict)
    assert NONE == 0
