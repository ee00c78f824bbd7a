"""A ``KafkaListener`` on a real loopback socket without a broker: the test drives its
``read``/``write`` by hand, one connected client socket on the other end."""

from __future__ import annotations

import selectors
import socket
import struct

from mq.broker.conns import Connections
from mq.broker.kafka.listener import KafkaListener


class ListenerPair:
    def __init__(self, handlers: dict | None = None) -> None:
        self.sel = selectors.DefaultSelector()
        self.conns = Connections(1 << 20)
        self.closed: list = []
        self.listener = KafkaListener(["127.0.0.1:0"], selector=self.sel, conns=self.conns,
                                      dispatch=lambda conn, req: None, close=self._close,
                                      max_request_bytes=1 << 20)
        self.listener.set_handlers(handlers or {})
        self.listener.listen()
        host, port = self.listener.bound[0].rsplit(":", 1)
        self.client = socket.create_connection((host, int(port)), timeout=5)
        for key, _ in self.sel.select(5):
            if key.data is self.listener:
                self.listener.accept(key)
        (self.conn,) = list(self.conns)

    def _close(self, conn) -> None:
        """What the broker's ``_close`` does to a connection, as far as the listener sees."""
        conn.closing = True
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.release_shared()
        self.closed.append(conn)

    def send(self, frame: bytes, write: bool = True) -> None:
        """``frame`` from the client, read by the listener (and answered: ``write``)."""
        self.client.sendall(frame)
        for key, _ in self.sel.select(5):
            if key.data is self.conn:
                self.listener.read(self.conn)
                if write and not self.conn.closing:
                    self.listener.write(self.conn)
                return
        raise AssertionError("no request arrived")

    def response(self) -> bytes:
        size = struct.unpack(">i", self._exactly(4))[0]
        return self._exactly(size)

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.client.recv(n - len(buf))
            assert chunk, "the listener closed the connection"
            buf += chunk
        return buf

    def close(self) -> None:
        self.client.close()
        self.conn.sock.close()
        self.listener.close()
        self.sel.close()
