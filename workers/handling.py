"""What a child's two loops (``engine.SyncEngine``, ``aio.AsyncEngine``) share: the
counters they publish to the counter table, and what they know about a record's earlier
attempts — deaths in the handler (the supervisor's ring), retry hints of other children,
outputs refused in an aborted transaction — with the decisions that follow (retry delay,
dead letter or skip), and the steps of their loops that are the same (``poll``,
``aborted``, ``seek_committed``). The loops themselves are the engines'. What talks to the
broker (``poll``, ``settle``, ``give_up``...) is an operation of steps (``clients.Op``) that
the engine runs with its clients (``run_op``: a call, or a coroutine to await).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import mq
from workers.clients import Op
from workers.config import PoolConfig
from workers.delivery import Delivery, TransactionAborted
from workers.failures import backoff_s, death_error
from workers.logs import record_fields
from workers.stats import (
    COMMITTED,
    DEAD_LETTERED,
    FAILED,
    HANDLED,
    HANDLER_NS,
    LAST_ACTIVE_NS,
    RETRIED,
    SKIPPED,
    StatsTable,
)

__all__ = ["Base", "Counters"]

log = logging.getLogger("workers.engine")

_monotonic_ns = time.monotonic_ns


class Counters:
    """A child's counters: kept in plain attributes on the hot path, published to its row of
    the counter table (cumulative per slot) by ``publish``."""

    FIELDS = ((HANDLED, "handled"), (RETRIED, "retried"), (FAILED, "failed"),
              (DEAD_LETTERED, "dead_lettered"), (SKIPPED, "skipped"),
              (HANDLER_NS, "handler_ns"), (COMMITTED, "committed"))

    def __init__(self, table: StatsTable, slot: int) -> None:
        self.table = table
        self.slot = slot
        self.base = {i: table.words[table.row(slot) + i] for i, _ in self.FIELDS}
        self.handled = self.retried = self.failed = self.dead_lettered = self.skipped = 0
        self.handler_ns = self.committed = 0

    def publish(self) -> None:
        w, row = self.table.words, self.table.row(self.slot)
        for i, name in self.FIELDS:
            w[row + i] = self.base[i] + getattr(self, name)
        w[row + LAST_ACTIVE_NS] = _monotonic_ns()


class Base:
    """What both engines share: the attempts a death spent, failure decisions, dead letters,
    revocation."""

    def __init__(self, config: PoolConfig, slot: int, handler: Callable, clients,
                 delivery: Delivery, table: StatsTable, counters: Counters,
                 draining: Callable[[], bool]) -> None:
        self.config = config
        self.slot = slot
        self.handler = handler
        self.clients = clients
        self.consumer = clients.consumer          # local calls: pause, seek, assignment...
        self.run_op = clients.run                 # the rest: steps (clients.py)
        self.delivery = delivery
        self.table = table
        self.counters = counters
        self.draining = draining
        self.topic_index = {t: i for i, t in enumerate(config.topics)}
        self.suspects: dict[tuple[int, int, int], tuple[int, str | None, int]] = {}
        self._attempts_version = -1
        self.hinted: set[tuple[int, int, int]] = set()
        self.refusals: dict[tuple[int, int, int], tuple[str, bool, bool]] = {}
        delivery.on_refused = self.on_refused
        self.tick: Callable[[], None] = lambda: None    # the child's per-turn check

    def refresh_suspects(self) -> None:
        """Reload what other children and the supervisor know of failed attempts, when it
        changed: deaths in the handler (the supervisor's ring) and every child's retry hints
        (a record moved here by a rebalance goes on counting where its last owner stopped)."""
        table = self.table
        version = table.hints_version()
        if version == self._attempts_version:
            return
        while True:
            deaths, hints = table.attempt_entries(), table.hints()
            again = table.hints_version()
            if again == version:
                break
            version = again
        merged = {key: (failed, death_error(kind, detail, self.config.handler_timeout_s), 0)
                  for key, (failed, kind, detail) in deaths.items()}
        for key, (failed, not_before) in hints.items():
            if failed > merged.get(key, (0, None, 0))[0]:
                merged[key] = (failed, "its earlier attempts failed (see the pool's log)",
                               not_before)
        self.suspects = merged
        self._attempts_version = version

    def record_key(self, r) -> tuple[int, int, int]:
        """``r``'s key in the counter table's entries: (topic index, partition, offset)."""
        return (self.topic_index[r.topic], r.partition, r.offset)

    def poll(self, timeout_s: float) -> Op[dict]:
        """Poll for up to ``timeout_s`` and take what came; returns the batch."""
        batch = yield ("poll", timeout_s)
        if batch:
            self.refresh_suspects()             # hints written before a rebalance
        for tp, records in batch.items():
            self.take(tp, records)
        return batch

    def aborted(self, err: TransactionAborted) -> None:
        """The open transaction was aborted: remember its refused outputs, read again from
        the committed positions."""
        self.remember_refused(err.refused)
        self.rewind()

    def seek_committed(self, tps) -> None:
        """After an abort: read ``tps`` again from their committed positions (resumed), and
        move every done position back to its committed one."""
        consumer, committed = self.consumer, self.delivery.committed
        assigned = consumer.assignment()
        for tp in tps:
            start = committed.get(tp)
            if tp in assigned and start is not None:
                consumer.seek(tp, start)
            if tp in consumer.paused():
                consumer.resume(tp)
        self.delivery.done = dict(committed)

    def prior_attempts(self, r) -> tuple[int, str | None, int]:
        """Attempts of ``r`` that failed elsewhere, the last one's error, and when the next
        may start (CLOCK_MONOTONIC ns; 0: now)."""
        return self.suspects.get(self.record_key(r), (0, None, 0))

    def hint_failed(self, r, attempt: int, delay_s: float) -> None:
        """Attempt ``attempt`` of ``r`` failed and it will be tried again after ``delay_s``:
        say so in this child's row, for whoever owns the partition next."""
        key = self.record_key(r)
        self.hinted.add(key)
        self.table.set_hint(self.slot, *key, attempt, _monotonic_ns() + int(delay_s * 1e9))

    def hint_done(self, r) -> None:
        key = self.record_key(r)
        if key in self.hinted:
            self.hinted.discard(key)
            self.table.clear_hint(self.slot, *key)

    def give_up(self, r, error: str, attempts: int) -> Op[None]:
        """The last attempt failed: dead-letter ``r`` (or log and skip it)."""
        self.hint_done(r)
        if self.config.dead_letter_topic is not None:
            yield from self.delivery.dead_letter(r, error, attempts)
            self.counters.dead_lettered += 1
            log.error("dead-lettered after %d attempts to %s: %s", attempts,
                      self.config.dead_letter_topic, error, extra=record_fields(r))
        else:
            self.counters.skipped += 1
            log.error("skipped after %d failed attempts (no dead-letter topic): %s",
                      attempts, error, extra=record_fields(r))

    def settle(self, busy) -> Op[None]:
        """Move the done position of every partition with nothing left to handle
        (``busy``: the partitions that have) up to the consumer's position: past transaction
        markers, aborted records and compaction gaps, which never reach the handler. Without
        it a transactional input would keep a lag of one (its last marker) forever."""
        done = self.delivery.done
        for tp, offset in list(done.items()):
            if tp in busy:
                continue
            try:
                position = yield ("position", tp)
            except (ValueError, mq.MQError):
                continue                            # no longer assigned
            if position > offset:
                done[tp] = position

    def on_refused(self, r, error: str, dead_letter: bool) -> Op[None]:
        """The producer refused an output (or the dead letter) of ``r``, which was handled:
        at least once, dead-letter it now (or, its dead letter refused, skip it)."""
        log.error("%s refused: %s", "its dead letter was" if dead_letter else "an output was",
                  error, extra=record_fields(r))
        if dead_letter:
            self.counters.skipped += 1
        else:
            yield from self.give_up(r, error, 1)

    def remember_refused(self, refused) -> None:
        """Exactly once, a transaction was aborted because outputs of these records were
        refused. One record: handling it again would fail the same way, so it is
        dead-lettered (skipped, if its dead letter was refused) when it comes back, and
        other children learn it from a retry hint with every attempt spent. Several records
        (a batch fails as a whole): each is a suspect, handled again in a transaction of its
        own (``isolate``), which tells."""
        keys = {self.record_key(r) for r, _, _ in refused}
        for r, error, dead_letter in refused:
            key = self.record_key(r)
            confirmed = len(keys) == 1
            log.error("%s refused: %s; %s", "its dead letter was" if dead_letter
                      else "an output was", error, "giving up on the record" if confirmed
                      else "the record is tried again in a transaction of its own",
                      extra=record_fields(r))
            self.refusals[key] = (error, dead_letter, confirmed)
            if confirmed:
                self.hint_failed(r, self.config.max_attempts, 0.0)

    def take_refusal(self, r):
        """What a refused output of ``r`` means now: None (nothing), ``"isolate"`` (a
        suspect: handle it in a transaction of its own), ``("dead", error)`` or ``("skip",
        error)`` (give up on it: its output, or its dead letter, was refused)."""
        key = self.record_key(r)
        seen = self.refusals.get(key)
        if seen is None:
            return None
        error, dead_letter, confirmed = seen
        if not confirmed:
            return "isolate"
        del self.refusals[key]
        return ("skip", error) if dead_letter else ("dead", error)

    def skip(self, r) -> None:
        """``r``'s dead letter was refused: nothing more can be done with it."""
        self.hint_done(r)
        self.counters.skipped += 1

    def isolated(self, r) -> None:
        """A suspect's own transaction committed: it was not the culprit."""
        self.refusals.pop(self.record_key(r), None)

    def wait_for_topic(self, r, err: Exception, waits: int) -> float:
        """An output topic of ``r`` does not exist (``MissingOutputTopic``): the attempt does
        not count and ``r`` is tried again after the returned delay, which grows with
        ``waits`` up to ``retry_backoff_max_ms`` (10 s by default), so records wait for the
        topic instead of all going to the dead-letter topic."""
        delay = self.backoff(waits)
        log.warning("%s; the record is tried again in %.0f ms, its attempts untouched (its "
                    "partition waits)", err, delay * 1000, extra=record_fields(r))
        return delay

    def backoff(self, attempt: int) -> float:
        return backoff_s(attempt, self.config.retry_backoff_ms, self.config.retry_backoff_max_ms)
