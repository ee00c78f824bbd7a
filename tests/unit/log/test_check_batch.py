"""The broker's C check of a client's batch, ``_crecords.check_batch``, against the Python path.

``PartitionLog.append`` checks and stamps a client's batch in one C call when the topic is
CreateTime without ``message.timestamp.before.max.ms`` and the batch is a writable buffer;
whatever the call refuses goes through the Python checks, which say why. Here two logs take the
same batches, one with the C calls and one without (``native.check_batch`` and
``native.append_plain`` set to None): over
batches built by ``BatchBuilder`` and then damaged field by field or byte by byte, both
append the same bytes with the same ``AppendInfo``, or both raise the same error and leave
the buffer the same; what the C call refuses it never stamps.
"""

from __future__ import annotations

import re
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mq import errors
from mq.log import native
from mq.log.builder import build_batch
from mq.log.compression import LZ4, NONE
from mq.log.config import LogConfig
from mq.log.layout import crc32c
from mq.log.log import PartitionLog

_crecords = pytest.importorskip("mq.log._crecords")
check_batch = _crecords.check_batch

HOUR_MS = 3_600_000
UNLIMITED = (1 << 63) - 1

# Header fields a damage may set: (offset, struct format).
FIELDS = {"batchLength": (8, ">i"), "magic": (16, ">b"), "crc": (17, ">I"),
          "attributes": (21, ">h"), "lastOffsetDelta": (23, ">i"), "baseTimestamp": (27, ">q"),
          "maxTimestamp": (35, ">q"), "producerId": (43, ">q"), "producerEpoch": (51, ">h"),
          "baseSequence": (53, ">i"), "recordsCount": (57, ">i")}

FIELD_VALUES = st.sampled_from([-2, -1, 0, 1, 2, 3, 5, 0x20, 0x10, 0x80, 0x7FFF, 1 << 30,
                                (1 << 31) - 1, -(1 << 31)])


def examples(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def now_ms() -> int:
    return int(time.time() * 1000)


@st.composite
def batches(draw) -> bytearray:
    """A client's batch: plain or LZ4, with or without a producer, timestamps about now."""
    n = draw(st.integers(1, 4))
    base_ts = now_ms() + draw(st.sampled_from([0, -10 * HOUR_MS, 30 * 60_000, 10 * HOUR_MS]))
    idempotent = draw(st.booleans())
    batch = build_batch([(base_ts + i, None, draw(st.binary(max_size=40))) for i in range(n)],
                        compression=draw(st.sampled_from([NONE, NONE, LZ4])),
                        producer_id=7 if idempotent else -1,
                        producer_epoch=0 if idempotent else -1,
                        base_sequence=0 if idempotent else -1)
    kind = draw(st.sampled_from(["none", "field", "field+crc", "byte", "cut", "extend"]))
    if kind in ("field", "field+crc"):
        at, fmt = FIELDS[draw(st.sampled_from(sorted(FIELDS)))]
        value = draw(FIELD_VALUES)
        try:
            struct.pack_into(fmt, batch, at, value)
        except struct.error:
            pass
        if kind == "field+crc":     # a consistent CRC: only the field's own check refuses
            batch[17:21] = struct.pack(">I", crc32c(bytes(batch[21:])))
    elif kind == "byte":
        i = draw(st.integers(0, len(batch) - 1))
        batch[i] ^= draw(st.integers(1, 255))
    elif kind == "cut":
        del batch[draw(st.integers(0, len(batch) - 1)):]
    elif kind == "extend":
        batch += b"\0" * draw(st.integers(1, 20))
    return batch


def outcome(plog: PartitionLog, batch: bytearray, as_view: bool):
    """What an append of a copy of ``batch`` returned or raised (its message without numbers:
    a timestamp's is the wall clock), and the copy after it."""
    buf = bytearray(batch)
    try:
        info = plog.append(memoryview(buf) if as_view else buf, leader_epoch=5)
    except (errors.MQError, ValueError) as err:
        return type(err), re.sub(r"\d+", "N", str(err)), bytes(buf)
    return info, bytes(buf)


CONFIGS = [LogConfig(), LogConfig(message_timestamp_after_max_ms=UNLIMITED),
           LogConfig(max_message_bytes=120), LogConfig(message_timestamp_after_max_ms=0)]


@examples(400)
@given(config=st.sampled_from(CONFIGS), sent=st.lists(batches(), min_size=1, max_size=4),
       as_view=st.booleans())
def test_c_and_python_paths_append_the_same_and_refuse_the_same(tmp_path_factory, config,
                                                                 sent, as_view,
                                                                 monkeypatch_module):
    d = tmp_path_factory.mktemp("pair")
    (d / "c").mkdir()
    (d / "py").mkdir()
    with_c = PartitionLog.open(str(d / "c" / "t-0"), config)      # one name: the same errors
    with_py = PartitionLog.open(str(d / "py" / "t-0"), config)
    try:
        for batch in sent:
            got = outcome(with_c, batch, as_view)
            with monkeypatch_module.context() as m:
                m.setattr(native, "check_batch", None)
                m.setattr(native, "append_plain", None)
                want = outcome(with_py, batch, as_view)
            assert got == want
        assert with_c.log_end_offset == with_py.log_end_offset
    finally:
        with_c.close()
        with_py.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        yield m


def test_a_good_batch_is_checked_in_c_and_stamped_in_place():
    batch = build_batch([(now_ms(), b"k", b"v"), (now_ms(), None, b"w")], producer_id=3,
                        producer_epoch=1, base_sequence=9)
    facts = check_batch(batch, 42, 7, now_ms(), 1 << 20, HOUR_MS)
    assert facts == (len(batch) - 12, 2, 1, struct.unpack_from(">q", batch, 35)[0], 3, 1, 9, 0)
    assert struct.unpack_from(">q", batch, 0)[0] == 42
    assert struct.unpack_from(">i", batch, 12)[0] == 7


@pytest.mark.parametrize("damage", ["crc", "control", "future", "size", "count", "no-seq"])
def test_what_the_c_check_refuses_it_leaves_untouched(damage):
    batch = build_batch([(now_ms(), None, b"v")])
    if damage == "crc":
        batch[-1] ^= 1
    elif damage == "control":
        struct.pack_into(">h", batch, 21, 0x20)
    elif damage == "future":
        struct.pack_into(">q", batch, 35, now_ms() + 2 * HOUR_MS)
    elif damage == "count":
        struct.pack_into(">i", batch, 57, 2)
    elif damage == "no-seq":
        struct.pack_into(">q", batch, 43, 5)
    if damage != "crc":
        batch[17:21] = struct.pack(">I", crc32c(bytes(batch[21:])))
    before = bytes(batch)
    limit = len(batch) - 1 if damage == "size" else 1 << 20
    assert check_batch(batch, 42, 7, now_ms(), limit, HOUR_MS) is None
    assert bytes(batch) == before


def test_a_read_only_buffer_is_refused_by_the_call_itself():
    with pytest.raises(TypeError):
        check_batch(bytes(build_batch([(now_ms(), None, b"v")])), 0, 0, now_ms(), 1 << 20,
                    HOUR_MS)
