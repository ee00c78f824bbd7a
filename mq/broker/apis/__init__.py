"""The broker's api components, one per api family: ``produce.py`` (the data path: Produce,
ListOffsets, Wait), ``topics.py`` (topic administration and the partitions' lifecycle) and
``groups.py`` (consumer groups and committed offsets); a transactions component joins them the
same way.

A component is built with the collaborators it uses — the partition table, the state
publisher, group commit, connections, and another family's component where it needs one (the
groups component opens ``__consumer_offsets`` through the topics component, which tells the
groups component of partition changes) — and exposes its requests as an explicit
``handlers()`` table. The loop (``server.py``) merges those tables into one
``{Api: handler}`` dict and dispatches each request with one lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from mq.broker.conns import Conn
from mq.protocol.messages import Api, Request

__all__ = ["ApiComponent", "Handler"]

# A request handler: the response to send now, or None (sent later, or a one-way request).
Handler = Callable[[Conn, Request], "list | None"]


class ApiComponent(Protocol):
    def handlers(self) -> Mapping[Api, Handler]:
        """The requests this component answers."""
        ...
