"""The broker's Produce of a plain batch in C, ``_crecords.produce_plain``, against the Python
path of ``ProduceApis.append``.

Two brokers' produce sides (each its own logs, partition table, state region, group commit and
free-space guard) take the same random requests: plain batches mostly, as bytearray, writable
view or bytes, and now and then an idempotent, transactional, control, damaged or oversized
one, for a known, unknown or internal topic, with acks 0, 1 or all, a partition in durable
mode, and a free-space guard that is off, roomy, nearly full or due for a new reading. One side
has the C call, the other not (``native.produce_plain = None``). After each request both
returned the same reply or raised the same error, and hold the same files, counters,
partitions to publish and space accounting.
"""

from __future__ import annotations

import os
import re
import types

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from mq import errors
from mq.broker.apis.produce import ProduceApis
from mq.broker.conns import Connections
from mq.broker.flushing import GroupCommit
from mq.broker.partitions import PartitionTable
from mq.broker.space import FreeSpaceGuard
from mq.broker.wakeups import StatePublisher
from mq.log import native
from mq.log.builder import build_batch
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.protocol.state import StateWriter

pytest.importorskip("mq.log._crecords")

MiB = 1 << 20
TOPICS = [("t", 0), ("t", 1), ("d", 0)]           # "d": durable (the high watermark trails)


class Side:
    """One broker's produce side over its own directory."""

    def __init__(self, root, min_free: int, free: int) -> None:
        os.makedirs(root)
        self.root = root
        self.clock = [0.0]
        self.free = [free]
        self.table = PartitionTable(8)
        self.logs = []
        for topic, partition in TOPICS:
            plog = PartitionLog.open(os.path.join(root, f"{topic}-{partition}"),
                                     LogConfig(max_message_bytes=600, segment_bytes=4096,
                                               index_interval_bytes=1024))
            if topic == "d":
                plog.high_watermark_follows_log_end = False
            self.logs.append(plog)
            self.table.add(topic, partition, plog)
        self.writer = StateWriter(os.path.join(root, "state"), slots=8)
        self.commit = GroupCommit(self.table, Connections(MiB),
                                  StatePublisher(self.writer, self.table))
        # The file system's free bytes come from the test: the same on both sides.
        self.space = FreeSpaceGuard(root, min_free,
                                    statvfs=lambda path: types.SimpleNamespace(
                                        f_bavail=self.free[0], f_frsize=1),
                                    clock=lambda: self.clock[0])
        self.apis = ProduceApis(self.table, self.commit, self.space, "mq-test",
                                lambda conn, message: None, leader_epoch=3)

    def produce(self, request: tuple):
        topic, partition, acks, batch, kind = request
        batch = bytes(batch) if kind == "bytes" else bytearray(batch)
        if kind == "view":
            batch = memoryview(batch)
        try:
            return self.apis.append(object(), 7, topic, partition, acks, batch)
        except (errors.MQError, ValueError) as err:
            return type(err), re.sub(r"\d+", "N", str(err).replace(self.root, "<dir>"))

    def state(self) -> tuple:
        files = {}
        for plog in self.logs:
            for name in sorted(os.listdir(plog.dir)):
                with open(os.path.join(plog.dir, name), "rb") as f:
                    files[f"{os.path.basename(plog.dir)}/{name}"] = f.read()
        parts = [(p.topic, p.partition, p.produced_records, p.produced_bytes,
                  p.log.log_end_offset, p.log.high_watermark) for p in self.table]
        touched = sorted((p.topic, p.partition) for p in self.table.touched)
        space = (self.space._free, self.space._admitted, self.space.refusing)
        return files, parts, touched, space

    def close(self) -> None:
        for plog in self.logs:
            plog.close()
        self.writer.close()


@st.composite
def requests(draw) -> tuple:
    kind = draw(st.sampled_from(["plain"] * 6 + ["idempotent", "transactional", "control",
                                                 "damaged", "big"]))
    n = draw(st.integers(1, 4))
    values = [draw(st.binary(max_size=700 if kind == "big" else 120)) for _ in range(n)]
    records = [(1_000 + i, None, v) for i, v in enumerate(values)]
    if kind == "idempotent":
        batch = build_batch(records, producer_id=9, producer_epoch=0,
                            base_sequence=draw(st.integers(0, 2)))
    elif kind == "transactional":
        batch = build_batch(records, producer_id=9, producer_epoch=0, base_sequence=0,
                            is_transactional=True)
    elif kind == "control":
        batch = build_batch(records, is_control=True)
    else:
        batch = build_batch(records)
    if kind == "damaged":
        batch[draw(st.integers(0, len(batch) - 1))] ^= 0x04
    topic, partition = draw(st.sampled_from([("t", 0)] * 6 + TOPICS + [
        ("nope", 0), ("t", 5), ("__consumer_offsets", 0)]))
    acks = draw(st.sampled_from([1] * 8 + [0, -1]))
    as_type = draw(st.sampled_from(["ba", "ba", "view", "bytes"]))
    return topic, partition, acks, bytes(batch), as_type


# No shrinking: an example builds two brokers' worth of logs, and shrinking one took minutes.
@settings(max_examples=20, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(requests(), min_size=1, max_size=25),
       guard=st.sampled_from([(0, 0), (MiB, 100 * MiB), (MiB, MiB + 2000)]),
       ticks=st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.5, 3.0]), min_size=25, max_size=25))
def test_the_c_produce_answers_and_stores_what_the_python_path_does(tmp_path, monkeypatch,
                                                                   batches, guard, ticks):
    root = tmp_path / os.urandom(4).hex()
    with_c, with_py = Side(str(root / "c"), *guard), Side(str(root / "py"), *guard)
    fast = native.produce_plain
    try:
        for request, tick in zip(batches, ticks):
            for side in (with_c, with_py):
                side.clock[0] += tick                   # a new reading now and then
                side.free[0] -= 300
            c_out = with_c.produce(request)
            monkeypatch.setattr(native, "produce_plain", None)
            py_out = with_py.produce(request)
            monkeypatch.setattr(native, "produce_plain", fast)
            assert c_out == py_out, request
            assert with_c.state() == with_py.state(), request
    finally:
        with_c.close()
        with_py.close()


def test_the_common_case_is_answered_in_c(tmp_path):
    side = Side(str(tmp_path / "s"), MiB, 100 * MiB)
    try:
        part = side.table.get("t", 0)
        part.log.append(build_batch([(1_000, None, b"first")]), leader_epoch=3)  # the epoch's
        batch = build_batch([(1_000, None, b"x" * 50)])
        reply = native.produce_plain(side.table.by_key, side.space, side.table.touched, "t", 0,
                                     batch, 3, 1_000, 7, 0)
        assert reply is None                         # the guard's first reading is due
        side.space.free_bytes()
        reply = native.produce_plain(side.table.by_key, side.space, side.table.touched, "t", 0,
                                     batch, 3, 1_000, 7, 0)
        assert reply == [0, 7, 0, None, 1, -1, 0]
        assert (part.produced_records, part.produced_bytes) == (1, len(batch))
        assert side.table.touched == {part} and side.space._admitted == len(batch)
        assert part.log.log_end_offset == 2
    finally:
        side.close()
