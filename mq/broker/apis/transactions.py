"""Idempotence and transactions: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
DescribeTransactions and ListTransactions, over the pure ``TransactionCoordinator`` and the
``__transaction_state`` log (Kafka's TransactionCoordinator and TransactionMarkerChannel).

A transition of a transactional id is made durable before anything acts on it::

    record appended to __transaction_state --fsync--> coordinator.record_written
        Prepare{Commit,Abort}: a COMMIT/ABORT marker on every partition of the transaction
        (``__consumer_offsets`` partitions apply or drop the offsets it committed)
        --fsync of those partitions--> the Complete record --fsync--> EndTxn answered

so an ``EndTxn`` answer means the markers are on disk and ``read_committed`` readers see the
outcome. A broker killed in between finds the Prepare record at its next start and writes the
markers again (``recover``); a second marker for a closed transaction closes nothing. Markers
that cannot be written now (a full disk) are written again every ``RETRY_S``; a partition that
went offline (a failed fsync) leaves its transaction prepared until a restart recovers it.

Transactions open longer than their timeout are aborted with a bumped epoch, which fences the
producer that opened them (``expired``), checked every ``RETRY_S``. A transactional batch is
accepted only on a partition its producer added to its open transaction (``verify``, called by
the produce path), so a zombie cannot leave a transaction open on a partition nobody will end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from mq import errors
from mq.broker.apis import Handler
from mq.broker.apis.groups import GroupApis, wall_ms
from mq.broker.apis.topics import TopicApis
from mq.broker.conns import Conn, Connections
from mq.broker.flushing import GroupCommit
from mq.broker.internal_topics import OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, is_internal
from mq.broker.metadata import MetadataStore
from mq.broker.partitions import Partition, PartitionTable
from mq.broker.transaction_log import decode_key, decode_value, encode_key, encode_value
from mq.broker.txn_coordinator import MarkerJob, TransactionCoordinator, Transition
from mq.errors import InvalidRequestError
from mq.log.builder import build_batch
from mq.protocol.messages import Api, Request, response

__all__ = ["RETRY_S", "TransactionApis"]

log = logging.getLogger("mq.broker")

RETRY_S = 1.0              # timeouts checked, markers that failed written again
Done = Callable[[BaseException | None], None]


class TransactionApis:
    """The transaction coordinator wired to the loop: its log, markers, timers, and apis."""

    def __init__(self, topics: TopicApis, table: PartitionTable, conns: Connections,
                 commit: GroupCommit, groups: GroupApis, metadata: MetadataStore, *,
                 coordinator_epoch: int, max_timeout_ms: int) -> None:
        self._table = table
        self._conns = conns
        self._commit = commit
        self._groups = groups
        self._metadata = metadata
        self._epoch = coordinator_epoch
        self._log_part: Partition = topics.open_internal(TRANSACTION_STATE_TOPIC)[0]
        self.coordinator = TransactionCoordinator(metadata.allocate_producer_id,
                                                  max_timeout_ms=max_timeout_ms)
        self.coordinator.load(self._replay())
        groups.transaction_partitions = self.coordinator.open_partitions
        self._retry: list[tuple[MarkerJob, Done]] = []
        self._next_check = 0.0

    def _replay(self):
        for batch in self._log_part.log.batches():
            for rec in batch.records():
                if rec.key is None:
                    continue
                try:
                    tid = decode_key(bytes(rec.key))
                    yield tid, None if rec.value is None else decode_value(tid,
                                                                           bytes(rec.value))
                except ValueError as err:
                    raise errors.CorruptRecordError(self._log_part.log.dir, rec.offset,
                                                    f"bad __transaction_state record: {err}"
                                                    ) from err

    def handlers(self) -> Mapping[Api, Handler]:
        return {Api.INIT_PRODUCER_ID: self.init_producer_id,
                Api.ADD_PARTITIONS_TO_TXN: self.add_partitions,
                Api.ADD_OFFSETS_TO_TXN: self.add_offsets, Api.END_TXN: self.end_txn,
                Api.DESCRIBE_TRANSACTIONS: self.describe, Api.LIST_TRANSACTIONS: self.list}

    # --- start and timers ---------------------------------------------------------------------
    def recover(self) -> None:
        """After a restart: finish every transaction found prepared."""
        for t in self.coordinator.recover():
            log.info("transactional id %s: finishing a transaction left %s", t.transactional_id,
                     t.after.state.kafka_name)
            self._written(t, {}, _ignore)

    def timers(self, now: float) -> None:
        """Every ``RETRY_S``: abort transactions past their timeout, write again the markers
        that could not be written."""
        if now < self._next_check:
            return
        self._next_check = now + RETRY_S
        retry, self._retry = self._retry, []
        for job, done in retry:
            self._write_markers(job, done)
        for t in self.coordinator.expired(wall_ms()):
            log.info("transactional id %s: transaction open past its %d ms timeout: aborting",
                     t.transactional_id, t.after.timeout_ms)
            self._drive(t, _ignore)

    def deadline_s(self, now: float) -> float:
        return max(0.0, self._next_check - now)

    # --- the produce path's check --------------------------------------------------------------
    def verify(self, topic: str, partition: int, producer_id: int, epoch: int) -> None:
        """A transactional batch: its partition must be in the producer's open transaction."""
        held = self.coordinator.open_partitions(producer_id, epoch)
        if held is None and self.coordinator.epoch_of(producer_id) > epoch:
            raise errors.InvalidProducerEpochError(
                f"producer {producer_id} epoch {epoch} is fenced: a newer producer holds its "
                "transactional id")
        if held is None or (topic, partition) not in held:
            raise errors.InvalidTxnStateError(
                f"producer {producer_id} (epoch {epoch}) has no open transaction holding "
                f"{topic}-{partition}: add the partition to the transaction first")

    # --- apis ---------------------------------------------------------------------------------
    def init_producer_id(self, conn: Conn, req: Request) -> list | None:
        tid = req["transactional_id"]
        if tid is None:                       # idempotence only: a fresh id, epoch 0
            return response(req.api, req.request_id, 0, None,
                            self._metadata.allocate_producer_id(), 0)
        if not tid:
            raise InvalidRequestError("the transactional id must be a non-empty string")
        t = self.coordinator.init_producer_id(tid, req["transaction_timeout_ms"], wall_ms())
        if t.retry:
            self._drive(t, _ignore)
            raise errors.ConcurrentTransactionsError(
                f"transactional id {tid!r} had a transaction open: it is being aborted; retry")
        self._drive(t, self._answer(conn, req, t.after.producer_id, t.after.producer_epoch))
        return None

    def add_partitions(self, conn: Conn, req: Request) -> list | None:
        wanted = req["partitions"]
        if not wanted:
            raise InvalidRequestError("AddPartitionsToTxn needs at least one partition")
        for topic, partition in wanted:
            self._table.partition(topic, partition)        # UnknownTopicOrPartition
            if is_internal(topic):
                raise InvalidRequestError(f"cannot write internal topic {topic!r} in a "
                                          "transaction")
        return self._add(conn, req, [tuple(tp) for tp in wanted])

    def add_offsets(self, conn: Conn, req: Request) -> list | None:
        group = req["group"]
        if not group:
            raise errors.InvalidGroupIdError("the group id must be a non-empty string")
        partition = self._groups.offsets.log_for(group).partition
        return self._add(conn, req, [(OFFSETS_TOPIC, partition)])

    def _add(self, conn: Conn, req: Request, partitions) -> list | None:
        t = self.coordinator.add_partitions(req["transactional_id"], req["producer_id"],
                                            req["producer_epoch"], partitions, wall_ms())
        if t is None:
            return response(req.api, req.request_id, 0, None)
        self._drive(t, self._answer(conn, req))
        return None

    def end_txn(self, conn: Conn, req: Request) -> list | None:
        t = self.coordinator.end_txn(req["transactional_id"], req["producer_id"],
                                     req["producer_epoch"], bool(req["commit"]), wall_ms())
        if t is None:
            return response(req.api, req.request_id, 0, None)
        self._drive(t, self._answer(conn, req))
        return None

    def describe(self, conn: Conn, req: Request) -> list:
        ids = req["transactional_ids"]
        rows = []
        for tid in (sorted(self.coordinator.txns) if ids is None else ids):
            meta = self.coordinator.txns.get(tid)
            if meta is None:
                raise errors.TransactionalIdNotFoundError(f"unknown transactional id {tid!r}")
            rows.append({"transactional_id": tid, "state": meta.state.kafka_name,
                         "producer_id": meta.producer_id, "producer_epoch": meta.producer_epoch,
                         "timeout_ms": meta.timeout_ms, "start_ms": meta.start_ms,
                         "last_update_ms": meta.last_update_ms,
                         "partitions": sorted(map(list, meta.partitions))})
        return response(req.api, req.request_id, 0, None, rows)

    def list(self, conn: Conn, req: Request) -> list:
        rows = [[tid, meta.producer_id, meta.state.kafka_name]
                for tid, meta in sorted(self.coordinator.txns.items())]
        return response(req.api, req.request_id, 0, None, rows)

    def _answer(self, conn: Conn, req: Request, *fields) -> Done:
        """What ends a request's transition: its answer (or its error)."""
        def done(err: BaseException | None) -> None:
            if err is None:
                self._conns.send(conn, response(req.api, req.request_id, 0, None, *fields))
            else:
                code = err.code if isinstance(err, errors.BrokerError) \
                    else errors.KafkaStorageError.code
                self._conns.send(conn, response(req.api, req.request_id, code, str(err)))
        return done

    # --- driving transitions ------------------------------------------------------------------
    def _drive(self, t: Transition, done: Done) -> None:
        """Append ``t``'s record; go on once it is durable."""
        plog = self._log_part.log
        try:
            plog.append(build_batch([(wall_ms(), encode_key(t.transactional_id),
                                      encode_value(t.after))]))
        except errors.LogWriteError as err:
            self.coordinator.abandon(t)
            done(err)
            return
        self._commit.on_durable([self._log_part], lambda failed: self._written(t, failed, done))

    def _written(self, t: Transition, failed: dict, done: Done) -> None:
        if failed:
            self.coordinator.abandon(t)
            done(errors.KafkaStorageError(
                f"{TRANSACTION_STATE_TOPIC} could not be fsynced: "
                f"{next(iter(failed.values()))}; the transaction state is as before"))
            return
        job = self.coordinator.record_written(t)
        if job is None:
            done(None)
        else:
            self._write_markers(job, done)

    def _write_markers(self, job: MarkerJob, done: Done) -> None:
        """A COMMIT/ABORT marker on each partition of the transaction not marked yet."""
        written: list[Partition] = []
        for topic, partition in sorted(job.partitions - job.marked):
            part = self._table.get(topic, partition)
            if part is None:
                job.marked.add((topic, partition))        # deleted since: nothing to mark
                continue
            try:
                part.log.append_marker(job.producer_id, job.producer_epoch, commit=job.commit,
                                       coordinator_epoch=self._epoch, leader_epoch=self._epoch)
            except errors.LogWriteError as err:
                log.warning("transaction of producer %d: marker on %s-%d not written (%s); "
                            "trying again in %.0f s", job.producer_id, topic, partition, err,
                            RETRY_S)
                self._retry.append((job, done))
                return
            job.marked.add((topic, partition))
            written.append(part)
            if topic == OFFSETS_TOPIC:
                self._groups.offsets.end_transaction(partition, job.producer_id, job.commit)
        self._commit.on_durable(written, lambda failed: self._marked(job, failed, done))

    def _marked(self, job: MarkerJob, failed: dict, done: Done) -> None:
        if failed:
            # Offline partitions: the transaction stays prepared; a restart finishes it.
            done(errors.KafkaStorageError(
                f"transaction markers could not be fsynced ({next(iter(failed.values()))}); "
                "the transaction completes when the broker restarts"))
            return
        self._drive(self.coordinator.markers_written(job, wall_ms()), done)


def _ignore(err: BaseException | None) -> None:
    if err is not None:
        log.warning("transaction: %s", err)
