"""The ``mq`` sink's plan, pure: the write options parsed once, the input columns checked
against the contract of Spark's Kafka sink, Arrow batches turned into ``Producer.send``
arguments, and the names and the rule of the exactly-once streaming writes. Nothing here opens
a socket; ``writer.py`` does the I/O.

Columns (Spark's ``KafkaWriter.validateQuery``; names match exactly, other columns are
ignored)::

    value      string | binary    required; null -> a record without a value (a tombstone)
    key        string | binary    optional; null -> no key
    topic      string             required unless the ``topic`` option is set, which overrides it
    partition  int                optional; null -> the producer's partitioner (murmur2 of the
                                  key as Kafka's Java client; sticky for records without a key)
    headers    array<struct<key: string, value: binary>>   optional; null -> no headers

Options are Spark's ``CaseInsensitiveDict`` (lowercased keys, string values): ``topic``;
``socket`` (the broker's Unix socket; without it the clients' rules: ``$MQ_SOCKET``, then
``<dataDir>/mq.sock`` with the ``dataDir`` option or the default data dir, as the source finds
it); ``mq.transactional`` (streaming only, default ``true``); a few Kafka
producer settings under Kafka's ``kafka.`` prefix (``_PRODUCER_OPTIONS``). Spark adds
``checkpointLocation`` and ``queryName`` to a streaming query's options. Anything else is a
``ConfigError`` naming the option, raised when Spark plans the write.

Exactly once, per micro-batch and Spark partition (``writer.py`` runs it): the write task of
partition ``p`` in batch ``b`` of query ``q`` uses the transactional id
``mq-spark-sink-{q}-{p}`` and commits, in the same transaction as its rows, the offset ``b + 1``
for the consumer group of the same name. A task whose group already holds an offset above
``b`` finds its rows committed by an earlier attempt and writes nothing
(``already_committed``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from mq.errors import ConfigError
from mq.protocol.paths import default_socket_path

__all__ = ["SinkColumns", "StreamTask", "WriteOptions", "already_committed", "batch_marker",
           "committed_batch", "parse_write_options", "plan_columns", "transactional_id"]

_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
# What Spark itself puts in a streaming sink's options.
_SPARK_OPTIONS = frozenset({"checkpointlocation", "queryname"})
_KNOWN = frozenset({"topic", "socket", "datadir", "mq.transactional"})


def _number(kind, minimum):
    def parse(name: str, text: str):
        try:
            value = kind(text)
        except ValueError as err:
            raise ConfigError(f"mq sink: option {name}={text!r} is not a number") from err
        if value < minimum:
            raise ConfigError(f"mq sink: option {name}={text!r} must be >= {minimum}")
        return value
    return parse


def _codec(name: str, text: str) -> str | None:
    codec = text.strip().lower()
    if codec not in _CODECS:
        raise ConfigError(f"mq sink: option {name}={text!r}: one of {', '.join(_CODECS)}")
    return None if codec == "none" else codec


def _bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"mq sink: option {name}={text!r} must be true or false")
    return value == "true"


# Kafka producer settings a sink may pass on (Spark's Kafka sink takes every ``kafka.*``
# producer config; mq takes the ones its Producer has): option -> (keyword, parser).
_PRODUCER_OPTIONS: dict[str, tuple[str, Any]] = {
    "kafka.linger.ms": ("linger_ms", _number(float, 0)),
    "kafka.batch.size": ("batch_size", _number(int, 1)),
    "kafka.max.request.size": ("max_request_size", _number(int, 1024)),
    "kafka.compression.type": ("compression_type", _codec),
    "kafka.delivery.timeout.ms": ("delivery_timeout_ms", _number(int, 1)),
    "kafka.transaction.timeout.ms": ("transaction_timeout_ms", _number(int, 1)),
}


@dataclass(frozen=True)
class WriteOptions:
    """A sink's options, checked. ``producer_config``: keyword arguments for ``mq.Producer``
    (only what the user set; the Producer's defaults otherwise)."""

    topic: str | None = None
    socket: str | None = None
    transactional: bool = False
    producer_config: Mapping[str, Any] = field(default_factory=dict)


def parse_write_options(options: Mapping[str, str], streaming: bool) -> WriteOptions:
    """Check a sink's options (Spark's ``CaseInsensitiveDict``: lowercase keys, str values).
    ``mq.transactional`` defaults to true for a streaming write and must stay false for a
    batch write (which is at least once, as Kafka's). Raises ``ConfigError`` naming the
    option."""
    known = sorted(["topic", "socket", "dataDir", "mq.transactional", *_PRODUCER_OPTIONS],
                   key=str.lower)
    for name in options:
        key = name.lower()
        if key in _KNOWN or key in _PRODUCER_OPTIONS or key in _SPARK_OPTIONS:
            continue
        if key == "path":
            raise ConfigError(f"mq sink: save({options[name]!r}) takes no path: name the "
                              "topic with .option('topic', ...) or a topic column")
        hint = " (mq finds its broker by the socket option, not bootstrap servers)" \
            if key == "kafka.bootstrap.servers" else ""
        raise ConfigError(f"mq sink: unknown option {name!r}{hint}; known: {', '.join(known)}")
    lower = {k.lower(): str(v) for k, v in options.items()}
    topic = lower.get("topic")
    if topic is not None and not topic:
        raise ConfigError("mq sink: option topic is empty")
    socket = lower.get("socket") or None
    if socket is None and lower.get("datadir"):
        socket = default_socket_path(lower["datadir"])
    if "mq.transactional" in lower:
        transactional = _bool("mq.transactional", lower["mq.transactional"])
    else:
        transactional = streaming
    if transactional and not streaming:
        raise ConfigError("mq sink: mq.transactional=true applies to streaming writes "
                          "(writeStream); a batch write (df.write) is at least once, as "
                          "Kafka's sink is")
    config = {}
    for key, (keyword, parse) in _PRODUCER_OPTIONS.items():
        if key in lower:
            config[keyword] = parse(key, lower[key])
    if "transaction_timeout_ms" in config and not transactional:
        raise ConfigError("mq sink: kafka.transaction.timeout.ms needs mq.transactional=true "
                          "(a streaming write)")
    return WriteOptions(topic, socket, transactional, config)


# --- columns ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SinkColumns:
    """Where the sink columns are in the input (field positions; None: absent or, for
    ``topic``, overridden by the option), and whether value and key arrive as strings."""

    value: int
    key: int | None = None
    topic: int | None = None
    partition: int | None = None
    headers: int | None = None
    topic_option: str | None = None

    def records(self, batch: pa.RecordBatch) -> Iterator[tuple]:
        """``(topic, value, key, partition, headers)`` per row of ``batch``: the positional
        arguments of ``Producer.send``, values and keys as ``bytes`` (strings as UTF-8).
        Raises ``ValueError`` for a null topic."""
        n = batch.num_rows
        values = _binary(batch.column(self.value))
        keys = _binary(batch.column(self.key)) if self.key is not None \
            else itertools.repeat(None, n)
        if self.topic_option is not None:
            topics: Iterable = itertools.repeat(self.topic_option, n)
        else:
            column = batch.column(self.topic)
            if column.null_count:
                raise ValueError("mq sink: null topic present in the data; set the topic "
                                 "option for a default topic")
            topics = column.to_pylist()
        partitions = batch.column(self.partition).to_pylist() if self.partition is not None \
            else itertools.repeat(None, n)
        headers = _headers(batch.column(self.headers)) if self.headers is not None \
            else itertools.repeat(None, n)
        return zip(topics, values, keys, partitions, headers, strict=True)

    def first_topic(self, batch: pa.RecordBatch) -> str:
        """The topic of the first row of a non-empty ``batch``."""
        if self.topic_option is not None:
            return self.topic_option
        topic = batch.column(self.topic)[0].as_py()
        if topic is None:
            raise ValueError("mq sink: null topic present in the data; set the topic option "
                             "for a default topic")
        return topic


def _binary(column: pa.Array) -> list:
    """A string or binary Arrow column as a list of ``bytes`` / None (strings: their UTF-8
    bytes, which is how Arrow stores them; the cast copies nothing)."""
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    return column.to_pylist()


def _headers(column: pa.Array) -> list:
    return [None if row is None else [(h["key"], h["value"]) for h in row]
            for row in column.to_pylist()]


_HEADERS_HINT = "array<struct<key: string, value: binary>>"


def plan_columns(schema: StructType, topic_option: str | None) -> SinkColumns:
    """Check the input columns against Kafka's sink contract (module doc). Raises
    ``ConfigError`` naming the column and the type it has and should have."""
    where: dict[str, list[int]] = {}
    for i, f in enumerate(schema.fields):
        where.setdefault(f.name, []).append(i)

    def find(name: str) -> int | None:
        found = where.get(name, [])
        if len(found) > 1:
            raise ConfigError(f"mq sink: the input has {len(found)} columns named {name!r}")
        return found[0] if found else None

    def check(name: str, ok: bool, wanted: str) -> None:
        if not ok:
            got = schema.fields[where[name][0]].dataType.simpleString()
            raise ConfigError(f"mq sink: column {name!r} must be {wanted}, got {got}")

    value = find("value")
    if value is None:
        names = ", ".join(schema.fieldNames()) or "none"
        raise ConfigError(f"mq sink: the input needs a 'value' column (string or binary); "
                          f"its columns: {names}")
    check("value", isinstance(schema.fields[value].dataType, (StringType, BinaryType)),
          "string or binary")
    key = find("key")
    if key is not None:
        check("key", isinstance(schema.fields[key].dataType, (StringType, BinaryType)),
              "string or binary")
    topic = find("topic")
    if topic is not None:
        check("topic", isinstance(schema.fields[topic].dataType, StringType), "string")
    elif topic_option is None:
        raise ConfigError("mq sink: no topic: set the topic option or give the input a "
                          "'topic' column (string)")
    partition = find("partition")
    if partition is not None:
        check("partition", isinstance(schema.fields[partition].dataType, IntegerType),
              "int (cast it: CAST(partition AS INT))")
    headers = find("headers")
    if headers is not None:
        check("headers", _is_headers(schema.fields[headers].dataType), _HEADERS_HINT)
    return SinkColumns(value, key, None if topic_option is not None else topic, partition,
                       headers, topic_option)


def _is_headers(t) -> bool:
    if not isinstance(t, ArrayType) or not isinstance(t.elementType, StructType):
        return False
    fields = t.elementType.fields
    return len(fields) == 2 and fields[0].name == "key" and fields[1].name == "value" and \
        isinstance(fields[0].dataType, StringType) and isinstance(fields[1].dataType,
                                                                  BinaryType)


# --- exactly-once streaming writes --------------------------------------------------------------

@dataclass(frozen=True)
class StreamTask:
    """A streaming write task: its query (the id kept in the checkpoint, the same across
    restarts), micro-batch and Spark partition."""

    query_id: str
    batch_id: int
    partition_id: int

    @classmethod
    def from_properties(cls, query_id: str | None, batch_id: str | None,
                        partition_id: int) -> StreamTask:
        """From the local properties Spark's micro-batch engine gives each task
        (``sql.streaming.queryId``, ``streaming.sql.batchId``). Raises ``RuntimeError``
        when they are missing (not a micro-batch query)."""
        if not query_id or batch_id is None:
            raise RuntimeError(
                "mq sink: a transactional streaming write needs the micro-batch engine's task "
                f"properties (query id {query_id!r}, batch id {batch_id!r}); continuous "
                "processing is not supported (or set mq.transactional=false)")
        return cls(query_id, int(batch_id), partition_id)

    @property
    def transactional_id(self) -> str:
        return transactional_id(self.query_id, self.partition_id)


def transactional_id(query_id: str, partition_id: int) -> str:
    """The transactional id, and the name of the consumer group holding the marker, of one
    Spark partition of a streaming query: stable across task retries and query restarts from
    the same checkpoint, so a new attempt fences the one before it."""
    return f"mq-spark-sink-{query_id}-{partition_id}"


def batch_marker(batch_id: int, rows: int) -> tuple[int, str]:
    """The ``(offset, metadata)`` a task commits with its rows: the next batch id, and words
    for ``mq groups describe``."""
    return batch_id + 1, f"spark batch {batch_id}: {rows} rows"


def committed_batch(offsets: Mapping[Any, int]) -> int | None:
    """The next batch id a partition's group holds (the largest of its offsets: the marker's
    topic-partition is the first row's topic, partition 0, which may change between
    batches), or None when nothing was committed yet."""
    return max(offsets.values(), default=None)


def already_committed(next_batch: int | None, batch_id: int) -> bool:
    """True if batch ``batch_id`` of this partition was committed by an earlier attempt (a
    retried task, or a batch Spark replays after a restart): its group holds a marker past
    it."""
    return next_batch is not None and next_batch > batch_id
