"""File-name rules, atomic writes and checkpoint files (``mq.log.files``)."""

from __future__ import annotations

import os

import pytest

from mq.errors import StorageError
from mq.log import files
from mq.log.files import (CheckpointError, atomic_write, parse_partition_dir,
                          parse_segment_name, partition_dir_name, read_checkpoint,
                          segment_name, validate_topic_name, write_checkpoint)


# --- segment names -----------------------------------------------------------------------------

def test_segment_name_is_20_digit_zero_padded():
    assert segment_name(0, ".log") == "00000000000000000000.log"
    assert segment_name(42, ".index") == "00000000000000000042.index"
    assert segment_name(368769, ".timeindex") == "00000000000000368769.timeindex"
    assert segment_name((1 << 63) - 1, ".log") == "09223372036854775807.log"
    assert len(segment_name(123, "")) == 20


@pytest.mark.parametrize("base", [0, 1, 42, 4096, 10**12, (1 << 63) - 1])
@pytest.mark.parametrize("kind", [".log", ".index", ".timeindex", ".txnindex", ".snapshot"])
@pytest.mark.parametrize("suffix", ["", ".deleted", ".cleaned", ".swap"])
def test_segment_name_round_trip(base, kind, suffix):
    assert parse_segment_name(segment_name(base, kind) + suffix) == (base, kind, suffix)


@pytest.mark.parametrize("name", [
    "0.log",                                   # not 20 digits
    "000000000000000000042.log",               # 21 digits
    "0000000000000000042.log",                 # 19 digits
    "00000000000000000042.txt",                # unknown kind
    "00000000000000000042.log.tmp",            # unknown suffix
    "00000000000000000042.log.deleted.swap",   # two suffixes
    "00000000000000000042",                    # no kind
    "leader-epoch-checkpoint",
    "partition.metadata",
    "x0000000000000000042.log",
])
def test_parse_segment_name_rejects_others(name):
    assert parse_segment_name(name) is None


def test_parse_segment_name_suffixes():
    assert parse_segment_name("00000000000000000042.index.swap") == (42, ".index", ".swap")
    assert parse_segment_name("00000000000000000007.log.deleted") == (7, ".log", ".deleted")
    assert parse_segment_name("00000000000000000007.timeindex.cleaned") == \
        (7, ".timeindex", ".cleaned")
    assert parse_segment_name("00000000000000000100.snapshot") == (100, ".snapshot", "")


# --- partition directories ---------------------------------------------------------------------

@pytest.mark.parametrize("topic, partition", [
    ("orders", 3), ("my-topic", 0), ("a-b-c-12", 7), ("x", 123456), ("__consumer_offsets", 49),
    ("dots.and_underscores", 1), ("t-0", 0),
])
def test_partition_dir_round_trip(topic, partition):
    name = partition_dir_name(topic, partition)
    assert name == f"{topic}-{partition}"
    assert parse_partition_dir(name) == (topic, partition)


@pytest.mark.parametrize("name", [
    "orders", "orders-", "-3", "orders-x", "orders-3.0123abcd-delete", "orders-3.abc-future",
    "bad topic-1", "meta.properties", ".lock", "recovery-point-offset-checkpoint",
])
def test_parse_partition_dir_rejects_others(name):
    assert parse_partition_dir(name) is None


def test_count_partition_dirs_counts_partition_directories_only(tmp_path):
    assert files.count_partition_dirs(str(tmp_path / "absent")) == 0
    for name in ("orders-0", "orders-1", "__consumer_offsets-0", "orders-2.0123abcd-delete"):
        (tmp_path / name).mkdir()
    (tmp_path / "orders-3").write_bytes(b"")        # a file, not a partition
    (tmp_path / "meta.properties").write_bytes(b"")
    before = sorted(os.listdir(tmp_path))
    assert files.count_partition_dirs(str(tmp_path)) == 3
    assert sorted(os.listdir(tmp_path)) == before


def test_validate_topic_name():
    for ok in ("a", "orders", "my-topic.v2_x", "x" * 249):
        validate_topic_name(ok)
    for bad in ("", ".", "..", "x" * 250, "with space", "slash/name", "ümlaut"):
        with pytest.raises(ValueError, match="invalid topic name"):
            validate_topic_name(bad)


# --- atomic writes -----------------------------------------------------------------------------

def test_atomic_write_replaces_and_leaves_no_tmp(tmp_path):
    target = tmp_path / "meta.properties"
    atomic_write(str(target), b"first")
    assert target.read_bytes() == b"first"
    atomic_write(str(target), b"second, longer")
    assert target.read_bytes() == b"second, longer"
    atomic_write(str(target), b"")
    assert target.read_bytes() == b""
    assert sorted(os.listdir(tmp_path)) == ["meta.properties"]


def test_atomic_write_overwrites_a_stale_tmp(tmp_path):
    target = tmp_path / "cp"
    (tmp_path / ("cp" + files.TMP_SUFFIX)).write_bytes(b"garbage from a crash" * 100)
    atomic_write(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["cp"]


# --- checkpoint files --------------------------------------------------------------------------

def test_checkpoint_round_trip(tmp_path):
    path = str(tmp_path / files.RECOVERY_POINT_CHECKPOINT)
    offsets = {("orders", 0): 100, ("orders", 1): 0, ("my-topic", 12): (1 << 63) - 1,
               ("a.b_c", 3): 7}
    write_checkpoint(path, offsets)
    assert read_checkpoint(path) == offsets
    text = (tmp_path / files.RECOVERY_POINT_CHECKPOINT).read_text()
    assert text.splitlines()[:2] == ["0", "4"]
    assert "my-topic 12 9223372036854775807" in text.splitlines()
    assert os.listdir(tmp_path) == [files.RECOVERY_POINT_CHECKPOINT]


def test_checkpoint_empty_and_missing(tmp_path):
    path = str(tmp_path / "cp")
    assert read_checkpoint(path) == {}                  # missing file
    write_checkpoint(path, {})
    assert (tmp_path / "cp").read_text() == "0\n0\n"
    assert read_checkpoint(path) == {}


def test_checkpoint_reads_kafka_written_file(tmp_path):
    path = tmp_path / "cp"
    path.write_text("0\n2\norders 0 15\n__consumer_offsets 7 123\n")
    assert read_checkpoint(str(path)) == {("orders", 0): 15, ("__consumer_offsets", 7): 123}


@pytest.mark.parametrize("content, match", [
    ("1\n1\norders 0 5\n", "version"),                 # wrong version
    ("", "version"),                                    # empty file
    ("0\n2\norders 0 5\n", "expected 2 entries, found 1"),
    ("0\n0\norders 0 5\n", "expected 0 entries, found 1"),
    ("0\nx\n", "bad entry count"),
    ("0\n1\norders 0\n", "malformed line"),
    ("0\n1\norders zero 5\n", "malformed line"),
    ("0\n1\norders 0 5 9\n", "malformed line"),
    ("0\n1\norders 0 5.5\n", "malformed line"),
])
def test_checkpoint_errors(tmp_path, content, match):
    path = tmp_path / "cp"
    path.write_text(content)
    with pytest.raises(CheckpointError, match=match) as info:
        read_checkpoint(str(path))
    assert str(path) in str(info.value)
    assert isinstance(info.value, StorageError)


def test_checkpoint_binary_garbage_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "cp"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CheckpointError):
        read_checkpoint(str(path))


def test_remove_quietly(tmp_path):
    (tmp_path / "a").write_bytes(b"")
    files.remove_quietly([str(tmp_path / "a"), str(tmp_path / "never-existed")])
    assert os.listdir(tmp_path) == []
