"""The group half of ``mq.Consumer``: subscription, reconciliation, commits.

Mixed into ``Consumer``; it runs on the poll thread. ``Membership`` (``membership.py``) is the
heartbeat thread. Each pass of ``poll`` first calls ``_group_round``: callbacks of finished
async commits, a due auto-commit, and — when the heartbeat thread saw the assignment change —
reconciliation: revoke (commit, ``on_partitions_revoked``, stop reading), then start the new
partitions at their committed offsets (``on_partitions_assigned``); each step is reported to
the broker at once, so a partition's next owner can start as soon as this one let go. A
``read_committed`` consumer does not start a partition whose newer offsets an unfinished
transaction holds (the previous owner's commit under way): it asks again each round until the
transaction ends, then starts where it left the offsets.

Commits carry the member id and epoch; the broker rejects a commit from a fenced member. A
commit whose epoch went stale while in flight (the member moved on meanwhile) is retried once
the heartbeat thread has the new epoch, as Kafka's consumer does. Offsets committed are
*positions*: the offset of the next record to process.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping

from mq import errors
from mq.client.admin import fetch_committed
from mq.client.membership import ConsumerRebalanceListener, Membership
from mq.client.types import ConsumerGroupMetadata, TopicPartition
from mq.protocol.messages import Api

__all__ = ["GroupConsumer", "ConsumerRebalanceListener"]

log = logging.getLogger("mq.client.consumer")

_STALE_RETRIES = 5
_UNSTABLE_BACKOFF_S = (0.01, 0.2)   # asking again for offsets a transaction holds: first, most
_EMPTY: frozenset[TopicPartition] = frozenset()
CommitCallback = Callable[[dict[TopicPartition, int], Exception | None], None]


class GroupConsumer:
    """Group methods of ``Consumer`` (see the module doc)."""

    def _init_group(self, *, listener, instance_id: str | None, assignor: str | None,
                    session_timeout_ms: int, max_poll_interval_ms: int,
                    auto_commit_interval_ms: int) -> None:
        if session_timeout_ms <= 0 or max_poll_interval_ms <= 0 or auto_commit_interval_ms <= 0:
            raise ValueError("session_timeout_ms, max_poll_interval_ms and "
                             "auto_commit_interval_ms must be positive")
        self._listener = listener or ConsumerRebalanceListener()
        self.group_instance_id = instance_id
        self.assignor = assignor
        self.session_timeout_ms = session_timeout_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._membership: Membership | None = None
        self._seen_version = -1
        # request id -> [offsets, callback, is an auto-commit, reply or None], in commit order:
        # callbacks run in that order, as Kafka's do, though a failed commit is answered
        # before an earlier one that waits for its fsync.
        self._async_commits: dict[int, list] = {}
        self._last_committed: dict[TopicPartition, int] = {}
        # read_committed: assigned partitions whose committed offset an unfinished transaction
        # holds (no position yet, not read), and when to ask again (KIP-447)
        self._unstable: set[TopicPartition] = set()
        self._unstable_retry_at = 0.0
        self._unstable_backoff = _UNSTABLE_BACKOFF_S[0]
        self._next_auto_commit = time.monotonic() + auto_commit_interval_ms / 1000

    # --- subscription ---------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join (or change the subscription in) the consumer's group: the broker assigns
        partitions of ``topics``, or of every topic whose name matches the regex ``pattern``
        (full match; internal topics never match), including topics created later."""
        self._check_open()
        if self.group_id is None:
            raise ValueError("subscribe() needs a group_id; without one, pass topics to the "
                             "constructor or use assign()")
        topics = [topics] if isinstance(topics, str) else list(topics)
        if bool(topics) == (pattern is not None):
            raise ValueError("subscribe to topic names or to a pattern (exactly one)")
        if not all(isinstance(t, str) and t for t in topics):
            raise ValueError("topic names must be non-empty strings")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"bad subscription pattern {pattern!r}: {err}") from err
        if listener is not None:
            self._listener = listener
        self._subscribed = ()
        if self._membership is not None:
            self._membership.subscribe(topics, pattern)
            return
        if self._fetches:
            self._assign([])
        self._membership = Membership(
            self._socket, self.group_id, topics=topics, pattern=pattern,
            instance_id=self.group_instance_id, assignor=self.assignor,
            session_timeout_ms=self.session_timeout_ms,
            max_poll_interval_ms=self.max_poll_interval_ms, request_timeout=self._timeout,
            wake=self._wake_poll)
        self._seen_version = -1
        self._membership.start()

    def unsubscribe(self) -> None:
        """Leave the group (committing first with auto-commit) and drop every partition."""
        self._check_open()
        self._leave_group()
        self._assign([])

    def _leave_group(self) -> None:
        m, self._membership = self._membership, None
        if m is None:
            return
        owned = set(self._fetches)
        try:
            if self.enable_auto_commit and owned and self._session is not None:
                self._commit_sync(self._changed_positions(owned), m)
            if owned:
                self._listener.on_partitions_revoked(owned)
        except Exception as err:            # closing: report, never leave the group half-way
            log.warning("group %s: while leaving: %s", self.group_id, err)
        finally:
            m.leave()

    def _wake_poll(self) -> None:
        """Called by the heartbeat thread: wake a blocked poll (``Session.interrupt``)."""
        session = self._session
        if session is not None:
            session.interrupt()

    def _group_changed(self) -> bool:
        m = self._membership
        return m is not None and m.version != self._seen_version

    # --- the poll-thread round ------------------------------------------------------------------
    def _group_round(self, session) -> None:
        if self._async_commits:
            for reply in session.conn.ready():
                self._on_reply(reply)
        m = self._membership
        if m is None:
            return
        if self.enable_auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self.auto_commit_interval_ms / 1000
            changed = self._changed_positions(self._fetches)
            if changed:
                self._send_commit(changed, None, auto=True)
        if m.version != self._seen_version:
            self._reconcile(session, m)
        if self._unstable and time.monotonic() >= self._unstable_retry_at:
            self._settle_unstable(session)

    def _reconcile(self, session, m: Membership) -> None:
        owned = frozenset(self._fetches)
        version, target, lost, error = m.reconciling(owned)
        if error is not None:
            raise error
        failures: list[Exception] = []
        if lost:
            self._drop(owned)
            m.set_owned(_EMPTY, lost_handled=True)
            if owned:
                self._notify("on_partitions_lost", owned, failures)
            owned = _EMPTY
        revoked = owned - target
        if revoked:
            self._rewind_iterator(list(revoked))
            if self.enable_auto_commit:
                self._check_metadata(session)
                alive = [tp for tp in revoked if tp.topic in self._topics]   # not deleted
                try:
                    self._commit_sync(self._changed_positions(alive), m)
                except errors.MQError as err:
                    log.warning("group %s: commit before revoking failed: %s", self.group_id,
                                err)
            self._notify("on_partitions_revoked", revoked, failures)
            self._drop(revoked)
            owned -= revoked
            m.set_owned(owned)
        added = target - owned
        if added:
            self._check_metadata(session)
            added = frozenset(tp for tp in added if tp.topic in self._topics and
                              tp.partition < self._topics[tp.topic]["partitions"])
            committed, unstable = self._fetch_committed(session, added)
            self._assign([f.tp for f in self._order] + sorted(added))
            for tp in added:
                if tp in unstable:
                    self._hold_unstable(tp)
                else:
                    self._start_at(tp, committed.get(tp))
            owned |= added
            self._notify("on_partitions_assigned", added, failures)
        m.reconciled(owned)
        self._seen_version = version
        if failures:
            raise failures[0]

    def _start_at(self, tp: TopicPartition, committed: int | None) -> None:
        """Position a newly assigned partition at its committed offset or, without one, by
        ``auto_offset_reset`` (now, as Kafka does: "latest" means the end at assignment time,
        not whenever the partition is first read)."""
        f = self._fetches[tp]
        if committed is not None:
            self._seek(f, committed)
            self._last_committed[tp] = committed
        else:
            self._reset(f, self._state(tp), None)

    def _hold_unstable(self, tp: TopicPartition) -> None:
        """An unfinished transaction holds newer offsets of ``tp``: starting at the committed
        offset would read again what that transaction consumed once it commits. Leave it
        without a position (not read) and ask again shortly."""
        if not self._unstable:
            self._unstable_backoff = _UNSTABLE_BACKOFF_S[0]
            self._unstable_retry_at = time.monotonic() + self._unstable_backoff
        self._unstable.add(tp)
        log.debug("group %s: %s-%d waits for a transaction's offsets", self.group_id, *tp)

    def _settle_unstable(self, session) -> None:
        """Ask again for the held partitions' offsets; start those now settled."""
        waiting = {tp for tp in self._unstable
                   if tp in self._fetches and self._fetches[tp].offset is None}
        committed, unstable = self._fetch_committed(session, waiting) if waiting else ({}, set())
        for tp in waiting - unstable:
            self._start_at(tp, committed.get(tp))
        self._unstable = unstable
        self._unstable_backoff = min(self._unstable_backoff * 2, _UNSTABLE_BACKOFF_S[1])
        self._unstable_retry_at = time.monotonic() + self._unstable_backoff

    def _drop(self, tps: Iterable[TopicPartition]) -> None:
        tps = set(tps)
        self._rewind_iterator(list(tps))
        self._assign([f.tp for f in self._order if f.tp not in tps])
        for tp in tps:
            self._last_committed.pop(tp, None)
        self._unstable -= tps

    def _notify(self, name: str, tps: frozenset[TopicPartition], failures: list) -> None:
        try:
            getattr(self._listener, name)(set(tps))
        except Exception as err:           # raised from poll once reconciliation is done
            log.exception("group %s: %s raised", self.group_id, name)
            failures.append(err)

    # --- commits --------------------------------------------------------------------------------
    def _positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Positions (next offset to return) of these partitions, where known."""
        unyielded: dict[TopicPartition, int] = {}
        for rec in self._unyielded():
            unyielded.setdefault(TopicPartition(rec.topic, rec.partition), rec.offset)
        out = {}
        for tp in tps:
            f = self._fetches.get(tp)
            pos = unyielded.get(tp, None if f is None else f.position)
            if pos is not None:
                out[tp] = pos
        return out

    def _changed_positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: pos for tp, pos in self._positions(tps).items()
                if self._last_committed.get(tp) != pos}

    def _commit_items(self, offsets: Mapping | None) -> tuple[dict[TopicPartition, int], list]:
        if self.group_id is None:
            raise ValueError("committing needs a group_id")
        if offsets is None:
            offsets = self._positions(self._fetches)
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

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group id, member id and member epoch (Kafka's
        ``groupMetadata()``), for ``Producer.send_offsets_to_transaction``. Raises
        ``ValueError`` without a ``group_id``."""
        if self.group_id is None:
            raise ValueError("group_metadata() needs a consumer with a group_id")
        m = self._membership
        member_id, epoch = m.commit_identity() if m is not None else ("", -1)
        return ConsumerGroupMetadata(self.group_id, member_id, epoch, self.group_instance_id)

    def commit(self, offsets: Mapping | None = None) -> None:
        """Commit offsets and wait until the broker has them on disk. Default: the position
        of every assigned partition. ``offsets``: ``{tp: offset}`` or ``{tp: (offset,
        metadata)}``. Raises the broker's error (``StaleMemberEpochError`` after retries,
        ``UnknownMemberIdError``, ``NonEmptyGroupError`` for a group-less consumer of a group
        with live members, ``UnknownTopicOrPartitionError``)."""
        self._check_open()
        self._commit_sync(offsets, self._membership)

    def _commit_sync(self, offsets: Mapping | None, m: Membership | None) -> None:
        plain, items = self._commit_items(offsets)
        if not items:
            return
        session = self._require_session()
        if m is not None:
            m.joined.wait(self._timeout)   # a member's commit needs its member id and epoch
        for attempt in range(_STALE_RETRIES + 1):
            member_id, epoch = m.commit_identity() if m is not None else ("", -1)
            try:
                session.conn.call(Api.OFFSET_COMMIT, self.group_id, member_id, epoch, items)
            except errors.StaleMemberEpochError:
                if m is None or attempt >= _STALE_RETRIES:
                    raise
                m.wait_for_epoch_change(epoch, timeout=1.0)
                continue
            self._last_committed.update(plain)
            return

    def commit_async(self, offsets: Mapping | None = None,
                     callback: CommitCallback | None = None) -> None:
        """Send a commit without waiting; ``callback(offsets, error_or_None)`` runs inside a
        later ``poll``, ``commit`` or ``close``."""
        self._check_open()
        self._send_commit(offsets, callback, auto=False)

    def _send_commit(self, offsets: Mapping | None, callback: CommitCallback | None,
                     auto: bool) -> None:
        plain, items = self._commit_items(offsets)
        if not items:
            return
        session = self._require_session()
        m = self._membership
        member_id, epoch = m.commit_identity() if m is not None else ("", -1)
        rid = session.conn.send(Api.OFFSET_COMMIT, self.group_id, member_id, epoch, items)
        self._async_commits[rid] = [plain, callback, auto, None]

    def _on_reply(self, reply) -> None:
        """A reply that arrived outside a call: an async commit's, or a WAIT's error."""
        pending = self._async_commits.get(reply.request_id)
        if pending is None:
            if reply.error_code:
                raise errors.error_for_code(reply.error_code, reply.error_message or "")
            return
        pending[3] = reply
        while self._async_commits:
            rid, first = next(iter(self._async_commits.items()))
            if first[3] is None:
                return                      # an earlier commit is still in flight
            del self._async_commits[rid]
            self._complete_commit(*first)

    def _complete_commit(self, plain: dict, callback: CommitCallback | None, auto: bool,
                         reply) -> None:
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

    def _finish_async_commits(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        session = self._session
        while self._async_commits and session is not None and time.monotonic() < deadline:
            try:
                replies = session.conn.poll_any(max(0.0, deadline - time.monotonic()))
            except errors.MQError:
                break
            for reply in replies:
                self._on_reply(reply)

    def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset for ``partition`` (None if it has none)."""
        self._check_open()
        if self.group_id is None:
            raise ValueError("committed() needs a group_id")
        tp = TopicPartition(*partition)
        deadline = time.monotonic() + self._timeout
        backoff = _UNSTABLE_BACKOFF_S[0]
        while True:
            committed, unstable = self._fetch_committed(self._require_session(), [tp])
            if not unstable:
                return committed.get(tp)
            if time.monotonic() + backoff > deadline:
                raise errors.UnstableOffsetCommitError(
                    f"{tp.topic}-{tp.partition}: an unfinished transaction still holds the "
                    f"group's newer offsets")
            time.sleep(backoff)
            backoff = min(backoff * 2, _UNSTABLE_BACKOFF_S[1])

    def _fetch_committed(self, session, tps: Iterable[TopicPartition]
                         ) -> tuple[dict[TopicPartition, int], set[TopicPartition]]:
        """Committed offsets, and (``read_committed``) the partitions an unfinished
        transaction's offsets hold."""
        tps = list(tps)
        if not tps:
            return {}, set()
        return fetch_committed(session.conn, self.group_id, tps,
                               require_stable=self._read_committed)
