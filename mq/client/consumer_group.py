"""The consumer's group part: subscription, reconciliation and commits, on the poll thread.

``ConsumerGroup`` is handed the ``ConsumerDriver`` (the session: commits and offset fetches go
through its connection) and the ``Fetcher`` (the cursors it starts, drops and reads positions
of). The group member (``membership.py``: a sans-I/O ``GroupMember`` driven by the heartbeat
thread) says what the broker assigned; each pass of ``poll`` first calls ``round``: callbacks of
finished async commits, a due auto-commit, and — when the member's assignment changed —
reconciliation: revoke (commit, ``on_partitions_revoked``, stop reading), then start the new
partitions at their committed offsets (``on_partitions_assigned``); each step is reported to
the broker at once, so a partition's next owner can start as soon as this one let go.

Invariants:

- A partition moves only after its old owner stopped reading it (revocations are reported
  after ``on_partitions_revoked`` returned and the cursor is gone).
- A ``read_committed`` consumer does not start a partition whose newer offsets an unfinished
  transaction holds (the previous owner's commit under way): its cursor is *held* and asked
  for again each round, with backoff, until the transaction ends (KIP-447).
- Commits carry the member id and epoch; the broker rejects a commit from a fenced member. A
  member's commit refused for its id or epoch — the epoch moved while it was in flight, or the
  broker restarted and the member has not rejoined it yet (the broker keeps no members across
  a restart) — or cut off by the broker going away waits for the member's next heartbeat reply
  and goes again with its id and epoch, within the request timeout, if the member held the
  partitions all along; otherwise it raises ``CommitFailedError`` (``group_member.py``). So a
  commit rides out a broker restart, as Kafka's ``commitSync`` rides out a coordinator
  failover. Offsets committed are *positions*: the offset of the next record to process.
- Async commits' callbacks run in commit order, inside a later ``poll``, ``commit`` or
  ``close``.

The steps that talk to the broker or wait (a round, a commit, leaving, a committed offset)
are written once, without I/O, as generators of steps (``GroupOp``): a list of requests
(sent their replies, the first error thrown in), a backoff in seconds, or one of the small
step types below (``Notify``, ``FRESH_METADATA``, ``Joined``, ``CommitRetry``,
``SendCommit``). ``run`` drives them for the threaded consumer, on its poll thread;
``mq.aio.Consumer`` awaits the same ones. A request that failed with
``BrokerUnavailableError`` drops the session, and the next request reconnects (one attempt).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from mq import errors
from mq.client.admin_ops import committed_offsets, first_error
from mq.client.membership import ConsumerRebalanceListener, Membership
from mq.client.types import ConsumerGroupMetadata, TopicPartition
from mq.protocol.messages import Api

__all__ = ["FRESH_METADATA", "CommitCallback", "ConsumerGroup", "ConsumerRebalanceListener",
           "CommitRetry", "GroupOp", "Joined", "Notify", "SendCommit"]

log = logging.getLogger("mq.client.consumer")

_UNSTABLE_BACKOFF_S = (0.01, 0.2)   # asking again for offsets a transaction holds: first, most
_EMPTY: frozenset[TopicPartition] = frozenset()
CommitCallback = Callable[[dict[TopicPartition, int], Exception | None], None]
T = TypeVar("T")
GroupOp = Generator[Any, Any, T]


class Notify(NamedTuple):
    """Call the rebalance listener's ``method`` with ``partitions``; sent back what it raised
    (or None). A coroutine method is awaited (``mq.aio.Consumer``)."""
    method: str
    partitions: frozenset


class Joined(NamedTuple):
    """Wait up to ``timeout`` seconds for the member's first heartbeat reply."""
    timeout: float


class CommitRetry(NamedTuple):
    """A member's commit of ``partitions`` was refused or cut off: ask for a heartbeat and
    wait up to ``timeout`` for ``GroupMember.retry_commit(partitions, first, last)``; sent
    back its ``(member id, epoch, replies)``, or None on timeout; what it raised
    (``CommitFailedError``, the member's fatal error) is thrown in."""
    partitions: frozenset
    first: int
    last: int
    timeout: float


class SendCommit(NamedTuple):
    """An offset commit whose outcome goes to ``ConsumerGroup.commit_done`` (the threaded
    consumer sends it and reads the reply in a later round)."""
    plain: dict
    items: list
    callback: CommitCallback | None
    auto: bool


FRESH_METADATA = "fresh metadata"           # the driver's topics, refreshed if they changed


class ConsumerGroup:
    """Group state of one consumer (module doc). ``group_id`` None: no group (only
    ``commit`` raises, and async commit replies are still routed)."""

    def __init__(self, driver, fetcher, *, group_id: str | None, read_committed: bool,
                 enable_auto_commit: bool, listener: ConsumerRebalanceListener | None,
                 instance_id: str | None, assignor: str | None, session_timeout_ms: int,
                 max_poll_interval_ms: int, auto_commit_interval_ms: int,
                 membership_type: type = Membership) -> None:
        self._driver = driver
        self._membership_type = membership_type
        self._fetcher = fetcher
        self.group_id = group_id
        self.read_committed = read_committed
        self.enable_auto_commit = enable_auto_commit
        self.listener = listener or ConsumerRebalanceListener()
        self.instance_id = instance_id
        self.assignor = assignor
        self.session_timeout_ms = session_timeout_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.membership: Any = None         # a Membership (or mq.aio's AsyncMembership)
        self._seen_version = -1
        # request id -> [offsets, callback, is an auto-commit, reply or None], in commit order:
        # callbacks run in that order, as Kafka's do, though a failed commit is answered
        # before an earlier one that waits for its fsync.
        self.async_commits: dict[int, list] = {}
        self._last_committed: dict[TopicPartition, int] = {}
        # read_committed: assigned partitions held for a transaction's offsets, and when to ask
        # again
        self.held: set[TopicPartition] = set()
        self.retry_held_at = 0.0
        self._held_backoff = _UNSTABLE_BACKOFF_S[0]
        self._next_auto_commit = time.monotonic() + auto_commit_interval_ms / 1000

    # --- membership -----------------------------------------------------------------------------
    def join(self, topics: list[str], pattern: str | None) -> None:
        """Join the group (start the heartbeat thread), or change the subscription."""
        if self.membership is not None:
            self.membership.subscribe(topics, pattern)
            return
        self.membership = self._membership_type(
            self._driver.socket_path, self.group_id, topics=topics, pattern=pattern,
            instance_id=self.instance_id, assignor=self.assignor,
            session_timeout_ms=self.session_timeout_ms,
            max_poll_interval_ms=self.max_poll_interval_ms,
            request_timeout=self._driver.timeout, wake=self._driver.interrupt)
        self._seen_version = -1
        self.membership.start()

    def leave(self) -> None:
        """Leave the group: commit (auto-commit), ``on_partitions_revoked``, stop the
        heartbeat thread."""
        m = self.membership
        if m is None:
            return
        try:
            self.run(self._driver.session, self.leaving(m))
        finally:
            self.membership = None
            m.leave()

    def leaving(self, m) -> GroupOp[None]:
        """Before ``m`` leaves: commit (auto-commit) and ``on_partitions_revoked``. Errors are
        logged: a closing consumer never leaves half-way."""
        owned = frozenset(self._fetcher.cursors)
        try:
            if self.enable_auto_commit and owned and self._driver.session is not None:
                # no waiting for a broker that is gone: closing does not block
                yield from self.committing(self._changed_positions(owned), m, timeout=0.0)
            if owned:
                err = yield Notify("on_partitions_revoked", owned)
                if err is not None:
                    raise err
        except Exception as err:            # closing: report, never leave the group half-way
            log.warning("group %s: while leaving: %s", self.group_id, err)

    def changed(self) -> bool:
        """The member's assignment changed since the last reconciliation."""
        m = self.membership
        return m is not None and m.version != self._seen_version

    # --- the poll-thread round ------------------------------------------------------------------
    def round(self, session) -> None:
        """Before each read of ``poll``: commit callbacks, then ``rounds``."""
        if self.async_commits:
            for reply in session.conn.ready():
                self.on_reply(reply)
        if self.membership is not None:
            self.run(session, self.rounds())

    def rounds(self) -> GroupOp[None]:
        """Auto-commit, reconciliation, held partitions. Raises a listener's error once
        reconciliation is done, and the member's fatal error."""
        m = self.membership
        if self.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.auto_commit_interval_ms / 1000
            changed = self._changed_positions(self._fetcher.cursors)
            if changed:
                yield SendCommit(*self._commit_items(changed), None, True)
        if m.version != self._seen_version:
            yield from self._reconcile(m)
        if self.held and time.monotonic() >= self.retry_held_at:
            yield from self._settle_held()

    def _reconcile(self, m) -> GroupOp[None]:
        fetcher, driver = self._fetcher, self._driver
        owned = frozenset(fetcher.cursors)
        version, target, lost, error = m.reconciling(owned)
        if error is not None:
            raise error
        failures: list[Exception] = []
        if lost:
            self._drop(owned)
            m.set_owned(_EMPTY, lost_handled=True)
            if owned:
                failures.append((yield Notify("on_partitions_lost", owned)))
            owned = _EMPTY
        revoked = owned - target
        if revoked:
            fetcher.rewind(revoked)
            if self.enable_auto_commit:
                yield FRESH_METADATA
                alive = [tp for tp in revoked if tp.topic in driver.topics]   # not deleted
                try:
                    yield from self.committing(self._changed_positions(alive), m)
                except errors.MQError as err:
                    log.warning("group %s: commit before revoking failed: %s", self.group_id,
                                err)
            failures.append((yield Notify("on_partitions_revoked", revoked)))
            self._drop(revoked)
            owned -= revoked
            m.set_owned(owned)
        added = target - owned
        if added:
            yield FRESH_METADATA
            topics = driver.topics
            added = frozenset(tp for tp in added if tp.topic in topics and
                              tp.partition < topics[tp.topic]["partitions"])
            committed, unstable = yield from self._fetch_committed(added)
            fetcher.assign([c.tp for c in fetcher.order] + sorted(added))
            for tp in added:
                if tp in unstable:
                    self._hold(tp)
                else:
                    self.start(tp, committed.get(tp))
            owned |= added
            failures.append((yield Notify("on_partitions_assigned", added)))
        m.reconciled(owned)
        self._seen_version = version
        failures = [err for err in failures if err is not None]
        if failures:
            raise failures[0]

    def start(self, tp: TopicPartition, committed: int | None) -> None:
        """Start reading ``tp`` at its committed offset (or by ``auto_offset_reset``)."""
        self.held.discard(tp)
        self._fetcher.start(tp, committed)
        if committed is not None:
            self._last_committed[tp] = committed

    def _hold(self, tp: TopicPartition) -> None:
        """An unfinished transaction holds newer offsets of ``tp``: starting at the committed
        offset would read again what that transaction consumed once it commits. Leave it
        without a position (not read) and ask again shortly."""
        if not self.held:
            self._held_backoff = _UNSTABLE_BACKOFF_S[0]
            self.retry_held_at = time.monotonic() + self._held_backoff
        self.held.add(tp)
        self._fetcher.hold(tp)
        log.debug("group %s: %s-%d waits for a transaction's offsets", self.group_id, *tp)

    def _settle_held(self) -> GroupOp[None]:
        """Ask again for the held partitions' offsets; start those now settled."""
        waiting = self.held & self._fetcher.held()
        committed, unstable = (yield from self._fetch_committed(waiting)) if waiting \
            else ({}, set())
        for tp in waiting - unstable:
            self.start(tp, committed.get(tp))
        self.held = unstable
        self._held_backoff = min(self._held_backoff * 2, _UNSTABLE_BACKOFF_S[1])
        self.retry_held_at = time.monotonic() + self._held_backoff

    def _drop(self, tps: Iterable[TopicPartition]) -> None:
        tps = set(tps)
        fetcher = self._fetcher
        fetcher.rewind(tps)
        fetcher.assign([c.tp for c in fetcher.order if c.tp not in tps])
        for tp in tps:
            self._last_committed.pop(tp, None)
        self.held -= tps

    def notify(self, step: Notify) -> Exception | None:
        """Call the listener's method (the threaded consumer's ``Notify``); what it raised."""
        try:
            getattr(self.listener, step.method)(set(step.partitions))
        except Exception as err:           # raised from poll once reconciliation is done
            log.exception("group %s: %s raised", self.group_id, step.method)
            return err
        return None

    # --- commits --------------------------------------------------------------------------------
    def _changed_positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: pos for tp, pos in self._fetcher.positions(tps).items()
                if self._last_committed.get(tp) != pos}

    def _commit_items(self, offsets: Mapping | None) -> tuple[dict[TopicPartition, int], list]:
        if self.group_id is None:
            raise ValueError("committing needs a group_id")
        if offsets is None:
            offsets = self._fetcher.positions(self._fetcher.cursors)
        plain, items = {}, []
        for tp, value in offsets.items():
            tp = TopicPartition(*tp)
            offset, metadata = (value, "") if isinstance(value, int) else \
                (value[0], value[1] or "")
            if not isinstance(offset, int) or offset < 0 or not isinstance(metadata, str):
                raise ValueError(f"bad offset for {tp}: {value!r} (an int >= 0, or "
                                 "(offset, metadata str))")
            plain[tp] = offset
            items.append([tp.topic, tp.partition, offset, -1, metadata])
        return plain, items

    def metadata(self) -> ConsumerGroupMetadata:
        """Group id, member id and member epoch (Kafka's ``groupMetadata()``)."""
        if self.group_id is None:
            raise ValueError("group_metadata() needs a consumer with a group_id")
        m = self.membership
        member_id, epoch = m.commit_identity() if m is not None else ("", -1)
        return ConsumerGroupMetadata(self.group_id, member_id, epoch, self.instance_id)

    def commit(self, offsets: Mapping | None) -> None:
        """Commit and wait (``Consumer.commit``)."""
        self.run(self._driver.require(), self.committing(offsets, self.membership))

    def committing(self, offsets: Mapping | None, m,
                   timeout: float | None = None) -> GroupOp[None]:
        """Commit ``offsets`` (None: every position) and wait for the broker. A member's
        commit goes again while refused for its id or epoch or cut off, for up to
        ``timeout`` (default: the request timeout; module doc). Raises ``CommitFailedError``
        when the member lost a partition meanwhile, else the last error on timeout."""
        plain, items = self._commit_items(offsets)
        if not items:
            return
        if m is None:
            yield [(Api.OFFSET_COMMIT, self.group_id, "", -1, items)]
            self._last_committed.update(plain)
            return
        timeout = self._driver.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        yield Joined(timeout)                # a member's commit needs its id and epoch
        member_id, epoch, first = m.commit_stamp()
        last = first
        while True:
            try:
                yield [(Api.OFFSET_COMMIT, self.group_id, member_id, epoch, items)]
            except (errors.StaleMemberEpochError, errors.UnknownMemberIdError,
                    errors.BrokerUnavailableError):
                retry = yield CommitRetry(frozenset(plain), first, last,
                                          max(0.0, deadline - time.monotonic()))
                if retry is None:
                    raise
                member_id, epoch, last = retry
                continue
            self._last_committed.update(plain)
            return

    def commit_async(self, offsets: Mapping | None, callback: CommitCallback | None) -> None:
        """Send a commit without waiting (``Consumer.commit_async``)."""
        self._send_commit(offsets, callback, auto=False)

    def _send_commit(self, offsets: Mapping | None, callback: CommitCallback | None,
                     auto: bool) -> None:
        self.send_commit(SendCommit(*self._commit_items(offsets), callback, auto))

    def send_commit(self, step: SendCommit) -> None:
        """Send a commit without waiting; its reply is read in a later round."""
        plain, items, callback, auto = step
        if not items:
            return
        session = self._driver.require()
        m = self.membership
        member_id, epoch = m.commit_identity() if m is not None else ("", -1)
        rid = session.conn.send(Api.OFFSET_COMMIT, self.group_id, member_id, epoch, items)
        self.async_commits[rid] = [plain, callback, auto, None]

    def on_reply(self, reply) -> None:
        """A reply that arrived outside a call: an async commit's, or a WAIT's error."""
        pending = self.async_commits.get(reply.request_id)
        if pending is None:
            if reply.error_code:
                raise errors.error_for_code(reply.error_code, reply.error_message or "")
            return
        pending[3] = reply
        while self.async_commits:
            rid, first = next(iter(self.async_commits.items()))
            if first[3] is None:
                return                      # an earlier commit is still in flight
            del self.async_commits[rid]
            self.commit_done(*first)

    def commit_done(self, plain: dict, callback: CommitCallback | None, auto: bool,
                    reply) -> None:
        """A sent commit's reply: remember what it committed, or report its error."""
        err = errors.error_for_code(reply.error_code, reply.error_message or "") \
            if reply.error_code else None
        if err is None:
            self._last_committed.update(plain)
        elif auto and isinstance(err, errors.StaleMemberEpochError):
            # An auto-commit that crossed an epoch change: commit again at the next poll,
            # with the epoch the heartbeat brought (positions only move forward).
            self._next_auto_commit = time.monotonic()
        elif callback is None:
            log.warning("group %s: %scommit failed: %s", self.group_id,
                        "auto-" if auto else "async ", err)
        if callback is not None:
            callback(plain, err)

    def finish_async_commits(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the async commits in flight (closing)."""
        deadline = time.monotonic() + timeout
        session = self._driver.session
        while self.async_commits and session is not None and time.monotonic() < deadline:
            try:
                replies = session.conn.poll_any(max(0.0, deadline - time.monotonic()))
            except errors.MQError:
                break
            for reply in replies:
                self.on_reply(reply)

    def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset for ``tp``, waiting (up to the request timeout) for a
        transaction holding it. Raises ``UnstableOffsetCommitError``."""
        return self.run(self._driver.require(), self.committed_offset(tp))

    def committed_offset(self, tp: TopicPartition) -> GroupOp[int | None]:
        if self.group_id is None:
            raise ValueError("committed() needs a group_id")
        deadline = time.monotonic() + self._driver.timeout
        backoff = _UNSTABLE_BACKOFF_S[0]
        while True:
            committed, unstable = yield from self._fetch_committed([tp])
            if not unstable:
                return committed.get(tp)
            if time.monotonic() + backoff > deadline:
                raise errors.UnstableOffsetCommitError(
                    f"{tp.topic}-{tp.partition}: an unfinished transaction still holds the "
                    f"group's newer offsets")
            yield backoff
            backoff = min(backoff * 2, _UNSTABLE_BACKOFF_S[1])

    def _fetch_committed(self, tps: Iterable[TopicPartition]
                         ) -> GroupOp[tuple[dict[TopicPartition, int], set[TopicPartition]]]:
        """Committed offsets, and (``read_committed``) the partitions an unfinished
        transaction's offsets hold."""
        tps = list(tps)
        if not tps:
            return {}, set()
        return (yield from committed_offsets(self.group_id, tps,
                                             require_stable=self.read_committed))

    # --- the threaded consumer's runner ---------------------------------------------------------
    def run(self, session, op: GroupOp[T]) -> T:
        """Drive ``op`` on the poll thread: requests over ``session``'s connection (pipelined;
        every reply collected before the first error is thrown in; after the connection
        broke, over a new session), listeners called, membership waits and backoffs
        blocking."""
        m = self.membership
        try:
            step = next(op)
            while True:
                if isinstance(step, list):
                    try:
                        if session is None:
                            session = self._driver.require()   # one attempt
                        conn = session.conn
                        rids = [conn.send(api, *fields, claim=True) for api, *fields in step]
                        replies = [conn.wait_raw(rid) for rid in rids]
                    except (errors.MQError, TimeoutError, OSError) as err:
                        if isinstance(err, errors.BrokerUnavailableError):
                            self._driver.lost()
                            session = None
                        step = op.throw(err)          # the broker went away, say
                        continue
                    err = first_error(replies)
                    step = op.send(replies) if err is None else op.throw(err)
                    continue
                value = None
                if isinstance(step, float):
                    time.sleep(step)
                elif isinstance(step, Notify):
                    value = self.notify(step)
                elif step is FRESH_METADATA:
                    if session is None:
                        session = self._driver.require()
                    self._driver.check_metadata(session)
                elif isinstance(step, Joined):
                    if m is not None:
                        m.joined.wait(step.timeout)
                elif isinstance(step, CommitRetry):
                    try:
                        value = m.wait_commit_retry(*step)
                    except errors.MQError as err:     # CommitFailedError, or the member's
                        step = op.throw(err)          # fatal error
                        continue
                elif isinstance(step, SendCommit):
                    self.send_commit(step)
                else:
                    raise AssertionError(f"unknown group step {step!r}")
                step = op.send(value)
        except StopIteration as stop:
            return stop.value
