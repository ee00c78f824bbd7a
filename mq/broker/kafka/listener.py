"""The Kafka listener: TCP sockets on the broker's loop, speaking Kafka's wire protocol.

The broker's loop (``server.py``) owns the selector; this object owns the listening sockets
and the Kafka connections' protocol work: frames in (``conn.FrameBuffer``), each request
decoded by the schema-driven codec, checked against the served versions (``versions.py``),
handed to its handler (``handlers.py``), and the responses written in request order with
``sendfile`` for Fetch's records (``conn.KafkaConn``).

On a SASL listener a connection that has not authenticated may send ApiVersions and the SASL
apis only; any other request closes it (``sasl_wire.py``).

What a peer can do wrong closes its connection and nothing else: a frame over
``max_request_bytes`` (Kafka's ``socket.request.max.bytes``), a frame that does not decode,
a version outside the served range (Kafka closes too: it cannot encode a response in a
version it does not know) — except ApiVersions, which is answered in version 0 with
UNSUPPORTED_VERSION and the full list, so the client retries with one it finds there
(KIP-511). The logs are only touched by the components the handlers call, which validate as
they do for mq's own clients.

A peer that never reads its responses, or pipelines without bound, stops being read once it
is ``backlogged`` (conn.py: requests in flight, descriptors held, bytes unsent), and is read
again as it drains (Kafka mutes such a channel too): its requests pile up in the kernel and
in its own socket buffer, not here.

An ``SSL://`` listener wraps each accepted socket in TLS (tls.py): the handshake runs on this
loop with a deadline (``timers``), reads and writes go through the session, and Fetch's records
are copied instead of sent with ``sendfile`` (conn.py). The hooks are marked "TLS hook".

Accepting stops for ``_ACCEPT_PAUSE_S`` when the broker is out of descriptors (EMFILE), so a
flood of connections costs one warning a pause, not a busy loop.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import selectors
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mq.broker.conns import Connections
from mq.broker.kafka import tls
from mq.broker.kafka.addresses import PLAINTEXT, display, parse_listener
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Exchange, Park
from mq.broker.kafka.frames import FrameBudget
from mq.broker.kafka.sasl_wire import PRE_AUTH_APIS
from mq.broker.kafka.versions import API_VERSIONS, SERVED
from mq.broker.partitions import Partition
from mq.errors import RemoteProtocolError, UnsupportedVersionError
from mq.protocol.kafka.codec import decode_request, peek_header
from mq.protocol.messages import Request

__all__ = ["KafkaHandler", "KafkaListener"]

log = logging.getLogger("mq.broker")

# A Kafka handler: (connection, api version, decoded body) -> the response body, None for no
# response, or a generator driven by ``Exchange`` (exchange.py).
KafkaHandler = Callable[[KafkaConn, int, dict], Any]

# What one read takes when no large frame is in progress, into one scratch buffer for all
# connections (the loop is single-threaded): small requests, and the head of a large one, which
# is copied into its own buffer once its size is known (frames.py).
_READ_SIZE = 64 * 1024
_ACCEPT_PAUSE_S = 0.1


class KafkaListener:
    """The broker's Kafka listeners and connections."""

    def __init__(self, addresses: Iterable[str], *, selector: selectors.BaseSelector,
                 conns: Connections, dispatch: Callable[[KafkaConn, Request], list | None],
                 close: Callable[[KafkaConn], None], max_request_bytes: int,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._addresses = list(addresses)
        self._sel = selector
        self._conns = conns
        self._dispatch = dispatch
        self._close = close
        self._max_request_bytes = max_request_bytes
        self._handlers: dict[int, KafkaHandler] = {}
        self._sockets: list[socket.socket] = []
        self._protocols: dict[socket.socket, str] = {}     # listening socket -> PLAINTEXT...
        self.bound: list[str] = []
        # Parked handlers (Fetch's long poll): by partition, and by deadline.
        self._parked: dict[tuple[str, int], set[Exchange]] = {}
        self._deadlines: list[tuple[float, int, Exchange]] = []
        self._seq = itertools.count()
        self._accept_paused_until: float | None = None
        # TLS hook (tls.py): the context of SSL:// listeners, the listening sockets that use
        # it, and the handshakes in progress by deadline.
        self._ssl_context = ssl_context
        self._tls_sockets: set[socket.socket] = set()
        self._handshakes: list[tuple[float, int, KafkaConn]] = []
        self._budget = FrameBudget()       # large frames received in place (frames.py)
        self._scratch = bytearray(_READ_SIZE)

    def set_handlers(self, handlers: Mapping[int, KafkaHandler]) -> None:
        for key in handlers:
            if key not in SERVED:
                raise ValueError(f"a handler for api {key}, which versions.py does not serve")
        self._handlers = dict(handlers)

    def api_versions(self) -> list[dict]:
        """What ApiVersions advertises: the served range of every api with a handler."""
        keys = sorted(set(self._handlers) | {API_VERSIONS})
        return [{"api_key": k, "min_version": SERVED[k][0], "max_version": SERVED[k][1]}
                for k in keys]

    # --- sockets ------------------------------------------------------------------------------
    def listen(self) -> None:
        """Bind every address (port 0: any free one); ``bound`` lists where. Raises
        ``OSError`` naming the address that cannot be bound."""
        for text in self._addresses:
            spec = parse_listener(text)       # config.py applied the loopback rule
            secure, host, port = spec.tls, spec.host, spec.port
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(info[0], socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(info[4])
                sock.listen(512)
            except OSError as err:
                sock.close()
                raise OSError(err.errno, f"cannot listen for Kafka clients on {text}: "
                              f"{err.strerror}") from err
            sock.setblocking(False)
            self._sockets.append(sock)
            if secure:
                if self._ssl_context is None:
                    raise ValueError(f"Kafka listener {text!r} needs a TLS context")
                self._tls_sockets.add(sock)
            self._protocols[sock] = spec.protocol
            self._sel.register(sock, selectors.EVENT_READ, self)
            name = sock.getsockname()
            self.bound.append(display(spec, f"[{name[0]}]:{name[1]}" if ":" in name[0]
                                      else f"{name[0]}:{name[1]}"))
            log.info("Kafka listener on %s", self.bound[-1])

    def close(self) -> None:
        """Stop accepting (idempotent); the connections are the loop's to close."""
        for sock in self._sockets:
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        self._sockets.clear()
        self._protocols.clear()

    def accept(self, key: selectors.SelectorKey) -> None:
        listener = key.fileobj
        while True:
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE):
                    # The pending connection stays in the backlog and the socket readable:
                    # stop watching it for a while rather than spin on it.
                    log.warning("Kafka listener: accept failed: %s; pausing accepts for "
                                "%d ms", err.strerror, _ACCEPT_PAUSE_S * 1000)
                    self._pause_accepts()
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = None
            if listener in self._tls_sockets:                  # TLS hook
                deadline = time.monotonic() + tls.HANDSHAKE_TIMEOUT_S
                session = tls.TlsSession.accept(self._ssl_context, sock, deadline)
                sock = session.sock
            conn = KafkaConn(sock, self._conns.next_id(), self._max_request_bytes,
                             f"{peer[0]}:{peer[1]}", self._protocols.get(listener, PLAINTEXT),
                             self._budget)
            conn.tls = session
            if session is not None:
                heapq.heappush(self._handshakes, (session.deadline, conn.conn_id, conn))
            self._conns.adopt(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _pause_accepts(self) -> None:
        for sock in self._sockets:
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
        self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE_S

    def _resume_accepts(self, now: float) -> None:
        if self._accept_paused_until is None or now < self._accept_paused_until:
            return
        self._accept_paused_until = None
        for sock in self._sockets:
            self._sel.register(sock, selectors.EVENT_READ, self)

    # --- reading ------------------------------------------------------------------------------
    def read(self, conn: KafkaConn) -> None:
        if conn.tls is not None and not conn.tls.established:   # TLS hook
            self._handshake(conn)
            return
        tail = conn.frames.tail()
        try:
            if tail is not None and conn.tls is None:       # a large frame: in place
                with tail:
                    n = conn.sock.recv_into(tail)
                conn.frames.filled(n)
            elif conn.tls is not None:          # decrypted, then copied in
                data = conn.tls.recv(len(tail) if tail is not None else _READ_SIZE)
                n = len(data)
                conn.frames.feed(data)
            else:
                n = conn.sock.recv_into(self._scratch)
                with memoryview(self._scratch) as view:
                    conn.frames.feed(view[:n])
        except (BlockingIOError, InterruptedError):
            return
        except RemoteProtocolError as err:                      # TLS: a renegotiation, ...
            log.info("closing Kafka connection from %s: %s", conn.peer, err)
            self._close(conn)
            return
        except OSError:
            n = 0
        if not n:
            self._close(conn)
            return
        self._serve(conn)

    def _serve(self, conn: KafkaConn) -> None:
        """Handle the whole requests received until the peer is backlogged, then watch its
        socket for what it may do next."""
        try:
            while not conn.closing and not conn.backlogged:
                frame = conn.frames.next_frame()
                if frame is None:
                    break
                self._request(conn, frame)
        except RemoteProtocolError as err:
            log.info("closing Kafka connection from %s: %s", conn.peer, err)
            self._close(conn)
            return
        except Exception:        # a bug in mq: this connection goes, the broker serves on
            log.exception("closing Kafka connection from %s: a request failed", conn.peer)
            self._close(conn)
            return
        self._watch(conn)

    # --- TLS (tls.py) -------------------------------------------------------------------------
    def _handshake(self, conn: KafkaConn) -> None:
        """Advance ``conn``'s TLS handshake; once done, its principal is set and what the
        client sent with its last handshake message is read."""
        try:
            events = conn.tls.handshake()
        except RemoteProtocolError as err:
            log.info("closing Kafka connection from %s: %s", conn.peer, err)
            self._close(conn)
            return
        except OSError:                 # the client went away: as a plain one, no log
            self._close(conn)
            return
        if events:
            try:
                self._sel.modify(conn.sock, events, conn)
            except (KeyError, ValueError):
                pass
            return
        conn.principal = conn.tls.principal
        log.info("Kafka connection from %s: %s, principal %s", conn.peer,
                 conn.sock.version(), conn.principal)
        self._watch(conn)           # the handshake may have left it selected for writing
        self.read(conn)

    def _handshake_timers(self, now: float) -> None:
        while self._handshakes and self._handshakes[0][0] <= now:
            _, _, conn = heapq.heappop(self._handshakes)
            if not conn.closing and not conn.tls.established:
                log.info("closing Kafka connection from %s: no TLS handshake within %d s",
                         conn.peer, tls.HANDSHAKE_TIMEOUT_S)
                self._close(conn)

    def _watch(self, conn: KafkaConn) -> None:
        """Select for reading unless the peer is backlogged, for writing while output waits;
        for neither, the socket leaves the selector (a parked Fetch finishing, or a reply
        for a request in flight, brings it back through ``write``)."""
        if conn.closing:
            return
        events = (0 if conn.backlogged else selectors.EVENT_READ) | \
            (selectors.EVENT_WRITE if conn.parts else 0)
        try:
            if events:
                try:
                    self._sel.modify(conn.sock, events, conn)
                except KeyError:
                    self._sel.register(conn.sock, events, conn)
            else:
                self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass

    def _request(self, conn: KafkaConn, frame: memoryview) -> None:
        api_key, version, correlation_id = peek_header(frame)
        if not conn.authenticated and api_key not in PRE_AUTH_APIS:
            raise RemoteProtocolError(f"api {api_key} before SASL authentication")
        served = SERVED.get(api_key) if api_key in self._handlers or \
            api_key == API_VERSIONS else None
        if served is None or not served[0] <= version <= served[1]:
            if api_key == API_VERSIONS:        # KIP-511: answer in v0 with what we speak
                slot = conn.open_slot(correlation_id, API_VERSIONS, 0)
                conn.finish(slot, {"error_code": UnsupportedVersionError.code,
                                   "api_keys": self.api_versions()})
                self._conns.mark_unsent(conn)
                return
            what = f"api {api_key}" if served is None else \
                f"api {api_key} version {version} (this broker serves {served[0]}-{served[1]})"
            raise RemoteProtocolError(f"unsupported {what}")
        header, body = decode_request(frame)
        conn.client_id = header.client_id
        slot = conn.open_slot(correlation_id, api_key, version)
        if api_key == API_VERSIONS:
            conn.finish(slot, {"error_code": 0, "api_keys": self.api_versions()})
        else:
            result = self._handlers[api_key](conn, version, body)
            if hasattr(result, "send"):             # a generator: an exchange
                Exchange(self, conn, slot, result).start()
            else:
                conn.finish(slot, result)
        self._conns.mark_unsent(conn)

    # --- Runner (exchange.py) -----------------------------------------------------------------
    def dispatch(self, conn: KafkaConn, req: Request) -> list | None:
        return self._dispatch(conn, req)

    def failed(self, conn: KafkaConn, what: str) -> None:
        self._close(conn)

    def park(self, exchange: Exchange, park: Park) -> None:
        for key in park.partitions:
            self._parked.setdefault(key, set()).add(exchange)
        heapq.heappush(self._deadlines, (park.deadline, next(self._seq), exchange))

    def _unpark(self, exchange: Exchange) -> None:
        for waiting in self._parked.values():
            waiting.discard(exchange)

    def partitions_moved(self, touched: Iterable[Partition]) -> None:
        """The loop's end of round: wake the handlers parked on a partition that moved."""
        if not self._parked:
            return
        woken: list[Exchange] = []
        for part in touched:
            waiting = self._parked.pop((part.topic, part.partition), None)
            if waiting:
                woken += waiting
        for exchange in woken:
            if exchange.parked:
                self._unpark(exchange)
                exchange.wake()
                self._conns.mark_unsent(exchange.conn)

    def timers(self, now: float) -> None:
        self._resume_accepts(now)
        self._handshake_timers(now)
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, exchange = heapq.heappop(self._deadlines)
            if exchange.parked:
                self._unpark(exchange)
                exchange.wake()
                self._conns.mark_unsent(exchange.conn)
        if not self._deadlines:
            self._parked = {k: v for k, v in self._parked.items() if v}

    def deadline_s(self, now: float) -> float:
        while self._deadlines and not self._deadlines[0][2].parked:
            heapq.heappop(self._deadlines)
        wait = max(0.0, self._deadlines[0][0] - now) if self._deadlines else 3600.0
        if self._accept_paused_until is not None:
            wait = min(wait, max(0.0, self._accept_paused_until - now))
        if self._handshakes:
            wait = min(wait, max(0.0, self._handshakes[0][0] - now))
        return wait

    # --- writing ------------------------------------------------------------------------------
    def write(self, conn: KafkaConn) -> None:
        """Send what the socket takes; then handle the requests a backlog held back."""
        if conn.closing:
            return
        if conn.tls is not None and not conn.tls.established:   # TLS hook
            self._handshake(conn)
            return
        try:
            conn.send_some()
        except OSError as err:
            # A peer that went away with answers unread (librdkafka closes connections it no
            # longer needs) is no news; anything else on the way out is.
            if conn.parts and not isinstance(err, (ConnectionError, ssl.SSLEOFError,
                                                   ssl.SSLZeroReturnError)):
                log.info("closing Kafka connection from %s: %s", conn.peer, err)
            self._close(conn)
            return
        self._serve(conn)
