"""Where the Kafka cluster is, and mq's client options as librdkafka's properties.

A client talks to a cluster when it is given ``bootstrap_servers`` ("host:port,..." or a list
of them), or, given neither that nor ``socket``, when ``$MQ_BOOTSTRAP_SERVERS`` is set: an
explicit ``socket`` always means the local broker, so a script that names its socket keeps it
whatever the environment says. ``kafka_config`` is a dict of librdkafka properties
(``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``ssl.ca.location``...) passed
through as they are, after the ones mq derives from its own options, so it can also override
those; ``read_properties`` reads the same from a Java-style ``client.properties`` file (the
``mq`` commands' ``--command-config``, as Kafka's tools call it).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mq.errors import ConfigError

__all__ = ["ENV", "bootstrap", "backend_args", "connection_only", "native", "read_properties",
           "with_overrides"]

ENV = "MQ_BOOTSTRAP_SERVERS"


def bootstrap(socket: str | None, bootstrap_servers: str | Iterable[str] | None) -> str | None:
    """The cluster's "host:port,..." a client was asked to use, or ``None`` for the local
    broker. ``ValueError`` for both ``socket`` and ``bootstrap_servers``, or an empty list."""
    if bootstrap_servers is None:
        return None if socket is not None else (os.environ.get(ENV) or None)
    if socket is not None:
        raise ValueError("give socket= (the local broker) or bootstrap_servers= (a Kafka "
                         "cluster), not both")
    if not isinstance(bootstrap_servers, str):
        bootstrap_servers = ",".join(bootstrap_servers)
    servers = ",".join(s.strip() for s in bootstrap_servers.split(",") if s.strip())
    if not servers:
        raise ValueError("bootstrap_servers is empty; give host:port[,host:port...]")
    return servers


def backend_args(servers: str | None, args: tuple, kafka_config: Any) -> None:
    """Check a client's arguments against its backend: ``kafka_config`` only with a
    cluster, and a cluster's options by keyword (the local classes' positional order does
    not carry over)."""
    if servers is None:
        if kafka_config is not None:
            raise ValueError("kafka_config= is for a Kafka cluster: give bootstrap_servers= too")
    elif args:
        raise TypeError("with bootstrap_servers=, pass the other options by keyword")


class _LibrdkafkaLog:
    """librdkafka's log lines, to the ``mq.kafka`` logger at INFO: its connection errors
    repeat while a node is down, and what matters reaches the caller as an exception."""

    def __init__(self) -> None:
        self._log = logging.getLogger("mq.kafka")

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self._log.info(fmt, *args)


def with_overrides(servers: str, derived: Mapping[str, Any],
                   kafka_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """librdkafka's configuration: the cluster, what mq derived from its options (``None``
    values left out: librdkafka's default), then the user's own properties."""
    if importlib.util.find_spec("confluent_kafka") is None:
        raise ConfigError("a Kafka cluster needs confluent-kafka: pip install 'mq[kafka]'")
    conf: dict[str, Any] = {"bootstrap.servers": servers, "logger": _LibrdkafkaLog()}
    conf.update((k, v) for k, v in derived.items() if v is not None)
    if kafka_config:
        for key in kafka_config:
            if not isinstance(key, str):
                raise TypeError(f"kafka_config keys are librdkafka property names, got {key!r}")
        conf.update(kafka_config)
    return conf


def read_properties(path: str | os.PathLike) -> dict[str, str]:
    """A ``client.properties`` file: ``key=value`` (or ``key: value``) lines, ``#`` and
    ``!`` comments; raises ``ValueError`` naming the line that is neither."""
    out: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if sep < 0:
            raise ValueError(f"{path}:{number}: not a key=value line: {line!r}")
        out[line[:sep].strip()] = line[sep + 1:].strip()
    return out


# Properties about reaching the cluster, which every kind of librdkafka client takes.
_CONNECTION = {"bootstrap.servers", "security.protocol", "client.id", "logger",
               "socket.timeout.ms", "broker.address.family", "client.dns.lookup"}


def connection_only(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Of a client's configuration, how to reach the cluster (addresses, security, logging):
    what a helper client of another kind (an admin beside a consumer, a probe consumer
    beside a producer) takes."""
    return {k: v for k, v in conf.items()
            if k in _CONNECTION or k.startswith(("sasl.", "ssl.", "oauthbearer."))}


# The objects that own librdkafka handles (``native``). A forked child inherits the handles
# but not their threads: a handle's destructor joins those threads, and crashes the child
# (when the owner is collected there, or at its exit). So a forked child leaks them all.
_OWNERS: weakref.WeakSet = weakref.WeakSet()


def native(owner: object, kind: Any, conf: Mapping[str, Any]) -> Any:
    """A librdkafka handle ``kind(conf)`` (confluent-kafka's ``Producer``, ``Consumer`` or
    ``AdminClient``) for ``owner``, which keeps it (the handles are weakly referenced from
    nowhere else), never destroyed in a forked child. An owner with a ``_forked_child()``
    method is told it is in one (to open handles of its own there)."""
    handle = kind(conf)
    owner.__dict__.setdefault("_native_handles", []).append(handle)
    _OWNERS.add(owner)
    return handle


def _after_fork_in_child() -> None:
    for owner in list(_OWNERS):
        for handle in owner.__dict__.pop("_native_handles", ()):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))
        hook = getattr(owner, "_forked_child", None)
        if hook is not None:
            hook()
    _OWNERS.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
