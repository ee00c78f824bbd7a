"""``batch_headers``: batch framing from headers alone, over a descriptor or bytes."""

from __future__ import annotations

import os

from builders import make_batch
from mq.log.batch_headers import (SCAN_BYTES, header_max_timestamp, read_frame_length,
                                  scan_headers)


def test_scan_headers_yields_each_whole_batch_and_stops_at_a_torn_tail(tmp_path):
    first = make_batch(3, base_offset=0, timestamp=1_000, ts_step=1)
    second = make_batch(2, base_offset=3, timestamp=2_000, ts_step=1)
    data = bytes(first) + bytes(second)
    path = tmp_path / "0.log"
    path.write_bytes(data + bytes(second)[:30])          # a torn third batch
    fd = os.open(path, os.O_RDONLY)
    try:
        heads = list(scan_headers(fd, 0, len(data) + 30))
        assert heads == [(0, len(first), 2, 1_002), (3, len(second), 1, 2_001)]
        assert list(scan_headers(fd, len(first), len(data))) == heads[1:]
        assert list(scan_headers(fd, 0, len(data) - 1)) == heads[:1]   # nothing past end
    finally:
        os.close(fd)


def test_read_frame_length_and_header_max_timestamp():
    batch = bytes(make_batch(4, timestamp=5_000, ts_step=1))
    assert read_frame_length(batch[:17]) == len(batch)
    assert read_frame_length(batch[:16]) is None
    assert read_frame_length(bytes(17)) is None                  # length 0, magic 0
    assert header_max_timestamp(batch[:SCAN_BYTES]) == 5_003
