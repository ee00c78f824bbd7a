"""A real Apache Kafka 4.3.1 node for the tests: one KRaft node (broker and controller in one
JVM) from the jars of ``tests/java/kafka-broker/pom.xml`` (kafka_2.13 and a log4j2 binding,
resolved once by ``javakafka.resolve``; nothing committed), with that directory's
``server.properties`` and ``log4j2.properties``.

::

    node = KafkaNode(workdir).start()    # formats workdir/meta once, then starts the JVM
    node.bootstrap                       # "127.0.0.1:PORT"
    node.data_dir                        # log.dirs: Kafka's partition directories
    node.stop()                          # SIGTERM: Kafka's clean shutdown (indexes trimmed)
    node.start()                         # again, on the same directories

Started as Kafka's quickstart does: ``kafka.tools.StorageTool random-uuid``
and ``format --standalone``, then ``kafka.Kafka server.properties``; it is ready when Metadata
names a broker. Kafka's log goes to ``workdir/logs/server.log`` (INFO).

Raises ``JavaUnavailable`` (from ``javakafka``) when Java or Maven is missing, and
``RuntimeError`` with the log's tail when the node exits or is not ready in time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from javakafka import JAVA_DIR, require, resolve

import mq.testing

CONFIG_DIR = JAVA_DIR / "kafka-broker"
# A broker, not a tool: C2 and a heap that holds a test's topics, but no more than that.
JVM = ["-Xms128m", "-Xmx512m", "-XX:+UseSerialGC"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KafkaNode:
    """One Kafka node in ``workdir`` (created; formatted on the first ``start``)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.data_dir = str(self.workdir / "data")
        self.port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_path = self.workdir / "logs" / "server.log"
        self.proc: subprocess.Popen | None = None
        self._java: list[str] | None = None

    def _command(self, *args: str) -> list[str]:
        if self._java is None:
            classpath = os.pathsep.join(map(str, resolve("kafka-broker")))
            self._java = [require("java"), *JVM,
                          f"-Dlog4j2.configurationFile=file:{CONFIG_DIR / 'log4j2.properties'}",
                          f"-Dkafka.logs.dir={self.workdir / 'logs'}", "-cp", classpath]
        return [*self._java, *args]

    def _format(self) -> str:
        """server.properties filled in, and the storage formatted (once)."""
        props = self.workdir / "server.properties"
        if props.exists():
            return str(props)
        self.workdir.mkdir(parents=True, exist_ok=True)
        template = (CONFIG_DIR / "server.properties").read_text()
        props.write_text(template.format(port=self.port, controller_port=_free_port(),
                                         data_dir=self.data_dir,
                                         metadata_dir=self.workdir / "meta"))
        cluster_id = self._run("kafka.tools.StorageTool", "random-uuid").strip()
        self._run("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
                  "--standalone")
        return str(props)

    def _run(self, *args: str) -> str:
        done = subprocess.run(self._command(*args), capture_output=True, text=True,
                              timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} exited {done.returncode}:\n"
                               f"{done.stdout}{done.stderr}")
        return done.stdout

    def start(self, timeout: float = 120.0) -> KafkaNode:
        props = self._format()
        with open(self.workdir / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(self._command("kafka.Kafka", props), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Kafka did not start (exit {self.proc.returncode}):\n"
                                   f"{self.log_tail()}")
            time.sleep(0.1)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _ready(self) -> bool:
        """Its listener answers and Metadata names a broker."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                pass
            meta = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except (OSError, KafkaException):
            return False
        return bool(meta.brokers)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no server.log)"

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (Kafka's clean shutdown), SIGKILL after ``timeout`` seconds."""
        if self.proc is not None:
            mq.testing.terminate(self.proc, timeout)
