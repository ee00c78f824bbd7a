"""Spark's own Kafka connector (``format("kafka")``) for a cluster mq's clients reach: its Maven
coordinates, and its ``kafka.*`` options from the librdkafka properties mq's clients take
(``kafka_config=``, the ``mq`` commands' ``--command-config FILE``). Pure: no Spark, no client.

The connector is a Java client, so one cluster's settings have two spellings. The ones spelt
differently are translated; every other property passes as it is, since the two clients share
most names (``security.protocol``, ``sasl.mechanism``, ``client.id``,
``ssl.endpoint.identification.algorithm``...), and a Java client ignores a name it lacks::

    librdkafka                                 Java (the connector's kafka.* options)
    sasl.mechanisms=M                          sasl.mechanism=M
    sasl.username=U, sasl.password=P           sasl.jaas.config=<PLAIN or SCRAM module>
                                                 required username="U" password="P";
    ssl.ca.location=FILE (PEM)                 ssl.truststore.type=PEM,
                                                 ssl.truststore.location=FILE
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["EXCLUDES", "PACKAGE", "VERSION", "connector_options", "java_properties"]

# Maven Central serves the connector up to 4.2.0 while PySpark is at 4.3.0; the 4.2 connector
# runs on Spark 4.2 and 4.3 (Scala 2.13, the same DataSource V2 API). tests/java/spark/pom.xml
# pins the same version (tests/unit/spark/test_kafka_connector.py holds them together).
VERSION = "4.2.0"
PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{VERSION}"
# What the connector depends on besides its token provider, kafka-clients and commons-pool2:
# jars PySpark ships (Hadoop's client, 110 MB of the 125 MB, and compression, logging), which
# Spark's --packages would fetch again and put on the class path twice (spark.jars.excludes).
EXCLUDES = ("org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime",
            "org.xerial.snappy:snappy-java", "at.yawk.lz4:lz4-java", "org.slf4j:slf4j-api",
            "org.scala-lang.modules:scala-parallel-collections_2.13",
            "com.google.code.findbugs:jsr305")

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _quoted(text: str) -> str:
    """A JAAS option value: in double quotes, with ``\\`` and ``"`` escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_properties(config: Mapping[str, str]) -> dict[str, str]:
    """The Java client's properties for the librdkafka properties ``config`` (module doc).
    Raises ``ValueError`` for a user name and password without a mechanism the translation
    knows (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)."""
    props = dict(config)
    if "sasl.mechanisms" in props:
        props.setdefault("sasl.mechanism", props.pop("sasl.mechanisms"))
    user, password = props.pop("sasl.username", None), props.pop("sasl.password", None)
    if user is not None or password is not None:
        mechanism = props.get("sasl.mechanism", "GSSAPI")
        if mechanism not in _LOGIN_MODULES:
            raise ValueError(f"sasl.username and sasl.password need sasl.mechanism PLAIN, "
                             f"SCRAM-SHA-256 or SCRAM-SHA-512 for Spark's Kafka connector, "
                             f"got {mechanism}")
        props.setdefault("sasl.jaas.config",
                         f"{_LOGIN_MODULES[mechanism]} required username={_quoted(user or '')} "
                         f"password={_quoted(password or '')};")
    ca = props.pop("ssl.ca.location", None)
    if ca is not None:
        props.setdefault("ssl.truststore.type", "PEM")
        props.setdefault("ssl.truststore.location", ca)
    return props


def connector_options(config: Mapping[str, str] | None) -> dict[str, str]:
    """The connector's ``kafka.<property>`` options for the librdkafka properties ``config``
    (without ``bootstrap.servers``: the caller gives ``kafka.bootstrap.servers``). Raises
    ``ValueError`` as ``java_properties`` does."""
    props = java_properties(config or {})
    props.pop("bootstrap.servers", None)
    return {f"kafka.{key}": str(value) for key, value in props.items()}
