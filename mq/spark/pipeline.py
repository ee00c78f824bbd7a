"""The streaming pipeline of ``mq demo --spark``: order totals per customer and event-time
window, from the topic ``orders`` to the topic ``order-totals`` and to Parquet.

::

    orders (JSON)  --readStream.format("mq")-->  from_json  -->  withWatermark(event_time, 5 s)
      --> groupBy(window(event_time, 5 s), customer): orders, amount, last_order_at
      --> writeStream.format("mq")       topic order-totals  (exactly once per micro-batch)
      --> writeStream.format("parquet")  files               (Spark's file sink: exactly once)

An order event is a JSON object ``{"order_id", "customer", "amount", "event_time"}`` keyed by
its customer; ``event_time`` is when the order happened (ISO 8601), which is not when it was
produced: orders reach the topic late and out of order. Totals are in append mode, so each
(window, customer) is written once, when the watermark (the latest event time seen minus 5 s)
passes the window's end; an order arriving later than that is dropped (Spark counts it in
``numRowsDroppedByWatermark``). ``amount`` is a decimal, so sums are exact. ``last_order_at``
is the newest Kafka ``timestamp`` (produce time) among the window's orders: a result's record
timestamp minus it is the pipeline's end-to-end lag.

One DataFrame, two sinks: Spark runs one query per ``writeStream`` (two sources reading the
same offsets, each with its own checkpoint), which is how the same results reach both sinks
exactly once; ``foreachBatch`` would write both from one query but only at least once.

**Moving to Kafka.** Options, schema and offsets JSON are Kafka's, so the same code runs
against an Apache Kafka cluster by changing ``format("mq")`` to ``format("kafka")`` and
adding ``kafka.bootstrap.servers``, nothing else::

    totals = order_totals(spark)                                       # mq, on this host
    totals = order_totals(spark, "kafka", servers="kafka-1:9092")      # an Apache Kafka cluster
    to_topic(totals, checkpoint, "kafka", servers="kafka-1:9092")

that is, in the query itself::

    spark.readStream.format("mq").option("subscribe", "orders")
    spark.readStream.format("kafka").option("kafka.bootstrap.servers", "kafka-1:9092") \\
        .option("subscribe", "orders")

The mq code passes no connection option: the source and the sink find the broker by
``$MQ_SOCKET`` (or the default data dir), which Spark's Python workers inherit. What changes
with the move is outside the code: Spark needs its Kafka connector
(``--packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0``,
``mq.spark.kafka_connector.PACKAGE``); a secured cluster's client settings go in ``options``
as ``kafka.*`` (``mq.spark.kafka_connector.connector_options``); Kafka's sink is at least once
(mq's streaming sink is exactly once per micro-batch, for ``read_committed`` readers); and the
executors may run anywhere (mq's executors map the broker's log files read-only, so mq runs in
local mode, or on a cluster whose executors share the broker's host). ``mq demo --spark
--bootstrap-server HOST:PORT`` runs this pipeline on a Kafka cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

__all__ = ["ORDERS", "ORDER_SCHEMA", "TOTALS", "WATERMARK_S", "WINDOW_S", "order_totals",
           "to_parquet", "to_topic"]

ORDERS = "orders"
TOTALS = "order-totals"
ORDER_SCHEMA = "order_id STRING, customer STRING, amount DECIMAL(12,2), event_time TIMESTAMP"
WINDOW_S = 5           # tumbling windows of event time
WATERMARK_S = 5        # how late an order may arrive; the demo's arrive < 1 s late


def _connect(stream, fmt: str, servers: str | None, options: Mapping[str, str] | None):
    """``format(fmt)`` plus, for Kafka, ``kafka.bootstrap.servers`` (and the cluster's
    ``kafka.*`` security options, if any): the whole difference."""
    stream = stream.format(fmt).options(**(options or {}))
    return stream.option("kafka.bootstrap.servers", servers) if servers else stream


def order_totals(spark: SparkSession, fmt: str = "mq", servers: str | None = None,
                 topic: str = ORDERS, options: Mapping[str, str] | None = None) -> DataFrame:
    """The streaming DataFrame of totals: ``window_start``, ``window_end``, ``customer``,
    ``orders`` (count), ``amount`` (sum, decimal), ``last_order_at`` (newest produce time).
    ``options``: more of the source's options (``kafka.security.protocol``...)."""
    orders = _connect(spark.readStream, fmt, servers, options) \
        .option("subscribe", topic).option("startingOffsets", "earliest").load()
    parsed = orders.select(
        F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("order"),
        F.col("timestamp").alias("produced_at")).select("order.*", "produced_at")
    return (parsed.withWatermark("event_time", f"{WATERMARK_S} seconds")
            .groupBy(F.window("event_time", f"{WINDOW_S} seconds"), "customer")
            .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"),
                 F.max("produced_at").alias("last_order_at"))
            .select(F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"),
                    "customer", "orders", "amount", "last_order_at"))


def to_topic(totals: DataFrame, checkpoint: str, fmt: str = "mq", servers: str | None = None,
             topic: str = TOTALS, trigger: str = "1 second",
             options: Mapping[str, str] | None = None) -> StreamingQuery:
    """Start the query writing each total as a JSON record keyed by its customer.
    ``options``: more of the sink's options (``kafka.security.protocol``...)."""
    records = totals.select(F.col("customer").alias("key"),
                            F.to_json(F.struct(*totals.columns)).alias("value"))
    return (_connect(records.writeStream, fmt, servers, options)
            .option("topic", topic).option("checkpointLocation", checkpoint)
            .outputMode("append").queryName(f"totals-to-{fmt}")
            .trigger(processingTime=trigger).start())


def to_parquet(totals: DataFrame, path: str, checkpoint: str,
               trigger: str = "1 second") -> StreamingQuery:
    """Start the query appending the totals to Parquet files under ``path``."""
    return (totals.writeStream.format("parquet").option("path", path)
            .option("checkpointLocation", checkpoint).outputMode("append")
            .queryName("totals-to-parquet").trigger(processingTime=trigger).start())
