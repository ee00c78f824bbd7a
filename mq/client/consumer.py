"""``mq.Consumer``: reads partitions straight from the broker's files, woken by a futex.

A consumer asks the broker for topic metadata, then reads without it: each poll takes the
partition's slot from the shared-memory state region (high watermark, log start offset, the
readable end as (segment base, byte position), the segment-set generation) and decodes batches
from read-only maps of the segment files (``mq.log.reader.PartitionReader``). No broker round
trip per poll.

The session with the broker (connection, state map, semaphore, reconnects) and the read path
from the maps to records are in ``fetching.py``; waiting and iteration are here.

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
member its share and moves partitions when members come and go (``consumer_groups.py`` and
``membership.py``); ``commit``/``committed`` store offsets in ``__consumer_offsets``.

Never returned: records at or past the high watermark (the last stable offset with
``isolation_level="read_committed"``), and control batches (transaction markers), which only
advance the position. A ``read_committed`` consumer also skips the records of aborted
transactions: the aborts overlapping what it read come from the segments' ``.txnindex``
(``PartitionReader.aborted_transactions``), and a producer's transactional batches are skipped
from the aborted transaction's first offset up to its ABORT marker (Kafka's fetcher rule).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator

import posix_ipc

from mq.client.consumer_groups import ConsumerRebalanceListener, GroupConsumer
from mq.client.fetching import RECONNECT_BACKOFF_S, Fetch, Fetcher, Record, Session
from mq.client.types import TopicPartition
from mq.errors import (
    BrokerUnavailableError,
    ClosedError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from mq.log.reader import PartitionReader
from mq.protocol.messages import Api
from mq.protocol.state import futex, slot_offset

__all__ = ["Consumer", "Record", "TopicPartition", "NoOffsetForPartitionError",
           "ConsumerRebalanceListener"]

_LIVENESS_CHECK_S = 1.0           # a blocked consumer checks its connection this often
_MAX_WORDS = 127                  # futex_waitv's limit, less the consumer's own word
_ALL = 0x7FFFFFFF                 # FUTEX_WAKE: every sleeper


def _block(sem: posix_ipc.Semaphore, timeout: float) -> bool:
    """Wait for a post; True if one came, False on timeout. (A seam for tests.)"""
    try:
        sem.acquire(timeout)
    except posix_ipc.BusyError:
        return False
    except posix_ipc.SignalError:
        return True                       # EINTR: let the caller look again
    return True


def _sleep_on(region, offsets: list[int], values: list[int], local: bytearray,
              local_value: int, timeout: float) -> int:
    """Futex sleep (``_futex.wait_any``): the index of the word woken, -1 on timeout, -2 if
    one had already changed. (A seam for tests, like ``_block``.)"""
    return futex.wait_any(region, offsets, values, local, local_value, timeout)


def _drain(sem: posix_ipc.Semaphore) -> None:
    """Take every post pending on ``sem``."""
    try:
        while True:
            sem.acquire(0)
    except posix_ipc.BusyError:
        pass


class Consumer(Fetcher, GroupConsumer):
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

    Raises ``BrokerUnavailableError`` when no broker answers, ``UnknownTopicOrPartitionError``
    for a topic that does not exist (without a group; a group may subscribe to a topic
    before it exists);
    ``poll`` raises ``CorruptRecordError`` for a damaged batch (after returning the records
    before it).
    """

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
                 auto_commit_interval_ms: int = 5_000) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', got "
                             f"{auto_offset_reset!r}")
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', "
                             f"got {isolation_level!r}")
        if max_poll_records < 1 or max_partition_fetch_bytes < 1:
            raise ValueError("max_poll_records and max_partition_fetch_bytes must be positive")
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise ValueError(f"group_id must be a non-empty string, got {group_id!r}")
        if pattern is not None and group_id is None:
            raise ValueError("a pattern subscription needs a group_id")
        self.group_id = group_id
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit
        self.isolation_level = isolation_level
        self.max_poll_records = max_poll_records
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.value_bytes = value_bytes
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer
        self.consumer_timeout_ms = consumer_timeout_ms
        self.check_crcs = check_crcs
        self._socket = socket
        self._timeout = request_timeout_ms / 1000
        self._read_committed = isolation_level == "read_committed"
        self._closed = False
        self._fetches: dict[TopicPartition, Fetch] = {}
        self._order: list[Fetch] = []
        self._next_start = 0
        self._subscribed: tuple[str, ...] = tuple(topics) if group_id is None else ()
        self._init_group(listener=listener, instance_id=group_instance_id, assignor=assignor,
                         session_timeout_ms=session_timeout_ms,
                         max_poll_interval_ms=max_poll_interval_ms,
                         auto_commit_interval_ms=auto_commit_interval_ms)
        self._topics: dict[str, dict] = {}
        self._meta_version = -1
        self._it_records: list[Record] = []
        self._it_iter = iter(self._it_records)
        self._iterator: Iterator[Record] | None = None
        self._reconnect_at = 0.0
        self._backoff = RECONNECT_BACKOFF_S[0]
        self._session: Session | None = Session(socket, self._timeout)
        self._generation = self._session.generation
        try:
            self._refresh_metadata()
            if group_id is not None and (topics or pattern is not None):
                self.subscribe(topics, pattern)
            elif topics:
                missing = [t for t in topics if t not in self._topics]
                if missing:
                    raise UnknownTopicOrPartitionError(f"unknown topic {missing[0]!r}")
                self._assign(self._subscribed_partitions())
        except BaseException:
            self.close()
            raise

    # --- metadata -------------------------------------------------------------------------------
    def _refresh_metadata(self) -> None:
        session = self._require_session()
        version = session.state.metadata_version     # before the call: never miss a change
        self._topics = session.conn.call(Api.METADATA, None)["topics"]
        self._meta_version = version
        for f in self._order:
            info = self._topics.get(f.tp.topic)
            if info is None or f.tp.partition >= info["partitions"]:
                continue                      # poll raises UnknownTopicOrPartitionError
            if f.topic_id is not None and f.topic_id != info["id"]:
                f.reader.reset()              # deleted and created again: other files
                f.clear()
            f.topic_id = info["id"]
        if self._subscribed:
            new = [tp for tp in self._subscribed_partitions() if tp not in self._fetches]
            if new:
                self._assign(list(self._fetches) + new)

    def _check_metadata(self, session: Session) -> None:
        if session.state.metadata_version != self._meta_version:
            self._refresh_metadata()

    def _subscribed_partitions(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in self._subscribed if t in self._topics
                for p in range(self._topics[t]["partitions"])]

    def _slot(self, tp: TopicPartition) -> int:
        info = self._topics.get(tp.topic)
        if info is None or not 0 <= tp.partition < info["partitions"]:
            raise UnknownTopicOrPartitionError(f"unknown topic or partition {tp.topic}-"
                                               f"{tp.partition}")
        return info["slots"][tp.partition]

    def _state(self, tp: TopicPartition, session: Session | None = None):
        """A consistent slot snapshot for ``tp`` (``session``: the live one, if the caller has
        it); raises ``UnknownTopicOrPartitionError``."""
        if session is None:
            session = self._require_session()
        while True:
            self._check_metadata(session)
            st = session.state.read(self._slot(tp))
            # A deleted topic's slot is reused by the next topic created: the snapshot counts
            # only if the topics did not change while it was taken.
            if session.state.metadata_version == self._meta_version:
                break
        if st.high_watermark < 0:
            raise UnknownTopicOrPartitionError(f"topic {tp.topic!r} was deleted")
        return st

    # --- assignment -----------------------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing the assignment, and the constructor's
        topics). Positions of partitions that stay assigned are kept. Raises
        ``UnknownTopicOrPartitionError`` for a partition that does not exist."""
        if self._membership is not None:
            raise ValueError(f"this consumer subscribes through group {self.group_id!r}; "
                             "call unsubscribe() before assign()")
        tps = [TopicPartition(*tp) for tp in partitions]
        session = self._require_session()
        self._check_metadata(session)
        for tp in tps:
            self._slot(tp)
        self._subscribed = ()
        self._rewind_iterator()
        self._assign(tps)

    def _assign(self, tps: list[TopicPartition]) -> None:
        session = self._require_session()
        fetches = {}
        for tp in dict.fromkeys(tps):
            f = self._fetches.get(tp)
            if f is None:
                f = Fetch(tp, PartitionReader(os.path.join(session.data_dir,
                                                            f"{tp.topic}-{tp.partition}")))
                f.topic_id = self._topics[tp.topic]["id"]
            fetches[tp] = f
        for tp, f in self._fetches.items():
            if tp not in fetches:
                f.reader.close()
        self._fetches = fetches
        self._order = list(fetches.values())
        self._next_start = 0

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetches)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """Partition numbers of ``topic``, or None if it does not exist."""
        session = self._require_session()
        self._check_metadata(session)
        info = self._topics.get(topic)
        return None if info is None else set(range(info["partitions"]))

    def topics(self) -> set[str]:
        session = self._require_session()
        self._check_metadata(session)
        return set(self._topics)

    def _fetch_of(self, tp: TopicPartition) -> Fetch:
        f = self._fetches.get(TopicPartition(*tp))
        if f is None:
            raise ValueError(f"{tp} is not assigned to this consumer")
        return f

    # --- positions ------------------------------------------------------------------------------
    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on at the next poll. An offset outside the log
        is resolved then by ``auto_offset_reset``."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
        self._check_open()
        f = self._fetch_of(partition)
        self._rewind_iterator([f.tp])
        self._seek(f, offset)

    @staticmethod
    def _seek(f: Fetch, offset: int) -> None:
        f.offset = offset
        f.clear()

    def _targets(self, partitions) -> list[Fetch]:
        self._check_open()
        if not partitions:
            return list(self._order)
        return [self._fetch_of(tp) for tp in partitions]

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start offset of each partition (all assigned ones by default)."""
        for f in self._targets(partitions):
            self._rewind_iterator([f.tp])
            self._seek(f, self._state(f.tp).log_start_offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move past the last readable record (the high watermark, or the last stable
        offset with ``read_committed``)."""
        for f in self._targets(partitions):
            self._rewind_iterator([f.tp])
            self._seek(f, self._bound(self._state(f.tp)))

    def position(self, partition: TopicPartition) -> int:
        """Offset of the next record ``poll`` (or iteration) will return for ``partition``;
        resolves a missing position with ``auto_offset_reset``."""
        self._check_open()
        f = self._fetch_of(partition)
        position = self._positions([f.tp]).get(f.tp)
        if position is None and f.tp in self._unstable:
            committed = self.committed(f.tp)     # waits for the transaction holding it
            if f.offset is None:
                self._unstable.discard(f.tp)
                self._start_at(f.tp, committed)
            position = f.position
        if position is None:
            self._reset(f, self._state(f.tp), None)
            position = f.position
        return position

    def beginning_offsets(self, partitions: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        """``{tp: log start offset}`` from the shared state (no broker round trip)."""
        self._check_open()
        return {TopicPartition(*tp): self._state(TopicPartition(*tp)).log_start_offset
                for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """``{tp: high watermark}`` (last stable offset with ``read_committed``)."""
        self._check_open()
        return {TopicPartition(*tp): self._bound(self._state(TopicPartition(*tp)))
                for tp in partitions}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]
                          ) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, the earliest ``(offset, timestamp_ms)`` whose timestamp is >=
        the given one, or None (Kafka's ListOffsets). Raises ``ValueError`` for a negative
        timestamp."""
        session = self._require_session()
        out = {}
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp must be a non-negative integer, got {ts!r}")
            tp = TopicPartition(*tp)
            reply = session.conn.call(Api.LIST_OFFSETS, tp.topic, tp.partition, ts)
            offset, found_ts = reply["offset"], reply["timestamp"]
            out[tp] = None if offset < 0 else (offset, found_ts)
        return out

    def _bound(self, st) -> int:
        return st.last_stable_offset if self._read_committed else st.high_watermark

    def _reset(self, f: Fetch, st, bad_offset: int | None) -> None:
        """Choose a position by ``auto_offset_reset``, or raise when it is "none"."""
        if self.auto_offset_reset == "earliest":
            self._seek(f, st.log_start_offset)
        elif self.auto_offset_reset == "latest":
            self._seek(f, self._bound(st))
        elif bad_offset is None:
            raise NoOffsetForPartitionError(-1, st.log_start_offset, st.high_watermark,
                                            f"{f.tp.topic}-{f.tp.partition}")
        else:
            raise OffsetOutOfRangeError(bad_offset, st.log_start_offset, st.log_end_offset,
                                        f"{f.tp.topic}-{f.tp.partition}")

    # --- flow control ---------------------------------------------------------------------------
    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of these partitions until ``resume``."""
        for tp in partitions:
            f = self._fetch_of(tp)
            self._rewind_iterator([f.tp])
            f.paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._fetch_of(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        return {f.tp for f in self._order if f.paused}

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
        self._rewind_iterator()
        return self._poll(timeout_ms / 1000, max_records or self.max_poll_records)

    def _poll(self, timeout_s: float | None, max_records: int
              ) -> dict[TopicPartition, list[Record]]:
        m = self._membership
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
        while True:
            session = self._live_session()
            if session is not None:
                try:
                    if self._membership is not None or self._async_commits:
                        self._group_round(session)
                    out = self._fetch(session, max_records)
                except BrokerUnavailableError:
                    self._lost()              # mid metadata refresh: reconnect and go on
                    session = None
                else:
                    if out:
                        return out
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return {}
            self._wait(session, remaining)

    # --- waiting --------------------------------------------------------------------------------
    def _wait(self, session: Session | None, remaining: float | None) -> None:
        """Block until the broker posts, ``remaining`` passes or a liveness check is due."""
        slice_s = _LIVENESS_CHECK_S if remaining is None else min(remaining, _LIVENESS_CHECK_S)
        if self._unstable:                    # asking again for held offsets is due then
            slice_s = max(0.0, min(slice_s, self._unstable_retry_at - time.monotonic()))
        if session is None:
            # Disconnected: back off until the next reconnect attempt (nothing can post).
            pause = max(0.0, self._reconnect_at - time.monotonic())
            time.sleep(min(slice_s, pause) if pause else 0.001)
            return
        if session.futex and len(self._order) < _MAX_WORDS:
            try:
                self._sleep(session, slice_s)
                return
            except OSError:                   # no futex_waitv (ENOSYS): the semaphore
                session.futex = False
        positions = []
        for f in self._order:
            if f.paused or f.offset is None:
                continue
            offset = f.offset
            if self._read_committed:
                # Wake when data arrives past the high watermark: the last stable offset only
                # moves when a marker is appended.
                offset = max(offset, self._state(f.tp, session).high_watermark)
            positions.append([f.tp.topic, f.tp.partition, offset])
        key = (self._meta_version, [(topic, partition) for topic, partition, _ in positions])
        armed = session.armed
        if armed is None or armed[0] != key or any(
                p[2] < offset for p, offset in zip(positions, armed[1], strict=True)):
            _drain(session.sem)               # posts made before this look
            try:
                session.conn.send(Api.WAIT, session.name, positions)
            except BrokerUnavailableError:
                self._lost()
                return
            session.armed = (key, [p[2] for p in positions])
        if self._group_changed():
            return                            # the heartbeat thread's post may be drained
        if _block(session.sem, slice_s):
            _drain(session.sem)               # before the next look at the state (module doc)
        elif not session.alive(self._on_reply):
            self._lost()

    def _sleep(self, session: Session, slice_s: float) -> None:
        """Futex wake-ups (module doc): sleep on the words of the partitions read until a
        publish changes one, the heartbeat thread bumps ``session.local``, or ``slice_s``
        passes."""
        state, seen = session.state, session.seen
        local = int.from_bytes(session.local, "little")      # before the group check
        offsets, values = [], []
        look = False
        for f in self._order:
            if f.paused or f.offset is None:
                continue
            try:
                slot = self._slot(f.tp)
            except UnknownTopicOrPartitionError:
                continue                          # deleted: nothing will be published there
            seq, st = state.snapshot(slot)
            if st.high_watermark < 0:
                return                            # deleted: the next fetch says so
            bound = st.last_stable_offset if self._read_committed else st.high_watermark
            word = slot_offset(slot)
            # Readable at a sequence the last fetch may not have seen: look again. (At a
            # sequence already slept on, it is what that fetch could not return.)
            if bound > f.offset and seen.get(word) != seq:
                look = True
            seen[word] = seq
            offsets.append(word)
            values.append(seq & 0xFFFFFFFF)
        if look or state.metadata_version != self._meta_version or self._group_changed():
            return
        woken = _sleep_on(state.region, offsets, values, session.local, local, slice_s)
        if woken == -1:
            if not session.alive(self._on_reply):
                self._lost()
            return
        if woken < 0:
            return                                # changed before the sleep began
        # The broker wakes one sleeper per publish; the one it woke wakes the others. Any
        # changed word may have had its wake-up land here, so each is passed on, once per
        # value (so two consumers cannot keep waking each other).
        region, passed = state.region, session.passed
        for i, word in enumerate(offsets):
            now = int.from_bytes(region[word:word + 4], "little")
            if (i == woken or now != values[i]) and passed.get(word) != now:
                passed[word] = now
                futex.wake(region, word, _ALL)

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
        try:
            while True:
                it = self._it_iter
                yield from it                 # C-level delegation: no bytecode per record
                if it is not self._it_iter:
                    continue                  # replaced by _rewind_iterator: go on with it
                timeout = None if self.consumer_timeout_ms is None \
                    else self.consumer_timeout_ms / 1000
                self._check_open()
                out = self._poll(timeout, self.max_poll_records)
                if not out:
                    return
                self._set_iter([r for records in out.values() for r in records])
        finally:
            self._iterator = None

    def _set_iter(self, records: list[Record]) -> None:
        self._it_records, self._it_iter = records, iter(records)

    def _unyielded(self) -> list[Record]:
        """Records the iterator holds but has not yielded yet (a list iterator knows how many
        are left)."""
        left = self._it_iter.__length_hint__()
        return self._it_records[len(self._it_records) - left:] if left else []

    def _rewind_iterator(self, tps: list[TopicPartition] | None = None) -> None:
        """Give back records the iterator holds but has not yielded (all, or of ``tps``):
        their partitions are read again from the first of them."""
        rest = self._unyielded()
        if not rest:
            return
        first: dict[TopicPartition, int] = {}
        keep = []
        for r in rest:
            tp = TopicPartition(r.topic, r.partition)
            if tps is None or tp in tps:
                first.setdefault(tp, r.offset)
            else:
                keep.append(r)
        for tp, offset in first.items():
            f = self._fetches.get(tp)
            if f is not None:
                self._seek(f, offset)
        self._it_iter.__setstate__(len(self._it_records))     # ends the running `yield from`
        self._set_iter(keep)

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
            self._leave_group()
            self._finish_async_commits(timeout=1.0)
        finally:
            self._closed = True
        session, self._session = self._session, None
        if session is not None:
            session.close()
        for f in self._order:
            f.reader.close()
            f.clear()
        self._fetches, self._order = {}, []
        self._it_iter.__setstate__(len(self._it_records))     # a suspended loop ends
        self._set_iter([])

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Consumer(assignment={sorted(self._fetches)}, group_id={self.group_id!r}"
                f"{', closed' if self._closed else ''})")

