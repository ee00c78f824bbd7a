"""The consumer's driver: its session with the broker — connection, state map, semaphore —,
topic metadata, and the waits for the broker's wake-ups (futex words or the semaphore; the
protocol is drawn in ``consumer.py``).

``Session`` is what belongs to one connection in one process. ``ConsumerDriver`` keeps one
alive, reconnecting with backoff, and reads partition slots for the ``Fetcher``.

Invariants:

- A session is used only by the process that opened it: a forked child opens its own on first
  use, and the parent's socket, map and semaphore stay the parent's.
- ``topics`` is replaced (never changed in place) by each metadata refresh, and a slot snapshot
  counts only if the metadata version did not change while it was taken (a deleted topic's
  slot is reused by the next topic created).
- ``generation`` is the broker's: a restart changes it, and readers must re-list segments.
- A wait never loses a wake-up: the futex word's value, or the semaphore's drained posts, are
  taken before the last look at the state.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable

import posix_ipc

from mq.client.connection import Connection
from mq.client.types import TopicPartition
from mq.errors import (
    BrokerUnavailableError,
    ClosedError,
    MQError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from mq.log import native
from mq.protocol.messages import Api
from mq.protocol.state import StateReader, futex, slot_offset

__all__ = ["RECONNECT_BACKOFF_S", "ConsumerDriver", "Session", "share_semaphore"]

log = logging.getLogger("mq.client.consumer")

RECONNECT_BACKOFF_S = (0.05, 1.0)
_LIVENESS_CHECK_S = 1.0           # a blocked consumer checks its connection this often
MAX_FUTEX_WORDS = 127             # futex_waitv's limit, less the consumer's own word


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
              local_value: int, timeout: float, spin: float, passed: dict[int, int]) -> int:
    """Futex sleep (``_futex.wait_any``), after watching the words for ``spin`` seconds: the
    index of the word woken, -1 on timeout, -2 if one had changed (before the sleep, or
    while spinning). (A seam for tests, like ``_block``.)

    The broker wakes one sleeper per publish, and the one it woke wakes the others: a shared
    word's wake-up is passed on in the same C call, before the take, once per value
    (``passed``, by word offset), so two consumers cannot keep waking each other."""
    return futex.wait_any(region, offsets, values, local, local_value, timeout, spin, passed)


def _drain(sem: posix_ipc.Semaphore) -> None:
    """Take every post pending on ``sem``."""
    try:
        while True:
            sem.acquire(0)
    except posix_ipc.BusyError:
        pass


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
        self.armed: tuple | None = None     # what the last WAIT armed (``_wait_semaphore``)
        # Futex wake-ups (``_sleep``): the broker wakes a sleeper on a slot's word after every
        # publish. ``local`` is this consumer's private word (the heartbeat thread's
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


class ConsumerDriver:
    """The consumer's session, kept alive, its topic metadata and its waits (module doc).
    Opens the first session at once (``connect(socket_path, timeout)``, ``Session`` unless a
    test hands in another): raises ``BrokerUnavailableError`` when no broker answers."""

    def __init__(self, socket_path: str | None, timeout: float, read_committed: bool,
                 connect: Callable[[str | None, float], Session] = Session,
                 spin_s: float = 0.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.read_committed = read_committed
        self.spin_s = spin_s              # busy-watch the futex words this long, then sleep
        self._connect = connect
        self.closed = False
        self.topics: dict[str, dict] = {}
        self.meta_version = -1
        self._reconnect_at = 0.0
        self._backoff = RECONNECT_BACKOFF_S[0]
        self.session: Session | None = connect(socket_path, timeout)
        self.generation = self.session.generation
        self.data_dir = self.session.data_dir

    # --- the session ----------------------------------------------------------------------------
    def live(self, forbid_fork: bool = False) -> Session | None:
        """The session of this process, reconnecting if it was lost (None while the broker is
        unreachable). Raises ``ClosedError`` after ``close()``, and ``MQError`` in a forked
        child when ``forbid_fork`` (a group member: the group knows the parent)."""
        if self.closed:
            raise ClosedError("consumer is closed")
        session = self.session
        if session is not None and session.pid != os.getpid():
            if forbid_fork:
                raise MQError("a consumer in a group cannot be used in a forked child (the "
                              "group knows the parent); create it after the fork")
            # A forked child: the parent's socket, map and semaphore stay the parent's.
            self.session = session = None
            self._reconnect_at = 0.0
        if session is None:
            if time.monotonic() < self._reconnect_at:
                return None
            try:
                session = self._connect(self.socket_path, self.timeout)
            except BrokerUnavailableError as err:
                log.debug("broker unavailable, retrying in %.2fs: %s", self._backoff, err)
                self._reconnect_at = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, RECONNECT_BACKOFF_S[1])
                return None
            self.session = session
            self.data_dir = session.data_dir
            self._backoff = RECONNECT_BACKOFF_S[0]
            if session.generation != self.generation:
                log.info("broker restarted (generation %d -> %d): re-reading segment lists",
                         self.generation, session.generation)
                self.generation = session.generation
            self.meta_version = -1            # slots may have moved
        return session

    def require(self) -> Session:
        """The live session; raises ``BrokerUnavailableError`` when there is none."""
        session = self.live()
        if session is None:
            raise BrokerUnavailableError(f"no broker at {self.socket_path or 'the default socket'}")
        return session

    def lost(self) -> None:
        """The connection broke: drop the session; the next ``live`` reconnects at once."""
        if self.session is not None:
            log.info("lost the broker connection; reconnecting")
            self.session.close()
            self.session = None
            self._reconnect_at = 0.0

    def interrupt(self) -> None:
        """Wake a blocked wait (from another thread)."""
        session = self.session
        if session is not None:
            session.interrupt()

    def close(self) -> None:
        """Close the session. Idempotent."""
        self.closed = True
        session, self.session = self.session, None
        if session is not None:
            session.close()

    # --- metadata and slots ---------------------------------------------------------------------
    def refresh_metadata(self) -> None:
        session = self.require()
        version = session.state.metadata_version     # before the call: never miss a change
        self.topics = session.conn.call(Api.METADATA, None)["topics"]
        self.meta_version = version

    def check_metadata(self, session: Session) -> None:
        """Refresh the metadata if the broker's changed since the last refresh."""
        if session.state.metadata_version != self.meta_version:
            self.refresh_metadata()

    def slot(self, tp: TopicPartition) -> int:
        info = self.topics.get(tp.topic)
        if info is None or not 0 <= tp.partition < info["partitions"]:
            raise UnknownTopicOrPartitionError(f"unknown topic or partition {tp.topic}-"
                                               f"{tp.partition}")
        return info["slots"][tp.partition]

    def slot_base(self, tp: TopicPartition) -> int:
        """Where ``tp``'s slot starts in the state region (its futex word)."""
        return slot_offset(self.slot(tp))

    def state(self, tp: TopicPartition, session: Session | None = None):
        """A consistent slot snapshot for ``tp`` (``session``: the live one, if the caller has
        it); raises ``UnknownTopicOrPartitionError``."""
        if session is None:
            session = self.require()
        while True:
            self.check_metadata(session)
            st = session.state.read(self.slot(tp))
            # A deleted topic's slot is reused by the next topic created: the snapshot counts
            # only if the topics did not change while it was taken.
            if session.state.metadata_version == self.meta_version:
                break
        if st.high_watermark < 0:
            raise UnknownTopicOrPartitionError(f"topic {tp.topic!r} was deleted")
        return st

    # --- waiting --------------------------------------------------------------------------------
    def wait(self, session: Session | None, watched: list[tuple[TopicPartition, int]],
             remaining: float | None, interrupted: Callable[[], bool],
             on_reply: Callable) -> None:
        """Block until the broker posts or publishes past a watched ``(tp, offset)``,
        ``remaining`` passes, a liveness check is due, or ``interrupted()`` (the group's
        change) says to look again. ``on_reply`` takes replies that arrived meanwhile."""
        slice_s = _LIVENESS_CHECK_S if remaining is None else min(remaining, _LIVENESS_CHECK_S)
        if session is None:
            # Disconnected: back off until the next reconnect attempt (nothing can post).
            pause = max(0.0, self._reconnect_at - time.monotonic())
            time.sleep(min(slice_s, pause) if pause else 0.001)
            return
        if session.futex and len(watched) < MAX_FUTEX_WORDS:
            try:
                self._sleep(session, watched, slice_s, interrupted, on_reply)
                return
            except OSError:                   # no futex_waitv (ENOSYS): the semaphore
                session.futex = False
        self._wait_semaphore(session, watched, slice_s, interrupted, on_reply)

    def wait_positions(self, session, watched: list[tuple[TopicPartition, int]]) -> list[list]:
        """A WAIT's ``[topic, partition, offset]`` for each watched ``(tp, offset)``."""
        positions = []
        for tp, offset in watched:
            if self.read_committed:
                # Wake when data arrives past the high watermark: the last stable offset only
                # moves when a marker is appended.
                offset = max(offset, self.state(tp, session).high_watermark)
            positions.append([tp.topic, tp.partition, offset])
        return positions

    def _wait_semaphore(self, session: Session, watched, slice_s: float, interrupted,
                        on_reply) -> None:
        positions = self.wait_positions(session, watched)
        key = (self.meta_version, [(topic, partition) for topic, partition, _ in positions])
        armed = session.armed
        if armed is None or armed[0] != key or any(
                p[2] < offset for p, offset in zip(positions, armed[1], strict=True)):
            _drain(session.sem)               # posts made before this look
            try:
                session.conn.send(Api.WAIT, session.name, positions)
            except BrokerUnavailableError:
                self.lost()
                return
            session.armed = (key, [p[2] for p in positions])
        if interrupted():
            return                            # the heartbeat thread's post may be drained
        if _block(session.sem, slice_s):
            _drain(session.sem)               # before the next look at the state (module doc)
        elif not session.alive(on_reply):
            self.lost()

    def _sleep(self, session: Session, watched, slice_s: float, interrupted, on_reply) -> None:
        """Futex wake-ups (``consumer.py``): sleep on the words of the partitions watched until
        a publish changes one, the heartbeat thread bumps ``session.local``, or ``slice_s``
        passes."""
        state, seen = session.state, session.seen
        local = int.from_bytes(session.local, "little")      # before the group check
        offsets, values = [], []
        look = False
        read_committed = self.read_committed
        for tp, offset in watched:
            try:
                slot = self.slot(tp)
            except UnknownTopicOrPartitionError:
                continue                          # deleted: nothing will be published there
            seq, st = state.snapshot(slot)
            if st.high_watermark < 0:
                return                            # deleted: the next fetch says so
            bound = st.last_stable_offset if read_committed else st.high_watermark
            word = slot_offset(slot)
            # Readable at a sequence the last fetch may not have seen: look again. (At a
            # sequence already slept on, it is what that fetch could not return.)
            if bound > offset and seen.get(word) != seq:
                look = True
            seen[word] = seq
            offsets.append(word)
            values.append(seq & 0xFFFFFFFF)
        if look or state.metadata_version != self.meta_version or interrupted():
            return
        woken = _sleep_on(state.region, offsets, values, session.local, local, slice_s,
                          self.spin_s, session.passed)
        if woken == -1 and not session.alive(on_reply):
            self.lost()

    def sleep_tail(self, session: Session, words: list[int], seqs: list[int], local: int,
                   remaining: float | None, on_reply: Callable, takes: list
                   ) -> tuple[bool, int, tuple | None]:
        """The fast tail poll's sleep (``Consumer._poll_tail``) on its partitions' words,
        which held ``seqs`` when the poll found nothing to read, as ``_sleep`` sleeps
        (``local``: ``session.local`` read before that), and the take that follows a
        partition's wake-up in the same C call (``_crecords.tail_wait_take``, with that
        partition's ``tail_take`` arguments in ``takes``). ``(look_again, woken, taken)``:
        ``taken`` is that take's result (for ``Fetcher.took_tail``), else None; look again at
        once when a word changed (its wake-up passed on); else ``poll``'s general loop goes
        on: the slice passed (the connection checked, as ``_sleep`` does) or ``session.local``
        moved."""
        slice_s = _LIVENESS_CHECK_S if remaining is None else min(remaining, _LIVENESS_CHECK_S)
        region, values = session.state.region, [seq & 0xFFFFFFFF for seq in seqs]
        wait_args = (region, words, values, session.local, local, slice_s, self.spin_s,
                     session.passed)
        fused = native.tail_wait_take
        if fused is not None:
            woken, taken = fused(_sleep_on, wait_args, takes)
        else:
            woken, taken = _sleep_on(*wait_args), None
        if 0 <= woken < len(words):
            return True, woken, taken
        if woken == -1 and not session.alive(on_reply):
            self.lost()
        return woken == -2 and int.from_bytes(session.local, "little") == local, woken, None
