"""The reading half of ``mq.Consumer``: its session with the broker and the read path from the
segment maps to ``Record``s.

``Session`` is what belongs to one connection in one process (socket, state map, semaphore).
``Fetcher`` (mixed into ``Consumer``) keeps one alive, reconnecting with backoff, and serves
``poll``: per assigned partition a ``Fetch`` holds the position and what was read from the map
but not yet returned; batches are decoded one at a time, as records are taken. The wake-up
protocol and what is never returned are described in ``consumer.py``.
"""

from __future__ import annotations

import gc
import logging
import os
import secrets
import time
from typing import Any, NamedTuple

import posix_ipc

from mq.client.connection import Connection
from mq.client.types import TopicPartition
from mq.errors import (
    BrokerUnavailableError,
    ClosedError,
    MQError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from mq.log.reader import PartitionReader
from mq.log.txnindex import AbortedTxnFilter, is_visible
from mq.protocol.messages import Api
from mq.protocol.state import StateReader, futex

__all__ = ["RECONNECT_BACKOFF_S", "Fetch", "Fetcher", "Record", "Session"]

log = logging.getLogger("mq.client.consumer")

RECONNECT_BACKOFF_S = (0.05, 1.0)


class Record(NamedTuple):
    """One consumed record. ``timestamp_type``: 0 CreateTime, 1 LogAppendTime."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: int
    key: Any
    value: Any
    headers: list

    def __repr__(self) -> str:
        def show(b):
            return b if b is None or not isinstance(b, memoryview) else bytes(b)
        return (f"Record(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
                f"timestamp_ms={self.timestamp_ms}, timestamp_type={self.timestamp_type}, "
                f"key={show(self.key)!r}, value={show(self.value)!r}, "
                f"headers={[(k, show(v)) for k, v in self.headers]!r})")

    def __reduce__(self):
        # Pickling (to a worker process) copies the views into bytes: a memoryview cannot
        # be pickled, and the receiver has no map to point into.
        def b(v):
            return bytes(v) if isinstance(v, memoryview) else v
        return (Record, (self.topic, self.partition, self.offset, self.timestamp_ms,
                         self.timestamp_type, b(self.key), b(self.value),
                         [(k, b(v)) for k, v in self.headers]))


_new_record = tuple.__new__


class Fetch:
    """Per assigned partition: where reading stands and what was read but not yet returned.

    ``offset`` is the next offset to decode (None: no position yet). ``batches`` are batches
    read from the map but not decoded; ``raw``/``index`` decoded records not yet returned, all
    at offsets >= the position. position = raw[index].offset if any, else ``offset``.
    """

    __slots__ = ("tp", "topic_id", "reader", "offset", "paused", "batches", "bound",
                 "raw", "index", "timestamp_type", "aborted")

    def __init__(self, tp: TopicPartition, reader: PartitionReader) -> None:
        self.tp = tp
        self.topic_id: str | None = None
        self.reader = reader
        self.offset: int | None = None
        self.paused = False
        self.batches: list = []
        self.bound = 0
        self.raw: list = []
        self.index = 0
        self.timestamp_type = 0
        self.aborted: AbortedTxnFilter | None = None    # read_committed: what to skip

    def clear(self) -> None:
        self.aborted = None
        self.batches = []
        self.raw = []
        self.index = 0

    @property
    def position(self) -> int | None:
        if self.index < len(self.raw):
            return self.raw[self.index].offset
        return self.offset


def share_semaphore(name: str, broker_gid: int | None) -> None:
    """Let a broker running as another user open semaphore ``name``: read-write for the group
    whatever the umask did to ``mode``, and the broker's group when it differs from this
    process's (a member of the broker's group may give its files to it; under the systemd
    units the broker runs as user ``mq`` and clients are members of group ``mq``). Where the
    semaphore has no file (not Linux) or the change is refused, it stays as created: a broker
    of the same user needs neither, and another one answers the WAIT with the reason."""
    path = "/dev/shm/sem." + name.lstrip("/")
    try:
        os.chmod(path, 0o660)
        if broker_gid is not None and broker_gid != os.getegid():
            os.chown(path, -1, broker_gid)
    except OSError:
        pass


def _unlink(sem: posix_ipc.Semaphore) -> None:
    """Unlink my semaphore's name; a broker that started meanwhile may have removed it (it
    removes its data dir's at start), which changes nothing for the open semaphore."""
    try:
        sem.unlink()
    except posix_ipc.ExistentialError:
        pass


class Session:
    """What belongs to one connection in one process: socket, state map, semaphore."""

    def __init__(self, socket_path: str | None, timeout: float) -> None:
        self.pid = os.getpid()
        self.conn = Connection(socket_path, "mq-consumer", timeout)
        self.state: StateReader | None = None
        self.sem: posix_ipc.Semaphore | None = None
        self.armed: tuple | None = None     # what the last WAIT armed (consumer._wait)
        # Futex wake-ups (consumer._sleep): the broker wakes a sleeper on a slot's word after
        # every publish. ``local`` is this consumer's private word (the heartbeat thread's
        # interrupt); ``seen`` the sequence of each slot at the last sleep, ``passed`` the
        # word value last passed on to the other sleepers, both by word offset.
        self.futex = False
        self.local = bytearray(4)
        self.seen: dict[int, int] = {}
        self.passed: dict[int, int] = {}
        try:
            info = self.conn.broker_info
            self.generation = info["generation"]
            self.data_dir = info["data_dir"]
            self.state = StateReader(self.data_dir)
            self.sem = self._register_semaphore(info["semaphore_prefix"])
            self.futex = futex is not None and bool(info.get("futex_wake")) and \
                os.environ.get("MQ_CONSUMER_WAKE", "futex") != "semaphore"
        except BaseException:
            self.close()
            raise

    def _register_semaphore(self, prefix: str) -> posix_ipc.Semaphore:
        """Create my semaphore, have the broker open it, then unlink its name."""
        while True:
            name = f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
            try:
                sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o660, initial_value=0)
                break
            except posix_ipc.ExistentialError:
                continue
        try:
            share_semaphore(name, self.conn.broker_info.get("gid"))
            self.conn.send(Api.WAIT, name, [])
            self.conn.call(Api.METADATA, [])     # requests are served in order: WAIT is done
            for reply in self.conn.poll_any(0):
                if reply.error_code:
                    raise error_for_code(reply.error_code, reply.error_message or "")
        except BaseException:
            _unlink(sem)
            sem.close()
            raise
        _unlink(sem)
        self.name = name
        return sem

    def interrupt(self) -> None:
        """Wake a poll blocked on this session, from another thread (the heartbeat's): its
        futex sleep through its own word (bumped, then woken: a sleep about to begin sees
        the new value and does not), or its semaphore."""
        if self.futex:
            local = self.local
            local[:] = ((int.from_bytes(local, "little") + 1) & 0xFFFFFFFF).to_bytes(4, "little")
            futex.wake(local, 0, 1, private=True)
        sem = self.sem
        if sem is not None:
            try:
                sem.release()
            except Exception:            # closed meanwhile: nobody is waiting on it
                pass

    def alive(self, on_reply) -> bool:
        """False when the broker closed the connection; replies that arrived go to
        ``on_reply`` (a WAIT's error, an async commit's answer)."""
        try:
            replies = self.conn.ready()
        except (BrokerUnavailableError, OSError, ValueError):
            return False
        for reply in replies:
            on_reply(reply)
        return True

    def close(self) -> None:
        """Release this process's handles (in a forked child: only the child's copies)."""
        if self.sem is not None:
            try:
                self.sem.close()
            except posix_ipc.Error:
                pass
            self.sem = None
        if self.state is not None:
            self.state.close()
            self.state = None
        self.conn.close()


class Fetcher:
    """Session and read methods of ``Consumer`` (see the module doc)."""

    # --- session: connection, state region, semaphore ------------------------------------------
    def _live_session(self) -> Session | None:
        """The session of this process, reconnecting if it was lost (None while the broker is
        unreachable). Raises ``ClosedError`` after ``close()``."""
        if self._closed:
            raise ClosedError("consumer is closed")
        session = self._session
        if session is not None and session.pid != os.getpid():
            if self._membership is not None:
                raise MQError("a consumer in a group cannot be used in a forked child (the "
                              "group knows the parent); create it after the fork")
            # A forked child: the parent's socket, map and semaphore stay the parent's.
            self._session = session = None
            self._reconnect_at = 0.0
        if session is None:
            if time.monotonic() < self._reconnect_at:
                return None
            try:
                session = Session(self._socket, self._timeout)
            except BrokerUnavailableError as err:
                log.debug("broker unavailable, retrying in %.2fs: %s", self._backoff, err)
                self._reconnect_at = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, RECONNECT_BACKOFF_S[1])
                return None
            self._session = session
            self._backoff = RECONNECT_BACKOFF_S[0]
            if session.generation != self._generation:
                log.info("broker restarted (generation %d -> %d): re-reading segment lists",
                         self._generation, session.generation)
                self._generation = session.generation
                for f in self._order:
                    f.reader.reset()
                    f.batches = []
            self._meta_version = -1           # slots may have moved
        return session

    def _require_session(self) -> Session:
        session = self._live_session()
        if session is None:
            raise BrokerUnavailableError(f"no broker at {self._socket or 'the default socket'}")
        return session

    def _lost(self) -> None:
        if self._session is not None:
            log.info("lost the broker connection; reconnecting")
            self._session.close()
            self._session = None
            self._reconnect_at = 0.0

    # --- reading --------------------------------------------------------------------------------
    def _fetch(self, session: Session, max_records: int) -> dict[TopicPartition, list[Record]]:
        # Decoding creates ~3 GC-tracked objects per record (record, value view, headers list)
        # that all survive the call, so every collection the cyclic GC runs meanwhile finds
        # nothing to free: pausing it for the call doubles throughput (1.3 -> 2.9 M records/s
        # of CPU for 100-byte values); one collection over the survivors follows.
        if not gc.isenabled():
            return self._fetch_records(session, max_records)
        gc.disable()
        try:
            return self._fetch_records(session, max_records)
        finally:
            gc.enable()

    def _fetch_records(self, session: Session, max_records: int
                       ) -> dict[TopicPartition, list[Record]]:
        self._check_metadata(session)
        out: dict[TopicPartition, list[Record]] = {}
        order = self._order
        n = len(order)
        if not n:
            return out
        start = self._next_start % n
        want = max_records
        for i in range(n):
            f = order[(start + i) % n]
            if f.paused:
                continue
            try:
                records = self._take(session, f, want)
            except UnknownTopicOrPartitionError:
                if self._membership is not None:
                    continue              # deleted: the group takes it away at once
                if out:
                    return out
                raise
            except Exception:
                if out:
                    return out            # positions moved past these: return them first;
                raise                     # the error comes from the state and recurs
            if records:
                out[f.tp] = records
                want -= len(records)
                if want <= 0:
                    self._next_start = (start + i + 1) % n     # fairness: next one first
                    break
        return out

    def _take(self, session: Session, f: Fetch, limit: int) -> list[Record]:
        """Up to ``limit`` records of one partition, decoding only what is returned."""
        out: list[Record] = []
        topic, partition = f.tp
        convert = self.value_bytes or self.key_deserializer or self.value_deserializer
        while limit > 0:
            while f.index >= len(f.raw):
                # One read per partition and poll: records already taken are returned before
                # anything (an error included) can come of reading again.
                if not f.batches and (out or not self._read_more(session, f)):
                    return out
                try:
                    self._decode_next(f)  # every batch decoded advances the position
                except Exception:
                    if out:
                        return out        # the damaged batch raises again at the next poll
                    raise
            raw, i = f.raw, f.index
            chunk = raw[i:i + limit] if i or len(raw) > limit else raw
            f.index = i + len(chunk)
            limit -= len(chunk)
            tt = f.timestamp_type
            if convert:
                out += [self._convert(topic, partition, tt, r) for r in chunk]
            else:
                out += [_new_record(Record, (topic, partition, r.offset, r.timestamp, tt, r.key,
                                             r.value, r.headers)) for r in chunk]
        return out

    def _convert(self, topic: str, partition: int, tt: int, r) -> Record:
        key, value, headers = r.key, r.value, r.headers
        if self.value_bytes:
            key = None if key is None else bytes(key)
            value = None if value is None else bytes(value)
            headers = [(k, None if v is None else bytes(v)) for k, v in headers]
        if self.key_deserializer is not None and key is not None:
            key = self.key_deserializer(key)
        if self.value_deserializer is not None and value is not None:
            value = self.value_deserializer(value)
        return _new_record(Record, (topic, partition, r.offset, r.timestamp, tt, key, value,
                                    headers))

    def _read_more(self, session: Session, f: Fetch) -> bool:
        """Read batches at the position from the map; False when nothing is readable."""
        st = self._state(f.tp, session)
        if f.offset is None:
            if f.tp in self._unstable:
                return False              # a transaction holds its offsets: not yet
            self._reset(f, st, None)
        elif f.offset < st.log_start_offset or f.offset > st.log_end_offset:
            self._reset(f, st, f.offset)
        bound = self._bound(st)
        if f.offset >= bound:
            return False
        try:
            batches = f.reader.read(f.offset, st.active_segment_base, st.hw_position,
                                    self.max_partition_fetch_bytes,
                                    log_start_offset=st.log_start_offset,
                                    generation=st.segment_generation)
        except OffsetOutOfRangeError:
            # The segment went (retention) between the state snapshot and the read.
            st = self._state(f.tp, session)
            self._reset(f, st, f.offset)
            return False
        while batches and batches[-1].base_offset >= bound:
            batches.pop()
        if self._read_committed and batches:
            f.aborted = AbortedTxnFilter(f.reader.aborted_transactions(batches[0].base_offset,
                                                                       bound))
        batches.reverse()                 # pop() from the end: oldest last
        f.batches, f.bound = batches, bound
        return bool(batches)

    def _decode_next(self, f: Fetch) -> None:
        """Decode pending batches until one yields records at or past the position."""
        batches, bound = f.batches, f.bound
        f.raw, f.index = [], 0
        while batches:
            batch = batches.pop()
            offset = f.offset
            if not is_visible(batch, f.aborted):
                f.offset = max(offset, min(batch.next_offset, bound))
                continue
            try:
                if self.check_crcs:
                    batch.validate()      # CRC-32C: ~1% of the decode time (Kafka's default)
                records = batch.records()
            except Exception:
                f.batches = []            # read again from the position: raise again
                raise
            if batch.base_offset < offset or batch.last_offset >= bound:
                records = [r for r in records if offset <= r.offset < bound]
            f.offset = max(offset, min(batch.next_offset, bound))
            if records:
                f.raw, f.timestamp_type = records, batch.timestamp_type
                return
