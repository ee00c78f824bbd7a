"""``mq groups describe``'s partition rows (``mq.cli.groups.partition_rows``) from the local
broker's description and from a Kafka cluster's (members with client id and host; each
partition's owner found in the members' assignments)."""

from __future__ import annotations

import pytest

from mq.cli.groups import partition_rows
from mq.errors import GroupIdNotFoundError


def cluster_desc(members=(), offsets=(), state="Stable"):
    return {"group": "g", "state": state, "assignor": "range", "members": list(members),
            "offsets": list(offsets)}


def member(member_id, *assignment):
    return {"member_id": member_id, "instance_id": None, "client_id": f"{member_id}-client",
            "host": "/10.0.0.1", "assignment": [list(tp) for tp in assignment]}


def committed(topic, partition, offset, end):
    return {"topic": topic, "partition": partition, "committed_offset": offset, "metadata": "",
            "end_offset": end, "lag": end - offset}


def test_a_cluster_group_names_each_partitions_owner():
    desc = cluster_desc([member("m1", ("t", 0)), member("m2", ("t", 1))],
                        [committed("t", 0, 5, 9), committed("t", 2, 1, 1)])
    assert partition_rows(desc) == [
        {"group": "g", "topic": "t", "partition": 0, "committedOffset": 5, "endOffset": 9,
         "lag": 4, "memberId": "m1", "host": "/10.0.0.1", "clientId": "m1-client"},
        # assigned, nothing committed yet
        {"group": "g", "topic": "t", "partition": 1, "committedOffset": None,
         "endOffset": None, "lag": None, "memberId": "m2", "host": "/10.0.0.1",
         "clientId": "m2-client"},
        # committed, owned by nobody
        {"group": "g", "topic": "t", "partition": 2, "committedOffset": 1, "endOffset": 1,
         "lag": 0, "memberId": None, "host": None, "clientId": None},
    ]


def test_a_dead_empty_cluster_group_does_not_exist():
    with pytest.raises(GroupIdNotFoundError, match="group 'g' does not exist"):
        partition_rows(cluster_desc(state="Dead"))
    assert partition_rows(cluster_desc(state="Empty")) == []


def test_the_local_brokers_rows_keep_pid_and_lag_seconds():
    desc = {"group": "g", "state": "Stable", "group_epoch": 3, "assignor": "uniform",
            "members": [], "offsets": [{**committed("t", 0, 5, 9), "lag_ms": 1500,
                                        "member_id": "m1", "pid": 42}]}
    assert partition_rows(desc) == [
        {"group": "g", "topic": "t", "partition": 0, "committedOffset": 5, "endOffset": 9,
         "lag": 4, "lagSeconds": 1.5, "memberId": "m1", "pid": 42}]
