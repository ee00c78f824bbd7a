"""The processes of the chaos run (``bench/chaos.py``): producer and group-member bodies (run in
forkserver children), the broker subprocess and the tmpfs that is filled to make the disk full.

Producers and members write ledgers (``bench.chaos_checks``) with one ``write(2)`` per line on
an ``O_APPEND`` descriptor, so a SIGKILL never leaves half a line; times are CLOCK_MONOTONIC.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from bench.chaos_checks import make_value
from mq.testing import broker_ready

TOPIC = "chaos"
GROUP = "chaos"
COMMIT_INTERVAL_S = 0.1                     # a member commits at most this often
BROKER_START_TIMEOUT_S = 60.0


# --- child processes ----------------------------------------------------------------------------

def _child_setup(err_path: str) -> list:
    """Common start of a producer or member: stderr to its own file, Ctrl-C is the harness's
    business, SIGTERM asks for a clean exit, and the process dies with the forkserver."""
    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop: list = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    return stop


def _connect(factory: Callable, stop: list):
    """``factory()`` once a broker answers (it may be restarting); None if stopped first."""
    from mq.errors import BrokerUnavailableError
    deadline = time.monotonic() + BROKER_START_TIMEOUT_S
    while not stop:
        try:
            return factory()
        except BrokerUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)                  # polling for the broker's socket
    return None


def plain_producer(n: int) -> bool:
    """Whether producer ``n`` sends with acks=1, not idempotent: a re-send of a batch the
    broker wrote before it was killed may be in the log twice (at least once)."""
    return n % 3 == 2


def producer_main(n: int, socket: str, partitions: int, rate: float, ack_path: str,
                  err_path: str) -> None:
    """Send ``make_value(n, seq)`` to partition ``seq % partitions`` at ``rate`` records/s
    with acks="all"; the callback appends ``A partition offset seq t`` once acknowledged.
    Even producers linger 2 ms (batches); odd ones send with ``linger_ms=0``, so that a
    record mostly goes out whole (``ProducerIO.send_whole``). Every third one
    (``plain_producer``) sends with acks=1 and ``linger_ms=0``: not idempotent, so its
    batches take the broker's append in C (``_crecords.append_plain``)."""
    stop = _child_setup(err_path)
    import mq
    from mq.errors import MQError
    fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    clock = time.monotonic

    def acked(seq: int, meta) -> None:
        os.write(fd, b"A %d %d %d %.6f\n" % (meta.partition, meta.offset, seq, clock()))

    def failed(seq: int, err: BaseException) -> None:
        os.write(fd, b"F %d %s %.6f\n" % (seq, type(err).__name__.encode(), clock()))

    plain = plain_producer(n)
    producer = _connect(lambda: mq.Producer(socket=socket, acks=1 if plain else "all",
                                            linger_ms=0 if n % 2 or plain else 2,
                                            max_block_ms=10_000), stop)
    if producer is None:
        return
    seq, start = 0, clock()
    while not stop:
        ahead = start + seq / rate - clock()
        if ahead > 0:
            time.sleep(ahead)                 # pacing, not waiting for a condition
        elif ahead < -1.0:
            start = clock() - seq / rate      # no burst after a blocked send()
        try:
            fut = producer.send(TOPIC, value=make_value(n, seq), partition=seq % partitions)
        except (MQError, TimeoutError) as err:
            failed(seq, err)
        else:
            fut.add_callback(acked, seq)
            fut.add_errback(failed, seq)
        seq += 1
    producer.close(5)


def member_main(n: int, socket: str, commit_path: str, err_path: str) -> None:
    """A group member: polls, and commits the offsets after what it consumed (of partitions it
    still owns) at most every ``COMMIT_INTERVAL_S``. Ledger lines: ``{"n", "t0", "offsets"}``
    before ``commit()``, ``{"n", "t1", "ok"[, "error"]}`` after."""
    stop = _child_setup(err_path)
    import mq
    from mq.errors import MQError
    fd = os.open(commit_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(**fields) -> None:
        os.write(fd, (json.dumps(fields) + "\n").encode())

    pending: dict = {}

    class Listener(mq.ConsumerRebalanceListener):
        def on_partitions_revoked(self, tps):
            for tp in tps:
                pending.pop(tp, None)

        def on_partitions_lost(self, tps):
            self.on_partitions_revoked(tps)

    consumer, k, last = None, 0, 0.0
    while not stop:
        if consumer is None:
            consumer = _connect(lambda: mq.Consumer(TOPIC, group_id=GROUP, socket=socket,
                                                    enable_auto_commit=False,
                                                    listener=Listener()), stop)
            if consumer is None:
                break
        try:
            for tp, records in consumer.poll(100, max_records=1000).items():
                pending[tp] = records[-1].offset + 1
            now = time.monotonic()
            if pending and now - last >= COMMIT_INTERVAL_S:
                owned = consumer.assignment()
                offsets = {tp: o for tp, o in pending.items() if tp in owned}
                pending.clear()
                last = now
                if offsets:
                    k += 1
                    log(n=k, t0=time.monotonic(),
                        offsets=[[tp.partition, o] for tp, o in offsets.items()])
                    try:
                        consumer.commit(offsets)
                    except MQError as err:
                        log(n=k, t1=time.monotonic(), ok=False, error=repr(err))
                    else:
                        log(n=k, t1=time.monotonic(), ok=True)
        except MQError as err:             # start over with a new consumer
            log(error=repr(err), t=time.monotonic())
            with contextlib.suppress(MQError):
                consumer.close()
            consumer = None
            time.sleep(0.05)                  # no hot loop while the broker is failing
    if consumer is not None:
        consumer.close()


# --- the broker ---------------------------------------------------------------------------------

def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


class Broker:
    """``python -m mq.broker`` in its own session (Ctrl-C is the harness's), stderr in the work
    dir (not on the data dir, which may be full), readiness through ``--ready-fd``. Each start
    writes the TOML config: ``min_free_bytes`` only when ``BrokerConfig`` has that field."""

    def __init__(self, data_dir: str, socket: str, work: str) -> None:
        self.data_dir, self.socket, self.work = data_dir, socket, work
        self.stderr_path = os.path.join(work, "broker.stderr.log")
        self.config_path = os.path.join(work, "mq.toml")
        self.proc: subprocess.Popen | None = None
        self.started_at_byte = 0
        self.min_free_bytes: int | None = None
        self.starts = 0

    @staticmethod
    def has_min_free_bytes() -> bool:
        from mq.broker.config import BrokerConfig
        return any(f.name == "min_free_bytes" for f in dataclasses.fields(BrokerConfig))

    def start(self, min_free_bytes: int | None = None) -> None:
        """Start and wait until it listens; raises ``RuntimeError`` (with the stderr tail)."""
        self.min_free_bytes = min_free_bytes
        with open(self.config_path, "w") as f:
            if min_free_bytes is not None:
                f.write(f"min_free_bytes = {min_free_bytes}\n")
        with contextlib.suppress(FileNotFoundError):
            self.started_at_byte = os.path.getsize(self.stderr_path)
        r, w = os.pipe()
        cmd = [sys.executable, "-m", "mq.broker", "--data-dir", self.data_dir, "--socket",
               self.socket, "--config", self.config_path, "--log-level", "WARNING",
               "--ready-fd", str(w)]
        # preexec_fn is safe: the harness runs no thread.
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(cmd, pass_fds=(w,), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True,
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509
        os.close(w)
        self.starts += 1
        if not broker_ready(r, BROKER_START_TIMEOUT_S):
            code = self.proc.poll()
            if code is None:
                self.kill()
            raise RuntimeError(f"broker did not start ({exit_text(self.proc.returncode)}): "
                               f"{self.stderr_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def term(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait; the exit status, or None if it was still running after
        ``timeout`` (it is killed then)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def stderr_size(self) -> int:
        try:
            return os.path.getsize(self.stderr_path)
        except FileNotFoundError:
            return 0

    def stderr_lines_since(self, size: int) -> int:
        """Lines the broker wrote to stderr after it was ``size`` bytes long."""
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(size)
                return f.read().count(b"\n")
        except FileNotFoundError:
            return 0

    def stderr_tail(self, lines: int = 12) -> str:
        """The last lines this incarnation wrote to stderr, joined with `` | ``."""
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(self.started_at_byte)
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return "(no stderr)"
        tail = [ln for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(tail) if tail else "(stderr empty)"


def exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


# --- the full disk ------------------------------------------------------------------------------

class Disk:
    """A tmpfs mounted on the data dir (root only), and the ballast that fills it."""

    def __init__(self, mountpoint: str, size_mb: int) -> None:
        self.mountpoint, self.size_mb = mountpoint, size_mb
        self.mounted = False
        self.ballast = os.path.join(mountpoint, "ballast")

    def mount(self) -> str | None:
        """Mount; returns why not (not root, mount failed) or None."""
        if os.geteuid() != 0:
            return "not running as root"
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs",
                              self.mountpoint], check=False, capture_output=True, text=True)
        if res.returncode != 0:
            return f"mount -t tmpfs failed: {res.stderr.strip() or res.returncode}"
        self.mounted = True
        return None

    def unmount(self) -> None:
        """Unmount (always called; every process using it must be gone). Lazy as a last
        resort so that a mount never outlives the run."""
        if not self.mounted:
            return
        for attempt in range(20):
            if subprocess.run(["umount", self.mountpoint], check=False,
                              capture_output=True).returncode == 0:
                self.mounted = False
                return
            time.sleep(0.1 * (attempt + 1))   # EBUSY: a killed process's files close late
        subprocess.run(["umount", "-l", self.mountpoint], check=False, capture_output=True)
        self.mounted = False

    def free_bytes(self) -> int:
        st = os.statvfs(self.mountpoint)
        return st.f_bavail * st.f_frsize

    def fill(self, leave_free: int = 0) -> int:
        """Write the ballast until ``write`` fails with ENOSPC (``leave_free`` 0) or until
        fewer than ``leave_free`` bytes are free. Returns the ballast's size."""
        if not self.mounted:                  # never fill a real disk
            raise RuntimeError(f"{self.mountpoint} is not the run's tmpfs")
        chunk = bytes(1 << 20)
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        size, step = 0, len(chunk)
        try:
            while step >= 512:
                want = step
                if leave_free:
                    want = min(step, self.free_bytes() - leave_free)
                    if want <= 0:
                        break
                try:
                    size += os.write(fd, chunk[:want])
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
                    step //= 8               # the broker may free a little; fill it all
        finally:
            os.close(fd)
        return size

    def drain(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.ballast)
