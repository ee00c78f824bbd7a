"""A caught-up consumer's poll in one C call, ``_crecords.tail_take``, on a region and a segment
built here.

``tail_take`` reads one partition's slot of the broker's state region under its seqlock
(``mq.protocol.state``), then takes the new batches of the segment the consumer's last read
ended in, from its map or one ``pread``: ``take_batches`` over the same bytes, cut at the
published high watermark and its byte position. Anything else it leaves to the Python path
(status 2). Here: it returns what ``take_batches`` returns over those bytes, never a record at
or past the high watermark, and the Python path's cases each send it there.
"""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq.client.fetcher import TAIL_EMPTY, TAIL_PYTHON, TAIL_TOOK, Record
from mq.log.batch import RecordBatch
from mq.log.builder import build_batch
from mq.log.layout import crc32c

_crecords = pytest.importorskip("mq.log._crecords")
tail_take, take_batches = _crecords.tail_take, _crecords.take_batches

SLOT = 64 + 64 * 2                # slot 2 of mq.protocol.state's layout
META = 7
GEN = 3
BASE = 0                          # the segment's base offset
BIG = 1 << 30


def segment(sizes: list[int]) -> tuple[bytes, list[RecordBatch]]:
    """Batches of ``sizes`` records at consecutive offsets from ``BASE``, as a segment holds
    them."""
    out, parsed, offset = bytearray(), [], BASE
    for i, n in enumerate(sizes):
        b = build_batch([(1_000 + j, None, b"v%d-%d" % (i, j)) for j in range(n)])
        struct.pack_into(">q", b, 0, offset)
        b[17:21] = struct.pack(">I", crc32c(bytes(b[21:])))
        parsed.append(RecordBatch(memoryview(bytes(b)), len(out)))
        out += b
        offset = parsed[-1].next_offset
    return bytes(out), parsed


def region(hw: int, hw_position: int, *, seq: int = 10, meta: int = META, gen: int = GEN,
           base: int = BASE, log_start: int = 0, log_end: int | None = None) -> bytearray:
    r = bytearray(SLOT + 64)
    struct.pack_into("<q", r, 32, meta)
    struct.pack_into("<qqqqqqqq", r, SLOT, seq, hw, hw, log_start, base, hw_position, gen,
                     hw if log_end is None else log_end)
    return r


@pytest.fixture
def seg_file(tmp_path):
    opened = []

    def write(data: bytes) -> int:
        path = tmp_path / f"{len(opened)}.log"
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        opened.append(fd)
        return fd
    yield write
    for fd in opened:
        os.close(fd)


def call(reg, data: bytes, fd: int, position: int, offset: int, *, mapped: int | None = None,
         remap_at: int = BIG, max_bytes: int = BIG, meta: int = META, gen: int = GEN,
         base: int = BASE):
    mapped = len(data) if mapped is None else mapped
    return tail_take(reg, SLOT, meta, gen, base, memoryview(data)[:mapped], mapped, fd,
                     position, offset, remap_at, max_bytes, True, "t", 0, Record)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=8), data=st.data())
def test_it_takes_what_take_batches_takes_below_the_high_watermark(seg_file, sizes, data):
    raw, batches = segment(sizes)
    fd = seg_file(raw)
    k = data.draw(st.integers(0, len(batches) - 1), label="first batch read")
    h = data.draw(st.integers(k + 1, len(batches)), label="batches published")
    position = batches[k].position
    offset = data.draw(st.integers(batches[k].base_offset, batches[k].last_offset),
                       label="offset")
    hw = batches[h - 1].next_offset
    hw_position = batches[h - 1].position + batches[h - 1].size
    mapped = data.draw(st.integers(0, len(raw)), label="mapped")
    max_bytes = data.draw(st.sampled_from([1, 200, BIG]), label="max_bytes")
    status, seq, records, pos, next_offset = call(region(hw, hw_position), raw, fd, position,
                                                  offset, mapped=mapped, max_bytes=max_bytes)
    if position < mapped:
        want = take_batches(memoryview(raw), position, min(hw_position, mapped), offset, hw,
                            max_bytes, True, "t", 0, Record)
        shift = 0
    else:
        tail = memoryview(os.pread(fd, min(hw_position - position, max_bytes), position))
        want = take_batches(tail, 0, len(tail), offset, hw, max_bytes, True, "t", 0, Record)
        shift = position
    if want[1] == (position - shift):
        assert status == TAIL_PYTHON and records is None      # nothing whole to take
    else:
        assert (status, seq) == (TAIL_TOOK, 10)
        assert records == want[0] and pos == shift + want[1] and next_offset == want[2]
        assert all(offset <= r.offset < hw for r in records)


def test_nothing_past_the_position_is_empty_with_the_sequence_to_sleep_on(seg_file):
    raw, batches = segment([2, 3])
    fd = seg_file(raw)
    end = batches[1].next_offset
    assert call(region(end, len(raw), seq=42), raw, fd, len(raw), end)[:3] == \
        (TAIL_EMPTY, 42, None)


def test_nothing_to_read_is_empty_whatever_the_segment():
    """A reader with no segment to go on in (nothing read yet: base -1, no map, no
    descriptor) still learns that nothing is there, and sleeps; something there is the
    Python path's."""
    raw, _ = segment([2])
    assert tail_take(region(2, len(raw), seq=8), SLOT, META, -1, -1, None, 0, -1, 0, 2, 0, BIG,
                     True, "t", 0, Record)[:2] == (TAIL_EMPTY, 8)
    assert tail_take(region(2, len(raw)), SLOT, META, -1, -1, None, 0, -1, 0, 0, 0, BIG,
                     True, "t", 0, Record)[0] == TAIL_PYTHON


def test_records_stop_at_the_published_high_watermark_not_the_bytes(seg_file):
    raw, batches = segment([2, 3, 1])
    fd = seg_file(raw)
    hw, hw_position = batches[0].next_offset, batches[1].position
    status, _, records, pos, offset = call(region(hw, hw_position), raw, fd, 0, 0)
    assert status == TAIL_TOOK and [r.offset for r in records] == [0, 1]
    assert (pos, offset) == (hw_position, hw)


@pytest.mark.parametrize("change", ["meta", "generation", "segment", "deleted", "below start",
                                    "past the end", "position at the end", "remap due"])
def test_what_the_python_path_must_read_goes_there(seg_file, change):
    raw, batches = segment([2, 3])
    fd = seg_file(raw)
    hw = batches[1].next_offset
    kw, reg, position, offset = {}, None, 0, 0
    if change == "meta":
        kw["meta"] = META + 1
    elif change == "generation":
        kw["gen"] = GEN + 1
    elif change == "segment":
        kw["base"] = BASE + 100
    elif change == "deleted":
        reg = region(-1, len(raw))
    elif change == "below start":
        reg = region(hw, len(raw), log_start=1)
    elif change == "past the end":
        offset = hw + 1
    elif change == "position at the end":
        reg = region(hw + 1, len(raw), log_end=hw + 1)
        position, offset = len(raw), hw
    elif change == "remap due":
        kw["remap_at"] = len(raw)
    reg = reg if reg is not None else region(hw, len(raw))
    status, _, records, pos, next_offset = call(reg, raw, fd, position, offset, **kw)
    assert (status, records, pos, next_offset) == (TAIL_PYTHON, None, position, offset)


def test_a_batch_take_batches_leaves_is_left_to_the_python_path(seg_file):
    raw, batches = segment([2])
    damaged = bytearray(raw)
    damaged[-1] ^= 1                                   # CRC mismatch
    fd = seg_file(bytes(damaged))
    assert call(region(2, len(raw)), bytes(damaged), fd, 0, 0)[0] == TAIL_PYTHON


def test_bad_arguments_raise(seg_file):
    raw, _ = segment([1])
    fd = seg_file(raw)
    with pytest.raises(ValueError):
        tail_take(bytearray(100), SLOT, META, GEN, BASE, memoryview(raw), len(raw), fd, 0, 0,
                  BIG, BIG, True, "t", 0, Record)
    with pytest.raises(TypeError):
        tail_take(region(1, len(raw)), SLOT, META, GEN, BASE, memoryview(raw), len(raw), fd, 0,
                  0, BIG, BIG, True, "t", 0, dict)


# --- tail_wait_take: the sleep and the take after its wake-up, in one call --------------------
def test_the_woken_partitions_take_follows_the_wait_in_the_same_call(seg_file):
    """``tail_wait_take`` calls the wait it is given with its arguments, and for a
    partition's index takes with that partition's arguments exactly what ``tail_take`` takes;
    for any other outcome (the local word, a timeout, a changed word) it takes nothing."""
    raw, batches = segment([2, 3])
    fd = seg_file(raw)
    reg = region(batches[1].next_offset, len(raw))
    mapped = len(raw)
    args = (reg, SLOT, META, GEN, BASE, memoryview(raw), mapped, fd, batches[1].position,
            batches[1].base_offset, BIG, BIG, True, "t", 0, Record)
    calls = []

    def wait(*wait_args):
        calls.append(wait_args)
        return wait_args[0]
    woken, taken = _crecords.tail_wait_take(wait, (1, "x"), [None, args])
    assert calls == [(1, "x")] and woken == 1 and taken == tail_take(*args)
    assert taken[0] == TAIL_TOOK and [r.offset for r in taken[2]] == [2, 3, 4]
    for outcome in (2, -1, -2, 0):        # the local word, timeout, changed, no arguments
        assert _crecords.tail_wait_take(wait, (outcome,), [None, args]) == (outcome, None)
    with pytest.raises(ZeroDivisionError):
        _crecords.tail_wait_take(lambda: 1 / 0, (), [args])     # the wait's error, raised
    with pytest.raises(TypeError):
        _crecords.tail_wait_take(wait, [1], [args])             # wait_args: a tuple
