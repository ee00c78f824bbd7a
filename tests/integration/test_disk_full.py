"""A real full disk: the broker's data dir on a 24 MiB tmpfs, filled by ``acks="all"``
producers until the kernel says ENOSPC (the issue's report, reproduced). Needs root for the
mount; skipped otherwise (the same failures are injected without root in
``test_write_faults_broker.py``).

Checked: the broker answers the failed writes with a retriable storage error and keeps
running (its periodic checkpoints fail too), serves reads meanwhile, takes writes again once a
topic is deleted to make room, stops cleanly, and ``mq log check`` then finds nothing wrong;
after a restart every acknowledged record is where its acknowledgement said, and the next
offset follows the last one (the reported bug gave offset 0 again).
"""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest
from cli_run import mq_run, ok

import mq.testing
from mq.client.admin import Admin
from mq.client.consumer import Consumer
from mq.client.producer import Producer
from mq.client.types import TopicPartition
from mq.errors import KafkaStorageError, MQError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

VALUE = 64 * 1024


@contextlib.contextmanager
def small_tmpfs(path, size: str = "24m"):
    path.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def broker_on(tmp_path, data_dir, **settings):
    conf = tmp_path / "mq.toml"
    conf.write_text("".join(f"{k} = {v!r}\n" for k, v in settings.items()))
    return mq.testing.broker(data_dir, socket_path=str(tmp_path / "mq.sock"),
                             config_file=str(conf))


def fill(producer: Producer, topic: str, acked: dict, limit: int | None = None
         ) -> list[MQError]:
    """Send 64 KiB records until the broker refuses three (or ``limit`` were sent); returns
    the errors."""
    errors: list[MQError] = []
    for i in range(limit or 1000):
        value = b"%s-%06d-" % (topic.encode(), i) + b"x" * VALUE
        try:
            meta = producer.send(topic, value, partition=0).get(timeout=30)
        except MQError as err:
            errors.append(err)
            if len(errors) >= 3:
                return errors
            continue
        assert (topic, meta.offset) not in acked, f"{topic}:{meta.offset} acknowledged twice"
        acked[(topic, meta.offset)] = value
    assert limit, "1000 records of 64 KiB fit on a 24 MiB file system"
    return errors


def read_back(sock: str, topic: str) -> dict:
    tp = TopicPartition(topic, 0)
    out = {}
    with Consumer(socket=sock, enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning()
        end = consumer.end_offsets([tp])[tp]
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=2000).values():
                for rec in records:
                    out[(topic, rec.offset)] = bytes(rec.value)
    return out


def test_a_full_disk_loses_no_acknowledged_record(tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        data_dir = disk / "data"
        acked: dict = {}
        with broker_on(tmp_path, data_dir, min_free_bytes=0, flush_interval_ms=50) as b:
            with Admin(b.socket) as admin:
                admin.create_topic("orders", 1, {"segment.bytes": str(4 << 20)})
                admin.create_topic("bulk", 1, {"segment.bytes": str(4 << 20)})
            with Producer(socket=b.socket, retries=0, linger_ms=0) as producer:
                assert not fill(producer, "orders", acked, limit=40)
                errors = fill(producer, "bulk", acked)
                assert all(isinstance(e, KafkaStorageError) and e.retriable for e in errors)
                assert "No space left on device" in str(errors[0])
                assert b.proc.poll() is None, b.stderr()        # still serving
                orders = {k: v for k, v in acked.items() if k[0] == "orders"}
                assert read_back(b.socket, "orders") == orders   # reads go on
                with Admin(b.socket) as admin:
                    admin.delete_topic("bulk")                   # make room
                acked = {k: v for k, v in acked.items() if k[0] == "orders"}
                for i in range(5):
                    meta = producer.send("orders", b"after-%d" % i, partition=0).get(timeout=30)
                    assert ("orders", meta.offset) not in acked
                    acked[("orders", meta.offset)] = b"after-%d" % i
            assert b.stop() == 0, b.stderr()
            assert "Traceback" not in b.stderr()
            ok(mq_run("log", "check", data_dir / "orders-0"))
            b.start()                                            # recovery
            assert read_back(b.socket, "orders") == acked
            with Producer(socket=b.socket) as producer:
                meta = producer.send("orders", b"next", partition=0).get(timeout=30)
            assert meta.offset == max(o for _, o in acked) + 1


def test_min_free_bytes_refuses_produce_before_the_disk_is_full(tmp_path):
    with small_tmpfs(tmp_path / "disk") as disk:
        data_dir = disk / "data"
        acked: dict = {}
        with broker_on(tmp_path, data_dir, min_free_bytes=8 << 20) as b:
            with Admin(b.socket) as admin:
                admin.create_topic("orders", 1)
            with Producer(socket=b.socket, retries=0, linger_ms=0) as producer:
                errors = fill(producer, "orders", acked)
            assert all("min_free_bytes" in str(e) for e in errors), errors
            assert os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize > 7 << 20
            with Consumer(socket=b.socket, group_id="g", enable_auto_commit=False) as consumer:
                consumer.assign([TopicPartition("orders", 0)])
                consumer.commit({TopicPartition("orders", 0): 1})   # room for commits
            assert read_back(b.socket, "orders") == acked
