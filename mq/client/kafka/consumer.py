"""``mq.Consumer`` on a Kafka cluster: mq's consumer API over librdkafka's consumer.

librdkafka fetches in its own threads; ``poll`` takes what it has fetched and returns mq's
``Record``s, grouped by partition as the local consumer does. Rebalance listeners run inside
``poll`` (librdkafka calls them there), with mq's ``TopicPartition`` sets.

Where the local consumer's semantics are kept by hand:

- **Auto-commit is at-least-once.** librdkafka would store a record's offset as it hands
  the record over, so a crash after ``poll`` returned could commit records never
  processed. Here offsets are stored when the *next* ``poll`` (or ``commit``, a revocation,
  ``close``) comes, as Kafka's Java client and the local consumer do; librdkafka's timer
  commits what is stored.
- **Without ``group_id``** the constructor's topics are assigned whole, and partitions added
  later join at the next ``poll`` after a metadata check (every ``_RECHECK_S``). librdkafka
  needs a group id even then: a private one, never committed to.
- **A ``pattern``** is matched by Python's ``re.fullmatch`` over the cluster's topic names
  (not librdkafka's own regex dialect), checked again every ``_RECHECK_S``.
- **A position never passes a record not handed out.** librdkafka counts a message as
  consumed when it gives it to us, and its position (used to step over transaction markers)
  moves past it. Two messages are taken and not handed out: a poll's first message, when a
  rebalance between it and the rest of the batch revoked its partition (or a seek moved it),
  and one that ``close`` takes while it waits for ``commit_async``'s reports. Until the
  partition hands out a record again, or is sought, its position stands before such a
  message, so neither a listener nor an auto-commit commits past it. An error among a
  poll's messages is raised at the next ``poll`` when records came before it. What a
  rebalance listener raises comes out of ``poll`` once the rebalance is done, as in Kafka's
  Java client, and the records the poll took are read again.
- **A partition taken away is no longer paused** when it comes back (librdkafka would keep
  it paused across the revocation).
- **A commit a rebalance refused** (unknown member, old generation, rebalance in progress)
  raises ``CommitFailedError``, as Kafka's Java client does.

Offsets by time and the offsets of a partition's ends come from an admin client
(``ListOffsets``), which also gives the record's timestamp and, with ``read_committed``,
the last stable offset.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from mq.client.consumer_options import (
    check_group_options,
    check_read_options,
    check_spin,
    check_subscription,
)
from mq.client.fetcher import Record
from mq.client.kafka.config import connection_only, native, with_overrides
from mq.client.kafka.errors import (
    LIST_OFFSETS_UNKNOWN_GRACE_S,
    committed_offsets,
    from_kafka,
    raising,
    results,
)
from mq.client.types import ConsumerGroupMetadata, TopicPartition
from mq.errors import (
    ClosedError,
    CommitFailedError,
    NoOffsetForPartitionError,
    UnknownTopicOrPartitionError,
)

__all__ = ["KafkaConsumer"]

log = logging.getLogger("mq.consumer")

_RECHECK_S = 5.0               # how often a whole-topic or pattern subscription looks again
_ASSIGNORS = {"range": "range", "roundrobin": "roundrobin", "sticky": "cooperative-sticky"}
_NOT_MEMBER = ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS",
               "FENCED_INSTANCE_ID", "STALE_MEMBER_EPOCH", "FENCED_MEMBER_EPOCH")


class _GroupMetadata(ConsumerGroupMetadata):
    """``ConsumerGroupMetadata`` with librdkafka's own (``native_group_metadata``), which
    ``Producer.send_offsets_to_transaction`` hands the cluster."""

    native_group_metadata: bytes


def _tp(rd_tp: Any) -> TopicPartition:
    return TopicPartition(rd_tp.topic, rd_tp.partition)


def _generation(native: bytes) -> int:
    """The group generation librdkafka's serialized group metadata carries ("CGMDv2:" and
    the generation as a native int32), the member's epoch in mq's terms; -1 if unknown."""
    magic = b"CGMDv2:"
    if isinstance(native, bytes) and native.startswith(magic) and len(native) >= len(magic) + 4:
        return int.from_bytes(native[len(magic):len(magic) + 4], sys.byteorder, signed=True)
    return -1


def _offsets_key(rd_offsets: list) -> tuple:
    """A commit's offsets, comparable with librdkafka's report of it."""
    return tuple(sorted((t.topic, t.partition, t.offset) for t in rd_offsets))


class KafkaConsumer:
    """``mq.Consumer(bootstrap_servers=...)``: see the module doc and ``mq.Consumer``'s."""

    def __init__(self, servers: str, *topics: str, group_id: str | None = None,
                 auto_offset_reset: str = "earliest", enable_auto_commit: bool = True,
                 isolation_level: str = "read_uncommitted", max_poll_records: int = 500,
                 max_partition_fetch_bytes: int = 1 << 20, value_bytes: bool = False,
                 key_deserializer=None, value_deserializer=None,
                 consumer_timeout_ms: float | None = None, request_timeout_ms: int = 30_000,
                 check_crcs: bool = True, pattern: str | None = None, listener: Any = None,
                 group_instance_id: str | None = None, assignor: str | None = None,
                 session_timeout_ms: int = 45_000, max_poll_interval_ms: int = 300_000,
                 auto_commit_interval_ms: int = 5_000, spin_us: float = 0,
                 kafka_config: Mapping[str, Any] | None = None) -> None:
        check_read_options(auto_offset_reset, isolation_level, max_poll_records,
                           max_partition_fetch_bytes)
        check_spin(spin_us)               # checked alike; librdkafka's fetches do the waiting
        check_group_options(group_id, pattern, session_timeout_ms, max_poll_interval_ms,
                            auto_commit_interval_ms)
        if assignor is not None and assignor not in _ASSIGNORS:
            raise ValueError(f"assignor must be one of {sorted(_ASSIGNORS)}, got {assignor!r}")
        self.group_id = group_id
        self.isolation_level = isolation_level
        self.max_poll_records = max_poll_records
        self.consumer_timeout_ms = consumer_timeout_ms
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self._timeout = request_timeout_ms / 1000
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._listener = listener
        self._conf = with_overrides(servers, {
            "group.id": group_id or f"mq-unsubscribed-{uuid.uuid4()}",
            "client.id": "mq-consumer",
            "enable.auto.commit": self.enable_auto_commit,
            "enable.auto.offset.store": False,
            "auto.commit.interval.ms": auto_commit_interval_ms,
            "auto.offset.reset": "error" if auto_offset_reset == "none" else auto_offset_reset,
            "isolation.level": isolation_level,
            "session.timeout.ms": session_timeout_ms,
            "max.poll.interval.ms": max_poll_interval_ms,
            "group.instance.id": group_instance_id,
            "partition.assignment.strategy": _ASSIGNORS.get(assignor or ""),
            "max.partition.fetch.bytes": max_partition_fetch_bytes,
            "check.crcs": check_crcs,
            # librdkafka's default (1000) postpones a partition's next fetch by a second
            # whenever 100,000 records wait locally: a backlog read stalls every 100,000.
            "fetch.queue.backoff.ms": 10,
            "on_commit": self._on_commit,
        }, kafka_config)
        from confluent_kafka import Consumer as RdConsumer
        with raising("consumer"):
            self._rd = native(self, RdConsumer, self._conf)
        self._admin: Any = None
        self._closed = False
        # positions known here: after the records handed out, or sought (librdkafka forgets a
        # position at a seek until the next record)
        self._handed: dict[TopicPartition, int] = {}
        self._sought: set[TopicPartition] = set()  # of those, the ones a seek set
        self._paused: set[TopicPartition] = set()
        self._whole: tuple[str, ...] = tuple(topics) if group_id is None else ()
        self._pattern: re.Pattern | None = None
        self._subscription: list[str] = []
        self._checked_at = 0.0
        self._async_pending: list[tuple] = []      # commit_async's, until librdkafka reports
        # librdkafka's consumed messages not handed out: {tp: the first one's offset}
        self._unhanded: dict[TopicPartition, int] = {}
        self._early: TopicPartition | None = None   # a poll's first message's, meanwhile
        self._error: BaseException | None = None   # to raise at the next poll
        self._listener_error: BaseException | None = None   # to raise when the poll ends
        self._recent_metadata: ConsumerGroupMetadata | None = None
        self._iterator: Iterator[Record] | None = None
        try:
            if group_id is not None and (topics or pattern is not None):
                self.subscribe(topics, pattern)
            elif topics:
                known = self._topics()
                missing = [t for t in topics if t not in known]
                if missing:
                    raise UnknownTopicOrPartitionError(f"unknown topic {missing[0]!r}")
                self._follow(known)
        except BaseException:
            self.close()
            raise

    # --- metadata --------------------------------------------------------------------------
    def _topics(self) -> dict[str, int]:
        """The cluster's topics (internal ones left out) and their partition counts."""
        with raising("metadata"):
            meta = self._rd.list_topics(timeout=self._timeout)
        return {name: len(t.partitions) for name, t in meta.topics.items()
                if not name.startswith("__") and t.error is None}

    def topics(self) -> set[str]:
        self._check_open()
        return set(self._topics())

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self._topics().get(topic)
        return None if count is None else set(range(count))

    def _follow(self, known: dict[str, int] | None = None) -> None:
        """Keep the subscription current: a whole-topic assignment grows by new partitions,
        a pattern subscribes to the topics that match now."""
        self._checked_at = time.monotonic()
        if self._whole:
            known = self._topics() if known is None else known
            have = {_tp(tp) for tp in self._rd.assignment()}
            start = self._start_offset()
            new = [TopicPartition(t, p) for t in self._whole for p in range(known.get(t, 0))
                   if TopicPartition(t, p) not in have]
            if new:
                from confluent_kafka import TopicPartition as RdPartition
                with raising("assign"):
                    self._rd.incremental_assign([RdPartition(t, p, start) for t, p in new])
        elif self._pattern is not None:
            known = self._topics() if known is None else known
            matched = sorted(t for t in known if self._pattern.fullmatch(t))
            if matched != self._subscription:
                self._subscribe(matched)

    def _start_offset(self) -> int:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_STORED
        return {"earliest": OFFSET_BEGINNING, "latest": OFFSET_END}.get(self.auto_offset_reset,
                                                                      OFFSET_STORED)

    # --- assignment and subscription -------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing the assignment)."""
        self._check_open()
        if self._subscription or self._pattern is not None:
            raise ValueError(f"this consumer subscribes through group {self.group_id!r}; "
                             "call unsubscribe() before assign()")
        tps = [TopicPartition(*tp) for tp in partitions]
        known = self._topics()
        for tp in tps:
            if not 0 <= tp.partition < known.get(tp.topic, 0):
                raise UnknownTopicOrPartitionError(f"unknown partition {tp.topic}-"
                                                   f"{tp.partition}")
        from confluent_kafka import TopicPartition as RdPartition
        start = self._start_offset() if self.group_id is None else None
        self._whole = ()
        self._store_handed()
        with raising("assign"):
            self._rd.assign([RdPartition(t, p) if start is None else RdPartition(t, p, start)
                             for t, p in tps])
        self._handed = {tp: o for tp, o in self._handed.items() if tp in set(tps)}

    def assignment(self) -> set[TopicPartition]:
        self._check_open()
        return {_tp(tp) for tp in self._rd.assignment()}

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None,
                  listener: Any = None) -> None:
        """Join the group's subscription to ``topics`` or to the topics ``pattern`` matches
        (Python's ``re.fullmatch``, internal topics never)."""
        self._check_open()
        topics = check_subscription(self.group_id, topics, pattern)
        if listener is not None:
            self._listener = listener
        self._whole = ()
        if pattern is not None:
            self._pattern = re.compile(pattern)
            self._subscription = []
            self._follow()
        else:
            self._pattern = None
            self._subscribe(topics)

    def _subscribe(self, topics: list[str]) -> None:
        self._subscription = topics
        if not topics:                       # a pattern that matches nothing yet
            self._rd.unsubscribe()
            return
        with raising("subscribe"):
            self._rd.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                               on_lost=self._on_lost)

    def unsubscribe(self) -> None:
        """Leave the group (committing first with auto-commit) and drop every partition."""
        self._check_open()
        self._commit_handed()
        self._pattern = None
        self._subscription = []
        self._rd.unsubscribe()

    def _listen(self, method: str, partitions: set[TopicPartition]) -> None:
        """The listener's ``method``, inside librdkafka's rebalance callback. What it raises
        is kept for ``poll`` (or ``close``) to raise once the rebalance is done: raised through
        librdkafka, it would drop the messages of the batch the rebalance came in."""
        self._recent_metadata = None
        if self._listener is None:
            return
        try:
            if self.group_id is not None:
                self._recent_metadata = self.group_metadata()
            getattr(self._listener, method)(partitions)
        except BaseException as err:     # noqa: BLE001 - raised by poll or close
            if self._listener_error is None:
                self._listener_error = err

    def _on_assign(self, rd: Any, partitions: list) -> None:
        self._listen("on_partitions_assigned", {_tp(tp) for tp in partitions})

    def _on_revoke(self, rd: Any, partitions: list) -> None:
        revoked = {_tp(tp) for tp in partitions}
        self._commit_handed(revoked)
        self._listen("on_partitions_revoked", revoked)
        self._drop_early(revoked)
        self._unpause(revoked)

    def _on_lost(self, rd: Any, partitions: list) -> None:
        lost = {_tp(tp) for tp in partitions}
        for tp in lost:
            self._handed.pop(tp, None)        # another member may own them: never commit
        self._listen("on_partitions_lost", lost)
        self._drop_early(lost)
        self._unpause(lost)

    def _unpause(self, tps: set[TopicPartition]) -> None:
        """Partitions taken from this consumer are no longer paused when the group gives
        them back, as with the local consumer and Kafka's Java client. librdkafka keeps them
        paused, and its (eager) rebalances take every partition: a listener that dropped a
        paused partition's records at the revocation would never resume it, and the
        partition would stall for good."""
        gone = self._paused & tps
        if not gone:
            return
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as RdPartition
        with contextlib.suppress(KafkaException):
            self._rd.resume([RdPartition(tp.topic, tp.partition) for tp in gone])
        self._paused -= gone

    # --- commits ---------------------------------------------------------------------------
    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group, member id and generation, with librdkafka's own for
        ``Producer.send_offsets_to_transaction``. ``ValueError`` without a ``group_id``."""
        self._check_open()
        if self.group_id is None:
            raise ValueError("group_metadata() needs a group_id")
        native = self._rd.consumer_group_metadata()
        out = _GroupMetadata(self.group_id, self._rd.memberid() or "", _generation(native),
                             self._conf.get("group.instance.id"))
        out.native_group_metadata = native
        return out

    def recent_group_metadata(self) -> ConsumerGroupMetadata:
        """``group_metadata()`` as of the last rebalance callback (taken there, on the
        consumer's thread): for another thread, which must not ask librdkafka while this
        one is inside a rebalance. The classic protocol calls the assignment callback at every
        rebalance, so a new member id or generation always comes through one; taking it at
        every poll instead cost a poll about 115 us (librdkafka serializes it)."""
        if self._listener is None or self._recent_metadata is None:
            return self.group_metadata()       # no listener: nothing waits on that thread
        return self._recent_metadata

    def native_group_metadata(self) -> bytes:
        return self._rd.consumer_group_metadata()

    def _offsets(self, offsets: Mapping | None) -> list:
        """librdkafka's offsets to commit: ``offsets`` (``{tp: offset}`` or ``{tp: (offset,
        metadata)}``), or the position of every assigned partition that has one here (read
        or sought: one never read still stands at its committed offset)."""
        from confluent_kafka import TopicPartition as RdPartition
        if offsets is None:
            assigned = self.assignment()
            offsets = {_tp(t): t.offset for t in self._handed_positions(assigned)}
            offsets.update((_tp(t), t.offset) for t in self._app_positions(
                [RdPartition(tp.topic, tp.partition) for tp in assigned - offsets.keys()])
                if t.offset >= 0)
        out = []
        for tp, offset in offsets.items():
            offset, metadata = offset if isinstance(offset, tuple) else (offset, None)
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
            out.append(RdPartition(tp[0], tp[1], offset, metadata=metadata) if metadata
                       else RdPartition(tp[0], tp[1], offset))
        return out

    def commit(self, offsets: Mapping | None = None) -> None:
        """Commit offsets (default: every assigned partition's position) and wait for the
        group coordinator. Raises ``CommitFailedError`` when a rebalance refused it."""
        self._check_open()
        self._commit(self._offsets(offsets))

    def _commit(self, rd_offsets: list) -> None:
        if self.group_id is None:
            raise ValueError("commit() needs a group_id")
        if not rd_offsets:
            return
        from confluent_kafka import KafkaException
        try:
            self._rd.commit(offsets=rd_offsets, asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0]
            if err.name() in _NOT_MEMBER:
                raise CommitFailedError(f"commit refused by the group's rebalance: "
                                        f"{err.str()}") from exc
            raise from_kafka(err, "commit") from exc
        for rd_tp in rd_offsets:
            tp = _tp(rd_tp)
            if self._handed.get(tp) == rd_tp.offset:
                del self._handed[tp]
        if self.enable_auto_commit:
            # librdkafka's auto-commit (on its timer and at close) commits what is stored:
            # stored as committed, or it would take an explicit commit back
            with contextlib.suppress(KafkaException):
                self._rd.store_offsets(offsets=rd_offsets)

    def commit_async(self, offsets: Mapping | None = None, callback: Any = None) -> None:
        """Commit without waiting (librdkafka's asynchronous commit); ``callback(offsets,
        error_or_None)`` runs inside a later ``poll``, ``commit`` or ``close``."""
        self._check_open()
        if self.group_id is None:
            raise ValueError("commit_async() needs a group_id")
        rd_offsets = self._offsets(offsets)
        if not rd_offsets:
            return
        self._async_pending.append((_offsets_key(rd_offsets), callback,
                                    {_tp(t): t.offset for t in rd_offsets}))
        with raising("commit"):
            self._rd.commit(offsets=rd_offsets, asynchronous=True)

    def _on_commit(self, err: Any, partitions: list) -> None:
        """librdkafka's commit report (inside ``poll``): the matching ``commit_async``'s
        callback, with the commit's error, if any (an auto-commit's report matches none)."""
        key = _offsets_key(partitions)
        for i, (pending, callback, offsets) in enumerate(self._async_pending):
            if pending == key:
                del self._async_pending[i]
                break
        else:
            return
        failed = next((t.error for t in partitions if t.error is not None), None)
        error = err or failed
        if error is not None:
            error = (CommitFailedError(f"commit refused by the group's rebalance: "
                                       f"{error.str()}") if error.name() in _NOT_MEMBER
                     else from_kafka(error, "commit"))
        if callback is not None:
            callback(offsets, error)

    def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset for ``partition`` (None if it has none), asked again
        while the group's coordinator moves, for up to ``request_timeout_ms``
        (``errors.committed_offsets``)."""
        self._check_open()
        if self.group_id is None:
            raise ValueError("committed() needs a group_id")
        from confluent_kafka import TopicPartition as RdPartition
        [tp] = committed_offsets(self._rd, [RdPartition(partition[0], partition[1])],
                                 f"committed offset of group {self.group_id}", self._timeout)
        return tp.offset if tp.offset >= 0 else None

    def _store_handed(self, only: set[TopicPartition] | None = None) -> None:
        """Store the positions after the records handed out (auto-commit commits them)."""
        if not self.enable_auto_commit or not self._handed:
            return
        from confluent_kafka import KafkaException
        handed = self._handed_positions(only)
        try:
            self._rd.store_offsets(offsets=handed)
        except KafkaException:
            pass                      # a partition no longer assigned: not ours to commit

    def _handed_positions(self, only: set[TopicPartition] | None = None) -> list:
        """librdkafka's offsets of the positions known here (``_handed``), each moved past
        what librdkafka skipped after the last record handed out (a transaction's marker):
        so a transactional input is committed to its end, as locally."""
        from confluent_kafka import TopicPartition as RdPartition
        tps = [RdPartition(tp.topic, tp.partition) for tp in self._handed
               if only is None or tp in only]
        if not tps:
            return []
        out = []
        for rd_tp in self._app_positions(tps):
            tp = _tp(rd_tp)
            known = self._handed[tp]
            if tp not in self._sought and rd_tp.offset > known:
                known = rd_tp.offset
            out.append(RdPartition(tp.topic, tp.partition, known))
        return out

    def _app_positions(self, rd_tps: list) -> list:
        """librdkafka's positions (after the last message it gave us), none past a message
        not handed out (``_unhanded``)."""
        out = self._rd.position(rd_tps)
        unhanded = self._unhanded
        if unhanded:
            for rd_tp in out:
                offset = unhanded.get(_tp(rd_tp))
                if offset is not None and rd_tp.offset > offset:
                    rd_tp.offset = offset
        return out

    def _drop_early(self, tps: set[TopicPartition]) -> None:
        """A listener's partitions went (or a seek moved one) while ``poll`` held their
        first message: it is not handed out (the partition is read again from where it is
        committed, or sought)."""
        if self._early in tps:
            self._early = None

    def _commit_handed(self, only: set[TopicPartition] | None = None) -> None:
        """With auto-commit, commit the records handed out (before a revocation, on
        ``unsubscribe`` and ``close``); a refused commit is left to the next owner."""
        if not self.enable_auto_commit:
            return
        try:
            self._commit(self._handed_positions(only))
        except (CommitFailedError, UnknownTopicOrPartitionError):
            pass

    # --- positions -------------------------------------------------------------------------
    def _rd_tp(self, partition: TopicPartition, offset: int = -1001) -> Any:
        from confluent_kafka import TopicPartition as RdPartition
        tp = TopicPartition(*partition)
        if tp not in self.assignment():
            raise ValueError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return RdPartition(tp.topic, tp.partition, offset)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on at the next poll."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
        self._check_open()
        self._seek(self._rd_tp(partition, offset))

    def _seek(self, rd_tp: Any) -> None:
        from confluent_kafka import KafkaException
        tp = _tp(rd_tp)
        self._drop_early({tp})
        self._unhanded.pop(tp, None)
        self._handed[tp] = rd_tp.offset     # the position now, also to auto-commit
        self._sought.add(tp)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                self._rd.seek(rd_tp)
                return
            except KafkaException as exc:    # the partition's fetcher is still starting
                if time.monotonic() > deadline:
                    raise from_kafka(exc, "seek") from exc
                time.sleep(0.01)

    def _targets(self, partitions: tuple) -> list[TopicPartition]:
        self._check_open()
        return [TopicPartition(*tp) for tp in partitions] or sorted(self.assignment())

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset of each partition (all assigned ones by default)."""
        for tp, offset in self.beginning_offsets(self._targets(partitions)).items():
            self._seek(self._rd_tp(tp, offset))

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move past the last readable record."""
        for tp, offset in self.end_offsets(self._targets(partitions)).items():
            self._seek(self._rd_tp(tp, offset))

    def position(self, partition: TopicPartition) -> int:
        """Offset of the next record ``poll`` will return for ``partition``; a partition
        never read yet starts at its committed offset, else by ``auto_offset_reset``, and
        stays there (sought) until it is read."""
        self._check_open()
        tp = TopicPartition(*partition)
        if tp in self._handed:
            [rd_tp] = self._handed_positions({tp})
            return rd_tp.offset
        [rd_tp] = self._app_positions([self._rd_tp(tp)])
        if rd_tp.offset >= 0:
            return rd_tp.offset
        resolved = self.committed(tp) if self.group_id is not None else None
        if resolved is None:
            if self.auto_offset_reset == "none":
                raise NoOffsetForPartitionError(-1, self.beginning_offsets([tp])[tp],
                                                self.end_offsets([tp])[tp],
                                                f"{tp.topic}-{tp.partition}")
            resolved = (self.beginning_offsets if self.auto_offset_reset == "earliest"
                        else self.end_offsets)([tp])[tp]
        # pinned, as locally: librdkafka would resolve it anew when it starts fetching, and
        # with "latest" skip what arrived in between
        self._seek(self._rd_tp(tp, resolved))
        return resolved

    def _list_offsets(self, specs: dict[TopicPartition, Any]) -> dict[TopicPartition, Any]:
        """ListOffsets through an admin client: ``{tp: ListOffsetsResultInfo}``."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka import TopicPartition as RdPartition
        from confluent_kafka.admin import AdminClient
        if self._admin is None:
            self._admin = native(self, AdminClient, connection_only(self._conf))
        level = (IsolationLevel.READ_COMMITTED if self.isolation_level == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        found = results(lambda: self._admin.list_offsets(
            {RdPartition(tp.topic, tp.partition): spec for tp, spec in specs.items()},
            isolation_level=level, request_timeout=self._timeout), "list offsets",
            self._timeout, lambda: self._admin.list_topics(timeout=self._timeout),
            LIST_OFFSETS_UNKNOWN_GRACE_S)
        return {_tp(rd_tp): info for rd_tp, info in found.items()}

    def beginning_offsets(self, partitions: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        """``{tp: log start offset}``."""
        from confluent_kafka.admin import OffsetSpec
        self._check_open()
        return {tp: info.offset for tp, info in self._list_offsets(
            {TopicPartition(*tp): OffsetSpec.earliest() for tp in partitions}).items()}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """``{tp: high watermark}`` (last stable offset with ``read_committed``)."""
        from confluent_kafka.admin import OffsetSpec
        self._check_open()
        return {tp: info.offset for tp, info in self._list_offsets(
            {TopicPartition(*tp): OffsetSpec.latest() for tp in partitions}).items()}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]
                          ) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, the earliest ``(offset, timestamp_ms)`` whose timestamp is >=
        the given one, or None."""
        from confluent_kafka.admin import OffsetSpec
        self._check_open()
        for ts in timestamps.values():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp must be a non-negative integer, got {ts!r}")
        found = self._list_offsets({TopicPartition(*tp): OffsetSpec.for_timestamp(ts)
                                    for tp, ts in timestamps.items()})
        return {tp: None if info.offset < 0 else (info.offset, info.timestamp)
                for tp, info in found.items()}

    # --- flow control ----------------------------------------------------------------------
    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of these partitions until ``resume``."""
        tps = [self._rd_tp(tp) for tp in partitions]
        with raising("pause"):
            self._rd.pause(tps)
        self._paused.update(_tp(t) for t in tps)

    def resume(self, *partitions: TopicPartition) -> None:
        tps = [self._rd_tp(tp) for tp in partitions]
        with raising("resume"):
            self._rd.resume(tps)
        self._paused.difference_update(_tp(t) for t in tps)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused) & self.assignment()

    # --- polling ---------------------------------------------------------------------------
    def poll(self, timeout_ms: float = 0, max_records: int | None = None
             ) -> dict[TopicPartition, list[Record]]:
        """Records from assigned, unpaused partitions: ``{tp: [Record, ...]}``, at most
        ``max_records`` (default ``max_poll_records``) in all. Waits up to ``timeout_ms``
        when nothing has been fetched; returns ``{}`` if still nothing."""
        self._check_open()
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records must be positive, got {max_records}")
        return self._poll(timeout_ms / 1000, max_records or self.max_poll_records)

    def _poll(self, timeout_s: float | None, max_records: int
              ) -> dict[TopicPartition, list[Record]]:
        self._store_handed()
        if (self._whole or self._pattern is not None) and \
                time.monotonic() - self._checked_at > _RECHECK_S:
            self._follow()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        rd = self._rd
        first = rd.poll(-1 if timeout_s is None else timeout_s)
        messages = [] if first is None else [first]
        if first is not None and max_records > 1:
            early = None
            if first.error() is None:
                early = self._early = TopicPartition(first.topic(), first.partition())
                self._unhanded.setdefault(early, first.offset())
            from confluent_kafka import KafkaException
            try:
                messages += rd.consume(max_records - 1, 0)
            except KafkaException as exc:      # after the first: raised at the next poll
                self._error = from_kafka(exc.args[0], "poll")
            finally:
                if early is not None and self._early is None:
                    del messages[0]                # dropped by a rebalance or a seek
                self._early = None
        out: dict[TopicPartition, list[Record]] = {}
        for m in messages:
            err = m.error()
            if err is None:
                self._take(m, out)
            elif self._error is None:
                self._error = self._failure(m, err)
        if self._listener_error is not None:
            error, self._listener_error = self._listener_error, None
            self._give_back(out)
            raise error
        if not out and self._error is not None:
            error, self._error = self._error, None
            raise error
        return out

    def _give_back(self, out: dict[TopicPartition, list[Record]]) -> None:
        """A poll raises instead of returning ``out``: its partitions are read again from
        their first record (those still assigned; the others' next owners read them)."""
        assigned = self.assignment() if out else set()
        for tp, records in out.items():
            if tp in assigned:
                self._seek(self._rd_tp(tp, records[0].offset))

    @staticmethod
    def _failure(m: Any, err: Any) -> BaseException | None:
        from confluent_kafka import KafkaError
        if err.code() == KafkaError._PARTITION_EOF:
            return None
        return from_kafka(err, f"{m.topic()}-{m.partition()}")

    def _take(self, m: Any, out: dict[TopicPartition, list[Record]]) -> None:
        """One of librdkafka's messages (not an error) into ``out``."""
        tp = TopicPartition(m.topic(), m.partition())
        kind, ts = m.timestamp()
        key, value = m.key(), m.value()
        if key is not None and self._key_deserializer is not None:
            key = self._key_deserializer(key)
        if value is not None and self._value_deserializer is not None:
            value = self._value_deserializer(value)
        offset = m.offset()
        records = out.get(tp)
        if records is None:
            records = out[tp] = []
        records.append(Record(tp.topic, tp.partition, offset, ts, 1 if kind == 2 else 0, key,
                              value, m.headers() or []))
        self._handed[tp] = offset + 1
        self._sought.discard(tp)
        if self._unhanded:
            self._unhanded.pop(tp, None)

    def __iter__(self) -> Iterator[Record]:
        """Records one by one, blocking for the next (forever, or ``consumer_timeout_ms``)."""
        self._check_open()
        if self._iterator is None:
            self._iterator = self._generate()
        return self._iterator

    def __next__(self) -> Record:
        return next(iter(self))

    def _generate(self) -> Iterator[Record]:
        try:
            while True:
                self._check_open()
                timeout = None if self.consumer_timeout_ms is None \
                    else self.consumer_timeout_ms / 1000
                out = self._poll(timeout, self.max_poll_records)
                if not out:
                    return
                for records in out.values():
                    yield from records
        finally:
            self._iterator = None

    # --- lifecycle -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("consumer is closed")

    def close(self) -> None:
        """Commit what was handed out (with auto-commit), leave the group and close.
        Idempotent."""
        if self._closed:
            return
        try:
            try:
                self._commit_handed()
            except Exception as err:          # noqa: BLE001 - closing goes on
                log.warning("consumer closing without committing what it handed out: %s", err)
            deadline = time.monotonic() + 1.0   # commit_async's reports, for a second at most
            while self._async_pending and time.monotonic() < deadline:
                m = self._rd.poll(0.05)
                if m is not None and m.error() is None:      # not handed out
                    self._unhanded.setdefault(TopicPartition(m.topic(), m.partition()),
                                              m.offset())
            self._rd.close()      # leaves the group: a listener's revocation runs in here
        finally:
            self._closed = True
        if self._listener_error is not None:
            error, self._listener_error = self._listener_error, None
            raise error

    def __enter__(self) -> KafkaConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"KafkaConsumer(servers={self._conf['bootstrap.servers']!r}, group_id="
                f"{self.group_id!r}{', closed' if self._closed else ''})")
