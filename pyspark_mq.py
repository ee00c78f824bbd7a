"""Auto-registration of the ``mq`` Spark data source: Spark imports every top-level module
named ``pyspark_*`` on the Python path at its first data source lookup and registers its
``DefaultSource`` (SPARK-45917), so ``format("mq")`` works without ``mq.spark.register``.
Importing this module must stay cheap and free of side effects."""

from mq.spark.source import MQDataSource as DefaultSource

__all__ = ["DefaultSource"]
