"""Apache Kafka's own Java clients and CLI tools, and Spark's Kafka connector, from Maven Central
for the tests: each pom under ``tests/java/`` is resolved once (``mvn dependency:copy-dependencies``)
into ``~/.cache/mq-tests/maven/<name>-<hash of the pom>/`` and reused while the pom is unchanged;
no jar is committed. ``KafkaChecks.java`` is compiled there too, keyed by its source's hash.

Failures are failures, never skips: without ``java``, ``javac`` or ``mvn`` (``.ci/run`` installs
openjdk-17-jdk-headless and maven when missing) or without Maven Central, the fixture fails.

Invariants: a cache directory holds a complete resolution or does not exist (each is built under a
temporary name, under a lock, and renamed when whole).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

JAVA_DIR = Path(__file__).resolve().parents[3] / "java"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mq-tests" / "maven"
# Pinned so that Maven need not look the plugin's latest version up (3.3.0-3.11.0 are served).
COPY = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
# A CLI tool's JVM runs for a second or two: C1 only and a small heap start it about 30 % sooner.
JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m",
       "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"]
WAIT = 60.0                   # seconds: one JVM's run on a loaded 2-core box

# Spark's Kafka connector: the connector, its token provider, the Kafka client it was built with
# (3.9) and its pool; Spark's own jars (Scala, Hadoop, snappy, lz4, SLF4J) come with PySpark.
SPARK_CONNECTOR = ("spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13",
                   "kafka-clients", "commons-pool2")

TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
GET_OFFSETS = "org.apache.kafka.tools.GetOffsetShell"
ACL_COMMAND = "org.apache.kafka.tools.AclCommand"

# The listeners the Java tests run against (a test parametrizes the ``security`` fixture).
SECURITY = ("PLAINTEXT", "SASL_SSL")


class JavaUnavailable(Exception):
    """Java, javac or Maven is missing, or Maven could not resolve a pom."""


def require(name: str) -> str:
    """The path of the program ``name``; raises ``JavaUnavailable`` when it is missing."""
    path = shutil.which(name)
    if path is None:
        raise JavaUnavailable(f"{name} is not installed (apt-get install -y "
                              "openjdk-17-jdk-headless maven; .ci/run does it)")
    return path


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _publish(build, target: Path) -> Path:
    """``build(tmp)`` fills a temporary directory beside ``target``, renamed to it when whole.
    One build at a time on the machine (a lock file): xdist workers wait for the first one's
    rather than run Maven on one ``~/.m2`` at once."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():                 # built while this worker waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            build(tmp)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(name: str, include: tuple[str, ...] = ()) -> list[Path]:
    """The runtime jars of ``tests/java/<name>/pom.xml`` (only the artifact ids ``include`` when
    given), resolved once into the cache."""
    pom = JAVA_DIR / name / "pom.xml"
    mvn = require("mvn")

    def build(tmp: Path) -> None:
        argv = [mvn, "-B", "-q", "-f", str(pom), COPY, "-DincludeScope=runtime",
                f"-DoutputDirectory={tmp}"]
        if include:
            argv.append("-DincludeArtifactIds=" + ",".join(include))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise JavaUnavailable(f"mvn could not resolve {pom}:\n{done.stdout[-3000:]}"
                                  f"{done.stderr[-2000:]}")

    key = hashlib.sha256(",".join(include).encode()).hexdigest()[:8]
    libs = _publish(build, CACHE / f"{name}-{_digest(pom)}-{key}")
    return sorted(libs.glob("*.jar"))


def spark_session(app: str, master: str = "local[1]", **conf: str):
    """A local-mode SparkSession for this process, with Spark's Kafka connector on its class
    path: every in-process session of the suite starts here. A process's first SparkContext
    launches the JVM, whose class path then holds for every later context in the process (one
    started later with more ``spark.jars`` still cannot load their data sources), so the
    sessions must agree, whichever test of the worker runs first. ``conf``: more settings
    (dots as in Spark's names)."""
    from pyspark.sql import SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.jars", ",".join(map(str, resolve("spark", SPARK_CONNECTOR))))
               .config("spark.ui.enabled", "false")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.session.timeZone", "UTC"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def compile_checks(jars: list[Path]) -> Path:
    """``KafkaChecks.java`` compiled against ``jars``: its classes directory (cached)."""
    source = JAVA_DIR / "kafka" / "src" / "KafkaChecks.java"
    javac = require("javac")

    def build(tmp: Path) -> None:
        done = subprocess.run([javac, "-d", str(tmp), "-cp", os.pathsep.join(map(str, jars)),
                               str(source)], capture_output=True, text=True, timeout=300,
                              check=False)
        if done.returncode != 0:
            raise JavaUnavailable(f"javac failed:\n{done.stderr}")

    return _publish(build, CACHE / f"classes-{_digest(source, JAVA_DIR / 'kafka' / 'pom.xml')}")


@dataclasses.dataclass(frozen=True)
class JavaKafka:
    """kafka-clients and kafka-tools 4.3.1 on one classpath, with ``KafkaChecks`` compiled."""
    java: str
    classpath: str

    @classmethod
    def load(cls) -> JavaKafka:
        java = require("java")
        jars = resolve("kafka")
        classes = compile_checks(jars)
        return cls(java, os.pathsep.join([str(classes), *map(str, jars)]))

    def run(self, main: str, *args: str, input: str | None = None, timeout: float = WAIT,
            check: bool = True) -> subprocess.CompletedProcess:
        """``java -cp CLASSPATH main args``: fails the test on a non-zero exit when ``check``."""
        done = subprocess.run([self.java, *JVM, "-cp", self.classpath, main, *args],
                              input=input, capture_output=True, text=True, timeout=timeout,
                              check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{main.rsplit('.', 1)[-1]} {' '.join(args)} exited "
                                 f"{done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def popen(self, main: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen([self.java, *JVM, "-cp", self.classpath, main, *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


@dataclasses.dataclass(frozen=True)
class KafkaTarget:
    """One broker as Kafka's Java tools reach it: its bootstrap address and a client
    properties file (empty for PLAINTEXT; ``security.protocol``, ``sasl.*``, ``ssl.*`` for a
    secured listener), given to every tool as ``--command-config`` and to ``KafkaChecks``."""
    java: JavaKafka
    bootstrap: str
    config: str

    def tool(self, main: str, *args: str, **kw) -> subprocess.CompletedProcess:
        """A Kafka CLI tool, with ``--bootstrap-server`` and ``--command-config`` first (where
        TransactionsCommand needs them: before its subcommand)."""
        return self.java.run(main, "--bootstrap-server", self.bootstrap,
                             "--command-config", self.config, *args, **kw)

    def checks(self, *steps: str, **kw) -> list[list[str]]:
        """``KafkaChecks`` running ``steps`` in one JVM: its output lines, split on tabs."""
        out = self.run_checks(*steps, **kw).stdout
        return [line.split("\t") for line in out.splitlines()]

    def run_checks(self, *steps: str, **kw) -> subprocess.CompletedProcess:
        """``KafkaChecks`` running ``steps``: the finished process (``check=False`` for one
        that is to fail)."""
        return self.java.run("KafkaChecks", self.bootstrap, self.config, *steps, **kw)

    def popen_checks(self, *steps: str) -> subprocess.Popen:
        return self.java.popen("KafkaChecks", self.bootstrap, self.config, *steps)


def client_properties(security: str, user: str, password: str, ca: str) -> dict[str, str]:
    """What a Java client (or Spark's connector, as ``kafka.*`` options) needs to reach a
    ``security`` listener as ``user``: nothing on PLAINTEXT; on SASL_SSL, SCRAM-SHA-256
    inside TLS with the CA certificate ``ca`` as a PEM trust store."""
    if security == "PLAINTEXT":
        return {}
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                                f'required username="{user}" password="{password}";',
            "ssl.truststore.type": "PEM", "ssl.truststore.location": ca}


def write_properties(path: Path, props: dict[str, str]) -> str:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return str(path)


def table(text: str) -> list[dict[str, str]]:
    """A Kafka tool's table (a header line, then rows) as dicts: columns split on tabs
    (TransactionsCommand's, where a cell may be empty) or else on runs of spaces."""
    lines = [line for line in text.splitlines() if line.strip()]
    if "\t" in lines[0]:
        rows = [[cell.strip() for cell in line.split("\t")] for line in lines]
    else:
        rows = [line.split() for line in lines]
    return [dict(zip(rows[0], row, strict=False)) for row in rows[1:]]
