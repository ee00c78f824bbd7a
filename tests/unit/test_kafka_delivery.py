"""The Kafka backend's delivery reports: a success whose offset librdkafka does not know.

An idempotent producer's retry of a batch the leader had already written is answered
DUPLICATE_SEQUENCE_NUMBER, which librdkafka reports as a success with no offset
(``Message.offset()`` is ``None``). CI saw one when a Kafka node was killed under load: the
report raised on the producer's poll thread, which died, and no later send was settled."""

from __future__ import annotations

import threading

from confluent_kafka import Message

from mq.client.kafka.producer import KafkaFuture, delivered


def report(offset: int) -> Message:
    return Message(topic="t", partition=1, offset=offset, value=b"v", timestamp=(1, 1234))


def test_a_success_without_an_offset_is_settled_with_offset_minus_one():
    assert report(-1).offset() is None                  # what confluent-kafka hands over
    fut = KafkaFuture(threading.Lock())
    called = []
    fut.add_callback(called.append)
    fut._deliver(None, report(-1))
    meta = fut.get(timeout=0)
    assert meta == ("t", 1, -1, 1234)
    assert called == [meta]


def test_a_success_with_an_offset_keeps_it():
    """``delivered`` is what both producers settle a success with (mq.aio's too)."""
    meta = delivered(report(41))
    assert meta == ("t", 1, 41, 1234)

