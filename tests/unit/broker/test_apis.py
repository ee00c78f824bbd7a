"""What a handler's exception is answered with (``mq.broker.apis.answer_for``): mq's own errors
by their Kafka code, anything else (a bug in mq) not at all, so the loop answers
UNKNOWN_SERVER_ERROR and logs the traceback."""

from __future__ import annotations

import pytest

from mq import errors
from mq.broker.apis import answer_for


@pytest.mark.parametrize("err, answer", [
    (errors.InvalidRequestError("acks must be 0, 1 or -1"), (42, "acks must be 0, 1 or -1")),
    (errors.UnknownTopicOrPartitionError("unknown topic 't'"), (3, "unknown topic 't'")),
    (errors.UnknownServerError(), (-1, "UnknownServerError")),
    (errors.ConfigError("retention.ms must be an integer"),
     (40, "retention.ms must be an integer")),
    (errors.LogWriteError("t-0: no space left", offline=False), (56, "t-0: no space left")),
    (errors.CorruptRecordError(None, 0, "bad CRC"), (2, "bad CRC")),
    (errors.OffsetOutOfRangeError(9, 0, 5, "t-0"), (1, "t-0: offset 9 is out of range [0, 5]")),
])
def test_mqs_own_errors_are_answered_with_their_kafka_code(err, answer):
    assert answer_for(err) == answer


@pytest.mark.parametrize("err", [ValueError("not enough values to unpack"), KeyError("slot"),
                                 TypeError("'NoneType' object is not subscriptable"),
                                 errors.ClosedError("closed"), OSError(5, "I/O error")])
def test_anything_else_is_a_bug_not_the_clients_error(err):
    assert answer_for(err) is None
