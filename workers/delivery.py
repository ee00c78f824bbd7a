"""A child's writes: handler outputs, dead letters and committed offsets, at least once or
exactly once. The engines (``engine.py``, ``aio.py``) decide *what* is done; this decides how
it becomes durable.

Positions: ``done[tp]`` is the offset after the partition's done prefix — every record below
it was handled or dead-lettered, and its outputs were handed to the producer. Only ``done``
positions are ever committed, so a crash redelivers at most what the child took and had not
committed yet (at least once), never a record it skipped.

At least once: outputs and dead letters go through an idempotent producer (``acks="all"``).
A commit first ``flush()``es it and checks that every output since the last commit was
acknowledged (``OutputsLost`` if not: the child exits and the records are redelivered), then
``commit_async`` the changed positions, one commit in flight at a time. Commits happen every
``commit_interval_ms``, when the child goes idle, before a partition is revoked (synchronous)
and at drain.

Exactly once: a transactional producer whose ``transactional_id`` is stable per slot, made and
``init_transactions()``-ed before the consumer joins (it fences a dead predecessor of the slot
and aborts its open transaction, so the group's offsets are settled first). Outputs and dead
letters are sent inside a transaction; a commit adds the changed positions
(``send_offsets_to_transaction`` with the consumer's group metadata, so a member that lost its
partitions cannot commit them) and commits. One transaction spans ``commit_interval_ms`` of
records. A failed transaction is aborted and ``TransactionAborted`` tells the engine to go
back to the committed positions; ``ProducerFencedError`` is fatal (a newer child of the slot
exists), and ends the child.
"""

from __future__ import annotations

import logging
import time

import mq
from mq.errors import (
    InvalidTxnStateError,
    MessageTooLargeError,
    MQError,
    ProducerFencedError,
    RecordListTooLargeError,
    UnknownTopicOrPartitionError,
)
from workers.config import PoolConfig
from workers.failures import dead_letter_headers

__all__ = ["BadOutput", "Delivery", "MissingOutputTopic", "OutputsLost", "TransactionAborted"]

log = logging.getLogger("workers.delivery")

_TRIES = 10                 # commit/abort calls that time out before giving up
_BLOCKED_FACTOR = 4         # the next commit waits at least 4x as long as this one blocked
# A record's own fault: retried, then dead-lettered. Any other error of a send is the pool's.
_RECORD_ERRORS = (TypeError, ValueError, UnknownTopicOrPartitionError, MessageTooLargeError,
                  RecordListTooLargeError)


class BadOutput(Exception):
    """An output the producer refused (not bytes, unknown topic, too large): the record's
    attempt failed."""


class MissingOutputTopic(BadOutput):
    """An output's topic does not exist. Not the record's fault (a pool started before its
    output topic was created would dead-letter every record): the engines try the record
    again after a backoff, its attempts untouched, until the topic exists."""


class OutputsLost(MQError):
    """An output or dead letter was not acknowledged: the child must not commit past it."""


class TransactionAborted(MQError):
    """The open transaction failed and was aborted: go back to the committed positions.
    ``refused``: ``(record, error, was a dead letter)`` of the outputs the producer refused
    (too large, ...). When that names one record, handling it again would fail the same way:
    it is dead-lettered (or, its dead letter refused, skipped) when it comes back. Several
    records may share one culprit's failure; each is then handled again in a transaction of
    its own, which tells."""

    def __init__(self, message: str, refused=()) -> None:
        super().__init__(message)
        self.refused = list(refused)


def _again_on_timeout(call) -> None:
    """``commit_transaction``/``abort_transaction``: ``TimeoutError`` means still under way;
    calling again finishes it."""
    for attempt in range(_TRIES):
        try:
            call()
            return
        except TimeoutError:
            if attempt == _TRIES - 1:
                raise


class Delivery:
    """Outputs, dead letters and commits of one child (see the module doc)."""

    def __init__(self, config: PoolConfig, slot: int) -> None:
        self.config = config
        self.slot = slot
        self.eos = config.exactly_once
        self.consumer: mq.Consumer | None = None
        self.done: dict[mq.TopicPartition, int] = {}
        self.committed: dict[mq.TopicPartition, int] = {}
        self.commits = 0                      # records committed (the counter table's)
        self._producer: mq.Producer | None = None
        self._pending: list = []                # (future, record, dead letter?, the send)
        self.on_refused = None                  # at least once: (record, error, dlq) -> None
        self._sent: dict = {}                   # the async commit in flight
        self._blocked = 0.0                     # seconds in sends since the last commit (EOS)
        self._interval = config.commit_interval_ms / 1000
        self._next_commit = time.monotonic() + self._interval
        self._txn_open = False
        self._topics: set[str] = set()          # output topics known to exist

    # --- setup ------------------------------------------------------------------------------
    def start(self) -> Delivery:
        """Exactly once: the transactional producer, before the consumer exists."""
        if self.eos and self._producer is None:
            producer = self._new_producer()
            try:
                producer.init_transactions()
            except BaseException:
                producer.close(timeout=1)
                raise
            self._producer = producer
        return self

    def _new_producer(self) -> mq.Producer:
        kw: dict = {"socket": self.config.socket, "linger_ms": 5}
        if self.eos:
            kw.update(transactional_id=self.config.transactional_id(self.slot),
                      transaction_timeout_ms=self.config.transaction_timeout_ms)
        return mq.Producer(**kw)

    @property
    def producer(self) -> mq.Producer:
        if self._producer is None:
            self._producer = self._new_producer()
        return self._producer

    # --- writes -----------------------------------------------------------------------------
    def normalize(self, outputs) -> list[tuple]:
        """A handler's outputs — ``(topic, key, value)`` or ``(topic, key, value, headers)``
        tuples; keys and values bytes-like, str (sent as UTF-8) or None — as a list of
        4-tuples. Raises ``BadOutput`` for anything else (the record's attempt failed),
        ``MissingOutputTopic`` for a topic that does not exist (yet)."""
        try:
            items = list(outputs)
        except TypeError as err:
            raise BadOutput(f"a handler returns None or an iterable of (topic, key, value) "
                            f"tuples, not {type(outputs).__name__}") from err
        out = []
        for item in items:
            if not isinstance(item, tuple) or len(item) not in (3, 4) or \
                    not isinstance(item[0], str):
                raise BadOutput(f"an output is (topic, key, value[, headers]), got {item!r}")
            topic, key, value = item[0], _encoded(item[1]), _encoded(item[2])
            if topic not in self._topics:
                try:
                    self.producer.partitions_for(topic)
                except UnknownTopicOrPartitionError as err:
                    raise MissingOutputTopic(f"output topic {topic!r} does not exist (create "
                                             f"it: mq topics create {topic} --partitions N)"
                                             ) from err
                self._topics.add(topic)
            out.append((topic, key, value, item[3] if len(item) == 4 else None))
        return out

    def send_normalized(self, outputs: list[tuple], record) -> None:
        """Send checked outputs of ``record``. Raises ``BadOutput`` for an output the producer
        refuses at once (too large for the topic): the attempt failed. Exactly once that
        aborts the transaction instead, which may hold the record's other outputs:
        ``TransactionAborted`` naming the record."""
        for topic, key, value, headers in outputs:
            try:
                self._send(topic, key, value, headers, record)
            except BadOutput as err:
                if self.eos:
                    self._abort(err, [(record, f"BadOutput: {err}", False)])
                raise

    def dead_letter(self, record, error: str, attempts: int) -> None:
        """Send ``record`` to the dead-letter topic; one the producer refuses at once is
        logged and dropped (nothing else can be done with it)."""
        topic = self.config.dead_letter_topic
        assert topic is not None
        headers = dead_letter_headers(record.headers, record.topic, record.partition,
                                      record.offset, error, attempts, self.config.group_id,
                                      record.timestamp_ms)
        try:
            self._send(topic, record.key, record.value, headers, record, dead_letter=True)
        except BadOutput as err:
            log.error("could not dead-letter %s-%d@%d, skipped: %s", record.topic,
                      record.partition, record.offset, err)

    def _send(self, topic, key, value, headers, record, dead_letter: bool = False) -> None:
        producer = self.producer
        if self.eos and not self._txn_open:
            producer.begin_transaction()
            self._txn_open = True
        try:
            if self.eos:
                started = time.monotonic()
                fut = producer.send(topic, value=value, key=key, headers=headers)
                self._blocked += time.monotonic() - started
            else:
                fut = producer.send(topic, value=value, key=key, headers=headers)
        except _RECORD_ERRORS as err:
            raise BadOutput(f"{type(err).__name__}: {err}") from err
        except ProducerFencedError:
            raise
        except InvalidTxnStateError as err:             # an earlier send of the txn failed
            self._abort(err)
        self._pending.append((fut, record, dead_letter, (topic, key, value, headers)))

    # --- commits ----------------------------------------------------------------------------
    def due(self, now: float) -> bool:
        return now >= self._next_commit

    def changed(self, tps=None, against: dict | None = None) -> dict:
        """Done positions (all, or of ``tps``) that differ from ``against`` (default: the
        confirmed commits)."""
        done, base = self.done, self.committed if against is None else against
        return {tp: done[tp] for tp in (done if tps is None else tps)
                if tp in done and base.get(tp) != done[tp]}

    def commit(self, sync: bool = False, tps=None) -> None:
        """Make the done positions durable (all, or of ``tps``). ``sync``: wait for it (at
        least once; a transaction always waits). Raises ``OutputsLost`` (at least once),
        ``TransactionAborted`` and ``ProducerFencedError`` (exactly once).

        The next commit is due ``commit_interval_ms`` later, or ``_BLOCKED_FACTOR`` times as
        long as this one blocked, if that is longer. Exactly once, the blocking includes the
        transaction's sends: the first record of each partition in a transaction waits for
        AddPartitionsToTxn, which the coordinator makes durable (an fsync each), and the
        commit waits for the sends' fsync, then the markers and their fsyncs. On a loaded box
        that added up to 100-300 ms per transaction, and a child committing every 100 ms
        spent most of its time waiting. So a child spends at most about a fifth of its time
        blocked in commits, and batches more records per transaction when they are slow."""
        started = time.monotonic()
        try:
            self._commit(sync, tps)
        finally:
            now = time.monotonic()
            blocked, self._blocked = now - started + self._blocked, 0.0
            self._next_commit = now + max(self._interval, _BLOCKED_FACTOR * blocked)

    def _commit(self, sync: bool, tps) -> None:
        if self.eos:
            self._commit_transaction()
            return
        if self._sent and not sync:     # sync: whatever an async commit in flight may carry
            return                      # one async commit in flight at a time
        changed = self.changed(tps)
        if not changed:
            return
        for _ in range(3):                  # refused outputs' dead letters, checked too
            if not self._pending:
                break
            self._producer.flush()                        # type: ignore[union-attr]
            failed = [item for item in self._pending if not item[0].succeeded()]
            self._pending = []
            for record, error, dead_letter in self._resend_alone(failed):
                self.on_refused(record, error, dead_letter)   # type: ignore[misc]
        consumer = self.consumer
        assert consumer is not None
        if sync:
            consumer.commit(changed)
            self._confirmed(changed)
        else:
            self._sent = dict(changed)
            consumer.commit_async(changed, self._committed_async)

    def _confirmed(self, offsets: dict) -> None:
        for tp, offset in offsets.items():
            before = self.committed.get(tp)
            if before is None or offset > before:
                self.commits += 0 if before is None else offset - before
                self.committed[tp] = offset

    def _committed_async(self, offsets: dict, error: Exception | None) -> None:
        self._sent = {}
        if error is not None:
            log.warning("commit failed (the next one retries it): %s", error)
        else:
            self._confirmed(offsets)

    def _commit_transaction(self) -> None:
        changed = self.changed()
        if not changed and not self._txn_open:
            return
        producer = self.producer
        try:
            if not self._txn_open:
                producer.begin_transaction()
                self._txn_open = True
            if changed:
                producer.send_offsets_to_transaction(changed, self.consumer)
            _again_on_timeout(producer.commit_transaction)
        except ProducerFencedError:
            raise
        except (MQError, TimeoutError) as err:
            self._abort(err)
        self._txn_open = False
        self._pending = []
        self._confirmed(changed)

    def _resend_alone(self, failed: list) -> list[tuple]:
        """At least once: send each failed output again on its own and wait for it. A batch
        fails as a whole, and the batches queued behind a failed one fail with its error, so
        only a send that fails alone is its record's fault: ``(record, error, a dead
        letter?)`` of those. Raises ``OutputsLost`` for any other failure."""
        refused = []
        for fut, record, dead_letter, (topic, key, value, headers) in failed:
            try:
                self.producer.send(topic, value=value, key=key, headers=headers).get()
            except _RECORD_ERRORS as err:
                refused.append((record, f"BadOutput: {type(err).__name__}: {err}",
                                dead_letter))
            except (MQError, TimeoutError) as err:
                raise OutputsLost(f"an output or dead letter was not acknowledged: "
                                  f"{fut.exception()}; sent again: {err}") from err
        return refused

    @staticmethod
    def _refused(pending) -> list[tuple]:
        """Exactly once: ``(record, error, a dead letter?)`` of the sends of an aborted
        transaction that failed for a record's fault (``_RECORD_ERRORS``). Several records
        may be named for one culprit (a batch fails as a whole): the engines try each again
        in a transaction of its own."""
        out = []
        for fut, record, dead_letter, _ in pending:
            if fut.is_done and fut.failed() and isinstance(fut.exception(), _RECORD_ERRORS):
                exc = fut.exception()
                out.append((record, f"BadOutput: {type(exc).__name__}: {exc}", dead_letter))
        return out

    def _abort(self, err: BaseException, refused=()):
        refused = list(refused) + self._refused(self._pending)
        self._pending = []
        log.warning("transaction failed, aborting it and going back to the committed "
                    "offsets: %s: %s", type(err).__name__, err)
        try:
            _again_on_timeout(self.producer.abort_transaction)
        except ProducerFencedError:
            raise
        except (MQError, TimeoutError) as again:
            raise MQError(f"could not abort a failed transaction: {again}") from again
        finally:
            self._txn_open = False
        raise TransactionAborted(f"{type(err).__name__}: {err}", refused) from err

    # --- partitions come and go ---------------------------------------------------------------
    def revoked(self, tps) -> None:
        """Commit before the partitions go: their next owner starts where this one stopped."""
        try:
            self.commit(sync=True, tps=None if self.eos else tps)
        finally:
            self.forget(tps)

    def forget(self, tps) -> None:
        for tp in tps:
            self.done.pop(tp, None)
            self.committed.pop(tp, None)
            self._sent.pop(tp, None)

    def lost(self) -> None:
        """Every partition was taken without a revocation: commit nothing; an open
        transaction's offsets would be refused, so abort it."""
        self.done.clear()
        self.committed.clear()
        self._sent = {}
        self._pending = []
        if self.eos and self._txn_open:
            try:
                self._abort(MQError("the group took this member's partitions"))
            except TransactionAborted:
                pass

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=10)
            self._producer = None


def _encoded(value):
    if value is None or isinstance(value, (bytes, bytearray, memoryview)):
        return value
    if isinstance(value, str):
        return value.encode()
    raise BadOutput(f"output keys and values are bytes, str or None, not "
                    f"{type(value).__name__}")
