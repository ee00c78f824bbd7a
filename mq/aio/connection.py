"""An asyncio connection to the broker: the Unix socket and ``mq.protocol``, in an event loop.

``open_connection`` connects and shakes hands (the same checks and errors as the blocking
``mq.client.connection.Connection``). Requests pipeline: ``request`` writes one at once and
returns a future of its reply; ``call`` awaits it and raises an error reply as its exception.
Replies are read by the loop's protocol callback, never by a thread, and a broker push
(request id 0) goes to the callback registered for its api (``on_push``): the wake-up of a
``Wait`` with no semaphore, say, so an asyncio consumer sleeps on the socket itself.

A connection belongs to the event loop that opened it. When the broker goes away, every
waiting future fails with ``BrokerUnavailableError``; ``close`` fails them with
``ClosedError``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from typing import Any

from mq.client.connection import connect_error, resolve_socket
from mq.errors import (BrokerUnavailableError, ClosedError, ConfigError, LocalProtocolError,
                       RemoteProtocolError, error_for_code)
from mq.protocol.frames import FrameReader, encode_frame
from mq.protocol.messages import PROTOCOL_VERSION, PUSH_REQUEST_ID, Api, Response, request
from mq.protocol.paths import check_socket_path

__all__ = ["AsyncConnection", "open_connection"]


class _Protocol(asyncio.Protocol):
    """The socket's side of an ``AsyncConnection``: frames in, replies to their futures."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn
        self._reader = FrameReader()

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        conn = self._conn
        unclaimed: list[Response] = []
        try:
            for message in self._reader.messages():
                reply = Response.from_message(message)
                if not conn._received(reply):
                    unclaimed.append(reply)
        except RemoteProtocolError as err:
            conn._lost(BrokerUnavailableError(f"broker sent garbage: {err}"))
        if unclaimed and conn._replies is not None:
            conn._replies(unclaimed)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"broker connection lost: {exc}" if exc else "the broker closed the connection"
        self._conn._lost(BrokerUnavailableError(reason))

    def pause_writing(self) -> None:
        self._conn._writable.clear()

    def resume_writing(self) -> None:
        self._conn._writable.set()


class AsyncConnection:
    def __init__(self, socket_path: str, client_name: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.client_name = client_name
        self.timeout = timeout
        self.broker_info: dict[str, Any] = {}
        self._transport: asyncio.WriteTransport | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Response]] = {}
        self._pushes: dict[int, Callable[[Response], None]] = {}
        self._writable = asyncio.Event()
        self._writable.set()
        self._error: Exception | None = None
        self._replies: Callable[[list[Response]], None] | None = None
        self._on_lost: Callable[[Exception], None] | None = None
        self.arena = None                   # no batch arena over an event loop's connection

    @property
    def closed(self) -> bool:
        return self._error is not None

    # --- requests -----------------------------------------------------------------------------
    def request(self, api: Api, *fields: Any) -> asyncio.Future[Response]:
        """Write a request now; the future of its reply (an error reply is a reply)."""
        if self._error is not None:
            raise self._error
        rid = next(self._ids)
        try:
            frame = encode_frame(request(api, rid, *fields))
        except LocalProtocolError as err:
            raise LocalProtocolError(f"{api.name} request: {err}") from err
        future = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        assert self._transport is not None
        self._transport.write(frame)
        return future

    def send(self, api: Api, *fields: Any) -> int:
        """Write a request whose reply goes to the ``on_replies`` callback; its request id.
        Raises the connection's loss (``BrokerUnavailableError``, ``ClosedError``)."""
        if self._error is not None:
            raise self._error
        rid = next(self._ids)
        assert self._transport is not None
        self._transport.write(encode_frame(request(api, rid, *fields)))
        return rid

    def on_replies(self, replies: Callable[[list[Response]], None],
                   lost: Callable[[Exception], None]) -> None:
        """The replies to ``send``'s requests go to ``replies``, those of one read together;
        the connection's loss to ``lost``, once."""
        self._replies = replies
        self._on_lost = lost

    def send_one_way(self, api: Api, *fields: Any) -> None:
        """Write a request that has no reply (``Wait``)."""
        if self._error is not None:
            raise self._error
        assert self._transport is not None
        self._transport.write(encode_frame(request(api, next(self._ids), *fields)))

    async def reply(self, future: asyncio.Future[Response], timeout: float | None = None
                    ) -> Response:
        """The reply ``future`` brings, within ``timeout`` seconds (default: the
        connection's); ``TimeoutError`` after it (the connection stays usable: a late reply
        is dropped)."""
        try:
            return await asyncio.wait_for(asyncio.shield(future),
                                          self.timeout if timeout is None else timeout)
        except TimeoutError:
            raise TimeoutError("no response from the broker in time") from None

    async def call(self, api: Api, *fields: Any) -> Response:
        """One request and its reply; an error reply raised as its exception."""
        reply = await self.reply(self.request(api, *fields))
        if reply.error_code:
            raise error_for_code(reply.error_code, reply.error_message or "")
        return reply

    async def drain(self) -> None:
        """Wait while the socket's send buffer is full (the broker is behind)."""
        await self._writable.wait()

    def on_push(self, api: Api, callback: Callable[[Response], None]) -> None:
        """Call ``callback(reply)`` for each push of ``api`` the broker sends."""
        self._pushes[int(api)] = callback

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self._lost(ClosedError("connection is closed"))

    # --- the protocol's callbacks -------------------------------------------------------------
    def _received(self, reply: Response) -> bool:
        """Hand ``reply`` to its waiter; False if it has none (a reply to ``send``)."""
        if reply.request_id == PUSH_REQUEST_ID:
            callback = self._pushes.get(reply.api)
            if callback is not None:
                callback(reply)
            return True
        future = self._waiting.pop(reply.request_id, None)
        if future is None:
            return False
        if not future.done():
            future.set_result(reply)
        return True

    def _lost(self, err: Exception) -> None:
        if self._error is not None:
            return
        self._error = err
        self._writable.set()
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(err)
                future.exception()          # retrieved: no "never retrieved" warning
        for callback in self._pushes.values():
            callback(Response.refused(-1, str(err)))
        if self._on_lost is not None:
            self._on_lost(err)

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


async def open_connection(socket_path: str | None = None, client_name: str = "mq",
                          timeout: float = 30.0) -> AsyncConnection:
    """Connect to the broker and shake hands; raises ``BrokerUnavailableError`` (no broker
    there), ``ConfigError`` (a socket path too long) or the broker's refusal."""
    path = resolve_socket(socket_path)
    try:
        check_socket_path(path)
    except ValueError as err:
        raise ConfigError(f"cannot connect to the broker: {err}; give a shorter one "
                          "(--socket, socket=, $MQ_SOCKET)") from err
    conn = AsyncConnection(path, client_name, timeout)
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await loop.create_unix_connection(lambda: _Protocol(conn), path)
    except OSError as err:
        raise connect_error(path, err) from err
    conn._transport = transport
    try:
        reply = await conn.call(Api.HANDSHAKE, PROTOCOL_VERSION, client_name, os.getpid())
    except BaseException:
        conn.close()
        raise
    conn.broker_info = reply["info"]
    return conn
