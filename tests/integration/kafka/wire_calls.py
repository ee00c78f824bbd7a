"""Raw Kafka-protocol requests for the wire tests: what the clients cannot send by hand."""

from __future__ import annotations

import socket

from mq.protocol.kafka.codec import decode_response, encode_request

__all__ = ["call", "read_frame"]


def call(address: str, api_key: int, version: int, body: dict, timeout: float = 30.0
         ) -> dict:
    """One request on a connection of its own, closed after the response (as a client that
    reconnects between requests), with mq's codec: the response body."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode_request(api_key, version, 7, body))
        data = read_frame(sock)
    correlation_id, response = decode_response(api_key, version, data)
    assert correlation_id == 7
    return response


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed Kafka frame (a request or a response) without its size. Raises
    ``ConnectionError`` if the peer closes first."""
    return _recv_exactly(sock, int.from_bytes(_recv_exactly(sock, 4), "big", signed=True))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)
