"""Consumer groups for Kafka clients: classic members (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) and KIP-848 members (ConsumerGroupHeartbeat) in mq's broker-side groups.

Both kinds are members of the same ``GroupCoordinator`` groups as mq's own consumers, so one
group may hold native, classic and KIP-848 members at once and they split its partitions.

**Classic members** are placed in the group the way Kafka 4's coordinator places them in a
KIP-848 group (``GroupMetadataManager.classicGroupJoinToConsumerGroup``):

- JoinGroup is a heartbeat with member epoch 0 (a join or rejoin), the subscription's topics
  and the partitions it reports owning (``ConsumerProtocolSubscription``; an eager client
  reports none: it revoked everything before rejoining). The broker computes the assignment
  with its own assignor; the client's assignors are not run. Every member is answered at
  once as a follower (leader ``""``): the generation is the member epoch and the protocol
  name is the member's own first one, which is how the client picks eager or cooperative.
- SyncGroup returns the assignment of that join as a ``ConsumerProtocolAssignment``: the
  partitions the engine granted, never one another member still holds — or
  REBALANCE_IN_PROGRESS when more could be granted already (as Kafka does).
- Heartbeat keeps the member alive and answers REBALANCE_IN_PROGRESS when the member has
  partitions to give up or could be granted more (``GroupCoordinator.classic_heartbeat``); the
  client rejoins, reporting what it still owns, and the engine moves on. A partition changes
  hands only after its owner rejoined without it, left, or timed out; a member told to rejoin
  that does not within its rebalance timeout is removed.
- JoinGroup v4+ without a member id is answered MEMBER_ID_REQUIRED with a fresh id (Kafka's
  KIP-394); v5+ with a group.instance.id is a static member: a new incarnation (no member
  id) takes the old one's place, partitions and epoch with no rebalance, and the old one's
  joins are FENCED_INSTANCE_ID.

Liveness is the session timeout, never the TCP connection (librdkafka reconnects and keeps
its member id): these members have no connection or pid in the coordinator.

**KIP-848 members** (librdkafka ``group.protocol=consumer``) heartbeat with the native
request's fields, topics named by id (librdkafka sends an empty regex for none); the
assignment is sent when it changed since the member's last response, or on a full request (a
join), as Kafka does.

**ACLs** (``acls.py``): every membership api needs Read on the group, else
GROUP_AUTHORIZATION_FAILED, as Kafka's.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping

from mq import errors
from mq.broker.acls import OPEN, AclOperation, Authorizer, ResourceType
from mq.broker.apis.groups import GroupApis
from mq.broker.kafka.admin import topic_id_bytes
from mq.broker.kafka.conn import KafkaConn
from mq.broker.metadata import MetadataStore
from mq.errors import InvalidRequestError, RemoteProtocolError
from mq.protocol.kafka.codec import decode_data, encode_data

__all__ = ["ClassicMember", "GroupWireApis", "assignment_bytes", "by_topic",
           "parse_subscription_metadata"]


PROTOCOL_TYPE = "consumer"
_ASSIGNMENT_VERSION = 0       # the same layout in versions 0-3: every client reads it


@dataclasses.dataclass(slots=True)
class ClassicMember:
    """What a classic member told its JoinGroup, for SyncGroup and DescribeGroups."""

    client_id: str
    client_host: str
    protocol_name: str
    metadata: bytes                              # its ConsumerProtocolSubscription
    generation: int
    assignment: frozenset[tuple[str, int]]


# --- pure translation ---------------------------------------------------------------------------

def parse_subscription_metadata(protocols: list[dict]
                                ) -> tuple[str, list[str], list[list]]:
    """(protocol name, topics, owned partitions) of a JoinGroup's protocols, from the first
    one's ``ConsumerProtocolSubscription`` (every protocol of a consumer carries the same
    subscription; only the assignor name differs). Raises ``ValueError`` when there is none
    or it does not decode."""
    if not protocols:
        raise ValueError("a JoinGroup with no protocols")
    first = protocols[0]
    try:
        _, sub = decode_data("ConsumerProtocolSubscription", bytes(first["metadata"]))
    except RemoteProtocolError as err:
        raise ValueError(f"protocol {first['name']!r}: {err}") from err
    topics = [t for t in sub["topics"] if t]
    owned = [[row["topic"], p] for row in sub.get("owned_partitions") or ()
             for p in row["partitions"]]
    return first["name"], topics, owned


def by_topic(partitions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """Partitions grouped by topic, both sorted."""
    out: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        out.setdefault(topic, []).append(partition)
    return out


def assignment_bytes(partitions: Iterable[tuple[str, int]]) -> bytes:
    """A SyncGroup assignment: the partitions as a ``ConsumerProtocolAssignment``."""
    return encode_data("ConsumerProtocolAssignment", _ASSIGNMENT_VERSION, {
        "assigned_partitions": [{"topic": t, "partitions": ps}
                                for t, ps in by_topic(partitions).items()],
        "user_data": b""})


def _join_error(version: int, code: int, member_id: str = "") -> dict:
    return {"throttle_time_ms": 0, "error_code": code, "generation_id": -1,
            "protocol_type": None, "protocol_name": None if version >= 7 else "",
            "leader": "", "skip_assignment": False, "member_id": member_id, "members": []}


# --- the handlers -------------------------------------------------------------------------------

class GroupWireApis:
    """The group handlers of the Kafka listener, over the native ``GroupApis``."""

    def __init__(self, groups: GroupApis, metadata: MetadataStore,
                 authz: Authorizer = OPEN) -> None:
        self._authz = authz
        self._groups = groups
        self._metadata = metadata
        self.classic: dict[tuple[str, str], ClassicMember] = {}
        # KIP-848 members: (epoch, assignment) last sent, so an unchanged one is not resent
        self._sent: dict[tuple[str, str], tuple[int, frozenset]] = {}

    def handlers(self) -> Mapping[int, object]:
        return {11: self.join_group, 14: self.sync_group, 12: self.heartbeat,
                13: self.leave_group, 68: self.consumer_group_heartbeat}

    def _may_read(self, conn: KafkaConn, group: str) -> bool:
        return self._authz.allows(conn, AclOperation.READ, ResourceType.GROUP, group)

    def _prune(self, group: str | None = None) -> None:
        """Forget what is kept of members the coordinator no longer has (timed out, or their
        group deleted): of ``group``, or of every group (on a join, so nothing piles up)."""
        groups = self._groups.coordinator.groups
        for table in (self.classic, self._sent):
            for key in [k for k in table if (group is None or k[0] == group) and
                        (k[0] not in groups or k[1] not in groups[k[0]].members)]:
                del table[key]

    # --- classic members ----------------------------------------------------------------------
    def join_group(self, conn: KafkaConn, version: int, body: dict) -> dict:
        group, member_id = body["group_id"], body["member_id"]
        instance_id = body["group_instance_id"] if version >= 5 else None
        if not group:
            return _join_error(version, errors.InvalidGroupIdError.code, member_id)
        if not self._may_read(conn, group):
            return _join_error(version, errors.GroupAuthorizationFailedError.code, member_id)
        if body["protocol_type"] != PROTOCOL_TYPE:
            return _join_error(version, errors.InconsistentGroupProtocolError.code, member_id)
        try:
            protocol, topics, owned = parse_subscription_metadata(body["protocols"])
        except ValueError:
            return _join_error(version, errors.InconsistentGroupProtocolError.code, member_id)
        unknown = not member_id
        if unknown:
            member_id = f"{conn.client_id or 'consumer'}-{uuid.uuid4()}"
            if instance_id is None and version >= 4:     # KIP-394: come back with this id
                return _join_error(version, errors.MemberIdRequiredError.code, member_id)
        self._prune()
        if instance_id is not None:
            g = self._groups.coordinator.groups.get(group)
            current = g.instances.get(instance_id) if g is not None else None
            if current is not None and current != member_id:
                if not unknown:           # an incarnation that was replaced: Kafka fences it
                    return _join_error(version, errors.FencedInstanceIdError.code, member_id)
                self._step_aside(group, instance_id, current)
        session = body["session_timeout_ms"]
        rebalance = body["rebalance_timeout_ms"] if version >= 1 else session
        result = self._groups.member_heartbeat(
            group, member_id, member_epoch=0, instance_id=instance_id, topics=topics,
            pattern=None, assignor=None, owned=owned, pid=None, conn_id=None,
            rebalance_timeout_ms=rebalance, session_timeout_ms=session)
        if result.error is not None:
            return _join_error(version, result.error.code, member_id)
        member_id = result.member_id
        self.classic[(group, member_id)] = ClassicMember(
            conn.client_id or "", f"/{conn.peer.rsplit(':', 1)[0]}", protocol,
            bytes(body["protocols"][0]["metadata"]), result.member_epoch,
            frozenset(map(tuple, result.assignment)))
        return {"throttle_time_ms": 0, "error_code": errors.NONE,
                "generation_id": result.member_epoch, "protocol_type": PROTOCOL_TYPE,
                "protocol_name": protocol, "leader": "", "skip_assignment": False,
                "member_id": member_id, "members": []}

    def _step_aside(self, group: str, instance_id: str, current: str) -> None:
        """A static member's new incarnation joins: the ``current`` one, which never leaves
        on its own (classic static members close without LeaveGroup), departs so the new one
        takes over its place."""
        self._groups.leave_member(group, current, instance_id=instance_id, temporary=True)
        self.classic.pop((group, current), None)

    def sync_group(self, conn: KafkaConn, version: int, body: dict) -> dict:
        group, member_id = body["group_id"], body["member_id"]
        instance_id = body["group_instance_id"] if version >= 3 else None
        if not self._may_read(conn, group):
            return {"throttle_time_ms": 0, "error_code": errors.GroupAuthorizationFailedError.code,
                    "protocol_type": None, "protocol_name": None, "assignment": b""}
        member = self.classic.get((group, member_id))
        error, rejoin = self._groups.classic_heartbeat(group, member_id,
                                                       generation=body["generation_id"],
                                                       instance_id=instance_id, sync=True)
        if error is None and member is None:
            error_code = errors.UnknownMemberIdError.code   # a KIP-848 member's id: not classic
        elif error is None and version >= 5 and (
                body["protocol_type"] not in (None, PROTOCOL_TYPE) or
                body["protocol_name"] not in (None, member.protocol_name)):
            error_code = errors.InconsistentGroupProtocolError.code   # not what JoinGroup was told
        else:
            error_code = error.code if error is not None else \
                errors.RebalanceInProgressError.code if rejoin else errors.NONE
        if error_code != errors.NONE:
            return {"throttle_time_ms": 0, "error_code": error_code, "protocol_type": None,
                    "protocol_name": None, "assignment": b""}
        return {"throttle_time_ms": 0, "error_code": errors.NONE, "protocol_type": PROTOCOL_TYPE,
                "protocol_name": member.protocol_name,
                "assignment": assignment_bytes(member.assignment)}

    def heartbeat(self, conn: KafkaConn, version: int, body: dict) -> dict:
        if not self._may_read(conn, body["group_id"]):
            return {"throttle_time_ms": 0, "error_code": errors.GroupAuthorizationFailedError.code}
        error, rejoin = self._groups.classic_heartbeat(
            body["group_id"], body["member_id"], generation=body["generation_id"],
            instance_id=body["group_instance_id"] if version >= 3 else None)
        code = error.code if error is not None else \
            errors.RebalanceInProgressError.code if rejoin else errors.NONE
        return {"throttle_time_ms": 0, "error_code": code}

    def leave_group(self, conn: KafkaConn, version: int, body: dict) -> dict:
        group = body["group_id"]
        if not self._may_read(conn, group):
            return {"throttle_time_ms": 0, "error_code": errors.GroupAuthorizationFailedError.code,
                    "members": []}
        leaving = [(m["member_id"], m["group_instance_id"]) for m in body["members"]] \
            if version >= 3 else [(body["member_id"], None)]
        rows = []
        for member_id, instance_id in leaving:
            error = self._groups.leave_member(group, member_id, instance_id=instance_id)
            self.classic.pop((group, member_id), None)
            self._sent.pop((group, member_id), None)
            rows.append({"member_id": member_id, "group_instance_id": instance_id,
                         "error_code": errors.NONE if error is None else error.code})
        self._prune(group)
        if version >= 3:
            return {"throttle_time_ms": 0, "error_code": errors.NONE, "members": rows}
        return {"throttle_time_ms": 0, "error_code": rows[0]["error_code"], "members": []}

    # --- KIP-848 members ----------------------------------------------------------------------
    def consumer_group_heartbeat(self, conn: KafkaConn, version: int, body: dict) -> dict:
        group = body["group_id"]
        if not group:              # Kafka's validation: INVALID_REQUEST, not INVALID_GROUP_ID
            return {"throttle_time_ms": 0, "error_code": InvalidRequestError.code,
                    "error_message": "GroupId can't be empty.", "member_id": None,
                    "member_epoch": -1, "heartbeat_interval_ms": 0, "assignment": None}
        if not self._may_read(conn, group):
            return {"throttle_time_ms": 0, "error_code": errors.GroupAuthorizationFailedError.code,
                    "error_message": None, "member_id": None, "member_epoch": -1,
                    "heartbeat_interval_ms": 0, "assignment": None}
        names = {topic_id_bytes(info.topic_id): name
                 for name, info in self._metadata.topics.items()}
        owned = None if body["topic_partitions"] is None else [
            [names[bytes(row["topic_id"])], p] for row in body["topic_partitions"]
            if bytes(row["topic_id"]) in names for p in row["partitions"]]
        epoch = body["member_epoch"]
        result = self._groups.member_heartbeat(
            group, body["member_id"] or None, member_epoch=epoch,
            instance_id=body["instance_id"], topics=body["subscribed_topic_names"],
            pattern=(body["subscribed_topic_regex"] or None) if version >= 1 else None,
            assignor=body["server_assignor"], owned=owned, pid=None, conn_id=None,
            rebalance_timeout_ms=body["rebalance_timeout_ms"], session_timeout_ms=-1)
        self._prune(group)
        if result.error is not None:
            return {"throttle_time_ms": 0, "error_code": result.error.code,
                    "error_message": result.error_message, "member_id": None,
                    "member_epoch": -1, "heartbeat_interval_ms": 0, "assignment": None}
        key = (group, result.member_id)
        now = (result.member_epoch, result.assignment)
        full = epoch == 0 or owned is not None
        assignment = None
        if epoch >= 0 and (full or self._sent.get(key) != now):
            self._sent[key] = now
            ids = {name: topic_id_bytes(info.topic_id)
                   for name, info in self._metadata.topics.items()}
            assignment = {"topic_partitions": [
                {"topic_id": ids[t], "partitions": ps}
                for t, ps in by_topic(result.assignment).items() if t in ids]}
        return {"throttle_time_ms": 0, "error_code": errors.NONE, "error_message": None,
                "member_id": result.member_id, "member_epoch": result.member_epoch,
                "heartbeat_interval_ms": result.heartbeat_interval_ms,
                "assignment": assignment}
