"""systemd's notify protocol, as much as a pool needs: one datagram per state change to
``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace), no libsystemd. The
supervisor sends ``READY=1`` once every child has joined its group, ``WATCHDOG=1`` from its
loop (every half ``$WATCHDOG_USEC``), ``STOPPING=1`` when it starts to drain. Without
``NOTIFY_SOCKET`` (not under systemd) nothing is sent.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["sd_notify"]

log = logging.getLogger("workers.supervisor")


def sd_notify(message: str) -> None:
    """One datagram to systemd's ``NOTIFY_SOCKET``, if set (``@`` = abstract namespace)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address[0] == "@":
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), address)
    except OSError as err:
        log.warning("sd_notify %r failed: %s", message, err)
