"""Kafka listener addresses: ``HOST:PORT`` parsed and checked before anything binds.

Until the listener authenticates its clients (SASL, next), a TCP port would give every local
and remote user the access that the Unix socket's file mode keeps to the socket's group. So
a listener binds loopback addresses only: a name must resolve to loopback addresses and
nothing else, and ``0.0.0.0``, ``::`` and an empty host are refused.
"""

from __future__ import annotations

import ipaddress
import socket

from mq.metrics import parse_address

__all__ = ["check_listener", "parse_listener"]


def parse_listener(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9092`` for IPv6) -> (host, port). Raises ``ValueError`` with one
    line naming what is wrong (an empty host too: it would mean every interface)."""
    if not isinstance(text, str):
        raise ValueError(f"a Kafka listener must be a string HOST:PORT, got {text!r}")
    if text.startswith(":"):
        raise ValueError(f"Kafka listener {text!r} must be HOST:PORT, like 127.0.0.1:9092: "
                         "a host is needed")
    return parse_address(text, f"Kafka listener {text!r}", "127.0.0.1:9092")


def check_listener(text: str) -> tuple[str, int]:
    """``parse_listener``, and refuse a host that is not loopback only."""
    host, port = parse_listener(text)
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except socket.gaierror as err:
        raise ValueError(f"Kafka listener {text!r}: cannot resolve {host!r}: "
                         f"{err.strerror}") from err
    outside = sorted(a for a in found if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if outside:
        raise ValueError(f"Kafka listener {text!r} is not a loopback address ({outside[0]}): "
                         "the listener has no authentication yet, so it binds 127.0.0.1 or "
                         "::1 only")
    return host, port
