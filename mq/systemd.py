"""systemd's service protocols without libsystemd: readiness notification, the watchdog, and
socket activation (``sd_notify(3)``, ``sd_watchdog_enabled(3)``, ``sd_listen_fds(3)``).

Notify: every state change is one ``AF_UNIX``/``SOCK_DGRAM`` datagram of ``KEY=VALUE`` lines
to ``$NOTIFY_SOCKET``, a filesystem path or, starting with ``@``, a name in Linux's abstract
namespace (``\\0`` + name). Without ``NOTIFY_SOCKET`` (not under systemd, or a unit that is
not ``Type=notify``) nothing is sent, so callers need no "am I under systemd" checks. A failed
send is logged and swallowed: the service keeps serving, and systemd's own timeouts decide.

Watchdog: ``$WATCHDOG_USEC`` is the period after which systemd kills a service that did not
send ``WATCHDOG=1``; ``$WATCHDOG_PID``, when set, names the process it is meant for (a child
that inherited the environment must not think it is watched).

Socket activation: systemd passes the listening sockets as fds ``3 .. 3 + $LISTEN_FDS - 1``
and sets ``$LISTEN_PID`` to the pid it started, so a child that inherited the environment
ignores them. ``$LISTEN_FDNAMES`` (``:``-separated) names them. As ``sd_listen_fds(unset=1)``
does, the variables are removed once read (our children never see them) and the fds get
``FD_CLOEXEC`` (nothing we exec inherits the listening socket).
"""

from __future__ import annotations

import logging
import os
import socket
import time

__all__ = ["LISTEN_FDS_START", "listen_fds", "monotonic_usec", "notify", "notify_address",
           "watchdog_usec"]

log = logging.getLogger("mq.systemd")

LISTEN_FDS_START = 3                      # SD_LISTEN_FDS_START


def notify_address(environ=os.environ) -> str | None:
    """Where notifications go: ``$NOTIFY_SOCKET`` as a ``sendto`` address (``@name`` turned
    into the abstract ``\\0name``), or None when unset."""
    address = environ.get("NOTIFY_SOCKET")
    if not address:
        return None
    return "\0" + address[1:] if address[0] == "@" else address


def notify(message: str, environ=os.environ) -> bool:
    """Send ``message`` (``"READY=1\\nSTATUS=..."``) as one datagram to ``$NOTIFY_SOCKET``.
    True if it was sent; False when there is no ``NOTIFY_SOCKET`` or the send failed (logged
    as a warning; never raises)."""
    address = notify_address(environ)
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), address)
    except OSError as err:
        log.warning("systemd notification %r to %s failed: %s", message,
                    environ.get("NOTIFY_SOCKET"), err)
        return False
    return True


def watchdog_usec(environ=os.environ, pid: int | None = None) -> int:
    """The watchdog period asked of this process in microseconds (``$WATCHDOG_USEC``), or 0
    when there is none, it is not a positive integer, or ``$WATCHDOG_PID`` names another
    process. Ping at half of it (systemd's advice)."""
    try:
        usec = int(environ.get("WATCHDOG_USEC") or 0)
    except ValueError:
        return 0
    watched = environ.get("WATCHDOG_PID")
    if watched:
        try:
            if int(watched) != (os.getpid() if pid is None else pid):
                return 0
        except ValueError:
            return 0
    return max(usec, 0)


def monotonic_usec() -> int:
    """``CLOCK_MONOTONIC`` in microseconds: the ``MONOTONIC_USEC=`` that systemd 253+ wants
    next to ``RELOADING=1`` (it is how it tells this reload from an older one)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def listen_fds(environ=os.environ, unset: bool = True) -> list[tuple[int, str]]:
    """The sockets systemd passed to this process: ``[(fd, name), ...]`` in order, fds from
    3; empty when ``$LISTEN_FDS`` is unset or ``$LISTEN_PID`` is another process. Names come
    from ``$LISTEN_FDNAMES`` (``"unknown"`` where missing, as in systemd). With ``unset`` the
    three variables are removed from ``environ`` (even when they were not for us). Every
    returned fd is set close-on-exec. Raises ``ValueError`` when the variables are garbled."""
    pid_text = environ.get("LISTEN_PID")
    count_text = environ.get("LISTEN_FDS")
    names_text = environ.get("LISTEN_FDNAMES")
    if unset:
        for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            environ.pop(var, None)
    if not count_text or not pid_text:
        return []
    try:
        pid = int(pid_text)
        count = int(count_text)
    except ValueError as err:
        raise ValueError(f"LISTEN_PID={pid_text!r} / LISTEN_FDS={count_text!r}: not "
                         "integers") from err
    if pid != os.getpid():
        return []
    if count < 0:
        raise ValueError(f"LISTEN_FDS={count_text!r} is negative")
    names = names_text.split(":") if names_text else []
    fds = [(LISTEN_FDS_START + i, names[i] if i < len(names) and names[i] else "unknown")
           for i in range(count)]
    for fd, _ in fds:                   # all checked before any is changed
        try:
            os.fstat(fd)
        except OSError as err:
            raise ValueError(f"LISTEN_FDS={count} but fd {fd} is not open: "
                             f"{err.strerror}") from err
    for fd, _ in fds:
        os.set_inheritable(fd, False)
    return fds
