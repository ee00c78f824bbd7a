"""Serving OpenMetrics: the one place the broker and worker pools start their ``/metrics``
endpoint, so both take the same ``HOST:PORT`` and answer the same way.

The exposition itself is ``prometheus_client``'s: it writes the text format Prometheus and
OpenMetrics scrapers expect (escaping, ``# TYPE``/``# UNIT``, the ``_total`` and ``_bucket``
suffixes, content negotiation on ``Accept``), which is fiddly to get right by hand. Each
exporter registers one custom collector on a registry of its own (not the process-global
default, so nothing else in the process leaks into mq's endpoint), and the collector builds
its families at scrape time from a snapshot.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["MetricsServer", "parse_address", "serve"]


def parse_address(text: str, what: str = "metrics address",
                  example: str = "127.0.0.1:9400") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6, ``:9400`` for every interface) -> (host, port).
    Raises ``ValueError`` with one line naming ``what`` is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"{what} must be HOST:PORT, like {example}, got {text!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"{what}: the port must be 0..65535, got {port}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", port


class MetricsServer:
    """A running ``/metrics`` endpoint: ``address`` is where it listens (port 0 picks a free
    one), ``close()`` stops it."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        host, port = server.server_address[:2]
        self.address = (host, port)

    @property
    def url(self) -> str:
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(registry: Any, address: str) -> MetricsServer:
    """Serve ``registry`` at ``http://address/metrics`` from a daemon thread. Raises
    ``ValueError`` for a bad address and ``OSError`` when it cannot listen."""
    from prometheus_client import start_http_server

    host, port = parse_address(address)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread)
