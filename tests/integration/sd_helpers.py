"""What the systemd tests share: a real ``NOTIFY_SOCKET`` listener that collects datagrams,
and ``read_all`` of a topic through the Python consumer."""

from __future__ import annotations

import socket
import time

import mq

WAIT = 30.0


class NotifyListener:
    """An ``AF_UNIX``/``SOCK_DGRAM`` socket bound at ``address`` (a path, or ``@name``)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.seen: list[str] = []

    def recv(self, timeout: float) -> str | None:
        """The next datagram, or None after ``timeout`` seconds without one."""
        self.sock.settimeout(timeout)
        try:
            message = self.sock.recv(65536).decode()
        except (TimeoutError, BlockingIOError):
            return None
        self.seen.append(message)
        return message

    def expect(self, predicate, timeout: float = WAIT, what: str = "a message") -> str:
        """The first datagram ``predicate`` accepts, skipping others; fails after
        ``timeout`` seconds naming what was seen."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            message = self.recv(max(0.0, left)) if left > 0 else None
            if message is None:
                raise AssertionError(f"no {what} within {timeout} s; seen: {self.seen[-20:]}")
            if predicate(message):
                return message

    def drain(self) -> list[str]:
        """Every datagram already queued."""
        out = []
        while (message := self.recv(0.0)) is not None:
            out.append(message)
        return out

    def close(self) -> None:
        self.sock.close()


def read_all(socket_path: str, topic: str) -> list[bytes]:
    """Every value of ``topic`` (partition order, then offset) up to its end now."""
    with mq.Admin(socket_path) as admin:
        ends = [end for _, end in admin.describe_topic(topic)["offsets"]]
    out = []
    with mq.Consumer(topic, socket=socket_path, value_bytes=True) as consumer:
        consumer.seek_to_beginning()
        tps = sorted(consumer.assignment())
        deadline = time.monotonic() + WAIT
        while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
            assert time.monotonic() < deadline, "records did not arrive in time"
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend(records)
    return [r.value for r in sorted(out, key=lambda r: (r.partition, r.offset))]
