"""Raw Kafka-protocol requests for the wire tests: what the clients cannot send by hand."""

from __future__ import annotations

import socket

from mq.protocol.kafka.codec import decode_response, encode_request

__all__ = ["call"]


def call(address: str, api_key: int, version: int, body: dict, timeout: float = 30.0
         ) -> dict:
    """One request on a connection of its own, closed after the response (as a client that
    reconnects between requests), with mq's codec: the response body."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(encode_request(api_key, version, 7, body))
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = sock.recv(65536)
            assert chunk, "the broker closed the connection"
            data += chunk
    correlation_id, response = decode_response(api_key, version, data[4:])
    assert correlation_id == 7
    return response
