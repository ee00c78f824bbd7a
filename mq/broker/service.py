"""The broker as a systemd service: what it tells the service manager and when, and the
listening socket systemd may hand it (``mq.systemd`` speaks the protocols).

``ServiceNotifier`` decides the messages; the loop (``server.py``) calls it at the points of
its lifecycle and once per round::

    LogManager.open  -> recovery_progress(k, n): EXTEND_TIMEOUT_USEC=30 s + STATUS=recovering
                        k/n partitions, at most once a second and only when recovery moved
    loop starts      -> ready(): READY=1 + STATUS=<topics, partitions, connections>
    every round      -> tick(): WATCHDOG=1 every half WATCHDOG_USEC; STATUS= every 5 s when
                        the summary changed. deadline_s() bounds the loop's select timeout,
                        so the pings come from the loop itself: a wedged loop stops them and
                        systemd restarts the broker (no pinger thread that would outlive it)
    SIGHUP           -> reloading() before the reload, ready() after it (also when it failed)
    SIGTERM/SIGINT   -> stopping(), once, first thing when the loop wakes (the signal pipe)

Without ``NOTIFY_SOCKET`` every method is a cheap no-op. Time comes from ``clock`` (monotonic
seconds) so the rules are tested without waiting.

``inherited_listener`` picks the socket of socket activation: the first of the passed fds that
is a listening ``AF_UNIX`` ``SOCK_STREAM`` socket; systemd owns its path (the broker never
unlinks it), and connections that arrive while no broker runs wait in its backlog.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping

from mq import systemd
from mq.errors import ConfigError

__all__ = ["EXTEND_TIMEOUT_USEC", "ServiceNotifier", "inherited_listener", "status_line"]

log = logging.getLogger("mq.broker")

EXTEND_TIMEOUT_USEC = 30_000_000   # each extension: 30 s more to show progress again
EXTEND_EVERY_S = 1.0               # at most one extension (and recovery status) a second
STATUS_EVERY_S = 5.0               # the summary is looked at this often, sent if it changed


class ServiceNotifier:
    """The broker's notifications to systemd (module docstring for the sequence)."""

    def __init__(self, environ: Mapping[str, str] = os.environ,
                 clock: Callable[[], float] = time.monotonic,
                 send: Callable[[str, Mapping[str, str]], bool] = systemd.notify) -> None:
        self._environ = dict(environ)
        self.enabled = systemd.notify_address(self._environ) is not None
        usec = systemd.watchdog_usec(self._environ) if self.enabled else 0
        self.ping_every_s = usec / 2e6                 # 0: no watchdog
        self._clock = clock
        self._send = send
        self._ready = False
        self._stopping = False
        self._status: str | None = None
        self._next_ping = math.inf
        self._next_status = math.inf
        self._next_extend = 0.0

    def send(self, message: str) -> None:
        if self.enabled:
            self._send(message, self._environ)

    def recovery_progress(self, done: int, total: int) -> None:
        """``LogManager.open``'s progress: extend the start timeout, rate-limited."""
        if not self.enabled or not total:
            return
        now = self._clock()
        if now < self._next_extend:
            return
        self._next_extend = now + EXTEND_EVERY_S
        self.send(f"EXTEND_TIMEOUT_USEC={EXTEND_TIMEOUT_USEC}\n"
                  f"STATUS=recovering {done}/{total} partitions")

    def ready(self, status: str) -> None:
        """Serving (at start, and after a reload): ``READY=1`` with the summary; the watchdog
        and status clocks start now."""
        if not self.enabled:
            return
        now = self._clock()
        self._ready = True
        self._status = status
        self.send(f"READY=1\nSTATUS={status}")
        self._next_status = now + STATUS_EVERY_S
        if self.ping_every_s:
            self.send("WATCHDOG=1")
            self._next_ping = now + self.ping_every_s

    def deadline_s(self) -> float:
        """Seconds until ``tick`` has something to do (the loop's select timeout is at most
        this); infinity when nothing is due, ever."""
        if not self._ready or self._stopping:
            return math.inf
        return max(0.0, min(self._next_ping, self._next_status) - self._clock())

    def tick(self, status: Callable[[], str]) -> None:
        """Once per loop round: ping the watchdog when due; every ``STATUS_EVERY_S`` send the
        summary ``status()`` if it changed."""
        if not self._ready or self._stopping:
            return
        now = self._clock()
        if now >= self._next_ping:
            self._next_ping = now + self.ping_every_s
            self.send("WATCHDOG=1")
        if now >= self._next_status:
            self._next_status = now + STATUS_EVERY_S
            text = status()
            if text != self._status:
                self._status = text
                self.send(f"STATUS={text}")

    def reloading(self) -> None:
        """Before a SIGHUP reload: ``RELOADING=1`` with ``MONOTONIC_USEC`` (systemd 253+'s
        ``Type=notify-reload`` requires it to match the reload to this message)."""
        self.send(f"RELOADING=1\nMONOTONIC_USEC={systemd.monotonic_usec()}")

    def stopping(self) -> None:
        """SIGTERM/SIGINT: ``STOPPING=1`` once; no more pings or status after it."""
        if self._stopping:
            return
        self._stopping = True
        self.send("STOPPING=1\nSTATUS=stopping: answering requests in flight, flushing")


def status_line(topics: int, partitions: int, connections: int) -> str:
    """The one-line summary systemd shows (``systemctl status``)."""
    def n(count: int, what: str) -> str:
        return f"{count} {what}" + ("" if count == 1 else "s")
    return f"serving {n(topics, 'topic')}, {n(partitions, 'partition')}, " \
           f"{n(connections, 'connection')}"


def inherited_listener(environ=os.environ) -> socket.socket | None:
    """The listening Unix stream socket systemd passed (``LISTEN_FDS``), or None when none was
    passed. The other passed fds stay open and unused (a warning names them). Raises
    ``ConfigError`` when fds were passed but none is a listening ``AF_UNIX`` stream socket."""
    try:
        fds = systemd.listen_fds(environ)
    except ValueError as err:
        raise ConfigError(f"socket activation: {err}") from err
    if not fds:
        return None
    found: socket.socket | None = None
    wrong = []
    for fd, name in fds:
        what = _describe(fd)
        if found is None and what == "ok":
            found = socket.socket(fileno=fd)
        else:
            wrong.append(f"fd {fd} ({name}): {'not used' if what == 'ok' else what}")
    if found is None:
        raise ConfigError("socket activation: none of the passed sockets is a listening Unix "
                          "stream socket (ListenStream=/path in the .socket unit): "
                          + "; ".join(wrong))
    if wrong:
        log.warning("socket activation: serving fd %d; ignoring %s", found.fileno(),
                    "; ".join(wrong))
    return found


def _describe(fd: int) -> str:
    """"ok" for a listening AF_UNIX SOCK_STREAM socket, else what ``fd`` is instead."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as err:
        return f"not a socket ({err.strerror})"
    try:
        if sock.family != socket.AF_UNIX:
            return f"a {sock.family.name} socket, not AF_UNIX"
        if sock.type != socket.SOCK_STREAM:
            return f"a {sock.type.name} socket, not SOCK_STREAM"
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return "a Unix stream socket that is not listening"
        return "ok"
    finally:
        sock.detach()                       # the fd stays open: not ours to close
