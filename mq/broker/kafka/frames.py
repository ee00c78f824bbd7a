"""Kafka's request frames from a byte stream (sans-I/O): a 4-byte big-endian size, then the
request.

Small frames are gathered in one buffer per connection and copied out whole. A large frame
(``LARGE_FRAME`` bytes or more) that has not arrived in full when its size is read gets a
buffer of its own, sized to it: what came of it so far is copied there once, and the owner of
the socket receives the rest straight into it (``tail()``, then ``filled(n)``), so a 1 MiB
Produce is not copied again in user space between the socket and the log (about 40 % of the
broker's time on produce went to those copies, bench/RESULTS.md). The buffer of the last large
frame is used again for the next one once nothing refers to it any more (the request that read
it is done): a fresh megabyte costs its page faults and zeroing, as much as the copies did.
Only a buffer of at most ``SPARE_MAX`` is kept for that (a Produce of batches up to 1 MB), so
an idle connection that once sent a 100 MiB request does not hold 100 MiB.

Sizing a buffer by a size the peer claims, before its bytes arrive, must not let peers make
the broker allocate what they never send. Two bounds:

- ``FrameBudget``: the bytes all of a listener's connections may hold promised to large frames
  not yet received. A frame the budget cannot cover is gathered as small ones are, growing as
  its bytes arrive, so a peer that claims and never sends costs nothing.
- ``max_frame``: a size above it, or below 8, raises ``RemoteProtocolError`` before the body is
  read. The connection sets it to Kafka's ``socket.request.max.bytes`` once a client may send
  anything, and to ``PRE_AUTH_MAX_FRAME`` (Kafka's ``sasl.server.max.receive.size``, 512 KiB)
  while a SASL listener's client has not authenticated.
"""

from __future__ import annotations

import sys
from typing import Final

from mq.errors import RemoteProtocolError

__all__ = ["FrameBudget", "FrameBuffer", "LARGE_FRAME", "PRE_AUTH_MAX_FRAME"]

MIN_FRAME: Final = 8           # api key, version and correlation id: every header has them
LARGE_FRAME: Final = 64 * 1024
PRE_AUTH_MAX_FRAME: Final = 512 * 1024
SPARE_MAX: Final = 2 * 1024 * 1024   # the largest large-frame buffer kept for the next one
# What a listener's connections may hold promised to large frames they are receiving: 64 MiB,
# the bytes a single peer may hold in unsent responses (conn.MAX_PENDING_OUT).
DEFAULT_BUDGET: Final = 64 * 1024 * 1024


class FrameBudget:
    """Bytes promised to large frames still being received, across connections."""

    def __init__(self, limit: int = DEFAULT_BUDGET) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class FrameBuffer:
    """Size-prefixed frames from a byte stream (the module's docstring)."""

    def __init__(self, max_frame: int, budget: FrameBudget | None = None) -> None:
        self.max_frame = max_frame
        self._budget = budget if budget is not None else FrameBudget()
        self._buf = bytearray()
        self._pos = 0
        self._large: bytearray | None = None     # a large frame's own buffer, being filled
        self._filled = 0
        self._spare: bytearray | None = None     # the last large frame returned

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes received (copied in); a large frame in progress takes what is its own."""
        if self._large is not None:
            room = len(self._large) - self._filled
            head = memoryview(data)[:room]
            self._large[self._filled:self._filled + len(head)] = head
            self._filled += len(head)
            data = memoryview(data)[room:]
        if data:
            self._buf += data

    def tail(self) -> memoryview | None:
        """Where the next bytes of the stream belong when a large frame is in progress: the
        part of its buffer not yet filled (receive into it, then ``filled``); else None."""
        if self._large is None or self._filled == len(self._large):
            return None
        return memoryview(self._large)[self._filled:]

    def filled(self, n: int) -> None:
        """``n`` bytes were received into ``tail()``."""
        self._filled += n

    def next_frame(self) -> bytearray | None:
        """The next whole frame received, a buffer of its own (a request's records stay views
        of it while the request is in progress, a Produce waiting for its fsync); None until
        one is whole. Raises ``RemoteProtocolError`` for a size out of bounds, before its body
        is read."""
        large = self._large
        if large is not None:
            if self._filled < len(large):
                return None
            self._large = None
            self._budget.give(len(large))
            self._spare = large if len(large) <= SPARE_MAX else None
            return large
        buf, pos = self._buf, self._pos
        if len(buf) - pos >= 4:
            size = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
            if size < MIN_FRAME or size > self.max_frame:
                raise RemoteProtocolError(
                    f"request size {size} is outside {MIN_FRAME}..{self.max_frame} "
                    "(socket.request.max.bytes)")
            have = len(buf) - pos - 4
            if have >= size:
                self._pos = pos + 4 + size
                return buf[pos + 4:self._pos]
            if size >= LARGE_FRAME and self._budget.take(size):
                large = self._large = self._large_buffer(size)
                large[:have] = memoryview(buf)[pos + 4:]
                self._filled = have
                del buf[:]
                self._pos = 0
                return None
        self.compact()
        return None

    def _large_buffer(self, size: int) -> bytearray:
        """``size`` bytes for a large frame: the last one's buffer when nothing else refers to
        it (no request still reads it: no view of it, no other reference), else a new one."""
        spare, self._spare = self._spare, None
        # References: ``spare`` here and getrefcount's argument; any other is a reader's.
        if spare is not None and sys.getrefcount(spare) == 2:
            try:                 # a resize also fails while a view of it exists
                if len(spare) > size:
                    del spare[size:]
                elif len(spare) < size:
                    spare += bytes(size - len(spare))
                return spare
            except BufferError:
                pass
        return bytearray(size)

    def compact(self) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0

    def release(self) -> None:
        """The connection closed: what a large frame in progress held is given back."""
        if self._large is not None:
            self._budget.give(len(self._large))
            self._large = None

    @property
    def pending_bytes(self) -> int:
        """Bytes received that no frame returned so far holds."""
        return len(self._buf) - self._pos + (self._filled if self._large is not None else 0)
