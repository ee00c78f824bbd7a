"""The broker's client connections: ``Conn``, one socket's state, and ``Connections``, all of
them with the output queued this round.

Nothing here touches a socket: the loop (``server.py``) reads, writes and closes. Every reply,
deferred acknowledgement and push of a loop round is appended to its connection's ``out``
buffer (``send``) and the loop writes each connection once at the end of the round
(``take_unsent``), so a round costs one ``send`` syscall per connection however many replies
it carries. A connection the loop closed is ``closing``: nothing more is queued for it.
"""

from __future__ import annotations

import array
import dataclasses
import itertools
import logging
import mmap
import os
import socket
from collections.abc import Callable, Iterator

import posix_ipc

from mq.protocol.frames import FrameReader, encode_frame
from mq.protocol.messages import PUSH_REQUEST_ID, Api, response

__all__ = ["Conn", "Connections", "MAX_PASSED_FDS", "SocketWake"]

log = logging.getLogger("mq.broker")

MAX_PASSED_FDS = 4
WAKE_PUSH = response(Api.WAIT, PUSH_REQUEST_ID)


class SocketWake:
    """A WAIT whose semaphore name is ``""``: its wake-up is pushed on the connection itself,
    ``[1000, 0, 0, nil]``, for a client whose event loop watches its socket (``mq.aio``). It
    stands where a semaphore stands (``release``, ``value``, ``close``) and, like a nudged
    semaphore, fires once: ``value`` stays 1 until the client's next WAIT arms it again."""

    __slots__ = ("_conn", "_send", "value")

    def __init__(self, conn: Conn, send: Callable[[Conn, list], None]) -> None:
        self._conn = conn
        self._send = send
        self.value = 0

    def release(self) -> None:
        if not self.value:
            self.value = 1
            self._send(self._conn, WAKE_PUSH)

    def close(self) -> None:
        pass


@dataclasses.dataclass(eq=False)
class Conn:
    """One client connection (hashable by identity)."""

    sock: socket.socket
    pid: int | None                    # the peer's, from SO_PEERCRED (None: a TCP peer)
    reader: FrameReader | None         # None: a Kafka connection (its own frames)
    conn_id: int = 0
    group_member: bool = False         # sent a group heartbeat: its close is a member leaving
    out: bytearray = dataclasses.field(default_factory=bytearray)
    greeted: bool = False              # its Handshake was accepted
    closing: bool = False
    # Wake-up semaphores the peer named in WAIT requests, opened once per connection ("": a
    # SocketWake).
    semaphores: dict[str, posix_ipc.Semaphore | SocketWake] = dataclasses.field(
        default_factory=dict)
    # Descriptors the peer passed (SCM_RIGHTS) that no request took yet, and the producer's
    # batch arena that ShareMemory mapped from one (apis/produce.py).
    fds: list[int] = dataclasses.field(default_factory=list)
    arena: mmap.mmap | None = None

    def take_fds(self, ancillary: list, flags: int) -> None:
        """Keep the descriptors a read brought, at most ``MAX_PASSED_FDS`` unclaimed; the
        rest are closed (a client sends one, with the request that claims it)."""
        for level, kind, data in ancillary:
            if level != socket.SOL_SOCKET or kind != socket.SCM_RIGHTS:
                continue
            fds = array.array("i")
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            for fd in fds:
                if len(self.fds) < MAX_PASSED_FDS:
                    self.fds.append(fd)
                else:
                    os.close(fd)
        if flags & socket.MSG_CTRUNC:
            log.info("pid %d passed more descriptors than one read takes; the rest were "
                     "closed", self.pid)

    def enqueue(self, message: list) -> None:
        """Queue a native reply or push for the loop to write."""
        self.out += encode_frame(message)

    def release_shared(self) -> None:
        """Close the passed descriptors and the arena's map (the connection closed)."""
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()
        self.set_arena(None)

    def set_arena(self, arena: mmap.mmap | None) -> None:
        """The connection's arena from now on; the one before is unmapped."""
        old, self.arena = self.arena, arena
        if old is not None:
            try:
                old.close()
            except BufferError:        # a view still held (a failure's traceback): the
                pass                   # map goes when the last view does


class Connections:
    """Every open connection, by id, and the ones with output queued this round."""

    def __init__(self, max_request_bytes: int) -> None:
        self._max_request_bytes = max_request_bytes
        self._by_id: dict[int, Conn] = {}
        self._unsent: set[Conn] = set()
        self._ids = itertools.count(1)

    def add(self, sock: socket.socket, pid: int) -> Conn:
        """A new connection of process ``pid``, with a fresh id."""
        return self.adopt(Conn(sock, pid, FrameReader(self._max_request_bytes),
                               self.next_id()))

    def next_id(self) -> int:
        return next(self._ids)

    def adopt(self, conn: Conn) -> Conn:
        """Add a connection made elsewhere (a Kafka listener's, ``mq/broker/kafka``)."""
        self._by_id[conn.conn_id] = conn
        return conn

    def remove(self, conn: Conn) -> None:
        """Forget a connection the loop closed (idempotent)."""
        self._by_id.pop(conn.conn_id, None)
        self._unsent.discard(conn)

    def get(self, conn_id: int) -> Conn | None:
        return self._by_id.get(conn_id)

    def send(self, conn: Conn, message: list) -> None:
        """Queue ``message`` (a response or a push) on ``conn``; the loop writes it at the end
        of the round. Nothing is queued on a closing connection."""
        if conn.closing:
            return
        conn.enqueue(message)
        self._unsent.add(conn)

    def mark_unsent(self, conn: Conn) -> None:
        """``conn`` has output queued some other way (a Kafka connection's responses)."""
        if not conn.closing:
            self._unsent.add(conn)

    def take_unsent(self) -> set[Conn]:
        """The connections with output queued since the last call (empty: nothing to write;
        no set is made for a round without output)."""
        unsent = self._unsent
        if unsent:
            self._unsent = set()
        return unsent

    def trim_buffers(self) -> None:
        """Give back the receive buffers of connections with nothing unparsed: a producer
        that went quiet keeps no buffer of twice its largest batch (the loop calls this once
        per flush interval; an active one takes a new buffer at its next read)."""
        for conn in self._by_id.values():
            if conn.reader is not None:
                conn.reader.trim()

    def __iter__(self) -> Iterator[Conn]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)
