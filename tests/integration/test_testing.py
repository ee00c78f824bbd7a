"""``mq.testing``: a broker started by ``BrokerProcess`` dies with the process that started it,
even when that process is killed with SIGKILL, and not before it (the parent-death signal
follows the thread that forked, so a thread that started a broker and ended must not take the
broker with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import posix_ipc
import psutil
import pytest
from cli_run import WAIT, Lines

import mq
import mq.testing
from mq.protocol.state import leftovers, semaphore_prefix, shm_name

CHILD = textwrap.dedent("""\
    import sys, threading
    import mq.testing

    how, path = sys.argv[1], sys.argv[2]
    broker = mq.testing.BrokerProcess(path)
    if how == "thread":              # started by a thread that has ended when we print
        starter = threading.Thread(target=broker.start)
        starter.start()
        starter.join()
    else:
        broker.start()
    print(broker.pid, broker.socket, flush=True)
    sys.stdin.read()                 # until the test kills this process
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE   # nobody reaps it here
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("how", ["main-thread", "thread"])
def test_broker_dies_with_the_process_that_started_it(tmp_path, how):
    data_dir = tmp_path / "data"
    child = subprocess.Popen([sys.executable, "-c", CHILD, how, str(data_dir)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    broker_pid = None
    try:
        line = Lines(child.stdout).next(WAIT)
        assert line, child.stderr.read().decode() if child.poll() is not None else "no pid"
        pid_text, socket = line.decode().split()
        broker_pid = int(pid_text)
        assert psutil.Process(broker_pid).ppid() == child.pid
        with mq.Admin(socket) as admin:          # alive and serving, the starter gone or not
            assert admin.list_topics() == []
        child.send_signal(signal.SIGKILL)
        child.wait(WAIT)
        mq.testing.wait_for(lambda: _gone(broker_pid), timeout=WAIT,
                            message=f"broker {broker_pid} to exit after its parent died")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if broker_pid is not None and not _gone(broker_pid):
            os.kill(broker_pid, signal.SIGKILL)
        for stream in (child.stdin, child.stdout, child.stderr):
            stream.close()
    # SIGTERM, not SIGKILL: the broker stopped as stop() stops it (clean-shutdown marker).
    assert (data_dir / ".kafka_cleanshutdown").exists()


def test_a_killed_broker_leaves_nothing_in_dev_shm(tmp_path):
    """A broker killed with SIGKILL leaves its region in /dev/shm until the next start on its
    data dir (a consumer killed mid-registration, its wake-up semaphore): ``kill()`` removes the
    region, ``close()`` the semaphores too, and never another broker's region; without
    mq.testing, the next broker start removes both."""
    data = tmp_path / "data"
    with mq.testing.broker(data) as b:
        assert leftovers(str(data)) == [shm_name(str(data))]
        b.kill()
        assert leftovers(str(data)) == []
        b.start()
        stale = posix_ipc.Semaphore(semaphore_prefix(str(data)) + "1-dead", posix_ipc.O_CREX)
        stale.close()                        # a client killed before it unlinked its name
        os.kill(b.pid, signal.SIGKILL)       # dies on its own: close() finds it gone
        b.proc.wait()
        assert leftovers(str(data)) == sorted([shm_name(str(data)), stale.name])
    assert leftovers(str(data)) == []

    # Without mq.testing: the next broker start on the data dir removes both.
    with mq.testing.broker(data) as b:
        stale = posix_ipc.Semaphore(semaphore_prefix(str(data)) + "2-dead", posix_ipc.O_CREX)
        stale.close()
        b.proc.kill()
        b.proc.wait()                        # not b.kill(): what a crash leaves stays
        assert leftovers(str(data)) == sorted([shm_name(str(data)), stale.name])
        b.start()
        assert leftovers(str(data)) == [shm_name(str(data))]   # a new region, that's all

    # A region some other broker wrote (a pid not ours) is left alone.
    with mq.testing.broker(data) as b:
        other = mq.testing.BrokerProcess(str(data), socket_path=str(tmp_path / "b.sock"))
        with pytest.raises(RuntimeError, match="broker did not start"):
            other.start()                    # the data dir is locked by b
        assert leftovers(str(data)) == [shm_name(str(data))]
        other.close()
        assert leftovers(str(data)) == [shm_name(str(data))]


def test_terminate_asks_then_kills():
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert mq.testing.terminate(polite) == -signal.SIGTERM
    deaf = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""\
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)""")], stdout=subprocess.PIPE, text=True)
    assert deaf.stdout.readline() == "ready\n"          # SIGTERM is ignored from here on
    assert mq.testing.terminate(deaf, grace_s=0.2) == -signal.SIGKILL
    deaf.stdout.close()
    assert mq.testing.terminate(deaf) == -signal.SIGKILL  # gone already: its status
