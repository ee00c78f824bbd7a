"""Socket activation with real processes: ``systemd-socket-activate`` starts the broker on the
first connection and clients work through the passed socket; and a restart with the socket
held (as systemd holds it): a client that connects and sends while no broker runs is answered
by the next broker, and no acknowledged record is lost (SIGTERM and kill -9)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading

import pytest
from sd_helpers import WAIT, NotifyListener, read_all

import mq
from mq.protocol.frames import FrameReader, encode_frame
from mq.protocol.messages import PROTOCOL_VERSION, Api, Response, request

# Puts the held socket at fd 3 and execs the broker in the same process, so LISTEN_PID is
# the broker's pid (what systemd does for Type=notify services).
_ACTIVATE = """\
import os, sys
os.dup2(int(sys.argv[1]), 3)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1", LISTEN_FDNAMES="mq")
os.execv(sys.executable, [sys.executable, "-m", "mq", "broker", *sys.argv[2:]])
"""


def _start(held: socket.socket, data_dir, notify: str, stderr) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _ACTIVATE, str(held.fileno()), "--data-dir", str(data_dir)],
        pass_fds=(held.fileno(),), env=dict(os.environ, NOTIFY_SOCKET=notify),
        stdout=subprocess.DEVNULL, stderr=stderr)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started.append
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                    reason="systemd-socket-activate is not installed")
def test_systemd_socket_activate_starts_the_broker_for_the_first_client(tmp_path, procs):
    path = str(tmp_path / "mq.sock")
    listener = NotifyListener(str(tmp_path / "notify.sock"))
    with open(tmp_path / "broker.log", "wb") as log:
        proc = subprocess.Popen(
            ["systemd-socket-activate", "-l", path, "-E", f"NOTIFY_SOCKET={listener.address}",
             sys.executable, "-m", "mq", "broker", "--data-dir", str(tmp_path / "data")],
            stdout=subprocess.DEVNULL, stderr=log)
    procs(proc)
    try:
        _wait_for_socket(path, proc)
        # The first connection starts the broker: Admin's handshake waits in the backlog.
        with mq.Admin(path) as admin:
            admin.create_topic("orders", partitions=2)
        ready = listener.expect(lambda m: m.startswith("READY=1"), what="READY=1")
        assert "connection" in ready
        with mq.Producer(socket=path) as producer:
            futures = [producer.send("orders", value=b"v%d" % i, partition=i % 2)
                       for i in range(100)]
            for f in futures:
                f.get(timeout=WAIT)
        assert sorted(read_all(path, "orders")) == sorted(b"v%d" % i for i in range(100))
        proc.send_signal(signal.SIGTERM)              # the broker is this pid (exec)
        assert proc.wait(WAIT) == 0
        assert os.path.exists(path)                    # never unlinked: not the broker's
    finally:
        listener.close()
    assert "broker stopped cleanly" in (tmp_path / "broker.log").read_text()


def _wait_for_socket(path: str, proc: subprocess.Popen) -> None:
    """Until systemd-socket-activate listens on ``path``: the path appears at bind(), before
    listen(), and a connect() in between is refused (seen on a loaded CI box)."""
    import mq.testing
    mq.testing.wait_for(lambda: _listening(path) or proc.poll() is not None,
                        timeout=WAIT, message="systemd-socket-activate to listen")
    assert proc.poll() is None, "systemd-socket-activate exited"


def _listening(path: str) -> bool:
    """Whether a Unix socket bound to ``path`` listens, from /proc/net/unix (its Flags column
    has __SO_ACCEPTCON, 0x10000), without connecting to it (a connection would start the
    broker)."""
    with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
        next(f)
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == path and int(fields[3], 16) & 0x10000:
                return True
    return False


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_clients_wait_in_the_backlog_across_a_restart(tmp_path, procs, stop):
    path = str(tmp_path / "mq.sock")
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held.bind(path)
    held.listen(64)
    listener = NotifyListener(str(tmp_path / "notify.sock"))
    log = open(tmp_path / "broker.log", "ab")
    try:
        first = _start(held, tmp_path / "data", listener.address, log)
        procs(first)
        listener.expect(lambda m: m.startswith("READY=1"), what="the first READY=1")
        with mq.Admin(path) as admin:
            admin.create_topic("t", partitions=1)
        with mq.Producer(socket=path, acks="all") as producer:
            acked = [producer.send("t", value=b"before-%d" % i).get(timeout=WAIT)
                     for i in range(50)]
        assert [m.offset for m in acked] == list(range(50))

        first.send_signal(stop)
        assert first.wait(WAIT) == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
        assert os.path.exists(path)

        # No broker now. A raw client connects and sends its handshake: both succeed at
        # once (the kernel queues the connection in the held socket's backlog).
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.settimeout(WAIT)
        raw.connect(path)
        raw.sendall(encode_frame(request(Api.HANDSHAKE, 1, PROTOCOL_VERSION, "raw",
                                         os.getpid())))
        # And a whole producer: its constructor and send block until a broker answers.
        late: dict = {}

        def produce_late() -> None:
            try:
                with mq.Producer(socket=path, acks="all") as p:
                    late["meta"] = p.send("t", value=b"late").get(timeout=WAIT)
            except BaseException as err:               # noqa: BLE001 -- checked below
                late["error"] = err
        client = threading.Thread(target=produce_late)
        client.start()

        second = _start(held, tmp_path / "data", listener.address, log)
        procs(second)
        listener.expect(lambda m: m.startswith("READY=1"), what="the second READY=1")
        reply = _read_reply(raw)
        assert reply.request_id == 1 and reply.error_code == 0
        assert reply["info"]["pid"] == second.pid
        raw.close()
        client.join(WAIT)
        assert not client.is_alive() and "error" not in late, late
        assert late["meta"].offset == 50

        values = read_all(path, "t")
        assert values == [b"before-%d" % i for i in range(50)] + [b"late"]
        second.send_signal(signal.SIGTERM)
        assert second.wait(WAIT) == 0
    finally:
        listener.close()
        held.close()
        log.close()


def _read_reply(sock: socket.socket) -> Response:
    reader = FrameReader()
    while True:
        data = sock.recv(65536)
        assert data, "the broker closed the connection"
        reader.feed(data)
        for message in reader.messages():
            return Response.from_message(message)
