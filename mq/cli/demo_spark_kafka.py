"""``mq demo --spark --bootstrap-server HOST:PORT[,...]``: what the pipeline demo needs to run on
an Apache Kafka cluster (or any Kafka-protocol broker, mq's own Kafka listener too) instead of
a local mq broker.

- The cluster: ``--bootstrap-server`` and ``--command-config FILE`` (librdkafka's properties
  in a ``client.properties`` file, as every ``mq`` command takes them) become the mq clients'
  ``bootstrap_servers=`` and ``kafka_config=`` (the producers, the admin that recreates the
  topics, the reader of the results), and, translated, the ``kafka.*`` options of Spark's
  Kafka connector (``mq.spark.kafka_connector``).
- The topics are ``mq-demo-orders`` and ``mq-demo-order-totals``, not ``orders`` and
  ``order-totals``: the demo deletes and recreates them, and a cluster's own ``orders`` must
  never be touched. Kafka deletes a topic in the background, so a create is asked again
  while the old one is still going.
- Spark's Kafka connector: ``--connector-jars`` (jars on disk, e.g. what Maven fetched from
  ``tests/java/spark/pom.xml``: no download), else Spark fetches
  ``mq.spark.kafka_connector.PACKAGE`` from Maven Central (``spark.jars.packages``, into Ivy's
  cache under ``~/.ivy2*``; once, about 10 MB: not the jars PySpark ships, ``EXCLUDES``).
- Before anything starts, one metadata request must be answered within ``PROBE_S``, so an
  unreachable cluster is one error line in bounded time.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import time

from mq.errors import MQError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

__all__ = ["ORDERS", "PROBE_S", "TOTALS", "Cluster", "probe", "recreate_topics"]

ORDERS = "mq-demo-orders"
TOTALS = "mq-demo-order-totals"
PROBE_S = 10.0              # the first metadata request: an unreachable cluster fails this soon
DELETED_S = 60.0            # how long Kafka may take to delete a topic in the background


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where the demo runs on Kafka: ``servers`` ("host:port,..."), ``config`` (librdkafka
    properties), ``jars`` (the connector's jars on disk, or empty: fetch it)."""
    servers: str
    config: dict[str, str]
    jars: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Cluster | None:
        """The cluster of ``--bootstrap-server`` (None without it). Raises ``ValueError`` (a
        usage error, one line) for options that do not go together, an unreadable
        ``--command-config`` or ``--connector-jars`` that name no file."""
        from mq.client.kafka.config import bootstrap, read_properties
        from mq.spark.kafka_connector import connector_options
        if args.bootstrap_server is None:
            if args.command_config or args.connector_jars:
                raise ValueError("--command-config and --connector-jars go with "
                                 "--bootstrap-server")
            return None
        if args.socket or args.data_dir:
            raise ValueError("--socket and --data-dir name a local broker, --bootstrap-server "
                             "a Kafka cluster: give one of them")
        servers = bootstrap(None, args.bootstrap_server)
        config = {}
        if args.command_config:
            try:
                config = read_properties(args.command_config)
            except OSError as err:
                raise ValueError(f"--command-config {args.command_config}: "
                                 f"{err.strerror or err}") from err
        connector_options(config)                   # a translation it cannot make: now
        return cls(servers, config, _jars(args.connector_jars))

    @property
    def clients(self) -> dict:
        """Keyword arguments of ``mq.Producer``, ``mq.Consumer`` and ``mq.Admin``."""
        return {"bootstrap_servers": self.servers, "kafka_config": self.config or None}

    def spark_conf(self) -> dict[str, str]:
        """Spark settings that put the connector on the class path."""
        from mq.spark.kafka_connector import EXCLUDES, PACKAGE
        if self.jars:
            return {"spark.jars": ",".join(self.jars)}
        return {"spark.jars.packages": PACKAGE, "spark.jars.excludes": ",".join(EXCLUDES)}

    def options(self) -> dict[str, str]:
        """The connector's ``kafka.*`` options besides ``kafka.bootstrap.servers``."""
        from mq.spark.kafka_connector import connector_options
        return connector_options(self.config)


def _jars(spec: str | None) -> tuple[str, ...]:
    """``--connector-jars``: comma-separated files or globs, each naming at least one file."""
    if not spec:
        return ()
    jars: list[str] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        found = sorted(glob.glob(os.path.expanduser(item)))
        if not found:
            raise ValueError(f"--connector-jars: no file matches {item}")
        jars += map(os.path.abspath, found)
    if not jars:
        raise ValueError("--connector-jars is empty")
    return tuple(jars)


def probe(cluster: Cluster) -> None:
    """Raise ``MQError`` (one line) unless the cluster answers a metadata request within
    ``PROBE_S``."""
    from mq.client.admin import Admin
    try:
        with Admin(timeout=PROBE_S, **cluster.clients) as admin:
            admin.list_topics()
    except MQError as err:
        raise MQError(f"no answer from the Kafka cluster at {cluster.servers} within "
                      f"{PROBE_S:.0f} s ({err})") from err


def recreate_topics(admin, names: tuple[str, ...], partitions: int) -> None:
    """Delete ``names`` where they exist and create them with ``partitions``, asking again
    while the cluster still deletes an old one (within ``DELETED_S``)."""
    existing = set(admin.list_topics())
    for name in names:
        if name in existing:
            try:
                admin.delete_topic(name)
            except UnknownTopicOrPartitionError:
                pass                                # deleted meanwhile
    deadline = time.monotonic() + DELETED_S
    for name in names:
        while True:
            try:
                admin.create_topic(name, partitions)
                break
            except TopicAlreadyExistsError as err:
                if time.monotonic() > deadline:
                    raise MQError(f"the cluster did not delete the topic {name} within "
                                  f"{DELETED_S:.0f} s, so it cannot be created afresh") from err
                time.sleep(0.2)
