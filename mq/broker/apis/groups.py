"""The broker's consumer-group and offset apis: the group coordinator and ``__consumer_offsets``
wired to the event loop.

``GroupCoordinator`` (``group_coordinator.py``) decides; this module feeds it requests,
connection closes, dead pids and the clock, and turns its effects into pushes: a member whose
assignment changed gets ``[68, 0, 0, nil]`` on its heartbeat connection and heartbeats at once.
That, and noticing a dead member by its socket closing (or its pid gone, checked every
``_PID_CHECK_MS``), is why a killed consumer's partitions move within milliseconds instead of
after a 45 s session timeout.

Committed offsets go through ``OffsetStore`` into ``__consumer_offsets-<n>`` and are
acknowledged after the fsync (like ``acks="all"``), so an acknowledged commit survives kill -9
of the broker and even a power loss. The coordinator is not persisted: after a restart members
rejoin with the partitions they still own; for groups that had members when the broker went
down (a group record in ``__consumer_offsets`` says so), partitions nobody reported are
withheld for ``RESTART_GRACE_MS`` so a member that is still consuming has time to rejoin before
anyone else is given its partitions.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable, Iterator, Mapping

from mq import errors
from mq.broker.apis import Handler
from mq.broker.apis.topics import TopicApis
from mq.broker.config import BrokerConfig
from mq.broker.conns import Conn, Connections
from mq.broker.flushing import GroupCommit
from mq.broker.group_coordinator import GroupCoordinator
from mq.broker.group_model import Effects, GroupState, HeartbeatResult, matches_pattern
from mq.broker.internal_topics import OFFSETS_TOPIC, is_internal
from mq.broker.offsets import CommittedOffset, OffsetStore
from mq.broker.partitions import Partition, PartitionTable
from mq.errors import InvalidRequestError
from mq.log.log import PartitionLog
from mq.protocol.limits import check_offset
from mq.protocol.messages import PUSH_REQUEST_ID, Api, Request, response
from mq.protocol.types import TopicPartition

__all__ = ["RESTART_GRACE_MS", "GroupApis", "monotonic_ms", "wall_ms"]

log = logging.getLogger("mq.broker")

# Timestamps of oldest unconsumed records already read: (partition, offset) ->
# (the partition's segment-set generation then, timestamp ms or None).
_Ages = dict[tuple[Partition, int], tuple[int, int | None]]

RESTART_GRACE_MS = 2_000
OFFSET_METADATA_MAX_BYTES = 4096            # offset.metadata.max.bytes
_PID_CHECK_MS = 100
_INT32_MAX = (1 << 31) - 1
_PUSH = [int(Api.CONSUMER_GROUP_HEARTBEAT), PUSH_REQUEST_ID, 0, None]


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class GroupApis:
    """Consumer groups (the coordinator) and committed offsets (``__consumer_offsets``)."""

    def __init__(self, topics: TopicApis, table: PartitionTable, conns: Connections,
                 commit: GroupCommit, config: BrokerConfig) -> None:
        """Open (or create) ``__consumer_offsets`` through ``topics``, replay it, and start
        the coordinator."""
        self._table = table
        self._conns = conns
        self._commit = commit
        self._config = config
        self.offsets = OffsetStore([part.log for part in topics.open_internal(OFFSETS_TOPIC)])
        self._ages: _Ages = {}               # summaries()' last look at lagging partitions
        c = config
        now = monotonic_ms()
        self.coordinator = GroupCoordinator(
            topics.partition_counts(), now_ms=now, restart_grace_ms=RESTART_GRACE_MS,
            grace_groups=set(self.offsets.live_groups), default_assignor=c.group_assignor,
            heartbeat_interval_ms=c.group_heartbeat_interval_ms,
            session_timeout_ms=c.group_session_timeout_ms,
            min_session_timeout_ms=c.group_min_session_timeout_ms,
            max_session_timeout_ms=c.group_max_session_timeout_ms)
        self._next_pid_check = now + _PID_CHECK_MS
        self._next_offsets_expiry = now + c.offsets_retention_check_interval_ms
        self._group_wakeup_ms = now
        # The partitions of a producer's open transaction (pid, epoch) -> set | None; the
        # transactions component plugs its coordinator in (none: no transaction is open).
        self.transaction_partitions: Callable[[int, int], frozenset | None] = \
            lambda producer_id, epoch: None

    def handlers(self) -> Mapping[Api, Handler]:
        return {Api.CONSUMER_GROUP_HEARTBEAT: self.heartbeat, Api.OFFSET_COMMIT: self.commit,
                Api.OFFSET_FETCH: self.fetch_offsets, Api.LIST_GROUPS: self.list_groups,
                Api.CONSUMER_GROUP_DESCRIBE: self.describe, Api.DELETE_GROUPS: self.delete,
                Api.OFFSET_DELETE: self.delete_offsets, Api.TXN_OFFSET_COMMIT: self.txn_commit}

    # --- timers -------------------------------------------------------------------------------
    def deadline_s(self) -> float:
        """Seconds until group work is due (for the loop's select timeout)."""
        return max(0.0, (self._group_wakeup_ms - monotonic_ms()) / 1e3)

    def timers(self) -> None:
        """Session and revocation timeouts, the pid check, offsets expiry. Runs every loop
        round but does work only when something is due: the next due time is cached, and a
        heartbeat pulls it in (``_group_activity``)."""
        now = monotonic_ms()
        if now < self._group_wakeup_ms:
            return
        self._group_effects(self.coordinator.tick(now))    # does nothing before a deadline
        if now >= self._next_pid_check:
            self._next_pid_check = now + _PID_CHECK_MS
            self._check_member_pids(now)
        if now >= self._next_offsets_expiry:
            self._next_offsets_expiry = now + self._config.offsets_retention_check_interval_ms
            self._expire_offsets()
        due = [self._next_offsets_expiry]
        deadline = self.coordinator.next_deadline_ms()
        if deadline is not None:                       # members exist: check their pids
            due += [deadline, self._next_pid_check]
        self._group_wakeup_ms = min(due)

    def _group_activity(self, now: int) -> None:
        self._group_wakeup_ms = min(self._group_wakeup_ms, now + _PID_CHECK_MS)

    def _check_member_pids(self, now: int) -> None:
        """A member whose process is gone while its socket lives on (a forked child holds a
        copy) is removed by pid."""
        pids = {m.pid for g in self.coordinator.groups.values() for m in g.members.values()
                if m.pid is not None and not m.departed}
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                self._group_effects(self.coordinator.member_died(pid, now))
            except PermissionError:
                pass                                   # alive, another user's

    def _expire_offsets(self) -> None:
        retention_ms = int(self._config.offsets_retention_minutes * 60_000)

        def empty(group: str) -> bool:
            return self.coordinator.group_state(group) in (GroupState.EMPTY, GroupState.DEAD)
        for group in self.offsets.expired(wall_ms(), retention_ms, empty):
            log.info("group %s: committed offsets expired (offsets.retention.minutes)", group)
            self.coordinator.delete_group(group)
            try:
                plog = self.offsets.delete(group, now_ms=wall_ms())
            except errors.LogWriteError as err:     # kept; the next check tries again
                log.warning("group %s: expired offsets not deleted: %s", group, err)
                continue
            if plog is not None:
                self._flush_offsets(plog)

    # --- effects ------------------------------------------------------------------------------
    def _group_effects(self, effects: Effects) -> None:
        for gone in effects.removed:
            log.info("group %s: member %s left (%s)", gone.group_id, gone.member_id, gone.reason)
            self._mark_group(gone.group_id)
        for gone in effects.departed:
            log.info("group %s: static member %s (%s) is away, partitions kept (%s)",
                     gone.group_id, gone.member_id, gone.instance_id, gone.reason)
        for wake in effects.wakeups:
            conn = self._conns.get(wake.conn_id)
            if conn is not None:
                self._conns.send(conn, _PUSH)

    def _mark_group(self, group: str) -> None:
        """Keep the group record (``offsets.py``) in step with whether the group has
        members."""
        g = self.coordinator.groups.get(group)
        try:
            self.offsets.mark_group(group, bool(g and g.members), g.epoch if g else 0,
                                    wall_ms())
        except errors.LogWriteError as err:
            # Only a broker crash reads the record: the next change of the group retries it.
            log.warning("group %s: group record not written: %s", group, err)

    def connection_closed(self, conn_id: Hashable) -> None:
        """A group member's connection closed: a dynamic member leaves at once."""
        self._group_effects(self.coordinator.connection_closed(conn_id, monotonic_ms()))

    def topic_partitions_changed(self, topic: str, count: int) -> None:
        """A topic listener (``TopicApis``): subscribers rebalance; a deleted topic's committed
        offsets go too (Kafka does the same)."""
        self._group_effects(self.coordinator.set_topic_partitions(topic, count))
        if count == 0:
            self._delete_topic_offsets(topic)

    # --- apis ---------------------------------------------------------------------------------
    def heartbeat(self, conn: Conn, req: Request) -> list:
        f = req.fields
        conn.group_member = True
        result = self.member_heartbeat(
            f["group"], f["member_id"], member_epoch=f["member_epoch"],
            instance_id=f["instance_id"], topics=f["topics"], pattern=f["pattern"],
            assignor=f["assignor"], owned=f["owned"], pid=conn.pid, conn_id=conn.conn_id,
            rebalance_timeout_ms=f["rebalance_timeout_ms"],
            session_timeout_ms=f["session_timeout_ms"])
        if result.error is not None:
            return response(req.api, req.request_id, result.error.code, result.error_message)
        return response(req.api, req.request_id, 0, None, result.member_id, result.member_epoch,
                        result.heartbeat_interval_ms, sorted(map(list, result.assignment)))

    def member_heartbeat(self, group: str, member_id: str | None, *, member_epoch: int,
                         instance_id: str | None, topics: list[str] | None,
                         pattern: str | None, assignor: str | None, owned: list | None,
                         pid: int | None, conn_id: Hashable | None,
                         rebalance_timeout_ms: int, session_timeout_ms: int
                         ) -> HeartbeatResult:
        """A member's heartbeat (join, heartbeat or leave: ``GroupCoordinator.heartbeat``).
        ``pid`` and ``conn_id`` None: the member lives by its session timeout alone (Kafka
        clients, which reconnect and keep their member id); timeouts < 0: the defaults."""
        if not group:
            raise errors.InvalidGroupIdError("the group id must be a non-empty string")
        now = monotonic_ms()
        self._group_activity(now)
        result = self.coordinator.heartbeat(
            group, member_id, member_epoch=member_epoch, instance_id=instance_id,
            subscription=topics, subscribed_pattern=pattern, assignor=assignor,
            owned_partitions=owned, now_ms=now, pid=pid, conn_id=conn_id,
            rebalance_timeout_ms=None if rebalance_timeout_ms < 0 else rebalance_timeout_ms,
            session_timeout_ms=None if session_timeout_ms < 0 else session_timeout_ms)
        self._group_effects(result.effects)
        self._mark_group(group)
        return result

    def classic_heartbeat(self, group: str, member_id: str, *, generation: int,
                          instance_id: str | None, sync: bool = False
                          ) -> tuple[type[errors.BrokerError] | None, bool]:
        """A classic (JoinGroup/SyncGroup) member's Heartbeat or SyncGroup: (error, must
        rejoin) — ``GroupCoordinator.classic_heartbeat``."""
        now = monotonic_ms()
        self._group_activity(now)
        return self.coordinator.classic_heartbeat(group, member_id, generation=generation,
                                                  instance_id=instance_id, sync=sync,
                                                  now_ms=now)

    def leave_member(self, group: str, member_id: str, *, instance_id: str | None = None,
                     temporary: bool = False) -> type[errors.BrokerError] | None:
        """A member leaves (``GroupCoordinator.leave``): a Kafka client's LeaveGroup, or a
        static classic member's old incarnation stepping aside (``temporary``)."""
        left = self.coordinator.leave(group, member_id, instance_id=instance_id,
                                      temporary=temporary)
        self._group_effects(left.effects)
        self._mark_group(group)
        return left.error

    def commit(self, conn: Conn, req: Request) -> list | None:
        group = req["group"]
        items = self._commit_items(group, req["member_id"], req["member_epoch"], req["offsets"])
        if not items:
            return response(req.api, req.request_id, 0, None)
        plog = self.offsets.commit(group, items, wall_ms())
        self._flush_offsets(plog, conn, response(req.api, req.request_id, 0, None))
        return None

    def txn_commit(self, conn: Conn, req: Request) -> list | None:
        """TxnOffsetCommit: offsets committed inside the producer's transaction. The group's
        offsets partition must be in the transaction (AddOffsetsToTxn); the offsets count once
        its COMMIT marker lands there (``OffsetStore.end_transaction``)."""
        group, pid, epoch = req["group"], req["producer_id"], req["producer_epoch"]
        items = self._commit_items(group, req["member_id"], req["member_epoch"], req["offsets"])
        held = self.transaction_partitions(pid, epoch)
        if held is None or (OFFSETS_TOPIC, self.offsets.log_for(group).partition) not in held:
            raise errors.InvalidTxnStateError(
                f"transactional id {req['transactional_id']!r} has not added group {group!r} "
                "to its transaction (send_offsets_to_transaction does that first)")
        if not items:
            return response(req.api, req.request_id, 0, None)
        plog = self.offsets.commit(group, items, wall_ms(), producer_id=pid,
                                   producer_epoch=epoch)
        self._flush_offsets(plog, conn, response(req.api, req.request_id, 0, None))
        return None

    def _commit_items(self, group: str, member_id: str, epoch: int, offsets: list
                      ) -> list[tuple[str, int, CommittedOffset]]:
        """Validate a commit (the group, the member, each offset); the items to store."""
        if not group:
            raise errors.InvalidGroupIdError("the group id must be a non-empty string")
        if epoch < 0 and not member_id:
            live = self._live_members(group)
            if live:
                raise errors.NonEmptyGroupError(
                    f"group {group!r} has {live} live member(s); stop them before changing "
                    "its offsets")
        refused = self.coordinator.validate_commit(group, member_id, epoch)
        if refused is not None:
            raise refused(f"member {member_id!r} at epoch {epoch} may not commit for group "
                          f"{group!r}: {refused.__doc__}")
        now = wall_ms()
        items = []
        for topic, partition, offset, leader_epoch, metadata in offsets:
            self._table.partition(topic, partition)     # UnknownTopicOrPartition
            if is_internal(topic):
                raise InvalidRequestError(f"cannot commit offsets of internal topic {topic!r}")
            try:
                check_offset(offset, f"the offset of {topic}-{partition}")
            except ValueError as err:
                raise InvalidRequestError(str(err)) from err
            if not -1 <= leader_epoch <= _INT32_MAX:        # stored as an int32 (offsets.py)
                raise InvalidRequestError(f"the leader epoch of {topic}-{partition} must be -1 "
                                          f"to {_INT32_MAX}, got {leader_epoch}")
            if len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                raise errors.OffsetMetadataTooLargeError(
                    f"offset metadata is longer than {OFFSET_METADATA_MAX_BYTES} bytes")
            items.append((topic, partition, CommittedOffset(offset, leader_epoch, metadata, now)))
        return items

    def fetch_offsets(self, conn: Conn, req: Request) -> list:
        """OffsetFetch. With ``require_stable`` (read_committed consumers), a partition whose
        newer offsets an open or prepared transaction holds answers UNSTABLE_OFFSET_COMMIT in
        its row (KIP-447): the committed offset would be stale the moment the transaction
        commits, and a new owner starting there would process the transaction's input again.
        """
        group, wanted = req["group"], req["partitions"]
        committed = self.offsets.offsets.get(group, {})
        keys = sorted(committed) if wanted is None else [(t, p) for t, p in wanted]
        unstable = self.offsets.pending_partitions(group) if req["require_stable"] else ()
        unstable_code = errors.UnstableOffsetCommitError.code
        rows = []
        for key in keys:
            c = committed.get(key)
            if key in unstable:
                rows.append([*key, -1, -1, "", -1, unstable_code])
            elif c is None:
                rows.append([*key, -1, -1, "", -1, 0])
            else:
                rows.append([*key, c.offset, c.leader_epoch, c.metadata,
                             c.commit_timestamp_ms, 0])
        return response(req.api, req.request_id, 0, None, rows)

    def list_groups(self, conn: Conn, req: Request) -> list:
        rows = [[name, state.value, self._live_members(name)]
                for name, state in self._group_states()]
        return response(req.api, req.request_id, 0, None, rows)

    def summaries(self) -> list[dict]:
        """Every group with its state, live members and, per committed partition, the
        committed offset, end offset, lag in records and age of the oldest unconsumed record
        (the stats api: ``mq top`` and the metrics)."""
        out = []
        seen: _Ages = {}
        for name, state in self._group_states():
            offsets = []
            for tp, c in sorted(self.offsets.offsets.get(name, {}).items()):
                end, lag, lag_ms = self._lag(tp, c.offset, self._ages, seen)
                offsets.append({"topic": tp[0], "partition": tp[1],
                                "committed_offset": c.offset, "end_offset": end, "lag": lag,
                                "lag_ms": lag_ms})
            out.append({"group": name, "state": state.value,
                        "members": self._live_members(name), "offsets": offsets})
        self._ages = seen                   # only what is still in use: the cache stays small
        return out

    def _group_states(self) -> Iterator[tuple[str, GroupState]]:
        """(name, state) of every group the coordinator or the offsets know, by name."""
        for name in sorted(set(self.coordinator.groups) | set(self.offsets.offsets)):
            state = self.coordinator.group_state(name)
            if state is GroupState.DEAD:
                state = GroupState.EMPTY                 # known only by its offsets
            yield name, state

    def describe(self, conn: Conn, req: Request) -> list:
        group = req["group"]
        desc = self.coordinator.describe(group)
        committed = self.offsets.offsets.get(group, {})
        if desc.state is GroupState.DEAD and not committed:
            raise errors.GroupIdNotFoundError(f"group {group!r} does not exist")
        now = monotonic_ms()
        owner = {}
        members = []
        for m in desc.members:
            for tp in m.assigned | m.pending_revocation:
                owner[tp] = m
            members.append({
                "member_id": m.member_id, "instance_id": m.instance_id, "pid": m.pid,
                "member_epoch": m.member_epoch, "state": m.state.value, "away": m.departed,
                "assignment": sorted(map(list, m.assigned)),
                "pending_revocation": sorted(map(list, m.pending_revocation)),
                "target": sorted(map(list, m.target)),
                "topics": list(m.subscribed_topics or ()), "pattern": m.subscribed_pattern,
                "assignor": m.assignor, "last_heartbeat_ms_ago": now - m.last_heartbeat_ms})
        rows = []
        for tp in sorted(set(committed) | set(owner)):
            c = committed.get(tp)
            m = owner.get(tp)
            end, lag, lag_ms = self._lag(tp, None if c is None else c.offset)
            rows.append({"topic": tp[0], "partition": tp[1],
                         "committed_offset": None if c is None else c.offset,
                         "metadata": None if c is None else c.metadata,
                         "end_offset": end, "lag": lag, "lag_ms": lag_ms,
                         "member_id": None if m is None else m.member_id,
                         "pid": None if m is None else m.pid})
        state = GroupState.EMPTY if desc.state is GroupState.DEAD else desc.state
        return response(req.api, req.request_id, 0, None, {
            "group": group, "state": state.value, "group_epoch": desc.group_epoch,
            "assignment_epoch": desc.assignment_epoch, "assignor": desc.assignor,
            "members": members, "offsets": rows})

    def delete(self, conn: Conn, req: Request) -> list | None:
        group = req["group"]
        refused = self.coordinator.delete_group(group)
        if refused is errors.NonEmptyGroupError:
            raise errors.NonEmptyGroupError(f"group {group!r} has {self._live_members(group)} "
                                            "live member(s); stop them first")
        if refused is errors.GroupIdNotFoundError and group not in self.offsets.offsets \
                and group not in self.offsets.known_groups:
            raise errors.GroupIdNotFoundError(f"group {group!r} does not exist")
        plog = self.offsets.delete(group, now_ms=wall_ms())
        reply = response(req.api, req.request_id, 0, None)
        if plog is None:
            return reply
        self._flush_offsets(plog, conn, reply)
        return None

    def delete_offsets(self, conn: Conn, req: Request) -> list | None:
        """OffsetDelete (Kafka's): forget the group's committed offsets of the partitions,
        except those of topics a member subscribes to (GROUP_SUBSCRIBED_TO_TOPIC in their
        rows). Answered after the fsync, like a commit."""
        group = req["group"]
        g = self.coordinator.groups.get(group)
        if g is None and group not in self.offsets.offsets:
            raise errors.GroupIdNotFoundError(f"group {group!r} does not exist")
        members = list(g.members.values()) if g is not None else []
        rows = []
        for topic, partition in req["partitions"] or ():
            subscribed = any(topic in (m.topics or ()) or matches_pattern(m, topic)
                             for m in members)
            rows.append([topic, partition,
                         errors.GroupSubscribedToTopicError.code if subscribed else 0])
        plog = self.offsets.delete(group, [(t, p) for t, p, code in rows if code == 0],
                                   now_ms=wall_ms())
        reply = response(req.api, req.request_id, 0, None, rows)
        if plog is None:
            return reply
        self._flush_offsets(plog, conn, reply)
        return None

    # --- helpers ------------------------------------------------------------------------------
    def _flush_offsets(self, plog: PartitionLog, conn: Conn | None = None,
                       reply: list | None = None) -> None:
        """Have this round's flush job fsync the ``__consumer_offsets`` log just written (and
        send ``reply`` once it did)."""
        self._commit.ack_after_flush(self._table.partition(OFFSETS_TOPIC, plog.partition), conn,
                                     reply)

    def _live_members(self, group: str) -> int:
        g = self.coordinator.groups.get(group)
        return 0 if g is None else sum(1 for m in g.members.values() if not m.departed)

    def _lag(self, tp: TopicPartition, committed: int | None, ages: _Ages | None = None,
             seen: _Ages | None = None) -> tuple[int | None, int | None, int | None]:
        """(end offset, lag in records, age in ms of the oldest unconsumed record).

        The age needs the record's timestamp, read from the log. ``ages`` are the timestamps
        the previous call of the same caller found, by (partition, offset): a group that did
        not move since (the one whose age matters) costs a dict lookup, not a read. The
        partition's segment-set generation is kept with each, so a roll, retention or a
        compaction swap reads again. What this call used is put in ``seen``."""
        part = self._table.get(*tp)
        if part is None:
            return None, None, None
        plog = part.log
        end = plog.high_watermark
        if committed is None:
            return end, None, None
        start = max(committed, plog.log_start_offset)
        lag = max(0, end - start)
        if lag == 0:
            return end, 0, 0
        key = (part, start)
        known = ages.get(key) if ages is not None else None
        if known is not None and known[0] == part.generation:
            timestamp = known[1]
        else:
            try:
                timestamp = plog.first_timestamp_from(start)
            except (errors.MQError, OSError) as err:
                log.debug("lag of %s-%d: %s", *tp, err)
                return end, lag, None
        if seen is not None:
            seen[key] = (part.generation, timestamp)
        return end, lag, None if timestamp is None else max(0, wall_ms() - timestamp)

    def _delete_topic_offsets(self, topic: str) -> None:
        for group in list(self.offsets.groups()):
            doomed = [tp for tp in self.offsets.offsets.get(group, {}) if tp[0] == topic]
            if doomed:
                try:
                    plog = self.offsets.delete(group, doomed, now_ms=wall_ms())
                except errors.LogWriteError as err:
                    log.warning("group %s: offsets of deleted topic %s kept: %s", group, topic,
                                err)
                    continue
                if plog is not None:
                    self._flush_offsets(plog)
