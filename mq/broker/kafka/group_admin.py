"""Committed offsets and group administration for Kafka clients: OffsetCommit, OffsetFetch,
OffsetDelete, ListGroups, DescribeGroups, DeleteGroups and ConsumerGroupDescribe.

Each goes through the native request of the same name (``apis/groups.py``): the same
``__consumer_offsets`` log, with a commit or deletion acknowledged after its fsync, and the same
coordinator state as mq's own clients see.

A commit is validated as a whole (one record batch, one fsync), so its error, if any, is every
partition's. A classic member's stale generation is Kafka's ILLEGAL_GENERATION (the member
rejoins); the native STALE_MEMBER_EPOCH is what KIP-848 members understand.

DescribeGroups answers in the classic format for every group, as Kafka 4 does for a consumer
group: each member's subscription and assignment encoded as the consumer protocol's
``ConsumerProtocolSubscription`` and ``ConsumerProtocolAssignment``; a group nobody knows is
``Dead`` with no error (versions 0-5).
"""

from __future__ import annotations

from collections.abc import Mapping

from mq.broker.apis.groups import GroupApis
from mq.broker.kafka.admin import topic_id_bytes
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls
from mq.broker.kafka.groups import PROTOCOL_TYPE, GroupWireApis, assignment_bytes, by_topic
from mq.broker.metadata import MetadataStore
from mq.protocol.kafka.codec import encode_data
from mq.protocol.messages import Api

__all__ = ["GroupAdminApis", "commit_offsets", "fetch_rows"]

NONE = 0
ILLEGAL_GENERATION = 22
GROUP_ID_NOT_FOUND = 69
STALE_MEMBER_EPOCH = 113
_AUTHORIZED_OPERATIONS_UNKNOWN = -(1 << 31)


def commit_offsets(topics: list[dict]) -> list[list]:
    """OffsetCommit's topics as the native request's ``[topic, partition, offset,
    leader_epoch, metadata]`` (a null metadata is Kafka's empty one)."""
    return [[t["name"], p["partition_index"], p["committed_offset"],
             p["committed_leader_epoch"], p["committed_metadata"] or ""]
            for t in topics for p in t["partitions"]]


def fetch_rows(rows: list[list], version: int) -> list[dict]:
    """The native OffsetFetch rows as Kafka's topics (``committed_leader_epoch`` from v5)."""
    out: dict[str, list[dict]] = {}
    for topic, partition, offset, leader_epoch, metadata, _, code in rows:
        out.setdefault(topic, []).append({
            "partition_index": partition, "committed_offset": offset,
            "committed_leader_epoch": leader_epoch, "metadata": metadata,
            "error_code": code})
    return [{"name": t, "partitions": ps} for t, ps in out.items()]


class GroupAdminApis:
    def __init__(self, groups: GroupApis, members: GroupWireApis,
                 metadata: MetadataStore) -> None:
        self._groups = groups
        self._members = members
        self._metadata = metadata

    def handlers(self) -> Mapping[int, object]:
        return {8: self.offset_commit, 9: self.offset_fetch, 47: self.offset_delete,
                16: self.list_groups, 15: self.describe_groups, 42: self.delete_groups,
                69: self.consumer_group_describe}

    # --- offsets ------------------------------------------------------------------------------
    def offset_commit(self, conn: KafkaConn, version: int, body: dict):
        group, member_id = body["group_id"], body["member_id"]
        (reply,) = yield Calls([Call(Api.OFFSET_COMMIT, {
            "group": group, "member_id": member_id,
            "member_epoch": body["generation_id_or_member_epoch"],
            "offsets": commit_offsets(body["topics"])})])
        code = reply[2]
        if code == STALE_MEMBER_EPOCH and (group, member_id) in self._members.classic:
            code = ILLEGAL_GENERATION
        return {"throttle_time_ms": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": code}
                for p in t["partitions"]]} for t in body["topics"]]}

    def offset_fetch(self, conn: KafkaConn, version: int, body: dict):
        if version >= 8:
            wanted = [(g["group_id"], g["topics"]) for g in body["groups"]]
        else:
            wanted = [(body["group_id"], body["topics"])]
        stable = int(version >= 7 and body["require_stable"])
        replies = yield Calls([Call(Api.OFFSET_FETCH, {
            "group": group,
            "partitions": None if topics is None else
            [[t["name"], p] for t in topics for p in t["partition_indexes"]],
            "require_stable": stable}) for group, topics in wanted])
        results = [(reply[2], fetch_rows(reply[4] if reply[2] == NONE else [], version))
                   for reply in replies]
        if version >= 8:
            return {"throttle_time_ms": 0, "groups": [
                {"group_id": group, "topics": topics, "error_code": code}
                for (group, _), (code, topics) in zip(wanted, results, strict=True)]}
        code, topics = results[0]
        return {"throttle_time_ms": 0, "topics": topics, "error_code": code}

    def offset_delete(self, conn: KafkaConn, version: int, body: dict):
        (reply,) = yield Calls([Call(Api.OFFSET_DELETE, {
            "group": body["group_id"],
            "partitions": [[t["name"], p["partition_index"]] for t in body["topics"]
                           for p in t["partitions"]]})])
        if reply[2] != NONE:
            return {"error_code": reply[2], "throttle_time_ms": 0, "topics": []}
        codes = {(topic, partition): code for topic, partition, code in reply[4]}
        return {"error_code": NONE, "throttle_time_ms": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"],
                 "error_code": codes[(t["name"], p["partition_index"])]}
                for p in t["partitions"]]} for t in body["topics"]]}

    # --- groups -------------------------------------------------------------------------------
    def list_groups(self, conn: KafkaConn, version: int, body: dict):
        (reply,) = yield Calls([Call(Api.LIST_GROUPS, {})])
        states = {s.lower() for s in body["states_filter"]} if version >= 4 else set()
        return {"throttle_time_ms": 0, "error_code": reply[2], "groups": [
            {"group_id": name, "protocol_type": PROTOCOL_TYPE, "group_state": state}
            for name, state, _ in (reply[4] if reply[2] == NONE else [])
            if not states or state.lower() in states]}

    def describe_groups(self, conn: KafkaConn, version: int, body: dict):
        names = body["groups"]
        replies = yield Calls([Call(Api.CONSUMER_GROUP_DESCRIBE, {"group": g}) for g in names])
        return {"throttle_time_ms": 0, "groups": [
            self._described(name, reply) for name, reply in zip(names, replies, strict=True)]}

    def _described(self, name: str, reply: list) -> dict:
        row = {"error_code": NONE, "error_message": None, "group_id": name,
               "group_state": "Dead", "protocol_type": "", "protocol_data": "",
               "members": [], "authorized_operations": _AUTHORIZED_OPERATIONS_UNKNOWN}
        if reply[2] == GROUP_ID_NOT_FOUND:
            return row
        if reply[2] != NONE:
            return {**row, "error_code": reply[2], "error_message": reply[3]}
        desc = reply[4]
        members = []
        protocol = desc["assignor"]
        for m in desc["members"]:
            if m["away"]:
                continue
            classic = self._members.classic.get((name, m["member_id"]))
            if classic is not None:
                protocol, metadata = classic.protocol_name, classic.metadata
            else:
                metadata = encode_data("ConsumerProtocolSubscription", 0,
                                       {"topics": m["topics"], "user_data": None})
            client_id, host = self._client(name, m)
            members.append({"member_id": m["member_id"], "group_instance_id": m["instance_id"],
                            "client_id": client_id, "client_host": host,
                            "member_metadata": metadata,
                            "member_assignment": assignment_bytes(map(tuple, m["assignment"]))})
        return {**row, "group_state": desc["state"],
                "protocol_type": PROTOCOL_TYPE if members or desc["state"] != "Empty" else "",
                "protocol_data": protocol if members else "", "members": members}

    def _client(self, group: str, member: dict) -> tuple[str, str]:
        """(client id, client host) of a described member: a Kafka client's own, or
        ``mq-<pid>`` for mq's native consumers (local by construction)."""
        classic = self._members.classic.get((group, member["member_id"]))
        if classic is not None:
            return classic.client_id, classic.client_host
        if member["pid"] is not None:
            return f"mq-{member['pid']}", "/127.0.0.1"
        return "", ""

    def delete_groups(self, conn: KafkaConn, version: int, body: dict):
        names = body["groups_names"]
        replies = yield Calls([Call(Api.DELETE_GROUPS, {"group": g}) for g in names])
        return {"throttle_time_ms": 0, "results": [
            {"group_id": g, "error_code": r[2]} for g, r in zip(names, replies, strict=True)]}

    def consumer_group_describe(self, conn: KafkaConn, version: int, body: dict):
        names = body["group_ids"]
        replies = yield Calls([Call(Api.CONSUMER_GROUP_DESCRIBE, {"group": g}) for g in names])
        ids = {name: topic_id_bytes(info.topic_id)
               for name, info in self._metadata.topics.items()}

        def assignment(partitions: list[list]) -> dict:
            return {"topic_partitions": [
                {"topic_id": ids.get(t, bytes(16)), "topic_name": t, "partitions": ps}
                for t, ps in by_topic(map(tuple, partitions)).items()]}
        groups = []
        for name, reply in zip(names, replies, strict=True):
            if reply[2] != NONE:
                groups.append({"error_code": reply[2], "error_message": reply[3],
                               "group_id": name, "group_state": "", "group_epoch": -1,
                               "assignment_epoch": -1, "assignor_name": "", "members": [],
                               "authorized_operations": _AUTHORIZED_OPERATIONS_UNKNOWN})
                continue
            desc = reply[4]
            groups.append({
                "error_code": NONE, "error_message": None, "group_id": name,
                "group_state": desc["state"], "group_epoch": desc["group_epoch"],
                "assignment_epoch": desc["assignment_epoch"], "assignor_name": desc["assignor"],
                "authorized_operations": _AUTHORIZED_OPERATIONS_UNKNOWN,
                "members": [{
                    "member_id": m["member_id"], "instance_id": m["instance_id"],
                    "rack_id": None, "member_epoch": m["member_epoch"],
                    "client_id": self._client(name, m)[0],
                    "client_host": self._client(name, m)[1],
                    "subscribed_topic_names": m["topics"],
                    "subscribed_topic_regex": m["pattern"],
                    "assignment": assignment(m["assignment"]),
                    "target_assignment": assignment(m["target"])}
                    for m in desc["members"] if not m["away"]]})
        return {"throttle_time_ms": 0, "groups": groups}
