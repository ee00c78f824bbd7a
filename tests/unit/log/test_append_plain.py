"""The broker's append of a plain batch in C, ``_crecords.append_plain``, against the Python path.

``PartitionLog.append`` hands a client's batch to one C call, which appends it on the log's own
objects when the case is the common one and declines (None, nothing touched) otherwise: a
producer id, a roll or an index entry or a new leader epoch due, files not open, a topic
setting, a batch the checks refuse. Here two logs take the same appends, one with the C call
and one without (``native.append_plain = None``), over settings that make every one of those
cases come up (small segments, a small index interval, short ``segment.ms``, leader epochs
that move): after each append both hold the same files byte for byte and the same state, and
both return the same ``AppendInfo`` or raise the same error. A failed write is cut off again
and takes the log offline on both paths, and a short write then a refusal (a file size limit)
leaves both the same.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mq.log.log
from mq import errors
from mq.log import native
from mq.log.builder import build_batch
from mq.log.config import LogConfig
from mq.log.log import PartitionLog

_crecords = pytest.importorskip("mq.log._crecords")

HOUR_MS = 3_600_000


def now_ms() -> int:
    return int(time.time() * 1000)


@st.composite
def appends(draw) -> tuple[bytearray, int, bool]:
    """A client's batch (plain mostly; idempotent or damaged now and then), the leader epoch
    it is appended at, and whether it comes as a memoryview."""
    n = draw(st.integers(1, 5))
    base_ts = now_ms() + draw(st.sampled_from([0, 0, 0, -HOUR_MS, 5_000, 20_000]))
    idempotent = draw(st.integers(0, 9)) == 0
    batch = build_batch([(base_ts + 10 * i, None, draw(st.binary(max_size=300)))
                         for i in range(n)],
                        producer_id=7 if idempotent else -1,
                        producer_epoch=0 if idempotent else -1,
                        base_sequence=draw(st.integers(0, 3)) if idempotent else -1)
    if draw(st.integers(0, 19)) == 0:
        batch[draw(st.integers(0, len(batch) - 1))] ^= 0x40
    return batch, draw(st.sampled_from([0, 0, 0, 1, 2])), draw(st.booleans())


CONFIGS = [LogConfig(),
           LogConfig(segment_bytes=2048, index_interval_bytes=300),
           LogConfig(segment_bytes=4096, index_interval_bytes=0, segment_ms=15_000),
           LogConfig(segment_index_bytes=48, index_interval_bytes=100),
           LogConfig(message_timestamp_type="LogAppendTime"),
           LogConfig(max_message_bytes=400)]


def outcome(plog: PartitionLog, batch: bytearray, epoch: int, as_view: bool):
    """What an append of a copy of ``batch`` returned or raised (its message without numbers:
    a timestamp's is the wall clock), and the copy after it."""
    buf = bytearray(batch)
    try:
        info = plog.append(memoryview(buf) if as_view else buf, leader_epoch=epoch)
    except (errors.MQError, ValueError) as err:
        return type(err), re.sub(r"\d+", "N", str(err)), bytes(buf)
    return info, bytes(buf)


def files(directory) -> dict[str, bytes]:
    """Every file of a partition directory and its bytes (the indexes up to their entries:
    the active ones are preallocated)."""
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


def state(plog: PartitionLog) -> tuple:
    seg = plog.active_segment
    return (plog.log_end_offset, plog.high_watermark, len(plog.segments), plog.offline,
            plog.leader_epochs.entries, seg.base_offset, seg.size, seg.first_batch_timestamp,
            seg.max_timestamp_so_far, seg.offset_of_max_timestamp_so_far,
            seg.bytes_since_last_index_entry, seg.next_offset,
            sorted(plog.producers.producers))


@pytest.fixture
def counted(monkeypatch):
    """How many appends the C call took on (it returned their ``AppendInfo`` or raised)."""
    taken = [0]
    plain = native.append_plain

    def count(*args):
        try:
            done = plain(*args)
        except OSError:
            taken[0] += 1
            raise
        taken[0] += done is not None
        return done
    monkeypatch.setattr(native, "append_plain", count)
    return taken


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(config=st.sampled_from(CONFIGS), sent=st.lists(appends(), min_size=1, max_size=30))
def test_c_and_python_paths_append_the_same(tmp_path_factory, config, sent, counted):
    d = tmp_path_factory.mktemp("pair")
    (d / "c").mkdir()
    (d / "py").mkdir()
    with_c = PartitionLog.open(str(d / "c" / "t-0"), config)      # one name: the same errors
    with_py = PartitionLog.open(str(d / "py" / "t-0"), config)
    plain = native.append_plain
    clock = mq.log.log._now_ms
    frozen = now_ms()                   # LogAppendTime stamps the same time on both paths
    mq.log.log._now_ms = lambda: frozen
    try:
        for batch, epoch, as_view in sent:
            got = outcome(with_c, batch, epoch, as_view)
            native.append_plain = None
            try:
                want = outcome(with_py, batch, epoch, as_view)
            finally:
                native.append_plain = plain
            assert got == want
            assert state(with_c) == state(with_py)
        with_c.flush()
        with_py.flush()
        assert files(with_c.dir) == files(with_py.dir)
    finally:
        mq.log.log._now_ms = clock
        with_c.close()
        with_py.close()


def test_plain_batches_are_appended_in_c_between_index_entries(tmp_path, counted):
    plog = PartitionLog.open(str(tmp_path / "t-0"), LogConfig(index_interval_bytes=1000))
    try:
        for i in range(40):
            info = plog.append(build_batch([(now_ms(), None, b"v%03d" % i + b"x" * 100)]))
            assert info.first_offset == i
        assert plog.high_watermark == 40
        # An entry is due after each 1000 bytes (the Python path writes it): 4 of the 40.
        assert 30 <= counted[0] < 40
        assert [r.value[:4] for b in plog.batches() for r in b.records()] == \
            [b"v%03d" % i for i in range(40)]
    finally:
        plog.close()


def test_an_idempotent_or_timed_append_takes_the_python_path(tmp_path, counted):
    plog = PartitionLog.open(str(tmp_path / "t-0"), LogConfig())
    try:
        plog.append(build_batch([(now_ms(), None, b"a")], producer_id=3, producer_epoch=0,
                                base_sequence=0))
        plog.append(build_batch([(now_ms(), None, b"b")]), now_ms=now_ms())
        assert counted[0] == 0
        plog.append(build_batch([(now_ms(), None, b"c")]))
        assert counted[0] == 1
    finally:
        plog.close()


def test_a_failed_write_is_cut_off_and_takes_the_log_offline(tmp_path, counted):
    """The segment's descriptor swapped for a read-only one: the write fails (EBADF), so does
    the truncation, and the log goes offline with the segment torn, as on the Python path."""
    logs, ts = {}, now_ms()
    for name in ("c", "py"):
        plog = logs[name] = PartitionLog.open(str(tmp_path / name / "t-0"), LogConfig())
        for value in (b"kept", b"kept in C"):         # the first one writes epoch 0
            plog.append(build_batch([(ts, None, value)]))
        files_ = plog.active_segment._files
        os.close(files_._fd)
        files_._fd = os.open(plog.active_segment.log_path, os.O_RDONLY)
    try:
        plain = native.append_plain
        got = outcome(logs["c"], build_batch([(ts, None, b"lost")]), 0, False)
        native.append_plain = None
        try:
            want = outcome(logs["py"], build_batch([(ts, None, b"lost")]), 0, False)
        finally:
            native.append_plain = plain
        assert got[0] is errors.LogWriteError and got[:2] == want[:2]
        assert state(logs["c"]) == state(logs["py"])
        assert logs["c"].offline is not None and logs["c"].active_segment.torn
        assert counted[0] == 3                  # both "kept in C" and the failed one
    finally:
        for plog in logs.values():
            plog.close()


# A child process with a file size limit (RLIMIT_FSIZE): a write that crosses it is cut short
# and the next one refused with EFBIG (SIGXFSZ ignored), as a filling disk does with ENOSPC.
_SIZE_LIMIT = textwrap.dedent("""
    import json, os, resource, signal, sys, time
    from mq.log import native
    from mq.log.builder import build_batch
    from mq.log.config import LogConfig
    from mq.log.log import PartitionLog
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if sys.argv[2] == "py":
        native.append_plain = None
    plog = PartitionLog.open(sys.argv[1], LogConfig())
    resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
    done = []
    for i in range(40):
        try:
            done.append(plog.append(build_batch([(1000 + i, None, b"x" * 200)])).first_offset)
        except Exception as err:
            done.append(type(err).__name__)
            break
    seg = plog.active_segment
    print(json.dumps([done, plog.log_end_offset, seg.size, os.path.getsize(seg.log_path),
                      plog.offline is not None, seg.torn]))
""")


def test_a_write_cut_short_by_a_size_limit_leaves_both_paths_the_same(tmp_path):
    out = {}
    for path in ("c", "py"):
        proc = subprocess.run([sys.executable, "-c", _SIZE_LIMIT, str(tmp_path / path / "t-0"),
                               path], capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        out[path] = proc.stdout
    assert out["c"] == out["py"]
    assert '"LogWriteError"' in out["c"]
