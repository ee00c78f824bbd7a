"""Small value types of the clients: ``RecordMetadata``, ``ConsumerGroupMetadata``, and
``TopicPartition`` (defined in ``mq.protocol.types``, which the broker shares).

All are ``NamedTuple``s, so they are immutable, hashable, ordered (topic, then partition, ...)
and cheap to create, as in kafka-python.
"""

from __future__ import annotations

from typing import NamedTuple

from mq.protocol.types import TopicPartition

__all__ = ["ConsumerGroupMetadata", "RecordMetadata", "TopicPartition"]


class RecordMetadata(NamedTuple):
    """Where the broker put a produced record.

    ``offset`` is -1 when the producer used ``acks=0`` (no reply, so no offset is known), and
    on a Kafka cluster for a record whose retry the leader answered as a duplicate (it had
    the record already; librdkafka is not told where).
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


class ConsumerGroupMetadata(NamedTuple):
    """Who a consumer is in its group, as ``Consumer.group_metadata()`` reports it (Kafka's
    ``ConsumerGroupMetadata``): what ``Producer.send_offsets_to_transaction`` hands the broker
    so that a consumer that lost its partitions cannot commit offsets for them.

    ``member_id`` is ``""`` and ``member_epoch`` -1 for a consumer that is not (yet) a member.
    """

    group_id: str
    member_id: str = ""
    member_epoch: int = -1
    group_instance_id: str | None = None
