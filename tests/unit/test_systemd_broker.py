"""The broker's side of systemd, without a broker: ServiceNotifier's rules on a fake clock,
inherited_listener's choice among passed fds, and LogManager's recovery progress."""

import subprocess
import sys
import textwrap

import pytest

from mq.broker import service
from mq.broker.service import ServiceNotifier, inherited_listener, status_line
from mq.log.manager import LogManager

ENV = {"NOTIFY_SOCKET": "/nonexistent/notify", "WATCHDOG_USEC": "2000000"}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def notifier(env=ENV):
    sent = []
    clock = Clock()
    return ServiceNotifier(env, clock, lambda message, environ: sent.append(message)), \
        sent, clock


def test_nothing_without_notify_socket():
    n, sent, clock = notifier({})
    n.recovery_progress(1, 2)
    n.ready("x")
    n.tick(lambda: "y")
    n.reloading()
    n.stopping()
    assert sent == [] and n.deadline_s() == float("inf")


def test_ready_then_watchdog_every_half_period_and_status_on_change():
    n, sent, clock = notifier()
    assert n.deadline_s() == float("inf")          # nothing before READY
    n.ready(status_line(1, 3, 0))
    assert sent == ["READY=1\nSTATUS=serving 1 topic, 3 partitions, 0 connections",
                    "WATCHDOG=1"]
    assert n.deadline_s() == pytest.approx(1.0)     # half of WATCHDOG_USEC
    sent.clear()
    clock.now += 0.5
    n.tick(lambda: "changed")
    assert sent == []
    clock.now += 0.5
    n.tick(lambda: "changed")
    assert sent == ["WATCHDOG=1"]                   # status waits for its 5 s
    clock.now += 4.0
    n.tick(lambda: "changed")
    assert sent[-1] == "STATUS=changed"
    sent.clear()
    clock.now += 5.0
    n.tick(lambda: "changed")
    assert sent == ["WATCHDOG=1"]                   # unchanged: not sent again


def test_watchdog_pid_of_another_process_means_no_pings():
    n, sent, clock = notifier({**ENV, "WATCHDOG_PID": "1"})
    n.ready("up")
    clock.now += 10
    n.tick(lambda: "up")
    assert "WATCHDOG=1" not in sent


def test_reload_and_stop():
    n, sent, clock = notifier()
    n.ready("up")
    sent.clear()
    n.reloading()
    assert sent[0].startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert int(sent[0].split("=")[-1]) > 0
    n.stopping()
    n.stopping()
    assert [m for m in sent if m.startswith("STOPPING=1")] == [sent[-1]]
    clock.now += 10
    n.tick(lambda: "later")
    assert not sent[-1].startswith(("WATCHDOG", "STATUS=later"))
    assert n.deadline_s() == float("inf")


def test_recovery_extends_at_most_once_a_second_and_only_on_progress():
    n, sent, clock = notifier()
    n.recovery_progress(0, 0)                       # a new data dir: nothing to recover
    assert sent == []
    n.recovery_progress(0, 4)
    n.recovery_progress(1, 4)
    assert sent == [f"EXTEND_TIMEOUT_USEC={service.EXTEND_TIMEOUT_USEC}\n"
                    "STATUS=recovering 0/4 partitions"]
    clock.now += 1.0
    n.recovery_progress(2, 4)
    assert sent[-1].endswith("STATUS=recovering 2/4 partitions") and len(sent) == 2
    assert 10_000_000 <= service.EXTEND_TIMEOUT_USEC <= 60_000_000


def test_log_manager_reports_progress_per_segment_and_partition(tmp_path):
    with LogManager.open(str(tmp_path)) as logs:
        for p in range(3):
            logs.create("t", p)
    calls = []
    with LogManager.open(str(tmp_path), progress=lambda done, total: calls.append(
            (done, total))):
        pass
    assert calls[0] == (0, 3) and calls[-1] == (3, 3)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def _in_child(tmp_path, setup: str, check: str) -> str:
    """Run ``setup`` (which leaves sockets at fds 3, 4, ... as systemd would) and then
    ``check`` in a fresh interpreter with LISTEN_PID/LISTEN_FDS naming them; returns its
    stdout. A child, because fds 3 and 4 of a pytest-xdist worker are its channel."""
    code = textwrap.dedent(f"""
        import os, socket, sys
        from mq.broker.service import inherited_listener
        path = sys.argv[1]
        for _ in range(8):                  # the sockets made next land above 3 and 4
            os.open(os.devnull, os.O_RDONLY)
        {setup}
        env = {{"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": str(len(socks))}}
        for i, s in enumerate(socks):
            os.dup2(s.fileno(), 3 + i)
        {check}
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.sock")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_inherited_listener_takes_the_first_listening_unix_stream(tmp_path):
    out = _in_child(tmp_path, """
        stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stream.bind(path)
        stream.listen(8)
        socks = [socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), stream]
    """, """
        sock = inherited_listener(env)
        os.fstat(3)                                 # the other one stays open
        print(sock.fileno(), sock.getsockname(), os.get_inheritable(4), env)
    """)
    assert out.split() == ["4", str(tmp_path / "s.sock"), "False", "{}"]


def test_inherited_listener_refuses_what_is_not_a_listening_unix_stream(tmp_path):
    out = _in_child(tmp_path, """
        socks = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
                 socket.socket(socket.AF_INET, socket.SOCK_STREAM)]
    """, """
        try:
            inherited_listener(env)
        except Exception as err:
            print(type(err).__name__, err)
    """)
    assert out.startswith("ConfigError socket activation: none of the passed sockets")
    assert "fd 3 (unknown): a Unix stream socket that is not listening" in out
    assert "fd 4 (unknown): a AF_INET socket, not AF_UNIX" in out


def test_no_listen_fds_no_listener():
    assert inherited_listener({}) is None
