"""The ``mq`` sink: ``df.write.format("mq")`` and ``df.writeStream.format("mq")``, with the
columns and options of Spark's Kafka sink (checked at planning: ``sink_plan.py``).

Where things run. Spark builds a writer in a planner Python worker, pickles it to the
executors' Python workers, and calls ``commit``/``abort`` on the driver side (for a stream, on
a writer built anew for each batch). So a writer holds only its checked options and column
positions; each ``write()`` opens its own ``mq.Producer`` (``acks="all"``: a record is
acknowledged once an fsync covers it), sends every row of its Spark partition from the Arrow
batches Spark hands it, waits for every acknowledgement and closes it. Any failure raises, and
Spark retries the task.

Guarantees.

- Batch writes (``df.write``) are **at least once**, as Kafka's sink: a task that fails after
  some of its records were acknowledged leaves them in the topic, and its retry (or a rerun of
  the job) writes them again. ``commit``/``abort`` only log: a failed job leaves the records of
  the tasks that succeeded.
- Streaming writes (``writeStream``, ``mq.transactional=true``, the default) are **exactly once
  per micro-batch** for ``read_committed`` readers. The task for Spark partition ``p`` of batch
  ``b`` uses the transactional id ``mq-spark-sink-{queryId}-{p}`` (the query id is kept in the
  checkpoint, so the id is the same for a retried task and for a batch replayed after a
  restart) and, in one transaction, writes its rows *and* commits offset ``b + 1`` for the
  consumer group of that same name (the marker: ``sink_plan.py``). Before writing it calls
  ``init_transactions()``, which fences every earlier attempt with this id and finishes their
  transactions, then reads the marker: past ``b`` means an earlier attempt committed this
  partition of this batch, and the task writes nothing. Spark replays a batch only with the
  same input (its offsets log), so "the same partition of the same batch" is the same rows
  provided the query is deterministic and keeps its number of partitions across restarts —
  Spark's own condition for exactly-once replays. Rows are visible to ``read_committed``
  consumers once their task commits, partition by partition, not all of a batch at once.
  A task whose JVM died may see its rows end early (``spark_input_cut``): it aborts instead
  of committing, so the replay writes the whole partition.
- ``mq.transactional=false`` on a stream: plain idempotent producers, at least once, as Kafka.

The batch id and query id come from the task's local properties, which Spark's micro-batch
engine sets for every task of a batch (``streaming.sql.batchId``, ``sql.streaming.queryId``;
checked in a Python data-source writer task with pyspark 4.3).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from mq.client.admin import Admin
from mq.client.producer import Producer
from mq.errors import ConfigError, MQError
from mq.protocol.types import TopicPartition
from mq.spark.sink_plan import (
    SinkColumns,
    StreamTask,
    WriteOptions,
    already_committed,
    batch_marker,
    committed_batch,
    parse_write_options,
    plan_columns,
)

__all__ = ["MQBatchWriter", "MQStreamWriter", "ProduceResult", "Sink"]

log = logging.getLogger("mq.spark.sink")


@dataclass
class ProduceResult(WriterCommitMessage):
    """What one write task did: ``rows`` sent and acknowledged (committed, when
    transactional); ``skipped``: its batch was committed by an earlier attempt, nothing was
    written."""

    partition_id: int
    rows: int
    batch_id: int | None = None
    transactional_id: str | None = None
    skipped: bool = False


class Sink:
    """One write task's work, shared by both writers: options and column positions only, so it
    pickles; the producer is made in ``write`` and closed before it returns."""

    def __init__(self, options: WriteOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def _producer(self, **extra) -> Producer:
        return Producer(socket=self.options.socket, acks="all", client_id="mq-spark-sink",
                        **self.options.producer_config, **extra)

    def write(self, batches: Iterable[pa.RecordBatch], partition_id: int) -> ProduceResult:
        """Send every row, wait for every acknowledgement (at least once). Raises the first
        send's failure."""
        producer = self._producer()
        try:
            send, records = producer.send, self.columns.records
            pending: list = []
            rows = 0
            for batch in batches:
                for topic, value, key, partition, headers in records(batch):
                    pending.append(send(topic, value, key, partition, headers))
                rows += batch.num_rows
                _check_sent(pending)
            producer.flush()
            _check_sent(pending, final=True)
        except BaseException:
            producer.close(timeout=0)       # the task fails: what is unsent stays unsent
            raise
        producer.close()
        return ProduceResult(partition_id, rows)

    def write_exactly_once(self, batches: Iterable[pa.RecordBatch],
                           task: StreamTask) -> ProduceResult:
        """Write the rows and the batch marker in one transaction, unless an earlier attempt
        committed them (module doc). A task without rows opens no transaction: a replay gives
        it no rows either. Raises what the producer raises (``ProducerFencedError`` when a
        newer attempt took over); the open transaction is aborted first."""
        batches = (b for b in batches if b.num_rows)
        first = next(batches, None)
        tid = task.transactional_id
        if first is None:
            return ProduceResult(task.partition_id, 0, task.batch_id, tid)
        producer = self._producer(transactional_id=tid)
        try:
            producer.init_transactions()      # fences older attempts, ends their transaction
            skipped = already_committed(self._committed_batch(tid), task.batch_id)
            rows = 0
            if skipped:
                for _ in batches:             # Spark hands every row to the task: take them
                    pass
                log.info("%s: batch %d already committed by an earlier attempt", tid,
                         task.batch_id)
            else:
                producer.begin_transaction()
                send, records = producer.send, self.columns.records
                for batch in itertools.chain([first], batches):
                    for topic, value, key, partition, headers in records(batch):
                        send(topic, value, key, partition, headers)
                    rows += batch.num_rows
                marker = TopicPartition(self.columns.first_topic(first), 0)
                producer.send_offsets_to_transaction(
                    {marker: batch_marker(task.batch_id, rows)}, tid)
                if spark_input_cut():
                    raise ConnectionAbortedError(
                        f"{tid}: the JVM feeding batch {task.batch_id} went away; the rows "
                        "may be cut short, so the transaction is aborted, not committed")
                producer.commit_transaction()
        except BaseException:
            _abort_quietly(producer, tid)
            producer.close(timeout=0)
            raise
        producer.close()
        return ProduceResult(task.partition_id, rows, task.batch_id, tid, skipped)

    def _committed_batch(self, group: str) -> int | None:
        """The marker of ``group`` (the task's own transactional id). Read after
        ``init_transactions()``: only this id commits offsets for this group, and its earlier
        transactions are finished by then, so the value is stable (no read_committed wait
        needed)."""
        with Admin(self.options.socket) as admin:
            return committed_batch(admin.list_group_offsets(group))


def _check_sent(pending: list, final: bool = False) -> None:
    """Raise the failure of a finished send, and forget the finished ones at the front of
    ``pending`` (all of them when ``final``, after a flush). Records finish about in the order
    they were sent, so the front is what is done; what is left is looked at next time."""
    done = 0
    for fut in pending:
        if not final and not fut.is_done:
            break
        error = fut.exception()
        if error is not None:
            raise error
        done += 1
    del pending[:done]


def spark_input_cut() -> bool:
    """Whether a peer of this Python worker closed its connection: the JVM that feeds the
    task's rows died. pyarrow ends a stream that stops at a batch boundary as if it were
    complete, so a task whose JVM is killed between two Arrow batches sees a normal end of its
    rows; committing then would record a partial batch as done, and the replay after a restart
    would skip the rest (a loss). The JVM keeps its socket open until it has read the task's
    result (it sends END_OF_STREAM after the rows), so a connected stream socket that reads as
    closed (b"" or a reset) means the input may be cut. Looked at once, just before the
    commit: a JVM that dies after it is done sending cannot cut rows. Linux only (it lists
    ``/proc/self/fd``); elsewhere it says False."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return False
    for fd in fds:
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue                             # closed meanwhile (the listing's own fd)
        try:
            if sock.type != socket.SOCK_STREAM:
                continue
            try:
                sock.getpeername()
            except OSError:
                continue                         # listening, or never connected
            try:
                if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    return True
            except (BlockingIOError, InterruptedError):
                continue                         # open, nothing to read
            except OSError:
                return True                      # reset by a peer that died
        finally:
            sock.close()
    return False


def _abort_quietly(producer, tid: str) -> None:
    """Abort the task's open transaction so ``read_committed`` readers need not wait for the
    broker's timeout; a fenced or broken producer cannot, and the next attempt's
    ``init_transactions()`` (or the timeout) aborts it instead."""
    try:
        producer.abort_transaction()
    except (MQError, TimeoutError) as err:
        log.info("%s: could not abort the transaction (%s: %s)", tid, type(err).__name__, err)


def _task_partition() -> int:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def _summary(messages: list) -> tuple[int, int, int, int]:
    """(tasks that reported, rows, tasks that found their batch committed, failed tasks)."""
    done = [m for m in messages if isinstance(m, ProduceResult)]
    return (len(done), sum(m.rows for m in done), sum(m.skipped for m in done),
            len(messages) - len(done))


class MQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("mq").mode("append")``: at least once (module doc)."""

    def __init__(self, options, schema, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("mq sink: save mode overwrite is not supported (a topic is "
                              "append-only, as in Kafka); use .mode('append')")
        opts = parse_write_options(options, streaming=False)
        self._sink = Sink(opts, plan_columns(schema, opts.topic))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ProduceResult:
        return self._sink.write(iterator, _task_partition())

    def commit(self, messages: list) -> None:
        tasks, rows, _, _ = _summary(messages)
        log.info("mq sink: %d rows written by %d tasks", rows, tasks)

    def abort(self, messages: list) -> None:
        tasks, rows, _, failed = _summary(messages)
        log.warning("mq sink: the write failed (%d of %d tasks); %d rows that %d tasks wrote "
                    "stay in the topic (at least once)", failed, len(messages), rows, tasks)


class MQStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("mq")``: exactly once per micro-batch with
    ``mq.transactional=true`` (the default), else at least once (module doc). Every output
    mode is taken: in Complete mode (``overwrite``) each batch appends the whole result, as
    Kafka's sink does, since a topic cannot be truncated."""

    def __init__(self, options, schema, overwrite: bool) -> None:
        opts = parse_write_options(options, streaming=True)
        self._sink = Sink(opts, plan_columns(schema, opts.topic))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ProduceResult:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if not self._sink.options.transactional:
            return self._sink.write(iterator, ctx.partitionId())
        task = StreamTask.from_properties(ctx.getLocalProperty("sql.streaming.queryId"),
                                          ctx.getLocalProperty("streaming.sql.batchId"),
                                          ctx.partitionId())
        return self._sink.write_exactly_once(iterator, task)

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 -- Spark's name
        tasks, rows, skipped, _ = _summary(messages)
        log.info("mq sink: batch %d: %d rows from %d tasks (%d found it committed before)",
                 batchId, rows, tasks, skipped)

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803 -- Spark's name
        tasks, rows, _, failed = _summary(messages)
        log.warning("mq sink: batch %d failed (%d of %d tasks); %d rows of %d tasks are "
                    "committed%s", batchId, failed, len(messages), rows, tasks,
                    "; a restart from the checkpoint replays the batch and writes only the "
                    "rest" if self._sink.options.transactional else " (at least once)")
