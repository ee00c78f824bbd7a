"""mq.systemd: the notify datagrams on a real socket (path and abstract address), the watchdog
variables, and listen_fds' parsing of systemd's socket-activation variables."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from mq import systemd


@pytest.fixture
def listener(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(10)
    yield sock
    sock.close()


def test_notify_sends_one_datagram_to_a_path(listener, tmp_path):
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    assert systemd.notify("READY=1\nSTATUS=up", env)
    assert listener.recv(4096) == b"READY=1\nSTATUS=up"


def test_notify_to_an_abstract_address(tmp_path):
    name = f"mq-test-{os.getpid()}-{tmp_path.name}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        assert systemd.notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_notify_without_socket_or_to_nobody_is_quiet(tmp_path, caplog):
    assert not systemd.notify("READY=1", {})
    assert not systemd.notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    assert "READY=1" in caplog.text


def test_watchdog_usec_respects_watchdog_pid():
    assert systemd.watchdog_usec({}) == 0
    assert systemd.watchdog_usec({"WATCHDOG_USEC": "2000000"}) == 2_000_000
    mine = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert systemd.watchdog_usec(mine) == 2_000_000
    assert systemd.watchdog_usec({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}) == 0
    assert systemd.watchdog_usec({"WATCHDOG_USEC": "soon"}) == 0


def test_monotonic_usec_is_clock_monotonic():
    import time
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert before <= systemd.monotonic_usec() <= before + 10_000_000


def test_listen_fds_for_this_process_unsets_and_sets_cloexec():
    # A child: fds 3 and 4 of a pytest-xdist worker are its channel, not ours to move.
    code = textwrap.dedent("""
        import os
        from mq import systemd
        r, w = os.pipe()
        os.dup2(r, 3, inheritable=True)
        os.dup2(w, 4, inheritable=True)
        env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "2",
               "LISTEN_FDNAMES": "mq-broker.socket"}
        print(systemd.listen_fds(env), env, os.get_inheritable(3), os.get_inheritable(4))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(3, 'mq-broker.socket'), (4, 'unknown')] {} False False"


def _is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_listen_fds_of_another_process_are_not_ours_but_are_unset():
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1"}
    assert systemd.listen_fds(env) == []
    assert env == {}
    kept = {"LISTEN_PID": "1", "LISTEN_FDS": "1"}
    assert systemd.listen_fds(kept, unset=False) == [] and kept
    assert systemd.listen_fds({}) == []


def test_listen_fds_garbled():
    with pytest.raises(ValueError, match="not integers"):
        systemd.listen_fds({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "x"})
    closed = next(fd for fd in range(3, 10_000) if not _is_open(fd))
    inheritable = {fd: os.get_inheritable(fd) for fd in range(3, closed)}
    with pytest.raises(ValueError, match=f"fd {closed} is not open"):
        systemd.listen_fds({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": str(closed - 1)})
    assert inheritable == {fd: os.get_inheritable(fd) for fd in range(3, closed)}
