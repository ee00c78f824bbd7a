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

Frames (``FrameBuffer``): a 4-byte big-endian size, then the request. A size above
``max_request_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB) or below 8 closes the
connection before the body is read, so a hostile size allocates nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import socket
from collections.abc import Iterator
from typing import Any

from mq.broker.conns import Conn
from mq.errors import RemoteProtocolError
from mq.protocol.kafka.codec import FileRegion, encode_response

__all__ = ["FrameBuffer", "KafkaConn", "Slot"]

_MIN_FRAME = 8                 # api key, version and correlation id: every header has them
_READ_SIZE = 256 * 1024


class FrameBuffer:
    """Size-prefixed frames from a byte stream (sans-I/O)."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def frames(self) -> Iterator[bytearray]:
        """The whole frames received so far, each a copy of its own: a request's records
        stay views of it while the request is in progress (a Produce waiting for its fsync),
        and this buffer moves on. Raises ``RemoteProtocolError`` for a size out of bounds."""
        buf = self._buf
        while len(buf) - self._pos >= 4:
            size = int.from_bytes(buf[self._pos:self._pos + 4], "big", signed=True)
            if size < _MIN_FRAME or size > self.max_frame:
                raise RemoteProtocolError(
                    f"request size {size} is outside {_MIN_FRAME}..{self.max_frame} "
                    "(socket.request.max.bytes)")
            if len(buf) - self._pos - 4 < size:
                break
            start = self._pos + 4
            self._pos = start + size
            yield buf[start:start + size]
        self.compact()

    def compact(self) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0

    @property
    def pending_bytes(self) -> int:
        return len(self._buf) - self._pos


@dataclasses.dataclass(eq=False)
class Slot:
    """One request's place in the response order."""

    correlation_id: int
    api_key: int
    api_version: int
    body: dict | None = None
    done: bool = False
    silent: bool = False            # no response at all (Produce with acks=0)


class KafkaConn(Conn):
    """A Kafka-protocol client connection (hashable by identity, like ``Conn``)."""

    def __init__(self, sock: socket.socket, conn_id: int, max_request_bytes: int,
                 peer: str) -> None:
        super().__init__(sock, None, None, conn_id)     # type: ignore[arg-type]
        self.peer = peer
        self.frames = FrameBuffer(max_request_bytes)
        self.slots: collections.deque[Slot] = collections.deque()
        self.parts: collections.deque[Any] = collections.deque()
        # native request id -> the exchange waiting for its reply (exchange.py)
        self.awaiting: dict[int, Any] = {}
        self._next_rid = 1
        self.local_address: tuple[str, int] = sock.getsockname()[:2]
        self.greeted = True            # no native Handshake: ApiVersions is optional
        self.client_id: str | None = None
        self.bytes_out = 0

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
        """The response of ``slot`` is ``body`` (None: no response); encodes every finished
        slot at the head of the queue into ``parts``."""
        slot.body = body
        slot.silent = body is None
        slot.done = True
        while self.slots and self.slots[0].done:
            head = self.slots.popleft()
            if not head.silent and not self.closing:
                self.parts.extend(encode_response(head.api_key, head.api_version,
                                                  head.correlation_id, head.body))

    @property
    def has_output(self) -> bool:
        return bool(self.parts)

    def send_some(self) -> None:
        """Write what the socket takes now: bytes with ``send``, regions with ``sendfile``.
        Raises ``OSError`` when the peer is gone; returns when the socket would block."""
        sock = self.sock
        while self.parts:
            part = self.parts[0]
            if isinstance(part, FileRegion):
                try:
                    n = os.sendfile(sock.fileno(), part.fd, part.offset, part.length)
                except (BlockingIOError, InterruptedError):
                    return
                if n == 0:          # the file is shorter than the region: the frame is lost
                    raise OSError(f"segment file ended {part.length} bytes early")
                self.bytes_out += n
                if n < part.length:
                    self.parts[0] = FileRegion(part.fd, part.offset + n, part.length - n)
                    continue
                os.close(part.fd)
                self.parts.popleft()
                continue
            try:
                n = sock.send(part)
            except (BlockingIOError, InterruptedError):
                return
            self.bytes_out += n
            if n < len(part):
                self.parts[0] = memoryview(part)[n:]
                continue
            self.parts.popleft()

    def release_shared(self) -> None:
        """Close the descriptors of regions never sent (the connection closed)."""
        super().release_shared()
        while self.parts:
            part = self.parts.popleft()
            if isinstance(part, FileRegion):
                os.close(part.fd)
        for exchange in list(self.awaiting.values()):
            exchange.abandon()
        self.awaiting.clear()
        self.slots.clear()
