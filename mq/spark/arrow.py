"""Records of the log as Arrow: the ``mq`` source's schema and its column-wise builder.

Spark takes ``pyarrow.RecordBatch``es from a Python data source's ``read()`` only if their
schema *equals* ``to_arrow_schema(schema, timezone="UTC")``, nullability included, and Arrow
batches cost a fraction of per-row tuples (a third to a fifth). So records are
never turned into rows here: each log batch is decoded once, straight into column buffers
(``mq.log.columns.decode_columns``, the C codec the consumer's decoder lives in), which become
Arrow arrays without a copy; keys and values are copied once, from the segment map into the
column. Per-record Python objects cost ~0.5 us a record; this is ~0.02 us.

Columns (Kafka's source; every field nullable, as Kafka declares them)::

    key binary | value binary | topic string | partition int | offset long |
    timestamp timestamp (us, UTC) | timestampType int (0 CreateTime, 1 LogAppendTime)
    [ headers array<struct<key string, value binary>> ]   with includeHeaders; null when a
                                                           record has none, as in Kafka
"""

from __future__ import annotations

import itertools
import operator
from typing import Final

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from mq.log.batch import RecordBatch
from mq.log.columns import decode_columns

__all__ = ["spark_schema", "arrow_schema", "ColumnBuilder", "TARGET_ROWS"]

TARGET_ROWS: Final = 16_384       # rows per Arrow batch: big enough to amortise the per-batch
#                                   Python work, small enough to stay in L2/L3 per column

_HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()),
                                      StructField("value", BinaryType())]))
_BASE_FIELDS = [
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
]
_SCHEMAS = {False: StructType(_BASE_FIELDS),
            True: StructType(_BASE_FIELDS + [StructField("headers", _HEADERS_TYPE)])}
_ARROW = {h: to_arrow_schema(s, timezone="UTC") for h, s in _SCHEMAS.items()}

_key = operator.attrgetter("key")
_value = operator.attrgetter("value")
_offset = operator.attrgetter("offset")
_timestamp = operator.attrgetter("timestamp")
_headers = operator.attrgetter("headers")
_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


def spark_schema(include_headers: bool) -> StructType:
    """Kafka's source schema (with ``headers`` when asked)."""
    return _SCHEMAS[include_headers]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark demands for ``spark_schema`` (UTC timestamps)."""
    return _ARROW[include_headers]


class ColumnBuilder:
    """Gathers the records of one partition and builds Arrow batches of them.

    ``add`` takes a log batch and the offset bounds ``[start, end)`` to keep (a range may start
    or end inside a batch); ``take`` builds a batch of what was added and starts afresh.

    Without headers the records are decoded straight into column buffers
    (``mq.log.columns.decode_columns``, in C when the codec is built: no object per record), and
    ``take`` wraps those buffers as Arrow arrays without copying. With headers they go
    through ``RecordBatch.records()`` and are gathered column by column."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self.schema = arrow_schema(include_headers)
        self._topic_bytes = topic.encode()
        self._reset()

    def _reset(self) -> None:
        self._records: list = []
        # offsets, timestamps, key ends, key data, key validity, value ends, data, validity;
        # the ends columns start with Arrow's leading 0.
        self._columns = [bytearray(), bytearray(), bytearray(4), bytearray(), bytearray(),
                         bytearray(4), bytearray(), bytearray()]
        self._types: list[tuple[int, int]] = []     # (timestampType, count) runs
        self.rows = 0

    def add(self, batch: RecordBatch, start: int, end: int) -> None:
        """Decode ``batch`` and keep its records with offsets in ``[start, end)``. Raises
        ``CorruptRecordError``."""
        if self.include_headers:
            records = batch.records()
            if batch.base_offset < start or batch.last_offset >= end:
                records = [r for r in records if start <= r.offset < end]
            self._records += records
            n = len(records)
        else:
            n = decode_columns(batch, self._columns, start, end)
        if not n:
            return
        tt = batch.timestamp_type
        if self._types and self._types[-1][0] == tt:
            self._types[-1] = (tt, self._types[-1][1] + n)
        else:
            self._types.append((tt, n))
        self.rows += n

    def take(self) -> pa.RecordBatch:
        """An Arrow batch of every record added since the last ``take``."""
        n, types = self.rows, self._types
        if self.include_headers:
            recs = self._records
            offsets = np.fromiter(map(_offset, recs), np.int64, n)
            millis = np.fromiter(map(_timestamp, recs), np.int64, n)
            keys = _binary(list(map(_key, recs)))
            values = _binary(list(map(_value, recs)))
        else:
            cols = self._columns
            offsets = np.frombuffer(cols[0], np.int64)
            millis = np.frombuffer(cols[1], np.int64)
            keys = _binary_from(n, *cols[2:5])
            values = _binary_from(n, *cols[5:8])
        if len(types) == 1:
            ttypes = np.full(n, types[0][0], np.int32)
        else:
            ttypes = np.repeat(np.array([t for t, _ in types], np.int32),
                               [c for _, c in types])
        columns = [
            keys,
            values,
            _constant_string(self._topic_bytes, n),
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(
                np.full(n, self.partition, np.int32))]),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offsets)]),
            # Milliseconds to Spark's microseconds.
            pa.Array.from_buffers(self.schema.field("timestamp").type, n,
                                  [None, pa.py_buffer(millis * 1000)]),
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(ttypes)]),
        ]
        if self.include_headers:
            columns.append(self._headers(self._records))
        self._reset()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _headers(self, recs: list) -> pa.Array:
        per_record = list(map(_headers, recs))
        counts = np.fromiter(map(len, per_record), np.int32, len(per_record))
        offsets = np.zeros(len(per_record) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        flat = list(itertools.chain.from_iterable(per_record))
        entries = pa.StructArray.from_arrays(
            [pa.array(list(map(_first, flat)), pa.string()), _binary(list(map(_second, flat)))],
            fields=list(self.schema.field("headers").type.value_type))
        # A record without headers has a null list, as Kafka's source gives.
        validity = pa.py_buffer(np.packbits(counts > 0, bitorder="little"))
        return pa.ListArray.from_buffers(self.schema.field("headers").type, len(per_record),
                                         [validity, pa.py_buffer(offsets)],
                                         null_count=int((counts == 0).sum()),
                                         children=[entries])


def _binary_from(n: int, ends: bytearray, data: bytearray, valid: bytearray) -> pa.Array:
    """A ``binary`` array over ``decode_columns`` buffers (no copy of the data)."""
    nulls = n - valid.count(1)
    validity = None if nulls == 0 else \
        pa.py_buffer(np.packbits(np.frombuffer(valid, np.bool_), bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(ends),
                                                  pa.py_buffer(data)], null_count=nulls)


def _binary(views: list) -> pa.Array:
    """A ``binary`` array of memoryviews, bytes or ``None`` (null): one join, no per-item
    Arrow calls."""
    n = len(views)
    nulls = views.count(None)
    if nulls == 0:
        lengths = np.fromiter(map(len, views), np.int32, n)
        validity = None
    elif nulls == n:
        return pa.nulls(n, pa.binary())
    else:
        lengths = np.fromiter((-1 if v is None else len(v) for v in views), np.int32, n)
        valid = lengths >= 0
        lengths[~valid] = 0
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    # None and empty values add no bytes: filter(None, ...) drops both.
    data = b"".join(filter(None, views))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets),
                                                  pa.py_buffer(data)], null_count=nulls)


def _constant_string(value: bytes, n: int) -> pa.Array:
    offsets = np.arange(0, (n + 1) * len(value), len(value) or 1, np.int32)[:n + 1] \
        if value else np.zeros(n + 1, np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(value * n)])
