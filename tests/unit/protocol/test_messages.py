"""The native protocol's schema table: requests checked against it, replies read by name."""

from __future__ import annotations

import pytest

from mq.errors import RemoteProtocolError
from mq.protocol.messages import (SCHEMAS, Api, Response, check_request, request,
                                  response)


def test_every_api_has_a_schema_with_distinct_names():
    assert set(SCHEMAS) == set(Api)
    for api, schema in SCHEMAS.items():
        names = [name for name, _ in schema.request]
        assert len(set(names)) == len(names), api
        assert len(set(schema.reply)) == len(schema.reply), api


def test_a_reply_is_read_by_the_names_of_its_schema():
    reply = Response.from_message(response(Api.PRODUCE, 7, 0, None, 42, -1, 3))
    assert (reply["first_offset"], reply["log_append_time"], reply["log_start_offset"]) == \
        (42, -1, 3)
    with pytest.raises(KeyError):
        reply["offset"]                     # ListOffsets' name, not Produce's


def test_an_error_reply_has_no_fields():
    reply = Response.from_message(response(Api.LIST_OFFSETS, 7, 3, "unknown topic"))
    assert (reply.error_code, reply.error_message) == (3, "unknown topic")
    with pytest.raises(IndexError):
        reply["offset"]


def test_a_reply_with_the_wrong_field_count_is_refused_where_asserts_run():
    with pytest.raises(AssertionError):
        response(Api.INIT_PRODUCER_ID, 1, 0, None, 1000)       # the epoch is missing


def test_a_refused_reply_carries_its_error_only():
    reply = Response.refused(29, "not authorized for topic 't'")
    assert (reply.error_code, reply.error_message, reply.fields) == \
        (29, "not authorized for topic 't'", [])


def test_a_request_is_checked_against_its_schema():
    req = check_request(request(Api.LIST_OFFSETS, 5, "t", 0, -1))
    assert (req["topic"], req["partition"], req["timestamp"]) == ("t", 0, -1)
    with pytest.raises(RemoteProtocolError, match="field 'partition' has the wrong type"):
        check_request(request(Api.LIST_OFFSETS, 5, "t", "0", -1))
    with pytest.raises(RemoteProtocolError, match="takes 3 fields, got 2"):
        check_request(request(Api.LIST_OFFSETS, 5, "t", 0))
