"""A client's connection to the broker: a Unix stream socket speaking ``mq.protocol``.

Requests pipeline: ``send`` returns a request id at once and ``wait`` collects the response
with that id, keeping any other responses that arrive first. ``call`` is both in one. A
connection belongs to the process that opened it: after ``fork()`` the child transparently
opens its own (the parent's socket is never shared). Thread-safe: one lock per direction.
"""

from __future__ import annotations

import array
import itertools
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from mq.client.arena import Arena
from mq.errors import (
    BrokerUnavailableError,
    ClosedError,
    ConfigError,
    LocalProtocolError,
    RemoteProtocolError,
    error_for_code,
)
from mq.protocol.frames import FrameReader, encode_frame, encode_tail_frame
from mq.protocol.messages import PROTOCOL_VERSION, TAIL_APIS, Api, Response, request
from mq.protocol.paths import check_socket_path, default_socket_path

__all__ = ["Connection", "connect_error", "poll_ms", "resolve_socket", "send_parts"]

_RECV_BYTES = 1 << 16
# The socket's send buffer (the kernel caps it at net.core.wmem_max; Linux's default buffer is
# 208 KiB): a 1 MiB Produce batch then goes in one sendmsg and reaches the broker in one read,
# instead of five handovers of 208 KiB, each a sleep and a wake-up on both sides. With 64 KiB
# records that took mq from 0.77x to 1.24x mp.Queue (bench.large_records). Memory is only
# used while data is queued.
_SEND_BUFFER = 4 << 20
_MAX_POLL_MS = 1 << 30                   # about 12 days; longer waits are waits forever


def poll_ms(seconds: float) -> int:
    """A ``poll()`` timeout in milliseconds for ``seconds``: rounded up, so that a wait never
    ends early and spins; 0 for a time already passed; -1 (forever) for a very long one."""
    if seconds * 1000 >= _MAX_POLL_MS:
        return -1
    return max(0, math.ceil(seconds * 1000))


def send_parts(sock: socket.socket, parts, fds: tuple[int, ...] = ()) -> None:
    """Send every byte of ``parts`` in order, with one ``sendmsg`` unless it is cut short;
    ``fds`` go with the first byte (``SCM_RIGHTS``)."""
    sent = sock.sendmsg(parts, [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]) \
        if fds else sock.sendmsg(parts)
    for part in parts:
        if sent < len(part):
            sock.sendall(memoryview(part)[sent:])
        sent = max(0, sent - len(part))


def resolve_socket(socket_path: str | None) -> str:
    """``socket_path``, else ``$MQ_SOCKET``, else ``<data dir>/mq.sock`` (``docs/api.md``)."""
    return socket_path or default_socket_path()


def connect_error(socket_path: str, err: OSError) -> BrokerUnavailableError:
    """What a failed ``connect`` to ``socket_path`` tells the user."""
    if isinstance(err, (FileNotFoundError, ConnectionRefusedError)):
        return BrokerUnavailableError(f"no broker at {socket_path} ({err.strerror}); start one "
                                      "with `mq broker` or pass --socket")
    return BrokerUnavailableError(f"cannot connect to {socket_path}: {err.strerror or err}")


class Connection:
    def __init__(self, socket_path: str | None = None, client_name: str = "mq",
                 timeout: float = 30.0) -> None:
        self.socket_path = resolve_socket(socket_path)
        self.client_name = client_name
        self.timeout = timeout
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._sock: socket.socket | None = None
        self._pid = -1
        # One buffer for every read (reads hold _recv_lock): recv(1 MiB) would allocate, map
        # and unmap 1 MiB per reply (~14 us vs ~2 us, bench/RESULTS.md); replies are small.
        self._recv_buf = bytearray(_RECV_BYTES)
        self._recv_view = memoryview(self._recv_buf)
        self.broker_info: dict[str, Any] = {}
        self._tails = False                # the broker takes Produce batches as frame tails
        self.arena: Arena | None = None    # this connection's batch arena (share_arena)
        self._claimed: set[int] = set()    # request ids a wait() takes the reply of
        self._connect()

    # --- setup --------------------------------------------------------------------------------
    def _connect(self) -> None:
        try:
            check_socket_path(self.socket_path)
        except ValueError as err:
            raise ConfigError(f"cannot connect to the broker: {err}; give a shorter one "
                              "(--socket, socket=, $MQ_SOCKET)") from err
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        try:
            sock.connect(self.socket_path)
        except OSError as err:
            sock.close()
            raise connect_error(self.socket_path, err) from err
        self._sock = sock
        # poll, not select: select() fails for a descriptor >= 1024 (FD_SETSIZE), which any
        # socket of a process with many open files has. One poller per socket, used under
        # _recv_lock.
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        self._reader = FrameReader()
        self._pending: dict[int, Response] = {}
        self._pid = os.getpid()
        try:
            reply = self.call(Api.HANDSHAKE, PROTOCOL_VERSION, self.client_name, os.getpid())
        except BaseException:
            sock.close()                  # the broker went away between accept and reply
            self._sock = None
            raise
        self.broker_info = reply["info"]
        self._tails = bool(self.broker_info.get("frame_tail"))

    def _ensure(self) -> socket.socket:
        if self._closed:
            raise ClosedError("connection is closed")
        if self._pid != os.getpid():            # we are a forked child: never share a socket
            self._sock = None
            self.arena = None                   # nor the parent's arena (it stays mapped)
            self._connect()
        assert self._sock is not None
        return self._sock

    # --- requests -----------------------------------------------------------------------------
    def send(self, api: Api, *fields: Any, claim: bool = False,
             fds: tuple[int, ...] = ()) -> int:
        """Send a request without waiting; returns its id. ``claim``: a ``wait`` for this id
        will take the reply, so ``poll_any`` (another thread's) leaves it alone. ``fds`` go
        with the request (``SCM_RIGHTS``)."""
        sock = self._ensure()
        rid = next(self._ids)
        message = request(api, rid, *fields)
        # A batch goes out as a tail frame's tail: the kernel copies it from the caller's
        # buffer, with no frame built around it here (and none taken apart in the broker).
        try:
            parts = encode_tail_frame(message) if self._tails and api in TAIL_APIS \
                else (encode_frame(message),)
        except LocalProtocolError as err:
            raise LocalProtocolError(f"{api.name} request: {err}") from err
        if claim:
            self._claimed.add(rid)
        try:
            self._write(sock, parts, fds)
        except BrokerUnavailableError:
            self._claimed.discard(rid)
            raise
        return rid

    def _write(self, sock: socket.socket, parts, fds: tuple[int, ...] = ()) -> None:
        with self._send_lock:
            try:
                send_parts(sock, parts, fds)
            except OSError as err:
                raise BrokerUnavailableError(f"broker connection lost: {err}") from err

    @property
    def takes_tails(self) -> bool:
        """The broker takes Produce batches as frame tails (``frames.encode_tail_frame``)."""
        return self._tails

    def next_id(self) -> int | None:
        """The id of a request this process builds itself (``send_frame``), or None when the
        connection must be made again first (closed, or a forked child's copy): ``send``
        does that."""
        if self._closed or self._pid != os.getpid():
            return None
        return next(self._ids)

    def send_built(self, build: Callable[..., tuple | None], limit: int, *args: Any
                   ) -> tuple | None:
        """Write a request frame that one C call builds and writes as far as the socket
        takes it at once, ``build(fd, limit, *args)`` (``native.produce_send``), its id from
        ``next_id``, in order; the rest is written here. Returns build's fields but the last
        (the request's parts first) and whether the whole frame went out: False when the
        connection is lost (``BrokerUnavailableError`` from ``send_frame``). None, with
        nothing written, when build declined (a batch over ``limit`` bytes)."""
        sock = self._sock                      # next_id saw it open, in this process
        if sock is None:
            return None
        with self._send_lock:
            got = build(sock.fileno(), limit, *args)
            if got is None:
                return None
            *fields, sent = got
            if sent < 0:
                return (*fields, False)
            head, data = fields[0], fields[1]
            if sent < len(head) + len(data):
                rest = (head[sent:], data) if sent < len(head) else \
                    (memoryview(data)[sent - len(head):],)
                try:
                    send_parts(sock, rest)
                except OSError:
                    return (*fields, False)
        return (*fields, True)

    def send_frame(self, parts) -> None:
        """Write a request frame built by the caller, its id from ``next_id``, in order.
        Raises ``BrokerUnavailableError`` when the connection is lost."""
        self._write(self._ensure(), parts)

    def share_arena(self, arena: Arena) -> None:
        """Hand ``arena`` to the broker (``ShareMemory``, its fd passed with ``SCM_RIGHTS``)
        and keep it as this connection's: closed with it. Raises the broker's refusal."""
        self.wait(self.send(Api.SHARE_MEMORY, arena.size, claim=True, fds=(arena.fd,)))
        self.arena = arena

    def wait(self, rid: int, timeout: float | None = None) -> Response:
        """The response to request ``rid``. Raises the broker's error as an exception,
        ``BrokerUnavailableError`` if the connection dies, ``TimeoutError`` on timeout."""
        reply = self.wait_raw(rid, timeout)
        if reply.error_code:
            raise error_for_code(reply.error_code, reply.error_message or "")
        return reply

    def wait_raw(self, rid: int, timeout: float | None = None) -> Response:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            with self._recv_lock:
                while rid not in self._pending:
                    self._receive(deadline)
                return self._pending.pop(rid)
        finally:
            self._claimed.discard(rid)

    def poll_any(self, timeout: float) -> list[Response]:
        """Every response available within ``timeout`` (at least one unless it expires),
        but those a ``wait`` claimed (``send(claim=True)``, ``call``): a producer's
        ``send()`` reads replies while its I/O thread may be in a ``call``, whose reply it
        must leave for it."""
        deadline = time.monotonic() + timeout
        with self._recv_lock:
            pending, claimed = self._pending, self._claimed
            if all(rid in claimed for rid in pending):      # nothing here for us (yet)
                try:
                    self._receive(deadline)
                except TimeoutError:
                    pass
            out = [reply for rid, reply in pending.items() if rid not in claimed]
            for reply in out:
                del pending[reply.request_id]
            return out

    def ready(self) -> list[Response]:
        """Responses already received or readable now, without blocking."""
        return self.poll_any(0.0)

    def take_pushed(self, rid: int) -> bool:
        """Remove a broker push (a frame with request id ``rid``) that arrived during an
        earlier call; True if there was one."""
        with self._recv_lock:
            return self._pending.pop(rid, None) is not None

    def call(self, api: Api, *fields: Any, timeout: float | None = None) -> Response:
        return self.wait(self.send(api, *fields, claim=True), timeout)

    def _receive(self, deadline: float) -> None:
        sock = self._ensure()
        # Wait with poll, not sock.settimeout: a socket timeout would also govern a
        # concurrent sendall() from another thread and could cut a frame in half. A deadline
        # already passed still looks once (poll with 0), so ``ready()`` is ``poll_any(0)``.
        # POLLHUP and POLLERR count as readable: recv then reports the end or the error.
        try:
            readable = self._poller.poll(poll_ms(deadline - time.monotonic()))
        except (OSError, ValueError) as err:
            raise BrokerUnavailableError(f"broker connection lost: {err}") from err
        if not readable:
            raise TimeoutError("no response from the broker in time")
        try:
            n = sock.recv_into(self._recv_buf)
        except OSError as err:
            raise BrokerUnavailableError(f"broker connection lost: {err}") from err
        if not n:
            raise BrokerUnavailableError("the broker closed the connection")
        self._reader.feed(self._recv_view[:n])
        try:
            for message in self._reader.messages():
                reply = Response.from_message(message)
                self._pending[reply.request_id] = reply
        except RemoteProtocolError as err:
            raise BrokerUnavailableError(f"broker sent garbage: {err}") from err

    def fileno(self) -> int:
        return self._ensure().fileno()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
            if self.arena is not None:
                self.arena.close()
        self._sock = None
        self.arena = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
