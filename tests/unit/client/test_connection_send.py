"""Connection's send of a tail frame: every byte goes out in order, even when the kernel takes
only part of the ``sendmsg``."""

from __future__ import annotations

import socket
import threading

import pytest

from mq.client.connection import send_parts
from mq.protocol.frames import FrameReader, encode_tail_frame


class ShortSocket:
    """Takes at most ``first`` bytes of the sendmsg, then everything sendall gets."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.data = b""

    def sendmsg(self, parts) -> int:
        sent = b"".join(bytes(p) for p in parts)[:self.first]
        self.data += sent
        return len(sent)

    def sendall(self, data) -> None:
        self.data += bytes(data)


@pytest.mark.parametrize("first", [0, 1, 7, 20, 1000, 1 << 20])
def test_a_short_sendmsg_is_completed(first):
    parts = (b"head-bytes", b"", memoryview(b"tail" * 100))
    sock = ShortSocket(first)
    send_parts(sock, parts)
    assert sock.data == b"".join(bytes(p) for p in parts)


def test_a_tail_frame_larger_than_the_socket_buffer_arrives_whole():
    head, tail = encode_tail_frame([0, 1, "t", bytes(range(256)) * 40_000])   # 10 MiB
    a, b = socket.socketpair()
    received = bytearray()

    def drain() -> None:
        while chunk := b.recv(1 << 16):
            received.extend(chunk)
    reader = threading.Thread(target=drain)
    reader.start()
    with a:
        send_parts(a, (head, tail))
    reader.join(30)
    b.close()
    frames = FrameReader(max_frame_bytes=1 << 24)
    frames.feed(received)
    it = frames.messages()
    message = next(it)
    assert message[:3] == [0, 1, "t"] and message[3] == bytes(tail)
