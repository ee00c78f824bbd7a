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

ConsumerGroupDescribe answers GROUP_ID_NOT_FOUND ("not a consumer group") for a group whose
live members all use the classic protocol, as Kafka does for a classic group, so that clients
describe it with DescribeGroups and report its type as classic. An empty group is described
(mq does not remember which protocol its past members spoke).

**ACLs** (``acls.py``), as Kafka's: OffsetCommit needs Read on the group and on each topic,
OffsetFetch and DescribeGroups Describe on the group (and OffsetFetch on each topic it
returns), OffsetDelete and DeleteGroups Delete on the group; ListGroups lists every group to
a principal that may Describe the Cluster, else the groups it may Describe. Denials answer
GROUP_AUTHORIZATION_FAILED and, per partition, TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from collections.abc import Mapping

from mq import errors
from mq.broker.acls import OPEN, AclOperation, Authorizer, ResourceType
from mq.broker.apis.groups import GroupApis
from mq.broker.kafka.admin import topic_id_bytes
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls, call_each
from mq.broker.kafka.groups import PROTOCOL_TYPE, GroupWireApis, assignment_bytes, by_topic
from mq.broker.metadata import MetadataStore
from mq.protocol.kafka.codec import encode_data
from mq.protocol.messages import Api, Response

__all__ = ["GroupAdminApis", "commit_offsets", "fetch_rows"]

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
                 metadata: MetadataStore, authz: Authorizer = OPEN) -> None:
        self._authz = authz
        self._groups = groups
        self._members = members
        self._metadata = metadata

    def handlers(self) -> Mapping[int, object]:
        return {8: self.offset_commit, 9: self.offset_fetch, 47: self.offset_delete,
                16: self.list_groups, 15: self.describe_groups, 42: self.delete_groups,
                69: self.consumer_group_describe}

    def _may(self, conn: KafkaConn, op: AclOperation, group: str) -> bool:
        return self._authz.allows(conn, op, ResourceType.GROUP, group)

    def _topic(self, conn: KafkaConn, op: AclOperation, topic: str) -> bool:
        return self._authz.allows(conn, op, ResourceType.TOPIC, topic)

    def _denied_reply(self, name: str) -> Response:
        return Response.refused(errors.GroupAuthorizationFailedError.code,
                                f"not authorized for group {name!r}")

    # --- offsets ------------------------------------------------------------------------------
    def offset_commit(self, conn: KafkaConn, version: int, body: dict):
        group, member_id = body["group_id"], body["member_id"]
        denied = {t["name"] for t in body["topics"]
                  if not self._topic(conn, AclOperation.READ, t["name"])}
        if not self._may(conn, AclOperation.READ, group):
            code = errors.GroupAuthorizationFailedError.code
        else:
            (reply,) = yield Calls([Call(Api.OFFSET_COMMIT, {
                "group": group, "member_id": member_id,
                "member_epoch": body["generation_id_or_member_epoch"],
                "offsets": commit_offsets([t for t in body["topics"]
                                           if t["name"] not in denied])})])
            code = reply.error_code
        if (code == errors.StaleMemberEpochError.code
                and (group, member_id) in self._members.classic):
            code = errors.IllegalGenerationError.code
        group_denied = code == errors.GroupAuthorizationFailedError.code
        return {"throttle_time_ms": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"],
                 "error_code": errors.TopicAuthorizationFailedError.code
                 if t["name"] in denied and not group_denied else code}
                for p in t["partitions"]]} for t in body["topics"]]}

    def offset_fetch(self, conn: KafkaConn, version: int, body: dict):
        if version >= 8:
            wanted = [(g["group_id"], g["topics"]) for g in body["groups"]]
        else:
            wanted = [(body["group_id"], body["topics"])]
        stable = int(version >= 7 and body["require_stable"])
        made = yield from call_each({i: Call(Api.OFFSET_FETCH, {
            "group": group,
            "partitions": None if topics is None else
            [[t["name"], p] for t in topics for p in t["partition_indexes"]],
            "require_stable": stable}) for i, (group, topics) in enumerate(wanted)
            if self._may(conn, AclOperation.DESCRIBE, group)})
        replies = [made.get(i) or self._denied_reply(group)
                   for i, (group, _) in enumerate(wanted)]
        results = [(reply.error_code, fetch_rows(self._visible(conn, reply["rows"], topics is None)
                                         if reply.error_code == errors.NONE else [], version))
                   for reply, (_, topics) in zip(replies, wanted, strict=True)]
        if version >= 8:
            return {"throttle_time_ms": 0, "groups": [
                {"group_id": group, "topics": topics, "error_code": code}
                for (group, _), (code, topics) in zip(wanted, results, strict=True)]}
        code, topics = results[0]
        return {"throttle_time_ms": 0, "topics": topics, "error_code": code}

    def _visible(self, conn: KafkaConn, rows: list[list], every: bool) -> list[list]:
        """OffsetFetch rows as the principal may see them: for all of a group's offsets,
        only the topics it may Describe; for named ones, TOPIC_AUTHORIZATION_FAILED."""
        out = []
        for row in rows:
            if self._topic(conn, AclOperation.DESCRIBE, row[0]):
                out.append(row)
            elif not every:
                out.append([*row[:2], -1, -1, "", -1, errors.TopicAuthorizationFailedError.code])
        return out

    def offset_delete(self, conn: KafkaConn, version: int, body: dict):
        if not self._may(conn, AclOperation.DELETE, body["group_id"]):
            return {"error_code": errors.GroupAuthorizationFailedError.code,
                    "throttle_time_ms": 0, "topics": []}
        denied = {t["name"] for t in body["topics"]
                  if not self._topic(conn, AclOperation.READ, t["name"])}
        (reply,) = yield Calls([Call(Api.OFFSET_DELETE, {
            "group": body["group_id"],
            "partitions": [[t["name"], p["partition_index"]] for t in body["topics"]
                           if t["name"] not in denied for p in t["partitions"]]})])
        if reply.error_code != errors.NONE:
            return {"error_code": reply.error_code, "throttle_time_ms": 0, "topics": []}
        codes = {(topic, partition): code for topic, partition, code in reply["rows"]}
        codes.update({(t["name"], p["partition_index"]): errors.TopicAuthorizationFailedError.code
                      for t in body["topics"] if t["name"] in denied for p in t["partitions"]})
        return {"error_code": errors.NONE, "throttle_time_ms": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"],
                 "error_code": codes[(t["name"], p["partition_index"])]}
                for p in t["partitions"]]} for t in body["topics"]]}

    # --- groups -------------------------------------------------------------------------------
    def list_groups(self, conn: KafkaConn, version: int, body: dict):
        (reply,) = yield Calls([Call(Api.LIST_GROUPS, {})])
        states = {s.lower() for s in body["states_filter"]} if version >= 4 else set()
        every = self._authz.allows(conn, AclOperation.DESCRIBE, ResourceType.CLUSTER)
        return {"throttle_time_ms": 0, "error_code": reply.error_code, "groups": [
            {"group_id": name, "protocol_type": PROTOCOL_TYPE, "group_state": state}
            for name, state, _ in (reply["rows"] if reply.error_code == errors.NONE else [])
            if (not states or state.lower() in states)
            and (every or self._may(conn, AclOperation.DESCRIBE, name))]}

    def describe_groups(self, conn: KafkaConn, version: int, body: dict):
        names = body["groups"]
        replies = yield from self._each_group(conn, AclOperation.DESCRIBE, names,
                                              Api.CONSUMER_GROUP_DESCRIBE)
        return {"throttle_time_ms": 0, "groups": [
            self._described(name, reply) for name, reply in zip(names, replies, strict=True)]}

    def _each_group(self, conn: KafkaConn, op: AclOperation, names: list[str], api: Api):
        """``yield from``: the native ``api``'s reply for each group, GROUP_AUTHORIZATION_FAILED
        for those the principal may not ``op``."""
        made = yield from call_each({i: Call(api, {"group": g}) for i, g in enumerate(names)
                                     if self._may(conn, op, g)})
        return [made.get(i) or self._denied_reply(g) for i, g in enumerate(names)]

    def _described(self, name: str, reply: Response) -> dict:
        row = {"error_code": errors.NONE, "error_message": None, "group_id": name,
               "group_state": "Dead", "protocol_type": "", "protocol_data": "",
               "members": [], "authorized_operations": _AUTHORIZED_OPERATIONS_UNKNOWN}
        if reply.error_code == errors.GroupIdNotFoundError.code:
            return row
        if reply.error_code != errors.NONE:
            return {**row, "error_code": reply.error_code, "error_message": reply.error_message}
        desc = reply["description"]
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
        replies = yield from self._each_group(conn, AclOperation.DELETE, names,
                                              Api.DELETE_GROUPS)
        return {"throttle_time_ms": 0, "results": [
            {"group_id": g, "error_code": r.error_code}
            for g, r in zip(names, replies, strict=True)]}

    def consumer_group_describe(self, conn: KafkaConn, version: int, body: dict):
        names = body["group_ids"]
        replies = yield from self._each_group(conn, AclOperation.DESCRIBE, names,
                                              Api.CONSUMER_GROUP_DESCRIBE)
        ids = {name: topic_id_bytes(info.topic_id)
               for name, info in self._metadata.topics.items()}

        def assignment(partitions: list[list]) -> dict:
            return {"topic_partitions": [
                {"topic_id": ids.get(t, bytes(16)), "topic_name": t, "partitions": ps}
                for t, ps in by_topic(map(tuple, partitions)).items()]}
        groups = []
        for name, reply in zip(names, replies, strict=True):
            if reply.error_code == errors.NONE and self._classic_only(name, reply["description"]):
                reply = Response.refused(errors.GroupIdNotFoundError.code,
                                         f"Group {name} is not a consumer group.")
            if reply.error_code != errors.NONE:
                groups.append({"error_code": reply.error_code, "error_message": reply.error_message,
                               "group_id": name, "group_state": "", "group_epoch": -1,
                               "assignment_epoch": -1, "assignor_name": "", "members": [],
                               "authorized_operations": _AUTHORIZED_OPERATIONS_UNKNOWN})
                continue
            desc = reply["description"]
            groups.append({
                "error_code": errors.NONE, "error_message": None, "group_id": name,
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

    def _classic_only(self, name: str, desc: dict) -> bool:
        """Whether every live member of the group is a classic Kafka member: Kafka's
        ConsumerGroupDescribe answers GROUP_ID_NOT_FOUND for such a group, and clients then
        describe it with DescribeGroups (as type CLASSIC)."""
        live = [m["member_id"] for m in desc["members"] if not m["away"]]
        return bool(live) and all((name, m) in self._members.classic for m in live)
