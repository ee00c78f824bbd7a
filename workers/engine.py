"""The child's loop for a plain (synchronous) handler: one record at a time, in partition
order, a failing record blocking only its own partition.

::

    loop:  attempts table changed?  -> reload it (records a death spent attempts on)
           a parked partition due?   -> try its head record again
           work on partitions with records taken and not handled, in turn
           nothing ready?            -> poll (up to 100 ms, less when a retry or commit is due)
           commit due / idle?        -> Delivery.commit

A record's attempt: mark it in the child's in-flight entry of the counter table (the supervisor
kills a child whose entry is older than ``handler_timeout_s``), call the handler, send its
outputs. A failure parks the partition: paused in the consumer, its rest kept, the head tried
again after the backoff while other partitions go on (``failures.py``). The last failed attempt
dead-letters the record (or, without a dead-letter topic, logs and skips it). Either way the
record is done and the partition's done position moves past it. An output topic that does not
exist parks the partition the same way but spends no attempt (``MissingOutputTopic``): the
record waits for the topic, with a growing backoff, instead of being dead-lettered.

Partitions are paused while they hold ``max_poll_records`` records not yet handled, so a
parked partition does not fill memory. Revocation commits the done positions first; a lost
partition (fenced member) is dropped without a commit.
"""

from __future__ import annotations

import logging
import time

import mq
from workers.clients import Op
from workers.delivery import BadOutput, MissingOutputTopic, TransactionAborted
from workers.failures import error_text
from workers.handling import Base
from workers.logs import record_fields

__all__ = ["SyncEngine"]

log = logging.getLogger("workers.engine")

_IDLE_POLL_S = 0.1
_monotonic_ns = time.monotonic_ns
_GO, _DEAD, _WAIT = "go", "dead", "wait"


class SyncEngine(Base):
    """The loop of a child with a plain handler (see the module doc)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pending: dict[mq.TopicPartition, list] = {}     # tp -> [records, next index]
        self.parked: dict[mq.TopicPartition, float] = {}     # tp -> when to try its head
        self.tries: dict[mq.TopicPartition, tuple[int, str]] = {}   # head's attempts, error
        self.topic_waits: dict[mq.TopicPartition, int] = {}  # head's waits for an output topic
        self.send = self.clients.send                        # an output, at once
        self.entry = table_entry = self.table.inflight_entry(self.slot, 0)
        self.words = self.table.words
        self.words[table_entry + 4] = 0

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        """Until ``draining()``; then the done positions are committed."""
        delivery, counters, run = self.delivery, self.counters, self.run_op
        while not self.draining():
            self.tick()
            self.refresh_suspects()
            try:
                worked = self.work()
                if not self.ready():
                    timeout = 0.0 if worked else self.idle_timeout()
                    batch = run(self.poll(timeout))
                    idle = not batch and not self.ready()
                else:
                    idle = False
                if idle or delivery.due(time.monotonic()):
                    run(self.settle(self.busy()))
                    run(delivery.commit())
            except TransactionAborted as err:
                self.aborted(err)
            counters.committed = delivery.commits
            counters.publish()
        self.words[self.entry + 4] = 0

    def idle_timeout(self) -> float:
        now = time.monotonic()
        timeout = _IDLE_POLL_S
        if self.parked:
            timeout = min(timeout, min(self.parked.values()) - now)
        return max(0.0, timeout)

    def busy(self) -> set:
        """Partitions with records taken and not handled."""
        return set(self.pending)

    def ready(self) -> bool:
        """Some partition has records to handle now."""
        return any(tp not in self.parked for tp in self.pending)

    def take(self, tp: mq.TopicPartition, records: list) -> None:
        # Where the group would resume this partition: where a rewind goes back to.
        self.delivery.committed.setdefault(tp, records[0].offset)
        work = self.pending.get(tp)
        if work is None:
            self.pending[tp] = [records, 0]
        else:
            work[0] = work[0][work[1]:] + records
            work[1] = 0
        if len(self.pending[tp][0]) >= self.config.max_poll_records:
            self.consumer.pause(tp)

    def work(self) -> bool:
        """Handle what is ready; True if any record was finished."""
        if not self.pending:
            return False
        finished = False
        now = time.monotonic()
        for tp in list(self.pending):
            if self.draining():
                break
            due = self.parked.get(tp)
            if due is not None:
                if due > now:
                    continue
                del self.parked[tp]
            work = self.pending.get(tp)
            if work is None:                     # revoked inside a commit
                continue
            finished |= self.run_partition(tp, work)
            if work[1] >= len(work[0]) and self.pending.get(tp) is work:
                del self.pending[tp]
                if tp in self.consumer.paused():
                    self.consumer.resume(tp)
        return finished

    def run_partition(self, tp: mq.TopicPartition, work: list) -> bool:
        """Handle ``tp``'s records from ``work``'s index until done, parked or draining."""
        records, i = work
        n = len(records)
        w, e = self.words, self.entry
        handler, counters, delivery = self.handler, self.counters, self.delivery
        run, send = self.run_op, self.send
        w[e] = self.topic_index[tp.topic]
        w[e + 1] = tp.partition
        suspects = self.suspects
        start = i
        while i < n:
            r = records[i]
            isolate = False
            if suspects or tp in self.tries:
                refusal = self.take_refusal(r) if self.refusals else None
                if refusal is not None and refusal != "isolate":
                    self.tries.pop(tp, None)
                    if refusal[0] == "dead":
                        run(self.give_up(r, refusal[1], 1))
                    else:
                        self.skip(r)
                    i += 1
                    delivery.done[tp] = r.offset + 1
                    continue
                if refusal == "isolate":             # exactly once: its own transaction
                    isolate = True
                    run(delivery.commit())
                verdict = self.start_checked(tp, r)
                if verdict is _WAIT:
                    work[1] = i
                    return i > start
                if verdict is _DEAD:
                    i += 1                           # dead-lettered without an attempt
                    delivery.done[tp] = r.offset + 1
                    continue
                attempt = self.tries[tp][0] + 1 if tp in self.tries else 1
            else:
                attempt = 1
            w[e + 2] = r.offset
            w[e + 3] = attempt
            t0 = _monotonic_ns()
            w[e + 4] = t0
            error = None
            try:
                out = handler(r)
                outputs = None if out is None else delivery.normalize(out)
            except Exception as err:            # noqa: BLE001 -- the handler's failure
                error = err
            w[e + 4] = 0
            counters.handler_ns += _monotonic_ns() - t0
            if error is None and outputs:
                try:
                    rest = delivery.send_now(outputs, r, send)
                    if rest is not None:
                        run(rest)                   # exactly once: raises
                except BadOutput as err:            # TransactionAborted instead
                    error = err
            if error is not None:
                if self.failed(tp, r, attempt, error):
                    work[1] = i
                    return i > start                 # parked: its head waits
            else:
                counters.handled += 1
                if attempt > 1:
                    self.tries.pop(tp, None)
                    self.hint_done(r)
                if self.topic_waits:
                    self.topic_waits.pop(tp, None)
                if isolate:
                    delivery.done[tp] = r.offset + 1
                    run(delivery.commit())           # raises TransactionAborted if it was it
                    self.isolated(r)
            i += 1
            delivery.done[tp] = r.offset + 1
            if self.draining():
                break
        work[1] = i
        return i > start

    def start_checked(self, tp: mq.TopicPartition, r):
        """Before an attempt: take up the attempts that failed elsewhere. ``_DEAD`` when none
        is left (it was dead-lettered), ``_WAIT`` when its
        backoff is not over (the partition is parked), else ``_GO``."""
        if tp not in self.tries:
            prior, error, not_before = self.prior_attempts(r)
            if prior:
                self.tries[tp] = (prior, error or "")
                wait = (not_before - _monotonic_ns()) / 1e9
                if wait > 0 and prior < self.config.max_attempts:
                    self.parked[tp] = time.monotonic() + wait
                    return _WAIT
        if tp in self.tries and self.tries[tp][0] >= self.config.max_attempts:
            attempts, error = self.tries.pop(tp)
            self.run_op(self.give_up(r, error, attempts))
            return _DEAD
        return _GO

    def failed(self, tp: mq.TopicPartition, r, attempt: int, err: Exception) -> bool:
        """Attempt ``attempt`` of ``r`` raised: True if the partition is parked for a retry,
        False if the record is done (dead-lettered or skipped). A missing output topic parks
        it without counting the attempt (``tries`` stays as it was)."""
        if isinstance(err, MissingOutputTopic):
            waits = self.topic_waits[tp] = self.topic_waits.get(tp, 0) + 1
            self.parked[tp] = time.monotonic() + self.wait_for_topic(r, err, waits)
            return True
        self.counters.failed += 1
        text = f"BadOutput: {err}" if isinstance(err, BadOutput) else error_text(err)
        if attempt < self.config.max_attempts:
            delay = self.backoff(attempt)
            self.tries[tp] = (attempt, text)
            self.hint_failed(r, attempt, delay)
            self.parked[tp] = time.monotonic() + delay
            self.counters.retried += 1
            log.warning("attempt %d of %d failed, retrying in %.0f ms: %s", attempt,
                        self.config.max_attempts, delay * 1000, text, extra=record_fields(r),
                        exc_info=log.isEnabledFor(logging.DEBUG))
            if self.delivery.eos:
                self.run_op(self.delivery.commit())  # keep the transaction short
            return True
        self.tries.pop(tp, None)
        self.run_op(self.give_up(r, text, attempt))
        return False

    # --- partitions come and go ---------------------------------------------------------------
    def revoked(self, tps) -> Op[None]:
        try:
            yield from self.settle(self.busy())
            yield from self.delivery.revoked(tps)
        finally:
            self.drop(tps)

    def lost(self, tps) -> Op[None]:
        yield from self.delivery.lost()
        self.drop(list(self.pending) + list(tps))

    def drop(self, tps) -> None:
        for tp in tps:
            self.pending.pop(tp, None)
            self.parked.pop(tp, None)
            self.tries.pop(tp, None)
            self.topic_waits.pop(tp, None)

    def rewind(self) -> None:
        """A transaction was aborted: read every partition again from its committed
        position."""
        self.seek_committed(set(self.pending) | set(self.delivery.done))
        self.drop(list(self.pending))
