"""A child's writes: handler outputs, dead letters and committed offsets, at least once or
exactly once. The engines (``engine.py``, ``aio.py``) decide *what* is done; this decides how
it becomes durable. Its operations are generators of steps (``clients.py``), which the
child's clients perform: blocking calls of the threaded clients for a plain handler, awaits of
``mq.aio``'s for an ``async def`` one, whose handlers go on meanwhile.

Positions: ``done[tp]`` is the offset after the partition's done prefix — every record below
it was handled or dead-lettered, and its outputs were handed to the producer. Only ``done``
positions are ever committed, so a crash redelivers at most what the child took and had not
committed yet (at least once), never a record it skipped.

At least once: outputs and dead letters go through an idempotent producer (``acks="all"``).
A commit first ``flush()``es it and checks that every output since the last commit was
acknowledged (``OutputsLost`` if not: the child exits and the records are redelivered), then
``commit_async`` the changed positions, one commit in flight at a time (an ``async def``
handler's loop commits synchronously inside its commit task instead: ``aio.py``). Commits
happen every ``commit_interval_ms``, when the child goes idle, before a partition is revoked
(synchronous) and at drain.

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
from typing import NoReturn

import mq
from mq.errors import (
    InvalidTxnStateError,
    MessageTooLargeError,
    MQError,
    ProducerFencedError,
    RecordListTooLargeError,
    UnknownTopicOrPartitionError,
)
from workers.clients import Op
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


def _again_on_timeout(step: str) -> Op[None]:
    """``commit_transaction``/``abort_transaction``: ``TimeoutError`` means still under way;
    calling again finishes it. Each call again is logged: on a Kafka cluster a call may
    wait ``max_block_ms`` (60 s) before it times out, and a child that spent minutes so
    showed nothing in the pool's log."""
    for attempt in range(_TRIES):
        try:
            yield (step,)
            return
        except TimeoutError as err:
            if attempt == _TRIES - 1:
                raise
            log.warning("%s did not finish (call %d of %d), calling it again: %s",
                        step.replace("_", " "), attempt + 1, _TRIES, err)


class Delivery:
    """Outputs, dead letters and commits of one child (see the module doc). Its operations
    are generators of steps (``clients.Op``), which the child's clients perform."""

    def __init__(self, config: PoolConfig, slot: int) -> None:
        self.config = config
        self.slot = slot
        self.eos = config.exactly_once
        self.done: dict[mq.TopicPartition, int] = {}
        self.committed: dict[mq.TopicPartition, int] = {}
        self.commits = 0                      # records committed (the counter table's)
        self._pending: list = []                # (future, record, dead letter?, the output)
        self.on_refused = None                  # at least once: (record, error, dlq) -> Op
        self._sent: dict = {}                   # the async commit in flight
        self._blocked = 0.0                     # seconds in sends since the last commit (EOS)
        self._interval = config.commit_interval_ms / 1000
        self._next_commit = time.monotonic() + self._interval
        self._txn_open = False
        self._topics: set[str] = set()          # output topics known to exist

    # --- setup ------------------------------------------------------------------------------
    def producer_options(self) -> dict:
        """The producer's keywords (``mq.Producer``'s and ``mq.aio.Producer``'s)."""
        kw: dict = {**self.config.broker_options(), "linger_ms": 5}
        if self.eos:
            kw.update(transactional_id=self.config.transactional_id(self.slot),
                      transaction_timeout_ms=self.config.transaction_timeout_ms)
        return kw

    # --- writes -----------------------------------------------------------------------------
    def normalize(self, outputs) -> list[tuple]:
        """A handler's outputs — ``(topic, key, value)`` or ``(topic, key, value, headers)``
        tuples; keys and values bytes-like, str (sent as UTF-8) or None — as a list of
        4-tuples. Raises ``BadOutput`` for anything else (the record's attempt failed)."""
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
            out.append((item[0], _encoded(item[1]), _encoded(item[2]),
                        item[3] if len(item) == 4 else None))
        return out

    def known(self, outputs: list[tuple]) -> bool:
        """Every output's topic is known to exist (``learn`` has nothing to do)."""
        for output in outputs:
            if output[0] not in self._topics:
                return False
        return True

    def learn(self, outputs: list[tuple]) -> Op[None]:
        """Check that the outputs' topics exist (once each): ``MissingOutputTopic`` for one
        that does not (yet)."""
        for output in outputs:
            topic = output[0]
            if topic in self._topics:
                continue
            try:
                yield ("partitions_for", topic)
            except UnknownTopicOrPartitionError as err:
                raise MissingOutputTopic(f"output topic {topic!r} does not exist (create it: "
                                         f"mq topics create {topic} --partitions N)") from err
            self._topics.add(topic)

    def send_normalized(self, outputs: list[tuple], record) -> Op[None]:
        """Send ``normalize``d outputs of ``record``, their topics checked first (``learn``).
        Raises ``BadOutput`` for an output the producer refuses at once (too large for the
        topic): the attempt failed. Exactly once that aborts the transaction instead, which
        may hold the record's other outputs: ``TransactionAborted`` naming the record."""
        return self._send(outputs, record, False)

    def dead_letter(self, record, error: str, attempts: int) -> Op[None]:
        """Send ``record`` to the dead-letter topic; one the producer refuses at once is
        logged and dropped (nothing else can be done with it)."""
        topic = self.config.dead_letter_topic
        assert topic is not None
        headers = dead_letter_headers(record.headers, record.topic, record.partition,
                                      record.offset, error, attempts, self.config.group_id,
                                      record.timestamp_ms)
        try:
            yield from self._send([(topic, record.key, record.value, headers)], record, True)
        except BadOutput as err:
            log.error("could not dead-letter %s-%d@%d, skipped: %s", record.topic,
                      record.partition, record.offset, err)

    def send_now(self, outputs: list[tuple], record, send) -> Op[None] | None:
        """``send_normalized`` for a plain handler's loop, without an operation per record:
        when the sends are the only steps (the topics known; exactly once, the transaction
        open), each output goes through ``send`` (the threaded clients' step). Returns None,
        or the operation that does the rest: all of it when another step comes first, the
        refusal (``BadOutput``, ``TransactionAborted``) of a send that raised."""
        if self.eos and not self._txn_open:
            return self.send_normalized(outputs, record)
        for output in outputs:                     # known(), without a call per record
            if output[0] not in self._topics:
                return self.send_normalized(outputs, record)
        for output in outputs:
            started = time.monotonic() if self.eos else 0.0
            try:
                fut = send(output)
            except Exception as err:                # noqa: BLE001 -- _refuse sorts it out
                return self._refuse(err, record, False)
            if self.eos:                            # _sent_output, inlined
                self._blocked += time.monotonic() - started
            self._pending.append((fut, record, False, output))
        return None

    def _send(self, outputs: list[tuple], record, dead_letter: bool) -> Op[None]:
        if not dead_letter and not self.known(outputs):
            yield from self.learn(outputs)
        if self.eos and not self._txn_open:
            yield ("begin_transaction",)
            self._txn_open = True
        for output in outputs:
            started = time.monotonic() if self.eos else 0.0
            try:
                fut = yield ("send", output)
            except Exception as err:                # noqa: BLE001 -- _refuse sorts it out
                yield from self._refuse(err, record, dead_letter)
            self._sent_output(fut, record, dead_letter, output, started)

    def _sent_output(self, fut, record, dead_letter: bool, output: tuple, started: float) -> None:
        if self.eos:
            self._blocked += time.monotonic() - started
        self._pending.append((fut, record, dead_letter, output))

    def _refuse(self, err: Exception, record, dead_letter: bool) -> Op[NoReturn]:
        """A send of ``record``'s raised ``err``: ``BadOutput`` if the record is at fault
        (exactly once, an output's aborts the transaction: ``TransactionAborted`` naming the
        record), ``TransactionAborted`` if an earlier send broke the transaction, else
        ``err``."""
        if isinstance(err, _RECORD_ERRORS):
            bad = BadOutput(f"{type(err).__name__}: {err}")
            if self.eos and not dead_letter:
                yield from self._abort(bad, [(record, f"BadOutput: {bad}", False)])
            raise bad from err
        if isinstance(err, InvalidTxnStateError):
            yield from self._abort(err)
        raise err

    # --- commits ----------------------------------------------------------------------------
    def due(self, now: float) -> bool:
        return now >= self._next_commit

    def changed(self, tps=None, against: dict | None = None) -> dict:
        """Done positions (all, or of ``tps``) that differ from ``against`` (default: the
        confirmed commits)."""
        done, base = self.done, self.committed if against is None else against
        return {tp: done[tp] for tp in (done if tps is None else tps)
                if tp in done and base.get(tp) != done[tp]}

    def commit(self, sync: bool = False, tps=None, retry_later: bool = False) -> Op[None]:
        """Make the done positions durable (all, or of ``tps``). ``sync``: wait for it (at
        least once; a transaction always waits); ``retry_later``: a synchronous commit that
        fails is logged and left to the next one, as an async commit's failure is. Raises
        ``OutputsLost`` (at least once), ``TransactionAborted`` and ``ProducerFencedError``
        (exactly once).

        The next commit is due ``commit_interval_ms`` later, or ``_BLOCKED_FACTOR`` times as
        long as this one took, if that is longer. Exactly once, that includes the
        transaction's sends: the first record of each partition in a transaction waits for
        AddPartitionsToTxn, which the coordinator makes durable (an fsync each), and the
        commit waits for the sends' fsync, then the markers and their fsyncs. On a loaded box
        that added up to 100-300 ms per transaction, and a child committing every 100 ms
        spent most of its time waiting. So a child spends at most about a fifth of its time
        in commits, and batches more records per transaction when they are slow."""
        started = time.monotonic()
        try:
            if self.eos:
                yield from self._commit_transaction()
            else:
                yield from self._commit(sync, tps, retry_later)
        finally:
            now = time.monotonic()
            blocked, self._blocked = now - started + self._blocked, 0.0
            self._next_commit = now + max(self._interval, _BLOCKED_FACTOR * blocked)

    def _commit(self, sync: bool, tps, retry_later: bool = False) -> Op[None]:
        if self._sent and not sync:     # sync: whatever an async commit in flight may carry
            return                      # one async commit in flight at a time
        changed = self.changed(tps)
        if not changed:
            return
        # What was sent before the done positions were taken; an async handler's records
        # may send meanwhile, for the next commit.
        pending, self._pending = self._pending, []
        for _ in range(3):                  # refused outputs' dead letters, checked too
            if not pending:
                break
            yield ("flush",)
            errors = yield ("outcomes", [item[0] for item in pending])
            failed = [(item, error) for item, error in zip(pending, errors)
                      if error is not None]
            mark = len(self._pending)
            for record, error, dead_letter in (yield from self._resend_alone(failed)):
                yield from self.on_refused(record, error, dead_letter)  # type: ignore[misc]
            pending = self._pending[mark:]                  # the dead letters just sent
            del self._pending[mark:]
        self._pending += pending                            # left for the next commit
        if sync:
            try:
                yield ("commit", changed)
            except (MQError, TimeoutError) as err:
                if not retry_later:
                    raise
                log.warning("commit failed (the next one retries it): %s", err)
                return
            self._confirmed(changed)
        else:
            self._sent = dict(changed)
            yield ("commit_async", changed, self._committed_async)

    def _confirmed(self, offsets: dict) -> None:
        for tp, offset in offsets.items():
            before = self.committed.get(tp)
            if before is None or offset > before:
                self.commits += 0 if before is None else offset - before
                self.committed[tp] = offset

    def _committed_async(self, offsets: dict, error: BaseException | None) -> None:
        self._sent = {}
        if error is not None:
            log.warning("commit failed (the next one retries it): %s", error)
        else:
            self._confirmed(offsets)

    def _commit_transaction(self) -> Op[None]:
        changed = self.changed()
        if not changed and not self._txn_open:
            return
        try:
            if not self._txn_open:
                yield ("begin_transaction",)
                self._txn_open = True
            if changed:
                yield ("send_offsets", changed)
            yield from _again_on_timeout("commit_transaction")
        except ProducerFencedError:
            raise
        except (MQError, TimeoutError) as err:
            yield from self._abort(err)
        self._txn_open = False
        self._pending = []
        self._confirmed(changed)

    def _resend_alone(self, failed: list) -> Op[list[tuple]]:
        """At least once: send each failed output (``(pending item, error)``) again on its
        own and wait for it. A batch fails as a whole, and the batches queued behind a failed
        one fail with its error, so only a send that fails alone is its record's fault:
        ``(record, error, a dead letter?)`` of those. Raises ``OutputsLost`` for any other
        failure."""
        refused = []
        for (_, record, dead_letter, output), first in failed:
            try:
                yield ("send_and_wait", output)
            except _RECORD_ERRORS as err:
                refused.append((record, f"BadOutput: {type(err).__name__}: {err}",
                                dead_letter))
            except (MQError, TimeoutError) as err:
                raise OutputsLost(f"an output or dead letter was not acknowledged: "
                                  f"{first}; sent again: {err}") from err
        return refused

    @staticmethod
    def _refused(pending: list, errors: list) -> list[tuple]:
        """Exactly once: ``(record, error, a dead letter?)`` of the sends of an aborted
        transaction that failed for a record's fault (``_RECORD_ERRORS``). Several records
        may be named for one culprit (a batch fails as a whole): the engines try each again
        in a transaction of its own."""
        return [(record, f"BadOutput: {type(exc).__name__}: {exc}", dead_letter)
                for (_, record, dead_letter, _), exc in zip(pending, errors)
                if isinstance(exc, _RECORD_ERRORS)]

    def _abort(self, err: BaseException, refused=()) -> Op[NoReturn]:
        pending, self._pending = self._pending, []
        errors = (yield ("outcomes", [item[0] for item in pending])) if pending else []
        refused = list(refused) + self._refused(pending, errors)
        log.warning("transaction failed, aborting it and going back to the committed "
                    "offsets: %s: %s", type(err).__name__, err)
        try:
            yield from _again_on_timeout("abort_transaction")
        except ProducerFencedError:
            raise
        except (MQError, TimeoutError) as again:
            raise MQError(f"could not abort a failed transaction: {again}") from again
        finally:
            self._txn_open = False
        raise TransactionAborted(f"{type(err).__name__}: {err}", refused) from err

    # --- partitions come and go ---------------------------------------------------------------
    def revoked(self, tps) -> Op[None]:
        """Commit before the partitions go: their next owner starts where this one stopped."""
        try:
            yield from self.commit(sync=True, tps=None if self.eos else tps)
        except Exception as err:
            log.warning("the commit before a revocation failed (%s: %s): the next owner "
                        "handles again what was done since the last commit (done, not "
                        "committed: %s)", type(err).__name__, err, _positions(self.changed(tps)))
            raise
        finally:
            self.forget(tps)

    def forget(self, tps) -> None:
        for tp in tps:
            self.done.pop(tp, None)
            self.committed.pop(tp, None)
            self._sent.pop(tp, None)

    def lost(self) -> Op[None]:
        """Every partition was taken without a revocation: commit nothing; an open
        transaction's offsets would be refused, so abort it."""
        uncommitted = self.changed()
        if uncommitted:
            log.warning("the group took this member's partitions without a revocation (its "
                        "session expired?): their next owner handles again what was done "
                        "since the last commit (done, not committed: %s)",
                        _positions(uncommitted))
        self.done.clear()
        self.committed.clear()
        self._sent = {}
        self._pending = []
        if self.eos and self._txn_open:
            try:
                yield from self._abort(MQError("the group took this member's partitions"))
            except TransactionAborted:
                pass


def _positions(offsets: dict) -> str:
    """``{tp: offset}`` for a log line: "topic-partition@offset, ..."."""
    return ", ".join(f"{tp.topic}-{tp.partition}@{o}" for tp, o in sorted(offsets.items())) \
        or "none"


def _encoded(value):
    if value is None or isinstance(value, (bytes, bytearray, memoryview)):
        return value
    if isinstance(value, str):
        return value.encode()
    raise BadOutput(f"output keys and values are bytes, str or None, not "
                    f"{type(value).__name__}")
