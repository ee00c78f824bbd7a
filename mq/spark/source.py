"""``MQDataSource``: the ``mq`` format. It only names the parts: the readers (``reader.py``)
and the writers (``writer.py``), built from the options parsed once (``options.py``)."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

__all__ = ["MQDataSource"]


class MQDataSource(DataSource):
    """``spark.read/readStream.format("mq")`` and ``df.write/writeStream.format("mq")``."""

    @classmethod
    def name(cls) -> str:
        return "mq"

    def schema(self):
        from mq.spark.reader import read_schema
        return read_schema(self.options)

    def reader(self, schema):
        from mq.spark.reader import MQBatchReader
        return MQBatchReader(self.options, schema)

    def streamReader(self, schema):
        from mq.spark.reader import MQStreamReader
        return MQStreamReader(self.options, schema)

    def writer(self, schema, overwrite: bool):
        from mq.spark.writer import MQBatchWriter
        return MQBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from mq.spark.writer import MQStreamWriter
        return MQStreamWriter(self.options, schema, overwrite)
