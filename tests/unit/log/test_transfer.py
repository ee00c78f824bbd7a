"""``mq.log.transfer``: copying a topic's partitions between two log dirs, on real files written
by ``LogManager`` (the tests against a real Kafka node are in
``tests/integration/kafka/java/judge/test_log_transfer.py``).

Each refusal changes nothing; locks are held by another process as the brokers hold them (an
``flock`` as mq's, a POSIX ``lockf`` as Kafka's JVM); a failure half-way through the copy
leaves the destination as it was; leader epochs above the destination's are stamped down.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import subprocess
import sys
import uuid

import pytest
from builders import make_batch

from mq.errors import LogTransferError
from mq.log import diskio, files, partition_metadata
from mq.log.epochs import LeaderEpochCache
from mq.log.manager import LogManager
from mq.log.transfer import LogDir, copy_topic, held, plan

TOPIC = "orders"


def make_dir(path, partitions: int = 2, records: int = 0, *, epochs=(0,), topic=TOPIC,
             topic_id: str | None = None) -> LogDir:
    """A log dir written by ``LogManager`` and closed cleanly: ``topic`` with ``records``
    one-record batches a partition, spread over ``epochs``."""
    mgr = LogManager.open(str(path))
    topic_id = topic_id or uuid.uuid4().hex
    for p in range(partitions):
        plog = mgr.create(topic, p, topic_id=topic_id)
        for i in range(records):
            plog.append(make_batch(value=b"v%d" % i),
                        leader_epoch=epochs[i * len(epochs) // records])
    mgr.close()
    return LogDir(str(path), "mq")


def snapshot(*dirs: LogDir) -> dict[str, bytes]:
    return {os.path.join(root, n): content(os.path.join(root, n))
            for d in dirs for root, _, names in os.walk(d.path) for n in names}


def content(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def copy(source: LogDir, destination: LogDir, *, stamp: bool = False):
    with held(source, destination):
        done = plan(TOPIC, source, destination, stamp_epochs=stamp, source_hint="stop it")
        copy_topic(done)
    return done


def batch_epochs(directory: str) -> list[int]:
    with open(os.path.join(directory, files.segment_name(0, files.LOG_SUFFIX)), "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos < len(data):
        _, length, epoch = struct.unpack_from(">qii", data, pos)
        out.append(epoch)
        pos += 12 + length
    return out


def test_a_topic_is_copied_under_the_destinations_topic_id(tmp_path):
    source = make_dir(tmp_path / "a", records=6, epochs=(0, 1, 2))
    dest = make_dir(tmp_path / "b")
    dest_ids = [partition_metadata.read_topic_id(os.path.join(dest.path, f"{TOPIC}-{p}"))
                for p in (0, 1)]
    done = copy(source, dest)
    assert [p.summary.split(", ")[2] for p in done.partitions] == ["6 records"] * 2
    for p in (0, 1):
        src, dst = (os.path.join(d.path, f"{TOPIC}-{p}") for d in (source, dest))
        names = sorted(n for n in os.listdir(src) if files.parse_segment_name(n))
        assert sorted(n for n in os.listdir(dst) if files.parse_segment_name(n)) == names
        for n in names:
            assert content(os.path.join(src, n)) == content(os.path.join(dst, n))
        assert partition_metadata.read_topic_id(dst) == dest_ids[p]
        assert LeaderEpochCache(dst).entries == LeaderEpochCache(src).entries == \
            [(0, 0), (1, 2), (2, 4)]
    assert sorted(os.listdir(dest.path)) == sorted(os.listdir(tmp_path / "a"))


def test_epochs_above_the_destinations_are_stamped_down(tmp_path):
    source = make_dir(tmp_path / "a", records=6, epochs=(0, 3, 5))
    dest = make_dir(tmp_path / "b", records=0)
    # as a new Kafka topic's partitions: one led since its creation, one after two restarts
    LeaderEpochCache(os.path.join(dest.path, f"{TOPIC}-1")).assign(2, 0)
    done = copy(source, dest, stamp=True)
    assert [p.max_epoch for p in done.partitions] == [0, 2]
    zero, one = (os.path.join(dest.path, f"{TOPIC}-{p}") for p in (0, 1))
    assert batch_epochs(zero) == [0] * 6
    assert LeaderEpochCache(zero).entries == [(0, 0)]
    assert batch_epochs(one) == [0, 0, 2, 2, 2, 2]
    assert LeaderEpochCache(one).entries == [(0, 0), (2, 2)]
    assert batch_epochs(os.path.join(source.path, f"{TOPIC}-1")) == [0, 0, 3, 3, 5, 5]


def hold_lock(path: str, kind: str) -> subprocess.Popen:
    """Another process holding ``path`` as a broker does: ``flock`` (mq) or ``lockf``
    (Kafka's JVM: a POSIX lock); it has the lock once it printed a line."""
    code = (f"import fcntl,os,sys; fd=os.open({path!r}, os.O_RDWR); "
            f"fcntl.{kind}(fd, fcntl.LOCK_EX); print(flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "\n"
    return proc


@pytest.mark.parametrize("side", ["source", "destination"])
@pytest.mark.parametrize("kind", ["flock", "lockf"])
def test_a_live_broker_on_either_side_is_refused(tmp_path, side, kind):
    dirs = {"source": make_dir(tmp_path / "a", records=3), "destination": make_dir(tmp_path / "b")}
    before = snapshot(*dirs.values())
    proc = hold_lock(os.path.join(dirs[side].path, files.LOCK_FILE), kind)
    try:
        with pytest.raises(LogTransferError, match="in use: a running broker holds"):
            copy(dirs["source"], dirs["destination"])
    finally:
        proc.stdin.close()
        proc.wait()
        proc.stdout.close()
    assert snapshot(*dirs.values()) == before


def test_the_locks_keep_a_broker_from_starting_meanwhile(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b")
    with held(source, dest):
        for d in (source, dest):
            fd = os.open(os.path.join(d.path, files.LOCK_FILE), os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
    with held(source, dest):
        pass                    # released: taken again


def refuse(source: LogDir, dest: LogDir, match: str) -> None:
    before = snapshot(source, dest)
    with pytest.raises(LogTransferError, match=match):
        copy(source, dest)
    assert snapshot(source, dest) == before


def test_an_unclean_source_is_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b")
    os.unlink(os.path.join(source.path, files.CLEAN_SHUTDOWN_FILE))
    refuse(source, dest, "was not shut down cleanly .*: stop it")


def test_a_source_that_does_not_check_clean_is_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b")
    log = os.path.join(source.path, f"{TOPIC}-1", files.segment_name(0, files.LOG_SUFFIX))
    with open(log, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\xff")
    refuse(source, dest, f"{TOPIC}-1 does not check clean: .*mq log check")


def test_a_destination_with_data_is_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b", records=1)
    refuse(source, dest, f"{TOPIC}-0 is not empty")


def test_a_destination_with_a_foreign_file_is_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b")
    with open(os.path.join(dest.path, f"{TOPIC}-1", "notes.txt"), "w") as f:
        f.write("mine")
    refuse(source, dest, r"holds files neither broker writes \(notes.txt\)")


def test_partition_directories_naming_two_topic_ids_are_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b")
    partition_metadata.write_topic_id(os.path.join(dest.path, f"{TOPIC}-1"), uuid.uuid4().hex)
    refuse(source, dest, f"topic id mismatch in mq's data dir .*{TOPIC}-1 to ")


def test_a_partition_without_a_topic_id_is_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b")
    os.unlink(os.path.join(source.path, f"{TOPIC}-0", partition_metadata.PARTITION_METADATA))
    refuse(source, dest, "no readable partition.metadata")


def test_partition_counts_that_differ_are_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b", 3)
    refuse(source, dest, "has 2 partitions in .* but 3 in")


def test_a_topic_missing_on_one_side_is_refused(tmp_path):
    source = make_dir(tmp_path / "a", records=3)
    dest = make_dir(tmp_path / "b", topic="other")
    refuse(source, dest, f"has no partition of topic {TOPIC}: create the topic")


def test_a_log_start_inside_the_first_segment_is_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b")
    files.write_checkpoint(os.path.join(source.path, files.LOG_START_OFFSET_CHECKPOINT),
                           {(TOPIC, 0): 2})
    refuse(source, dest, f"{TOPIC}-0 starts at offset 2, inside its first segment")


def test_internal_topics_are_refused(tmp_path):
    source, dest = make_dir(tmp_path / "a"), make_dir(tmp_path / "b")
    with pytest.raises(LogTransferError, match="internal topic"):
        plan("__consumer_offsets", source, dest, stamp_epochs=False, source_hint="")


class FailingFsync(diskio.DiskIO):
    """The disk fails the ``n``-th fsync."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def fsync(self, fd: int) -> None:
        self.left -= 1
        if self.left == 0:
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


@pytest.mark.parametrize("nth", [1, 4, 9])
def test_a_failure_while_copying_leaves_the_destination_as_it_was(tmp_path, nth):
    source, dest = make_dir(tmp_path / "a", records=3), make_dir(tmp_path / "b")
    before = snapshot(source, dest)
    entries = sorted(os.listdir(dest.path))
    with held(source, dest):
        done = plan(TOPIC, source, dest, stamp_epochs=False, source_hint="")
        with diskio.installed(FailingFsync(nth)), pytest.raises(OSError, match="Input/output"):
            copy_topic(done)
    assert snapshot(source, dest) == before
    assert sorted(os.listdir(dest.path)) == entries
