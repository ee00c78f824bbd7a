"""The broker's publication of a partition's state in C, ``_crecords.publish_slot``, against
the Python path (``PartitionTable.state_of`` and ``StateWriter.publish``).

One log takes a random run of appends, transactions, rolls, truncations, deleted records and
a high watermark held back (durable mode); after each step its partition is published twice,
into two regions: by the C call (falling back to the Python path where it declines, as the
broker does) and by the Python path alone. The two slots hold the same 64 bytes and the two
partitions the same segment-set generation after every step.
"""

from __future__ import annotations

import os
import secrets

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq.broker.partitions import Partition, PartitionTable
from mq.log import native
from mq.log.builder import build_batch
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.protocol.state import StateWriter, slot_offset

pytest.importorskip("mq.log._crecords")

SLOT = 3
PID = 42


def writer(tmp_path, name: str) -> StateWriter:
    """A region of its own (its name comes from the data dir)."""
    path = tmp_path / f"{name}-{os.getpid()}-{secrets.token_hex(4)}"
    path.mkdir()
    return StateWriter(str(path), slots=8)


def slot_bytes(w: StateWriter) -> bytes:
    base = slot_offset(SLOT)
    return bytes(w.region[base:base + 64])


def publish_c(w: StateWriter, part: Partition) -> bool:
    published = native.publish_slot(w.region, slot_offset(SLOT), part.log, part)
    if not published:
        w.publish(SLOT, PartitionTable.state_of(part))
    return published


def publish_py(w: StateWriter, part: Partition) -> None:
    w.publish(SLOT, PartitionTable.state_of(part))


def step(plog: PartitionLog, op: tuple) -> None:
    kind, n = op
    if kind == "append":
        plog.append(build_batch([(1_000 + i, None, b"v" * n) for i in range(1 + n % 3)]))
    elif kind == "txn":
        entry = plog.producers.producers.get(PID)
        seq = 0 if entry is None or not entry.batches else entry.batches[-1].last_seq + 1
        plog.append(build_batch([(1_000, None, b"t")], producer_id=PID, producer_epoch=0,
                                base_sequence=seq, is_transactional=True))
    elif kind == "marker":
        if plog.producers.first_unstable_offset is not None:
            plog.append_marker(PID, 0, commit=n % 2 == 0)
    elif kind == "roll":
        plog.roll()
    elif kind == "truncate":
        plog.truncate_to(max(plog.log_start_offset, plog.log_end_offset - n % 4))
    elif kind == "delete":
        plog.delete_records_before(min(plog.high_watermark, plog.log_start_offset + n % 3))
    elif kind == "hold":                        # durable mode: the high watermark trails
        plog.high_watermark_follows_log_end = False
        plog.high_watermark = max(plog.log_start_offset, plog.log_end_offset - n % 3)
    elif kind == "follow":
        plog.high_watermark_follows_log_end = True
        plog.high_watermark = plog.log_end_offset


OPS = st.tuples(st.sampled_from(["append"] * 6 + ["txn", "marker", "roll", "truncate",
                                                   "delete", "hold", "follow"]),
                st.integers(0, 200))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=30))
def test_the_c_publication_writes_what_the_python_path_writes(tmp_path, ops):
    d = tmp_path / secrets.token_hex(4)
    plog = PartitionLog.open(str(d / "t-0"), LogConfig(segment_bytes=1024))
    w_c, w_py = writer(tmp_path, "c"), writer(tmp_path, "py")
    part_c, part_py = Partition("t", 0, plog, SLOT), Partition("t", 0, plog, SLOT)
    try:
        for op in [("append", 1)] + ops:
            try:
                step(plog, op)
            except Exception:                   # a step the log refuses changes nothing here
                pass
            publish_c(w_c, part_c)
            publish_py(w_py, part_py)
            assert slot_bytes(w_c) == slot_bytes(w_py), op
            assert (part_c.shape, part_c.generation) == (part_py.shape, part_py.generation)
    finally:
        plog.close()
        w_c.close()
        w_py.close()


def test_the_common_case_is_published_in_c_and_the_rest_declined_untouched(tmp_path):
    plog = PartitionLog.open(str(tmp_path / "t-0"), LogConfig())
    w = writer(tmp_path, "w")
    part = Partition("t", 0, plog, SLOT)
    try:
        plog.append(build_batch([(1_000, None, b"x")]))
        assert native.publish_slot(w.region, slot_offset(SLOT), plog, part) is True
        assert part.generation == 1                 # the first shape seen
        seq = int.from_bytes(slot_bytes(w)[:8], "little")
        assert seq == 2                             # odd while written, even after
        plog.append(build_batch([(1_000, None, b"t")], producer_id=PID, producer_epoch=0,
                                base_sequence=0, is_transactional=True))
        before = slot_bytes(w)
        assert native.publish_slot(w.region, slot_offset(SLOT), plog, part) is False
        assert slot_bytes(w) == before              # an open transaction: the Python path's
        plog.append_marker(PID, 0, commit=True)
        plog.high_watermark_follows_log_end = False
        plog.high_watermark -= 1
        assert native.publish_slot(w.region, slot_offset(SLOT), plog, part) is False
        plog.high_watermark_follows_log_end = True
        plog.high_watermark = plog.log_end_offset
        publish_py(w, part)                 # pops the committed transaction off the heap
        assert native.publish_slot(w.region, slot_offset(SLOT), plog, part) is True
        with pytest.raises(ValueError, match="outside the region"):
            native.publish_slot(w.region, len(w.region) - 8, plog, part)
    finally:
        plog.close()
        w.close()
