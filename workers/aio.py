"""The child's loop for an ``async def`` handler: one event loop, up to ``concurrency`` records
in flight, each key's records (``ordering="key"``, the default) or each partition's
(``ordering="partition"``) one after another in offset order.

Scheduling: records taken from a poll wait in their partition's queue. A waiting record starts
when a place is free and no earlier record of its key (or of its partition) is still waiting
or running; records without a key never wait for each other. A record runs as one task: its
attempts one after another, each under ``asyncio.timeout(handler_timeout_s)`` (an expired one
is a failed attempt, ``HandlerTimeout``), with the backoff between them awaited, so a failing
record holds back its key and nothing else. The supervisor kills the child only if the loop
itself stops turning (a blocking call inside the handler) past the timeout plus a grace.

Completion is out of order, commits are not: a partition's done position moves over the
longest run of finished records from its first unfinished one (``release``). At least once, a
record's outputs are sent when its attempt succeeds (by its task), its dead letter when its
task ends; exactly once both are sent when the record is released, in offset order, so a
transaction never holds the outputs of a record whose offset it does not commit. Finished
tasks are released by the loop (``finish``), never from a callback: releasing may await.

The clients are ``mq.aio``'s (``clients.AsyncClients``): the loop awaits the broker — polls,
flushes, commits, transactions, revocations (the rebalance listener's methods are awaited
inside ``getmany``) — and never blocks on it, so running handlers go on meanwhile, and the
child has no thread but the loop's. A commit is a task of its own: while it runs, the loop
starts the records it already holds, and releases and polls nothing (so no revocation and no
send of a release comes between the commit's steps). The task awaits the commit itself (a
synchronous one), never hands it to a task of the clients' that outlives it: such a task's
request could reach the consumer after the next poll, whose revocation commits newer positions
first, and then move the group's committed offsets back (the next owner handles those records
again). The loop awaits a poll of up to
``_IDLE_POLL_S`` only when no task runs; otherwise it polls without waiting and waits for a
task to finish for at most ``_BUSY_WAIT_S`` (a new record waits that long at most for a free
place to be noticed).
A revocation lets the revoked partitions' running records finish (for most of
``drain_timeout_s``) and releases them before their done positions are committed, then cancels
what still runs; an aborted transaction cancels every task and reads again from the committed
positions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import mq
from workers.clients import Op
from workers.delivery import BadOutput, MissingOutputTopic, TransactionAborted
from workers.failures import error_text
from workers.handling import Base
from workers.logs import record_fields

__all__ = ["AsyncEngine"]

log = logging.getLogger("workers.aio")

_IDLE_POLL_S = 0.1
_BUSY_WAIT_S = 0.005
_REVOKE_WAIT_S = 0.002      # a revocation looks this often for its records to finish
_monotonic_ns = time.monotonic_ns


class _Partition:
    """One assigned partition's records between poll and commit."""

    __slots__ = ("waiting", "outstanding", "finished", "running")

    def __init__(self) -> None:
        self.waiting: collections.deque = collections.deque()    # records not started
        self.outstanding: collections.deque[int] = collections.deque()   # taken, unreleased
        self.finished: dict[int, tuple] = {}                     # offset -> what to release
        self.running = 0


class AsyncEngine(Base):
    """The loop of a child with an ``async def`` handler (see the module doc)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.parts: dict[mq.TopicPartition, _Partition] = {}
        self.tasks: dict[asyncio.Task, tuple[mq.TopicPartition, int]] = {}
        self.free = list(range(self.config.concurrency))
        self.keys: dict[tuple, int] = collections.Counter()    # (tp, key) running or held
        self.by_key = self.config.ordering == "key"
        self.ended: list[tuple] = []            # (task, tp, partition, record) to finish
        self.words = self.table.words
        for i in self.free:
            self.words[self.table.inflight_entry(self.slot, i) + 4] = 0

    async def run(self) -> None:
        """Until ``draining()``; then the running records finish (or are cancelled). A commit
        is a task: meanwhile the loop goes on starting the records it holds, and releases
        nothing and polls nothing (no revocation comes) until the commit is done."""
        delivery, counters, run = self.delivery, self.counters, self.run_op
        limit = self.config.concurrency
        committing: asyncio.Task | None = None
        while not self.draining():
            self.tick()
            self.refresh_suspects()
            try:
                if committing is not None and committing.done():
                    done, committing = committing, None
                    done.result()               # TransactionAborted, OutputsLost, fenced...
                if committing is None:
                    await run(self.finish())
                self.schedule()
                polled = False
                if committing is None and len(self.tasks) < limit:
                    timeout = 0.0 if self.tasks or self.ready() else _IDLE_POLL_S
                    polled = bool(await run(self.poll(timeout)))
                    self.schedule()
                idle = not polled and not self.tasks
                if committing is None and (idle or delivery.due(time.monotonic())):
                    committing = asyncio.get_running_loop().create_task(self.commit())
            except TransactionAborted as err:
                self.aborted(err)
            counters.committed = delivery.commits
            counters.publish()
            waiting = list(self.tasks) if committing is None else [*self.tasks, committing]
            if waiting:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED,
                                   timeout=_BUSY_WAIT_S if len(self.tasks) < limit and
                                   committing is None else _IDLE_POLL_S)
            else:
                await asyncio.sleep(0)
        if committing is not None:
            try:
                await committing
            except TransactionAborted as err:
                self.aborted(err)
        await self.finish_running()

    async def commit(self) -> None:
        """Move the idle partitions' done positions past what never reaches the handler,
        then commit and wait for the broker's answer (``sync``; a failure is logged and
        left to the next commit, as an async commit's was).

        Not ``commit_async``: ``AsyncClients`` runs that as a task of its own, whose first
        step, not the call, hands the commit to the consumer. When the loop's next turn came
        first (this task ended as the loop woke for a finished record), the loop's poll was
        queued on the consumer's thread ahead of it; that poll's revocation committed the
        partitions' newer positions, and then the stale commit moved them back (seen on mq's
        Kafka listener: 1203, then 1161 for the same partition, whose next owner handled
        1161-1202 again)."""
        await self.run_op(self.settle(self.busy()))
        await self.run_op(self.delivery.commit(sync=True, retry_later=True))

    async def finish_running(self) -> None:
        """Draining: let running records finish for most of ``drain_timeout_s`` (the
        supervisor kills at all of it), cancel the rest; their records stay uncommitted.
        The finished ones are released, for the last commit."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=self.config.drain_timeout_s * 0.8)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
        try:
            await self.run_op(self.finish())
        except TransactionAborted as err:
            self.aborted(err)

    # --- taking and starting records -----------------------------------------------------------
    def busy(self) -> set:
        """Partitions with records taken and not released."""
        return {tp for tp, part in self.parts.items() if part.outstanding}

    def ready(self) -> bool:
        return any(p.waiting for p in self.parts.values())

    def take(self, tp: mq.TopicPartition, records: list) -> None:
        self.delivery.committed.setdefault(tp, records[0].offset)
        part = self.parts.get(tp)
        if part is None:
            part = self.parts[tp] = _Partition()
        part.waiting.extend(records)
        part.outstanding.extend(r.offset for r in records)
        if len(part.waiting) >= self.config.max_poll_records:
            self.consumer.pause(tp)

    def schedule(self) -> None:
        """Start every waiting record that may start (see the module doc)."""
        if not self.free:
            return
        for tp, part in self.parts.items():
            if not part.waiting:
                continue
            if not self.by_key:
                if not part.running:
                    self.start(tp, part, part.waiting.popleft())
                continue
            held: set = set()
            keep = collections.deque()
            while part.waiting:
                r = part.waiting.popleft()
                key = r.key
                if key is not None and (key in held or self.keys[(tp, key)]):
                    held.add(key)
                    keep.append(r)
                elif self.free:
                    self.start(tp, part, r)
                else:
                    keep.append(r)
                    keep.extend(part.waiting)
                    part.waiting.clear()
            part.waiting = keep
            if not self.free:
                return
        for tp, part in self.parts.items():
            if len(part.waiting) < self.config.max_poll_records and tp in self.consumer.paused():
                self.consumer.resume(tp)

    def start(self, tp: mq.TopicPartition, part: _Partition, r) -> None:
        entry = self.free.pop()
        part.running += 1
        if r.key is not None:
            self.keys[(tp, r.key)] += 1
        task = asyncio.get_running_loop().create_task(self.attempts(r, entry))
        self.tasks[task] = (tp, r.offset)
        task.add_done_callback(lambda t, tp=tp, part=part, r=r, entry=entry:
                               self.completed(t, tp, part, r, entry))

    # --- one record ----------------------------------------------------------------------------
    async def attempts(self, r, entry: int) -> tuple:
        """Try ``r`` until it succeeds or its attempts are spent: ``("ok", outputs to send
        at release, a suspect to isolate)``, ``("dead", error, attempts)`` or ``("skip",
        error)``."""
        config, counters, w = self.config, self.counters, self.words
        e = self.table.inflight_entry(self.slot, entry)
        refusal = self.take_refusal(r) if self.refusals else None
        if refusal is not None and refusal != "isolate":   # refused in an aborted txn
            return refusal if refusal[0] == "skip" else ("dead", refusal[1], 1)
        attempt, error, not_before = self.prior_attempts(r)
        if attempt >= config.max_attempts:
            return ("dead", error, attempt)
        if not_before > _monotonic_ns():              # its last owner's backoff
            await asyncio.sleep((not_before - _monotonic_ns()) / 1e9)
        w[e], w[e + 1], w[e + 2] = self.topic_index[r.topic], r.partition, r.offset
        waits = 0                                     # for a missing output topic
        while True:
            attempt += 1
            w[e + 3] = attempt
            t0 = _monotonic_ns()
            w[e + 4] = t0
            cm = asyncio.timeout(config.handler_timeout_s)
            try:
                async with cm:
                    out = await self.handler(r)
                outputs = None if out is None else self.delivery.normalize(out)
                if outputs and not self.delivery.eos:
                    await self.run_op(self.delivery.send_normalized(outputs, r))
                elif outputs and not self.delivery.known(outputs):   # sent when released
                    await self.run_op(self.delivery.learn(outputs))
            except Exception as err:            # noqa: BLE001 -- the handler's failure
                if isinstance(err, MissingOutputTopic) and not cm.expired():
                    attempt, waits = attempt - 1, waits + 1      # not the record's fault
                    w[e + 4] = 0
                    counters.handler_ns += _monotonic_ns() - t0
                    await asyncio.sleep(self.wait_for_topic(r, err, waits))
                    continue
                if cm.expired():
                    text = (f"HandlerTimeout: the handler ran longer than handler_timeout_s="
                            f"{config.handler_timeout_s:g} s")
                elif isinstance(err, BadOutput):
                    text = f"BadOutput: {err}"
                else:
                    text = error_text(err)
                counters.failed += 1
                if attempt >= config.max_attempts:
                    return ("dead", text, attempt)
                delay = self.backoff(attempt)
                self.hint_failed(r, attempt, delay)
                counters.retried += 1
                log.warning("attempt %d of %d failed, retrying in %.0f ms: %s", attempt,
                            config.max_attempts, delay * 1000, text, extra=record_fields(r))
                w[e + 4] = 0
                counters.handler_ns += _monotonic_ns() - t0
                await asyncio.sleep(delay)
                continue
            finally:
                if w[e + 4] == t0:
                    w[e + 4] = 0
                    counters.handler_ns += _monotonic_ns() - t0
            counters.handled += 1
            if attempt > 1:
                self.hint_done(r)
            # At least once the outputs went out above; exactly once release sends them.
            return ("ok", outputs if self.delivery.eos else None, refusal == "isolate")

    def completed(self, task: asyncio.Task, tp: mq.TopicPartition, part: _Partition, r,
                  entry: int) -> None:
        self.tasks.pop(task, None)
        self.free.append(entry)
        self.words[self.table.inflight_entry(self.slot, entry) + 4] = 0
        if self.parts.get(tp) is not part:
            return                              # revoked or rewound meanwhile: dropped
        part.running -= 1
        if r.key is not None:
            key = (tp, r.key)
            self.keys[key] -= 1
            if not self.keys[key]:
                del self.keys[key]
        if not task.cancelled():
            self.ended.append((task, tp, part, r))

    def finish(self) -> Op[None]:
        """Take up the tasks that ended: at least once, dead-letter a record now; release
        what may be. A task's unexpected error (a bug) is raised."""
        ended, self.ended = self.ended, []
        for task, tp, part, r in ended:
            if self.parts.get(tp) is not part:
                continue                        # revoked or rewound meanwhile: dropped
            result = task.result()
            if result[0] == "dead" and not self.delivery.eos:
                yield from self.give_up(r, result[1], result[2])
                result = ("released",)
            elif result[0] == "skip":
                self.skip(r)
                result = ("released",)
            part.finished[r.offset] = (result, r)
            yield from self.release(tp, part)

    def release(self, tp: mq.TopicPartition, part: _Partition) -> Op[None]:
        """Move the done position over finished records from the first unfinished one. A
        suspect of a refused output (exactly once) gets a transaction of its own."""
        delivery = self.delivery
        while part.outstanding and part.outstanding[0] in part.finished:
            offset = part.outstanding.popleft()
            result, r = part.finished.pop(offset)
            if result[0] == "ok" and result[1]:
                isolate = result[2]
                if isolate:
                    yield from delivery.commit()      # what came before, without it
                yield from delivery.send_normalized(result[1], r)    # exactly once: in order
                if isolate:
                    delivery.done[tp] = offset + 1
                    yield from delivery.commit()      # raises TransactionAborted if it was it
                    self.isolated(r)
            elif result[0] == "dead":
                yield from self.give_up(r, result[1], result[2])
            delivery.done[tp] = offset + 1

    # --- partitions come and go ---------------------------------------------------------------
    def cancel(self, tps) -> None:
        tps = set(tps)
        for task, (tp, _) in list(self.tasks.items()):
            if tp in tps:
                task.cancel()
        for tp in tps:
            self.parts.pop(tp, None)
            for key in [k for k in self.keys if k[0] == tp]:
                del self.keys[key]

    def revoked(self, tps) -> Op[None]:
        """The revoked partitions' running records may finish (for most of
        ``drain_timeout_s``, as in a drain) and are released before the commit, so their next
        owner repeats none of them; what is still running then is cancelled."""
        tps = set(tps)
        deadline = time.monotonic() + self.config.drain_timeout_s * 0.8
        while any(tp in tps for tp, _ in self.tasks.values()) and time.monotonic() < deadline:
            yield ("sleep", _REVOKE_WAIT_S)
        yield from self.finish()
        busy = self.busy()
        self.cancel(tps)
        yield from self.settle(busy)
        yield from self.delivery.revoked(tps)

    def lost(self, tps) -> Op[None]:
        self.cancel(list(self.parts) + list(tps))
        yield from self.delivery.lost()

    def rewind(self) -> None:
        """A transaction was aborted: drop every task's result and read every partition
        again from its committed position."""
        self.seek_committed(list(self.parts))
        self.cancel(list(self.parts))
