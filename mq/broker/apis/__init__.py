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

A handler refuses a request by raising: a ``BrokerError`` (the client's mistake, or the
broker's state: a full disk, a coordinator moving) is answered with its Kafka code, as are
the few other errors mq raises on purpose (``answer_for``). Anything else it raises is a bug
in mq: the loop answers ``UNKNOWN_SERVER_ERROR`` and logs the traceback. So validation of
what a client sent raises the ``BrokerError`` that names the mistake (``InvalidRequestError``
and the like), never a bare ``ValueError``.

Invariants: a component never imports another's private names, and only the loop thread
calls a handler; a handler returns its reply, or None when the reply comes later (held for an
fsync) or never (a one-way request).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from mq import errors
from mq.broker.conns import Conn
from mq.protocol.messages import Api, Request

__all__ = ["ApiComponent", "Handler", "answer_for"]

# A request handler: the response to send now, or None (sent later, or a one-way request).
Handler = Callable[[Conn, Request], "list | None"]


class ApiComponent(Protocol):
    def handlers(self) -> Mapping[Api, Handler]:
        """The requests this component answers."""
        ...


def answer_for(err: Exception) -> tuple[int, str] | None:
    """The Kafka error code and message that answer ``err``, raised by a handler; None when
    ``err`` is not an error mq raises on purpose (a bug: the caller logs it)."""
    if isinstance(err, errors.BrokerError):
        return err.code, err.message
    if isinstance(err, errors.ConfigError):                 # a topic config's key or value
        return errors.InvalidConfigurationError.code, str(err)
    if isinstance(err, errors.LogWriteError):
        return errors.KafkaStorageError.code, str(err)
    if isinstance(err, errors.CorruptRecordError):
        return errors.CorruptMessageError.code, err.reason
    if isinstance(err, errors.OffsetOutOfRangeError):
        return errors.BrokerOffsetOutOfRangeError.code, str(err)
    return None
