"""The broker never touches what it did not write (issue 19), as a user meets it: real broker
processes pointed at a user's directories, and ``mq log check --repair`` at one. Every user
file must survive byte for byte, with its permission bits."""

from __future__ import annotations

import os
import subprocess
import sys

import mq.testing
from mq import Admin, Consumer, Producer, TopicPartition
from tests.integration.brokers import create_topic
from tests.integration.cli_run import ENV, mq_run
from tests.unit.log.test_datadir import tree, user_files


def run_broker(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """``python -m mq broker ARGS``, which must exit by itself (it refuses to start)."""
    return subprocess.run([sys.executable, "-m", "mq", "broker", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=60, check=False)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_the_issues_attack_changes_nothing(tmp_path):
    """``cd $d && mq broker --data-dir ""`` used to adopt $d and delete backup-2023."""
    user_files(tmp_path)
    os.chmod(tmp_path, 0o755)
    before = tree(tmp_path)
    line = one_error_line(run_broker("--data-dir", "", cwd=tmp_path))
    assert "--data-dir" in line and "empty path" in line
    assert tree(tmp_path) == before


def test_a_user_directory_is_refused_with_one_line(tmp_path):
    user_files(tmp_path)
    os.chmod(tmp_path, 0o755)
    before = tree(tmp_path)
    sock = str(tmp_path / "mq.sock")
    line = one_error_line(run_broker("--data-dir", str(tmp_path), "--socket", sock))
    assert str(tmp_path) in line and "backup-2023" in line and "not an mq data dir" in line
    assert tree(tmp_path) == before             # no lock, no meta.properties, no socket


def test_a_file_a_dangling_symlink_and_bad_config_values_are_named(tmp_path):
    (tmp_path / "file").write_text("x")
    line = one_error_line(run_broker("--data-dir", str(tmp_path / "file")))
    assert "is a regular file, not a directory" in line
    os.symlink(tmp_path / "nowhere", tmp_path / "link")
    line = one_error_line(run_broker("--data-dir", str(tmp_path / "link")))
    assert "symlink" in line and "does not exist" in line
    for value in ('""', "5"):
        toml = tmp_path / "mq.toml"
        toml.write_text(f"data_dir = {value}\n")
        line = one_error_line(run_broker("--config", str(toml)))
        assert "data_dir must be a non-empty path" in line
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "5").exists()


def test_inside_a_data_dir_what_no_topic_lists_is_kept(tmp_path):
    data = tmp_path / "data"
    with mq.testing.broker(data) as b:
        create_topic(b, "orders", 1)
        with Producer(b.socket) as p:
            p.send("orders", b"old").get(30)
    # What a crash between a topic's deletion record and its directory's removal leaves (a
    # partition no topic lists), and a user's own directories inside the data dir.
    os.rename(data / "orders-0", data / "gone-0")
    user_files(data)
    (data / "photos-0").mkdir()
    (data / "photos-0" / "cat.jpg").write_bytes(b"meow")
    mine = {k: v for k, v in tree(data).items()
            if k.startswith(("backup-2023", "photos-", "notes.txt"))}
    gone = tree(data / "gone-0")
    with mq.testing.broker(data) as b:
        assert {k: v for k, v in tree(data).items() if k in mine} == mine
        strays = [n for n in os.listdir(data) if n.startswith("gone-0.")]
        assert len(strays) == 1 and strays[0].endswith("-stray")
        assert tree(data / strays[0]) == gone
        # A topic of that name starts empty: the stray's record does not come back.
        create_topic(b, "gone", 1)
        create_topic(b, "backup", 1)
        with Producer(b.socket) as p:
            assert p.send("gone", b"new").get(30).offset == 0
        with Consumer(socket=b.socket) as c:
            c.assign([TopicPartition("gone", 0)])
            c.seek(TopicPartition("gone", 0), 0)
            got = c.poll(timeout_ms=10_000)
            assert [r.value for r in got[TopicPartition("gone", 0)]] == [b"new"]
        # A topic whose directory a user's directory holds is refused, and the user's kept.
        result = mq_run("topics", "create", "photos", "--socket", b.socket)
        assert result.code == 1 and "photos-0" in result.err and "Traceback" not in result.err
        with Admin(b.socket) as admin:
            assert "photos" not in admin.list_topics()
        assert "set aside as gone-0." in b.stderr()
    assert {k: v for k, v in tree(data).items() if k in mine} == mine


def test_repair_refuses_a_directory_mq_did_not_write(tmp_path):
    user_files(tmp_path)
    (tmp_path / "backup-2023" / "00000000000000000000.log").write_bytes(b"\0" * 100)
    before = tree(tmp_path)
    result = mq_run("log", "check", "--repair", tmp_path / "backup-2023")
    assert result.code == 1 and "files mq did not write (db.sql, export.tmp)" in result.err
    assert len(result.err.strip().splitlines()) == 1, result
    assert tree(tmp_path) == before


def test_mq_demo_refuses_a_user_directory_without_writing_its_log_there(tmp_path):
    user_files(tmp_path)
    before = tree(tmp_path)
    result = mq_run("demo", "--data-dir", tmp_path)
    assert result.code == 1 and "not an mq data dir" in result.err, result
    assert "Traceback" not in result.err
    assert tree(tmp_path) == before             # no broker.stderr.log either
