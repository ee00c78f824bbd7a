"""Small value types of the clients: ``RecordMetadata``, and ``TopicPartition`` (defined in
``mq.protocol.types``, which the broker shares).

Both are ``NamedTuple``s, so they are immutable, hashable, ordered (topic, then partition, ...)
and cheap to create, as in kafka-python.
"""

from __future__ import annotations

from typing import NamedTuple

from mq.protocol.types import TopicPartition

__all__ = ["TopicPartition", "RecordMetadata"]


class RecordMetadata(NamedTuple):
    """Where the broker put a produced record.

    ``offset`` is -1 when the producer used ``acks=0`` (no reply, so no offset is known).
    ``timestamp_ms`` is the record's CreateTime, or the broker's append time when the topic
    uses ``message.timestamp.type=LogAppendTime``.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)
