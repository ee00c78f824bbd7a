"""Spark's own Kafka connector (``spark-sql-kafka-0-10_2.13``, given to local-mode Spark as
``spark.jars`` from ``tests/java/spark/pom.xml``: no Ivy download at test time) against mq's
Kafka listener: a batch read and a streaming read of a topic ``mq.Producer`` wrote, and a batch
write that ``mq.Consumer`` reads, over PLAINTEXT and over SASL_SSL (the connector's ``kafka.*``
options carry alice's client properties; she has Read on the topic read and Write on the one
written, no more). One SparkSession (``local[1]``) for the module, or the worker's."""

from __future__ import annotations


import pytest
from javakafka import SECURITY, SPARK_CONNECTOR, JavaUnavailable, resolve, spark_session
from kclients import WAIT, collect

from mq.broker.acls import AclOperation, ResourceType
from mq.client.admin import Admin
from mq.client.consumer import Consumer as MqConsumer
from mq.client.producer import Producer as MqProducer

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """The worker's SparkSession when it has one (``tests/spark``'s: every session of the suite
    starts with the connector, ``javakafka.spark_session``), else one of this module's,
    stopped after it."""
    from pyspark import SparkContext
    try:
        jars = resolve("spark", SPARK_CONNECTOR)
    except JavaUnavailable as err:
        pytest.fail(str(err))
    assert sorted(j.name.rsplit("-", 1)[0] for j in jars) == sorted(SPARK_CONNECTOR), jars
    shared = SparkContext._active_spark_context is not None
    session = spark_session("mq-spark-kafka-connector", **{
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse"))})
    yield session
    if not shared:
        session.stop()


@pytest.mark.parametrize("security", SECURITY)
def test_spark_reads_and_writes_mq_through_its_kafka_connector(spark, mixed, kafka_client_props,
                                                                grant, tmp_path):
    grant("alice", (ResourceType.TOPIC, "events", AclOperation.READ),
          (ResourceType.TOPIC, "scored", AclOperation.WRITE))
    with Admin(mixed.socket) as admin:
        admin.create_topic("events", 2)
        admin.create_topic("scored", 1)
    with MqProducer(socket=mixed.socket) as p:
        for i in range(6):
            p.send("events", key=f"k{i}".encode(), value=f"v{i}".encode(),
                   partition=i % 2).get(timeout=WAIT)
    # The connector passes options named kafka.* to its clients (a secured listener's too).
    kafka = {"kafka.bootstrap.servers": mixed.bootstrap,
             **{f"kafka.{k}": v for k, v in kafka_client_props.items()}}

    batch = (spark.read.format("kafka").options(**kafka).option("subscribe", "events")
             .option("startingOffsets", "earliest").load())
    rows = batch.selectExpr("CAST(key AS STRING) k", "CAST(value AS STRING) v", "partition",
                            "offset").collect()
    assert sorted((r.k, r.v, r.partition, r.offset) for r in rows) == [
        (f"k{i}", f"v{i}", i % 2, i // 2) for i in range(6)]

    stream = (spark.readStream.format("kafka").options(**kafka).option("subscribe", "events")
              .option("startingOffsets", "earliest").load()
              .selectExpr("CAST(value AS STRING) v"))
    query = (stream.writeStream.format("memory").queryName("events_stream")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(WAIT * 4), "the streaming read did not finish"
    assert query.exception() is None
    streamed = sorted(r.v for r in spark.sql("SELECT v FROM events_stream").collect())
    assert streamed == [f"v{i}" for i in range(6)]

    (batch.selectExpr("key", "upper(CAST(value AS STRING)) AS value").write.format("kafka")
     .options(**kafka).option("topic", "scored").save())
    with MqConsumer("scored", socket=mixed.socket, value_bytes=True) as c:
        got = collect(lambda: [(bytes(r.key), r.value) for rs in
                               c.poll(timeout_ms=100).values() for r in rs], 6)
    assert sorted(got) == [(f"k{i}".encode(), f"V{i}".encode()) for i in range(6)]
