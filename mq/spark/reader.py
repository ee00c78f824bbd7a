"""The ``mq`` source's readers: batch (``spark.read``) and streaming (``spark.readStream``).

Where each part runs (PySpark's Python data source process model):

- ``schema()`` and the batch reader's ``partitions()`` run in a planner worker; the streaming
  reader's ``initialOffset``/``latestOffset``/``partitions``/``commit``/``stop`` run in one
  long-lived driver-side process per query, which keeps its state across micro-batches. Both
  talk to the broker through ``BrokerMetadata`` (one shared-memory look per trigger), opened
  lazily and never pickled.
- ``read()`` runs on executors, on a *separately built* reader pickled there, so everything it
  needs travels in the ``OffsetRange``. It needs no broker: it maps the segment files read-only
  through ``mq.log.reader.PartitionReader`` (the consumer's reader), cached per process, since
  Spark reuses its Python workers across tasks.

What a read returns: exactly the offsets ``[start, end)`` of the range that are records,
without control batches (transaction markers) and, under ``read_committed``, without the
records of aborted transactions (the consumer's ``AbortedTxnFilter`` over the ``.txnindex``
files). Offsets below the log's first segment (deleted by retention after planning) and a log
that ends early (a deleted topic) are data loss: ``DataLossError`` naming the partition and
offsets, or, with ``failOnDataLoss=false``, a warning and the next available offset. Gaps
inside the log (compaction, markers) are not loss, as in Kafka's source. A planned range never
ends past the high watermark (the last stable offset under ``read_committed``), so a torn tail
is never in reach.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from mq.errors import BrokerUnavailableError, ConfigError, OffsetOutOfRangeError
from mq.log.batch import RecordBatch
from mq.log.reader import PartitionReader
from mq.log.txnindex import AbortedTxnFilter, is_visible
from mq.protocol.paths import default_data_dir, default_socket_path
from mq.spark.arrow import TARGET_ROWS, ColumnBuilder, spark_schema
from mq.spark.metadata import BrokerMetadata
from mq.spark.offsets import TP, assigned_partitions, from_json, resolve, to_json
from mq.spark.options import ReadOptions, SpecificOffsets, parse_read_options
from mq.spark.ranges import (
    OffsetRange,
    clamp_to_log_start,
    delay_batch,
    plan_ranges,
    rate_limit,
    report_data_loss,
    split_ranges,
)

__all__ = ["read_schema", "MQBatchReader", "MQStreamReader", "read_range"]

log = logging.getLogger("mq.spark")

_READ_BYTES = 4 << 20              # bytes of batches taken from the map per read
_CHUNK_BYTES = 32 << 20            # an Arrow batch is cut after this many bytes of log too
# Partition readers kept open per executor process, each with at most 4 segments mapped (a
# task reads forward): about 130 descriptors at most, well inside the usual limit of 1024.
_MAX_READERS = 32
_MAPPED_SEGMENTS = 4


def read_schema(options) -> StructType:
    """``DataSource.schema()``: Kafka's source schema; checks every option on the way."""
    return spark_schema(parse_read_options(options).include_headers)


def _check_schema(schema: StructType | None, opts: ReadOptions) -> None:
    expected = spark_schema(opts.include_headers)
    if schema is not None and schema != expected:
        raise ConfigError("the mq source has a fixed schema (Kafka's source schema: "
                          f"{expected.simpleString()}); remove the .schema(...) given to it")


def _socket(opts: ReadOptions) -> str | None:
    """The ``socket`` option, else the usual rules (``$MQ_SOCKET``, else ``<dataDir>/mq.sock``
    with the ``dataDir`` option or the default data dir)."""
    return opts.socket or (default_socket_path(opts.data_dir) if opts.data_dir else None)


def _range(opts: ReadOptions, data_dir: str, tp: TP, start: int, end: int) -> OffsetRange:
    return OffsetRange(tp[0], tp[1], start, end, data_dir, opts.include_headers,
                       opts.read_committed, opts.fail_on_data_loss)


def _split(opts: ReadOptions, data_dir: str, planned) -> list[OffsetRange]:
    return [_range(opts, data_dir, tp, f, u) for tp, f, u in
            split_ranges(planned, opts.min_partitions, opts.max_records_per_partition)]


# --- batch --------------------------------------------------------------------------------------

class MQBatchReader(DataSourceReader):
    """``spark.read.format("mq")``: one planning look at the broker, then executor reads."""

    def __init__(self, options, schema: StructType | None) -> None:
        self.opts = parse_read_options(options, streaming=False)
        _check_schema(schema, self.opts)

    def partitions(self) -> list[OffsetRange]:
        return plan_batch(self.opts)

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):    # Spark's placeholder for "no ranges"
            return iter(())
        return read_range(partition)


def _offline(opts: ReadOptions) -> bool:
    """Explicit offsets of assigned partitions at both ends: planning needs no broker."""
    return (opts.subscription.kind == "assign"
            and isinstance(opts.starting, SpecificOffsets)
            and isinstance(opts.ending, SpecificOffsets)
            and all(o >= 0 for _, o in opts.starting.offsets + opts.ending.offsets))


def plan_batch(opts: ReadOptions) -> list[OffsetRange]:
    """The ranges of a batch read (Kafka's ``KafkaRelation``), resolved once."""
    try:
        view = BrokerMetadata(_socket(opts), opts.read_committed)
    except BrokerUnavailableError:
        if not _offline(opts):
            raise
        return _plan_offline(opts)
    with view:
        tps = assigned_partitions(opts.subscription, view.partition_counts(), strict=True)
        start = resolve(opts.starting, tps, view, starting=True,
                        no_match_latest=opts.no_match_latest)
        end = resolve(opts.ending, tps, view, starting=False)
        states = view.states(tps)
        data_dir = opts.data_dir or view.data_dir
    for tp in tps:
        name = f"{tp[0]}-{tp[1]}"
        latest = states[tp].last_stable_offset if opts.read_committed \
            else states[tp].high_watermark
        if end[tp] > latest:
            bound = "last stable offset" if opts.read_committed else "high watermark"
            raise ConfigError(f"endingOffsets of {name} is {end[tp]}, past the end of its log "
                              f"({latest}, its {bound})")
        if start[tp] > end[tp]:
            raise ConfigError(f"startingOffsets of {name} ({start[tp]}) is after its "
                              f"endingOffsets ({end[tp]})")
    planned = clamp_to_log_start([(tp, start[tp], end[tp]) for tp in tps],
                                 {tp: st.log_start_offset for tp, st in states.items()},
                                 opts.fail_on_data_loss)
    return _split(opts, data_dir, planned)


def _plan_offline(opts: ReadOptions) -> list[OffsetRange]:
    assert isinstance(opts.starting, SpecificOffsets) and isinstance(opts.ending, SpecificOffsets)
    start, end = opts.starting.as_dict(), opts.ending.as_dict()
    tps = sorted(opts.subscription.partitions)
    for name, given in (("startingOffsets", start), ("endingOffsets", end)):
        if set(given) != set(tps):
            raise ConfigError(f"option {name!r} must name exactly the assigned partitions")
    for tp in tps:
        if start[tp] > end[tp]:
            raise ConfigError(f"startingOffsets of {tp[0]}-{tp[1]} ({start[tp]}) is after its "
                              f"endingOffsets ({end[tp]})")
    log.info("mq source: no broker at %s; reading the log files of %s directly",
             _socket(opts) or "the default socket", opts.data_dir or default_data_dir())
    return _split(opts, opts.data_dir or default_data_dir(),
                  [(tp, start[tp], end[tp]) for tp in tps])


# --- streaming ----------------------------------------------------------------------------------

class MQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("mq")``: offsets are ``{"topic": {"partition": next}}``."""

    def __init__(self, options, schema: StructType | None) -> None:
        self.opts = parse_read_options(options, streaming=True)
        _check_schema(schema, self.opts)
        self._view: BrokerMetadata | None = None
        self._available_now = False
        self._target: dict[TP, int] | None = None      # AvailableNow: where the run ends
        self._latest: dict[TP, int] | None = None
        self._last_trigger_ms = 0

    def __getstate__(self) -> dict:
        # Pickled to executors for read(): the broker connection stays behind.
        return {**self.__dict__, "_view": None}

    def _metadata(self) -> BrokerMetadata:
        if self._view is None:
            self._view = BrokerMetadata(_socket(self.opts), self.opts.read_committed)
        return self._view

    def _data_dir(self) -> str:
        return self.opts.data_dir or self._metadata().data_dir

    def initialOffset(self) -> dict:
        """Where a new query starts (a restarted one resumes from its checkpoint instead)."""
        view = self._metadata()
        tps = assigned_partitions(self.opts.subscription, view.partition_counts(), strict=True)
        return to_json(resolve(self.opts.starting, tps, view, starting=True,
                               no_match_latest=self.opts.no_match_latest))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def _fetch_latest(self) -> dict[TP, int]:
        """Latest offsets of the partitions subscribed now (a pattern is matched again, so
        topics created since are in)."""
        view = self._metadata()
        tps = assigned_partitions(self.opts.subscription, view.partition_counts(), strict=False)
        return view.latest(tps)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        if self._available_now:
            if self._target is None:
                self._target = self._fetch_latest()     # fixed for the whole run
            latest = self._target
        else:
            latest = self._fetch_latest()
        self._latest = latest
        if isinstance(limit, ReadAllAvailable):
            return to_json(latest)
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) \
            else self.opts.min_offsets_per_trigger
        if min_rows is not None and not self._available_now:
            skip, self._last_trigger_ms = delay_batch(
                min_rows, latest, begin, int(time.time() * 1000), self._last_trigger_ms,
                self.opts.max_trigger_delay_ms)
            if skip:
                return to_json(begin)
        if isinstance(limit, ReadMaxRows):
            new = [tp for tp in latest if tp not in begin]
            earliest = self._metadata().earliest(new) if new else {}
            return to_json(rate_limit(limit.max_rows, begin, latest, earliest))
        return to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return to_json(self._latest) if self._latest else None

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        begin, until = from_json(start), from_json(end)
        if begin == until:
            return []
        # One look at the log starts serves both: new partitions' and the clamp's.
        earliest = self._metadata().earliest(begin.keys() | until.keys())
        planned = plan_ranges(begin, until,
                              lambda tps: {tp: earliest[tp] for tp in tps if tp in earliest},
                              self.opts.fail_on_data_loss)
        planned = clamp_to_log_start(planned, earliest, self.opts.fail_on_data_loss)
        return _split(self.opts, self._data_dir(), planned)

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())
        return read_range(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpoint is the source of truth, and Spark calls this one batch
        late (never for the last batch), so it can carry no guarantee."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None


# --- executors ----------------------------------------------------------------------------------

_readers: collections.OrderedDict[str, PartitionReader] = collections.OrderedDict()
_readers_pid = os.getpid()


def _reader(path: str) -> PartitionReader:
    """This process's reader of a partition directory (maps and descriptors stay open between
    the tasks a reused Python worker runs), re-listed for segments added or deleted since."""
    global _readers_pid
    if _readers_pid != os.getpid():        # a forked child: the parent's stay the parent's
        _readers.clear()
        _readers_pid = os.getpid()
    reader = _readers.pop(path, None)
    if reader is None or reader.closed:
        reader = PartitionReader(path, max_mapped_segments=_MAPPED_SEGMENTS)
    else:
        reader.refresh()
    _readers[path] = reader
    while len(_readers) > _MAX_READERS:
        _readers.popitem(last=False)[1].close()
    return reader


def read_range(r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records of ``r`` (module doc). Raises ``DataLossError`` (with
    ``failOnDataLoss``) and ``CorruptRecordError``."""
    name = f"{r.topic}-{r.partition}"
    reader = _reader(os.path.join(r.data_dir, name))
    builder = ColumnBuilder(r.topic, r.partition, r.include_headers)
    aborted = AbortedTxnFilter(reader.aborted_transactions(r.start, r.end)) \
        if r.read_committed else None
    pending: list[RecordBatch] = []       # read from the map, not added yet (last first)
    offset = r.start
    while offset < r.end:
        # The decoded records all survive until the batch is built, so a collection would
        # find nothing to free; pause the cyclic GC while filling one batch (as the consumer).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            offset = _fill(reader, builder, aborted, r, offset, name, pending)
            out = builder.take() if builder.rows else None
        finally:
            if gc_was_enabled:
                gc.enable()
        if out is not None:
            yield out


def _fill(reader: PartitionReader, builder: ColumnBuilder, aborted: AbortedTxnFilter | None,
          r: OffsetRange, offset: int, name: str, pending: list[RecordBatch]) -> int:
    """Add batches from ``offset`` until a chunk is full or the range ends; the next offset."""
    taken = 0
    while offset < r.end and builder.rows < TARGET_ROWS and taken < _CHUNK_BYTES:
        if not pending:
            try:
                pending += reversed(_read(reader, offset))
            except OffsetOutOfRangeError as err:
                first = err.log_start_offset
                resume = first if 0 <= first < r.end else r.end
                report_data_loss(f"Cannot read offsets [{offset}, {resume}) of {name}: the "
                                 f"log now starts at {first}", r.fail_on_data_loss)
                return resume
            if not pending:
                report_data_loss(f"Cannot read offsets [{offset}, {r.end}) of {name}: the log "
                                 "ends before them (was the topic deleted?)",
                                 r.fail_on_data_loss)
                return r.end
        batch = pending.pop()
        if batch.base_offset >= r.end:
            return r.end
        if is_visible(batch, aborted):
            batch.validate()                     # CRC-32C, as the consumer's check_crcs
            builder.add(batch, offset, r.end)
        taken += batch.size
        offset = max(offset, batch.next_offset)
    return min(offset, r.end)


def _read(reader: PartitionReader, offset: int) -> list[RecordBatch]:
    """Batches from ``offset`` on; [] when the log has none. Raises
    ``OffsetOutOfRangeError`` below the first segment."""
    batches = reader.read(offset, max_bytes=_READ_BYTES)
    if not batches:
        reader.refresh()                         # a segment rolled in since the listing?
        batches = reader.read(offset, max_bytes=_READ_BYTES)
    return batches
