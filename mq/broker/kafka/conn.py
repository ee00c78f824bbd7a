"""One Kafka-protocol connection: its frames in, its responses out in request order.

Kafka answers the requests of one connection in the order they came, even when the client
pipelines them (``protocol.html``, "Network"). A request here may finish at once (Metadata),
later (a Produce with acks=all waits for the fsync; a Fetch waits for data), or never (a
Produce with acks=0 has no response). So each request takes a ``Slot`` in a queue; a slot is
filled when its response body is known, and filled slots leave the head of the queue in
order, encoded into ``out``. A slot behind an unfinished one waits: a parked Fetch holds back
the responses after it, as in Kafka.

A request becomes one or more native requests to the broker's components (``exchange.py``).
Their replies come back through ``Connections.send`` like any native reply, as
``[api, request_id, error_code, error_message, *fields]``; ``enqueue`` routes each to the
exchange that is waiting for its request id.

``out`` holds bytes and ``FileRegion``s (Fetch's records, sent with ``sendfile``); the
regions' descriptors are this connection's to close, when sent or when it closes.

Frames (``frames.FrameBuffer``): a 4-byte big-endian size, then the request. A size above
``max_request_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB), or above 512 KiB before
a SASL client has authenticated, or below 8, closes the connection before the body is read; a
large frame is received in place within the listener's ``FrameBudget`` (frames.py).

What one peer holds is bounded (``backlogged``): at most ``MAX_IN_FLIGHT`` requests read and
not answered in full, ``MAX_REGIONS`` open segment descriptors and ``MAX_PENDING_OUT``
response bytes it has not taken. Past any of them the listener reads no further request of
that peer until it drains (Kafka reads one request at a time per connection). A response is
encoded as soon as its body is known, even behind an unfinished one, and a records region of
at most ``INLINE_BYTES`` is read into it then (``pread``) and its descriptor closed: a client
that pipelines small Fetches and never reads holds bytes, not the broker's descriptors
(unbounded, a few thousand such Fetches took the broker to its open-file limit: EMFILE for
every client and every segment roll).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

from mq.broker.conns import Conn
from mq.broker.kafka import tls
from mq.broker.kafka.frames import PRE_AUTH_MAX_FRAME, FrameBudget, FrameBuffer
from mq.protocol.kafka.codec import FileRegion, encode_response

__all__ = ["KafkaConn", "Slot"]

log = logging.getLogger("mq.broker")

# Per connection. Clients pipeline 5 requests (max.in.flight.requests.per.connection in the
# Java client and kafka-python, librdkafka with idempotence); more wait in the socket.
MAX_IN_FLIGHT = 64
MAX_REGIONS = 64               # open segment descriptors for unsent records
MAX_PENDING_OUT = 64 * 1024 * 1024
# A region this small is copied into the response at once: a 16 KiB pread costs about what
# the sendfile call it replaces does, and keeps no descriptor open.
INLINE_BYTES = 16 * 1024


@dataclasses.dataclass(eq=False)
class Slot:
    """One request's place in the response order."""

    correlation_id: int
    api_key: int
    api_version: int
    parts: list | None = None       # the encoded response (None: none, Produce acks=0)
    done: bool = False


class KafkaConn(Conn):
    """A Kafka-protocol client connection (hashable by identity, like ``Conn``)."""

    def __init__(self, sock: socket.socket, conn_id: int, max_request_bytes: int,
                 peer: str, protocol: str = "PLAINTEXT",
                 budget: FrameBudget | None = None) -> None:
        super().__init__(sock, None, None, conn_id)     # type: ignore[arg-type]
        self.peer = peer
        # Security (sasl_wire.py): the listener's protocol, who the client is (what ACLs
        # match; Kafka's KafkaPrincipal text), and on a SASL_* listener the exchange in
        # progress until ``authenticated``.
        self.protocol = protocol
        self.principal = tls.ANONYMOUS
        self.authenticated = not protocol.startswith("SASL_")
        self.sasl: Any = None
        self.max_request_bytes = max_request_bytes
        self.frames = FrameBuffer(max_request_bytes if self.authenticated else
                                  min(max_request_bytes, PRE_AUTH_MAX_FRAME), budget)
        self.slots: collections.deque[Slot] = collections.deque()
        self.parts: collections.deque[Any] = collections.deque()
        # native request id -> the exchange waiting for its reply (exchange.py)
        self.awaiting: dict[int, Any] = {}
        self._next_rid = 1
        self.local_address: tuple[str, int] = sock.getsockname()[:2]
        self.greeted = True            # no native Handshake: ApiVersions is optional
        self.client_id: str | None = None
        self.bytes_out = 0
        self.pending_out = 0           # bytes in ``parts``
        self._unsent: collections.deque[int] = collections.deque()   # their responses' sizes
        self.regions = 0               # FileRegions in ``parts`` and in finished slots
        self.tls: tls.TlsSession | None = None      # TLS hook: an SSL:// listener's (tls.py)

    def authenticate(self, principal: str) -> None:
        """SASL succeeded: ``principal`` is who the client is, and it may send any request,
        up to ``max_request_bytes``."""
        self.sasl = None
        self.authenticated = True
        self.principal = principal
        self.frames.max_frame = self.max_request_bytes

    # --- native replies -----------------------------------------------------------------------
    def request_id(self) -> int:
        """A fresh native request id (never 0: that is the push id)."""
        rid = self._next_rid
        self._next_rid = rid + 1 if rid < (1 << 62) else 1
        return rid

    def enqueue(self, message: list) -> None:
        """A native reply (or push) for this connection: to the exchange awaiting it."""
        waiter = self.awaiting.pop(message[1], None)
        if waiter is not None:
            waiter.reply(message)

    # --- responses ----------------------------------------------------------------------------
    def open_slot(self, correlation_id: int, api_key: int, api_version: int) -> Slot:
        slot = Slot(correlation_id, api_key, api_version)
        self.slots.append(slot)
        return slot

    def finish(self, slot: Slot, body: dict | None) -> None:
        """The response of ``slot`` is ``body`` (None: no response): encoded now, and every
        finished slot at the head of the queue moves into ``parts``. Raises ``ValueError``
        for a body the codec cannot encode (a bug in mq) and ``OSError`` for a records region
        past the end of its file, its descriptors closed: the caller closes the connection."""
        slot.done = True
        if body is not None and self.closing:
            for region in _regions(body):          # nobody will send it
                _close_fd(region.fd)
        elif body is not None:
            try:
                parts = encode_response(slot.api_key, slot.api_version, slot.correlation_id,
                                        body)
            except ValueError:
                for region in _regions(body):
                    _close_fd(region.fd)
                raise
            slot.parts = self._inline(parts)
            self.regions += sum(isinstance(p, FileRegion) for p in slot.parts)
        while self.slots and self.slots[0].done:
            head = self.slots.popleft()
            if head.parts:
                size = sum(p.length if isinstance(p, FileRegion) else len(p)
                           for p in head.parts)
                self.parts.extend(head.parts)
                self.pending_out += size
                self._unsent.append(size)

    @staticmethod
    def _inline(parts: list) -> list:
        """``parts`` with every region of at most ``INLINE_BYTES`` read into the bytes around
        it, its descriptor closed. Raises ``OSError`` for a file shorter than a region, with
        every region's descriptor closed."""
        out: list = []
        rest = iter(parts)
        try:
            for part in rest:
                if isinstance(part, FileRegion):
                    if part.length > INLINE_BYTES:
                        out.append(part)
                        continue
                    try:
                        data = os.pread(part.fd, part.length, part.offset)
                    finally:
                        os.close(part.fd)
                    if len(data) != part.length:
                        raise OSError(f"segment file ended {part.length - len(data)} bytes "
                                      "early")
                    part = data
                if out and isinstance(out[-1], bytearray):
                    out[-1] += part
                else:
                    out.append(bytearray(part))
        except OSError:
            for part in itertools.chain(out, rest):
                if isinstance(part, FileRegion):
                    _close_fd(part.fd)
            raise
        return out

    @property
    def backlogged(self) -> bool:
        """Read no more requests of this peer for now (the module's docstring)."""
        return len(self.slots) + len(self._unsent) >= MAX_IN_FLIGHT or \
            self.regions >= MAX_REGIONS or self.pending_out >= MAX_PENDING_OUT

    def _sent(self, n: int) -> None:
        self.bytes_out += n
        self.pending_out -= n
        unsent = self._unsent
        while n and unsent:
            if unsent[0] <= n:
                n -= unsent.popleft()
            else:
                unsent[0] -= n
                n = 0

    @property
    def has_output(self) -> bool:
        return bool(self.parts)

    def send_some(self) -> None:
        """Write what the socket takes now: bytes with ``send``, regions with ``sendfile``
        (on TLS, regions copied and bytes encrypted: tls.py).
        Raises ``OSError`` when the peer is gone; returns when the socket would block."""
        sock = self.sock
        while self.parts:
            part = self.parts[0]
            if isinstance(part, FileRegion) and self.tls is not None:     # TLS hook
                if tls.copy_head_region(self.parts):
                    self.regions -= 1
                continue
            if isinstance(part, FileRegion):
                try:
                    n = os.sendfile(sock.fileno(), part.fd, part.offset, part.length)
                except (BlockingIOError, InterruptedError):
                    return
                if n == 0:          # the file is shorter than the region: the frame is lost
                    raise OSError(f"segment file ended {part.length} bytes early")
                self._sent(n)
                if n < part.length:
                    self.parts[0] = FileRegion(part.fd, part.offset + n, part.length - n)
                    continue
                os.close(part.fd)
                self.regions -= 1
                self.parts.popleft()
                continue
            try:
                # More parts follow (a Fetch's records): this one leaves with them in full
                # TCP segments instead of a segment of its own (8 consumers: 14 % less broker
                # CPU per GB fetched, bench.kafka_wire).
                n = self.tls.send(part) if self.tls is not None else \
                    sock.send(part, socket.MSG_MORE if len(self.parts) > 1 else 0)
            except (BlockingIOError, InterruptedError):
                return
            self._sent(n)
            if n < len(part):
                self.parts[0] = memoryview(part)[n:]
                continue
            self.parts.popleft()

    def release_shared(self) -> None:
        """Close the descriptors of regions never sent (the connection closed)."""
        super().release_shared()
        self.frames.release()
        held = list(self.parts) + [p for slot in self.slots for p in slot.parts or ()]
        self.parts.clear()
        for part in held:
            if isinstance(part, FileRegion):
                _close_fd(part.fd)
        self.regions = self.pending_out = 0
        self._unsent.clear()
        for exchange in list(self.awaiting.values()):
            exchange.abandon()
        self.awaiting.clear()
        self.slots.clear()


def _regions(value: Any) -> Iterator[FileRegion]:
    """The FileRegions anywhere in a response body."""
    if isinstance(value, FileRegion):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _regions(item)
    elif isinstance(value, list):
        for item in value:
            yield from _regions(item)


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
