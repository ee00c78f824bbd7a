"""What mq may touch (``mq.log.datadir``, and ``LogManager`` through it): a directory that is not
an mq data dir is refused with nothing changed; inside one, what mq did not write stays as it
is, byte for byte (issue 19)."""

from __future__ import annotations

import os
import stat

import pytest

from mq.errors import DataDirError
from mq.log import datadir
from mq.log.builder import BatchBuilder
from mq.log.config import LogConfig
from mq.log.manager import LogManager


def tree(root) -> dict[str, tuple[int, bytes | None]]:
    """Every entry under ``root`` (itself included): mode and, for a file, its bytes."""
    out = {".": (os.lstat(root).st_mode, None)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            data = None
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    data = f.read()
            out[os.path.relpath(path, root)] = (st.st_mode, data)
    return out


def user_files(root) -> None:
    """What a user might keep in a directory: a dump in a dir named like a partition, a file
    mq would take for a leftover if it were in a partition, and a loose note."""
    os.makedirs(root / "backup-2023")
    (root / "backup-2023" / "db.sql").write_bytes(b"important\n" * 100)
    (root / "backup-2023" / "export.tmp").write_bytes(b"half an export")
    (root / "photos-delete").mkdir()
    (root / "photos-delete" / "cat.jpg").write_bytes(bytes(range(256)))
    (root / "notes.txt").write_text("do not lose\n")


def one_record(logs: LogManager, topic: str, partition: int = 0) -> None:
    builder = BatchBuilder()
    builder.append(timestamp_ms=0, key=None, value=b"v")
    logs.create(topic, partition).append(builder.build())


# --- the data dir itself ----------------------------------------------------------------------

def test_a_directory_of_user_files_is_refused_and_left_as_it_was(tmp_path):
    user_files(tmp_path)
    os.chmod(tmp_path, 0o755)
    before = tree(tmp_path)
    with pytest.raises(DataDirError, match=r"not empty and not an mq data dir .*3 other "
                                           r"entries \(backup-2023, notes.txt, photos-delete\)"):
        LogManager.open(str(tmp_path))
    assert tree(tmp_path) == before        # no .lock, no meta.properties, no chmod


def test_an_empty_path_is_refused_never_the_current_directory(tmp_path, monkeypatch):
    user_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(DataDirError, match="empty path"):
        LogManager.open("")
    assert tree(tmp_path) == before


def test_a_file_and_a_dangling_symlink_are_named_for_what_they_are(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(DataDirError, match=r"f is a regular file, not a directory"):
        datadir.prepare(str(tmp_path / "f"))
    with pytest.raises(DataDirError, match=r"a part of the path is a file"):
        datadir.prepare(str(tmp_path / "f" / "data"))
    os.symlink(tmp_path / "gone", tmp_path / "link")
    with pytest.raises(DataDirError, match=r"link is a symlink to .*gone, which does not exist"):
        datadir.prepare(str(tmp_path / "link"))
    assert not (tmp_path / "gone").exists()


def test_a_missing_directory_is_created_an_empty_one_initialised(tmp_path):
    assert datadir.prepare(str(tmp_path / "a" / "b")) is True
    assert datadir.prepare(str(tmp_path / "a" / "b")) is False
    os.mkfifo(tmp_path / "a" / "b" / "mq.sock.fifo")     # not a socket: a foreign entry
    with pytest.raises(DataDirError, match="mq.sock.fifo"):
        datadir.prepare(str(tmp_path / "a" / "b"))


def test_only_what_a_file_system_or_mq_leaves_before_meta_counts_as_empty(tmp_path):
    for name in ("lost+found", ".lock", "broker.stderr.log", "meta.properties.tmp"):
        path = tmp_path / name
        path.mkdir() if name == "lost+found" else path.write_bytes(b"")
    import socket
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "mq.sock"))
        assert datadir.prepare(str(tmp_path)) is False
    with LogManager.open(str(tmp_path)) as logs:
        assert logs.logs == {}
    assert (tmp_path / "lost+found").is_dir()


def test_the_mode_of_a_directory_mq_did_not_create_is_kept(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    with LogManager.open(str(data)) as logs:
        one_record(logs, "t")
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o755
    with LogManager.open(str(tmp_path / "new")):
        pass
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) & 0o007 == 0


def test_a_kafka_or_mq_log_dir_is_recognised_by_its_meta_properties(tmp_path):
    (tmp_path / "meta.properties").write_text("version=1\ncluster.id=abc\nnode.id=1\n")
    (tmp_path / "unrelated").mkdir()
    assert datadir.prepare(str(tmp_path)) is False
    (tmp_path / "meta.properties").write_text("just some text\n")
    with pytest.raises(DataDirError, match="no cluster.id"):
        datadir.prepare(str(tmp_path))


# --- inside a data dir ------------------------------------------------------------------------

def test_unlisted_directories_are_never_opened_and_never_removed(tmp_path):
    data = tmp_path / "data"
    with LogManager.open(str(data)) as logs:
        one_record(logs, "kept")
        one_record(logs, "gone")
    user_files(data)
    before = {k: v for k, v in tree(data).items()
              if k.startswith(("backup-2023", "photos-delete", "notes.txt"))}
    gone = tree(data / "gone-0")
    with LogManager.open(str(data), load_all=False) as logs:
        logs.load([("kept", 0)])
        logs.finish_loading()
        assert sorted(logs.logs) == [("kept", 0)]
    after = tree(data)
    # The user's things: all there, byte for byte, modes unchanged.
    assert {k: v for k, v in after.items() if k in before} == before
    # The unlisted partition: renamed *-stray, its files kept as they were.
    strays = [n for n in os.listdir(data) if n.endswith("-stray")]
    assert len(strays) == 1 and strays[0].startswith("gone-0.")
    assert tree(data / strays[0]) == gone
    assert not (data / "gone-0").exists()


def test_a_partition_cannot_be_created_over_a_directory_mq_did_not_write(tmp_path):
    data = tmp_path / "data"
    with LogManager.open(str(data)):
        pass
    (data / "photos-0").mkdir()
    (data / "photos-0" / "cat.jpg").write_bytes(b"meow")
    with LogManager.open(str(data)) as logs:
        with pytest.raises(DataDirError, match="photos-0 exists and is not a partition"):
            logs.create("photos", 0)
    assert os.listdir(data / "photos-0") == ["cat.jpg"]


def test_a_deletion_leftover_loses_only_the_files_mq_named(tmp_path):
    data = tmp_path / "data"
    with LogManager.open(str(data)) as logs:
        one_record(logs, "t")
    doomed = data / f"t-0.{'ab' * 16}-delete"
    os.rename(data / "t-0", doomed)
    (doomed / "mine.txt").write_text("a user's")
    with LogManager.open(str(data)):
        pass
    assert os.listdir(doomed) == ["mine.txt"]
    os.unlink(doomed / "mine.txt")
    with LogManager.open(str(data)):
        pass
    assert not doomed.exists()


def test_leftover_cleanup_in_a_partition_spares_files_mq_did_not_name(tmp_path):
    data = tmp_path / "data"
    with LogManager.open(str(data)) as logs:
        one_record(logs, "t")
    (data / "t-0" / "notes.tmp").write_text("mine")
    (data / "t-0" / "old.deleted").write_text("mine too")
    (data / "t-0" / "00000000000000000000.index.tmp").write_bytes(b"")
    with LogManager.open(str(data), lambda t: LogConfig(), load_all=False) as logs:
        logs.load([("t", 0)])                 # as the broker does: its metadata lists t-0
        assert logs.get("t", 0).log_end_offset == 1
    names = set(os.listdir(data / "t-0"))
    assert {"notes.tmp", "old.deleted"} <= names
    assert "00000000000000000000.index.tmp" not in names


def test_partition_file_names():
    assert datadir.is_partition_file("00000000000000000042.log")
    assert datadir.is_partition_file("00000000000000000042.index.swap")
    assert datadir.is_partition_file("00000000000000000042.snapshot.tmp")
    assert datadir.is_partition_file("00000000000000000042.log.deleted")
    assert datadir.is_partition_file("leader-epoch-checkpoint.tmp")
    for name in ("db.sql", "x.tmp", "42.log", "00000000000000000042.log.bak", "notes.deleted"):
        assert not datadir.is_partition_file(name)
    assert datadir.is_deletion_leftover(f"t-0.{'0' * 32}-delete")
    assert not datadir.is_deletion_leftover("photos-delete")
    assert not datadir.is_deletion_leftover(f"t.{'0' * 32}-delete")


def test_a_listed_partition_may_be_a_symlink_an_unlisted_one_is_left_alone(tmp_path):
    data, elsewhere = tmp_path / "data", tmp_path / "disk2"
    with LogManager.open(str(data)) as logs:
        one_record(logs, "t")
        one_record(logs, "u")
    elsewhere.mkdir()
    for name in ("t-0", "u-0"):
        os.rename(data / name, elsewhere / name)
        os.symlink(elsewhere / name, data / name)
    unlisted = tree(elsewhere / "u-0")
    with LogManager.open(str(data), load_all=False) as logs:
        logs.load([("t", 0)])                  # listed: opened through its link
        logs.finish_loading()
        assert logs.get("t", 0).log_end_offset == 1
    assert os.path.islink(data / "u-0")        # unlisted: neither renamed nor followed
    assert tree(elsewhere / "u-0") == unlisted


def test_a_close_before_loading_finished_leaves_the_unopened_partitions_to_recovery(tmp_path):
    """A broker start that fails after the data dir opened but before its partitions were
    loaded: the next start must still recover them (no clean-shutdown marker), from the
    recovery points the checkpoint kept."""
    data = tmp_path / "data"
    with LogManager.open(str(data)) as logs:
        one_record(logs, "t")
    os.unlink(data / ".kafka_cleanshutdown")                # as after a kill -9
    before = (data / "recovery-point-offset-checkpoint").read_text()
    logs = LogManager.open(str(data), load_all=False)
    assert list(logs.unloaded) == [("t", 0)]
    logs.close()
    assert not (data / ".kafka_cleanshutdown").exists()
    assert (data / "recovery-point-offset-checkpoint").read_text() == before
