"""A real Apache Kafka broker for the benchmarks: one KRaft node (broker and controller in one
JVM) from Maven Central's jars, started beside mq and driven by the same clients.

::

    with KafkaNode(workdir) as kafka:            # resolves the jars once, formats, starts
        kafka.bootstrap                          # "127.0.0.1:PORT"
        kafka.pid                                # the JVM, for CPU and RSS

The jars are the closure of ``kafka_2.13`` at ``KAFKA_VERSION`` (the version whose message
schemas ``mq/protocol/kafka/schemas.py`` is generated from) plus a log4j2 binding for SLF4J
1.x, resolved by Maven into ``~/.cache/mq-bench/kafka-<version>/`` on first use (nothing is
committed; ``.ci/run``-style machines reach Maven Central). Started as Kafka's quickstart
does: ``kafka.tools.StorageTool format --standalone`` (the cluster id made as ``StorageTool
random-uuid`` makes it, without its JVM) then ``kafka.Kafka server.properties``; ready when
its listener answers.

**Durability, stated beside every figure:** Kafka's defaults — ``acks=all`` is answered once
the in-sync replicas (here: this one node) have the batch in their page cache; nothing is
fsynced per request (``log.flush.interval.messages`` is Long.MAX_VALUE), the OS writes it back
on its own schedule. mq's ``acks=all`` waits for an fsync. So the comparison favours Kafka on
acks=all, and the two are equal on acks=1.

**SASL_SSL** (``KafkaNode(workdir, sasl_ssl=SaslSsl(certfile, keyfile, users))``): a second
listener, ``node.secure_bootstrap``, that asks for TLS (the certificate and its unencrypted
PKCS#8 key in one PEM file, ``ssl.keystore.type=PEM``) and then SCRAM-SHA-256; the users'
credentials are written into the metadata log at format time (``StorageTool format
--add-scram``), so they exist before the broker serves anyone. No authorizer: every user may
do everything, as on the PLAINTEXT listener.

Raises ``PeerUnavailable`` with one line when Java or Maven is missing or Central cannot be
reached.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field

import mq.testing

__all__ = ["KAFKA_VERSION", "KafkaNode", "PeerUnavailable", "SaslSsl", "classpath",
           "random_cluster_id"]

KAFKA_VERSION = "4.3.1"
LOG4J_VERSION = "2.25.4"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
  <groupId>mq.bench</groupId><artifactId>kafka-peer</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{LOG4J_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{LOG4J_VERSION}</version></dependency>
  </dependencies></project>
"""

# Warnings only, but the line that says the server started (readiness is checked on the socket).
_LOG4J2 = """status = error
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


class PeerUnavailable(RuntimeError):
    """Java, Maven or Maven Central is not there: the Kafka peer cannot run."""


@dataclass(frozen=True)
class SaslSsl:
    """A SASL_SSL listener: the broker's PEM certificate and unencrypted key, and the
    SCRAM-SHA-256 users (name -> password) it knows from the start."""
    certfile: str
    keyfile: str
    users: dict[str, str] = field(default_factory=dict)


def classpath(cache: str | None = None) -> str:
    """The broker's classpath, resolved by Maven once per pom into the cache."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise PeerUnavailable(f"the Kafka peer needs {tool} (apt-get install "
                                  f"{'openjdk-17-jre-headless' if tool == 'java' else 'maven'})")
    digest = hashlib.sha256(_POM.encode()).hexdigest()[:12]
    cache = cache or os.path.join(os.path.expanduser("~"), ".cache", "mq-bench",
                                  f"kafka-{KAFKA_VERSION}-{digest}")
    out = os.path.join(cache, "classpath.txt")
    if os.path.exists(out):
        with open(out) as f:
            return f.read().strip()
    os.makedirs(cache, exist_ok=True)
    with open(os.path.join(cache, "pom.xml"), "w") as f:
        f.write(_POM)
    tmp = out + ".tmp"
    done = subprocess.run(["mvn", "-B", "-q", "-f", os.path.join(cache, "pom.xml"),
                           f"{_DEPENDENCY_PLUGIN}:build-classpath",
                           f"-Dmdep.outputFile={tmp}"], capture_output=True, text=True)
    if done.returncode != 0 or not os.path.exists(tmp):
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise PeerUnavailable(f"Maven could not resolve Kafka {KAFKA_VERSION}: {last[0]}")
    os.replace(tmp, out)
    with open(out) as f:
        return f.read().strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_cluster_id() -> str:
    """A cluster id as Kafka's ``Uuid.randomUuid`` makes it (URL-safe base64 of a random UUID,
    unpadded), without the ~1 CPU-second of a JVM for ``StorageTool random-uuid``: never one
    that starts with "-", which a command line would take for an option."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(workdir: str, port: int, controller_port: int,
                      sasl_ssl_port: int | None = None,
                      keystore: str | None = None, node_id: int = 1,
                      voters: str | None = None) -> list[str]:
    """The lines of ``server.properties`` for one combined node with a PLAINTEXT listener on
    ``port`` and, given ``sasl_ssl_port``, a SASL_SSL one (SCRAM-SHA-256; TLS with the PEM
    ``keystore``: key and certificate in one file). Alone, or with ``voters`` ("1@host:port,
    ..."), node ``node_id`` of a cluster whose internal topics have three replicas, two in
    sync (``bench.kafka_cluster``)."""
    plain, c = f"127.0.0.1:{port}", f"127.0.0.1:{controller_port}"
    listeners = [f"PLAINTEXT://{plain}", f"CONTROLLER://{c}"]
    protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
    secure = []
    if sasl_ssl_port is not None:
        listeners.insert(1, f"SASL_SSL://127.0.0.1:{sasl_ssl_port}")
        protocols.append("SASL_SSL:SASL_SSL")
        secure = ["sasl.enabled.mechanisms=SCRAM-SHA-256",
                  "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config="
                  "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                  "ssl.keystore.type=PEM", f"ssl.keystore.location={keystore}"]
    replicas = "1" if voters is None else "3"
    in_sync = "1" if voters is None else "2"
    quorum = (f"controller.quorum.bootstrap.servers={c}" if voters is None
              else f"controller.quorum.voters={voters}")
    return [
        "process.roles=broker,controller", f"node.id={node_id}", quorum,
        f"listeners={','.join(listeners)}", f"advertised.listeners={','.join(listeners)}",
        "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
        f"listener.security.protocol.map={','.join(protocols)}", *secure,
        f"log.dirs={workdir}/data", f"metadata.log.dir={workdir}/meta",
        f"offsets.topic.replication.factor={replicas}",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={in_sync}",
        f"share.coordinator.state.topic.replication.factor={replicas}",
        f"share.coordinator.state.topic.min.isr={in_sync}",
        f"default.replication.factor={replicas}", f"min.insync.replicas={in_sync}",
        "offsets.topic.num.partitions=1", "transaction.state.log.num.partitions=1",
        "group.initial.rebalance.delay.ms=0", ""]


def scram_arguments(users: dict[str, str]) -> list[str]:
    """``StorageTool format``'s options that create the SCRAM-SHA-256 ``users``."""
    return [arg for name, password in users.items()
            for arg in ("--add-scram", f"SCRAM-SHA-256=[name={name},password={password}]")]


class KafkaNode:
    """One Kafka KRaft node in ``workdir`` (made fresh), on free loopback ports; with
    ``sasl_ssl``, a SASL_SSL listener too (``secure_bootstrap``). A node of a cluster
    (``bench.kafka_cluster``) is given its ``node_id``, and ``join(voters, cluster_id)`` before
    it is launched."""

    def __init__(self, workdir: str, heap_mb: int = 1024,
                 sasl_ssl: SaslSsl | None = None, node_id: int = 1) -> None:
        self.workdir = os.path.abspath(workdir)
        self.heap_mb = heap_mb
        self.sasl_ssl = sasl_ssl
        self.node_id = node_id
        self.port = _free_port()
        self.controller_port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.secure_port = _free_port() if sasl_ssl else None
        self.secure_bootstrap = f"127.0.0.1:{self.secure_port}" if sasl_ssl else None
        self.proc: subprocess.Popen | None = None
        self.started_s: float | None = None      # seconds from exec to a listening broker
        self._voters: str | None = None
        self._cluster_id: str | None = None
        self._launched_at = 0.0

    def join(self, voters: str, cluster_id: str) -> None:
        """Make this node one of a cluster's: its static quorum and the cluster's id."""
        self._voters, self._cluster_id = voters, cluster_id

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def java(self, cp: str | None = None) -> list[str]:
        return ["java", f"-Xms{min(256, self.heap_mb)}m", f"-Xmx{self.heap_mb}m",
                f"-Dlog4j2.configurationFile=file:{self.workdir}/log4j2.properties",
                f"-Dkafka.logs.dir={self.workdir}/logs", "-cp", cp or classpath()]

    def _keystore(self) -> str | None:
        """Kafka's PEM key store: the key, then the certificate, in one file."""
        if self.sasl_ssl is None:
            return None
        path = os.path.join(self.workdir, "keystore.pem")
        with open(path, "w") as out:
            for part in (self.sasl_ssl.keyfile, self.sasl_ssl.certfile):
                with open(part) as f:
                    out.write(f.read())
        return path

    def start(self, timeout: float = 120.0) -> KafkaNode:
        self.prepare()
        self.launch()
        self.wait(timeout)
        return self

    def prepare(self) -> None:
        """A fresh workdir: the properties written and the storage formatted."""
        java = self.java()
        shutil.rmtree(self.workdir, ignore_errors=True)
        os.makedirs(self.workdir)
        props = os.path.join(self.workdir, "server.properties")
        with open(props, "w") as f:
            f.write("\n".join(server_properties(self.workdir, self.port, self.controller_port,
                                                self.secure_port, self._keystore(),
                                                self.node_id, self._voters)))
        with open(os.path.join(self.workdir, "log4j2.properties"), "w") as f:
            f.write(_LOG4J2)
        cluster_id = self._cluster_id or random_cluster_id()
        users = self.sasl_ssl.users if self.sasl_ssl else {}
        quorum = ["--standalone"] if self._voters is None else []
        subprocess.run(java + ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                               props, *quorum, *scram_arguments(users)],
                       capture_output=True, text=True, check=True)

    def launch(self) -> None:
        """Start the JVM on the prepared workdir (again after a kill), without waiting."""
        self._launched_at = time.monotonic()
        with open(os.path.join(self.workdir, "stdout.log"), "ab") as log:
            self.proc = subprocess.Popen(
                self.java() + ["kafka.Kafka", os.path.join(self.workdir, "server.properties")],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float = 120.0, brokers: int = 1) -> None:
        """Until the node answers and Metadata names ``brokers`` brokers."""
        assert self.proc is not None
        while time.monotonic() - self._launched_at < timeout:
            if self.proc.poll() is not None:
                raise PeerUnavailable(f"Kafka exited with {self.proc.returncode}: see "
                                      f"{self.workdir}/stdout.log")
            if self._ready(brokers):
                self.started_s = time.monotonic() - self._launched_at
                return
            time.sleep(0.1)
        self.stop()
        raise PeerUnavailable(f"Kafka did not start within {timeout:.0f} s")

    def _ready(self, brokers: int = 1) -> bool:
        """Its listener answers and Metadata names ``brokers`` nodes."""
        from confluent_kafka.admin import AdminClient
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                pass
        except OSError:
            return False
        try:
            meta = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
        except Exception:       # confluent_kafka.KafkaException: not up yet
            return False
        return len(meta.brokers) >= brokers

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (Kafka's clean shutdown), then SIGKILL after ``timeout``."""
        if self.proc is not None:
            mq.testing.terminate(self.proc, timeout)

    def __enter__(self) -> KafkaNode:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
