"""The group apis' request schemas: well-formed requests pass, every wrong field is named."""

from __future__ import annotations

import pytest

from mq.errors import RemoteProtocolError
from mq.protocol.messages import Api, check_request, request

HEARTBEAT = ["g", None, 0, None, -1, -1, ["t"], None, None, None]
VALID = {
    Api.CONSUMER_GROUP_HEARTBEAT: HEARTBEAT,
    Api.OFFSET_COMMIT: ["g", "", -1, [["t", 0, 5, -1, "meta"]]],
    Api.OFFSET_FETCH: ["g", None, 0],
    Api.LIST_GROUPS: [],
    Api.DELETE_GROUPS: ["g"],
    Api.CONSUMER_GROUP_DESCRIBE: ["g"],
}


@pytest.mark.parametrize("api", list(VALID))
def test_valid_requests_pass(api):
    req = check_request(request(api, 7, *VALID[api]))
    assert req.api is api and req.request_id == 7


def test_heartbeat_optional_fields_take_values():
    fields = ["g", "m", 3, "instance-1", 1000, 500, None, "t.*", "range", [["t", 1]]]
    req = check_request(request(Api.CONSUMER_GROUP_HEARTBEAT, 1, *fields))
    assert req["pattern"] == "t.*" and req["owned"] == [["t", 1]]


@pytest.mark.parametrize("api,index,bad", [
    (Api.CONSUMER_GROUP_HEARTBEAT, 0, None),            # group must be a string
    (Api.CONSUMER_GROUP_HEARTBEAT, 2, "0"),             # epoch an int
    (Api.CONSUMER_GROUP_HEARTBEAT, 2, True),            # not a bool
    (Api.CONSUMER_GROUP_HEARTBEAT, 6, "t"),             # topics a list
    (Api.CONSUMER_GROUP_HEARTBEAT, 9, [["t"]]),         # owned pairs
    (Api.CONSUMER_GROUP_HEARTBEAT, 9, [["t", "0"]]),
    (Api.OFFSET_COMMIT, 3, [["t", 0, 5, -1]]),          # five fields per offset
    (Api.OFFSET_COMMIT, 3, [["t", 0, 5, -1, None]]),    # metadata a string
    (Api.OFFSET_COMMIT, 3, None),
    (Api.OFFSET_FETCH, 1, [[0, 0]]),
    (Api.OFFSET_FETCH, 2, None),                        # require_stable an int
    (Api.DELETE_GROUPS, 0, 1),
])
def test_wrong_field_types_are_named(api, index, bad):
    fields = list(VALID[api])
    fields[index] = bad
    with pytest.raises(RemoteProtocolError, match=api.name):
        check_request(request(api, 1, *fields))


def test_wrong_field_count():
    with pytest.raises(RemoteProtocolError, match="takes 10 fields"):
        check_request(request(Api.CONSUMER_GROUP_HEARTBEAT, 1, *HEARTBEAT[:-1]))
