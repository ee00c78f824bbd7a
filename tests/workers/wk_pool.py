"""The tests' side of a worker pool: ``mq workers run`` as a real process with its own stats
file and events file (``wk_handlers``), a feeder thread, and readers of what happened.

Everything a test creates lives under its ``tmp_path`` and its own broker, so ``-n auto`` is
safe. Nothing sleeps to wait for a condition: ``mq.testing.wait_for`` does.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import mq
import mq.testing
import workers

HERE = Path(__file__).resolve().parent
TIMEOUT = 30.0              # for one condition, on a loaded 2-core box
ENV = {k: v for k, v in os.environ.items()
       if k not in ("MQ_SOCKET", "MQ_DATA_DIR", "XDG_STATE_HOME", "NOTIFY_SOCKET")}


class Result:
    """A finished ``python -m mq`` command: ``code``, ``out``, ``err``."""

    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.code = proc.returncode
        self.out = proc.stdout.decode("utf-8", "replace")
        self.err = proc.stderr.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"exit {self.code}\nstdout: {self.out[-2000:]}\nstderr: {self.err[-2000:]}"


def mq_run(*args, cwd=None, env: dict | None = None) -> Result:
    full_env = dict(ENV, PYTHONPATH=os.pathsep.join(filter(None, (str(HERE),
                                                                  ENV.get("PYTHONPATH")))))
    full_env.update(env or {})
    return Result(subprocess.run([sys.executable, "-m", "mq", *map(str, args)],
                                 capture_output=True, env=full_env, cwd=cwd, timeout=60,
                                 check=False))


def read_events(path) -> list[dict]:
    """The complete lines of an events file (a line being written is left out)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in data.split(b"\n")[:-1] if line]


class Cluster:
    """A Kafka cluster (Apache Kafka, or mq's Kafka listener), which the helpers take in place
    of a socket: its ``bootstrap`` and the librdkafka properties (``kafka_config``) of the
    pools' clients, which a pool reads from a ``--command-config`` file."""

    def __init__(self, bootstrap: str, kafka_config: dict | None = None) -> None:
        self.bootstrap = bootstrap
        self.kafka_config = kafka_config

    def pool_args(self, directory: Path) -> list[str]:
        args = ["--bootstrap-server", self.bootstrap]
        if self.kafka_config:
            path = directory / "client.properties"
            path.write_text("".join(f"{k}={v}\n" for k, v in self.kafka_config.items()))
            args += ["--command-config", str(path)]
        return args


def client(broker: str | Cluster) -> dict:
    """mq's clients' keywords for a broker's socket or a ``Cluster``."""
    if isinstance(broker, Cluster):
        return {"bootstrap_servers": broker.bootstrap}
    return {"socket": broker}


class Pool:
    """``python -m mq workers run HANDLER ...`` with stderr, stats and events in ``directory``,
    on the broker of ``socket`` or on a ``Cluster``."""

    _count = 0

    def __init__(self, directory: Path, socket: str | Cluster, handler: str = "wk_handlers:handle",
                 topics=("jobs",), group: str = "g", processes: int = 2, args=(),
                 env: dict | None = None, events: Path | None = None,
                 stats_file: bool = True) -> None:
        """``stats_file``: the counter table in ``directory``; False: in its default place
        (``/dev/shm``, where ``mq workers stats GROUP`` finds it)."""
        Pool._count += 1
        n = Pool._count
        self.directory = directory
        self.socket = socket
        self.group = group
        self.events = events or directory / "events.jsonl"
        self.stats_path = directory / f"pool{n}.stats"
        self.stderr_path = directory / f"pool{n}.stderr"
        cmd = [sys.executable, "-m", "mq", "workers", "run", handler, "--group", group,
               "--processes", str(processes),
               *(socket.pool_args(directory) if isinstance(socket, Cluster)
                 else ["--socket", socket]),
               *(["--stats-file", str(self.stats_path)] if stats_file else []),
               *map(str, args)]
        for topic in topics:
            cmd += ["--topic", topic]
        full_env = dict(ENV, WK_EVENTS=str(self.events),
                        PYTHONPATH=os.pathsep.join(filter(None, (str(HERE),
                                                                 ENV.get("PYTHONPATH")))))
        full_env.update(env or {})
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err, env=full_env,
                                         cwd=directory)
        if not stats_file:
            self.stats_path = Path(workers.stats.default_stats_path(group, self.proc.pid))

    # --- looking ----------------------------------------------------------------------------
    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stats(self) -> dict | None:
        try:
            return workers.read_stats(str(self.stats_path))
        except (OSError, ValueError):
            return None

    def slots(self) -> list[dict]:
        snap = self.stats()
        return snap["slots"] if snap else []

    def total(self, counter: str) -> int:
        return sum(s[counter] for s in self.slots())

    def child_pids(self) -> list[int]:
        return [s["pid"] for s in self.slots() if s["state"] in ("running", "starting")]

    def wait_ready(self) -> None:
        """Until every child joined the group (the supervisor logs it)."""
        self.wait_for(lambda: "ready:" in self.stderr(), "the pool to be ready")

    def wait_for(self, condition, message: str, timeout: float = TIMEOUT) -> None:
        """Until ``condition()``; a timeout's failure shows the pool's log, what
        ``condition.explain()`` says (if it has one) and the children's stacks."""
        def check() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the pool exited ({self.proc.returncode}) while "
                                     f"waiting for {message}:\n{self.stderr()[-4000:]}")
            return condition()
        try:
            mq.testing.wait_for(check, timeout=timeout, interval=0.01, message=message)
        except TimeoutError as err:
            explain = getattr(condition, "explain", None)
            raise AssertionError(f"{err}\n{explain() if explain else ''}\n"
                                 f"{self.stderr()[-4000:]}\n{self.stacks()}") from err

    def stacks(self) -> str:
        """``py-spy dump`` of each child (Python and native frames), where py-spy is
        installed: where a stalled child waits."""
        if shutil.which("py-spy") is None:
            return "(no py-spy: the children's stacks are not shown)"
        out = []
        for pid in self.child_pids():
            try:
                dump = subprocess.run(["py-spy", "dump", "--native", "--pid", str(pid)],
                                      capture_output=True, text=True, timeout=30, check=False)
                out.append(f"child {pid}:\n{dump.stdout}{dump.stderr}")
            except subprocess.TimeoutExpired:
                out.append(f"child {pid}: py-spy did not answer within 30 s")
        return "\n".join(out)

    # --- acting -----------------------------------------------------------------------------
    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as err:
            raise AssertionError(f"the pool did not exit within {timeout} s:\n"
                                 f"{self.stderr()[-4000:]}") from err

    def stop(self) -> int:
        """SIGTERM and wait: the exit status."""
        self.send_signal(signal.SIGTERM)
        return self.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()                 # the children die with it (PR_SET_PDEATHSIG)
        self.proc.wait()
        self.stats_path.unlink(missing_ok=True)         # a killed pool's is left behind


class Feeder(threading.Thread):
    """Writes ``b"f%06d" % seq`` to partition ``seq % partitions`` at ``rate`` records/s until
    ``stop()``; ``acked`` holds what the broker acknowledged."""

    def __init__(self, socket: str | Cluster, topic: str, partitions: int,
                 rate: float) -> None:
        super().__init__(daemon=True, name="wk-feeder")
        self.socket, self.topic, self.partitions, self.rate = socket, topic, partitions, rate
        self.acked: list[bytes] = []
        self.failed: list[BaseException] = []        # sends the broker refused or timed out
        self.sent = 0
        self._done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with mq.Producer(**client(self.socket), linger_ms=1) as p:
                start = time.monotonic()
                while not self._done.is_set():
                    ahead = start + self.sent / self.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)            # pacing, not waiting for a condition
                    value = b"f%06d" % self.sent
                    fut = p.send(self.topic, value=value, partition=self.sent % self.partitions)
                    fut.add_callback(lambda _m, v=value: self.acked.append(v))
                    fut.add_errback(self.failed.append)
                    self.sent += 1
                p.flush(TIMEOUT)
        except BaseException as err:                  # noqa: BLE001 -- reported by stop()
            self.error = err

    def state(self) -> str:
        """What was sent, acknowledged and refused so far: a pool without progress may have
        had no new input."""
        last = f" (last: {self.failed[-1]!r})" if self.failed else ""
        return (f"the feeder: {self.sent} sent, {len(self.acked)} acknowledged, "
                f"{len(self.failed)} failed{last}, {'running' if self.is_alive() else 'ended'}")

    def stop(self) -> list[bytes]:
        self.close()
        self.check()
        return self.acked

    def check(self) -> None:
        """Raise what stopped the writing, if anything did."""
        if self.error is not None:
            raise AssertionError(f"the feeder stopped: {self.error!r}") from self.error

    def close(self) -> None:
        """Stop writing (a failed test's feeder must not write on into the next test)."""
        self._done.set()
        self.join(TIMEOUT)


def produce(socket: str | Cluster, topic: str, values, partition=None, key=None) -> None:
    with mq.Producer(**client(socket), linger_ms=2) as p:
        for i, value in enumerate(values):
            p.send(topic, value=value, key=key(i) if callable(key) else key,
                   partition=partition(i) if callable(partition) else partition)
        p.flush(TIMEOUT)


def ends(socket: str | Cluster, topic: str, isolation: str = "read_uncommitted") -> dict:
    with mq.Consumer(topic, **client(socket), isolation_level=isolation) as c:
        return c.end_offsets(sorted(c.assignment()))


def committed(socket: str | Cluster, group: str) -> dict:
    with mq.Admin(**client(socket)) as admin:
        return admin.list_group_offsets(group)


def coordinator_not_ready(err: mq.errors.UnknownServerError) -> bool:
    """Kafka's COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR,
    which mq.errors has no class of: a group's coordinator is loading its offsets (a Kafka
    node just started) or moving; asking again is the answer."""
    return err.code in (14, 15, 16)


# Kafka's answers to a client whose metadata went stale while a leader moved (a node killed
# by a test beside this one): LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER,
# FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH. Retriable in Kafka's clients; the next look
# asks with a fresh client.
_STALE_LEADER = (5, 6, 74, 75)


def caught_up(socket: str | Cluster, group: str, topic: str) -> bool:
    """The group committed the end of every partition of ``topic`` (an empty one needs
    no commit). False while the cluster's group coordinator or a partition's leader is
    moving (``coordinator_not_ready``, ``_STALE_LEADER``): a wait asks again."""
    try:
        done = committed(socket, group)
        return all(done.get(tp, 0) == end for tp, end in ends(socket, topic).items())
    except mq.errors.BrokerError as err:
        if coordinator_not_ready(err) or err.code in _STALE_LEADER:
            return False
        raise


def run_pool_script(script, socket: str, group: str, topic: str, cwd) -> None:
    """Run ``script``, a program that starts a pool of its own, until its ``group`` has
    consumed ``topic``; then SIGTERM (the pool drains) and check that it exited 0."""
    proc = subprocess.Popen([sys.executable, str(script)], env=ENV, cwd=cwd,
                            stderr=subprocess.PIPE)
    try:
        mq.testing.wait_for(lambda: caught_up(socket, group, topic), timeout=30,
                            message="the script's pool to catch up")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def read_all(socket: str | Cluster, topic: str, isolation: str = "read_uncommitted",
             markers: bool = False) -> list:
    """Every record of ``topic`` up to its end as it is now. ``markers``: the topic ends in
    transaction markers (aborted records too, maybe), before which a Kafka cluster's
    consumer's position stops (``test_pool_kafka.py``); so a record ``END`` is appended to
    each partition, outside any transaction, and read up to (and left out)."""
    out: list = []
    deadline = time.monotonic() + TIMEOUT
    with mq.Consumer(topic, **client(socket), isolation_level=isolation,
                     value_bytes=True) as c:
        tps = sorted(c.assignment())
        if markers:
            produce(socket, topic, [END] * len(tps), partition=lambda i: tps[i].partition)
        c.seek_to_beginning()
        end = c.end_offsets(tps)
        while not all(c.position(tp) >= end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{isolation} read of {topic} stuck"
            for records in c.poll(timeout_ms=100).values():
                out.extend(records)
    return [r for r in out if r.value != END] if markers else out


END = b"wk-pool-end"


def calls(events: list[dict], kind: str = "call") -> collections.Counter:
    """How many ``kind`` events each ``(partition, offset)`` has."""
    return collections.Counter((e["partition"], e["offset"]) for e in events
                               if e["kind"] == kind)
