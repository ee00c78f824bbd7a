"""Kafka listener addresses: ``[PROTOCOL://]HOST:PORT`` parsed and checked before anything
binds.

The protocols are Kafka's ``security.protocol`` values: PLAINTEXT (the default without a
prefix: no TLS, no authentication), SASL_PLAINTEXT (SASL, no TLS), SSL (TLS; with client
certificates required when ``kafka_ssl_cafile`` is set) and SASL_SSL (both).

A listener that does not authenticate its clients gives every local and remote user the
access that the Unix socket's file mode keeps to the socket's group. So such a listener binds
loopback addresses only — a name must resolve to loopback addresses and nothing else, and
``0.0.0.0``, ``::`` and an empty host are refused — unless the operator says
``kafka_allow_anonymous = true``. Authenticating means SASL_PLAINTEXT, SASL_SSL, or SSL with
client certificates.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from typing import Final

from mq.metrics import parse_address

__all__ = ["PLAINTEXT", "PROTOCOLS", "Listener", "check_listener", "display", "parse_listener"]

PLAINTEXT: Final = "PLAINTEXT"
PROTOCOLS: Final = ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL")


@dataclasses.dataclass(frozen=True, slots=True)
class Listener:
    protocol: str                   # one of PROTOCOLS
    host: str
    port: int

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def authenticates(self, client_certificates: bool) -> bool:
        """Whether every client proves who it is: SASL, or TLS with client certificates."""
        return self.sasl or (self.protocol == "SSL" and client_certificates)


def parse_listener(text: str) -> Listener:
    """``[PROTOCOL://]HOST:PORT`` (``[::1]:9092`` for IPv6) -> ``Listener``. Raises
    ``ValueError`` with one line naming what is wrong (an empty host too: it would mean every
    interface)."""
    if not isinstance(text, str):
        raise ValueError(f"a Kafka listener must be a string [PROTOCOL://]HOST:PORT, "
                         f"got {text!r}")
    protocol, sep, address = text.partition("://")
    if not sep:
        protocol, address = PLAINTEXT, text
    elif protocol.upper() not in PROTOCOLS:
        raise ValueError(f"Kafka listener {text!r}: the protocol must be one of "
                         f"{', '.join(PROTOCOLS)}, got {protocol!r}")
    if address.startswith(":"):
        raise ValueError(f"Kafka listener {text!r} must be HOST:PORT, like 127.0.0.1:9092: "
                         "a host is needed")
    host, port = parse_address(address, f"Kafka listener {text!r}", "127.0.0.1:9092")
    return Listener(protocol.upper(), host, port)


def check_listener(text: str, *, allow_anonymous: bool = False,
                   client_certificates: bool = False) -> Listener:
    """``parse_listener``, and refuse a listener on a host that is not loopback only unless
    it authenticates its clients or ``allow_anonymous``. Raises ``ValueError`` (one line)."""
    listener = parse_listener(text)
    host, port = listener.host, listener.port
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except socket.gaierror as err:
        raise ValueError(f"Kafka listener {text!r}: cannot resolve {host!r}: "
                         f"{err.strerror}") from err
    outside = sorted(a for a in found if not ipaddress.ip_address(a.split("%")[0]).is_loopback)
    if outside and not allow_anonymous and not listener.authenticates(client_certificates):
        why = ("SSL without kafka_ssl_cafile does not ask for client certificates"
               if listener.protocol == "SSL" else f"{listener.protocol} does not authenticate")
        raise ValueError(f"Kafka listener {text!r} is not a loopback address ({outside[0]}) "
                         f"and {why}: use SASL_PLAINTEXT:// or SASL_SSL:// with users (mq users "
                         "add), or set kafka_allow_anonymous = true")
    return listener


def display(listener: Listener, bound: str) -> str:
    """How ``bound`` (HOST:PORT) is shown: with its protocol prefix unless PLAINTEXT."""
    return bound if listener.protocol == PLAINTEXT else f"{listener.protocol}://{bound}"
