"""The broker under systemd's protocols, with real processes and sockets: the notify sequence
heard on a real NOTIFY_SOCKET (path and abstract), a wedged loop that stops the watchdog pings,
and the log formats a unit sees (JSON, journald's stream)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import pytest
from sd_helpers import NotifyListener

import mq
import mq.testing
from mq.broker.config import BrokerConfig
from mq.broker.server import Broker
from mq.broker.service import ServiceNotifier

WATCHDOG_USEC = 200_000            # pings every 0.1 s


@pytest.fixture
def listener(tmp_path):
    sock = NotifyListener(str(tmp_path / "notify.sock"))
    yield sock
    sock.close()


def _broker(tmp_path, env, **kwargs) -> mq.testing.BrokerProcess:
    return mq.testing.BrokerProcess(str(tmp_path / "data"), env=env, **kwargs)


def test_notify_sequence_start_status_watchdog_reload_stop(tmp_path, listener):
    broker = _broker(tmp_path, {"NOTIFY_SOCKET": listener.address,
                                "WATCHDOG_USEC": str(WATCHDOG_USEC)})
    try:
        broker.start()
        ready = listener.expect(lambda m: m.startswith("READY=1"), what="READY=1")
        assert ready == "READY=1\nSTATUS=serving 0 topics, 0 partitions, 0 connections"
        # READY means served: a client gets its handshake answered right away.
        with mq.Admin(broker.socket) as admin:
            admin.create_topic("orders", partitions=3)
        # The watchdog pings come every half WATCHDOG_USEC.
        pings = [time.monotonic()]
        for _ in range(3):
            listener.expect(lambda m: m == "WATCHDOG=1", timeout=5, what="WATCHDOG=1")
            pings.append(time.monotonic())
        # STATUS follows the summary (looked at every 5 s, sent when it changed).
        listener.expect(lambda m: m.startswith("STATUS=serving 1 topic, 3 partitions"),
                        timeout=20, what="STATUS with the new topic")

        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        broker.proc.send_signal(signal.SIGHUP)
        reloading = listener.expect(lambda m: m.startswith("RELOADING=1"), what="RELOADING")
        stamp = int(reloading.split("\nMONOTONIC_USEC=")[1])
        assert before <= stamp <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        after = listener.expect(lambda m: not m.startswith("WATCHDOG"), what="READY again")
        assert after.startswith("READY=1\nSTATUS=serving 1 topic, 3 partitions")

        broker.proc.send_signal(signal.SIGTERM)
        stopping = listener.expect(lambda m: m.startswith("STOPPING=1"), what="STOPPING=1")
        assert broker.proc.wait(30) == 0
        later = listener.drain()
        assert not [m for m in later if m.startswith(("WATCHDOG", "READY"))], listener.seen[-4:]
        assert listener.seen.index(stopping) > listener.seen.index(after)
    finally:
        broker.close()


def test_notify_to_an_abstract_socket(tmp_path):
    listener = NotifyListener(f"@mq-test-{uuid.uuid4().hex}")
    broker = _broker(tmp_path, {"NOTIFY_SOCKET": listener.address})
    try:
        broker.start()
        listener.expect(lambda m: m.startswith("READY=1\nSTATUS=serving"), what="READY=1")
        assert broker.stop() == 0
        listener.expect(lambda m: m.startswith("STOPPING=1"), what="STOPPING=1")
        assert not [m for m in listener.seen if m.startswith("WATCHDOG")]   # none asked for
    finally:
        broker.close()
        listener.close()


def test_recovery_extends_the_start_timeout(tmp_path, listener):
    broker = _broker(tmp_path, {"NOTIFY_SOCKET": listener.address})
    try:
        broker.start()
        with mq.Admin(broker.socket) as admin:
            admin.create_topic("t", partitions=2)
        broker.kill()                           # unclean: the next start recovers
        listener.drain()
        broker.start()
        first = listener.expect(lambda m: True, what="the first message")
        assert first.startswith("EXTEND_TIMEOUT_USEC=30000000\nSTATUS=recovering 0/"), first
        listener.expect(lambda m: m.startswith("READY=1"), what="READY=1")
    finally:
        broker.close()


def test_a_wedged_loop_stops_the_pings_and_they_resume(tmp_path, listener):
    data = tmp_path / "data"
    config = BrokerConfig(data_dir=str(data), socket=str(tmp_path / "mq.sock"))
    service = ServiceNotifier({"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "100000"})
    broker = Broker(config, service=service)
    broker.start()
    loop = threading.Thread(target=broker.serve_forever, name="broker-loop")
    loop.start()
    release = threading.Event()
    wedged = threading.Event()

    def wedge() -> None:
        wedged.set()
        release.wait(60)
    blocker = threading.Thread(target=broker._calls.call, args=(wedge, lambda: False))
    try:
        listener.expect(lambda m: m.startswith("READY=1"), what="READY=1")
        for _ in range(3):
            listener.expect(lambda m: m == "WATCHDOG=1", timeout=5, what="WATCHDOG=1")
        blocker.start()
        assert wedged.wait(10)
        listener.drain()                        # pings sent before the loop got stuck
        # Ten ping periods of silence while the process (and its other threads) live on.
        assert listener.recv(1.0) is None, listener.seen[-5:]
        assert loop.is_alive()
        release.set()
        listener.expect(lambda m: m == "WATCHDOG=1", timeout=5, what="pings again")
        blocker.join(10)
    finally:
        release.set()
        broker.request_stop()
        loop.join(30)
    assert not loop.is_alive()


def test_json_logs_one_object_a_line(tmp_path):
    config = tmp_path / "mq.toml"
    config.write_text('log_format = "json"\n')
    broker = _broker(tmp_path, None, config_file=str(config), log_level="INFO")
    broker.start()
    assert broker.stop() == 0
    lines = broker.stderr().splitlines()
    assert len(lines) >= 3
    for line in lines:
        obj = json.loads(line)
        assert {"ts", "level", "logger", "msg", "pid"} <= set(obj), obj
        assert obj["pid"] == broker.pid
    assert any(json.loads(line)["msg"] == "broker stopped cleanly" for line in lines)


def test_plain_logs_on_journald_stream_have_priority_and_no_time(tmp_path):
    broker = _broker(tmp_path, None, log_level="INFO")
    open(broker.stderr_path, "ab").close()          # its stderr file: the "journal"
    st = os.stat(broker.stderr_path)
    broker.env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    broker.start()
    assert broker.stop() == 0
    lines = broker.stderr().splitlines()
    assert "<6>INFO mq.broker: broker stopped cleanly" in lines
    assert all(line.startswith("<") for line in lines), lines


def test_plain_logs_elsewhere_keep_the_time(tmp_path):
    broker = _broker(tmp_path, {"JOURNAL_STREAM": "1:1"}, log_level="INFO")   # not stderr
    broker.start()
    assert broker.stop() == 0
    last = broker.stderr().splitlines()[-1]
    assert last.endswith(" INFO mq.broker: broker stopped cleanly") and last[:2] == "20"
