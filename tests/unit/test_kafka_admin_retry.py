"""The Kafka backend's admin retries: an answer that says the client's metadata is stale.

After a Kafka node is killed and comes back, a client's cached metadata may hold a leader
epoch that has since moved on; the leader answers FENCED_LEADER_EPOCH (74). librdkafka keeps
sending the epoch it cached until the cache expires (minutes), so asking again alone fails
until the deadline: CI saw ``mq workers redrive`` exit with "list offsets: Broker: Leader
epoch is older than broker epoch". ``results`` asks for fresh metadata before it asks again.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

import mq.errors
from mq.client.kafka.errors import results


def answers(*codes: int):
    """A call whose futures fail with each of ``codes`` in turn, then succeed."""
    left = list(codes)

    def call() -> dict:
        fut: Future = Future()
        if left:
            fut.set_exception(KafkaException(KafkaError(left.pop(0))))
        else:
            fut.set_result("offsets")
        return {"tp": fut}
    return call


@pytest.mark.parametrize("code", [6, 74, 75, 78])
def test_a_stale_metadata_answer_renews_the_metadata_before_asking_again(code):
    renewed = []
    found = results(answers(code, code), "list offsets", 5.0, lambda: renewed.append(1))
    assert found == {"tp": "offsets"}
    assert len(renewed) == 2


def test_another_retriable_answer_asks_again_without_renewing():
    renewed = []
    assert results(answers(KafkaError.REQUEST_TIMED_OUT), "list offsets", 5.0,
                   lambda: renewed.append(1)) == {"tp": "offsets"}
    assert renewed == []


def test_a_renewal_that_fails_is_asked_again_until_the_deadline():
    def renew():
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))
    with pytest.raises(mq.errors.MQError, match="list offsets: ") as caught:
        results(answers(*[74] * 1000), "list offsets", 0.3, renew)
    assert caught.value.code == 74


def test_a_refusal_is_raised_at_once_as_mq_s_exception():
    with pytest.raises(mq.errors.TopicAuthorizationFailedError):
        results(answers(KafkaError.TOPIC_AUTHORIZATION_FAILED), "list offsets", 60.0)


def test_an_unknown_topic_is_asked_for_again_with_fresh_metadata_within_the_grace():
    """A partition's leader that has not applied its topic's creation yet (a node restarted a
    moment ago) answers UNKNOWN_TOPIC_OR_PART: list offsets asks again for a few seconds."""
    renewed = []
    assert results(answers(3, 3), "list offsets", 30.0, lambda: renewed.append(1),
                   unknown_grace=5.0) == {"tp": "offsets"}
    assert len(renewed) == 2


def test_an_unknown_topic_is_raised_after_the_grace_or_at_once_without_one():
    with pytest.raises(mq.errors.UnknownTopicOrPartitionError):
        results(answers(3), "delete records", 30.0)
    with pytest.raises(mq.errors.UnknownTopicOrPartitionError):
        results(answers(*[3] * 1000), "list offsets", 30.0, unknown_grace=0.3)
