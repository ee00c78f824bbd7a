"""The admin operations without a socket: what each asks the broker, and what it makes of the
replies (``mq/client/admin_ops.py``)."""

from __future__ import annotations

import pytest

from mq.client import admin_ops as ops
from mq.client.types import TopicPartition
from mq.errors import InvalidPartitionsError, UnknownTopicOrPartitionError
from mq.protocol.messages import Api, Response, response


def reply(api: Api, *fields) -> Response:
    return Response.from_message(response(api, 1, 0, None, *fields))


def drive(op, *answers):
    """Run ``op``, answering its n-th list of requests with ``answers[n](requests)``; (the
    result, every list of requests it made)."""
    asked = []
    try:
        requests = next(op)
        for answer in answers:
            asked.append(requests)
            requests = op.send(answer(requests))
    except StopIteration as stop:
        return stop.value, asked
    raise AssertionError(f"the operation wants more: {requests}")


def test_describe_topic_asks_for_metadata_then_everything_else_in_one_round_trip():
    meta = {"orders": {"id": "x", "partitions": 2}}
    ends = {(0, -2): 0, (0, -1): 5, (1, -2): 3, (1, -1): 9}

    def rest(requests):
        return [reply(Api.DESCRIBE_CONFIGS, {"retention.ms": "1"}, {})] + [
            reply(Api.LIST_OFFSETS, ends[(p, which)], -1) for _, _, p, which in requests[1:]]
    result, asked = drive(ops.describe_topic("orders"),
                          lambda _: [reply(Api.METADATA, meta)], rest)
    assert asked[0] == [(Api.METADATA, ["orders"])]
    assert len(asked[1]) == 5                 # the configs and 2 bounds of each partition
    assert result["offsets"] == [(0, 5), (3, 9)]
    assert result["config"] == {"retention.ms": "1"} and result["overrides"] == {}
    assert result["offline"] == [None, None]


def test_a_check_fails_before_anything_is_sent():
    with pytest.raises(InvalidPartitionsError):
        next(ops.create_topic("orders", partitions=0))
    with pytest.raises(ValueError):
        next(ops.delete_records("orders", 0, -1))
    assert drive(ops.alter_group_offsets("g", {})) == (None, [])   # nothing to send


def test_committed_offsets_leave_out_partitions_without_one_and_name_unstable_ones():
    rows = [["t", 0, 7, -1, "", 1, 0], ["t", 1, -1, -1, "", -1, 0],
            ["t", 2, -1, -1, "", -1, 88]]                           # 88: UNSTABLE_OFFSET_COMMIT
    (offsets, unstable), asked = drive(
        ops.committed_offsets("g", [TopicPartition("t", p) for p in range(3)], True),
        lambda _: [reply(Api.OFFSET_FETCH, rows)])
    assert asked == [[(Api.OFFSET_FETCH, "g", [["t", 0], ["t", 1], ["t", 2]], 1)]]
    assert offsets == {TopicPartition("t", 0): 7}
    assert unstable == {TopicPartition("t", 2)}


def test_a_row_error_is_raised_naming_the_partition():
    rows = [["t", 0, -1, -1, "", -1, UnknownTopicOrPartitionError.code]]
    with pytest.raises(UnknownTopicOrPartitionError, match="t-0"):
        drive(ops.list_group_offsets("g"), lambda _: [reply(Api.OFFSET_FETCH, rows)])


def test_delete_user_removes_every_mechanism_the_user_has():
    held = [["ann", 0, None, [["SCRAM-SHA-256", 4096], ["SCRAM-SHA-512", 4096]]]]
    _, asked = drive(ops.delete_user("ann"),
                     lambda _: [reply(Api.DESCRIBE_USER_SCRAM_CREDENTIALS, held)],
                     lambda _: [reply(Api.ALTER_USER_SCRAM_CREDENTIALS, [])])
    assert asked[1] == [(Api.ALTER_USER_SCRAM_CREDENTIALS,
                         [["ann", "SCRAM-SHA-256"], ["ann", "SCRAM-SHA-512"]], [])]


def test_first_error_is_the_first_error_reply():
    ok = reply(Api.DELETE_TOPICS)
    bad = Response.from_message(response(Api.DELETE_TOPICS, 2, 3, "no such topic"))
    assert ops.first_error([ok, ok]) is None
    err = ops.first_error([ok, bad, bad])
    assert isinstance(err, UnknownTopicOrPartitionError) and "no such topic" in str(err)
