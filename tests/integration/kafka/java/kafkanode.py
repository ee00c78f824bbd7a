"""A real Apache Kafka 4.3.1 node for the tests: one KRaft node (broker and controller in one
JVM) from the jars of ``tests/java/kafka-broker/pom.xml`` (kafka_2.13 and a log4j2 binding,
resolved once by ``javakafka.resolve``; nothing committed), with that directory's
``server.properties`` (a node alone) or ``cluster.properties`` (a node of ``kafkacluster``) and
``log4j2.properties``.

::

    node = KafkaNode(workdir).start()    # formats workdir/meta once, then starts the JVM
    node.bootstrap                       # "127.0.0.1:PORT"
    node.data_dir                        # log.dirs: Kafka's partition directories
    node.stop()                          # SIGTERM: Kafka's clean shutdown (indexes trimmed)
    node.start()                         # again, on the same directories
    node.kill()                          # SIGKILL, as a crash (no clean-shutdown marker)

The JVM leads a process group of its own (``pid``), so that a node started by one process can
be killed by another (``kafkacluster`` shares one cluster among the xdist workers).

Started as Kafka's quickstart does: a cluster id as ``kafka.tools.StorageTool random-uuid``
makes it (``random_cluster_id``, without its JVM), ``format --standalone``, then
``kafka.Kafka server.properties``; it is ready when Metadata
names a broker. Kafka's log goes to ``workdir/logs/server.log`` (INFO).

Raises ``JavaUnavailable`` (from ``javakafka``) when Java or Maven is missing, and
``RuntimeError`` with the log's tail when the node exits or is not ready in time.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from javakafka import JAVA_DIR, require, resolve

import mq.testing

CONFIG_DIR = JAVA_DIR / "kafka-broker"
# A broker, not a tool: C2 and a heap that holds a test's topics, but no more than that.
JVM = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC"]
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _free_port() -> int:
    """A free port below the kernel's ephemeral range, where no client connection's local port
    can take it while the node is down: a restarted node binds the same ports again."""
    low = int(EPHEMERAL.read_text().split()[0])
    while True:
        port = random.randrange(low // 3, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def random_cluster_id() -> str:
    """A cluster id as Kafka's ``Uuid.randomUuid`` makes it (URL-safe base64 of 16 random
    bytes), without a JVM: never one that starts with "-", which a command line would take
    for an option."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


class KafkaNode:
    """One Kafka node in ``workdir`` (created; formatted on the first ``start``)."""

    def __init__(self, workdir: Path, *, template: Path = CONFIG_DIR / "server.properties",
                 format_args: tuple[str, ...] = ("--standalone",), jvm: list[str] = JVM,
                 ports: tuple[int, int] | None = None, pid: int | None = None) -> None:
        """One node alone (the defaults), or a node of a cluster (``kafkacluster.py``): its
        properties ``template``, the storage tool's quorum flags and JVM options
        (``set_cluster`` gives the rest); ``ports`` (listener, controller) and ``pid`` of a
        node that another process set up and started."""
        self.workdir = Path(workdir)
        self.data_dir = str(self.workdir / "data")
        self.port, self.controller_port = ports or (_free_port(), _free_port())
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = self.workdir / "logs" / "server.log"
        self.pid = pid
        self._jvm = jvm
        self._java: list[str] | None = None
        self._template = template
        self._values: dict = {}
        self._cluster_id: str | None = None
        self._format_args = format_args

    def _command(self, *args: str) -> list[str]:
        if self._java is None:
            classpath = os.pathsep.join(map(str, resolve("kafka-broker")))
            self._java = [require("java"), *self._jvm,
                          f"-Dlog4j2.configurationFile=file:{CONFIG_DIR / 'log4j2.properties'}",
                          f"-Dkafka.logs.dir={self.workdir / 'logs'}", "-cp", classpath]
        return [*self._java, *args]

    def _format(self) -> str:
        """server.properties filled in, and the storage formatted (once)."""
        props = self.workdir / "server.properties"
        if props.exists():
            return str(props)
        self.workdir.mkdir(parents=True, exist_ok=True)
        template = self._template.read_text()
        props.write_text(template.format(port=self.port, controller_port=self.controller_port,
                                         data_dir=self.data_dir,
                                         metadata_dir=self.workdir / "meta", **self._values))
        cluster_id = self._cluster_id or random_cluster_id()
        self._run("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
                  *self._format_args)
        return str(props)

    def set_cluster(self, cluster_id: str, values: dict) -> None:
        """Make this a node of a cluster: its id and template values (before ``launch``)."""
        self._cluster_id = cluster_id
        self._values = values

    def _run(self, *args: str) -> str:
        done = subprocess.run(self._command(*args), capture_output=True, text=True,
                              timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} exited {done.returncode}:\n"
                               f"{done.stdout}{done.stderr}")
        return done.stdout

    def start(self, timeout: float = 120.0, brokers: int = 1) -> KafkaNode:
        """Launch the JVM and wait until Metadata names ``brokers`` brokers."""
        self.launch()
        self.wait_ready(timeout, brokers)
        return self

    def launch(self) -> None:
        """Start the JVM (formatting the storage the first time) without waiting for it: a
        cluster's nodes must all be up before any is ready."""
        argv = self._command("kafka.Kafka", self._format())
        out = str(self.workdir / "stdout.log")
        self.pid = os.posix_spawn(argv[0], argv, os.environ, setsid=True, file_actions=[
            (os.POSIX_SPAWN_OPEN, 1, out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2)])

    def wait_ready(self, timeout: float = 120.0, brokers: int = 1) -> None:
        """Until its listener answers and Metadata names ``brokers`` brokers; a node that
        exits or is not ready in time is killed, and ``RuntimeError`` has its log's tail."""
        deadline = time.monotonic() + timeout
        while not self._ready(brokers):
            if not self.running or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"Kafka node {self.workdir.name} did not start in "
                                   f"{timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.1)

    @property
    def running(self) -> bool:
        return self.pid is not None and alive(self.pid)

    def _ready(self, brokers: int = 1) -> bool:
        """Its listener answers and Metadata names ``brokers`` brokers."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                pass
            meta = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except (OSError, KafkaException):
            return False
        return len(meta.brokers) >= brokers

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no server.log)"

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (Kafka's clean shutdown), SIGKILL after ``timeout`` seconds."""
        if self._signal(signal.SIGTERM):
            try:
                self._wait_gone(timeout)
            except TimeoutError:
                self.kill()

    def kill(self) -> None:
        """SIGKILL the JVM's process group, as a crash: its ports are free and its files no
        longer written when this returns."""
        if self._signal(signal.SIGKILL):
            self._wait_gone(30.0)

    def _signal(self, signo: int) -> bool:
        """Send ``signo`` to the JVM's process group if it still runs: False if it does not
        (nor if ``pid`` is now another process's, whose command line does not name this
        node's properties)."""
        if self.pid is None or not self.running:
            return False
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                if str(self.workdir / "server.properties").encode() not in f.read():
                    return False
            os.killpg(self.pid, signo)
        except (FileNotFoundError, ProcessLookupError):
            return False
        return True

    def _wait_gone(self, timeout: float) -> None:
        mq.testing.wait_for(lambda: not alive(self.pid), timeout, 0.02,
                            f"Kafka node {self.workdir.name} (pid {self.pid}) to exit")


def alive(pid: int) -> bool:
    """``pid`` runs: it exists and is no zombie. A child of this process that exited is
    reaped here (a JVM that a test killed, or that crashed)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
