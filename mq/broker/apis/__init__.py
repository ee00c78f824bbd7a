"""The broker's api components, one per api family: ``produce.py`` (the data path: Produce,
ProduceShared, ShareMemory, ListOffsets, Wait), ``topics.py`` (topic administration and the
partitions' lifecycle), ``groups.py`` (consumer groups and committed offsets),
``transactions.py`` (producer ids, transactions, markers), ``acls.py`` and ``users.py`` (ACLs
and SCRAM users in the metadata log).

A component is built with the collaborators it uses — the partition table, the state
publisher, group commit, connections, and another family's component where it needs one (the
groups component opens ``__consumer_offsets`` through the topics component, which tells the
groups component of partition changes) — and exposes its requests as an explicit
``handlers()`` table. The loop (``server.py``) merges those tables into one
``{Api: handler}`` dict and dispatches each request with one lookup; the Kafka listener's
handlers (``mq/broker/kafka/``) use the same components, mostly through native requests.

Invariants: a component never imports another's private names, and only the loop thread
calls a handler; a handler returns its reply, or None when the reply comes later (held for an
fsync) or never (a one-way request).
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
