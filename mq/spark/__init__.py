"""``mq`` as an Apache Spark data source (PySpark's Python Data Source API, Spark 4.2+).

Reads topics in batch and in Structured Streaming straight from the segment files (executors
map the logs read-only, as ``mq.Consumer`` does) and writes DataFrames to topics through the
broker, with the option names, schema and offsets JSON of Spark's Kafka source and sink::

    import mq.spark
    mq.spark.register(spark)                     # or have ``pyspark_mq`` on the path
    df = spark.read.format("mq").option("subscribe", "orders").load()

Needs the ``mq[spark]`` extra (pyspark, pyarrow) and Java 17.
"""

from __future__ import annotations

from mq.spark.source import MQDataSource

__all__ = ["MQDataSource", "register"]


def register(spark) -> None:
    """Register the ``mq`` format with a SparkSession (``spark.dataSource.register``)."""
    spark.dataSource.register(MQDataSource)
