"""``mq.Consumer``: reads partitions straight from the broker's files, woken by a futex.

A consumer asks the broker for topic metadata, then reads without it: each poll takes the
partition's slot from the shared-memory state region (high watermark, log start offset, the
readable end as (segment base, byte position), the segment-set generation) and decodes batches
from read-only maps of the segment files (``mq.log.reader.PartitionReader``). No broker round
trip per poll.

``Consumer`` holds three parts and delegates to them; none of them knows the consumer:

- ``ConsumerDriver`` (``consumer_driver.py``): the session with the broker (connection, state
  map, semaphore, reconnects), topic metadata, slot snapshots and the waits drawn below;
- ``Fetcher`` (``fetcher.py``): a cursor per assigned partition over its ``PartitionReader``
  (positions, bounds, the ``read_committed`` skip), decoding records as they are taken;
- ``ConsumerGroup`` (``consumer_group.py``): subscription, reconciliation and commits on the
  poll thread, over the group member that the heartbeat thread drives (``membership.py``).

The consumer itself keeps the public API, the poll loop and iteration.

Wake-up protocol (no busy polling). A caught-up consumer sleeps on **futex words** when the
broker says it wakes them (Handshake ``futex_wake``) and ``mq.protocol._futex`` is built::

    consumer                                   broker
      fetch from maps: nothing new
      (seq, state) of each partition read:
        readable at a seq not seen before? fetch again
      futex_waitv(each partition's word == seq,
                  my own word)  ... asleep ...
                                                <----  publish: seq changes, FUTEX_WAKE(1)
      woken: FUTEX_WAKE(all) on each changed word
        (once per value), then fetch again

- The word is the low half of the partition slot's sequence (``mq/protocol/state.py``), which
  every publish changes. The sequence is read before the look at the slot, so a publish the
  consumer has not seen makes its sleep not begin (the word differs): nothing is lost, and no
  request is sent to sleep or to wake.
- The broker wakes **one** sleeper per publish, whatever the number of consumers, and the one
  it woke wakes the others: its CPU per record is the same for 1 and for N consumers. A
  consumer passes a value on at most once, so two consumers cannot keep waking each other, and
  it passes on every word that changed, since the broker's wake-up for any of them may have
  landed on it. A consumer killed between its wake-up and the pass-on delays the others until
  their liveness check (1 s), never more.
- The heartbeat thread interrupts the sleep through the consumer's own word (a private
  futex, ``Session.interrupt``). ``futex_waitv`` takes at most 128 words: a consumer reading
  more partitions, a broker that does not wake futexes, or ``MQ_CONSUMER_WAKE=semaphore`` use
  the consumer's semaphore instead::

    consumer                                   broker
      fetch from maps: nothing new
      drain stale posts of my semaphore
      WAIT(sem, [[topic, partition, position], ...])  ---->  post now if a position < HW;
      sem.acquire(timeout) ... blocked ...                  remember the waiters
                                                <----  HW passes a position: sem.post(),
      drain the posts left, then fetch again              the waiter's position := HW
      ... caught up: nothing new
      sem.acquire(timeout) ... blocked ...      <----  HW advances again: sem.post()

- The semaphore is the consumer's own: created ``O_CREX`` as ``<prefix><pid>-<random>``, opened
  by the broker on the first WAIT of a connection and *unlinked at once* after that (one round
  trip proves the broker holds it), so a consumer killed with SIGKILL leaves no name behind.
  Each new connection (broker restart, fork) gets a new semaphore.
- While blocked, the consumer wakes every second to check that its connection is alive: a dead
  broker cannot post, and a restarted one knows nothing of old waits. On connection loss it
  reconnects (backing off up to 1 s), re-opens the state region, refreshes metadata (slots may
  have moved) and, when the broker generation changed, re-lists every partition's segments.
- Waiters stay armed after their post, so a consumer sends one WAIT per assignment, not one
  per catch-up: after a wake-up it drains the posts left and only then reads the state, so an
  advance it did not see is posted after the drain (the broker publishes before it posts) and
  the next ``acquire`` returns at once. A WAIT is sent again when the partitions waited on,
  the topic metadata or the connection change, or a position moved below the one armed (the
  broker's waiter would wait for an offset past it); it replaces all the semaphore's waiters.
  The broker does not post a semaphore whose count is above zero (a wake-up is pending).
- Fork: a consumer used in a child process opens its own connection, state map and semaphore
  on first use (detected by pid); the parent's are left alone. Not thread-safe: use one
  consumer per thread, like kafka-python's.

Records: ``Record(topic, partition, offset, timestamp_ms, timestamp_type, key, value, headers)``.
By default ``key``, ``value`` and header values are ``memoryview``s into the segment maps (zero
copy; compare them with ``==`` to bytes, convert with ``bytes(v)`` or ``str(v, "utf-8")``). They
stay valid as long as they are referenced — also after later polls, after ``close()``, and after
retention deleted the segment: maps are only ever dropped, never closed under a live view (see
``mq.log.reader``; compressed batches give views of their decompressed bytes, and the tail of a
growing segment may be served from a ``pread`` copy). Pickling a record copies them to bytes.
``value_bytes=True`` gives ``bytes`` instead (one copy per field); ``key_deserializer`` and
``value_deserializer`` (kafka-python's) are applied to non-null fields.

Without a ``group_id``, topics given to the constructor are assigned whole: every partition,
including partitions added later (a simple subscriber). ``assign()`` replaces that with a manual
assignment. With a ``group_id``, topics (or ``pattern``) subscribe: the broker assigns each
member its share and moves partitions when members come and go (``consumer_group.py`` and
``membership.py``); ``commit``/``committed`` store offsets in ``__consumer_offsets``.

Never returned: records at or past the high watermark (the last stable offset with
``isolation_level="read_committed"``), and control batches (transaction markers), which only
advance the position. A ``read_committed`` consumer also skips the records of aborted
transactions: the aborts overlapping what it read come from the segments' ``.txnindex``
(``PartitionReader.aborted_transactions``), and a producer's transactional batches are skipped
from the aborted transaction's first offset up to its ABORT marker (Kafka's fetcher rule).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from mq.client.consumer_driver import MAX_FUTEX_WORDS, ConsumerDriver
from mq.client.consumer_group import CommitCallback, ConsumerGroup, ConsumerRebalanceListener
from mq.client.consumer_options import (
    check_group_options,
    check_read_options,
    check_spin,
    check_subscription,
)
from mq.client.fetcher import TAIL_EMPTY, TAIL_PYTHON, TAIL_TOOK, Fetcher, Record
from mq.client.kafka.config import backend_args, bootstrap
from mq.client.types import ConsumerGroupMetadata, TopicPartition
from mq.errors import (
    BrokerUnavailableError,
    ClosedError,
    NoOffsetForPartitionError,
    UnknownTopicOrPartitionError,
)
from mq.protocol.messages import Api

__all__ = ["Consumer", "Record", "TopicPartition", "NoOffsetForPartitionError",
           "ConsumerRebalanceListener"]


class Consumer:
    """Read records from topic partitions. See the module docstring for the design.

    ``*topics`` (without ``group_id``): assign every partition of them. With ``group_id``:
    subscribe (also ``pattern``, a regex over topic names) — see ``subscribe``; ``listener``
    gets ``on_partitions_revoked/assigned/lost``; ``group_instance_id`` makes the member
    static (a restart within ``session_timeout_ms`` gets its partitions back without a
    rebalance); ``assignor``: "range", "roundrobin" or "sticky" (the broker's default);
    ``max_poll_interval_ms``: leave the group when ``poll`` is not called for this long;
    ``enable_auto_commit``: commit positions every ``auto_commit_interval_ms`` inside
    ``poll``, before a revocation and on ``close``. ``auto_offset_reset``:
    where a partition without a position, or with one outside the log, starts ("earliest",
    "latest", or "none" to raise). ``max_poll_records``: records per ``poll`` by default.
    ``max_partition_fetch_bytes``: bytes of batches taken from one partition's map per read.
    ``value_bytes``/``key_deserializer``/``value_deserializer``: see the module docstring.
    ``consumer_timeout_ms``: iteration stops after this long without a record (default:
    never). ``check_crcs``: verify each batch's CRC-32C before decoding it (Kafka's default).
    ``spin_us``: the wait strategy of a caught-up ``poll``. 0 (the default) sleeps on the
    partitions' futex words at once, using no CPU while idle; above 0 it first watches them
    for up to this many microseconds without sleeping (one CPU busy), so a record published
    meanwhile is seen without a scheduler wake-up (README, "Wait strategies").
    ``bootstrap_servers`` ("host:port,...") and ``kafka_config`` (librdkafka properties:
    security...): a Kafka cluster instead of the local broker, with the same options and API
    (``mq/client/kafka/consumer.py`` says what differs).

    Raises ``BrokerUnavailableError`` when no broker answers, ``UnknownTopicOrPartitionError``
    for a topic that does not exist (without a group; a group may subscribe to a topic
    before it exists);
    ``poll`` raises ``CorruptRecordError`` for a damaged batch (after returning the records
    before it).
    """

    def __new__(cls, *topics: str, socket: str | None = None,
                bootstrap_servers: str | Iterable[str] | None = None,
                kafka_config: dict | None = None, **options) -> Any:
        """The local consumer, or with a Kafka cluster (``bootstrap_servers``, else
        ``$MQ_BOOTSTRAP_SERVERS`` when no ``socket`` is given) the backend on it
        (``mq/client/kafka/consumer.py``), which takes the same options."""
        servers = bootstrap(socket, bootstrap_servers)
        backend_args(servers, (), kafka_config)
        if servers is None:
            return super().__new__(cls)
        from mq.client.kafka.consumer import KafkaConsumer
        return KafkaConsumer(servers, *topics, kafka_config=kafka_config, **options)

    def __init__(self, *topics: str, group_id: str | None = None, socket: str | None = None,
                 auto_offset_reset: str = "earliest", enable_auto_commit: bool = True,
                 isolation_level: str = "read_uncommitted", max_poll_records: int = 500,
                 max_partition_fetch_bytes: int = 1 << 20, value_bytes: bool = False,
                 key_deserializer=None, value_deserializer=None,
                 consumer_timeout_ms: float | None = None, request_timeout_ms: int = 30_000,
                 check_crcs: bool = True, pattern: str | None = None,
                 listener: ConsumerRebalanceListener | None = None,
                 group_instance_id: str | None = None, assignor: str | None = None,
                 session_timeout_ms: int = 45_000, max_poll_interval_ms: int = 300_000,
                 auto_commit_interval_ms: int = 5_000, spin_us: float = 0,
                 bootstrap_servers: str | Iterable[str] | None = None,
                 kafka_config: dict | None = None) -> None:
        check_read_options(auto_offset_reset, isolation_level, max_poll_records,
                           max_partition_fetch_bytes)
        spin_s = check_spin(spin_us)
        check_group_options(group_id, pattern, session_timeout_ms, max_poll_interval_ms,
                            auto_commit_interval_ms)
        self.group_id = group_id
        self.isolation_level = isolation_level
        self.max_poll_records = max_poll_records
        self.consumer_timeout_ms = consumer_timeout_ms
        self._closed = False
        self._subscribed: tuple[str, ...] = tuple(topics) if group_id is None else ()
        self._subscribed_topics: dict | None = None     # the metadata _subscribed was expanded by
        self._iterator: Iterator[Record] | None = None
        read_committed = isolation_level == "read_committed"
        self._driver = driver = ConsumerDriver(socket, request_timeout_ms / 1000, read_committed,
                                               spin_s=spin_s)
        self._fetcher = Fetcher(driver, read_committed=read_committed,
                                auto_offset_reset=auto_offset_reset,
                                max_partition_fetch_bytes=max_partition_fetch_bytes,
                                check_crcs=check_crcs, value_bytes=value_bytes,
                                key_deserializer=key_deserializer,
                                value_deserializer=value_deserializer)
        self._group = ConsumerGroup(driver, self._fetcher, group_id=group_id,
                                    read_committed=read_committed,
                                    enable_auto_commit=enable_auto_commit, listener=listener,
                                    instance_id=group_instance_id, assignor=assignor,
                                    session_timeout_ms=session_timeout_ms,
                                    max_poll_interval_ms=max_poll_interval_ms,
                                    auto_commit_interval_ms=auto_commit_interval_ms)
        try:
            driver.refresh_metadata()
            if group_id is not None and (topics or pattern is not None):
                self.subscribe(topics, pattern)
            elif topics:
                missing = [t for t in topics if t not in driver.topics]
                if missing:
                    raise UnknownTopicOrPartitionError(f"unknown topic {missing[0]!r}")
                self._follow_subscription()
        except BaseException:
            self.close()
            raise

    # --- configuration, kept on the parts -------------------------------------------------------
    @property
    def auto_offset_reset(self) -> str:
        return self._fetcher.auto_offset_reset

    @property
    def max_partition_fetch_bytes(self) -> int:
        return self._fetcher.max_partition_fetch_bytes

    @property
    def check_crcs(self) -> bool:
        return self._fetcher.check_crcs

    @property
    def value_bytes(self) -> bool:
        return self._fetcher.value_bytes

    @property
    def key_deserializer(self):
        return self._fetcher.key_deserializer

    @property
    def value_deserializer(self):
        return self._fetcher.value_deserializer

    @property
    def enable_auto_commit(self) -> bool:
        return self._group.enable_auto_commit

    @property
    def group_instance_id(self) -> str | None:
        return self._group.instance_id

    @property
    def assignor(self) -> str | None:
        return self._group.assignor

    @property
    def session_timeout_ms(self) -> int:
        return self._group.session_timeout_ms

    @property
    def max_poll_interval_ms(self) -> int:
        return self._group.max_poll_interval_ms

    @property
    def auto_commit_interval_ms(self) -> int:
        return self._group.auto_commit_interval_ms

    # --- metadata -------------------------------------------------------------------------------
    def _metadata(self) -> dict[str, dict]:
        """The topics, refreshed if the broker's changed (and a simple subscriber's
        assignment grown by partitions added since)."""
        self._driver.check_metadata(self._driver.require())
        self._follow_subscription()
        return self._driver.topics

    def _follow_subscription(self) -> None:
        """Without a group, the constructor's topics are assigned whole, new partitions too."""
        topics = self._driver.topics
        if not self._subscribed or topics is self._subscribed_topics:
            return
        self._subscribed_topics = topics
        cursors = self._fetcher.cursors
        new = [TopicPartition(t, p) for t in self._subscribed if t in topics
               for p in range(topics[t]["partitions"]) if TopicPartition(t, p) not in cursors]
        if new:
            self._fetcher.assign(list(cursors) + new)

    # --- assignment -----------------------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing the assignment, and the constructor's
        topics). Positions of partitions that stay assigned are kept. Raises
        ``UnknownTopicOrPartitionError`` for a partition that does not exist."""
        if self._group.membership is not None:
            raise ValueError(f"this consumer subscribes through group {self.group_id!r}; "
                             "call unsubscribe() before assign()")
        tps = [TopicPartition(*tp) for tp in partitions]
        self._check_open()
        self._metadata()
        for tp in tps:
            self._driver.slot(tp)
        self._subscribed = ()
        self._fetcher.rewind()
        self._fetcher.assign(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetcher.cursors)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """Partition numbers of ``topic``, or None if it does not exist."""
        info = self._metadata().get(topic)
        return None if info is None else set(range(info["partitions"]))

    def topics(self) -> set[str]:
        return set(self._metadata())

    # --- group ----------------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join (or change the subscription in) the consumer's group: the broker assigns
        partitions of ``topics``, or of every topic whose name matches the regex ``pattern``
        (full match; internal topics never match), including topics created later."""
        self._check_open()
        topics = check_subscription(self.group_id, topics, pattern)
        if listener is not None:
            self._group.listener = listener
        self._subscribed = ()
        if self._group.membership is None and self._fetcher.cursors:
            self._fetcher.assign([])
        self._group.join(topics, pattern)

    def unsubscribe(self) -> None:
        """Leave the group (committing first with auto-commit) and drop every partition."""
        self._check_open()
        self._group.leave()
        self._fetcher.assign([])

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group id, member id and member epoch (Kafka's
        ``groupMetadata()``), for ``Producer.send_offsets_to_transaction``. Raises
        ``ValueError`` without a ``group_id``."""
        return self._group.metadata()

    def commit(self, offsets: Mapping | None = None) -> None:
        """Commit offsets and wait until the broker has them on disk. Default: the position
        of every assigned partition. ``offsets``: ``{tp: offset}`` or ``{tp: (offset,
        metadata)}``. In a group, a commit the broker refuses for the member's id or epoch
        (the epoch moved meanwhile, or the broker restarted and the member has not rejoined
        yet) or that the broker going away cut off goes again once the member heartbeated,
        within ``request_timeout_ms``. Raises ``CommitFailedError`` if the member lost a
        partition meanwhile (another member may own it), else the last error on timeout
        (``StaleMemberEpochError``, ``UnknownMemberIdError``, ``BrokerUnavailableError``),
        or the broker's (``NonEmptyGroupError`` for a group-less consumer of a group with
        live members, ``UnknownTopicOrPartitionError``)."""
        self._check_open()
        self._group.commit(offsets)

    def commit_async(self, offsets: Mapping | None = None,
                     callback: CommitCallback | None = None) -> None:
        """Send a commit without waiting; ``callback(offsets, error_or_None)`` runs inside a
        later ``poll``, ``commit`` or ``close``."""
        self._check_open()
        self._group.commit_async(offsets, callback)

    def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset for ``partition`` (None if it has none)."""
        self._check_open()
        return self._group.committed(TopicPartition(*partition))

    # --- positions ------------------------------------------------------------------------------
    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on at the next poll. An offset outside the log
        is resolved then by ``auto_offset_reset``."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
        self._check_open()
        c = self._fetcher.cursor(partition)
        self._fetcher.rewind([c.tp])
        c.seek(offset)

    def _targets(self, partitions) -> list:
        self._check_open()
        if not partitions:
            return list(self._fetcher.order)
        return [self._fetcher.cursor(tp) for tp in partitions]

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset of each partition (all assigned ones by default)."""
        for c in self._targets(partitions):
            self._fetcher.rewind([c.tp])
            c.seek(self._driver.state(c.tp).log_start_offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move past the last readable record (the high watermark, or the last stable
        offset with ``read_committed``)."""
        for c in self._targets(partitions):
            self._fetcher.rewind([c.tp])
            c.seek(self._fetcher.bound(self._driver.state(c.tp)))

    def position(self, partition: TopicPartition) -> int:
        """Offset of the next record ``poll`` (or iteration) will return for ``partition``;
        resolves a missing position with ``auto_offset_reset``."""
        self._check_open()
        fetcher = self._fetcher
        c = fetcher.cursor(partition)
        position = fetcher.positions([c.tp]).get(c.tp)
        if position is None and c.held:
            committed = self._group.committed(c.tp)     # waits for the transaction holding it
            if c.offset is None:
                self._group.start(c.tp, committed)
            position = c.position
        if position is None:
            fetcher.reset(c, self._driver.state(c.tp), None)
            position = c.position
        return position

    def beginning_offsets(self, partitions: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        """``{tp: log start offset}`` from the shared state (no broker round trip)."""
        self._check_open()
        return {TopicPartition(*tp): self._driver.state(TopicPartition(*tp)).log_start_offset
                for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """``{tp: high watermark}`` (last stable offset with ``read_committed``)."""
        self._check_open()
        return {TopicPartition(*tp): self._fetcher.bound(self._driver.state(TopicPartition(*tp)))
                for tp in partitions}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]
                          ) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, the earliest ``(offset, timestamp_ms)`` whose timestamp is >=
        the given one, or None (Kafka's ListOffsets). Raises ``ValueError`` for a negative
        timestamp."""
        session = self._driver.require()
        out = {}
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp must be a non-negative integer, got {ts!r}")
            tp = TopicPartition(*tp)
            reply = session.conn.call(Api.LIST_OFFSETS, tp.topic, tp.partition, ts)
            offset, found_ts = reply["offset"], reply["timestamp"]
            out[tp] = None if offset < 0 else (offset, found_ts)
        return out

    # --- flow control ---------------------------------------------------------------------------
    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of these partitions until ``resume``."""
        tps = [self._fetcher.cursor(tp).tp for tp in partitions]
        self._fetcher.rewind(tps)
        self._fetcher.pause(tps)

    def resume(self, *partitions: TopicPartition) -> None:
        self._fetcher.resume(partitions)

    def paused(self) -> set[TopicPartition]:
        return self._fetcher.paused()

    # --- polling --------------------------------------------------------------------------------
    def poll(self, timeout_ms: float = 0, max_records: int | None = None
             ) -> dict[TopicPartition, list[Record]]:
        """Records from assigned, unpaused partitions: ``{tp: [Record, ...]}``, at most
        ``max_records`` (default ``max_poll_records``) in all, in offset order per partition.
        Waits up to ``timeout_ms`` when nothing is readable; returns ``{}`` if still nothing.

        Raises ``OffsetOutOfRangeError`` (``auto_offset_reset="none"``),
        ``UnknownTopicOrPartitionError`` (a topic was deleted), ``ClosedError``.
        """
        self._check_open()
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records must be positive, got {max_records}")
        self._fetcher.rewind()
        return self._poll(timeout_ms / 1000, max_records or self.max_poll_records)

    def _poll(self, timeout_s: float | None, max_records: int
              ) -> dict[TopicPartition, list[Record]]:
        m = self._group.membership
        if m is None:
            return self._poll_loop(timeout_s, max_records)
        m.poll_started()
        try:
            return self._poll_loop(timeout_s, max_records)
        finally:
            m.poll_ended()

    def _poll_loop(self, timeout_s: float | None, max_records: int
                   ) -> dict[TopicPartition, list[Record]]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        driver, group = self._driver, self._group
        while True:
            in_group = group.membership is not None
            session = driver.live(forbid_fork=in_group)
            if session is not None and session.futex and not (group.async_commits
                                                               or group.held) and \
                    (not self._subscribed or driver.topics is self._subscribed_topics):
                # A group member's round first (auto-commit, reconciliation), as the Python
                # path's take has it; a change of the assignment meanwhile ends the tail poll.
                tail = True
                if in_group:
                    try:
                        group.round(session)
                    except BrokerUnavailableError:
                        driver.lost()
                        continue
                    tail = not (group.async_commits or group.held)
                cursors = self._fetcher.tail_cursors() if tail else None
                if cursors is not None and len(cursors) < MAX_FUTEX_WORDS:
                    out = self._poll_tail(session, cursors, deadline, max_records, in_group)
                    if out is not None:
                        return out
                    if driver.session is not session:
                        continue              # lost in the sleep: reconnect first
            if session is not None:
                try:
                    if in_group or group.async_commits:
                        group.round(session)
                    if self._subscribed:      # partitions added: read them in this take
                        driver.check_metadata(session)
                        self._follow_subscription()
                    out = self._fetcher.take(session, max_records, in_group)
                except BrokerUnavailableError:
                    driver.lost()             # mid metadata refresh: reconnect and go on
                    session = None
                else:
                    if out:
                        return out
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return {}
            if group.held:                    # asking again for held offsets is due then
                due = max(0.0, group.retry_held_at - time.monotonic())
                remaining = due if remaining is None else min(remaining, due)
            driver.wait(session, self._fetcher.watched(), remaining, group.changed,
                        group.on_reply)

    def _poll_tail(self, session, cursors: list, deadline: float | None, max_records: int,
                   in_group: bool = False) -> dict[TopicPartition, list[Record]] | None:
        """A caught-up consumer (``Fetcher.tail_cursors``) polls here: from the broker's
        published state to its records in one C call per partition (``Fetcher.take_tails``),
        and its futex sleep (``ConsumerDriver.sleep_tail``), whose C call takes the woken
        partition's records right after the wake-up, with no Python between. None when
        ``_poll_loop`` goes on: whatever the C take leaves to the Python path, a sleep's
        slice passed, an interrupt, or (``in_group``) the member's assignment changed: the
        heartbeat thread's change wakes the sleep through ``session.local``."""
        fetcher, driver, group = self._fetcher, self._driver, self._group
        on_reply = group.on_reply
        words = [driver.slot_base(c.tp) for c in cursors]
        seqs = [0] * len(cursors)
        takes: list = [None] * len(cursors)
        while True:
            local = int.from_bytes(session.local, "little")     # before the look: no lost wake
            if in_group and group.changed():
                return None                   # the round reconciles before the next read
            status, out = fetcher.take_tails(session, cursors, words, seqs, takes, max_records)
            if out:
                return out
            if status != TAIL_EMPTY:
                if status == TAIL_TOOK:
                    continue                  # batches below the positions: read on
                return None
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return {}
            again, woken, taken = driver.sleep_tail(session, words, seqs, local, remaining,
                                                    on_reply, takes)
            if taken is not None:             # the woken partition's take, in the same call
                c = cursors[woken]
                status, records = fetcher.took_tail(c, taken, max_records)
                if records:
                    return {c.tp: records}
                if status == TAIL_PYTHON:
                    return None
            elif not again:
                return None

    # --- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Record]:
        """Records one by one, blocking for the next (forever, or ``consumer_timeout_ms``)."""
        self._check_open()
        if self._iterator is None:
            self._iterator = self._generate()
        return self._iterator

    def __next__(self) -> Record:
        return next(iter(self))

    def _generate(self) -> Iterator[Record]:
        fetcher = self._fetcher
        try:
            while True:
                it = fetcher.handed
                yield from it                 # C-level delegation: no bytecode per record
                if it is not fetcher.handed:
                    continue                  # replaced by a rewind: go on with it
                timeout = None if self.consumer_timeout_ms is None \
                    else self.consumer_timeout_ms / 1000
                self._check_open()
                out = self._poll(timeout, self.max_poll_records)
                if not out:
                    return
                fetcher.hand_out([r for records in out.values() for r in records])
        finally:
            self._iterator = None

    # --- lifecycle ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("consumer is closed")

    def close(self) -> None:
        """Close the connection, state map and readers. Records already returned stay valid
        (their maps are unmapped when the last one is released). Idempotent."""
        if self._closed:
            return
        try:
            self._group.leave()
            self._group.finish_async_commits(timeout=1.0)
        finally:
            self._closed = True
        self._driver.close()
        self._fetcher.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Consumer(assignment={sorted(self._fetcher.cursors)}, "
                f"group_id={self.group_id!r}{', closed' if self._closed else ''})")
