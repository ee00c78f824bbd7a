"""``TopicPartition``: the one type for "partition P of topic T", on both sides of the socket.

Clients hand it to users (``mq.TopicPartition``); the broker's group coordinator and assignors
key their assignments by it. A ``NamedTuple``: immutable, hashable, ordered (topic, then
partition) and equal to the plain ``(topic, partition)`` tuple, so values decoded from msgpack
lists compare and hash alike.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TopicPartition"]


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int
