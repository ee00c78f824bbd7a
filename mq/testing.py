"""Public test helpers: a real broker subprocess on its own data dir, socket and shm names.

::

    with mq.testing.broker(tmp_path) as b:
        with mq.Producer(socket=b.socket) as p: ...
        b.kill()          # SIGKILL, like a crash
        b.start()         # recover and serve again on the same data dir and socket

Readiness comes through a pipe the broker writes once it listens, so nothing here sleeps.

A broker dies with the process that started it, even one killed with SIGKILL: it runs with
Linux's parent-death signal (``PR_SET_PDEATHSIG``) set to SIGTERM, so it stops as ``stop()``
stops it. The kernel sends that signal when the *thread* that forked the broker ends, not the
process, so a broker started from any thread but the main one is forked by one long-lived
thread of this module instead.

A crash leaves the broker's shared-memory region in /dev/shm (``mq.protocol.state``):
``kill()``, a failed ``start()`` and ``close()`` remove what a broker of this object left, and
``close()`` the semaphores of clients killed before they unlinked theirs, so a test leaves
nothing there.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from mq.log import datadir

__all__ = ["BrokerProcess", "broker", "broker_ready", "terminate", "wait_for"]

_MAX_SOCKET_PATH = 100          # sun_path is 108 bytes on Linux

# Runs as ``python -c _BOOT PARENT_PID NOFILE ARGS...``: sets the parent-death signal and the
# open-file limit NOFILE ("soft:hard", or "-" to inherit it), then runs ``python -m mq.broker
# ARGS...`` in the same process. If the parent died before prctl, the broker was already
# reparented: it exits instead of running unowned.
_BOOT = """\
import ctypes, os, resource, runpy, signal, sys
parent = int(sys.argv.pop(1))
nofile = sys.argv.pop(1)
if nofile != "-":
    resource.setrlimit(resource.RLIMIT_NOFILE, tuple(map(int, nofile.split(":"))))
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)    # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass                                                         # not Linux
if os.getppid() != parent:
    sys.exit("mq.testing: the process that started this broker is gone")
runpy.run_module("mq.broker", run_name="__main__", alter_sys=True)
"""


class _Forker:
    """Starts subprocesses from a thread that lives as long as this process: the main thread
    when called on it, else one daemon thread (per process: a forked child makes its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue | None = None
        self._pid = -1

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            return subprocess.Popen(*args, **kwargs)
        with self._lock:
            if self._requests is None or self._pid != os.getpid():
                self._requests = queue.SimpleQueue()
                self._pid = os.getpid()
                threading.Thread(target=self._serve, args=(self._requests,), daemon=True,
                                 name="mq-testing-forker").start()
            requests = self._requests
        done: concurrent.futures.Future = concurrent.futures.Future()
        requests.put((done, args, kwargs))
        return done.result()

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while True:
            done, args, kwargs = requests.get()
            try:
                done.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001 -- handed to the caller
                done.set_exception(err)


_forker = _Forker()


class BrokerProcess:
    """A broker subprocess; ``data_dir`` and ``socket`` stay the same across restarts.
    ``nofile``: its open-file limit (soft, hard), else this process's."""

    def __init__(self, data_dir: str, socket_path: str | None = None,
                 config_file: str | None = None, log_level: str = "WARNING",
                 env: dict[str, str] | None = None,
                 nofile: tuple[int, int] | None = None) -> None:
        self.data_dir = os.path.abspath(data_dir)
        # Owner only: the broker changes no permission of a directory it did not create.
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        self._tmp = None
        if socket_path is None:
            socket_path = os.path.join(self.data_dir, "mq.sock")
            if len(socket_path) > _MAX_SOCKET_PATH:
                self._tmp = tempfile.mkdtemp(prefix="mq-")
                socket_path = os.path.join(self._tmp, "mq.sock")
        self.socket = socket_path
        self.config_file = config_file
        self.log_level = log_level
        self.env = env
        self.nofile = nofile
        self.proc: subprocess.Popen | None = None
        self.stderr_path = os.path.join(self.data_dir, "broker.stderr.log")

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        """Start and wait until the broker listens. Raises ``RuntimeError`` with the
        broker's stderr if it exits or is not ready within ``timeout`` seconds, and
        ``DataDirError`` before writing anything (its log included) into a directory that is
        not empty and not an mq data dir."""
        datadir.prepare(self.data_dir)
        r, w = os.pipe()
        nofile = "-" if self.nofile is None else "%d:%d" % self.nofile
        cmd = [sys.executable, "-c", _BOOT, str(os.getpid()), nofile,
               "--data-dir", self.data_dir, "--socket", self.socket,
               "--log-level", self.log_level, "--ready-fd", str(w)]
        if self.config_file:
            cmd += ["--config", self.config_file]
        env = dict(os.environ, **(self.env or {}))
        try:
            with open(self.stderr_path, "ab") as err:
                self.proc = _forker.popen(cmd, pass_fds=(w,), stdout=subprocess.DEVNULL,
                                          stderr=err, env=env)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        if not broker_ready(r, timeout):
            code = self.proc.poll()
            if code is None:
                self.proc.kill()
                self.proc.wait()
            self._remove_leftovers(semaphores=False)
            raise RuntimeError(f"broker did not start (exit {code}):\n{self.stderr()}")
        return self

    def stderr(self) -> str:
        try:
            with open(self.stderr_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: a clean shutdown. Returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the broker dies mid-whatever, like a crash. Its shared-memory region,
        which a crash leaves in /dev/shm until the next start on the data dir, is removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._remove_leftovers(semaphores=False)

    def _remove_leftovers(self, semaphores: bool) -> None:
        """What a broker of ours that exited left in /dev/shm (``state.remove_leftovers``)."""
        if self.proc is not None and self.proc.poll() is not None:
            from mq.protocol.state import remove_leftovers
            remove_leftovers(self.data_dir, self.proc.pid, semaphores)

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop (SIGKILL after 30 s) and remove what the broker and its clients left in
        /dev/shm: nothing after a clean stop; after a crash, the region and the semaphores of
        clients killed mid-registration."""
        try:
            self.stop(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        self._remove_leftovers(semaphores=True)
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


@contextlib.contextmanager
def broker(path, **kwargs) -> Iterator[BrokerProcess]:
    """A started broker on data dir ``path``; stopped (SIGTERM) on exit."""
    proc = BrokerProcess(str(path), **kwargs)
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


def broker_ready(fd: int, timeout: float) -> bool:
    """Wait for ``mq broker --ready-fd`` to write its ready line on pipe ``fd`` (closed
    here); False if it did not within ``timeout`` seconds (it died, or hangs)."""
    try:
        # poll, not select: select() fails for a descriptor >= 1024 (FD_SETSIZE).
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        ready = poller.poll(max(0, int(timeout * 1000)))
        return (os.read(fd, 64) if ready else b"") == b"ready\n"
    finally:
        os.close(fd)


def wait_for(condition, timeout: float = 10.0, interval: float = 0.005,
             message: str = "condition") -> None:
    """Wait until ``condition()`` is true; raises ``TimeoutError`` naming ``message``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def terminate(proc: subprocess.Popen, grace_s: float = 10.0) -> int:
    """Stop a child process as a service manager does: SIGTERM, then SIGKILL if it has not
    exited within ``grace_s`` seconds. Returns its exit status."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
